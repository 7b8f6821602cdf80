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
from torch import nn

from benchmarks.machine import machine_info
from benchmarks.sharding_report import write_page

__all__ = ["Plan", "FULL", "DRY", "held_bytes", "relative_gap", "run", "main"]

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


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard; any other tensor itself."""
    from torch.distributed.tensor import DTensor

    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def _nbytes(tensor: torch.Tensor | None) -> int:
    if tensor is None:
        return 0
    local = _local(tensor)
    return local.numel() * local.element_size()


def held_bytes(model: nn.Module, optimizer: torch.optim.Optimizer | None) -> dict[str, int]:
    """The bytes this rank holds in ``model``'s parameters (trainable and all), their gradients
    and ``optimizer``'s state (every tensor of it: AdamW's exp_avg, exp_avg_sq and step), each
    sharded tensor counted by its local shard."""
    params = list(model.parameters())
    state = 0
    if optimizer is not None:
        for per_param in optimizer.state.values():
            state += sum(_nbytes(v) for v in per_param.values() if isinstance(v, torch.Tensor))
    return {
        "parameters": sum(_nbytes(p) for p in params),
        "trainable_parameters": sum(_nbytes(p) for p in params if p.requires_grad),
        "gradients": sum(_nbytes(p.grad) for p in params),
        "optimizer_state": state,
    }


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
    row["sharded_parameters"] = sum(_local(t) is not t for t in model.parameters())
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


if __name__ == "__main__":
    main()
