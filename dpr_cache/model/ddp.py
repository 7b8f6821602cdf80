"""A BiEncoder's towers under DistributedDataParallel, as the step objects take them."""

from __future__ import annotations

import contextlib
import functools

from torch.nn.parallel import DistributedDataParallel

from dpr_cache.core.steppers import Towers
from dpr_cache.model.biencoder import BiEncoder
from dpr_cache.runtime.distributed import DistEnv

__all__ = ["wrap_towers"]


def wrap_towers(model: BiEncoder, env: DistEnv) -> Towers:
    """The model's encode functions; on several ranks each distinct tower wrapped in DDP.

    A shared tower is one DDP module used by both sides (its last chunk syncs); separate
    towers get one DDP each, so each tower's last chunk syncs its own parameters once.
    """
    if not env.enabled:
        return Towers(model.encode_query, model.encode_passage)
    device_ids = [env.device.index] if env.device.type == "cuda" else None
    q_ddp = DistributedDataParallel(model.query_encoder, device_ids=device_ids)
    p_ddp = (
        q_ddp
        if model.shared
        else DistributedDataParallel(model.passage_encoder, device_ids=device_ids)
    )
    wrappers = [q_ddp] if model.shared else [q_ddp, p_ddp]

    @contextlib.contextmanager
    def no_sync_all():
        with contextlib.ExitStack() as stack:
            for wrapper in wrappers:
                stack.enter_context(wrapper.no_sync())
            yield

    return Towers(
        encode_q=functools.partial(model.encode_with, q_ddp),
        encode_p=functools.partial(model.encode_with, p_ddp, side="passage"),
        no_sync=q_ddp.no_sync if model.shared else (q_ddp.no_sync, p_ddp.no_sync),
        no_sync_all=no_sync_all,
        wrappers=wrappers,
    )
