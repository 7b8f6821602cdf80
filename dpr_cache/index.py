"""Encode the passage corpus into resumable on-disk shards, then build a FAISS index over them.

Layout under ``output_dir/index/``::

    shards/<key>-00000.npy      float32 embeddings of passages [0, shard_size), file order
    shards/<key>-00000.ids.txt  their passage ids, one a line
    faiss.index                 the index: row i is passage row i of the passages file
    passage_ids.txt             the passage id of every index row, one a line
    meta.json                   model, weights fingerprint, sizes, index type, timings

``<key>`` hashes all an embedding depends on (weights, passages file, lengths, pooling, precision,
shard size), so a shard of another model or corpus is never reused. A finished shard is skipped on
a rerun; shard k belongs to rank ``k % world_size``. The final index is rebuilt from the shards on
every run, so switching ``index.type`` costs no re-encoding.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import faiss
import numpy as np
import torch
from tqdm.auto import tqdm

from dpr_cache.config import Config, IndexConfig
from dpr_cache.data import load_passages
from dpr_cache.errors import InputError
from dpr_cache.model import BiEncoder, resolve_model_path

__all__ = [
    "build_index",
    "load_index",
    "search",
    "configure_search",
    "encode_passage_texts",
    "load_shard_embeddings",
    "model_fingerprint",
]

log = logging.getLogger(__name__)

INDEX_FILE = "faiss.index"
IDS_FILE = "passage_ids.txt"
META_FILE = "meta.json"
_POLL_SECONDS = 5.0
_MAX_TRAIN_ROWS = 1_000_000  # IVF-PQ training sample cap (rows held in memory)

# -- shared with evaluate ---------------------------------------------------------------------


def index_dir_of(config: Config) -> Path:
    return config.output_path / "index"


def resolve_model_dir(config: Config, model_dir: str | Path | None) -> Path:
    """The model folder (default ``output_dir/model``), absolute; InputError if missing."""
    path = (
        Path(resolve_model_path(model_dir))
        if model_dir is not None
        else config.output_path / "model"
    )
    if not path.is_dir():
        raise InputError(f"{path}: no model folder: run `dpr-cache train` first or pass --model")
    return path.resolve()


def resolve_device(preference: str | torch.device) -> torch.device:
    """``auto`` = cuda if available else cpu; plain ``cuda`` under torchrun = cuda:LOCAL_RANK."""
    if isinstance(preference, torch.device):
        return preference
    if preference == "auto":
        preference = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(preference)
    except RuntimeError:
        raise InputError(f"train.device: not a device: {preference!r}") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise InputError(f"train.device: {preference!r} asked for but CUDA is not available")
        if device.index is None and "LOCAL_RANK" in os.environ:
            device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    return device


def autocast_for(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    """fp16/bf16 autocast on CUDA; a no-op elsewhere (CPU encodes in fp32)."""
    if device.type == "cuda" and precision in ("fp16", "bf16"):
        dtype = torch.float16 if precision == "fp16" else torch.bfloat16
        return torch.autocast("cuda", dtype=dtype)
    return contextlib.nullcontext()


def load_encoder(model_dir: Path, config: Config, *, query_only: bool = False) -> BiEncoder:
    """A saved BiEncoder (both towers, or only the query tower), or a plain HF folder, once."""
    saved = (model_dir / "query_encoder").is_dir()
    try:
        model = BiEncoder.from_pretrained(
            model_dir, shared=query_only or not saved, pooling=config.model.pooling
        )
    except (OSError, ValueError) as e:
        msg = " ".join(str(e).split())[:200]
        raise InputError(f"{model_dir}: cannot load a model ({msg})") from None
    if model.tokenizer is None:
        raise InputError(f"{model_dir}: no tokenizer files in the model folder")
    return model.eval()


def model_fingerprint(model_dir: str | Path) -> str:
    """sha256 over every file of the folder (relative path, size, bytes); hidden files skipped."""
    root = Path(model_dir)
    digest = hashlib.sha256()
    files = sorted(
        p
        for p in root.rglob("*")
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(root).parts)
    )
    for file in files:
        digest.update(f"{file.relative_to(root).as_posix()}\0{file.stat().st_size}\0".encode())
        with open(file, "rb") as f:
            while block := f.read(1 << 20):
                digest.update(block)
    return digest.hexdigest()


def passages_signature(path: Path) -> dict[str, Any]:
    st = path.stat()
    return {"path": str(path.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def write_atomic(path: Path, write: Callable[[Path], None]) -> None:
    """Call ``write(tmp)`` then rename tmp over ``path``, so readers never see half a file."""
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_json_atomic(path: Path, obj: Any) -> None:
    write_atomic(path, lambda tmp: tmp.write_text(json.dumps(obj, indent=2) + "\n"))


# -- tokenizing and encoding ------------------------------------------------------------------


def _tokenize_pairs(tokenizer, titles: list[str], texts: list[str], max_length: int) -> dict:
    """Unpadded (title, text) pair encodings, truncating the text (DPR); per-pair fallback to
    ``longest_first`` when a title alone is too long."""
    kwargs: dict[str, Any] = {"max_length": max_length, "padding": False}
    try:
        return dict(tokenizer(titles, texts, truncation="only_second", **kwargs))
    except Exception:  # fast tokenizers raise a bare Exception ("Truncation error: ...")
        pass
    rows = []
    for title, text in zip(titles, texts, strict=True):
        try:
            rows.append(tokenizer(title, text, truncation="only_second", **kwargs))
        except Exception:
            rows.append(tokenizer(title, text, truncation="longest_first", **kwargs))
    return {key: [row[key] for row in rows] for key in rows[0]}


def _pad(features: dict, rows: np.ndarray, pad_id: int, width: int, left: bool) -> dict:
    """Tensors of the selected rows padded to ``width`` (input_ids with pad_id, others 0)."""
    out = {}
    for key, seqs in features.items():
        arr = np.full((len(rows), width), pad_id if key == "input_ids" else 0, dtype=np.int64)
        for i, r in enumerate(rows):
            seq = seqs[r]
            if left:
                arr[i, width - len(seq) :] = seq
            else:
                arr[i, : len(seq)] = seq
        out[key] = torch.from_numpy(arr)
    return out


def encode_passage_texts(
    model: BiEncoder,
    titles: Sequence[str],
    texts: Sequence[str],
    *,
    max_length: int,
    batch_size: int,
    device: torch.device,
    precision: str = "fp32",
    sort_by_length: bool = True,
    on_batch: Callable[[int], Any] | None = None,
) -> np.ndarray:
    """Passage embeddings [n, dim] (float32, input order) from the passage tower.

    ``sort_by_length``: batches of similar length (longest first), each padded to its longest;
    otherwise batches in input order padded to ``max_length``, as DPR does.
    """
    n = len(texts)
    tok = model.tokenizer
    feats = _tokenize_pairs(tok, list(titles), list(texts), max_length)
    lengths = np.fromiter((len(s) for s in feats["input_ids"]), dtype=np.int64, count=n)
    order = np.argsort(-lengths, kind="stable") if sort_by_length else np.arange(n)
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else 0
    left = getattr(tok, "padding_side", "right") == "left"
    out = np.empty((n, model.dim), dtype=np.float32)
    with torch.inference_mode(), autocast_for(device, precision):
        for start in range(0, n, batch_size):
            rows = order[start : start + batch_size]
            width = int(lengths[rows].max()) if sort_by_length else max_length
            inputs = {k: v.to(device) for k, v in _pad(feats, rows, pad_id, width, left).items()}
            out[rows] = model.encode_passage(inputs).float().cpu().numpy()
            if on_batch is not None:
                on_batch(len(rows))
    return out


# -- shards -----------------------------------------------------------------------------------


def _shard_files(shard_dir: Path, key: str, k: int) -> tuple[Path, Path]:
    stem = f"{key}-{k:05d}"
    return shard_dir / f"{stem}.npy", shard_dir / f"{stem}.ids.txt"


def _shard_done(shard_dir: Path, key: str, k: int, rows: int) -> bool:
    emb_file, ids_file = _shard_files(shard_dir, key, k)
    if not (emb_file.is_file() and ids_file.is_file()):
        return False
    try:
        return np.load(emb_file, mmap_mode="r").shape[0] == rows
    except (OSError, ValueError):
        return False


def _save_shard(shard_dir: Path, key: str, k: int, embs: np.ndarray, ids: list[str]) -> None:
    """Ids first, embeddings last: a shard is complete once both files exist."""
    emb_file, ids_file = _shard_files(shard_dir, key, k)
    for pid in ids:
        if "\n" in pid or "\r" in pid:
            raise InputError(f"passage id {pid!r} contains a line break")
    write_atomic(ids_file, lambda tmp: tmp.write_text("".join(f"{pid}\n" for pid in ids)))

    def write_npy(tmp: Path) -> None:
        with open(tmp, "wb") as f:
            np.save(f, embs.astype(np.float32, copy=False))

    write_atomic(emb_file, write_npy)


def _remove_stale(shard_dir: Path, key: str, temporary: bool) -> None:
    """Drop shards of another key (model or corpus) and, if ``temporary``, leftover tmp files."""
    for path in shard_dir.iterdir():
        stale = not path.name.startswith(f"{key}-") or (temporary and ".tmp" in path.name)
        if path.is_file() and stale:
            path.unlink(missing_ok=True)


def _shard_key(fingerprint: str, passages: dict, config: Config, pooling: str, prec: str) -> str:
    ident = [fingerprint, passages, config.index.shard_size, config.model.max_passage_length]
    ident += [pooling, prec]
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]


def load_shard_embeddings(index_dir: str | Path) -> np.ndarray:
    """All passage embeddings [n, dim] of a built index, from its shards (file order)."""
    meta = json.loads((Path(index_dir) / META_FILE).read_text())
    shard_dir = Path(index_dir) / "shards"
    parts = [
        np.load(_shard_files(shard_dir, meta["shard_key"], k)[0]) for k in range(meta["n_shards"])
    ]
    return np.concatenate(parts)


def _wait_for_shards(shard_dir: Path, key: str, sizes: list[int]) -> None:
    """Rank 0 waits for the other ranks' shards to land on disk (no collective time-out)."""
    last_note = 0.0
    while missing := [k for k, r in enumerate(sizes) if not _shard_done(shard_dir, key, k, r)]:
        if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
            raise RuntimeError(
                f"{len(missing)} shard(s) of {shard_dir} are missing (first {missing[0]}): "
                "other ranks have not finished; rerun when they have"
            )
        if time.monotonic() - last_note > 60:
            log.info("waiting for %d shard(s) from other ranks", len(missing))
            last_note = time.monotonic()
        time.sleep(_POLL_SECONDS)


