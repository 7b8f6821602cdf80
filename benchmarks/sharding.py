"""What a rank holds under ``train.shard: none`` (DDP) and ``fsdp`` (FSDP2), counted on the CPU::

    python -m benchmarks.sharding --out docs/bench      # sharding.json and sharding.md

Each (model, world size W, sharding) runs one GradCache and one AdamW step in float64 on gloo
ranks and counts the bytes a rank holds. ``--dry-run``: toy sizes, one process group a W.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from benchmarks import harness

TINY_LLAMA = Path(__file__).resolve().parents[1] / "data" / "toy" / "tiny-llama"
SHARDS = ("none", "fsdp")
KINDS = ("parameters", "trainable_parameters", "gradients", "optimizer_state", "held", "peak_rss")
SPAWN_TIMEOUT = 600
TEMPERATURE = 0.5


@dataclass(frozen=True)
class Plan:
    """The sizes of a run (the page's by default)."""

    models: tuple[str, ...] = ("bert", "llama", "llama-lora")
    worlds: tuple[int, ...] = (1, 2, 4)
    n_q: int = 16  # global questions of the step
    group: int = 2  # passages a question: a positive and hard negatives
    chunk: int = 2  # GradCache's chunk, below every rank's slice of the batch
    q_len: int = 16
    p_len: int = 24
    bert_hidden: int = 256
    bert_layers: int = 4
    bert_vocab: int = 512
    lora_r: int = 4
    one_group_a_world: bool = False  # every case of a world size in one process group


FULL = Plan()
DRY = replace(FULL, models=("bert", "llama-lora"), worlds=(1, 2), n_q=4, chunk=1, q_len=8)
DRY = replace(DRY, p_len=10, bert_hidden=32, bert_layers=2, bert_vocab=97, one_group_a_world=True)


def build_model(name: str, plan: Plan):
    """The case's float64 BiEncoder, the same on every rank: a BERT of separate towers (moved
    apart), or the tiny Llama, one tower, fully trained or with LoRA (B matrices non-zero)."""
    from transformers import BertConfig

    from dpr_cache.config import LoraConfig
    from dpr_cache.model.biencoder import BiEncoder

    torch.manual_seed(0)
    if name == "bert":
        h = plan.bert_hidden
        shape = dict(hidden_size=h, intermediate_size=4 * h, num_attention_heads=4)
        shape.update(num_hidden_layers=plan.bert_layers, max_position_embeddings=64)
        config = BertConfig(vocab_size=plan.bert_vocab, **shape)
        model = BiEncoder.from_config(config, shared=False, pooling="mean", dropout=0.0)
    else:
        lora = LoraConfig(r=plan.lora_r, alpha=2.0 * plan.lora_r, dropout=0.0)
        options = dict(pooling="last", dropout=0.0, lora=lora if "lora" in name else None)
        model = BiEncoder.from_pretrained(TINY_LLAMA, shared=True, **options)
    with torch.no_grad():
        for param_name, param in model.named_parameters():
            if param_name.startswith("passage_encoder."):  # separate towers, moved apart
                param.add_(0.02 * torch.randn_like(param))
            elif "lora_B" in param_name:
                param.normal_(0.0, 0.05)
    return model.double().train()


def global_batch(name: str, plan: Plan) -> tuple[dict, dict, torch.Tensor]:
    """Random questions and passage groups, right-padded for the BERT, unpadded for the Llama."""
    gen = torch.Generator().manual_seed(1)
    vocab = plan.bert_vocab if name == "bert" else 512

    def rows(n: int, length: int) -> dict:
        ids = torch.randint(5, vocab, (n, length), generator=gen)
        if name != "bert":
            return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        lengths = torch.randint(length // 2, length + 1, (n,), generator=gen)
        mask = (torch.arange(length)[None, :] < lengths[:, None]).long()
        return {"input_ids": ids * mask, "attention_mask": mask, "token_type_ids": 0 * ids}

    p_ids = torch.arange(plan.n_q * plan.group) + 100
    return rows(plan.n_q, plan.q_len), rows(plan.n_q * plan.group, plan.p_len), p_ids


def _slice(inputs, rank: int, world: int):
    if isinstance(inputs, dict):
        return {k: _slice(v, rank, world) for k, v in inputs.items()}
    n = inputs.shape[0] // world
    return inputs[rank * n : (rank + 1) * n]


def relative_gap(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> float:
    """The largest difference over the largest magnitude of ``want`` (inf where the gradients
    named differ)."""
    if got.keys() != want.keys():
        return float("inf")
    scale = max(v.abs().max().item() for v in want.values())
    return max((got[k] - want[k]).abs().max().item() for k in want) / scale


def float64_norms() -> None:
    """Llama's RMSNorm kept in float64 (transformers' rounds through float32): every model of a
    rank is float64."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        variance = hidden.pow(2).mean(-1, keepdim=True)
        return self.weight * (hidden * torch.rsqrt(variance + self.variance_epsilon))

    LlamaRMSNorm.forward = forward


def run_case(name: str, shard: str, plan: Plan, env) -> tuple[dict, dict]:
    """One GradCache and one AdamW step on this rank's slice: bytes held, loss, whole gradient."""
    from dpr_cache.core.loss import InfoNCE
    from dpr_cache.core.objective import Objective, make_loss_fn
    from dpr_cache.core.steppers import make_stepper
    from dpr_cache.model.ddp import wrap_towers
    from dpr_cache.model.fsdp import full_value, shard_towers
    from dpr_cache.runtime import distributed
    from dpr_cache.runtime.memory import trim

    model = build_model(name, plan)
    if shard == "fsdp":
        towers = shard_towers(model, env, precision="fp32", sync="step")
    else:
        towers = wrap_towers(model, env)  # DDP on several ranks, the model itself on one
    objective = Objective(plan.group, InfoNCE(TEMPERATURE))
    loss_fn = make_loss_fn(objective, rank=env.rank, world_size=env.world_size)
    stepper = make_stepper("gradcache", towers, loss_fn, chunk_size=plan.chunk, release_memory=trim)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    q, p, p_ids = (_slice(x, env.rank, env.world_size) for x in global_batch(name, plan))
    optimizer.zero_grad(set_to_none=True)
    loss = stepper.step(q, p, p_ids=p_ids)
    named = model.named_parameters()
    grads = {n: full_value(t.grad).detach().clone() for n, t in named if t.grad is not None}
    optimizer.step()
    row = harness.held_bytes(model, optimizer)
    row["held"] = row["parameters"] + row["gradients"] + row["optimizer_state"]
    row["loss"] = distributed.all_mean(loss, env)
    row["sharded_parameters"] = sum(harness.local_shard(t) is not t for t in model.parameters())
    return row, grads


def _rank_main(rank: int, world: int, port: int, out: str, plan: Plan, cases: list) -> None:
    """A spawned rank: run ``cases``, write ``rank{r}.json`` (and rank 0 each ``{case}.pt``)."""
    from dpr_cache.runtime import distributed

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(world))
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)

    env = distributed.setup("cpu")
    float64_norms()
    rows = {}
    try:
        for name, shard in cases:
            row, grads = run_case(name, shard, plan, env)
            if rank == 0:
                torch.save(grads, Path(out) / f"{name}-{shard}.pt")
            rows[f"{name}-{shard}"] = row
    finally:
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        for row in rows.values():
            row["peak_rss"] = rss
        Path(out, f"rank{rank}.json").write_text(json.dumps(rows))
        distributed.teardown()


def _spawn(world: int, plan: Plan, cases: list, out: Path) -> list[dict]:
    import torch.multiprocessing as mp

    from dpr_cache.runtime.processes import free_port

    out.mkdir(parents=True, exist_ok=True)
    args = (world, free_port(), str(out), plan, cases)
    context = mp.start_processes(_rank_main, args, world, join=False, start_method="spawn")
    deadline = time.monotonic() + SPAWN_TIMEOUT
    while not context.join(timeout=1):
        if time.monotonic() > deadline:
            for proc in context.processes:
                proc.kill()
            raise TimeoutError(f"{world} ranks of {cases} did not finish in {SPAWN_TIMEOUT} s")
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]


