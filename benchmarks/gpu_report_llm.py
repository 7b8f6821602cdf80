"""The ``llm`` section of the GPU page (:mod:`benchmarks.gpu_llm`): its figures and issue 57's
goals on the GPU judged against them."""

from __future__ import annotations

__all__ = ["llm_goals", "render_llm", "GOAL_GB"]

GOAL_GB = 80  # issue 57: B = 1,024 in one step on one 80 GB GPU
MEMORY_RATIO = 1.2  # memory at B = 1,024 within 1.2x of B = 64's
OVER_CMNRL = 1.3  # pairs/s over CachedMNRL with the same adapter at equal chunk
OVER_FULL = 0.8  # pairs/s over the largest full batch that fits


def _big(r: dict | None) -> dict | None:
    """The goals' decoder's figures (the 7B's on a device)."""
    return next((m for m in (r or {}).get("models", []) if m.get("big")), None)


def _fitting(memory: list[dict]) -> list[dict]:
    return [row for row in memory if row.get("fits")]


def _fastest_full(model: dict) -> tuple[str, float] | None:
    """The fastest full batch measured: a row of the speed comparison or the search's largest
    (its trainer step), named, with its pairs per second."""
    found = []
    for name, row in (model.get("speed") or {}).get("rows", {}).items():
        if row.get("engine") == "full batch" and row.get("pairs_per_s"):
            batch = name.split("B=")[1] if "B=" in name else model["speed"]["batch"]
            found.append((f"full batch B={batch}", row["pairs_per_s"]))
    largest = model.get("largest_full_batch") or {}
    if largest.get("pairs_per_s"):
        found.append((f"largest full batch B={largest['batch']}", largest["pairs_per_s"]))
    return max(found, key=lambda f: f[1]) if found else None


def llm_goals(r: dict | None) -> list[tuple[str, str, str, bool | None]]:
    """(goal, measured, target, met) of issue 57's GPU goals, on the goals' decoder; an
    unmeasured figure is met None with the reason."""
    model = _big(r)
    if model is None:
        return []
    plan, name = r["plan"], model["shape"]["name"]
    lora = plan["lora"]
    head = f"{name} shape, LoRA r={lora['r']}, chunk {plan['chunk']}"
    memory = model.get("memory", [])
    by_batch = {row["batch"]: row for row in memory}
    first, last = plan["memory_batches"][0], plan["memory_batches"][-1]
    out = []
    top = by_batch.get(last, {})
    if top.get("fits"):
        gb = top["peak_bytes"] / 1e9
        out.append(
            (f"{head}: B={last:,} in one step", f"{gb:.1f} GB", f"<= {GOAL_GB} GB", gb <= GOAL_GB)
        )
    else:
        why = "out of memory" if top.get("fits") is False else _why(top, model)
        out.append((f"{head}: B={last:,} in one step", why, f"<= {GOAL_GB} GB", top.get("fits")))
    low = by_batch.get(first, {})
    ratio_goal = f"{head}: memory at B={last:,} over B={first}"
    if top.get("fits") and low.get("fits"):
        ratio = top["peak_bytes"] / low["peak_bytes"]
        out.append((ratio_goal, f"{ratio:.2f}x", f"<= {MEMORY_RATIO}x", ratio <= MEMORY_RATIO))
    else:
        out.append((ratio_goal, "not measured", f"<= {MEMORY_RATIO}x", None))
    out += _speed_goals(model, head, plan)
    return out


def _why(row: dict, model: dict) -> str:
    if row.get("skipped"):
        return f"not measured ({row['skipped']})"
    if model.get("error"):
        return f"not measured ({model['error'][:100]})"
    return "not measured"


def _speed_goals(model: dict, head: str, plan: dict) -> list[tuple]:
    speed = model.get("speed") or {}
    b, c = plan["speed_batch"], plan["chunk"]
    ours = (speed.get("rows", {}).get(f"dpr-cache chunk {c}") or {}).get("pairs_per_s")
    cmnrl = (speed.get("rows", {}).get(f"CachedMNRL rows {c}") or {}).get("pairs_per_s")
    over_cmnrl = f"{head}: B={b}, dpr-cache over CachedMNRL (same adapter, mini-batch {c})"
    over_full = f"{head}: B={b}, dpr-cache over the largest full batch that fits"
    if ours and cmnrl:
        ratio = ours / cmnrl
        cm = (over_cmnrl, f"{ratio:.2f}x ({ours:.2f} / {cmnrl:.2f} pairs/s)", f">= {OVER_CMNRL}x")
        out = [(*cm, ratio >= OVER_CMNRL)]
    else:
        out = [(over_cmnrl, _unmeasured(speed, ours), f">= {OVER_CMNRL}x", None)]
    full = _fastest_full(model)
    if ours and full:
        ratio = ours / full[1]
        measured = f"{ratio:.2f}x ({ours:.2f} / {full[1]:.2f} pairs/s, {full[0]})"
        out.append((over_full, measured, f">= {OVER_FULL}x", ratio >= OVER_FULL))
    else:
        out.append((over_full, _unmeasured(speed, ours), f">= {OVER_FULL}x", None))
    return out


def _unmeasured(speed: dict, ours: float | None) -> str:
    if speed.get("skipped"):
        return f"not measured ({speed['skipped']})"
    if speed and not ours:
        return "not measured (dpr-cache's step failed)"
    return "not measured"


def _count(n: int) -> str:
    """A parameter count in words: 7.24B, 41.9M, 16,384."""
    if n >= 1e9:
        return f"{n / 1e9:.3g}B"
    return f"{n / 1e6:.3g}M" if n >= 1e6 else f"{n:,}"


