"""What a rank holds under ``train.shard: none`` (DDP) and ``fsdp`` (FSDP2), counted on the CPU::

    python -m benchmarks.sharding --out docs/bench

writes ``sharding.json`` (every figure) and ``sharding.md`` (the page). For each model (a BERT
whose weights dominate, the tiny Llama of ``data/toy/tiny-llama`` fully trained and with LoRA
adapters), each world size W (1, 2, 4 gloo ranks spawned on 127.0.0.1) and each sharding, every
rank runs one GradCache step (chunk smaller than its slice of the batch) on its slice of one
global batch and one AdamW step, in float64, then counts the bytes it holds in:

- parameters (a DTensor's local shard, ``p.to_local()``; frozen ones too),
- gradients (the same),
- AdamW's state (``exp_avg``, ``exp_avg_sq``, ``step``),

and its peak resident memory (``ru_maxrss``). Counting bytes is deterministic: no timing, so the
figures hold on a shared machine. Beside them, the gradient of each run (gathered whole) against
the W = 1 unsharded run's, the largest difference relative to its largest magnitude (float64).

Each (model, W, sharding) runs in a process group of its own (its ranks' peak RSS are theirs);
the dry run (``--dry-run``) runs every case of a world size in one group, on a tiny BERT and
the Llama with LoRA at W = 1 and 2.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import resource
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from benchmarks.harness import cpu_text, held_bytes, local_shard, machine_info, markdown_table
from dpr_cache.runtime.atomic import write_json_atomic, write_text_atomic

__all__ = [
    "Plan",
    "FULL",
    "DRY",
    "relative_gap",
    "run",
    "main",
    "PAGE",
    "FIGURES",
    "markdown",
    "write_page",
]

REPO = Path(__file__).resolve().parents[1]
TINY_LLAMA = REPO / "data" / "toy" / "tiny-llama"
SHARDS = ("none", "fsdp")
TEMPERATURE = 0.5
SPAWN_TIMEOUT = 600


@dataclass(frozen=True)
class Plan:
    """The sizes of a run: the page's, or the dry run's."""

    models: tuple[str, ...]  # bert, llama, llama-lora
    worlds: tuple[int, ...]
    n_q: int  # global questions of the step
    group: int  # passages a question: a positive and hard negatives
    chunk: int  # GradCache's chunk (below every rank's slice of the batch)
    q_len: int
    p_len: int
    bert_hidden: int
    bert_layers: int
    bert_vocab: int
    lora_r: int = 4
    one_group_a_world: bool = False  # every case of a world size in one process group


FULL = Plan(
    models=("bert", "llama", "llama-lora"),
    worlds=(1, 2, 4),
    n_q=16,
    group=2,
    chunk=2,  # 16, 8 and 4 questions a rank
    q_len=16,
    p_len=24,
    bert_hidden=256,
    bert_layers=4,
    bert_vocab=512,
)
DRY = Plan(
    models=("bert", "llama-lora"),
    worlds=(1, 2),
    n_q=4,
    group=2,
    chunk=1,
    q_len=8,
    p_len=10,
    bert_hidden=32,
    bert_layers=2,
    bert_vocab=97,
    one_group_a_world=True,
)


def _bert(plan: Plan):
    """A BERT config of ``plan``'s width and depth (4 heads, MLP 4x), built in-process."""
    from transformers import BertConfig

    return BertConfig(
        vocab_size=plan.bert_vocab,
        hidden_size=plan.bert_hidden,
        num_hidden_layers=plan.bert_layers,
        num_attention_heads=4,
        intermediate_size=4 * plan.bert_hidden,
        max_position_embeddings=64,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )


