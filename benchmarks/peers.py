"""Peers on our model, batch and mini-batch, with our steppers' ``.step(q, p, p_ids=...)``:
sentence-transformers' cached MNRL loss and the GradCache library, given the very module our modes
train, the same pooling, a dot product at temperature 1 and mean reduction: our loss."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from types import ModuleType

from torch import Tensor, nn

from dpr_cache.core.loss import contrastive_loss
from dpr_cache.model.biencoder import BiEncoder

PEERS = ("st-cmnrl", "gradcache-lib")


def import_gradcache_lib() -> ModuleType:
    """The GradCache library as ``grad_cache``: the PyPI package ``gradcache`` installs a folder
    ``gradcache`` whose modules import ``grad_cache.*``, so it is loaded under that name."""
    if "grad_cache" not in sys.modules:
        found = importlib.util.find_spec("grad_cache") or importlib.util.find_spec("gradcache")
        if found is None or found.origin is None:
            raise ModuleNotFoundError(
                "the GradCache library is not installed (pip install gradcache)"
            )
        where = found.submodule_search_locations
        spec = importlib.util.spec_from_file_location(
            "grad_cache", found.origin, submodule_search_locations=where
        )
        sys.modules["grad_cache"] = module = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(module)
            importlib.import_module("grad_cache.grad_cache")
        except Exception:
            del sys.modules["grad_cache"]
            raise
    return sys.modules["grad_cache"]


def peer_available(name: str) -> bool:
    """Whether a peer's package imports in this environment."""
    try:
        if name == "gradcache-lib":
            import_gradcache_lib()
        else:
            importlib.import_module("sentence_transformers")
    except Exception:
        return False
    return True


class _Pooled(nn.Module):
    """One tower of a BiEncoder as a module mapping tokenized inputs to pooled reps."""

    def __init__(self, model: BiEncoder, tower: nn.Module) -> None:
        super().__init__()
        self.model, self.tower = model, tower

    def forward(self, **inputs: Tensor) -> Tensor:
        return self.model.encode_with(self.tower, inputs)


class GradCacheLibStep:
    """``grad_cache.GradCache`` on both towers, chunk ``chunk_size`` or [questions, passages]."""

    def __init__(self, model: BiEncoder, chunk_size: int | list[int]) -> None:
        import_gradcache_lib()
        lib = importlib.import_module("grad_cache.grad_cache")
        q = _Pooled(model, model.query_encoder)
        p = q if model.shared else _Pooled(model, model.passage_encoder)
        self.p_ids: Tensor | None = None
        self.engine = lib.GradCache(models=[q, p], chunk_sizes=chunk_size, loss_fn=self._loss)

    def _loss(self, q: Tensor, p: Tensor) -> Tensor:
        return contrastive_loss(q, p, p_ids=self.p_ids)

    def step(self, q_inputs: dict, p_inputs: dict, p_ids: Tensor | None = None) -> Tensor:
        self.p_ids = p_ids
        return self.engine(q_inputs, p_inputs)


class CachedMNRLStep:
    """sentence-transformers' ``CachedMultipleNegativesRankingLoss`` (dot product, scale 1) on
    shared towers: each group's first passage the positive, every passage row a candidate, as
    ours; no passage ids (no false-negative mask). Its Transformer module is loaded from
    ``st_folder`` (default: the model's own folder), then given our tower to run."""

    def __init__(self, model: BiEncoder, chunk_size: int, st_folder: str | None = None) -> None:
        if not model.shared:
            raise ValueError("st-cmnrl encodes both sides with one model: needs model.shared")
        from sentence_transformers import SentenceTransformer
        from sentence_transformers.sentence_transformer.losses import (
            CachedMultipleNegativesRankingLoss,
        )
        from sentence_transformers.sentence_transformer.modules import Pooling, Transformer
        from sentence_transformers.util import dot_score

        transformer = Transformer(st_folder or model.query_encoder.config._name_or_path)
        transformer.model = model.query_encoder  # the very module our modes train
        mode = {"last": "lasttoken"}.get(model.pooling, model.pooling)
        pooling = Pooling(model.dim, pooling_mode=mode)
        self.st = SentenceTransformer(modules=[transformer, pooling], device=str(model.device))
        self.st.train()
        self.loss = CachedMultipleNegativesRankingLoss(
            self.st, scale=1.0, similarity_fct=dot_score, mini_batch_size=chunk_size
        )

    def step(self, q_inputs: dict, p_inputs: dict, p_ids: Tensor | None = None) -> Tensor:
        loss = self.loss(cmnrl_features(q_inputs, p_inputs), None)
        loss.backward()
        return loss.detach()


def cmnrl_features(q_inputs: dict, p_inputs: dict) -> list[dict]:
    """CachedMNRL's columns of our batch: the questions, then each group's k-th passage."""
    group = len(p_inputs["input_ids"]) // len(q_inputs["input_ids"])
    features = [dict(q_inputs)]
    return features + [{k: v[h::group] for k, v in p_inputs.items()} for h in range(group)]


def st_model_over(model: BiEncoder, folder: str):
    """A SentenceTransformer loaded from ``folder`` (its own modules: pooling, normalization,
    sequence length) whose Transformer module runs ``model``'s query tower, in train mode."""
    from sentence_transformers import SentenceTransformer

    from dpr_cache.model.hub import resolve_model_path

    st = SentenceTransformer(str(resolve_model_path(folder)), device=str(model.device))
    st[0].model = model.query_encoder
    return st.train()


def make_peer(name: str, model: BiEncoder, chunk_size: int):
    """A step object for peer ``name`` (one of :data:`PEERS`) on ``model``."""
    return {"st-cmnrl": CachedMNRLStep, "gradcache-lib": GradCacheLibStep}[name](model, chunk_size)
