"""Work in resumable parts (``runtime/resumable.py``), on records of plain numbers: a cut run
resumes after its last finished part, a changed input refuses the parts, the parts are merged in
their order whatever order they were finished in, and two ranks write the file of one process."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch.distributed as dist

from dpr_cache.errors import InputError
from dpr_cache.runtime.distributed import DistEnv
from dpr_cache.runtime.laps import Laps
from dpr_cache.runtime.resumable import (
    PartJob,
    PartsSpec,
    file_signature,
    fingerprint,
    finish_parts,
    in_parts,
    open_parts,
    over_ranks,
    part_done,
    part_path,
    run_parts,
    share_of,
    summary_path,
)

RECORDS = list(range(8))  # in parts of 3: [0, 1, 2], [3, 4, 5], [6, 7]
WHOLE = [[x, 10 * x] for x in RECORDS]


def _job(calls: list[int], cut_at: int | None = None, skipped: list | None = None) -> PartJob:
    """Each record x written as [x, 10 x]; ``calls``: the first record of each part worked on;
    the part starting at ``cut_at`` is cut (KeyboardInterrupt); ``skipped``: finished parts."""

    def work(part: list[int]) -> list[int]:
        if part[0] == cut_at:
            raise KeyboardInterrupt
        calls.append(part[0])
        return [10 * x for x in part]

    def write(f, part: list[int], result: list[int]) -> dict[str, int]:
        for x, y in zip(part, result, strict=True):
            f.write(json.dumps([x, y]) + "\n")
        return {"records": len(part), "sum": sum(result)}

    return PartJob(work, write, skip=None if skipped is None else skipped.append)


def _run(spec: PartsSpec, job: PartJob) -> dict | None:
    open_parts(spec)
    return run_parts(spec, in_parts(RECORDS, spec.size, "no records"), job, laps=Laps())


def _lines(path: Path) -> list:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_cut_run_resumes_after_its_last_finished_part(tmp_path) -> None:
    spec = PartsSpec(tmp_path / "out.jsonl", 3, fingerprint("inputs"))
    calls: list[int] = []
    with pytest.raises(KeyboardInterrupt):
        _run(spec, _job(calls, cut_at=6))
    assert calls == [0, 3] and part_done(spec.folder, 1) and not part_done(spec.folder, 2)
    assert not spec.out.exists()  # nothing merged before every part is done
    calls.clear()
    skipped: list = []
    totals = _run(spec, _job(calls, skipped=skipped))
    assert calls == [6] and skipped == [[0, 1, 2], [3, 4, 5]]  # only the last part worked on
    assert _lines(spec.out) == WHOLE
    assert totals == {"records": 8, "sum": 280}  # the kept parts' counts summed in
    finish_parts(spec, {**totals, "note": "done"})
    assert json.loads(summary_path(spec.out).read_text())["sum"] == 280
    assert spec.out.with_suffix(".summary.json") == summary_path(spec.out)
    assert not spec.folder.exists()  # the parts go once merged
    # negative control: a run from nothing works on every part
    calls.clear()
    spec.out.unlink()
    _run(spec, _job(calls))
    assert calls == [0, 3, 6] and _lines(spec.out) == WHOLE


@pytest.mark.parametrize("change", ["inputs", "size"])
def test_a_changed_input_refuses_the_finished_parts(tmp_path, change) -> None:
    spec = PartsSpec(tmp_path / "out.jsonl", 3, fingerprint("inputs"))
    calls: list[int] = []
    with pytest.raises(KeyboardInterrupt):
        _run(spec, _job(calls, cut_at=6))
    other = (
        PartsSpec(spec.out, 3, fingerprint("other inputs"))
        if change == "inputs"
        else PartsSpec(spec.out, 4, spec.inputs)
    )
    calls.clear()
    _run(other, _job(calls))
    assert calls == ([0, 3, 6] if change == "inputs" else [0, 4])  # every part worked afresh
    assert _lines(spec.out) == WHOLE


def test_an_input_file_changed_changes_the_fingerprint(tmp_path, monkeypatch) -> None:
    train = tmp_path / "train.jsonl"
    train.write_text("one\n")
    before = fingerprint(file_signature(train), {"a": 1, "b": 2})
    assert fingerprint(file_signature(train), {"b": 2, "a": 1}) == before  # keys in any order
    train.write_text("one, longer\n")
    assert fingerprint(file_signature(train), {"a": 1, "b": 2}) != before
    # the path as given or relative: the same file, the same signature
    monkeypatch.chdir(tmp_path)
    assert file_signature(Path("train.jsonl")) == file_signature(train)


def test_the_parts_merge_in_their_order_not_the_order_finished(tmp_path) -> None:
    spec = PartsSpec(tmp_path / "out.jsonl", 3, fingerprint("inputs"))
    with pytest.raises(KeyboardInterrupt):
        _run(spec, _job([], cut_at=6))
    time.sleep(0.01)
    for path in (part_path(spec.folder, 0), part_path(spec.folder, 0).with_suffix(".json")):
        path.unlink()  # part 0 lost: done again after part 1
    calls: list[int] = []
    _run(spec, _job(calls))
    assert calls == [0, 6]
    times = [part_path(spec.folder, n).stat().st_mtime_ns for n in range(3)]
    assert times[1] < times[0]  # control: finished 1, 0, 2
    assert _lines(spec.out) == WHOLE


def test_records_in_parts_and_none_is_one_line() -> None:
    assert list(in_parts(iter(RECORDS), 3, "x")) == [[0, 1, 2], [3, 4, 5], [6, 7]]
    assert list(in_parts(RECORDS, 8, "x")) == [RECORDS]
    with pytest.raises(InputError, match=r"^t.jsonl: no questions$"):
        list(in_parts([], 3, "t.jsonl: no questions"))


def test_one_process_works_on_every_record() -> None:
    spec = PartsSpec(Path("o.jsonl"), 3, "")
    assert share_of(RECORDS, spec) == RECORDS
    assert over_ranks(RECORDS, lambda share: [-x for x in share], spec) == [-x for x in RECORDS]
    ranks = [share_of(RECORDS, PartsSpec(Path("o"), 3, "", r, 3)) for r in range(3)]
    assert ranks == [[0, 3, 6], [1, 4, 7], [2, 5]]


def _two_rank_worker(rank: int, world: int, port: int, root: str) -> None:
    """One rank of :func:`test_two_ranks_write_the_file_of_one_process`, for each case (a folder
    under ``root`` and the record that is bad input in it)."""
    from dpr_cache.runtime import distributed
    from tests.support.ranks import join

    env = join(rank, world, port)
    try:
        for name, bad in CASES.items():
            _two_rank_case(env, Path(root) / name, bad)
    finally:
        distributed.teardown()


def _two_rank_case(env: DistEnv, folder: Path, bad: int | None) -> None:
    """Each record worked on by the rank whose share holds it (its rank written beside it);
    record ``bad`` is bad input. What the run returned, or its error, goes to ``rank<r>.json``."""
    folder.mkdir(exist_ok=True)
    spec = PartsSpec(folder / "out.jsonl", 3, "inputs", env.rank, env.world_size)

    def work(share: list[int]) -> list[list[int]]:
        if bad in share:
            raise InputError(f"record {bad}: bad on rank {env.rank}")
        return [[x, 10 * x, env.rank] for x in share]

    def write(f, part: list[int], result: list[list[int]]) -> dict[str, int]:
        for row in result:
            f.write(json.dumps(row) + "\n")
        return {"records": len(part)}

    job = PartJob(lambda part: over_ranks(part, work, spec), write)
    try:
        result = {"totals": _run(spec, job)}
    except InputError as e:
        result = {"error": str(e)}
    (folder / f"rank{env.rank}.json").write_text(json.dumps(result))


CASES = {"good": None, "bad": 4}  # bad: record 4, part [3, 4, 5]'s second, on rank 1 only


@pytest.mark.slow
@pytest.mark.skipif(
    not (dist.is_available() and dist.is_gloo_available()), reason="no torch.distributed gloo"
)
def test_two_ranks_write_the_file_of_one_process(tmp_path) -> None:
    import torch.multiprocessing as mp

    from dpr_cache.runtime.processes import free_port

    mp.start_processes(
        _two_rank_worker, args=(2, free_port(), str(tmp_path)), nprocs=2, start_method="spawn"
    )
    ranks = [json.loads((tmp_path / "good" / f"rank{r}.json").read_text()) for r in range(2)]
    assert ranks == [{"totals": {"records": 8}}, {"totals": None}]  # rank 0 merges
    rows = _lines(tmp_path / "good" / "out.jsonl")
    assert [row[:2] for row in rows] == WHOLE  # one process's records, in order
    # each record worked on by the rank whose share holds it: the split is real
    assert [row[2] for row in rows] == [0, 1, 0, 0, 1, 0, 0, 1]
    # bad input on rank 1 alone stops both ranks with its one line, and nothing is merged
    ranks = [json.loads((tmp_path / "bad" / f"rank{r}.json").read_text()) for r in range(2)]
    assert ranks == [{"error": "record 4: bad on rank 1"}] * 2
    assert not (tmp_path / "bad" / "out.jsonl").exists()