def build_model(name: str, plan: Plan):
    """The case's float64 BiEncoder, the same on every rank: the BERT with separate towers
    (DPR's; the passage tower moved off the query tower's start), the tiny Llama with one shared
    tower and last-token pooling, fully trained or with LoRA on every linear layer (its B
    matrices made non-zero, as training leaves them)."""
    from dpr_cache.model.biencoder import BiEncoder

    torch.manual_seed(0)
    if name == "bert":
        model = BiEncoder.from_config(_bert(plan), shared=False, pooling="mean")
        with torch.no_grad():
            for param in model.passage_encoder.parameters():
                param.add_(0.02 * torch.randn_like(param))
        return model.double().train()
    from dpr_cache.config import LoraConfig

    lora = None
    if name == "llama-lora":
        lora = LoraConfig(r=plan.lora_r, alpha=2.0 * plan.lora_r, dropout=0.0)
    model = BiEncoder.from_pretrained(
        TINY_LLAMA, shared=True, pooling="last", dropout=0.0, lora=lora
    )
    with torch.no_grad():
        for param_name, param in model.named_parameters():
            if "lora_B" in param_name:
                param.normal_(0.0, 0.05)
    return model.double().train()


def global_batch(name: str, plan: Plan) -> tuple[dict, dict, torch.Tensor]:
    """Random token ids: questions and their passage groups, ragged (right-padded) for the BERT,
    every position attended for the decoder (last-token pooling reads the last column)."""
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


def _slice(inputs: dict, rank: int, world: int) -> dict:
    n = next(iter(inputs.values())).shape[0] // world
    return {k: v[rank * n : (rank + 1) * n] for k, v in inputs.items()}


def relative_gap(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> float:
    """The largest difference over every tensor, relative to the largest magnitude of ``want``;
    infinite where the names differ."""
    if got.keys() != want.keys():
        return float("inf")
    scale = max(v.abs().max().item() for v in want.values())
    return max((got[k] - want[k]).abs().max().item() for k in want) / scale


def float64_norms() -> None:
    """Llama's RMSNorm computed in float64 for float64 inputs (transformers' computes it in
    float32 whatever the input, which would leave float32 rounding in the gradients' gap)."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    original = LlamaRMSNorm.forward

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if hidden.dtype != torch.float64:
            return original(self, hidden)
        variance = hidden.pow(2).mean(-1, keepdim=True)
        return self.weight * (hidden * torch.rsqrt(variance + self.variance_epsilon))

    LlamaRMSNorm.forward = forward


def run_case(name: str, shard: str, plan: Plan, env) -> tuple[dict, dict]:
    """One GradCache step and one AdamW step of model ``name`` under ``shard`` on this rank's
    slice of the batch: the bytes held, the loss, and the first step's gradient gathered whole
    (a collective for shards)."""
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
    q, p, p_ids = global_batch(name, plan)
    optimizer.zero_grad(set_to_none=True)
    world, rank = env.world_size, env.rank
    loss = stepper.step(
        _slice(q, rank, world),
        _slice(p, rank, world),
        p_ids=_slice({"ids": p_ids}, rank, world)["ids"],
    )
    grads = {
        n: full_value(t.grad).detach().clone()
        for n, t in model.named_parameters()
        if t.grad is not None
    }
    optimizer.step()
    row = held_bytes(model, optimizer)
    row["held"] = row["parameters"] + row["gradients"] + row["optimizer_state"]
    row["loss"] = distributed.all_mean(loss, env)
    row["sharded_parameters"] = sum(local_shard(t) is not t for t in model.parameters())
    return row, grads


def _rank_main(rank: int, world: int, port: int, out: str, plan: Plan, cases: list) -> None:
    """Entry point of a spawned rank: join the group, run ``cases``, write this rank's figures
    (``rank{r}.json``) and rank 0 the gradients (``{case}.pt``)."""
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world),
    )
    torch.set_num_threads(1)
    from dpr_cache.runtime import distributed

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
    """``cases`` run on ``world`` spawned ranks in one process group: each rank's rows."""
    import torch.multiprocessing as mp

    from dpr_cache.runtime.processes import free_port

    out.mkdir(parents=True, exist_ok=True)
    context = mp.start_processes(
        _rank_main,
        args=(world, free_port(), str(out), plan, cases),
        nprocs=world,
        join=False,
        start_method="spawn",
    )
    deadline = time.monotonic() + SPAWN_TIMEOUT
    while not context.join(timeout=1):
        if time.monotonic() > deadline:
            for proc in context.processes:
                proc.kill()
            raise TimeoutError(f"{world} ranks of {cases} did not finish in {SPAWN_TIMEOUT} s")
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]


