"""Work in resumable parts: a command's records taken in parts of a size, each part written whole
into ``OUT.parts/`` with its counts beside it, the parts merged into ``OUT`` in order with their
counts summed, and a summary beside ``OUT`` (``<OUT stem>.summary.json``). ``mine`` and ``score``
run this way.

A rerun keeps the finished parts when the folder was made for the same inputs (the spec's
fingerprint, :func:`fingerprint`, and its part size), and empties the folder otherwise. Under
``torchrun`` every rank walks every part, rank 0 saying which are done; the work of a part is the
caller's, and may split the part's records over the ranks (:func:`share_of`, :func:`over_ranks`);
rank 0 writes the parts, merges them and writes the summary.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Generic, TypeVar

from tqdm.auto import tqdm

from dpr_cache.errors import InputError
from dpr_cache.runtime import distributed
from dpr_cache.runtime.atomic import write_atomic, write_json_atomic
from dpr_cache.runtime.distributed import all_objects
from dpr_cache.runtime.laps import Laps

__all__ = [
    "PartsSpec",
    "PartJob",
    "fingerprint",
    "file_signature",
    "in_parts",
    "part_path",
    "part_done",
    "share_of",
    "over_ranks",
    "open_parts",
    "run_parts",
    "finish_parts",
    "summary_path",
]

T = TypeVar("T")
P = TypeVar("P")  # a part as the caller reads it: its records, and what it made of them ahead
R = TypeVar("R")

STAMP = "inputs.sha256"  # the folder's inputs, as :func:`open_parts` made it
# the stages run_parts times: reading a part (mine and score read a training file), writing it,
# merging the parts
READ, WRITE, JOIN = "read the training file", "write the part", "join the parts into OUT"


@dataclass(frozen=True)
class PartsSpec:
    """What resumable work in parts needs: the file the parts are merged into, the records a
    part, a fingerprint of every input the parts depend on (:func:`fingerprint`), and this
    process's rank of how many."""

    out: Path
    size: int
    inputs: str
    rank: int = 0
    world_size: int = 1

    @property
    def folder(self) -> Path:
        """``OUT.parts/``: the finished parts, until they are merged into ``OUT``."""
        return self.out.with_name(self.out.name + ".parts")


@dataclass(frozen=True)
class PartJob(Generic[P, R]):
    """What a command does with a part: ``work`` on it, on every rank (the result is what rank 0
    writes); ``write`` its records with that result into the part's open file, on rank 0,
    returning the part's counts; ``skip`` a finished part, on rank 0 (a stream read beside the
    parts moved past its records); ``count`` its records (for the progress bar)."""

    work: Callable[[P], R]
    write: Callable[[IO[str], P, R], dict[str, Any]]
    skip: Callable[[P], None] | None = None
    count: Callable[[P], int] = len


def summary_path(out: Path) -> Path:
    """Where the summary of ``OUT`` goes: ``<OUT stem>.summary.json`` beside it."""
    return Path(out).with_suffix(".summary.json")