def run(plan: Plan, work: Path) -> dict:
    """Every (model, W, sharding): each rank's bytes, the ranks' largest, the ratio to ``none``
    at the same W, and the gradient's gap to the W = 1 unsharded run."""
    started, runs, models = time.monotonic(), {}, {}
    for world in plan.worlds:
        cases = [(m, s) for m in plan.models for s in SHARDS]
        for batch in [cases] if plan.one_group_a_world else [[c] for c in cases]:
            folder, begun = work / f"w{world}-{len(runs)}", time.monotonic()
            ranks = _spawn(world, plan, batch, folder)
            seconds = round(time.monotonic() - begun, 1)
            for name, shard in batch:
                per_rank = [r[f"{name}-{shard}"] for r in ranks]
                row = runs[(name, world, shard)] = dict(world=world, shard=shard, ranks=per_rank)
                row.update(loss=per_rank[0]["loss"], grads=folder / f"{name}-{shard}.pt")
                row.update(seconds=seconds, rss_alone=not plan.one_group_a_world)
                held = max(r["held"] for r in per_rank) / 1e6
                print(f"{name} W={world} {shard}: {held:.3f} MB held ({seconds} s)", flush=True)
    for name in plan.models:
        reference = torch.load(runs[(name, 1, "none")]["grads"])
        rows = [runs[(name, world, shard)] for world in plan.worlds for shard in SHARDS]
        for r in rows:
            r["grad_gap"] = relative_gap(torch.load(r.pop("grads")), reference)
            r["max"] = {k: max(rank[k] for rank in r["ranks"]) for k in KINDS}
        for r in rows:
            none = runs[(name, r["world"], "none")]["max"]
            r["ratio"] = {k: r["max"][k] / none[k] for k in KINDS if none[k]}
        whole = build_model(name, plan)
        trained = sum(p.numel() for p in whole.parameters() if p.requires_grad)
        counts = {"parameters": sum(p.numel() for p in whole.parameters()), "trainable": trained}
        towers = "shared" if whole.shared else "separate"
        models[name] = {**counts, "towers": towers, "pooling": whole.pooling, "runs": rows}
    return {"models": models, "seconds": round(time.monotonic() - started, 1)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("docs/bench"))
    parser.add_argument("--dry-run", action="store_true", help="A tiny BERT and W = 1, 2.")
    args = parser.parse_args(argv)
    plan = DRY if args.dry_run else FULL
    with tempfile.TemporaryDirectory(prefix="dpr-cache-sharding-") as tmp:
        result = run(plan, Path(tmp))
    command = "python -m benchmarks.sharding" + (" --dry-run" if args.dry_run else "")
    result |= {"command": f"{command} --out {args.out}", "dry_run": args.dry_run}
    result["plan"] = asdict(plan)
    harness.save_result(args.out / "sharding.json", result, harness.machine_info("cpu", 1), render)


