"""Late interaction (ColBERT-style): a vector per token, scored by MaxSim
(:mod:`dpr_cache.core.similarity`).

A multi-vector tower is a Hugging Face tower with one more submodule, ``multi_vector_dense``: a
linear projection of every token's last hidden state to ``dim`` dims, without bias (as
sentence-transformers' ``MultiVectorEncoder`` converts a model, and as PyLate and ColBERT
project). Each projected token is scaled to unit length; a token that is not scored is the zero
vector: padding on both sides, and on the passage side the skiplist's tokens (punctuation, where
the model asks). The projection lives inside the tower so that DDP syncs it and the optimizer
and checkpoints hold it with the tower's own weights.

Saved, a tower folder is a sentence-transformers ``MultiVectorEncoder`` folder: the backbone as a
``transformers`` folder at its root, ``1_Dense`` (the projection), ``2_MultiVectorMask`` (the
skiplist) and ``3_Normalize``; :func:`read_folder` reads such a folder back, whoever wrote it.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from dpr_cache.errors import InputError
from dpr_cache.model.encoding import (
    is_multi_vector_folder,
    shipped_expansion,
    shipped_modules,
    shipped_skiplist,
)

__all__ = [
    "DEFAULT_DIM",
    "PROJECTION",
    "MultiVector",
    "attach_projection",
    "projection_of",
    "token_reps",
    "read_folder",
    "write_folder",
    "without_projection",
    "is_multi_vector_folder",
]

DEFAULT_DIM = 128
"""``model.multi_dim``'s default (sentence-transformers' and ColBERT's), or the width where that
is smaller."""
PROJECTION = "multi_vector_dense"
"""The projection's name as a submodule of the tower."""

_ST = "sentence_transformers"
_TYPES = {
    "transformer": f"{_ST}.base.modules.transformer.Transformer",
    "dense": f"{_ST}.base.modules.dense.Dense",
    "mask": f"{_ST}.multi_vector_encoder.modules.multi_vector_mask.MultiVectorMask",
    "normalize": f"{_ST}.base.modules.normalize.Normalize",
}


@dataclass(frozen=True)
class Expansion:
    """ColBERT's query expansion: every question padded to ``length`` tokens with ``token``
    (None: the tokenizer's mask token, else its EOS), the padding scored; the encoder attends to
    it only when ``attend`` (sentence-transformers' ``query_expansion`` of strategy ``fixed``,
    PyLate's ``query_length`` with ``attend_to_expansion_tokens``)."""

    length: int
    attend: bool = False
    token: str | None = None

    def record(self) -> dict:
        return {"length": self.length, "attend": self.attend, "token": self.token}


@dataclass(frozen=True)
class MultiVector:
    """How a model encodes token vectors: their width, the words whose tokens a passage does
    not score (the skiplist), and the questions' expansion (None: none)."""

    dim: int
    skiplist: tuple[str, ...] = ()
    expansion: Expansion | None = None

    def record(self) -> dict:
        expansion = self.expansion.record() if self.expansion is not None else None
        return {
            "multi_dim": self.dim,
            "skiplist": list(self.skiplist),
            "query_expansion": expansion,
        }

    @classmethod
    def from_record(cls, dim: int, record: dict) -> MultiVector:
        """The spec a ``biencoder.json`` records (its projection's width given)."""
        expansion = record.get("query_expansion")
        return cls(
            dim,
            tuple(record.get("skiplist") or ()),
            Expansion(**expansion) if expansion else None,
        )


def expansion_id(tokenizer, expansion: Expansion) -> int:
    """The token id questions are expanded with: ``expansion.token``'s, else the mask token's,
    else EOS's (as sentence-transformers falls back)."""
    if expansion.token is not None:
        return int(tokenizer.convert_tokens_to_ids(expansion.token))
    found = tokenizer.mask_token_id if tokenizer.mask_token_id is not None else None
    found = found if found is not None else tokenizer.eos_token_id
    if found is None:
        raise InputError("query expansion needs a tokenizer with a mask or an EOS token")
    return int(found)