def _count_parameters(name: str, plan: Plan) -> dict:
    model = build_model(name, plan)
    return {
        "parameters": sum(p.numel() for p in model.parameters()),
        "trainable": sum(p.numel() for p in model.parameters() if p.requires_grad),
        "towers": "shared" if model.shared else "separate",
        "pooling": model.pooling,
    }


def run(plan: Plan, work: Path, echo=print) -> dict:
    """Every (model, W, sharding) of ``plan``: each rank's bytes, the largest over ranks, the
    ratio to ``none`` at the same W, and the gradient's gap to the W = 1 unsharded run."""
    started = time.monotonic()
    runs: dict[tuple, dict] = {}
    for world in plan.worlds:
        cases = [(m, s) for m in plan.models for s in SHARDS]
        batches = [cases] if plan.one_group_a_world else [[c] for c in cases]
        for batch in batches:
            folder = work / f"w{world}-{len(runs)}"
            begun = time.monotonic()
            ranks = _spawn(world, plan, batch, folder)
            seconds = round(time.monotonic() - begun, 1)
            for name, shard in batch:
                key = f"{name}-{shard}"
                per_rank = [r[key] for r in ranks]
                runs[(name, world, shard)] = {
                    "world": world,
                    "shard": shard,
                    "ranks": per_rank,
                    "loss": per_rank[0]["loss"],
                    "grads": folder / f"{key}.pt",
                    "seconds": seconds,
                    "rss_alone": not plan.one_group_a_world,
                }
                echo(f"{name} W={world} {shard}: {_summary(per_rank)} ({seconds} s)")
    models = {}
    for name in plan.models:
        reference = torch.load(runs[(name, 1, "none")]["grads"])
        rows = []
        for world in plan.worlds:
            for shard in SHARDS:
                r = runs[(name, world, shard)]
                grads = torch.load(r.pop("grads"))
                r["grad_gap"] = relative_gap(grads, reference)
                r["max"] = {k: max(rank[k] for rank in r["ranks"]) for k in _KINDS}
                rows.append(r)
        for r in rows:
            none = next(x for x in rows if x["world"] == r["world"] and x["shard"] == "none")
            r["ratio"] = {k: r["max"][k] / none["max"][k] for k in _KINDS if none["max"][k]}
        models[name] = {**_count_parameters(name, plan), "runs": rows}
    return {"models": models, "seconds": round(time.monotonic() - started, 1)}


_KINDS = (
    "parameters",
    "trainable_parameters",
    "gradients",
    "optimizer_state",
    "held",
    "peak_rss",
)


def _summary(ranks: list[dict]) -> str:
    worst = max(r["held"] for r in ranks)
    return f"{worst / 1e6:.3f} MB held by the fullest rank"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("docs/bench"))
    parser.add_argument("--dry-run", action="store_true", help="A tiny BERT and W = 1, 2.")
    args = parser.parse_args(argv)
    import tempfile

    plan = DRY if args.dry_run else FULL
    with tempfile.TemporaryDirectory(prefix="dpr-cache-sharding-") as tmp:
        result = run(plan, Path(tmp))
    command = "python -m benchmarks.sharding" + (" --dry-run" if args.dry_run else "")
    report = {
        "command": f"{command} --out {args.out}",
        "dry_run": args.dry_run,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine_info("cpu", 1),
        "plan": asdict(plan),
        **result,
    }
    for path in write_page(report, args.out):
        print(path)


# The page.


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


def render(result: dict, folder: Path, source: Path | None = None) -> Path:
    """``sharding.md`` in ``folder``."""
    write_text_atomic(folder / PAGE, markdown(result))
    return folder / PAGE


def write_page(result: dict, out: Path) -> list[Path]:
    """``sharding.json`` and ``sharding.md`` in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / FIGURES, result)
    write_text_atomic(out / PAGE, markdown(result))
    return [out / FIGURES, out / PAGE]


if __name__ == "__main__":
    main()
