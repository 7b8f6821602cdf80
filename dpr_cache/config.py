"""Typed run configuration: YAML in, ``key=value`` overrides, loud errors, resolved YAML out.

Every section forbids unknown keys, so a typo such as ``train.lrr`` is an error naming the key
and the file, never a silently ignored setting. Relative paths are taken from the working
directory, as the shell would.
"""

from __future__ import annotations

import difflib
import re
import types
import typing
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from dpr_cache.errors import InputError
from dpr_cache.runtime.atomic import write_text_atomic

__all__ = [
    "Config",
    "LoraConfig",
    "TrainSource",
    "TrainConfig",
    "load_config",
    "save_config",
    "parse_bytes",
    "default_of",
    "check_flags",
    "changed_settings",
]


Precision = Literal["fp32", "bf16", "fp16"]
Direction = Literal["query_to_passage", "passage_to_query", "query_to_query", "passage_to_passage"]
# where a command encodes (index, eval): auto is resolved for its device by
# runtime.device.resolve_precision (bf16 on CUDA from compute capability 8.0, else fp16; fp32
# on the CPU)
EncodePrecision = Literal["auto", "fp32", "bf16", "fp16"]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class LoraConfig(_Section):
    """LoRA adapters trained through peft on a frozen base (``model.lora``)."""

    r: int = Field(16, ge=1)  # the adapters' rank
    alpha: float = Field(32.0, gt=0.0)  # their scale is alpha / r
    dropout: float = Field(0.05, ge=0.0, lt=1.0)  # on each adapter's input, replayed by GradCache
    # the layers adapted: names of linear layers (as peft matches them, e.g. q_proj, v_proj),
    # or all-linear (every linear layer of the tower)
    target_modules: list[str] | Literal["all-linear"] = "all-linear"

    @field_validator("target_modules")
    @classmethod
    def _targets_named(cls, value: list[str] | str) -> list[str] | str:
        if isinstance(value, list) and (not value or not all(name.strip() for name in value)):
            raise ValueError("must be 'all-linear' or a non-empty list of layer names")
        return value


class ModelConfig(_Section):
    name_or_path: str = "data/toy/tiny-bert"
    shared: bool = False
    # cls (DPR), mean (masked mean), last (each row's final real token, decoders: the tokenizer's
    # EOS appended where its template does not add one); null = as the model records (a
    # dpr-cache or sentence-transformers folder), else cls (last for a decoder-only model)
    pooling: Literal["cls", "mean", "last"] | None = None
    gradient_checkpointing: bool = False
    max_query_length: int = Field(32, ge=4)
    max_passage_length: int = Field(256, ge=8)
    dropout: float | None = Field(None, ge=0.0, lt=1.0)
    normalize: bool | None = None  # unit vectors (cosine); null = as the model ships
    query_prefix: str | None = None  # prepended to every question; null = as the model ships
    passage_prefix: str | None = None  # before every passage's title; null = as the model ships
    # the dtype the weights are loaded and kept in (train.precision is autocast beside it); the
    # GradCache cache and the loss stay fp32. fp16 needs a GPU
    dtype: Literal["fp32", "bf16", "fp16"] = "fp32"
    # transformers' attention; flash_attention_2 where the flash-attn package is installed
    attn_implementation: Literal["auto", "sdpa", "eager", "flash_attention_2"] = "auto"
    lora: LoraConfig | None = None  # null: every weight trains (full fine-tuning)
    # single: one vector a text (pooled); multi: a vector a token (late interaction, MaxSim);
    # null = as the model records (a multi-vector folder is multi), else single
    vectors: Literal["single", "multi"] | None = None
    # multi: the token vectors' width (a projection of the last hidden state); null = as the
    # model records, else 128 (or the width where smaller)
    multi_dim: int | None = Field(None, ge=1)


class TrainSource(_Section):
    """One training source of ``data.train`` (docs/data.md): where it is, how it is read, and
    what its batches take (null: the run's own setting)."""

    path: str
    name: str | None = None  # in the log and the model's prompts; null = the file's stem
    # dpr | sentence_transformers | tevatron | beir; null = recognised from the columns
    format: Literal["dpr", "sentence_transformers", "tevatron", "beir"] | None = None
    columns: dict[str, str] | None = None  # {the file's column: the layout's column}
    split: str = "train"  # a datasets folder's split, a BEIR folder's qrels
    weight: float | None = Field(None, ge=0.0)  # its share of the batches (proportional)
    query_prefix: str | None = None  # its questions' prompt (an instruction); null = the model's
    passage_prefix: str | None = None  # its passages' prompt; null = the model's
    hard_negatives: int | None = Field(None, ge=0)  # its own negatives a question, at most