NAMES = {"bert": "BERT", "llama": "tiny Llama, fully trained", "llama-lora": "tiny Llama with LoRA"}
HEADER = ["W", "train.shard", "parameters MB", "gradients MB", "AdamW state MB", "sum MB"]
HEADER += ["ratio: parameters / gradients / state / sum", "1/W", "gradient gap", "peak RSS MB"]
SUMMED = ("parameters", "gradients", "optimizer_state", "held")


def _row(r: dict) -> list:
    top, world = r["max"], r["world"]
    engine = r["shard"] if r["shard"] == "fsdp" else ("none" if world == 1 else "none (DDP)")
    ratios = [r.get("ratio", {}).get(k) for k in SUMMED]
    mb = [f"{top[k] / 1e6:.3f}" for k in SUMMED]
    return [
        *(world, engine, *mb[:3], f"**{mb[3]}**"),
        " / ".join("–" if v is None else f"{v:.3f}" for v in ratios),
        *(f"{1 / world:.3f}", f"{r['grad_gap']:.1e}", f"{top['peak_rss'] / 1e6:.0f}"),
    ]


def _model_parts(name: str, m: dict) -> list:
    trained = "all of them" if m["trainable"] == m["parameters"] else f"{m['trainable']:,}"
    parts = [
        f"### {NAMES.get(name, name)}",
        f"{m['parameters']:,} parameters, {trained} trained; {m['towers']} towers, {m['pooling']}"
        " pooling. MB (10^6 bytes) the fullest rank holds; ratios to `none` at the same W.",
        harness.markdown_table(HEADER, [_row(r) for r in m["runs"]]),
    ]
    if "lora" in name:
        fsdp = [r for r in m["runs"] if r["shard"] == "fsdp"]
        held = [f"{r['max']['trainable_parameters'] / 1e6:.3f} MB at W={r['world']}" for r in fsdp]
        parts.append(f"The adapters: {', '.join(held)} under fsdp, the frozen base sharded too.")
    return parts


def _findings(result: dict) -> list[str]:
    out = []
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


def render(result: dict, folder: Path, source: Path | None = None) -> Path:
    """``folder/sharding.md``: machine, command, what is counted, the findings, each model's."""
    plan, machine = result["plan"], result["machine"]
    dry = "**Dry run**: toy sizes, to rehearse the benchmark; not the page's figures."
    per_rank = ", ".join(f"{plan['n_q'] // w} at W={w}" for w in plan["worlds"])
    groups = "every case of a world size in one group, so a rank's peak RSS is all its cases'"
    if not plan.get("one_group_a_world"):
        groups = "each (model, W, sharding) in a process group of its own"
    return harness.write_page(
        Path(folder) / "sharding.md",
        "What a rank holds: `train.shard` none (DDP) against fsdp (FSDP2), on the CPU",
        *([dry] if result.get("dry_run") else []),
        [
            f"`{result['command']}` ({result['date']}, {result['seconds']:.0f} s).",
            f"Machine: {harness.cpu_text(machine)}; torch {machine['torch']}, transformers "
            f"{machine['transformers']}, one thread a rank.",
        ],
        f"Each rank (gloo, on 127.0.0.1; {groups}) runs one GradCache step on its slice of a"
        f" global batch of {plan['n_q']} questions ({per_rank}; {plan['group'] - 1} hard"
        f" negative a question, chunk {plan['chunk']}, every rank's passages as negatives) and"
        " one AdamW step, in float64, under `train.shard: none` (DDP above W = 1) or `fsdp` (the"
        " trainer's `shard_towers`, `train.shard_sync: step`), then counts the bytes it holds"
        " (each DTensor by its local shard): parameters (frozen too), gradients, AdamW's state.",
        "Not counted: DDP's gradient buckets (a second copy of the gradients: `none` holds more"
        " at W > 1), FSDP's blocks gathered whole for their passes (one at a time), the"
        " activations and GradCache's cache (alike for both). Gradient gap: against the W = 1"
        " unsharded run's, the largest difference over the largest gradient. Peak RSS: each"
        " rank's `ru_maxrss`, dominated by the libraries, so it does not show the division.",
        "## Findings",
        _findings(result),
        *(part for name, m in result["models"].items() for part in _model_parts(name, m)),
    )


if __name__ == "__main__":
    main()
