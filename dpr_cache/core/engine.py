"""GradCache: the exact full-batch gradient of a contrastive loss, at the memory of a chunk.

The algorithm's steps are the engine's methods:

1. :meth:`GradCache.split` orders each tower's rows by length (longest first) and cuts them
   into chunks;
2. :meth:`GradCache.forward_no_grad` encodes every chunk without a graph, recording the RNG
   state (CPU and each CUDA device in use) before each chunk (:meth:`GradCache.forward_last`
   encodes the last chunk of each tower with its graph instead, when it is kept);
3. :meth:`GradCache.build_cache` computes the loss on the detached representations and
   ``g = dloss/dreps`` (kept in fp32, or fp64 for fp64 reps);
4. :meth:`GradCache.forward_backward` re-encodes each chunk with a graph under the replayed RNG
   state and backpropagates the surrogate ``sum(reps * g_chunk)``.

Three savings keep the overhead near one extra graph-less forward of all chunks but the last:
the last chunk of each tower is encoded with its graph in step 2 and backpropagated first in
step 4 (no re-forward; peak memory stays one question chunk plus one passage chunk); rows are
grouped by length, so each chunk holds rows of similar length; and each chunk is cut to its
longest row (trailing columns that no row attends to are dropped), so a chunk of short rows is
not encoded at the batch's padded width. The chunking is planned on the host from one read of
each tower's ``attention_mask`` (:func:`~dpr_cache.core.inputs.cut_chunks`): the chunk loop
never waits for the device to learn a length or a width. The loss always sees the
representations in batch order: each chunk's rows are scattered back to their places, and the
cached gradient gathered from them. Ordered longest first, the kept last chunk is the
shortest: its graph is the smallest one to hold.

Reps may have more dims than [rows, d]: a multi-vector encoder returns [rows, L, d], one vector
a token, with L the chunk's trimmed width. The tower's buffer is then as wide as its widest
chunk, each chunk's rows padded with zero vectors (padding, to the loss), and each chunk's
cached gradient is cut back to the chunk's own width.

The parameter gradients then equal those of one backward over the whole batch. The engine fills
``.grad`` and stops: optimizer, clipping and schedules belong to the caller.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from dpr_cache.core.inputs import Inputs, batch_rows, cut_chunks, group_size_of
from dpr_cache.core.loss import loss_dtype
from dpr_cache.core.rng import RngState, cuda_devices

__all__ = ["GradCache", "RELEASE_EVERY"]

RELEASE_EVERY = 8
"""Chunks encoded between two calls of ``release_memory`` (each call costs page faults)."""

Encoder = Callable[[Inputs], Tensor]
SyncContext = Callable[[], contextlib.AbstractContextManager]


@dataclass(eq=False)
class _Tower:
    """One side (questions or passages) of a step: its chunks, reps and cached gradients."""

    encode: Encoder
    chunks: list[dict[str, Tensor]]
    rows: list[Tensor] | None = None  # each chunk's batch rows; None: consecutive, in order
    reps: Tensor | None = None  # detached reps in batch order, [rows, d] or [rows, L, d]
    widths: list[int] | None = None  # each chunk's reps' dim 1 when it can vary (3-D and up)
    rng: list[RngState] | None = None
    last_reps: Tensor | None = None  # the last chunk's reps with their graph, if kept
    grads: list[Tensor] | None = None  # dloss/dreps per chunk, fp32 (fp64 for fp64 reps)


class GradCache:
    """Exact large-batch gradients for ``loss_fn(encode_q(q), encode_p(p))`` in chunks.

    Args:
        encode_q: maps a dict of batched tensors (a chunk of questions) to reps [n, d], or
            [n, L, d] (one vector a token, L the chunk's width; zero vectors are padding).
        encode_p: the same for passages.
        loss_fn: ``loss_fn(q_reps, p_reps, **loss_kwargs) -> scalar`` on the whole batch.
        chunk_size: question rows per chunk.
        p_chunk_size: passage rows per chunk (default ``chunk_size``).
        chunk_tokens: each chunk takes rows (longest first) while it holds at most this many
            attended tokens; ``chunk_size`` and ``p_chunk_size`` then cap its rows, and a row
            longer than the budget is a chunk alone. None: chunks of rows.
        scaler: a ``torch.amp.GradScaler``: the surrogate is scaled, never the cache.
        no_sync: a callable returning a context (e.g. ``ddp_model.no_sync``): every chunk's
            forward and backward but the last runs inside it, so DDP syncs gradients once. A
            pair ``(q_no_sync, p_no_sync)`` serves two DDP-wrapped towers: each tower's chunks
            but its last run inside its own context (each parameter is still synced once).
        keep_last_graph: encode the last chunk of each tower with its graph in the first pass
            and reuse it, saving its re-forward. Ignored when ``no_sync`` is given (DDP needs
            the synced backward right after its forward).
        replay_rng: replay each chunk's RNG state in the re-forward (turn off only to show
            what breaks without it).
        trim_padding: cut each chunk to its longest row (see :func:`cut_chunks`); turn off
            for an encoder whose output depends on trailing padded positions.
        length_order: chunk each tower's rows longest first (by ``attention_mask``), so rows
            of similar length share a chunk and less padding is encoded; exact for the same
            encoders as ``trim_padding``. Off: rows are chunked in batch order.
        length_bucket: round each trimmed chunk's width up to a multiple of this (exact, as
            the trim is), so that chunk shapes repeat: what compiled towers and CUDA graphs
            need to be reused. None: every chunk at its own width.
        release_memory: called after at least ``RELEASE_EVERY`` graph-less chunks, before
            any graph is built, and every ``RELEASE_EVERY`` re-forwarded chunks (e.g.
            :func:`dpr_cache.runtime.memory.trim`, which the trainer passes), so freed buffers of
            earlier chunks do not count in the step's peak resident memory.
    """

    def __init__(
        self,
        encode_q: Encoder,
        encode_p: Encoder,
        loss_fn: Callable[..., Tensor],
        chunk_size: int,
        *,
        p_chunk_size: int | None = None,
        chunk_tokens: int | None = None,
        scaler: torch.amp.GradScaler | None = None,
        no_sync: SyncContext | tuple[SyncContext, SyncContext] | None = None,
        keep_last_graph: bool = True,
        replay_rng: bool = True,
        trim_padding: bool = True,
        length_order: bool = True,
        length_bucket: int | None = None,
        release_memory: Callable[[], object] | None = None,
    ) -> None:
        sizes = (("chunk_size", chunk_size), ("p_chunk_size", p_chunk_size))
        for name, size in (*sizes, ("chunk_tokens", chunk_tokens)):
            if size is not None and (not isinstance(size, int) or size < 1):
                raise ValueError(f"{name} must be an integer >= 1, got {size!r}")
        self.encode_q, self.encode_p, self.loss_fn = encode_q, encode_p, loss_fn
        self.q_chunk_size = chunk_size
        self.p_chunk_size = p_chunk_size or chunk_size
        self.chunk_tokens = chunk_tokens
        self.scaler = scaler
        self.no_sync = no_sync
        self.keep_last_graph = keep_last_graph and no_sync is None
        self.replay_rng = replay_rng
        self.trim_padding = trim_padding
        self.length_order = length_order
        self.length_bucket = length_bucket
        self.release_memory = release_memory

    # -- the algorithm's steps -------------------------------------------------------------

    def split(self, q_inputs: Inputs, p_inputs: Inputs) -> tuple[_Tower, _Tower]:
        """Check the inputs; order each tower's rows by length and cut them into chunks."""
        group_size_of(batch_rows(q_inputs, "q_inputs"), batch_rows(p_inputs, "p_inputs"))
        return (
            self._tower(self.encode_q, q_inputs, self.q_chunk_size),
            self._tower(self.encode_p, p_inputs, self.p_chunk_size),
        )

    def _tower(self, encode: Encoder, inputs: Inputs, chunk_size: int) -> _Tower:
        chunks = cut_chunks(
            inputs,
            chunk_size,
            length_order=self.length_order,
            trim=self.trim_padding,
            length_bucket=self.length_bucket,
            max_tokens=self.chunk_tokens,
        )
        return _Tower(encode, chunks.parts, chunks.rows)

    def forward_no_grad(self, tower: _Tower) -> None:
        """Encode every chunk (all but the last if kept) without a graph; record RNG states."""
        tower.reps, tower.widths, tower.rng = None, None, []
        for i, chunk in enumerate(tower.chunks[: self._n_graph_less(tower)]):
            tower.rng.append(RngState.capture(cuda_devices(chunk)))
            with torch.no_grad():
                _store(tower, i, tower.encode(chunk))

    def _n_graph_less(self, tower: _Tower) -> int:
        """Chunks encoded without a graph in the first pass: all, or all but the kept last."""
        return len(tower.chunks) - (1 if self.keep_last_graph else 0)

    def forward_last(self, tower: _Tower) -> None:
        """Encode the last chunk with its graph (``keep_last_graph``). Called once both towers'
        graph-less chunks are done, so the kept graphs are allocated after the short-lived
        buffers of those chunks (less allocator fragmentation on CPU)."""
        chunk = tower.chunks[-1]
        tower.rng.append(RngState.capture(cuda_devices(chunk)))
        tower.last_reps = tower.encode(chunk)
        with torch.no_grad():
            _store(tower, len(tower.chunks) - 1, tower.last_reps.detach())

    def build_cache(self, q: _Tower, p: _Tower, **loss_kwargs) -> Tensor:
        """Loss on the detached reps (batch order) and its gradient per chunk (chunk order);
        raises on a non-finite loss."""
        q_all = _cache_leaf(q.reps)
        p_all = _cache_leaf(p.reps)
        with torch.enable_grad(), torch.autocast(q_all.device.type, enabled=False):
            loss = self.loss_fn(q_all, p_all, **loss_kwargs)
            if loss.dim() != 0:
                raise ValueError(f"loss_fn must return a scalar, got shape {tuple(loss.shape)}")
            if not torch.isfinite(loss):
                raise FloatingPointError(
                    f"non-finite loss ({loss.item()}); no gradient was written"
                )
            q_grad, p_grad = torch.autograd.grad(loss, [q_all, p_all], allow_unused=True)
        q.grads = _split_like(q_grad, q_all, q)
        p.grads = _split_like(p_grad, p_all, p)
        return loss.detach()

    def forward_backward(self, q: _Tower, p: _Tower) -> None:
        """Re-encode each chunk with a graph under its RNG state; backprop the surrogate."""
        keep = self.keep_last_graph
        if keep:  # the kept graphs go first: afterwards one chunk's graph at most is alive
            self._backward(sum(_surrogate(t.last_reps, t.grads[-1]) for t in (q, p)))
            for t in (q, p):
                t.last_reps = None
        pieces = [
            (tower, i)
            for tower in (q, p)
            for i in range(len(tower.chunks))
            if not (keep and i == len(tower.chunks) - 1)
        ]
        for n, (tower, i) in enumerate(pieces):
            if self.release_memory is not None and n and n % RELEASE_EVERY == 0:
                self.release_memory()  # heap slack creeps up over many chunks
            with self._sync_context(tower is q, i == len(tower.chunks) - 1, n == len(pieces) - 1):
                replay = tower.rng[i].replay() if self.replay_rng else contextlib.nullcontext()
                with replay:
                    reps = tower.encode(tower.chunks[i])
                self._backward(_surrogate(reps, tower.grads[i]))

    def step(self, q_inputs: Inputs, p_inputs: Inputs, **loss_kwargs) -> Tensor:
        """Accumulate the exact full-batch gradient into ``.grad``; return the detached loss."""
        q, p = self.split(q_inputs, p_inputs)
        try:
            self.forward_no_grad(q)
            self.forward_no_grad(p)
            graph_less = self._n_graph_less(q) + self._n_graph_less(p)
            if self.release_memory is not None and graph_less >= RELEASE_EVERY:
                self.release_memory()  # worth its page faults only after many chunks
            if self.keep_last_graph:
                self.forward_last(q)
                self.forward_last(p)
            loss = self.build_cache(q, p, **loss_kwargs)
            self.forward_backward(q, p)
        finally:
            q.last_reps = p.last_reps = None  # free kept graphs even on error
        return loss

    __call__ = step

    def _sync_context(
        self, is_query: bool, last_of_tower: bool, last_overall: bool
    ) -> contextlib.AbstractContextManager:
        """DDP's no_sync for every backward but the one that must sync the gradients."""
        if self.no_sync is None:
            return contextlib.nullcontext()
        if isinstance(self.no_sync, tuple):
            return (
                contextlib.nullcontext() if last_of_tower else self.no_sync[0 if is_query else 1]()
            )
        return contextlib.nullcontext() if last_overall else self.no_sync()

    def _backward(self, surrogate: Tensor) -> None:
        if self.scaler is not None:
            surrogate = self.scaler.scale(surrogate)
        surrogate.backward()