def fingerprint(*inputs: Any) -> str:
    """A hash of ``inputs`` (JSON values, anything else by its ``str``; keys in any order)."""
    text = json.dumps(list(inputs), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def file_signature(path: Path) -> list[Any]:
    """What identifies an input file in a fingerprint: its absolute path, size and modification
    time."""
    stat = Path(path).stat()
    return [str(Path(path).resolve()), stat.st_size, stat.st_mtime_ns]


def in_parts(records: Iterable[T], size: int, empty: str) -> Iterator[list[T]]:
    """``records`` in lists of ``size`` (the last one shorter), one list in memory at a time;
    InputError ``empty`` when there is no record."""
    part: list[T] = []
    read = 0
    for record in records:
        part.append(record)
        read += 1
        if len(part) == size:
            yield part
            part = []
    if not read:
        raise InputError(empty)
    if part:
        yield part


def part_path(folder: Path, n: int) -> Path:
    """Part ``n``'s records; the part is done once its counts (the ``.json`` beside) follow it."""
    return Path(folder) / f"part-{n:06d}.jsonl"


def part_done(folder: Path, n: int) -> bool:
    """Whether part ``n`` is written whole, as this process sees the disk."""
    return part_path(folder, n).with_suffix(".json").is_file()


def share_of(records: Sequence[T], spec: PartsSpec) -> list[T]:
    """This rank's share of a part's records: every ``world_size``-th from its rank on."""
    return list(records[spec.rank :: spec.world_size])


def over_ranks(
    records: Sequence[T], work: Callable[[list[T]], list[R]], spec: PartsSpec
) -> list[R] | None:
    """``work`` on each record, its share on each rank (:func:`share_of`): every result in the
    records' order on rank 0, None elsewhere. An InputError on any rank stops every rank with
    its one line."""
    if spec.world_size == 1:
        return work(list(records))
    try:
        result: tuple[str, Any] = ("ok", work(share_of(records, spec)))
    except InputError as e:
        result = ("error", str(e))
    gathered = all_objects(result)
    errors = [message for status, message in gathered if status == "error"]
    if errors:
        raise InputError(errors[0])
    if spec.rank != 0:
        return None
    out: list[Any] = [None] * len(records)
    for r, (_, results) in enumerate(gathered):
        out[r :: spec.world_size] = results
    return out


def open_parts(spec: PartsSpec) -> None:
    """Make ``spec.folder`` ready: kept as it is when it was made for these inputs, else
    emptied (rank 0; every rank waits for it)."""
    if spec.rank == 0:
        key = fingerprint(spec.inputs, spec.size)
        stamp = spec.folder / STAMP
        if not (stamp.is_file() and stamp.read_text() == key):
            shutil.rmtree(spec.folder, ignore_errors=True)
            spec.folder.mkdir(parents=True)
            stamp.write_text(key)
    distributed.barrier()


def run_parts(
    spec: PartsSpec,
    parts: Iterable[P],
    job: PartJob[P, R],
    *,
    laps: Laps,
    progress: bool = True,
    desc: str = "",
) -> dict[str, Any] | None:
    """Each part of ``parts`` (every rank reads them all) done by ``job`` unless it is done
    already, then the parts merged into ``spec.out``: on rank 0 the summed counts, None
    elsewhere. The folder is made ready by :func:`open_parts` first."""
    bar = tqdm(unit="q", desc=desc, disable=not (progress and spec.rank == 0), dynamic_ncols=True)
    n_parts = 0
    with bar:
        for part in parts:
            laps.lap(READ)
            if not distributed.rank0_says(part_done(spec.folder, n_parts)):
                result = job.work(part)
                if spec.rank == 0:
                    _write_part(spec, n_parts, part, result, job)
                laps.lap(WRITE)
            elif spec.rank == 0 and job.skip is not None:
                job.skip(part)
            n_parts += 1
            bar.update(job.count(part))
    distributed.barrier()
    if spec.rank != 0:
        return None
    totals = _merge(spec, n_parts)
    laps.lap(JOIN)
    return totals


def finish_parts(spec: PartsSpec, summary: dict[str, Any]) -> None:
    """Write ``summary`` beside ``spec.out`` and remove the merged parts (rank 0)."""
    write_json_atomic(summary_path(spec.out), summary)
    shutil.rmtree(spec.folder, ignore_errors=True)


def _write_part(spec: PartsSpec, n: int, part: P, result: R, job: PartJob[P, R]) -> None:
    """Part ``n``'s file as ``job.write`` makes it, then its counts, which mark it done."""
    counts: dict[str, Any] = {}

    def write(tmp: Path) -> None:
        with open(tmp, "w", encoding="utf-8") as f:
            counts.update(job.write(f, part, result))

    path = part_path(spec.folder, n)
    write_atomic(path, write)
    write_json_atomic(path.with_suffix(".json"), counts)


def _merge(spec: PartsSpec, n_parts: int) -> dict[str, Any]:
    """The parts' records copied into ``spec.out`` in order; their counts summed."""
    totals: Counter = Counter()

    def write(tmp: Path) -> None:
        with open(tmp, "wb") as f:
            for n in range(n_parts):
                part = part_path(spec.folder, n)
                with open(part, "rb") as src:  # copied in blocks, never a whole part in memory
                    shutil.copyfileobj(src, f)
                totals.update(json.loads(part.with_suffix(".json").read_text()))

    write_atomic(spec.out, write)
    return dict(totals)
