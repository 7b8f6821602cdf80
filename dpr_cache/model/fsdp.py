"""A BiEncoder's towers sharded across the ranks with PyTorch's FSDP2 (``fully_shard``), as the
step objects take them.

Each transformer block of a tower (the classes its Hugging Face model names in
``_no_split_modules``: ``BertLayer``, ``LlamaDecoderLayer``, ...) is one FSDP unit and the tower
itself the root, so a forward gathers one block's parameters at a time and frees them after it.
A tower with LoRA adapters is sharded the same way: frozen and trainable parameters share a unit.

GradCache runs unchanged over the sharded towers: its graph-less forward, the loss on the cached
representations and the chunked re-forwards and backwards are plain forwards and backwards of the
root. What sharding changes is when gradients leave a rank:

- ``sync: step``: every backward but each tower's last runs with the root's gradient sync off,
  so the unsharded gradients add up locally and are reduce-scattered once a step (the least
  traffic; a rank holds its towers' whole gradients until then);
- ``sync: chunk``: every chunk's backward reduce-scatters (a rank holds only its shard of the
  gradients; a step sends them once a chunk).

Either way the sharded gradient is the mean over ranks of the ranks' gradients, as DDP's is.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator

import torch
from torch import nn

from dpr_cache.core.steppers import Towers
from dpr_cache.model.biencoder import BiEncoder
from dpr_cache.runtime.distributed import DistEnv, device_mesh

__all__ = ["shard_towers", "blocks_of", "mixed_precision", "is_sharded", "full_value", "full_state"]

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def blocks_of(tower: nn.Module) -> list[nn.Module]:
    """The blocks of ``tower`` that FSDP shards one by one: the modules of the classes its
    Hugging Face model keeps whole (``_no_split_modules``), found under a peft wrapper too."""
    kept: set[str] = set()
    for module in tower.modules():
        kept.update(getattr(module, "_no_split_modules", None) or ())
    return [m for m in tower.modules() if type(m).__name__ in kept and m is not tower]


def mixed_precision(precision: str):
    """FSDP2's policy for ``train.precision``: parameters gathered in bf16 or fp16, gradients
    reduced in fp32; None for fp32 (parameters as they are)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if precision not in _DTYPES:
        return None
    return MixedPrecisionPolicy(param_dtype=_DTYPES[precision], reduce_dtype=torch.float32)


def shard_towers(model: BiEncoder, env: DistEnv, *, precision: str, sync: str) -> Towers:
    """Shard ``model``'s distinct towers in place over ``env``'s ranks (one FSDP root each; a
    shared tower is one root used by both sides) and return their encode functions with the
    contexts that hold back the gradient sync (``sync``: ``step`` or ``chunk``, see the module
    docstring). The optimizer must be built after this: sharding replaces the parameters."""
    from torch.distributed.fsdp import fully_shard

    mesh = device_mesh(env)
    policy = mixed_precision(precision)
    extra = {} if policy is None else {"mp_policy": policy}
    roots = [model.query_encoder] if model.shared else [model.query_encoder, model.passage_encoder]
    for root in roots:
        for block in blocks_of(root):
            fully_shard(block, mesh=mesh, **extra)
        fully_shard(root, mesh=mesh, **extra)
    held = [_sync_held(root, sync == "step") for root in roots]
    return Towers(
        encode_q=functools.partial(model.encode_with, model.query_encoder),
        encode_p=functools.partial(model.encode_with, model.passage_encoder, side="passage"),
        no_sync=held[0] if model.shared else (held[0], held[1]),
        no_sync_all=functools.partial(_all_held, held),
        wrappers=roots,
    )


def _sync_held(root: nn.Module, hold: bool) -> Callable[[], contextlib.AbstractContextManager]:
    """A context that turns ``root``'s gradient sync off while it lasts (``hold``), or that
    changes nothing (every backward then reduce-scatters)."""

    @contextlib.contextmanager
    def held() -> Iterator[None]:
        if not hold:
            yield
            return
        root.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            root.set_requires_gradient_sync(True)

    return held


@contextlib.contextmanager
def _all_held(held: list[Callable]) -> Iterator[None]:
    with contextlib.ExitStack() as stack:
        for context in held:
            stack.enter_context(context())
        yield


def is_sharded(model: nn.Module) -> bool:
    """Whether ``model``'s parameters are FSDP's shards (DTensors)."""
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in model.parameters())


def full_value(tensor: torch.Tensor) -> torch.Tensor:
    """A tensor whole: a DTensor's gathered value (a collective), any other tensor itself."""
    from torch.distributed.tensor import DTensor

    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def full_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """A sharded model's whole state dict on rank 0's CPU (gathered tensor by tensor: a
    collective, every rank calls it); empty on the other ranks."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_model_state_dict(model, options=options)