def _store(tower: _Tower, index: int, reps: Tensor) -> None:
    """Copy chunk ``index``'s reps to their batch rows of the tower's buffer, allocated at the
    first chunk.

    One buffer instead of a small tensor per chunk: no long-lived allocation lands between
    the chunks' short-lived activations (which fragments the CPU heap and grows the peak
    resident memory with the number of chunks), and no concatenation afterwards. Reps of 3
    dims or more ([rows, L, d]) go to a zero-filled buffer as wide as the widest chunk so far
    (:func:`_widen`), into their first ``L`` columns.
    """
    if tower.reps is None:
        rows = sum(batch_rows(c) for c in tower.chunks)
        shape = (rows, *reps.shape[1:])
        tower.reps = reps.new_zeros(shape) if reps.dim() > 2 else reps.new_empty(shape)
    target = tower.reps
    if reps.dim() > 2:
        _widen(tower, index, reps)
        target = tower.reps[:, : reps.shape[1]]
    if tower.rows is not None:
        target.index_copy_(0, tower.rows[index].to(reps.device), reps)
        return
    start = sum(batch_rows(c) for c in tower.chunks[:index])
    target[start : start + reps.shape[0]].copy_(reps)


def _widen(tower: _Tower, index: int, reps: Tensor) -> None:
    """Record chunk ``index``'s width; grow the tower's buffer with zeros to it when wider."""
    if reps.shape[2:] != tower.reps.shape[2:]:
        raise ValueError(
            f"a chunk's reps {tuple(reps.shape)} differ from the first chunk's "
            f"{tuple(tower.reps.shape)} beyond dim 1"
        )
    if tower.widths is None:
        tower.widths = [0] * len(tower.chunks)
    tower.widths[index] = reps.shape[1]
    if reps.shape[1] > tower.reps.shape[1]:
        wider = tower.reps.new_zeros((tower.reps.shape[0], *reps.shape[1:]))
        wider[:, : tower.reps.shape[1]].copy_(tower.reps)
        tower.reps = wider


def _cache_leaf(joined: Tensor) -> Tensor:
    """The tower's reps as a leaf in the loss's dtype that records its grad."""
    return joined.detach().to(loss_dtype(joined)).requires_grad_(True)


def _split_like(grad: Tensor | None, joined: Tensor, tower: _Tower) -> list[Tensor]:
    """The gradient (batch order) cut into the tower's chunks, rows as encoded and, where the
    chunks' widths vary, each cut to its chunk's width."""
    if grad is None:
        grad = torch.zeros_like(joined)
    if tower.rows is not None:
        parts = [grad.index_select(0, rows.to(grad.device)) for rows in tower.rows]
    else:
        parts = list(grad.split([batch_rows(c) for c in tower.chunks]))
    if tower.widths is None:
        return parts
    return [part[:, :width] for part, width in zip(parts, tower.widths, strict=True)]


def _surrogate(reps: Tensor, grad: Tensor) -> Tensor:
    """``sum(reps * grad)`` computed in the cache's precision: its gradient wrt reps is grad."""
    return (reps.to(grad.dtype) * grad).sum()
