"""BiEncoder: a question tower and a passage tower (Hugging Face encoders), shared or separate.

Saved layout (``save_pretrained(dir)``)::

    dir/query_encoder/      a complete transformers and sentence-transformers folder (see
                            :mod:`dpr_cache.model.tower_files`)
    dir/passage_encoder/    the same for passages (a copy of the query tower when shared)
    dir/biencoder.json      {"shared", "pooling", "normalize", "max_query_length",
                             "max_passage_length", "query_prefix", "passage_prefix", "dtype"}:
                            the model's record of how it encodes (its query encoding,
                            :mod:`dpr_cache.model.encoding`) and the dtype its weights were
                            trained in (what loading it takes by default; null: none was
                            given, and the weights load as transformers loads the base)
    dir/tokenizer files     when the BiEncoder carries a tokenizer

A tower with LoRA adapters (:mod:`dpr_cache.model.lora`) is saved as peft saves it: its folder
holds ``adapter_config.json`` and ``adapter_model.safetensors`` beside the tokenizer and the
sentence-transformers files, the base named by the adapter's config; ``from_pretrained`` loads
the base and the adapters back. :meth:`BiEncoder.merge_adapters` merges them into the base
(``dpr-cache export --format merged``, :mod:`dpr_cache.model.export`).
"""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import Tensor, nn
from transformers import PretrainedConfig

from dpr_cache.errors import InputError
from dpr_cache.model.decoders import attention_of, prepare_tokenizer, torch_dtype
from dpr_cache.model.dpr_formats import dpr_kind, load_dpr_towers
from dpr_cache.model.encoding import (
    ENCODING_FILE,
    QueryEncoding,
    shipped_normalize,
    shipped_pooling,
    shipped_prefixes,
)
from dpr_cache.model.hub import hub_name_of, resolve_model_path
from dpr_cache.model.lora import (
    ADAPTER_CONFIG,
    adapter_base,
    add_lora,
    check_saved_lora,
    has_adapters,
    load_adapters,
    merged,
    set_lora_dropout,
)
from dpr_cache.model.multivector import (
    PROJECTION,
    MultiVector,
    attach_projection,
    check_dim,
    default_dim,
    expand_queries,
    expansion_id,
    is_multi_vector_folder,
    passage_keep,
    projection_of,
    read_folder,
    skip_ids,
    token_reps,
    without_projection,
    write_folder,
)
from dpr_cache.model.pooling import POOLINGS, pool
from dpr_cache.model.tower_files import clean_tokenizer, sort_target_modules, write_tower
from dpr_cache.model.towers import (
    decoder_only,
    load_tokenizer,
    load_tower,
    tower_from_config,
)

__all__ = ["BiEncoder"]

_META = ENCODING_FILE


