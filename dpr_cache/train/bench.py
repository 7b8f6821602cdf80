"""``dpr-cache bench --config FILE``: the training step of a config on this machine, at each chunk
size asked, and the chunk to train with.

Each chunk size runs in a fresh process (its peak memory is its own: ``ru_maxrss`` on CPU, the
CUDA allocator's peak on a GPU) that builds the trainer exactly as ``train`` does and times
``warmup + steps`` real updates on the config's first batches (tokenizing left out: training does
it in loader workers). The pick is the fastest chunk whose peak fits ``train.memory_budget``
(any, without a budget). A chunk size that runs out of memory is a row that says so, and the
larger ones are not tried: the sizes that ran keep their figures. Nothing is written under
``output_dir``.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
import yaml

from dpr_cache.config import Config, load_config, parse_bytes
from dpr_cache.errors import InputError
from dpr_cache.runtime import distributed, memory
from dpr_cache.runtime.device import out_of_memory_state
from dpr_cache.runtime.processes import ChildFailed, run_json_child
from dpr_cache.train.settle import settle_model
from dpr_cache.train.trainer import batch_recipe, build_trainer, training_data, training_files

__all__ = ["ChunkTiming", "bench_chunks", "pick_chunk", "choose_chunk", "format_table"]


@dataclass(frozen=True)
class ChunkTiming:
    """One chunk size's figures: median step seconds, pairs a second, peak memory; or what
    ran out of memory (``out_of_memory``, the figures then NaN and 0)."""

    chunk: int
    step_s: float
    pairs_per_s: float
    peak_bytes: int
    fits: bool = True
    out_of_memory: str | None = None


def bench_chunks(config: Config, chunks: list[int], steps: int, warmup: int) -> list[ChunkTiming]:
    """Time ``config``'s step at each chunk size, each in a fresh process."""
    config = settle_model(config)
    training_files(config)
    if steps < 1 or warmup < 0 or not chunks or min(chunks) < 1:
        raise InputError("bench: --steps >= 1, --warmup >= 0 and chunk sizes >= 1 are needed")
    local = config.train.batch_size
    sizes = sorted({min(c, local) for c in chunks}) if config.train.mode != "full" else [local]
    budget = parse_bytes(config.train.memory_budget) if config.train.memory_budget else None
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        resolved = Path(tmp) / "config.yaml"
        resolved.write_text(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))
        for chunk in sizes:
            args = [str(resolved), str(chunk), str(steps), str(warmup)]
            try:
                row = run_json_child("dpr_cache.train.bench", args)
            except ChildFailed as e:
                raise InputError(f"bench: chunk {chunk} failed: {e.tail}") from None
            if "out_of_memory" in row:
                out.append(ChunkTiming(chunk, math.nan, 0.0, 0, False, row["out_of_memory"]))
                break  # a larger chunk needs more
            fits = budget is None or row["peak_bytes"] <= budget
            out.append(
                ChunkTiming(chunk, row["step_s"], row["pairs_per_s"], row["peak_bytes"], fits)
            )
    return out


def pick_chunk(timings: list[ChunkTiming]) -> ChunkTiming | None:
    """The fastest chunk that fits the budget (None when none does)."""
    fitting = [t for t in timings if t.fits]
    return max(fitting, key=lambda t: t.pairs_per_s) if fitting else None


def choose_chunk(timings: list[ChunkTiming], config: Config) -> ChunkTiming:
    """The chunk to train with (:func:`pick_chunk`); an InputError saying what to change when
    none fits: the smallest chunk asked ran out of memory, or every one is over
    ``train.memory_budget``."""
    best = pick_chunk(timings)
    if best is not None:
        return best
    first = timings[0]
    if first.out_of_memory is None:
        raise InputError(f"train.memory_budget: no chunk size fits {config.train.memory_budget}")
    if config.train.mode == "full":
        advice = "train.mode full runs the whole batch at once: set train.mode=gradcache"
    elif first.chunk > 1:
        advice = "ask for smaller ones (--chunks)"
    else:
        advice = "shorten model.max_passage_length or use a larger GPU"
    raise InputError(f"bench: chunk {first.chunk}, the smallest asked, ran out of memory: {advice}")


def format_table(timings: list[ChunkTiming], budget: str | None) -> str:
    """A text table, a line per chunk size."""
    lines = [" chunk | step s | pairs/s | peak GB", "-------+--------+---------+--------"]
    for t in timings:
        if t.out_of_memory is not None:
            lines.append(f"{t.chunk:>6} | {t.out_of_memory} (larger sizes not tried)")
            continue
        over = "" if t.fits else f"  over {budget}"
        lines.append(
            f"{t.chunk:>6} | {t.step_s:>6.2f} | {t.pairs_per_s:>7.2f} | "
            f"{t.peak_bytes / 1e9:>6.2f}{over}"
        )
    return "\n".join(lines)


def _time_steps(config: Config, steps: int, warmup: int) -> dict:
    """In this process: ``warmup + steps`` updates of the trainer ``config`` builds."""
    cfg = config.train
    if cfg.num_threads:
        torch.set_num_threads(cfg.num_threads)
    env = distributed.setup(cfg.device)
    dataset, batches, _ = training_data(config, env)
    trainer = build_trainer(config, env, warmup + steps)
    recipe = batch_recipe(config, trainer.model, trainer.length_bucket, trainer.guide)
    tokenizer = trainer.model.tokenizer
    if env.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(env.device)
    seconds = []
    try:
        for step in range(warmup + steps):
            batch = recipe.batch(dataset, batches, tokenizer, step % batches.steps_per_epoch)
            seconds.append(trainer.step(batch).seconds)
    except RuntimeError as e:  # torch.OutOfMemoryError among them
        state = out_of_memory_state(e)
        if state is None and not isinstance(e, torch.OutOfMemoryError):
            raise
        return {"out_of_memory": state or "ran out of memory"}
    step_s = statistics.median(seconds[warmup:])
    return {
        "step_s": step_s,
        "pairs_per_s": cfg.batch_size / step_s,
        "peak_bytes": memory.peak_memory_bytes(env.device),
    }


def main(argv: list[str] | None = None) -> None:
    """Child: ``CONFIG CHUNK STEPS WARMUP`` -> one JSON line of figures."""
    from dpr_cache.runtime.quiet import quiet_libraries

    path, chunk, steps, warmup = sys.argv[1:] if argv is None else argv
    quiet_libraries()
    config = load_config(path, [f"train.chunk_size={int(chunk)}"])
    print(json.dumps(_time_steps(config, int(steps), int(warmup))), flush=True)


if __name__ == "__main__":
    main()
