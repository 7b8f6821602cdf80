"""BiEncoder: a question tower and a passage tower (Hugging Face encoders), shared or separate.

Saved layout (``save_pretrained(dir)``)::

    dir/query_encoder/      a complete transformers and sentence-transformers folder (see
                            :mod:`dpr_cache.model.tower_files`)
    dir/passage_encoder/    the same for passages (a copy of the query tower when shared)
    dir/biencoder.json      {"shared", "pooling", "normalize", "max_query_length",
                             "max_passage_length", "query_prefix", "passage_prefix"}: the
                            model's record of how it encodes (its query encoding,
                            :mod:`dpr_cache.model.encoding`)
    dir/tokenizer files     when the BiEncoder carries a tokenizer
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import Tensor, nn
from transformers import PretrainedConfig

from dpr_cache.model.dpr_formats import dpr_kind, load_dpr_towers
from dpr_cache.model.encoding import ENCODING_FILE, QueryEncoding
from dpr_cache.model.hub import resolve_model_path
from dpr_cache.model.pooling import POOLINGS, pool
from dpr_cache.model.tower_files import clean_tokenizer, write_tower
from dpr_cache.model.towers import (
    load_tokenizer,
    load_tower,
    shipped_normalize,
    shipped_pooling,
    shipped_prefixes,
    tower_from_config,
)

__all__ = ["BiEncoder"]

_META = ENCODING_FILE


class BiEncoder(nn.Module):
    """DPR's two encoders; ``encode_query`` / ``encode_passage`` map tokenized inputs to reps.

    Args:
        query_encoder: a Hugging Face encoder (``last_hidden_state`` output).
        passage_encoder: the passage tower; ``None`` shares the query tower.
        pooling: ``"cls"`` (DPR) or ``"mean"`` (masked mean, sentence-transformers).
        tokenizer: optional, saved beside the towers.
        max_query_length, max_passage_length: the token limits it was trained with, saved so
            that ``dpr-cache encode`` needs no config (None: not known).
        normalize: scale every vector to unit length (cosine similarity), after pooling.
        query_prefix, passage_prefix: the model's prompts (e.g. ``"query: "``), prepended to
            every question and to every passage pair's first text wherever it encodes
            (:mod:`dpr_cache.data.tokenize`), and saved as its sentence-transformers prompts.
    """

    def __init__(
        self,
        query_encoder: nn.Module,
        passage_encoder: nn.Module | None = None,
        *,
        pooling: str = "cls",
        tokenizer=None,
        max_query_length: int | None = None,
        max_passage_length: int | None = None,
        normalize: bool = False,
        query_prefix: str = "",
        passage_prefix: str = "",
    ) -> None:
        super().__init__()
        if pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {POOLINGS}, got {pooling!r}")
        self.query_encoder = query_encoder
        self.shared = passage_encoder is None or passage_encoder is query_encoder
        self.passage_encoder = query_encoder if self.shared else passage_encoder
        self.pooling = pooling
        self.tokenizer = tokenizer
        self.max_query_length = max_query_length
        self.max_passage_length = max_passage_length
        self.normalize = normalize
        self.query_prefix, self.passage_prefix = query_prefix, passage_prefix

    # -- construction -----------------------------------------------------------------------

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        shared: bool = False,
        pooling: str | None = None,
        gradient_checkpointing: bool = False,
        dropout: float | None = None,
        normalize: bool | None = None,
    ) -> BiEncoder:
        """Load a saved BiEncoder folder, or any Hugging Face model (a folder or a hub name, see
        :func:`~dpr_cache.model.hub.resolve_model_path`) for both towers.

        ``pooling=None`` and ``normalize=None`` keep what the model ships: a saved BiEncoder's
        settings (which always win for pooling), or a sentence-transformers folder's Pooling and
        Normalize modules; else CLS pooling (DPR's) without normalization."""
        path = resolve_model_path(path)
        if dpr_kind(path) is not None:  # HF DPR pair or DPR's .cp: two BERTs, [CLS], no norm
            query, passage, tokenizer = load_dpr_towers(path, dropout)
            model = cls(query, None if shared else passage, pooling="cls", tokenizer=tokenizer)
            if gradient_checkpointing:
                model.enable_gradient_checkpointing()
            return model
        if not path.is_dir():
            raise FileNotFoundError(2, "no such model folder", str(path))
        meta = {}
        if (path / "query_encoder").is_dir():
            meta = json.loads((path / _META).read_text()) if (path / _META).is_file() else {}
            query = load_tower(path / "query_encoder", dropout)
            passage = None if shared else load_tower(path / "passage_encoder", dropout)
            pooling = meta.get("pooling", pooling)
        else:
            query = load_tower(path, dropout)
            passage = None if shared else copy.deepcopy(query)
            meta = {"normalize": shipped_normalize(path), **shipped_prefixes(path)}
            pooling = pooling or shipped_pooling(path)
        model = cls(
            query,
            passage,
            pooling=pooling or "cls",
            tokenizer=load_tokenizer(path),
            max_query_length=meta.get("max_query_length"),
            max_passage_length=meta.get("max_passage_length"),
            normalize=bool(meta.get("normalize", False)) if normalize is None else normalize,
            query_prefix=meta.get("query_prefix", ""),
            passage_prefix=meta.get("passage_prefix", ""),
        )
        if gradient_checkpointing:
            model.enable_gradient_checkpointing()
        return model

    @classmethod
    def from_config(
        cls,
        config: PretrainedConfig,
        shared: bool = False,
        pooling: str = "cls",
        gradient_checkpointing: bool = False,
        dropout: float | None = None,
        tokenizer=None,
        normalize: bool = False,
    ) -> BiEncoder:
        """Random-init towers from a Hugging Face config (separate towers start equal)."""
        query = tower_from_config(config, dropout)
        passage = None if shared else copy.deepcopy(query)
        model = cls(query, passage, pooling=pooling, tokenizer=tokenizer, normalize=normalize)
        if gradient_checkpointing:
            model.enable_gradient_checkpointing()
        return model

    def enable_gradient_checkpointing(self) -> None:
        """Recompute each layer's activations in the backward (non-reentrant checkpoints)."""
        towers = [self.query_encoder] + ([] if self.shared else [self.passage_encoder])
        for tower in towers:
            if hasattr(tower, "activation_checkpointing_enable"):  # transformers >= 5.x
                tower.activation_checkpointing_enable({"use_reentrant": False})
            else:
                tower.gradient_checkpointing_enable({"use_reentrant": False})

    def save_pretrained(self, out_dir: str | Path) -> Path:
        """Write both towers (each a complete transformers and sentence-transformers folder),
        the pooling and normalization, and the tokenizer into ``out_dir`` (the trainer passes it
        to :func:`~dpr_cache.runtime.atomic.write_dir_atomic`, so a finished run's folder is
        swapped in whole)."""
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        for name, tower, length, prompt in (
            (
                "query_encoder",
                self.query_encoder,
                self.max_query_length,
                ("query", self.query_prefix),
            ),
            (
                "passage_encoder",
                self.passage_encoder,
                self.max_passage_length,
                ("document", self.passage_prefix),
            ),
        ):
            write_tower(
                tower,
                out_dir / name,
                tokenizer=self.tokenizer,
                pooling=self.pooling,
                normalize=self.normalize,
                max_length=length,
                prompt=prompt,
            )
        meta = {
            "shared": self.shared,
            "pooling": self.pooling,
            "normalize": self.normalize,
            "max_query_length": self.max_query_length,
            "max_passage_length": self.max_passage_length,
            "query_prefix": self.query_prefix,
            "passage_prefix": self.passage_prefix,
        }
        (out_dir / _META).write_text(json.dumps(meta, indent=2) + "\n")
        if self.tokenizer is not None:
            clean_tokenizer(self.tokenizer).save_pretrained(out_dir)
        return out_dir

    # -- encoding ---------------------------------------------------------------------------

    def encode_query(self, inputs: Mapping[str, Tensor]) -> Tensor:
        """Question reps [n, hidden] from tokenized questions."""
        return self.encode_with(self.query_encoder, inputs)

    def encode_passage(self, inputs: Mapping[str, Tensor]) -> Tensor:
        """Passage reps [n, hidden] from tokenized (title, text) pairs."""
        return self.encode_with(self.passage_encoder, inputs)

    def forward(
        self,
        query: Mapping[str, Tensor] | None = None,
        passage: Mapping[str, Tensor] | None = None,
    ) -> tuple[Tensor | None, Tensor | None]:
        """Either or both towers, so one ``DistributedDataParallel`` wrapper serves both."""
        q_reps = self.encode_query(query) if query is not None else None
        p_reps = self.encode_passage(passage) if passage is not None else None
        return q_reps, p_reps

    def encode_with(self, tower: nn.Module, inputs: Mapping[str, Tensor]) -> Tensor:
        """Run ``tower`` (one of ours, possibly DDP-wrapped) and pool its last hidden state."""
        hidden = tower(**inputs).last_hidden_state  # [n, seq, hidden]
        reps = pool(hidden, inputs["attention_mask"], self.pooling)  # [n, hidden]
        return torch.nn.functional.normalize(reps, dim=-1) if self.normalize else reps

    @property
    def query_encoding(self) -> QueryEncoding:
        """How this model encodes a question (its prefix, pooling, normalization, length)."""
        return QueryEncoding(self.query_prefix, self.pooling, self.normalize, self.max_query_length)

    @property
    def dim(self) -> int:
        return int(self.query_encoder.config.hidden_size)

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device