class BiEncoder(nn.Module):
    """DPR's two encoders; ``encode_query`` / ``encode_passage`` map tokenized inputs to reps.

    Args:
        query_encoder: a Hugging Face encoder (``last_hidden_state`` output).
        passage_encoder: the passage tower; ``None`` shares the query tower.
        pooling: ``"cls"`` (DPR), ``"mean"`` (masked mean, sentence-transformers) or
            ``"last"`` (each text's final real token: decoders); None: ``"last"`` for a
            decoder-only tower, else ``"cls"``. ``"cls"`` on a decoder-only tower is an
            InputError (its first token sees nothing of the text).
        tokenizer: optional, saved beside the towers.
        max_query_length, max_passage_length: the token limits it was trained with, saved so
            that ``dpr-cache encode`` needs no config (None: not known).
        normalize: scale every vector to unit length (cosine similarity), after pooling.
        query_prefix, passage_prefix: the model's prompts (e.g. ``"query: "``, or
            E5-Mistral's ``"Instruct: {task}\nQuery: "``), prepended to every question and to
            every passage pair's first text wherever it encodes
            (:mod:`dpr_cache.data.tokenize`), and saved as its sentence-transformers prompts.
        dtype: the name (``fp32 | bf16 | fp16``) of the dtype the weights were loaded in,
            recorded when saved (None: not given; transformers' default dtype).
        multi: late interaction (:mod:`~dpr_cache.model.multivector`): every tower then
            carries its projection, and encodes [n, L, multi.dim] unit token vectors (zero
            where a token is not scored); None: one vector a text, pooled.

    ``output_dim`` (an attribute, None: the full width) cuts every vector to its first dims,
    re-normalized when the model normalizes: retrieval at a Matryoshka dim (``index.dim``);
    never saved with the model, whose folder keeps the full width.
    """

    def __init__(
        self,
        query_encoder: nn.Module,
        passage_encoder: nn.Module | None = None,
        *,
        pooling: str | None = None,
        tokenizer=None,
        max_query_length: int | None = None,
        max_passage_length: int | None = None,
        normalize: bool = False,
        query_prefix: str = "",
        passage_prefix: str = "",
        dtype: str | None = None,
        multi: MultiVector | None = None,
    ) -> None:
        super().__init__()
        pooling = _pooling_for(query_encoder, pooling)
        self.query_encoder = query_encoder
        self.shared = passage_encoder is None or passage_encoder is query_encoder
        self.passage_encoder = query_encoder if self.shared else passage_encoder
        self.pooling = pooling
        self.tokenizer = tokenizer
        self.max_query_length = max_query_length
        self.max_passage_length = max_passage_length
        self.normalize = normalize
        self.query_prefix, self.passage_prefix = query_prefix, passage_prefix
        # each named training source's own (query, passage) prompts, saved with the model
        self.source_prompts: dict[str, tuple[str, str]] = {}
        self.weights_dtype = dtype
        self.output_dim: int | None = None
        self.multi = multi
        if multi is not None and any(projection_of(t) is None for t in self.towers):
            raise ValueError("a multi-vector BiEncoder's towers each need their projection")

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
        *,
        dtype: str | None = None,
        attn_implementation: str | None = None,
        lora=None,
        vectors: str | None = None,
        multi_dim: int | None = None,
    ) -> BiEncoder:
        """Load a saved BiEncoder folder, or any Hugging Face model (a folder or a hub name, see
        :func:`~dpr_cache.model.hub.resolve_model_path`) for both towers: encoders (BERTs) and
        decoders (Llama, Mistral, Qwen2/Qwen3, Gemma: ``AutoModel``) alike.

        ``pooling=None`` and ``normalize=None`` keep what the model ships: a saved BiEncoder's
        settings, or a sentence-transformers folder's Pooling and Normalize modules; else CLS
        pooling (DPR's) without normalization, or last-token pooling for a decoder-only model
        (its tokenizer then appending EOS). Given, they are used as given: the commands settle
        them against what the folder records first
        (:func:`~dpr_cache.model.encoding.settle_encoding`). ``dtype`` (``fp32 |
        bf16 | fp16``; None: what a saved BiEncoder records, else transformers' default) and
        ``attn_implementation`` (None or ``auto``: transformers' choice) go to every tower.
        ``lora`` (``model.lora``: ``r``, ``alpha``, ``dropout``, ``target_modules``) adds
        trainable LoRA adapters to a frozen base; a folder saved with adapters loads them (frozen
        unless ``lora`` is given, then trainable: its own adapters go on training).
        ``vectors`` (``model.vectors``: ``single | multi``; None: as the folder records) and
        ``multi_dim``: a multi-vector folder (ours, sentence-transformers' ``MultiVectorEncoder``
        or PyLate's) loads its projection; any other folder asked for ``multi`` gets a new one
        of ``multi_dim`` dims (None: :func:`~dpr_cache.model.multivector.default_dim`)."""
        path = resolve_model_path(path)
        if dpr_kind(path) is not None:  # HF DPR pair or DPR's .cp: two BERTs, [CLS], no norm
            model = cls._from_dpr(path, shared, dropout, normalize, vectors, multi_dim)
        else:
            model = cls._from_folder(
                path,
                shared,
                pooling,
                dropout,
                normalize,
                dtype=dtype,
                attn_implementation=attn_implementation,
                lora=lora,
                vectors=vectors,
                multi_dim=multi_dim,
            )
        if gradient_checkpointing:
            model.enable_gradient_checkpointing()
        return model

    @classmethod
    def _from_dpr(cls, path, shared, dropout, normalize, vectors, multi_dim) -> BiEncoder:
        """DPR's two BERTs ([CLS], unnormalized), with equal new projections when multi."""
        _check_multi_dim(vectors, multi_dim)
        query, passage, tokenizer = load_dpr_towers(path, dropout)
        query, passage = _projected(query, None if shared else passage, vectors, multi_dim, path)
        multi = None if vectors != "multi" else MultiVector(projection_of(query).out_features)
        normalize = _multi_normalize(normalize) if multi is not None else False
        return cls(
            query, passage, pooling="cls", tokenizer=tokenizer, normalize=normalize, multi=multi
        )

    @classmethod
    def _from_folder(
        cls,
        path,
        shared,
        pooling,
        dropout,
        normalize,
        *,
        dtype,
        attn_implementation,
        lora,
        vectors,
        multi_dim,
    ) -> BiEncoder:
        """A saved BiEncoder folder, or a Hugging Face one for both towers (see
        :meth:`from_pretrained`)."""
        if not path.is_dir():
            raise FileNotFoundError(2, "no such model folder", str(path))
        saved = (path / "query_encoder").is_dir()
        meta = json.loads((path / _META).read_text()) if (path / _META).is_file() else {}
        dtype = dtype or meta.get("dtype")
        load = _tower_loader(dropout, dtype, attn_implementation, lora)
        vectors = vectors or meta.get("vectors") or _folder_vectors(path, saved)
        _check_multi_dim(vectors, multi_dim)
        if saved:
            query = _with_lora(load(path / "query_encoder"), lora)
            passage = None if shared else _with_lora(load(path / "passage_encoder"), lora)
            pooling = pooling or meta.get("pooling")
        else:
            query, passage = _plain_towers(load(path), shared, lora)
            meta = {"normalize": shipped_normalize(path), **shipped_prefixes(path)}
            pooling = pooling or shipped_pooling(path)
        query, passage = _projected(query, passage, vectors, multi_dim, path, saved)
        multi = None
        if vectors == "multi":
            multi = _multi_spec(path, saved, query, meta)
            normalize = _multi_normalize(normalize)
        pooling = _pooling_for(query, pooling)  # before the tokenizer: last appends EOS
        model = cls(
            query,
            passage,
            pooling=pooling,
            tokenizer=prepare_tokenizer(load_tokenizer(path), pooling),
            max_query_length=meta.get("max_query_length"),
            max_passage_length=meta.get("max_passage_length"),
            normalize=bool(meta.get("normalize", False)) if normalize is None else normalize,
            query_prefix=meta.get("query_prefix", ""),
            passage_prefix=meta.get("passage_prefix", ""),
            dtype=dtype,
            multi=multi,
        )
        model.source_prompts = {
            k: (v["query"], v["passage"]) for k, v in meta.get("source_prompts", {}).items()
        }
        return model

    @classmethod
    def from_config(
        cls,
        config: PretrainedConfig,
        shared: bool = False,
        pooling: str | None = None,
        gradient_checkpointing: bool = False,
        dropout: float | None = None,
        tokenizer=None,
        normalize: bool | None = None,
        *,
        lora=None,
        dtype: str | None = None,
        attn_implementation: str | None = None,
        multi_dim: int | None = None,
    ) -> BiEncoder:
        """Random-init towers from a Hugging Face config (separate towers start equal; with
        ``lora``, equal bases and adapters of their own), their weights in ``dtype`` (``fp32 |
        bf16 | fp16``; None: transformers' default), recorded when saved as
        ``from_pretrained``'s are; ``pooling`` None as :class:`BiEncoder` takes it;
        ``multi_dim``: a multi-vector model of token vectors that wide (None: one vector a
        text), whose vectors are unit length (``normalize`` None or True)."""
        query = tower_from_config(
            config, dropout, torch_dtype(dtype), attention=attention_of(attn_implementation)
        )
        query, passage = _plain_towers(query, shared, lora)
        multi = None
        if multi_dim is not None:
            multi = MultiVector(multi_dim)
            query = attach_projection(query, multi_dim)
            passage = None if passage is None else _projection_like(passage, query)
            normalize = _multi_normalize(normalize)
        pooling = _pooling_for(query, pooling)
        model = cls(
            query,
            passage,
            pooling=pooling,
            tokenizer=prepare_tokenizer(tokenizer, pooling),
            normalize=bool(normalize),
            dtype=dtype,
            multi=multi,
        )
        if gradient_checkpointing:
            model.enable_gradient_checkpointing()
        return model

    def enable_gradient_checkpointing(self) -> None:
        """Recompute each layer's activations in the backward (non-reentrant checkpoints). A
        tower with adapters also makes its input embeddings' output require grad, as peft asks
        of a frozen base (each checkpointed layer's input then carries a graph)."""
        for tower in self.towers:
            if hasattr(tower, "activation_checkpointing_enable"):  # transformers >= 5.x
                tower.activation_checkpointing_enable({"use_reentrant": False})
            else:
                tower.gradient_checkpointing_enable({"use_reentrant": False})
            if has_adapters(tower):
                tower.enable_input_require_grads()

    @property
    def towers(self) -> list[nn.Module]:
        """The distinct towers: one when shared, else the query and the passage tower."""
        return [self.query_encoder] + ([] if self.shared else [self.passage_encoder])

    @property
    def has_adapters(self) -> bool:
        """Whether the towers carry LoRA adapters (their base frozen)."""
        return has_adapters(self.query_encoder)

    def merge_adapters(self) -> BiEncoder:
        """Merge each tower's adapters into its base weights (in place): plain Hugging Face
        towers that encode as the adapted ones did (a multi-vector tower keeps its
        projection)."""
        self.query_encoder = _merged(self.query_encoder)
        self.passage_encoder = self.query_encoder if self.shared else _merged(self.passage_encoder)
        return self

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
            side = 0 if name == "query_encoder" else 1
            if self.multi is not None:
                self._write_multi_tower(tower, out_dir / name)
                continue
            write_tower(
                tower,
                out_dir / name,
                tokenizer=self.tokenizer,
                pooling=self.pooling,
                normalize=self.normalize,
                max_length=length,
                prompt=prompt,
                more_prompts={k: v[side] for k, v in self.source_prompts.items()},
            )
        meta = {
            "shared": self.shared,
            "pooling": self.pooling,
            "normalize": self.normalize,
            "max_query_length": self.max_query_length,
            "max_passage_length": self.max_passage_length,
            "query_prefix": self.query_prefix,
            "passage_prefix": self.passage_prefix,
            "dtype": self.weights_dtype,
        }
        if self.multi is not None:
            meta.update(vectors="multi", **self.multi.record())
        if self.source_prompts:
            meta["source_prompts"] = {
                k: {"query": q, "passage": p} for k, (q, p) in self.source_prompts.items()
            }
        (out_dir / _META).write_text(json.dumps(meta, indent=2) + "\n")
        if self.tokenizer is not None:
            clean_tokenizer(self.tokenizer).save_pretrained(out_dir)
        return out_dir

    def _write_multi_tower(self, tower: nn.Module, out: Path) -> None:
        """One tower as a sentence-transformers ``MultiVectorEncoder`` folder (with adapters:
        peft's adapter files in place of the backbone, the projection in ``1_Dense``)."""
        with without_projection(tower) as projection:
            tower.save_pretrained(out)
        sort_target_modules(out / ADAPTER_CONFIG)
        if self.tokenizer is not None:
            clean_tokenizer(self.tokenizer).save_pretrained(out)
        write_folder(
            out,
            projection,
            self.multi,
            prompts={"query": self.query_prefix, "document": self.passage_prefix},
            lengths=(self.max_query_length, self.max_passage_length),
        )

    # -- encoding ---------------------------------------------------------------------------

    def encode_query(self, inputs: Mapping[str, Tensor]) -> Tensor:
        """Question reps [n, hidden] (multi-vector: [n, L, dim]) from tokenized questions."""
        return self.encode_with(self.query_encoder, inputs)

    def encode_passage(self, inputs: Mapping[str, Tensor]) -> Tensor:
        """Passage reps [n, hidden] (multi-vector: [n, L, dim]) from tokenized (title, text)
        pairs."""
        return self.encode_with(self.passage_encoder, inputs, side="passage")

    def forward(
        self,
        query: Mapping[str, Tensor] | None = None,
        passage: Mapping[str, Tensor] | None = None,
    ) -> tuple[Tensor | None, Tensor | None]:
        """Either or both towers, so one ``DistributedDataParallel`` wrapper serves both."""
        q_reps = self.encode_query(query) if query is not None else None
        p_reps = self.encode_passage(passage) if passage is not None else None
        return q_reps, p_reps

    def encode_with(
        self, tower: nn.Module, inputs: Mapping[str, Tensor], side: str = "query"
    ) -> Tensor:
        """Run ``tower`` (one of ours, possibly DDP-wrapped) and pool its last hidden state;
        a multi-vector model's token vectors instead (a passage's skiplist tokens zero)."""
        if self.multi is not None:
            return self._token_reps(tower, inputs, side)
        hidden = tower(**inputs).last_hidden_state  # [n, seq, hidden]
        reps = pool(hidden, inputs["attention_mask"], self.pooling)  # [n, hidden]
        if self.output_dim is not None:
            reps = reps[:, : self.output_dim]
        return torch.nn.functional.normalize(reps, dim=-1) if self.normalize else reps

    @property
    def query_encoding(self) -> QueryEncoding:
        """How this model encodes a question (its prefix, pooling, normalization, length and
        the vectors' width)."""
        return QueryEncoding(
            self.query_prefix, self.pooling, self.normalize, self.max_query_length, self.dim
        )

    def _token_reps(self, tower: nn.Module, inputs: Mapping[str, Tensor], side: str) -> Tensor:
        """A multi-vector tower's token vectors: questions expanded first where the model
        expands them; a passage's skiplist tokens zero."""
        expansion = self.multi.expansion
        if side == "query" and expansion is not None:
            token = expansion_id(self.tokenizer, expansion)
            inputs, keep = expand_queries(dict(inputs), expansion, token)
        else:
            keep = inputs["attention_mask"].bool()
            if side == "passage":
                keep = passage_keep(inputs, self._skipped(keep.device))
        hidden = tower(**inputs).last_hidden_state
        return token_reps(hidden, keep, projection_of(tower))

    def _skipped(self, device: torch.device) -> Tensor | None:
        """The skiplist's token ids (None: no skiplist)."""
        if not self.multi.skiplist or self.tokenizer is None:
            return None
        return torch.tensor(skip_ids(self.tokenizer, self.multi.skiplist), device=device)

    @property
    def width(self) -> int:
        """The towers' hidden size: the full vectors' width."""
        return int(self.query_encoder.config.hidden_size)

    @property
    def dim(self) -> int:
        """The width of the vectors it encodes: ``output_dim``, else the full width (a
        multi-vector model's: its token vectors')."""
        if self.multi is not None:
            return self.multi.dim
        return self.output_dim or self.width

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device


