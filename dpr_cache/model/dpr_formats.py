"""DPR's own model formats, both ways.

- Export: a BiEncoder as Hugging Face's ``DPRQuestionEncoder`` / ``DPRContextEncoder`` pair
  (``OUT/question_encoder``, ``OUT/ctx_encoder``, each with its tokenizer), whose
  ``pooler_output`` is DPR's [CLS] vector, so only CLS pooling without normalization exports.
- Import: such a pair (a folder holding both), or DPR's own biencoder checkpoint (a ``.cp`` file
  of ``question_model.*`` / ``ctx_model.*`` weights, a pickle: trusted input only), each tower
  loaded as the BERT it wraps; a tokenizer must sit beside a ``.cp`` (DPR does not save one),
  and the BERT's ``config.json`` may (else sizes are read off the weights, with BERT's 64
  dimensions an attention head).
"""

from __future__ import annotations

import json
import pickle
import re
from pathlib import Path

import torch
from torch import nn
from transformers import AutoTokenizer, BertConfig, BertModel, DPRConfig

from dpr_cache.errors import InputError
from dpr_cache.model.tower_files import clean_tokenizer

__all__ = ["DPR_HF_FOLDERS", "export_dpr_hf", "dpr_kind", "load_dpr_towers"]

DPR_HF_FOLDERS = ("question_encoder", "ctx_encoder")  # what an export writes into its folder
_CLASSES = {"question_encoder": "DPRQuestionEncoder", "ctx_encoder": "DPRContextEncoder"}


def _architecture(folder: Path) -> str | None:
    config = folder / "config.json"
    if not config.is_file():
        return None
    return (json.loads(config.read_text()).get("architectures") or [None])[0]


def dpr_kind(path: Path) -> str | None:
    """``"hf-pair"``, ``"cp"`` or None (not a DPR model). InputError for half of a pair."""
    path = Path(path)
    if path.is_file() and path.suffix == ".cp":
        return "cp"
    if path.is_dir() and all(_architecture(path / p) == _CLASSES[p] for p in DPR_HF_FOLDERS):
        return "hf-pair"
    found = _architecture(path) if path.is_dir() else None
    if found in _CLASSES.values():
        raise InputError(
            f"{path}: a lone {found}: give the folder holding question_encoder/ and ctx_encoder/"
        )
    return None


def export_dpr_hf(model, out: Path) -> Path:
    """Write ``out/question_encoder`` and ``out/ctx_encoder`` for HF's DPR classes."""
    if getattr(model.query_encoder.config, "model_type", None) != "bert":
        raise InputError("export --format dpr-hf: HF's DPR classes hold BERT towers only")
    if model.multi is not None:
        raise InputError(
            "export --format dpr-hf: HF's DPR classes encode one vector a text; this model "
            "encodes a vector a token (its folder loads in sentence-transformers' "
            "MultiVectorEncoder as it is)"
        )
    if model.pooling != "cls" or model.normalize:
        raise InputError(
            f"export --format dpr-hf: DPR's pooler_output is the raw [CLS] vector; this model "
            f"pools with {model.pooling!r}{' and normalizes' if model.normalize else ''}, so HF's "
            "DPR classes would give other vectors"
        )
    if model.query_prefix or model.passage_prefix:
        raise InputError(
            "export --format dpr-hf: this model prepends prompts to its inputs "
            f"({model.query_prefix!r}, {model.passage_prefix!r}), which HF's DPR classes cannot "
            "record: they would give other vectors"
        )
    from transformers import DPRContextEncoder, DPRQuestionEncoder

    for name, cls, tower in (
        ("question_encoder", DPRQuestionEncoder, model.query_encoder),
        ("ctx_encoder", DPRContextEncoder, model.passage_encoder),
    ):
        dpr = cls(DPRConfig(**_bert_fields(tower.config), projection_dim=0))
        weights = {k: v for k, v in tower.state_dict().items() if not k.startswith("pooler.")}
        getattr(dpr, name).bert_model.load_state_dict(weights)
        dpr.save_pretrained(Path(out) / name)
        if model.tokenizer is not None:
            clean_tokenizer(model.tokenizer).save_pretrained(Path(out) / name)
    return Path(out)


def _bert_fields(config) -> dict:
    keys = (
        "vocab_size",
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "intermediate_size",
        "hidden_act",
        "hidden_dropout_prob",
        "attention_probs_dropout_prob",
        "max_position_embeddings",
        "type_vocab_size",
        "initializer_range",
        "layer_norm_eps",
        "pad_token_id",
    )
    return {k: getattr(config, k) for k in keys if hasattr(config, k)}