def expand_queries(inputs: dict, expansion: Expansion, token_id: int) -> tuple[dict, Tensor]:
    """Right-padded questions [n, w] expanded to [n, length]: every padded position holds the
    expansion token, attended only when ``expansion.attend``; and the tokens scored (every one:
    the question's and the expansion's)."""
    ids, mask = inputs["input_ids"], inputs["attention_mask"]
    width = ids.shape[1]
    if width > expansion.length:
        raise ValueError(
            f"questions of {width} tokens, longer than the query expansion's {expansion.length}: "
            f"set model.max_query_length to at most {expansion.length}"
        )
    pad = expansion.length - width
    mask = F.pad(mask, (0, pad), value=0)
    expanded = mask == 0
    out = {k: F.pad(v, (0, pad), value=0) for k, v in inputs.items()}
    out["input_ids"] = out["input_ids"].masked_fill(expanded, token_id)
    out["attention_mask"] = torch.ones_like(mask) if expansion.attend else mask
    return out, torch.ones_like(expanded)


def default_dim(width: int) -> int:
    """``model.multi_dim`` when not given: :data:`DEFAULT_DIM`, or the width where smaller."""
    return min(DEFAULT_DIM, width)


def check_dim(dim: int, width: int) -> int:
    """``dim`` if it is a width the projection can have (1 to the model's width)."""
    if not 1 <= dim <= width:
        raise InputError(f"model.multi_dim: {dim} is not 1 to the model's width ({width})")
    return dim


def attach_projection(tower: nn.Module, dim: int, weight: Tensor | None = None) -> nn.Module:
    """``tower`` with its projection (``weight`` [dim, width], else PyTorch's default
    initialization from the global generator, as sentence-transformers draws it), in the
    tower's dtype."""
    width = int(tower.config.hidden_size)
    dtype = next(tower.parameters()).dtype
    linear = nn.Linear(width, check_dim(dim, width), bias=False, dtype=dtype)
    if weight is not None:
        if tuple(weight.shape) != (dim, width):
            raise InputError(
                f"the projection's weights are {tuple(weight.shape)}, but the model projects "
                f"{width} dims to {dim}"
            )
        with torch.no_grad():
            linear.weight.copy_(weight)
    tower.add_module(PROJECTION, linear)
    return tower


def projection_of(tower: nn.Module) -> nn.Linear | None:
    """The projection of a tower (itself, or wrapped in DDP), or None for a single-vector
    tower."""
    return getattr(getattr(tower, "module", tower), PROJECTION, None)


def token_reps(hidden: Tensor, keep: Tensor, projection: nn.Linear) -> Tensor:
    """[n, L, dim] unit token vectors of ``hidden`` [n, L, width], zero where ``keep`` [n, L]
    is false."""
    reps = F.normalize(projection(hidden), dim=-1)
    return reps * keep.unsqueeze(-1).to(reps.dtype)


def skip_ids(tokenizer, words: Sequence[str]) -> list[int]:
    """The token ids of the skiplist's words (each a single token of the tokenizer)."""
    ids = []
    for word in words:
        found = tokenizer.convert_tokens_to_ids(word)
        if found is not None and found != tokenizer.unk_token_id:
            ids.append(int(found))
    return ids


def passage_keep(inputs: dict, skipped: Tensor | None) -> Tensor:
    """The passage tokens scored: attended, and not the skiplist's."""
    keep = inputs["attention_mask"].bool()
    if skipped is not None and skipped.numel():
        keep = keep & ~torch.isin(inputs["input_ids"], skipped.to(keep.device))
    return keep


@contextlib.contextmanager
def without_projection(tower: nn.Module) -> Iterator[nn.Linear | None]:
    """The tower without its projection for the block (a plain ``transformers`` model to
    save), the projection given to the block."""
    projection = tower._modules.pop(PROJECTION, None)
    try:
        yield projection
    finally:
        if projection is not None:
            tower._modules[PROJECTION] = projection


@dataclass(frozen=True)
class FolderVectors:
    """What a multi-vector folder holds: its projection's weight and what it scores."""

    weight: Tensor
    spec: MultiVector