def _tower_loader(dropout, dtype: str | None, attn_implementation: str | None, lora):
    """:func:`_load_tower` of a folder with these settings."""
    return functools.partial(
        _load_tower,
        dropout=dropout,
        dtype=torch_dtype(dtype),
        attention=attention_of(attn_implementation),
        lora=lora,
    )


def _load_tower(folder: Path, *, dropout, dtype, attention, lora) -> nn.Module:
    """One tower from ``folder``: a Hugging Face model, or a base with the adapters saved there
    (peft's format): frozen, or, when ``lora`` is given, trainable with ``lora.dropout`` as
    their dropout (InputError when ``lora`` disagrees with them on r, alpha or target
    modules)."""
    if (folder / ADAPTER_CONFIG).is_file():
        base = load_tower(_base_path(folder), dropout, dtype, attention)
        if lora is None:
            return load_adapters(base, folder)
        check_saved_lora(folder, base, lora)
        return set_lora_dropout(load_adapters(base, folder, trainable=True), lora.dropout)
    return load_tower(folder, dropout, dtype, attention)


def _with_lora(tower: nn.Module, lora) -> nn.Module:
    """``tower`` with new adapters per ``lora`` (None: as it is; one with adapters keeps
    them)."""
    if lora is None or has_adapters(tower):
        return tower
    return add_lora(_absolute_name(tower), lora)


