"""A frozen guide model (GIST, ``train.guide``): its own tokenizer and encoding, vectors of the
batch's rows without a graph, never trained or saved with the run."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from dpr_cache.core.inputs import Inputs, batch_rows, cut_chunks
from dpr_cache.errors import InputError
from dpr_cache.model.biencoder import BiEncoder
from dpr_cache.model.hub import ModelNotFound, resolve_model_path
from dpr_cache.model.loading import load_encoder

__all__ = ["GuideModel", "GuideText", "load_guide"]


@dataclass(frozen=True)
class GuideText:
    """How the guide reads the batch's texts: its tokenizer and prompts (a batch recipe's
    part: the rows are tokenized twice, for the student and for the guide)."""

    tokenizer: object
    query_prefix: str = ""
    passage_prefix: str = ""


@dataclass
class GuideModel:
    """The guide's towers (eval mode, frozen) and the chunks it encodes in: ``chunk_rows``
    rows, at most ``chunk_tokens`` attended tokens where given (as GradCache cuts them)."""

    model: BiEncoder
    chunk_rows: int
    chunk_tokens: int | None = None

    @property
    def text(self) -> GuideText:
        return GuideText(self.model.tokenizer, self.model.query_prefix, self.model.passage_prefix)

    @torch.no_grad()
    def reps(self, q_inputs: Inputs, p_inputs: Inputs) -> dict[str, Tensor]:
        """The guide's vectors of the questions and passages (``guide_q``, ``guide_p``), each
        tower encoded ``chunk_rows`` rows at a time without a graph (its eval mode: no
        dropout)."""
        return {
            "guide_q": self._encode(self.model.encode_query, q_inputs),
            "guide_p": self._encode(self.model.encode_passage, p_inputs),
        }

    def _encode(self, encode, inputs: Inputs) -> Tensor:
        """Rows in chunks as GradCache cuts them (longest first, each cut to its longest row),
        the vectors put back in batch order."""
        device = self.model.device
        moved = {k: v.to(device) for k, v in inputs.items()}
        chunks = cut_chunks(moved, self.chunk_rows, max_tokens=self.chunk_tokens)
        parts = [encode(chunk).float() for chunk in chunks.parts]
        if chunks.rows is None:
            return torch.cat(parts)
        out = parts[0].new_empty((batch_rows(inputs), parts[0].shape[1]))
        for rows, part in zip(chunks.rows, parts, strict=True):
            out[rows] = part
        return out


def load_guide(
    path: str, device: torch.device, chunk_rows: int, chunk_tokens: int | None = None
) -> GuideModel:
    """The guide model folder ``path`` (``train.guide``: a dpr-cache model, a transformers or
    a sentence-transformers folder, encoding as it ships) on ``device``, frozen; InputError
    naming the key when the folder is missing or has no tokenizer."""
    try:
        folder = resolve_model_path(path)
    except ModelNotFound as e:
        raise InputError(f"train.guide: {e}") from None
    if not Path(folder).is_dir():
        raise InputError(f"train.guide: {path}: no such model folder")
    try:
        model = load_encoder(Path(folder))
    except InputError as e:
        raise InputError(f"train.guide: {e}") from None
    if model.multi is not None:
        raise InputError(
            f"train.guide: {path} is a multi-vector model; a guide scores with one vector a text"
        )
    model.requires_grad_(False)
    return GuideModel(model.to(device), chunk_rows, chunk_tokens)