def read_folder(path: Path) -> FolderVectors:
    """A sentence-transformers ``MultiVectorEncoder`` or PyLate folder's projection (its Dense
    module's weights, safetensors or a PyTorch file), skiplist and query expansion; InputError
    for a folder without its projection, and for what dpr-cache does not read yet (a residual
    or biased projection, query expansion of strategy ``min``)."""
    path = Path(path)
    dense = next((m for m in shipped_modules(path) if m.get("type", "").endswith("Dense")), None)
    weights = _dense_weights(path / dense.get("path", "")) if dense is not None else None
    if weights is None:
        raise InputError(f"{path}: a multi-vector model folder without its projection (1_Dense)")
    config = json.loads((weights.parent / "config.json").read_text())
    if config.get("bias") or config.get("use_residual"):
        raise InputError(
            f"{weights.parent}: a projection with a bias or a residual is not read yet"
        )
    weight = _load_weight(weights)
    expansion = shipped_expansion(path)
    spec = MultiVector(
        int(weight.shape[0]),
        tuple(shipped_skiplist(path)),
        Expansion(**expansion) if expansion else None,
    )
    return FolderVectors(weight, spec)


def _dense_weights(folder: Path) -> Path | None:
    """The file a Dense module's weights are in (None: none)."""
    for name in ("model.safetensors", "pytorch_model.bin"):
        if (folder / name).is_file():
            return folder / name
    return None


def _load_weight(file: Path) -> Tensor:
    """The projection's ``linear.weight`` from a safetensors or PyTorch file."""
    if file.suffix == ".safetensors":
        return load_file(str(file))["linear.weight"]
    return torch.load(file, map_location="cpu", weights_only=True)["linear.weight"]


def write_folder(
    out: Path,
    projection: nn.Linear,
    spec: MultiVector,
    *,
    prompts: dict[str, str],
    lengths: tuple[int | None, int | None],
) -> None:
    """The sentence-transformers ``MultiVectorEncoder`` modules beside a tower saved at
    ``out`` (its backbone already there): ``modules.json``, the Transformer's settings (the
    question and passage lengths), ``1_Dense``, ``2_MultiVectorMask``, ``3_Normalize`` and
    the model's settings (MaxSim, the prompts)."""
    out = Path(out)
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": _TYPES["transformer"]},
        {"idx": 1, "name": "1", "path": "1_Dense", "type": _TYPES["dense"]},
        {"idx": 2, "name": "2", "path": "2_MultiVectorMask", "type": _TYPES["mask"]},
        {"idx": 3, "name": "3", "path": "3_Normalize", "type": _TYPES["normalize"]},
    ]
    _write_json(out / "modules.json", modules)
    transformer = {
        "transformer_task": "feature-extraction",
        "modality_config": {
            "text": {"method": "forward", "method_output_name": "last_hidden_state"}
        },
        "module_output_name": "token_embeddings",
    }
    query_length, passage_length = lengths
    if query_length:
        transformer["query_length"] = int(query_length)
    if spec.expansion is not None:
        transformer["query_expansion"] = {"strategy": "fixed", **spec.expansion.record()}
    if passage_length:
        transformer["document_length"] = int(passage_length)
    _write_json(out / "sentence_bert_config.json", transformer)
    dense = {
        "in_features": int(projection.in_features),
        "out_features": int(projection.out_features),
        "bias": False,
        "activation_function": "torch.nn.modules.linear.Identity",
        "module_input_name": "token_embeddings",
        "module_output_name": "token_embeddings",
    }
    _write_json(out / "1_Dense" / "config.json", dense)
    weight = projection.weight.detach().to("cpu").contiguous()
    save_file({"linear.weight": weight}, str(out / "1_Dense" / "model.safetensors"))
    mask = {"skiplist_words": list(spec.skiplist), "skiplist_tasks": ["document"]}
    _write_json(out / "2_MultiVectorMask" / "config.json", {**mask, "keep_only_token_ids": None})
    token_level = {
        "module_input_name": "token_embeddings",
        "module_output_name": "token_embeddings",
    }
    _write_json(out / "3_Normalize" / "config.json", token_level)
    settings = {
        "model_type": "MultiVectorEncoder",
        "prompts": {"query": prompts.get("query", ""), "document": prompts.get("document", "")},
        "default_prompt_name": None,
        "similarity_fn_name": "maxsim",
    }
    _write_json(out / "config_sentence_transformers.json", settings)


def _write_json(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2) + "\n")