def _base_path(folder: Path) -> Path:
    """The base an adapter folder names, as a local folder."""
    return resolve_model_path(adapter_base(folder))


def _absolute_name(tower: nn.Module) -> nn.Module:
    """``tower`` named as adapters should record their base: a model of the Hugging Face hub by
    its hub name (its cache folder is this machine's), a local folder by its absolute path (so
    that a saved run's adapters find it from any working directory)."""
    name = tower.config._name_or_path
    if name and Path(name).is_dir():
        tower.config._name_or_path = hub_name_of(Path(name)) or str(Path(name).resolve())
        tower.name_or_path = tower.config._name_or_path
    return tower


def _pooling_for(tower: nn.Module, pooling: str | None) -> str:
    """``pooling`` checked for ``tower``, or its default when None: ``last`` for a decoder-only
    tower (a causal model's last token is the only one that sees the whole text), else
    ``cls``. InputError for ``cls`` on a decoder-only tower (its first token sees nothing of
    the text, and on left padding is a pad)."""
    decoder = decoder_only(tower.config)
    pooling = pooling or ("last" if decoder else "cls")
    if pooling not in POOLINGS:
        raise ValueError(f"pooling must be one of {POOLINGS}, got {pooling!r}")
    if pooling == "cls" and decoder:
        raise InputError(
            f"model.pooling: cls on a decoder-only model ({tower.config.model_type}), whose "
            "first token sees nothing of the text that follows it: use last (or mean)"
        )
    return pooling


