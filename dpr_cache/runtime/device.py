"""Devices and numeric precision: which device a process runs on, which precision ``auto``
stands for there, and what ``fp32 | bf16 | fp16`` mean for autocast. The one place that maps a
device preference or a precision name."""

from __future__ import annotations

import contextlib
import functools
import os
import re
import traceback

import torch

from dpr_cache.errors import InputError, OutOfDeviceMemory

__all__ = [
    "PRECISIONS",
    "resolve_device",
    "resolve_precision",
    "precision_dtype",
    "autocast",
    "deterministic_kernels",
    "out_of_memory_state",
]

PRECISIONS = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def resolve_device(
    preference: str | torch.device = "auto", local_rank: int | None = None, key: str = "device"
) -> torch.device:
    """``auto`` = cuda if available, else cpu; a bare ``cuda`` is ``cuda:LOCAL_RANK``.

    ``local_rank`` defaults to the ``LOCAL_RANK`` that ``torchrun`` sets (0 without it).
    Raises InputError, naming the setting ``key`` it came from, for a device that does not parse
    or a CUDA device without CUDA.
    """
    if isinstance(preference, torch.device):
        return preference
    if preference == "auto":
        preference = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(preference)
    except RuntimeError:
        raise InputError(f"{key}: not a device: {preference!r}") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise InputError(f"{key}: {preference!r} asked for but CUDA is not available")
        if device.index is None:
            rank = int(os.environ.get("LOCAL_RANK", "0")) if local_rank is None else local_rank
            device = torch.device("cuda", rank)
    return device


def resolve_precision(precision: str, device: torch.device) -> str:
    """The precision a model runs in on ``device``: ``fp32``, ``bf16`` or ``fp16`` as named, and
    ``auto`` by the device.

    ``auto`` on CUDA is bf16 from compute capability 8.0 (the GPU's own bf16; an older one only
    emulates it, slowly) and fp16 below it; on ROCm bf16; on any other device (the CPU) fp32.
    So ``auto`` never means fp32 on a GPU, and nothing here turns TF32 on: an fp32 asked for
    runs PyTorch's default full-precision fp32 matmuls on any device. ValueError for a name
    that is none of these.
    """
    if precision == "auto":
        if device.type != "cuda":
            return "fp32"
        major, _ = torch.cuda.get_device_capability(device)
        return "bf16" if torch.version.hip is not None or major >= 8 else "fp16"
    precision_dtype(precision)  # ValueError for an unknown name
    return precision


def precision_dtype(precision: str) -> torch.dtype:
    """The dtype of ``fp32``, ``bf16`` or ``fp16``."""
    try:
        return PRECISIONS[precision]
    except KeyError:
        raise ValueError(
            f"precision must be one of {list(PRECISIONS)}, got {precision!r}"
        ) from None


def autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    """Autocast to ``precision`` on ``device`` (a no-op for fp32)."""
    dtype = precision_dtype(precision)
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)


def deterministic_kernels(on: bool) -> None:
    """Make every kernel deterministic (``torch.use_deterministic_algorithms``; cuBLAS gets the
    fixed workspace it needs, set before its first use), or leave PyTorch's defaults. On CUDA
    this is what makes two runs of one config, or a resumed run and an unbroken one, equal bit
    for bit; on the CPU the kernels already are."""
    if not on:
        return
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False


def out_of_memory_state(error: BaseException) -> str | None:
    """What the GPU that ``error`` ran out of holds, once this process's cache is handed back:
    its name, the memory free of its total and the most this process reserved, so that a GPU
    that other processes fill reads apart from a batch too large for it; None when ``error`` is
    no CUDA out-of-memory error. Both kinds count: the caching allocator's
    (``torch.OutOfMemoryError``) and a CUDA call's own (``CUDA error: out of memory``, as when
    a context or a library's workspace cannot be made). Where the GPU can no longer be read,
    the line says only that it ran out."""
    text = str(error)
    allocator = isinstance(error, torch.OutOfMemoryError)
    if not (allocator or "CUDA error: out of memory" in text) or not torch.cuda.is_available():
        return None
    named = re.search(r"\bGPU (\d+)", text)
    try:
        index = int(named.group(1)) if named else torch.cuda.current_device()
        held = torch.cuda.max_memory_reserved(index)
        if error.__traceback__ is not None:  # the failed frames' tensors, freed before the reading
            traceback.clear_frames(error.__traceback__)
        torch.cuda.empty_cache()
        free, total = torch.cuda.mem_get_info(index)
        name = torch.cuda.get_device_name(index)
    except RuntimeError:
        return "the GPU ran out of memory"
    return (
        f"{name} (cuda:{index}) ran out of memory: {free / 1e9:.2f} of {total / 1e9:.1f} GB free "
        f"now, this process held at most {held / 1e9:.2f} GB"
    )


def advises_on_out_of_memory(way_out: str):
    """A decorator for a command's work: a CUDA out-of-memory error it raises becomes
    :class:`~dpr_cache.errors.OutOfDeviceMemory`, one line saying what the GPU holds (see
    :func:`out_of_memory_state`) and ``way_out`` beside freeing the GPU (e.g. ``"lower
    eval.batch_size"``, the setting that bounds what that work puts on the GPU at once)."""

    def decorate(func):
        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            try:
                return func(*args, **kwargs)
            except RuntimeError as exc:
                state = out_of_memory_state(exc)
                if state is None:
                    raise
                advice = f"free the GPU of other processes, or {way_out}"
                raise OutOfDeviceMemory(f"{state}: {advice}") from None

        wrapper.way_out = way_out
        return wrapper

    return decorate
