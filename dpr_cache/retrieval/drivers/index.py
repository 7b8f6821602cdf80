"""The ``index`` command: encode a passages TSV into resumable shards (``index --config``), or
take precomputed shards (``index --embeddings``: ours, or DPR's ``generate_dense_embeddings``
pickles), then finish the index type asked for (see :mod:`dpr_cache.retrieval.dense.index`).

Layout of ``output_dir/index/`` when encoding::

    shards/<key>-00000.npy      embeddings of passages [0, shard_size), file order (float16 default)
    shards/<key>-00000.ids.txt  their passage ids, one a line
    shards/<key>-00000.offsets.npy  a multi-vector model's only: where each passage's tokens
                                begin in the .npy (int64, passages + 1), which then holds
                                its scored token vectors [tokens, dim]
    meta.json                   type, shards, model fingerprint, passages file, encoding, timings
    faiss.index, faiss.ivfdata  approximate types only

``<key>`` hashes all an embedding depends on (see
:func:`~dpr_cache.retrieval.dense.shards.shard_key`).
The index type is rebuilt from the shards on every run, so switching it costs no re-encoding.
:func:`build_index` reads the config; the others take plain arguments and its sections.
"""

from __future__ import annotations

import glob
import os
import pickle
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from dpr_cache.config import Config, IndexConfig
from dpr_cache.errors import InputError
from dpr_cache.model.loading import resolve_model_dir
from dpr_cache.retrieval.dense.faiss_index import check_index_spec
from dpr_cache.retrieval.dense.index import check_token_spec, finish_index, index_dir_of
from dpr_cache.retrieval.dense.layout import MULTI, model_vectors
from dpr_cache.retrieval.dense.questions import config_encoding, config_loading
from dpr_cache.retrieval.dense.shards import PassageSource, encode_passage_shards
from dpr_cache.retrieval.dense.store import EmbeddingStore, write_shard
from dpr_cache.retrieval.dense.tokens import TokenStore
from dpr_cache.retrieval.dense.widths import cut_shards
from dpr_cache.retrieval.drivers.overrides import refuse_train_keys
from dpr_cache.runtime import distributed
from dpr_cache.runtime.device import advises_on_out_of_memory, resolve_device
from dpr_cache.runtime.lock import output_lock

__all__ = ["index_command", "build_index", "index_passages", "index_embeddings"]


def build_index(
    config: Config,
    model_dir: str | Path | None = None,
    *,
    rank: int = 0,
    world_size: int = 1,
    progress: bool = True,
) -> Path:
    """``dpr-cache index --config``: encode ``data.passages`` with the passage tower of
    ``model_dir`` (default ``output_dir/model``) on ``index.device`` and build ``index.type``;
    returns the folder."""
    model_dir = resolve_model_dir(model_dir, config.output_path / "model")
    if not config.data.passages:
        raise InputError("data.passages: not set (a DPR passages TSV)")
    asked, fallback = config_encoding(config.model, config.index)
    source = PassageSource(
        Path(config.data.passages),
        model_dir,
        asked,
        fallback,
        config.model.max_passage_length,
        config.data.num_workers,
        config.cache_path,
        config_loading(config.model),
    )
    with output_lock(index_dir_of(config.output_path)):
        return index_passages(
            source,
            index_dir_of(config.output_path),
            config.index,
            device=resolve_device(config.index.device, key="index.device"),
            rank=rank,
            world_size=world_size,
            progress=progress,
        )


def index_passages(
    source: PassageSource,
    out: Path,
    index: IndexConfig,
    *,
    device: torch.device,
    rank: int = 0,
    world_size: int = 1,
    progress: bool = True,
) -> Path:
    """Encode ``source``'s passages into ``out/shards`` (see
    :func:`~dpr_cache.retrieval.dense.shards.encode_passage_shards`) and, on rank 0, finish the
    ``index.type`` over them within ``index.memory_gb`` (see :func:`finish_index`). meta.json
    records the model's encoding (how its questions must be encoded) and the precision the
    passages were encoded in (an ``auto`` as resolved on ``device``). A multi-vector model's
    passages go into token shards, its index flat (:func:`check_token_spec`, checked first)."""
    multi = model_vectors(source.model_dir) == MULTI
    if multi:
        check_token_spec(index)
    encoded = encode_passage_shards(
        source,
        out / "shards",
        index,
        device=device,
        rank=rank,
        world_size=world_size,
        progress=progress,
        check=None if multi else lambda n, dim: check_index_spec(index, n, dim, index.memory_gb),
    )
    if rank != 0:
        return out
    extra = {
        "model": {
            "dir": str(source.model_dir),
            "fingerprint": encoded.fingerprint,
            **encoded.encoding.record(),
            "passage_prefix": encoded.passage_prefix,
            "max_passage_length": encoded.max_length,
            "precision": encoded.precision,
            **(encoded.multi or {}),
        },
        "passages": encoded.signature,
        "shard_key": encoded.key,
        "encode": encoded.settings(index, source.num_workers),
        "timings": encoded.timings(),  # this run, rank 0
    }
    opened = TokenStore.open if encoded.multi else EmbeddingStore.open
    finish_index(out, opened(encoded.paths), index, extra)
    return out