def _plain_towers(query: nn.Module, shared: bool, lora) -> tuple[nn.Module, nn.Module | None]:
    """The towers of one plain model: the passage tower a copy of the query tower (None when
    shared); with ``lora``, each given its own adapters (a model already with adapters keeps
    them)."""
    passage = None if shared else copy.deepcopy(query)
    return _with_lora(query, lora), None if passage is None else _with_lora(passage, lora)


def _folder_vectors(path: Path, saved: bool) -> str:
    """What a folder encodes when neither the caller nor a record says: token vectors for a
    multi-vector folder, else one vector a text."""
    return "multi" if not saved and is_multi_vector_folder(path) else "single"


def _multi_tower(tower: nn.Module, vectors: str, dim: int | None, folder: Path) -> nn.Module:
    """``tower`` with its projection when multi-vector: the folder's, else a new one of
    ``dim`` dims (None: the default)."""
    if vectors != "multi":
        return tower
    if is_multi_vector_folder(folder):
        found = read_folder(folder)
        if dim is not None and dim != found.spec.dim:
            raise InputError(
                f"model.multi_dim: {dim}, but the model at {folder} records {found.spec.dim}: "
                "set it back or pass another model"
            )
        return attach_projection(tower, found.spec.dim, found.weight)
    width = int(tower.config.hidden_size)
    return attach_projection(tower, check_dim(default_dim(width) if dim is None else dim, width))