def _source_at(i: int, item: dict[str, Any]) -> TrainSource:
    """``data.train``'s item ``i`` as a source; ValueError naming its key and what it takes."""
    try:
        return TrainSource.model_validate(item)
    except ValidationError as e:
        first = e.errors()[0]
        key = ".".join(str(p) for p in first["loc"][:1])
        where = f"data.train[{i}].{key}"
        if first["type"] == "extra_forbidden":
            keys = ", ".join(TrainSource.model_fields)
            raise ValueError(f"unknown key '{where}' (a source takes {keys})") from None
        if first["type"] == "missing":
            raise ValueError(f"{where}: missing (the source's file or folder)") from None
        message = first["msg"].removeprefix("Value error, ")
        raise ValueError(f"{where}: {message} (got {first.get('input')!r})") from None


class DataConfig(_Section):
    # a training file, or a list of sources: files read as one (paths), or mappings (TrainSource)
    train: str | list[str | TrainSource] | None = None
    # one source a batch, chosen by weight (proportional) or in turn (round_robin); or rows of
    # every source in each batch (mixed: files listed as paths read as one)
    batching: Literal["proportional", "round_robin", "mixed"] = "mixed"

    @field_validator("train", mode="before")
    @classmethod
    def _sources(cls, value: Any) -> Any:
        """Each item a path or a source's mapping, its errors named by its place in the list."""
        if not isinstance(value, list):
            return value
        items = []
        for i, item in enumerate(value):
            if isinstance(item, str):
                items.append(item)
            elif isinstance(item, dict):
                items.append(_source_at(i, item))
            else:
                raise ValueError(
                    f"item {i + 1} is {item!r}: each source is a path or a mapping of "
                    f"{', '.join(TrainSource.model_fields)}"
                )
        return items

    passages: str | None = None
    dev_qa: str | list[str] | None = None  # a qas file, or several (eval: a row each)
    qrels: str | None = None  # TREC qrels judging dev_qa's questions (BEIR); null = answer match
    cache_dir: str | None = None  # Arrow caches of large files; default ~/.cache/dpr-cache
    num_workers: int = Field(1, ge=0)  # tokenizing processes ahead of train and encode; 0: inline


