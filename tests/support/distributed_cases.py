"""Per-rank worker of the 2-rank tests (launched with torch.multiprocessing.spawn).

Each case builds the same float64 tiny BERT on every rank, wraps it with the trainer's own
``wrap_towers`` / ``make_loss_fn`` / ``make_stepper``, runs a few steps on this rank's slice of a
global batch and saves, per step, the ``.grad`` every trainable parameter holds after DDP's
averaging and how many times a DDP comm hook saw each parameter.
"""

# No ``from __future__ import annotations``: DDP checks the comm hook's annotations as objects.
import functools
import signal
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

from dpr_cache.core.distill import Distillation
from dpr_cache.core.gather import gather_no_grad
from dpr_cache.core.loss import Guide, InfoNCE, contrastive_loss
from dpr_cache.core.objective import Matryoshka, Objective, make_loss_fn
from dpr_cache.core.steppers import make_stepper
from dpr_cache.model.biencoder import BiEncoder
from dpr_cache.model.ddp import wrap_towers
from dpr_cache.runtime import distributed
from dpr_cache.runtime.atomic import write_atomic
from dpr_cache.runtime.distributed import DistEnv
from dpr_cache.runtime.memory import trim
from tests.support.fixtures import bert_config, random_inputs
from tests.support.ranks import join

N_Q = 8  # global questions: 4 per rank; chunk 3 leaves uneven last chunks (3+1, 3+3+2)
HARD = 1
GROUP = 1 + HARD
CHUNK = 3
TEMPERATURE = 0.5
STEPS = 2
MULTI_DIM = 16


def make_model(shared: bool, checkpointing: bool = False, multi: bool = False) -> BiEncoder:
    """The same float64 weights in every process (separate towers start different); ``multi``:
    token vectors of ``MULTI_DIM`` dims (the projection in each tower)."""
    torch.manual_seed(0)
    model = BiEncoder.from_config(
        bert_config(),
        shared=shared,
        pooling="mean",
        gradient_checkpointing=checkpointing,
        multi_dim=MULTI_DIM if multi else None,
    )
    if not shared:
        with torch.no_grad():
            for param in model.passage_encoder.parameters():
                param.add_(0.02 * torch.randn_like(param))
    return model.double().train()


def global_batch(step: int) -> tuple[dict, dict, Tensor]:
    """A global batch whose passages repeat across the rank boundary (rows 0..7 | 8..15).

    Row 9 (rank 1, question 4's hard negative) is question 0's positive (row 0, rank 0); row 1
    (rank 0, question 0's hard negative) is question 5's positive (row 10, rank 1).
    """
    q_inputs = random_inputs(N_Q, 9, seed=10 + step)
    p_inputs = random_inputs(N_Q * GROUP, 12, seed=20 + step)
    p_ids = torch.arange(N_Q * GROUP) + 100
    for dup, orig in ((9, 0), (1, 10)):
        p_ids[dup] = p_ids[orig]
        for key in p_inputs:
            p_inputs[key][dup] = p_inputs[key][orig]
    return q_inputs, p_inputs, p_ids


def teacher_scores(step: int, n_q: int = N_Q) -> Tensor:
    """The teacher's scores of a global batch's passage rows (float64)."""
    gen = torch.Generator().manual_seed(30 + step)
    return 3.0 * torch.randn(n_q * GROUP, generator=gen, dtype=torch.float64)


def distillation(case: dict[str, Any]) -> Distillation | None:
    """A case's distillation spec (``distill``: the loss, ``weight``: the contrastive share)."""
    if "distill" not in case:
        return None
    return Distillation(case["distill"], weight=case.get("weight", 0.0), teacher_temperature=2.0)


def objective(case: dict[str, Any]) -> Objective:
    """A case's loss: ``tile``, the distillation keys, and ``loss`` (``directions``,
    ``partition``, ``hardness`` with ``strength``, ``guide_margin`` with ``strategy``,
    ``matryoshka`` dims with ``normalize``)."""
    o = case.get("loss", {})
    guide = None
    if "guide_margin" in o:
        guide = Guide(o["guide_margin"], o.get("strategy", "absolute"))
    infonce = InfoNCE(
        temperature=TEMPERATURE,
        tile_size=case.get("tile"),
        directions=tuple(o.get("directions", ("query_to_passage",))),
        partition=o.get("partition", "joint"),
        hardness=o.get("hardness"),
        hardness_strength=o.get("strength", 0.0),
        guide=guide,
    )
    matryoshka = None
    if "matryoshka" in o:
        matryoshka = Matryoshka(tuple(o["matryoshka"]), o.get("weights"), o.get("normalize", False))
    return Objective(GROUP, infonce, distillation(case), matryoshka)


def guide_reps(step: int, n_q: int = N_Q) -> dict[str, Tensor]:
    """A guide's vectors of a global batch's rows (float64): each question near its positive,
    so that the guide's rule takes some candidates out of a row and keeps others."""
    gen = torch.Generator().manual_seed(40 + step)
    guide_p = torch.randn(n_q * GROUP, 6, generator=gen, dtype=torch.float64)
    noise = torch.randn(n_q, 6, generator=gen, dtype=torch.float64)
    return {"guide_q": guide_p[::GROUP] + 0.6 * noise, "guide_p": guide_p}