def _multi_spec(path: Path, saved: bool, query: nn.Module, meta: dict) -> MultiVector:
    """The model's :class:`MultiVector`: its projection's width, and the skiplist and query
    expansion its folder records (none for a model made multi-vector here)."""
    dim = projection_of(query).out_features
    if saved:
        return MultiVector.from_record(dim, meta)
    if is_multi_vector_folder(path):
        return read_folder(path).spec
    return MultiVector(dim)


def _projection_like(tower: nn.Module, like: nn.Module) -> nn.Module:
    """``tower`` with a projection equal to ``like``'s (separate towers start equal)."""
    weight = projection_of(like).weight.detach().clone()
    return attach_projection(tower, weight.shape[0], weight)


def _merged(tower: nn.Module) -> nn.Module:
    """:func:`~dpr_cache.model.lora.merged` of ``tower``, its projection (a multi-vector
    tower's, held beside peft's wrapper) moved onto the merged model."""
    with without_projection(tower) as projection:
        plain = merged(tower)
    if projection is not None:
        plain.add_module(PROJECTION, projection)
    return plain


def _check_multi_dim(vectors: str | None, multi_dim: int | None) -> None:
    """InputError for a ``model.multi_dim`` given to a model of one vector a text."""
    if multi_dim is not None and vectors != "multi":
        raise InputError(
            f"model.multi_dim: {multi_dim}, but the model encodes one vector a text: set "
            "model.vectors: multi (or leave model.multi_dim null)"
        )


def _multi_normalize(normalize: bool | None) -> bool:
    """A multi-vector model's ``normalize``: always (its token vectors are unit length, as
    MaxSim takes them); InputError when asked not to."""
    if normalize is False:
        raise InputError(
            "model.normalize: false, but a multi-vector model's token vectors are unit length "
            "(set it to true or null)"
        )
    return True


def _projected(query, passage, vectors, multi_dim, path: Path, saved: bool = False):
    """The towers with their projections when ``vectors`` is multi: each saved tower's own
    folder's (a saved BiEncoder), the folder's (a multi-vector folder: both towers alike), else
    a new one on the query tower that the passage tower starts equal to."""
    if vectors != "multi":
        return query, passage
    q_folder, p_folder = (
        (path / "query_encoder", path / "passage_encoder") if saved else (path, path)
    )
    query = _multi_tower(query, vectors, multi_dim, q_folder)
    if passage is None:
        return query, None
    if is_multi_vector_folder(p_folder):
        return query, _multi_tower(passage, vectors, multi_dim, p_folder)
    return query, _projection_like(passage, query)