class TrainConfig(_Section):
    mode: Literal["gradcache", "full", "accumulate"] = "gradcache"
    batch_size: int = Field(128, ge=1)  # global questions per step
    chunk_size: int | Literal["auto"] = 16  # questions per chunk (gradcache, accumulate)
    p_chunk_size: int | None = Field(None, ge=1)  # passages per chunk; default chunk_size
    memory_budget: str | None = None  # e.g. "4GB", for chunk_size: auto
    hard_negatives: int = Field(1, ge=0)
    epochs: int = Field(1, ge=1)
    max_steps: int | None = Field(None, ge=1)  # stop early; the schedule still spans it
    lr: float = Field(2e-5, gt=0.0)
    weight_decay: float = Field(0.0, ge=0.0)
    adam_eps: float = Field(1e-8, gt=0.0)
    warmup_steps: int = Field(0, ge=0)
    max_grad_norm: float | None = Field(2.0, gt=0.0)  # DPR clips at 2.0; null = no clipping
    # fp16: the most steps skipped in a row (a loss or gradient not finite); one more stops the
    # run, its last checkpoint kept. The loss scale halves at each skip: 10 take it from 2**16
    # to 64, past any overflow a scale cures; null = never stop (docs/reliability.md)
    max_skipped_steps: int | None = Field(10, ge=1)
    temperature: float = Field(1.0, gt=0.0)
    loss: Literal["contrastive", "distill_kl", "margin_mse"] = "contrastive"
    distill_weight: float | None = Field(None, ge=0.0, lt=1.0)  # contrastive share; null = 0
    teacher_temperature: float | None = Field(None, gt=0.0)  # distill_kl; null = 1
    # the loss's tile (rows a block); null = the whole score matrix at once (a multi-vector
    # model's loss is tiled all the same: train/step.py's MULTI_VECTOR_TILE)
    loss_tile_size: int | None = Field(None, ge=1)
    # the contrastive loss's anchors and candidates (docs/losses.md): query_to_passage is always
    # in; passage_to_query with it is the symmetric loss. joint: one softmax over every
    # direction's candidates; per_direction: one a direction, averaged
    directions: list[Direction] = Field(default_factory=lambda: ["query_to_passage"])
    partition: Literal["joint", "per_direction"] = "joint"
    # hardness weighting: strength * stop_grad(score) added to the negatives it names
    # (in_batch: other questions' passages; hard: the question's own; all: both)
    hardness: Literal["in_batch", "hard", "all"] | None = None
    hardness_strength: float = Field(0.0, ge=0.0)
    # a frozen model folder (GIST) whose scores take false negatives out of each row
    guide: str | None = None
    guide_margin: float = Field(0.0, ge=0.0)
    guide_margin_strategy: Literal["absolute", "relative"] = "absolute"
    # Matryoshka: the loss summed over these leading dims of the vectors (descending)
    matryoshka_dims: list[int] | None = None
    matryoshka_weights: list[float] | None = None  # null: 1 each
    # token-budget chunks: each chunk takes rows (longest first) up to this many real tokens,
    # chunk_size (p_chunk_size) capping its rows; auto: picked with chunk_size auto
    chunk_tokens: int | Literal["auto"] | None = None
    precision: Precision = "fp32"
    seed: int = 42
    checkpoint_every: int = Field(500, ge=1)  # steps
    keep_checkpoints: int = Field(2, ge=1)
    log_every: int = Field(1, ge=1)
    keep_last_graph: bool = True
    length_order: bool = True  # gradcache: chunk rows longest first (less padding; exact)
    # gradcache: each chunk's trimmed width rounded up to a multiple of this (exact), and each
    # batch padded to one where it divides model.max_*_length, so shapes repeat; null: each
    # chunk at its own width, or 32 when the towers are compiled
    length_bucket: int | None = Field(None, ge=1)
    # torch.compile the towers (exact: dropout replayed); on CUDA as CUDA graphs. auto is off:
    # on the CPU half the cost a chunk but more a step at few chunks and seconds a new shape
    # (docs/bench/chunk_cost.md); on CUDA not yet measured
    compile: Literal["auto", "on", "off"] = "auto"
    fast_dropout: bool = True  # CPU: dropout masks four to a 64-bit draw (model/fast_dropout)
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    # under torchrun: none (DDP: each rank holds the whole model) or fsdp (FSDP2: each rank
    # holds 1/W of the weights, gradients and optimizer state; docs/distributed.md)
    shard: Literal["none", "fsdp"] = "none"
    # fsdp: gradients reduce-scattered once a step (step: a rank holds its towers' whole
    # gradients until the last chunk) or after every chunk (chunk: a rank holds its shard only)
    shard_sync: Literal["step", "chunk"] = "step"
    deterministic: bool = False  # CUDA: deterministic kernels (bit-exact reruns and resumes)
    num_threads: int | None = Field(None, ge=1)
    log_to: Literal["tensorboard", "none"] | None = None  # null = tensorboard when installed
    eval_every: int | None = Field(None, ge=1)  # validate (and keep the best model) every N steps
    eval_passages: int = Field(10_000, ge=1)  # corpus sample validation searches
    eval_questions: int = Field(500, ge=1)  # first dev questions validation asks

    @field_validator("compile", mode="before")
    @classmethod
    def _compile_words(cls, value: Any) -> Any:
        # YAML 1.1 reads a bare on / off as true / false
        return {True: "on", False: "off"}.get(value, value) if isinstance(value, bool) else value

    @field_validator("chunk_size")
    @classmethod
    def _chunk_positive(cls, value: int | str) -> int | str:
        if isinstance(value, int) and value < 1:
            raise ValueError("must be >= 1 or 'auto'")
        return value

    @field_validator("directions")
    @classmethod
    def _directions_known(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError(f"a direction is listed twice: {value}")
        return value if "query_to_passage" in value else ["query_to_passage", *value]

    @field_validator("matryoshka_dims")
    @classmethod
    def _dims_descend(cls, value: list[int] | None) -> list[int] | None:
        if value is not None and (
            not value or min(value) < 1 or value != sorted(set(value), reverse=True)
        ):
            raise ValueError("must be integers >= 1 in descending order, e.g. [384, 128, 64]")
        return value

    @field_validator("chunk_tokens")
    @classmethod
    def _tokens_positive(cls, value: int | str | None) -> int | str | None:
        if isinstance(value, int) and value < 1:
            raise ValueError("must be >= 1, 'auto' or null")
        return value

    @field_validator("memory_budget")
    @classmethod
    def _budget_parses(cls, value: str | None) -> str | None:
        if value is not None:
            parse_bytes(value)
        return value

    @model_validator(mode="after")
    def _loss_consistent(self) -> TrainConfig:
        if self.loss == "contrastive":
            for key in ("distill_weight", "teacher_temperature"):
                if getattr(self, key) is not None:
                    raise ValueError(
                        f"train.{key} is set but train.loss is contrastive: set train.loss to "
                        "distill_kl or margin_mse, or leave it null"
                    )
        elif self.hard_negatives < 1:
            raise ValueError(
                f"train.hard_negatives: train.loss {self.loss} learns the teacher's scores of "
                "each question's positive and hard negatives: set it to 1 or more"
            )
        if self.shard == "fsdp" and self.chunk_size == "auto":
            raise ValueError(
                "train.chunk_size: auto probes the model whole on one device; under train.shard "
                "fsdp give the chunk (docs/distributed.md)"
            )
        if self.shard == "fsdp" and self.eval_every is not None:
            raise ValueError(
                "train.eval_every: validation encodes on rank 0 alone, and sharded towers need "
                "every rank: under train.shard fsdp leave it null and run `dpr-cache eval` on "
                "the saved model"
            )
        if self.shard == "fsdp" and self.compile == "on":
            raise ValueError(
                "train.compile: on is not supported under train.shard fsdp (the towers are "
                "sharded eager): set it off or auto"
            )
        if self.shard == "fsdp" and self.precision == "fp16":
            raise ValueError(
                "train.precision: fp16 under train.shard fsdp needs a sharded loss scaler: "
                "use bf16 (or fp32), or train.shard none"
            )
        self._options_consistent()
        if self.loss == "margin_mse" and self.teacher_temperature is not None:
            raise ValueError(
                "train.teacher_temperature is set but train.loss margin_mse reads the teacher's "
                "raw margins: leave it null, or use distill_kl"
            )
        return self

    def _options_consistent(self) -> None:
        """The contrastive options' rules that join keys."""
        same_side = [d for d in self.directions if d in ("query_to_query", "passage_to_passage")]
        if self.partition == "per_direction" and same_side:
            raise ValueError(
                f"train.partition: per_direction takes no same-side direction ({same_side[0]} "
                "in train.directions): its softmax would not hold the positive pair; use joint"
            )
        if self.hardness is not None and self.hardness_strength == 0:
            raise ValueError(
                f"train.hardness_strength: 0 weights nothing under train.hardness {self.hardness}"
                ": set it (Lan et al. use 9 for in_batch, EmbeddingGemma 5 for hard)"
            )
        if self.hardness is None and self.hardness_strength > 0:
            raise ValueError(
                "train.hardness_strength is set but train.hardness is null: name the negatives "
                "it weights (in_batch, hard or all)"
            )
        if self.guide is None and (
            self.guide_margin != 0.0 or self.guide_margin_strategy != "absolute"
        ):
            raise ValueError(
                "train.guide_margin (or train.guide_margin_strategy) is set but train.guide is "
                "null: name the guide model folder"
            )
        if self.matryoshka_weights is not None and (
            self.matryoshka_dims is None
            or len(self.matryoshka_weights) != len(self.matryoshka_dims)
        ):
            raise ValueError(
                "train.matryoshka_weights: one weight a dim of train.matryoshka_dims "
                f"({self.matryoshka_dims})"
            )
        if self.chunk_tokens is not None and self.mode != "gradcache":
            raise ValueError(
                f"train.chunk_tokens packs GradCache's chunks; train.mode {self.mode} has none: "
                "leave it null"
            )
        if self.chunk_tokens == "auto" and self.memory_budget is None:
            raise ValueError("train.chunk_tokens: 'auto' needs train.memory_budget (e.g. '4GB')")


class IndexConfig(_Section):
    type: Literal["flat", "ivf", "ivfpq", "hnsw"] = "flat"
    device: str = "auto"  # where `index` encodes the passages: auto | cpu | cuda | cuda:N
    precision: EncodePrecision = "auto"  # autocast of the passage encoder
    batch_size: int = Field(128, ge=1)  # passages per encoding batch
    shard_size: int = Field(50_000, ge=1)  # passages per on-disk shard (resumable unit)
    store_dtype: Literal["float16", "float32"] = "float16"  # stored vectors; scores in float32
    # vectors truncated to their first dim dims (re-normalized when the model normalizes), for
    # a model trained with train.matryoshka_dims; the index records it; null: the full width
    dim: int | None = Field(None, ge=1)
    # a search's or an index build's bound on the whole process's peak memory (GB); unset:
    # runtime.memory.HEADROOM_GB over what it holds when its first search or build begins
    memory_gb: float | None = Field(None, gt=0, allow_inf_nan=False)
    hnsw_m: int = Field(32, ge=4)
    hnsw_ef_search: int = Field(128, ge=1)
    ivf_nlist: int | None = Field(None, ge=1)  # default ~4*sqrt(N)
    pq_m: int = Field(16, ge=1)
    ivf_nprobe: int = Field(16, ge=1)
    # a multi-vector ivf/ivfpq index's search: nearest tokens each question token asks for, and
    # passages rescored by exact MaxSim, each per passage asked (k)
    ivf_token_hits: int = Field(20, ge=1)
    ivf_candidates: int = Field(10, ge=1)


class EvalConfig(_Section):
    top_k: list[int] = Field(default_factory=lambda: [1, 5, 20, 100])
    match: Literal["string", "regex"] = "string"
    device: str = "auto"  # where `eval` encodes the questions: auto | cpu | cuda | cuda:N
    precision: EncodePrecision = "auto"  # autocast of the question encoder
    batch_size: int = Field(128, ge=1)
    fusion: Literal["none", "linear", "rrf"] = "none"  # BM25 fused with the dense ranking
    fusion_weight: float | Literal["auto"] = 1.1  # linear: the dense score's weight
    fusion_depth: int = Field(1000, ge=1)  # candidates from each side
    fusion_rrf_k: int = Field(60, ge=1)
    fusion_tune_qa: str | None = None  # held-out qas file that picks an "auto" weight
    fusion_tune_metric: str = "mrr@10"  # mrr@10 or top{k}
    bm25_run: str | None = None  # a TREC run to fuse (rrf) instead of building BM25

    @field_validator("fusion_tune_metric")
    @classmethod
    def _metric_known(cls, value: str) -> str:
        if value != "mrr@10" and not re.fullmatch(r"top[1-9][0-9]*", value):
            raise ValueError("must be mrr@10 or top{k}, e.g. top20")
        return value

    @model_validator(mode="after")
    def _fusion_consistent(self) -> EvalConfig:
        if self.fusion_weight != "auto" and self.fusion_weight < 0:
            raise ValueError(
                f"eval.fusion_weight: must be >= 0 or 'auto' (got {self.fusion_weight})"
            )
        if self.fusion == "none" and self.bm25_run is not None:
            raise ValueError("eval.bm25_run is set but eval.fusion is none: set eval.fusion")
        if self.fusion_weight == "auto" and (self.fusion != "linear" or not self.fusion_tune_qa):
            raise ValueError(
                "eval.fusion_weight: auto picks linear fusion's weight on eval.fusion_tune_qa: "
                "set eval.fusion: linear and eval.fusion_tune_qa"
            )
        if self.fusion == "linear" and self.bm25_run is not None:
            raise ValueError(
                "eval.fusion: linear needs BM25's score of every candidate, which a run "
                "(eval.bm25_run) does not hold: use rrf with a run"
            )
        if self.fusion != "none" and self.fusion_depth < max(self.top_k):
            raise ValueError(
                f"eval.fusion_depth: {self.fusion_depth} candidates a side cannot fill the top "
                f"{max(self.top_k)} of eval.top_k: raise it"
            )
        return self

    @field_validator("top_k")
    @classmethod
    def _ks_positive(cls, value: list[int]) -> list[int]:
        if not value or any(k < 1 for k in value):
            raise ValueError("must be a non-empty list of integers >= 1")
        return sorted(set(value))


class Config(_Section):
    output_dir: str = "runs/toy"
    model: ModelConfig = Field(default_factory=ModelConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    index: IndexConfig = Field(default_factory=IndexConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)

    @model_validator(mode="after")
    def _consistent(self) -> Config:
        t = self.train
        _check_sources(self.data, t.hard_negatives)
        if t.chunk_size == "auto" and t.memory_budget is None:
            raise ValueError("train.chunk_size: 'auto' needs train.memory_budget (e.g. '4GB')")
        if isinstance(t.chunk_tokens, int) and t.chunk_tokens < self.model.max_query_length:
            raise ValueError(
                f"train.chunk_tokens: {t.chunk_tokens} is below model.max_query_length "
                f"({self.model.max_query_length}): a chunk must hold a whole question"
            )
        return self

    @property
    def train_files(self) -> list[Path]:
        """``data.train``'s paths (none when unset)."""
        return [Path(s if isinstance(s, str) else s.path) for s in self.train_sources]

    @property
    def train_sources(self) -> list[str | TrainSource]:
        """``data.train`` as a list (none when unset)."""
        files = self.data.train
        return [files] if isinstance(files, str) else list(files or [])

    @property
    def dev_sets(self) -> list[tuple[str, Path]]:
        """``data.dev_qa``'s files, each with a name: the file's name before its first dot, with
        its folder's name before it where two files share one."""
        dev = self.data.dev_qa
        paths = [Path(p) for p in ([dev] if isinstance(dev, str) else dev or [])]
        names = [p.name.split(".")[0] for p in paths]
        return [
            (f"{p.parent.name}-{n}" if names.count(n) > 1 else n, p)
            for p, n in zip(paths, names, strict=True)
        ]

    def with_dev_set(self, path: Path) -> Config:
        """This config evaluating one dev set."""
        return self.model_copy(update={"data": self.data.model_copy(update={"dev_qa": str(path)})})

    @property
    def output_path(self) -> Path:
        return Path(self.output_dir)

    @property
    def cache_path(self) -> Path:
        """``data.cache_dir``, else ``$XDG_CACHE_HOME/dpr-cache`` (``~/.cache/dpr-cache``)."""
        from dpr_cache.data.arrow_cache import default_cache_dir

        return Path(self.data.cache_dir) if self.data.cache_dir else default_cache_dir()


def source_name(item: str | TrainSource) -> str:
    """A ``data.train`` source's name: its ``name``, else its file's stem."""
    if isinstance(item, str):
        return Path(item).stem
    return item.name or Path(item.path).stem


def _check_sources(data: DataConfig, hard_negatives: int) -> None:
    """What a list of sources must agree on: distinct names, weights only where batches are
    drawn by weight and not all zero, a source's own negatives only where a batch is one
    source's and at most ``train.hard_negatives``."""
    items = [data.train] if isinstance(data.train, str) else list(data.train or [])
    names = [source_name(s) for s in items]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise ValueError(
                f"data.train[{i}]: a second source named {name!r}: give each one a name"
            )
    mappings = [(i, s) for i, s in enumerate(items) if not isinstance(s, str)]
    weighted = [(i, s) for i, s in mappings if s.weight is not None]
    if weighted and data.batching != "proportional":
        raise ValueError(
            f"data.train[{weighted[0][0]}].weight: weights choose the source of each batch under "
            f"data.batching proportional, not {data.batching}"
        )
    if weighted and all(s.weight == 0 for _, s in weighted) and len(weighted) == len(items):
        raise ValueError("data.train: every source's weight is 0: no batch could be drawn")
    for i, s in mappings:
        if s.hard_negatives is None:
            continue
        if data.batching == "mixed" and len(items) > 1:
            raise ValueError(
                f"data.train[{i}].hard_negatives: under data.batching mixed a batch holds every "
                "source's rows; a source's own negatives need proportional or round_robin"
            )
        if s.hard_negatives > hard_negatives:
            raise ValueError(
                f"data.train[{i}].hard_negatives: {s.hard_negatives} is more than "
                f"train.hard_negatives ({hard_negatives}), the negatives a question has in a step"
            )


_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}  # fmt: skip


def parse_bytes(text: str | int) -> int:
    """'4GB' -> 4_000_000_000, '512MiB' -> 536_870_912, 1024 -> 1024."""
    if isinstance(text, int):
        return text
    match = re.fullmatch(r"\s*([0-9.]+)\s*([A-Za-z]*)\s*", str(text))
    if not match or match.group(2).upper() not in _UNITS:
        raise ValueError(f"not a size: {text!r} (use e.g. '4GB' or '512MiB')")
    return int(float(match.group(1)) * _UNITS[match.group(2).upper()])


def _apply_override(raw: dict, item: str) -> str:
    """Set ``KEY=VALUE`` in ``raw``; returns the key. VALUE is read as YAML, except that a key
    typed as a string takes the text as typed (``query: `` stays a string, not a mapping),
    unquoted when it is a quoted YAML string, and None when empty or ``null``."""
    if "=" not in item:
        raise InputError(f"--set: {item!r} is not KEY=VALUE")
    key, _, text = item.partition("=")
    key = key.strip()
    parts = key.split(".")
    try:
        value = yaml.safe_load(text) if text.strip() else None
    except yaml.YAMLError:
        value = text
    if _is_text(parts) and value is not None and not isinstance(value, str):
        value = text
    node = raw
    for depth, part in enumerate(parts[:-1], start=1):
        if node.get(part) is None and _optional_section(parts[:depth]):
            section = ".".join(parts[:depth])
            raise InputError(
                f"--set {key}: {section} is null (off), so it has no keys to set: give the whole "
                f"section, e.g. --set '{section}={{{parts[depth]}: ...}}', or a {part}: section "
                "in the config file"
            )
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise InputError(f"--set {key}: {part!r} is not a section")
        node = child
    node[parts[-1]] = value
    return key


def _section_of(annotation: Any) -> Any:
    """A key's type, a section that may be null (``LoraConfig | None``) taken as the section."""
    members = typing.get_args(annotation)
    sections = [m for m in members if isinstance(m, type) and issubclass(m, BaseModel)]
    return sections[0] if type(None) in members and len(sections) == 1 else annotation


def _optional_section(parts: list[str]) -> bool:
    """True when the config key ``parts`` is a section that may be null (``model.lora``)."""
    model: Any = Config
    for part in parts:
        field = getattr(model, "model_fields", {}).get(part)
        if field is None:
            return False
        model = field.annotation
    return _section_of(model) is not model


def _is_text(parts: list[str]) -> bool:
    """True when the config key ``parts`` is typed as a string (or a string or None)."""
    model: Any = Config
    for part in parts:
        field = getattr(model, "model_fields", {}).get(part)
        if field is None:
            return False
        model = _section_of(field.annotation)
    return model is str or (
        str in typing.get_args(model) and set(typing.get_args(model)) <= {str, type(None)}
    )


def _did_you_mean(loc: tuple) -> str:
    """`` (did you mean 'train.lr'?)`` for the closest valid key of the same section, if any."""
    model: type[BaseModel] = Config
    for part in loc[:-1]:
        field = model.model_fields.get(str(part))
        if field is None or not isinstance(_section_of(field.annotation), type):
            return ""
        model = _section_of(field.annotation)
    close = difflib.get_close_matches(str(loc[-1]), list(model.model_fields), n=1, cutoff=0.6)
    prefix = ".".join(str(p) for p in loc[:-1])
    return f" (did you mean '{prefix + '.' if prefix else ''}{close[0]}'?)" if close else ""


# what a key takes where a validator, not the key's type, holds its rule
_TAKES = {
    "data.train": "a path, or a list of paths and sources ({path, name, format, ...}), or null",
    "train.chunk_size": "an integer >= 1 or 'auto'",
    "train.chunk_tokens": "an integer >= 1, 'auto' or null",
    "train.matryoshka_dims": "a list of integers >= 1 in descending order, or null",
    "train.memory_budget": "a size such as '4GB' or '512MiB', or null",
    "eval.top_k": "a non-empty list of integers >= 1",
    "eval.fusion_weight": "a number >= 0 or 'auto'",
    "eval.fusion_tune_metric": "'mrr@10' or 'top{k}' (e.g. 'top20')",
}
# what one item of a list key takes, for a flag that gives one number (search's --k)
_TAKES_ONE = {"eval.top_k": "an integer >= 1"}
_NOUNS = {int: ("an integer", "integers"), float: ("a number", "numbers"),
          str: ("a string", "strings"), bool: ("true or false", "true or false")}  # fmt: skip
_BOUNDS = (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<"))


def _number(value: float) -> str:
    """A bound as written: 0.0 as 0, 1e-08 as 1e-08, 4 as 4."""
    return f"{value:g}" if isinstance(value, float) else str(value)


def _either(parts: list[str]) -> str:
    """'a', 'a or b', 'a, b or c'."""
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " or " + parts[-1]


def _describe(annotation: Any, bounds: str = "", plural: bool = False) -> str:
    """A value of ``annotation`` in words ('an integer >= 1', "'cls' or 'mean'", 'a list of
    strings', 'a string or null'); ``bounds`` (' >= 1') follows a number."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Literal:
        return _either([repr(a) for a in args])
    if origin in (typing.Union, types.UnionType):
        kinds = [a for a in args if typing.get_origin(a) is not Literal and a is not type(None)]
        parts = [_describe(a, bounds, plural) for a in kinds]
        parts += [repr(v) for a in args if typing.get_origin(a) is Literal for v in a.__args__]
        return _either(parts + ["null"] if type(None) in args else parts)
    if origin is list:
        return f"a list of {_describe(args[0], bounds, plural=True)}"
    singular, many = _NOUNS.get(annotation, (str(annotation),) * 2)
    return (many if plural else singular) + (bounds if annotation in (int, float) else "")


def _field_at(loc: tuple) -> tuple[str, Any]:
    """The config key an error's location points into and its field (None for a section or the
    top level); what follows the key in the location (a union member's tag, a list index) is
    dropped."""
    model: Any = Config
    parts: list[str] = []
    field = None
    for part in loc:
        fields = getattr(model, "model_fields", None)
        if not isinstance(part, str) or not fields or part not in fields:
            break
        field = fields[part]
        parts.append(part)
        model = _section_of(field.annotation)
    if isinstance(model, type) and issubclass(model, BaseModel):
        field = None  # a section: its own rules name their keys
    return ".".join(parts), field


def _keys_of(key: str) -> str:
    """The keys of the section ``key`` (``model.lora``), in words."""
    model: Any = Config
    for part in key.split("."):
        model = _section_of(model.model_fields[part].annotation)
    return _either(list(model.model_fields))


def _or_null(key: str) -> str:
    """`` or null`` for a section that may be null."""
    return " or null" if _optional_section(key.split(".")) else ""


def takes(key: str, one: bool = False) -> str:
    """What the config key ``key`` (``section.name``) takes, in words; ``one``: one item of a
    list key, as a flag of one number gives it."""
    if one and key in _TAKES_ONE:
        return _TAKES_ONE[key]
    if key in _TAKES:
        return _TAKES[key]
    _, field = _field_at(tuple(key.split(".")))
    if field is None:  # a section
        return f"a section (a mapping of {_keys_of(key)}){_or_null(key)}"
    rules = [
        f"{word} {_number(getattr(rule, name))}"
        for rule in field.metadata
        for name, word in _BOUNDS
        if getattr(rule, name, None) is not None
    ]
    bounds = " " + " and ".join(rules) if rules else ""
    annotation = typing.get_args(field.annotation)[0] if one else field.annotation
    return _describe(annotation, bounds)


def _one_line(error: ValidationError, source: str, overridden: set[str]) -> str:
    """The errors on one line, a part a key: those of keys given with ``--set`` blamed on it,
    the others on ``source`` (the file). A type or range error says what the key takes (a
    union's members, which pydantic reports one by one, in one part); a validator's own message
    says it in its words."""
    by_source: dict[str, dict[str, str]] = {}
    for item in error.errors():
        key, field = _field_at(tuple(item["loc"]))
        got = item.get("input")
        shown = "" if isinstance(got, dict) else f" (got {got!r})"
        index = [p for p in item["loc"][len(key.split(".")) :] if isinstance(p, int)]
        if index and field is not None:  # one item of a list
            shown = f" (item {index[0] + 1} is {got!r})"
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            key = ".".join(str(p) for p in item["loc"])
            part = f"unknown key '{key}'{_did_you_mean(item['loc'])}"
        elif field is None and item["type"] == "model_type":  # a section given as a value
            part = f"{key} takes {takes(key)}{shown}"
        elif field is None:  # a rule joining keys: its message names them
            named = re.match(r"[a-z_]+\.[a-z_]+\b", message)
            part = message if named else f"{key or '(top level)'}: {message}"
        elif item["type"] == "value_error" and message.startswith((f"{key}[", "unknown key")):
            part = message  # an item of a list of sections, named by its place
        elif item["type"] == "value_error":  # the key's validator: its message says what it takes
            part = f"{key}: {message}{shown}"
        else:
            part = f"{key} takes {takes(key)}{shown}"
        if field is None and item["type"] != "extra_forbidden":  # blamed on a key it names
            given = any(o == key or re.search(rf"\b{re.escape(o)}\b", message) for o in overridden)
        else:
            given = any(o == key or f"{key}.".startswith(f"{o}.") for o in overridden)
        where = "--set" if given else source
        by_source.setdefault(where, {}).setdefault(key if field else part, part)
    return "; ".join(f"{where}: " + "; ".join(parts.values()) for where, parts in by_source.items())


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Read ``path`` (YAML), apply ``key=value`` overrides, validate; raise InputError."""
    source = str(path) if path is not None else "config"
    raw: dict[str, Any] = {}
    if path is not None:
        file = Path(path)
        if not file.is_file():
            raise InputError(f"{file}: no such config file")
        try:
            raw = yaml.safe_load(file.read_text()) or {}
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" line {mark.line + 1}" if mark is not None else ""
            raise InputError(f"{file}:{where} not valid YAML") from None
        if not isinstance(raw, dict):
            raise InputError(f"{file}: the top level must be a mapping of sections")
    overridden = {_apply_override(raw, item) for item in overrides or []}
    try:
        return Config.model_validate(raw)
    except ValidationError as exc:
        raise InputError(_one_line(exc, source, overridden)) from None


def check_valid(config: Config, source: str) -> None:
    """InputError naming the keys, blamed on ``source``, when ``config`` (made by
    ``model_copy``, which validates nothing) breaks a rule of the schema."""
    try:
        Config.model_validate(config.model_dump())
    except ValidationError as exc:
        raise InputError(_one_line(exc, source, set())) from None


def default_of(key: str) -> Any:
    """The default of a config key (``section.name``), for a flag that mirrors it."""
    section, name = key.split(".")
    field = Config.model_fields[section].annotation.model_fields[name]
    return field.get_default(call_default_factory=True)


def check_flags(section: str, flags: dict[str, tuple[str, Any]]) -> Any:
    """Command-line flags that mirror keys of a config section (``{flag: (key, value)}``),
    checked by the section's own validators: the section, or InputError naming the flags."""
    model = Config.model_fields[section].annotation
    try:
        return model.model_validate({key: value for key, value in flags.values()})
    except ValidationError as exc:
        flag_of = {key: flag for flag, (key, _) in flags.items()}
        parts = []
        for item in exc.errors():
            message = item["msg"].removeprefix("Value error, ")
            for key, flag in sorted(flag_of.items(), key=lambda kv: -len(kv[0])):  # longest first
                message = message.replace(f"{section}.{key}", flag)
            loc = [str(p) for p in item["loc"]]
            value = flags.get(flag_of.get(loc[0], ""), (None, None))[1] if loc else None
            if loc and isinstance(value, list) and len(value) == 1:  # a flag of one item
                message = f"{flag_of[loc[0]]}: takes {takes(f'{section}.{loc[0]}', one=True)}"
                message += f" (got {value[0]!r})"
            elif loc:
                got = item.get("input")
                message = f"{flag_of.get(loc[0], loc[0])}: {message} (got {got!r})"
            parts.append(message)
        raise InputError("; ".join(parts)) from None


def changed_settings(saved: str | Path, config: Config) -> list[tuple[str, Any, Any]]:
    """Each key (``section.name``) whose value in the config file ``saved`` (as
    :func:`save_config` writes it) is not ``config``'s: (key, saved value, value now)."""
    try:
        tree = yaml.safe_load(Path(saved).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise InputError(f"{saved}: {type(exc).__name__}") from None
    if not isinstance(tree, dict):
        raise InputError(f"{saved}: not a config (a YAML mapping)")
    before, now = _flat(tree), _flat(config.model_dump(mode="json"))
    return [(k, before.get(k), v) for k, v in now.items() if before.get(k) != v]


def _flat(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(_flat(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def save_config(config: Config, path: str | Path) -> Path:
    """Write the resolved config (every key, defaults included) as YAML."""
    return write_text_atomic(path, yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))