# -- FAISS ------------------------------------------------------------------------------------


def _default_nlist(n: int) -> int:
    return max(1, min(int(round(4 * math.sqrt(n))), n // 39))


def _check_index_config(cfg: IndexConfig, n: int, dim: int) -> None:
    if cfg.type != "ivfpq":
        return
    if dim % cfg.pq_m:
        raise InputError(f"index.pq_m: {cfg.pq_m} does not divide the embedding size {dim}")
    if cfg.ivf_nlist is not None and cfg.ivf_nlist > n:
        raise InputError(f"index.ivf_nlist: {cfg.ivf_nlist} is more than the {n} passages")


def _gather_rows(shards: list[np.ndarray], shard_size: int, rows: np.ndarray) -> np.ndarray:
    parts = []
    for k, emb in enumerate(shards):
        lo = k * shard_size
        sel = rows[(rows >= lo) & (rows < lo + len(emb))] - lo
        if len(sel):
            parts.append(np.asarray(emb[sel]))
    return np.concatenate(parts)


def _new_index(
    cfg: IndexConfig, shards: list[np.ndarray], shard_size: int, n: int, dim: int
) -> tuple[faiss.Index, dict[str, Any]]:
    """An empty (trained, for IVF-PQ) index of ``cfg.type`` and the parameters it was given."""
    if cfg.type == "flat":
        return faiss.IndexFlatIP(dim), {}
    if cfg.type == "hnsw":
        index = faiss.IndexHNSWFlat(dim, cfg.hnsw_m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efSearch = cfg.hnsw_ef_search
        return index, {"hnsw_m": cfg.hnsw_m, "ef_construction": int(index.hnsw.efConstruction)}
    nlist = cfg.ivf_nlist or _default_nlist(n)
    n_train = min(n, max(50 * nlist, 65_536), _MAX_TRAIN_ROWS)
    rows = np.sort(np.random.default_rng(0).choice(n, size=n_train, replace=False))
    train = np.ascontiguousarray(_gather_rows(shards, shard_size, rows), dtype=np.float32)
    nbits = 8 if n_train >= 256 else max(1, int(math.log2(n_train)))
    quantizer = faiss.IndexFlatIP(dim)
    index = faiss.IndexIVFPQ(quantizer, dim, nlist, cfg.pq_m, nbits, faiss.METRIC_INNER_PRODUCT)
    index.train(train)  # faiss's Python wrapper keeps ``quantizer`` alive with ``index``
    params = {"nlist": nlist, "pq_m": cfg.pq_m, "pq_nbits": nbits, "train_rows": n_train}
    return index, params


def configure_search(index: faiss.Index, cfg: IndexConfig) -> faiss.Index:
    """Apply the search-time knobs (``ivf_nprobe``, ``hnsw_ef_search``) to a loaded index."""
    ivf = faiss.try_extract_index_ivf(index)
    if ivf is not None:
        ivf.nprobe = min(cfg.ivf_nprobe, ivf.nlist)
    if hasattr(index, "hnsw"):
        index.hnsw.efSearch = cfg.hnsw_ef_search
    return index


def search(index: faiss.Index, q_embs: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-k inner-product search: (scores [n, k'], rows [n, k']), k' = min(k, index size);
    a row of -1 means no result (approximate indexes)."""
    q = np.ascontiguousarray(q_embs, dtype=np.float32)
    return index.search(q, max(1, min(k, index.ntotal)))


def load_index(index_dir: str | Path, *, with_ids: bool = True) -> tuple[faiss.Index, list, dict]:
    """(index, passage ids by row, meta); ids are [] when ``with_ids`` is False."""
    index_dir = Path(index_dir)
    files = [index_dir / name for name in (META_FILE, INDEX_FILE, IDS_FILE)]
    if not all(f.is_file() for f in files):
        raise InputError(f"no index at {index_dir}: run `dpr-cache index` first")
    meta = json.loads(files[0].read_text())
    index = faiss.read_index(str(files[1]))
    ids = files[2].read_text(encoding="utf-8").splitlines() if with_ids else []
    if index.ntotal != meta.get("n_passages") or (with_ids and len(ids) != index.ntotal):
        raise InputError(f"{index_dir}: index files disagree: rerun `dpr-cache index`")
    return index, ids, meta


# -- the command ------------------------------------------------------------------------------


def build_index(
    config: Config,
    model_dir: str | Path | None = None,
    *,
    rank: int = 0,
    world_size: int = 1,
    progress: bool = True,
    sort_by_length: bool = True,
    device: str | torch.device | None = None,
) -> Path:
    """Encode ``data.passages`` into shards (this rank's share) and, on rank 0, build the index.

    Rank 0 waits for the other ranks' shards by watching the shard folder (a long encode never
    hits a collective time-out); the other ranks return as soon as their shards are written.
    Returns ``output_dir/index``.
    """
    model_dir = resolve_model_dir(config, model_dir)
    if not config.data.passages:
        raise InputError("data.passages: not set (a DPR passages TSV)")
    passages = Path(config.data.passages)
    dataset = load_passages(passages, config.cache_path)
    n = len(dataset)
    if n == 0:
        raise InputError(f"{passages}: no passages")
    dev = resolve_device(device if device is not None else config.train.device)
    model = load_encoder(model_dir, config).to(dev)
    _check_index_config(config.index, n, model.dim)
    precision = config.train.precision if dev.type == "cuda" else "fp32"
    fingerprint = model_fingerprint(model_dir)
    signature = passages_signature(passages)
    key = _shard_key(fingerprint, signature, config, model.pooling, precision)

    out = index_dir_of(config)
    shard_dir = out / "shards"
    shard_dir.mkdir(parents=True, exist_ok=True)
    if rank == 0:  # other ranks only write this key's files; their tmp files must survive
        _remove_stale(shard_dir, key, temporary=world_size == 1)
    size = config.index.shard_size
    sizes = [min(size, n - k * size) for k in range(math.ceil(n / size))]
    mine = [
        k
        for k in range(rank, len(sizes), world_size)
        if not _shard_done(shard_dir, key, k, sizes[k])
    ]
    todo = sum(sizes[k] for k in mine)
    bar = tqdm(total=todo, unit="psg", desc=f"encode passages (rank {rank})", disable=not progress)
    start = time.perf_counter()
    with bar:
        for k in mine:
            chunk = dataset[k * size : k * size + sizes[k]]
            embs = encode_passage_texts(
                model,
                chunk["title"],
                chunk["text"],
                max_length=config.model.max_passage_length,
                batch_size=config.index.batch_size,
                device=dev,
                precision=precision,
                sort_by_length=sort_by_length,
                on_batch=bar.update,
            )
            _save_shard(shard_dir, key, k, embs, chunk["id"])
    encode_seconds = time.perf_counter() - start
    dim, pooling = model.dim, model.pooling
    del model
    if rank != 0:
        return out
    _wait_for_shards(shard_dir, key, sizes)

    start = time.perf_counter()
    shard_embs = [
        np.load(_shard_files(shard_dir, key, k)[0], mmap_mode="r") for k in range(len(sizes))
    ]
    index, params = _new_index(config.index, shard_embs, size, n, dim)
    for emb in shard_embs:
        index.add(np.ascontiguousarray(emb, dtype=np.float32))
    (out / META_FILE).unlink(missing_ok=True)  # no meta = no index, until all files are new
    write_atomic(out / INDEX_FILE, lambda tmp: faiss.write_index(index, str(tmp)))

    def write_ids(tmp: Path) -> None:
        with open(tmp, "w", encoding="utf-8") as f:
            for k in range(len(sizes)):
                f.write(_shard_files(shard_dir, key, k)[1].read_text(encoding="utf-8"))

    write_atomic(out / IDS_FILE, write_ids)
    meta = {
        "model_dir": str(model_dir),
        "fingerprint": fingerprint,
        "passages": signature,
        "n_passages": n,
        "dim": dim,
        "index_type": config.index.type,
        "index_params": params,
        "pooling": pooling,
        "max_passage_length": config.model.max_passage_length,
        "precision": precision,
        "shard_size": size,
        "n_shards": len(sizes),
        "shard_key": key,
        "sort_by_length": sort_by_length,
        "timings": {  # this run, rank 0
            "encoded_passages": todo,
            "encode_seconds": round(encode_seconds, 3),
            "passages_per_second": round(todo / encode_seconds, 1) if todo else None,
            "build_seconds": round(time.perf_counter() - start, 3),
        },
    }
    write_json_atomic(out / META_FILE, meta)
    return out