def _bert_from(config_fields: dict, weights: dict[str, torch.Tensor], dropout) -> nn.Module:
    config = BertConfig(**config_fields)
    if dropout is not None:
        config.hidden_dropout_prob = config.attention_probs_dropout_prob = dropout
    bert = BertModel(config, add_pooling_layer=False)
    missing, unexpected = bert.load_state_dict(weights, strict=False)
    real_missing = [k for k in missing if "position_ids" not in k]
    if real_missing or unexpected:
        raise InputError(
            f"weights do not fit a BERT: missing {real_missing[:3]}, unexpected {unexpected[:3]}"
        )
    return bert


def _config_from_weights(weights: dict[str, torch.Tensor]) -> dict:
    """A BERT config read off the tensors' shapes (DPR's checkpoints name only the hub model)."""
    vocab, hidden = weights["embeddings.word_embeddings.weight"].shape
    numbers = [re.match(r"encoder\.layer\.(\d+)\.", k) for k in weights]
    layers = 1 + max(int(m.group(1)) for m in numbers if m)
    return {
        "vocab_size": vocab,
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": max(1, hidden // 64),
        "intermediate_size": weights["encoder.layer.0.intermediate.dense.weight"].shape[0],
        "max_position_embeddings": weights["embeddings.position_embeddings.weight"].shape[0],
        "type_vocab_size": weights["embeddings.token_type_embeddings.weight"].shape[0],
    }


def load_dpr_towers(path: Path, dropout: float | None = None):
    """(question tower, passage tower, tokenizer) of an HF DPR pair or a DPR ``.cp`` file."""
    path = Path(path)
    if dpr_kind(path) == "hf-pair":
        from transformers import DPRContextEncoder, DPRQuestionEncoder

        q = DPRQuestionEncoder.from_pretrained(path / "question_encoder")
        c = DPRContextEncoder.from_pretrained(path / "ctx_encoder")
        if q.config.projection_dim or c.config.projection_dim:
            raise InputError(
                f"{path}: a DPR model with a projection layer (projection_dim > 0) "
                "is not supported: its vectors are not the [CLS] state"
            )
        towers = []
        for dpr, inner in ((q, q.question_encoder), (c, c.ctx_encoder)):
            towers.append(
                _bert_from(_bert_fields(dpr.config), inner.bert_model.state_dict(), dropout)
            )
        return towers[0], towers[1], AutoTokenizer.from_pretrained(path / "question_encoder")
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)  # a pickle: trusted input
    except ModuleNotFoundError as e:  # e.g. Hydra-era checkpoints pickle omegaconf objects
        raise InputError(f"{path}: unpickling needs {e.name} (pip install {e.name})") from None
    except (pickle.UnpicklingError, EOFError, RuntimeError, ValueError) as e:
        raise InputError(
            f"{path}: not a readable checkpoint ({' '.join(str(e).split())[:120]})"
        ) from None
    weights = state.get("model_dict", state) if isinstance(state, dict) else None
    names = [str(k) for k in weights] if isinstance(weights, dict) else []
    if any(k.startswith(("question_model.encode_proj", "ctx_model.encode_proj")) for k in names):
        raise InputError(
            f"{path}: a DPR model with a projection layer (encode_proj) is not "
            "supported: its vectors are not the [CLS] state"
        )
    if not any(k.startswith("question_model.") for k in names):
        raise InputError(f"{path}: not a DPR biencoder checkpoint (no question_model.* weights)")
    beside = path.parent / "config.json"  # a BERT config beside it, else read off the shapes
    towers = []
    for prefix in ("question_model.", "ctx_model."):
        part = {k[len(prefix) :]: v for k, v in weights.items() if k.startswith(prefix)}
        part = {k: v for k, v in part.items() if not k.startswith(("pooler.", "encode_proj."))}
        try:
            fields = _config_from_weights(part)
        except (KeyError, ValueError):
            raise InputError(f"{path}: {prefix}* weights are not a BERT's") from None
        if beside.is_file():
            fields = {**fields, **_bert_fields(BertConfig.from_pretrained(path.parent))}
        towers.append(_bert_from(fields, part, dropout))
    if not any((path.parent / f).is_file() for f in ("vocab.txt", "tokenizer.json")):
        raise InputError(
            f"{path}: no tokenizer beside it (DPR checkpoints carry none): put its "
            "BERT's vocab.txt or tokenizer.json in the same folder"
        )
    return towers[0], towers[1], AutoTokenizer.from_pretrained(path.parent)