def index_embeddings(pattern: str, out: Path, index: IndexConfig) -> Path:
    """``dpr-cache index --embeddings``: an ``index.type`` index over precomputed shards. Our
    ``.npy`` shards are validated and recorded in place; DPR's pickles (``.pkl``/``.pickle``:
    trusted input only, pickle runs code) are converted once into shards of
    ``index.store_dtype`` under ``out/shards``. With ``index.dim`` below their width, the
    shards are cut to it (re-normalized when unit length) into ``out/shards``."""
    paths = sorted(glob.glob(os.path.expanduser(pattern)))
    if not paths:
        raise InputError(f"{pattern}: matches no file")
    pickles = [p for p in paths if p.endswith((".pkl", ".pickle"))]
    if pickles and len(pickles) != len(paths):
        raise InputError(f"{pattern}: mixes DPR pickles and .npy shards; give one kind")
    npys = [Path(p) for p in paths if p.endswith(".npy")]
    if not (pickles or npys):
        raise InputError(f"{pattern}: matches no .npy shard")
    out = Path(out)
    with output_lock(out):
        if pickles:
            npys = [
                _dpr_pickle_to_shard(
                    Path(p), out / "shards" / f"dpr-{i:05d}.npy", index.store_dtype
                )
                for i, p in enumerate(pickles)
            ]
        store = EmbeddingStore.open(npys)
        extra: dict = {"source": pattern}
        if index.dim is not None and index.dim != store.dim:
            extra["cut_from"] = store.dim
            store = EmbeddingStore.open(cut_shards(store, out / "shards", index.dim, pattern))
        finish_index(out, store, index, extra)
    return out


def _dpr_pickle_to_shard(path: Path, npy: Path, dtype: str) -> Path:
    """One of DPR's embedding pickles (a list of ``(passage id, float32 vector)``) as a shard."""
    if npy.is_file():
        return npy  # converted by an earlier run
    try:
        with open(path, "rb") as f:
            pairs = pickle.load(f)  # noqa: S301 - trusted input, as the docs say
        ids = [str(pid) for pid, _ in pairs]
        embs = np.stack([np.asarray(vec, dtype=np.float32) for _, vec in pairs])
    except (pickle.UnpicklingError, EOFError, TypeError, ValueError) as e:
        msg = " ".join(str(e).split())[:120]
        raise InputError(f"{path}: not a DPR embeddings pickle ({msg})") from None
    if embs.ndim != 2:
        raise InputError(f"{path}: vectors of shape {embs.shape[1:]}, expected one dimension")
    write_shard(npy, embs, ids, dtype)
    return npy


@advises_on_out_of_memory("lower index.batch_size")
def index_command(
    config: Config,
    model_dir: str | Path | None = None,
    *,
    embeddings: str | None = None,
    out: Path | None = None,
    progress: bool = True,
    overridden: Sequence[str] = (),
) -> Path | None:
    """``dpr-cache index``: precomputed shards (``embeddings`` into ``out``, by rank 0) or
    ``data.passages`` encoded (under ``torchrun`` the ranks share the shards); the index folder
    on the main rank, None on the others. ``overridden``: the keys ``--set`` gave."""
    if embeddings is None:
        refuse_train_keys(overridden, "index", config)
    if embeddings is not None:
        if out is None:
            raise InputError("index --embeddings: --out DIR is needed")
        if int(os.environ.get("RANK", "0")) != 0:
            return None
        return index_embeddings(embeddings, out, config.index)
    env = distributed.setup(config.index.device, "index.device")
    try:
        path = build_index(
            config, model_dir, rank=env.rank, world_size=env.world_size, progress=progress
        )
    finally:
        distributed.teardown()
    return path if env.is_main else None
