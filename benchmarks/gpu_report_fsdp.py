"""The ``fsdp`` section of the GPU page (:mod:`benchmarks.gpu_fsdp`): FSDP2 in a process group of
one, its float64 exactness and one step's memory against ``train.shard: none``."""

from __future__ import annotations

__all__ = ["fsdp_goals", "render_fsdp"]


def fsdp_goals(r: dict | None) -> list[tuple[str, str, str, bool | None]]:
    """(goal, measured, target, met): the sharded GradCache gradient equals the full batch's in
    float64 (issue 58's bound), each sync."""
    if not r or not r.get("exactness"):
        return []
    ex = r["exactness"]
    out = []
    for row in ex["rows"]:
        out.append(
            (
                f"FSDP2 on one GPU (a group of one), sync per {row['sync']}: sharded GradCache "
                f"(B={ex['batch']}, chunk {ex['chunk']}) vs the unsharded full batch, float64",
                f"{row['relative_error']:.1e}",
                f"<= {row['bound']:.0e}",
                row["ok"],
            )
        )
    return out


def _mb(n: int | None) -> str:
    return "–" if n is None else f"{n / 1e6:,.1f}"


def render_fsdp(r: dict) -> list[str]:
    """The section's markdown lines."""
    lines = [
        "",
        "FSDP2 (`train.shard: fsdp`, the trainer's own `shard_towers`) on **one GPU, in a process "
        "group of one**. With one GPU there is nothing to divide: each parameter's shard is the "
        "whole parameter, so the ratio fsdp / none below measures FSDP's own overhead (its "
        "gathered and bf16 copies of a block, its buffers), not the division across ranks that "
        "FSDP promises. Two GPUs were not available; the division at 2 and 4 ranks is counted "
        "on the CPU in [sharding.md](sharding.md).",
    ]
    return lines + _fsdp_exactness(r.get("exactness")) + _fsdp_memory(r["plan"], r.get("memory"))


def _fsdp_exactness(ex: dict | None) -> list[str]:
    if not ex:
        return []
    lines = [
        "",
        f"Exactness: a random BERT ({ex['layers']} layers of {ex['hidden']}) in float64, "
        f"B={ex['batch']} with one hard negative: `verify`'s `sharded_step` (GradCache at "
        f"chunk {ex['chunk']} over the sharded towers, the gradient gathered whole) against "
        "`compare_steps`' unsharded full batch.",
        "",
        "| gradient sync | relative gap | bound | equal |",
        "|---|--:|--:|---|",
    ]
    for row in ex["rows"]:
        equal = "yes" if row["ok"] else "**no**"
        lines.append(
            f"| once a {row['sync']} | {row['relative_error']:.1e} | {row['bound']:.0e} | {equal} |"
        )
    return lines


def _fsdp_memory(plan: dict, memory: list | None) -> list[str]:
    if not memory:
        return []
    lines = [
        "",
        f"Memory: one GradCache training step of a random BERT ({plan['layers']} layers of "
        f"{plan['hidden']}, MLP {plan['intermediate']:,}, {plan['vocab']:,} words; separate "
        f"towers), B={plan['batch']}, chunk {plan['chunk']}, {plan['q_len']}-token questions "
        f"and {plan['p_len']}-token passages with one hard negative, {plan['precision']} "
        "autocast (and FSDP's bf16 policy, gradients reduced in fp32, where sharded), AdamW's "
        "update included. Peak: `torch.cuda.max_memory_allocated` (a dry run: the process's "
        "peak RSS); held: the bytes of parameters, gradients and AdamW's state after the "
        "step (a DTensor's local shard). MB = 10^6 bytes.",
        "",
        "| train.shard | peak MB | parameters MB | gradients MB | AdamW state MB | held MB "
        "| step s |",
        "|---|--:|--:|--:|--:|--:|--:|",
    ]
    for row in memory:
        lines.append(
            f"| {row['shard']} | {_mb(row['peak_bytes'])} | {_mb(row['parameters'])} | "
            f"{_mb(row['gradients'])} | {_mb(row['optimizer_state'])} | {_mb(row['held'])} "
            f"| {row['seconds']:.2f} |"
        )
    rows = {row["shard"]: row for row in memory}
    if {"none", "fsdp"} <= set(rows):
        none, fsdp = rows["none"], rows["fsdp"]
        lines += [
            "",
            f"fsdp / none: peak {fsdp['peak_bytes'] / none['peak_bytes']:.3f}x, held "
            f"{fsdp['held'] / none['held']:.3f}x (one rank: FSDP's overhead, not a "
            "division).",
        ]
    return lines