def _gb(n: int | None) -> str:
    return "–" if n is None else f"{n / 1e9:.2f} GB"


def render_llm(r: dict) -> list[str]:
    """The section's markdown lines."""
    plan = r["plan"]
    lora = plan["lora"]
    targets = lora["target_modules"]
    layers = "every linear layer" if targets == "all-linear" else ", ".join(targets)
    lines = [
        "",
        "Decoder LLMs as the towers (issue 57), with random weights built on the device in "
        f"{plan['dtype']}: LoRA r={lora['r']} (alpha {lora['alpha']}, dropout {lora['dropout']}) "
        f"on {layers} "
        "(the adapters in fp32, the base frozen), gradient checkpointing, last-token pooling, one "
        f"shared tower, {plan['q_len']}-token questions and {plan['p_len']}-token passages with "
        f"every position attended (each ending in EOS), one hard negative, {plan['precision']} "
        "autocast. Memory: the peak (`torch.cuda.max_memory_allocated`; a dry run: the "
        "process's peak RSS) of one `Trainer.step` (AdamW's update of the adapters included) "
        "of the trainer `build_trainer` makes from the config; its step s is that "
        "trainer's first step. Pairs/s: the steppers' step (forward, loss, backward), "
        "interleaved; CachedMNRL runs sentence-transformers' loss on the very same peft module.",
    ]
    goals = llm_goals(r)
    if goals:
        lines += ["", "| goal (issue 57) | measured | target | met |", "|---|---|---|---|"]
        for goal, measured, target, met in goals:
            mark = {True: "yes", False: "**no**", None: "–"}[met]
            lines.append(f"| {goal} | {measured} | {target} | {mark} |")
    for model in r.get("models", []):
        lines += _model(model, plan)
    return lines


def _model(m: dict, plan: dict) -> list[str]:
    s = m["shape"]
    lines = [
        "",
        f"### {s['name']} ({s['layers']} layers x {s['hidden']}, {s['heads']} heads, "
        f"{s['kv_heads']} KV heads, MLP {s['intermediate']:,}, vocabulary {s['vocab']:,})",
        "",
    ]
    if "parameters" in m:
        lines.append(
            f"{_count(m['parameters'])} parameters, {_count(m['trainable'])} of them "
            f"trainable ({', '.join(m['trainable_dtypes'])}), the base {m['base_dtype']}; "
            f"attention {m['attention']}; built on the device in {m['build_s']:.1f} s."
        )
    if m.get("error"):
        lines += ["", f"Stopped: `{m['error']}`"]
    if m.get("memory"):
        lines += ["", "| batch | chunk | peak | step s |", "|--:|--:|--:|--:|"]
        for row in m["memory"]:
            if row.get("skipped"):
                lines.append(f"| {row['batch']:,} | {row['chunk']} | {row['skipped']} | |")
                continue
            step = f"{row['step_s']:.2f}" if row.get("fits") else "out of memory"
            lines.append(
                f"| {row['batch']:,} | {row['chunk']} | {_gb(row.get('peak_bytes'))} | {step} |"
            )
    lines += _speed(m.get("speed"), m.get("largest_full_batch"))
    lines += _largest(m.get("largest_full_batch"))
    return lines


def _speed(speed: dict | None, largest: dict | None) -> list[str]:
    if not speed:
        return []
    if speed.get("skipped"):
        return ["", f"Pairs/s at B={speed['batch']}: skipped, {speed['skipped']}."]
    lines = [
        "",
        f"Pairs/s at B={speed['batch']} ({speed['precision']}, the median of {speed['rounds']} "
        f"round(s) after {speed['warmups']} warm-up(s)):",
        "",
        "| setting | pairs/s | step s |",
        "|---|--:|--:|",
    ]
    for name, row in speed["rows"].items():
        if "pairs_per_s" in row:
            lines.append(f"| {name} | {row['pairs_per_s']:.2f} | {row['step_s']:.2f} |")
        else:
            lines.append(f"| {name} | {row.get('failed', 'not timed')} | |")
    if largest and largest.get("pairs_per_s"):
        step = largest["batch"] / largest["pairs_per_s"]
        lines.append(
            f"| largest full batch B={largest['batch']} (the search's trainer step) | "
            f"{largest['pairs_per_s']:.2f} | {step:.2f} |"
        )
    return lines


def _largest(r: dict | None) -> list[str]:
    if not r:
        return []
    tries = ", ".join(
        f"{b} ({_gb(t['peak_bytes']) if t['fits'] else 'out of memory'})"
        for b, t in r["tried"].items()
    )
    how = "doubling, then bisection" + (
        ", each try after the first placed where a line through the peaks reaches 97% of the "
        "device's memory"
        if r.get("predicted")
        else ""
    )
    if r["batch"] is None:
        found = "none fitted"
    else:
        found = f"**{r['batch']:,}** questions ({_gb(r.get('peak_bytes'))})"
        if r.get("first_too_large"):
            found += f", B={r['first_too_large']:,} out of memory"
    lines = [
        "",
        f"Largest full batch (`train.mode: full`) that fits: {found}; {how}; tried {tries}.",
    ]
    if r.get("pretended_limit") is not None:
        lines.append(
            f"(Dry run: a full batch above {r['pretended_limit']} questions is pretended out of "
            "memory.)"
        )
    if r.get("stopped"):
        lines.append(f"The search stopped: {r['stopped']}.")
    return lines