def loss_inputs(case: dict[str, Any], step: int, n_q: int = N_Q) -> dict[str, Tensor]:
    """What a case's loss takes besides the reps for a global batch: the teacher's scores
    (distillation) and the guide's vectors (a guided loss)."""
    extra = {}
    if "distill" in case:
        extra["teacher_scores"] = teacher_scores(step, n_q)
    if "guide_margin" in case.get("loss", {}):
        extra.update(guide_reps(step, n_q))
    return extra


def rank_loss_inputs(extra: dict[str, Tensor], rank: int, world: int) -> dict[str, Tensor]:
    """This rank's rows of :func:`loss_inputs` (each tensor a row per question or passage)."""
    return {key: rank_rows({key: value}, rank, world)[key] for key, value in extra.items()}


def rank_rows(inputs: dict, rank: int, world: int) -> dict:
    rows = next(iter(inputs.values())).shape[0] // world
    return {k: v[rank * rows : (rank + 1) * rows] for k, v in inputs.items()}


def naive_loss_fn(env: DistEnv, tile_size: int | None):
    """The negative control: other ranks' passages enter as constants (no gradient back)."""

    def loss_fn(q_reps: Tensor, p_reps: Tensor, p_ids: Tensor | None = None) -> Tensor:
        parts = [torch.empty_like(p_reps) for _ in range(env.world_size)]
        dist.all_gather(parts, p_reps.detach().contiguous())
        parts[env.rank] = p_reps
        return contrastive_loss(
            q_reps,
            torch.cat(parts),
            temperature=TEMPERATURE,
            tile_size=tile_size,
            p_ids=gather_no_grad(p_ids),
            group_size=GROUP,
            positive_offset=env.rank * p_reps.shape[0],
        )

    return loss_fn


class SyncCounter:
    """A DDP comm hook that all-reduces as usual and counts the parameters each bucket covers."""

    def __init__(self, names: dict[int, str]) -> None:
        self.names = names
        self.calls = 0
        self.seen: dict[str, int] = {}

    def reset(self) -> dict[str, Any]:
        out = {"calls": self.calls, "params": dict(self.seen)}
        self.calls, self.seen = 0, {}
        return out

    def hook(self, state: Any, bucket: dist.GradBucket) -> torch.futures.Future[Tensor]:
        self.calls += 1
        for param in bucket.parameters():
            name = self.names[id(param)]
            self.seen[name] = self.seen.get(name, 0) + 1
        return allreduce_hook(None, bucket)


def run_case(case: dict[str, Any], env: DistEnv) -> dict[str, Any]:
    model = make_model(case["shared"], case.get("checkpointing", False), case.get("multi", False))
    names = {id(p): n for n, p in model.named_parameters()}
    towers = wrap_towers(model, env)
    counters = []
    for wrapper in towers.wrappers:
        counter = SyncCounter(names)
        wrapper.register_comm_hook(None, counter.hook)
        counters.append(counter)
    if case.get("naive"):
        loss_fn = naive_loss_fn(env, case.get("tile"))
    else:
        loss_fn = make_loss_fn(objective(case), rank=env.rank, world_size=env.world_size)
    if case.get("sync_every_chunk"):  # the counter's own control: no no_sync at all
        towers.no_sync = None
    stepper = make_stepper(
        case["mode"], towers, loss_fn, chunk_size=CHUNK, keep_last_graph=False, release_memory=trim
    )
    steps = []
    for step in range(STEPS):
        q_inputs, p_inputs, p_ids = global_batch(step)
        model.zero_grad(set_to_none=True)
        extra = rank_loss_inputs(loss_inputs(case, step), env.rank, env.world_size)
        if case.get("wrong_teacher"):  # the control reads rank 0's scores on every rank
            extra["teacher_scores"] = rank_rows({"t": teacher_scores(step)}, 0, env.world_size)["t"]
        loss = stepper.step(
            rank_rows(q_inputs, env.rank, env.world_size),
            rank_rows(p_inputs, env.rank, env.world_size),
            p_ids=rank_rows({"ids": p_ids}, env.rank, env.world_size)["ids"],
            **extra,
        )
        steps.append(
            {
                "loss": float(loss),
                "grads": {
                    n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad
                },
                "syncs": [c.reset() for c in counters],
                "n_params": [sum(p.requires_grad for p in w.parameters()) for w in towers.wrappers],
            }
        )
    return {"steps": steps}


def main(rank: int, world: int, port: int, out_dir: str, cases: list[dict[str, Any]]) -> None:
    """Entry point for ``torch.multiprocessing.spawn``: run every case, save one file each."""
    env = join(rank, world, port)
    handler = signal.getsignal(signal.SIGTERM)  # a dead peer named even if SIGTERM comes first
    assert handler is distributed._on_sigterm, f"setup left SIGTERM to {handler}"
    try:
        for case in cases:
            try:
                result = run_case(case, env)
            except Exception as exc:  # reported by the test; both ranks fail alike under DDP
                result = {"error": f"{type(exc).__name__}: {exc}"}
            path = Path(out_dir) / f"{case['name']}-rank{rank}.pt"
            write_atomic(path, functools.partial(torch.save, result))
    finally:
        distributed.teardown()
