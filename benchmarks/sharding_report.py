"""``sharding.json`` as a page, ``sharding.md``: what a rank holds under ``train.shard`` none
(DDP) and fsdp (FSDP2) at each world size, its ratio to none, and each run's gradient against
the one-process run's."""

from __future__ import annotations

from pathlib import Path

from benchmarks.machine import cpu_text
from benchmarks.scale_report import markdown_table
from dpr_cache.runtime.atomic import write_json_atomic, write_text_atomic

__all__ = ["PAGE", "FIGURES", "markdown", "write_page"]

PAGE = "sharding.md"
FIGURES = "sharding.json"
NAMES = {
    "bert": "BERT",
    "llama": "tiny Llama, fully trained",
    "llama-lora": "tiny Llama with LoRA",
}


def _mb(n: float) -> str:
    return f"{n / 1e6:.3f}"


def _ratio(row: dict, kind: str) -> str:
    value = row.get("ratio", {}).get(kind)
    return "–" if value is None else f"{value:.3f}"


def _model_lines(name: str, m: dict, plan: dict) -> list[str]:
    trained = "all of them" if m["trainable"] == m["parameters"] else f"{m['trainable']:,}"
    lines = [
        "",
        f"### {NAMES.get(name, name)}",
        "",
        f"{m['parameters']:,} parameters, {trained} trained; {m['towers']} towers, "
        f"{m['pooling']} pooling. MB (10^6 bytes) held by the fullest rank after the steps, "
        "float64; the ratio is to `none` at the same W (`none` holds the whole model on every "
        "rank); 1/W is what FSDP promises.",
        "",
    ]
    header = [
        "W",
        "train.shard",
        "parameters MB",
        "gradients MB",
        "AdamW state MB",
        "sum MB",
        "ratio: parameters / gradients / state / sum",
        "1/W",
        "gradient gap",
        "peak RSS MB",
    ]
    rows = []
    for r in m["runs"]:
        top = r["max"]
        engine = (
            r["shard"] if r["shard"] == "fsdp" else ("none" if r["world"] == 1 else "none (DDP)")
        )
        ratios = " / ".join(
            _ratio(r, k) for k in ("parameters", "gradients", "optimizer_state", "held")
        )
        rows.append(
            [
                r["world"],
                engine,
                _mb(top["parameters"]),
                _mb(top["gradients"]),
                _mb(top["optimizer_state"]),
                f"**{_mb(top['held'])}**",
                ratios,
                f"{1 / r['world']:.3f}",
                f"{r['grad_gap']:.1e}",
                f"{top['peak_rss'] / 1e6:.0f}",
            ]
        )
    lines += markdown_table(header, rows)
    if "lora" in name:
        fsdp = [r for r in m["runs"] if r["shard"] == "fsdp"]
        lines += [
            "",
            "Of the parameters, the trained ones (the adapters): "
            + ", ".join(
                f"{_mb(r['max']['trainable_parameters'])} MB at W={r['world']}" for r in fsdp
            )
            + " under fsdp; the frozen base is sharded with them (one FSDP unit a block).",
        ]
    return lines


def markdown(result: dict) -> str:
    """The page: machine, command, what is counted, a table for each model."""
    plan, machine = result["plan"], result["machine"]
    lines = ["# What a rank holds: `train.shard` none (DDP) against fsdp (FSDP2), on the CPU", ""]
    if result.get("dry_run"):
        lines += ["**Dry run**: toy sizes, to rehearse the benchmark; not the page's figures.", ""]
    per_rank = ", ".join(f"{plan['n_q'] // w} at W={w}" for w in plan["worlds"])
    lines += [
        f"`{result['command']}` ({result['date']}, {result['seconds']:.0f} s).",
        f"Machine: {cpu_text(machine)}; torch {machine['torch']}, transformers "
        f"{machine['transformers']}, one thread a rank.",
        "",
        f"For each model and each world size W (gloo ranks spawned on 127.0.0.1), each rank runs "
        f"one GradCache step on its slice of one global batch of {plan['n_q']} questions "
        f"({per_rank}; {plan['group'] - 1} hard negative a question, chunk {plan['chunk']}, "
        f"every rank's passages as negatives) and one AdamW step, in float64, with "
        "`train.shard: none` (the model itself at W = 1, DistributedDataParallel above) or "
        "`fsdp` (the trainer's own `shard_towers`: FSDP2 `fully_shard` on each block and each "
        "tower, gradients reduce-scattered once a step, `train.shard_sync: step`; at W = 1 a "
        "process group of one). Then each rank counts the bytes it holds: parameters (a "
        "DTensor's local shard, `to_local()`; frozen ones too), gradients (the same), AdamW's "
        "state (`exp_avg`, `exp_avg_sq`, `step`). The tables give the fullest rank's. Counting "
        "bytes is deterministic: these are not timings, and a shared machine does not move them.",
        "",
        "What is not counted: DDP's gradient buckets (a second copy of the gradients that its "
        "reducer keeps, so `none` holds more than its row on W > 1), FSDP's parameters gathered "
        "whole for a block's forward or backward (one block at a time, freed after it), and the "
        "activations and GradCache's cached representations (the same for both, per rank). "
        "After the step FSDP holds its parameters sharded: what the table counts is what a rank "
        "keeps between steps.",
        "",
        "Gradient gap: the first step's gradient of the run (gathered whole) against the W = 1 "
        "unsharded run's, the largest difference relative to the largest gradient, float64: a "
        "sanity column (sharding and the split of the batch change only the order of the sums).",
        "",
        "Peak RSS: each rank's own high-water mark (`ru_maxrss`); on the CPU it is dominated by "
        "the libraries (torch, transformers and peft imported: some hundreds of MB), against a "
        "model of a few MB, so it does not show the division; the counted bytes do."
        + (
            " Here every case of a world size ran in one process group, so a rank's peak RSS "
            "is that of all its cases."
            if result["plan"].get("one_group_a_world")
            else " Each (model, W, sharding) ran in a process group of its own."
        ),
    ]
    lines += _findings(result)
    for name, m in result["models"].items():
        lines += _model_lines(name, m, plan)
    return "\n".join(lines) + "\n"


def _findings(result: dict) -> list[str]:
    """One line a model: the sum's ratio at each W > 1 against 1/W, and the worst gap."""
    out = ["", "## Findings", ""]
    for name, m in result["models"].items():
        fsdp = [r for r in m["runs"] if r["shard"] == "fsdp" and r["world"] > 1]
        ratios = ", ".join(
            f"{r['ratio']['held']:.3f} at W={r['world']} (1/W = {1 / r['world']:.3f})" for r in fsdp
        )
        gap = max(r["grad_gap"] for r in m["runs"])
        out.append(
            f"- {NAMES.get(name, name)}: FSDP's parameters + gradients + AdamW state per rank "
            f"over DDP's: {ratios or 'no W > 1 run'}; the gradients' largest gap {gap:.1e}."
        )
    return out


def write_page(result: dict, out: Path) -> list[Path]:
    """``sharding.json`` and ``sharding.md`` in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / FIGURES, result)
    write_text_atomic(out / PAGE, markdown(result))
    return [out / FIGURES, out / PAGE]
