"""docs/reliability.md from the injections the fault tests recorded::

DPR_CACHE_FAULT_REPORT=/tmp/faults.jsonl .venv/bin/python -m pytest -q tests/faults
.venv/bin/python -m tests.faults.report /tmp/faults.jsonl --out docs/reliability.md
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

from dpr_cache.runtime.atomic import write_text_atomic

TESTS = {
    "kill -9": "tests/faults/test_kill.py",
    "disk full": "tests/faults/test_disk_full.py",
    "file size limit": "tests/faults/test_disk_full.py",
    "a rank killed": "tests/faults/test_dead_rank.py",
    "damaged checkpoint": "tests/faults/test_damaged_checkpoint.py",
    "two commands, one folder": "tests/faults/test_locks.py",
    "loss not finite": "tests/faults/test_nonfinite.py",
    "every step skipped": "tests/faults/test_nonfinite.py",
}
"""Each fault's rows in this order, and the test file of a record that names none."""


SETTINGS = {
    "kill -9": "the kill points are drawn from seed 2026 (settings of the test), not measured",
    "file size limit": "the limit is the test's setting (half a shard), not measured",
    "timeout 15 s": "timeout 15 s is the test's setting",
}
"""Why a row's figures name no data file: a fault (or a phrase of its row) -> the reason."""


def _why_no_source(fault: str, where: str) -> str:
    why = SETTINGS.get(fault) or next((w for k, w in SETTINGS.items() if k in where), None)
    return f"<!-- figures: {why} -->" if why else ""


def table(records: list[dict]) -> list[str]:
    groups: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for r in records:
        groups[(r["fault"], r["command"])].append(r)
    lines = [
        "| fault | command | injections | survived | lost bytes | where it struck | reproduce |",
        "|---|---|--:|--:|--:|---|---|",
    ]
    faults = list(TESTS)  # the table in this order, whichever test process ran first
    for (fault, command), rows in sorted(groups.items(), key=lambda g: faults.index(g[0][0])):
        where = "; ".join(dict.fromkeys(r["where"] for r in rows))
        tests = " ".join(dict.fromkeys(r.get("test") or TESTS[fault] for r in rows))
        lines.append(
            f"| {fault} | {command} | {len(rows)} | {sum(r['survived'] for r in rows)} | "
            f"{sum(r['lost_bytes'] for r in rows)} | {where}{_why_no_source(fault, where)} | "
            f"`pytest {tests}` |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("records", type=Path)
    parser.add_argument("--out", type=Path, default=Path("docs/reliability.md"))
    args = parser.parse_args()
    records = [json.loads(line) for line in args.records.read_text().splitlines() if line]
    head = args.out.read_text().split("<!-- faults:begin -->")[0] if args.out.is_file() else ""
    tail = args.out.read_text().rsplit("<!-- faults:end -->", 1)[1] if args.out.is_file() else "\n"
    body = "<!-- faults:begin -->\n" + "\n".join(table(records)) + "\n<!-- faults:end -->"
    write_text_atomic(args.out, head + body + tail)
    print(f"{len(records)} injections written to {args.out}")


if __name__ == "__main__":
    main()
