"""Every measured figure written by hand in ``README.md``, ``docs/*.md`` and
:data:`BENCH_NOTES` names its data, in a marker a page does not show::

    1.89x<!-- from docs/bench/recheck/realtext.json: d["ratios"]["st-cmnrl"] -->
    38.5 / 40.0 / 41.4<!-- from F: a; b; c -->    (one marker for the last figures, in order)

Each expression is Python over ``d``, the file's JSON (a ``.jsonl`` file's records), with
:func:`row`, ``load(PATH)`` and ``mine_hours(mine, scale)``; it agrees when its value, rounded
as printed, gives the figure. A measured-looking figure with no marker is unsourced, unless it
is a bound (``<=``, ``under`` ...) or its line says why: ``<!-- figures: REASON -->``.

    python -m benchmarks.figures   # lists every figure that disagrees or has no source
"""

from __future__ import annotations

import json
import math
import re
import statistics
from dataclasses import dataclass
from pathlib import Path

from benchmarks import mine

REPO = Path(__file__).resolve().parents[1]
NUMBER = r"-?\d[\d,]*(?:\.\d+)?(?:e-?\d+)?"
MARKER = re.compile(r"<!-- from (?P<file>[^:\s]+): (?P<exprs>.*?) -->")
EXEMPT = re.compile(r"<!-- figures: [^>]+ -->")
UNITS = (
    r"x\b|\s?%|\s(?:ms|ns|µs|s|min|minutes|h|hours|seconds|GB|MB|KB|GiB|MiB|TB|bytes)\b"
    r"|\s(?:pairs|passages|questions|tokens|vectors|steps)/s\b|\stop-\d+"
)
MEASURED = re.compile(rf"(?<![\w.=/-])({NUMBER})(?={UNITS})")
BOUND = re.compile(
    r"(?:<=|>=|≤|≥|<|>|\bunder|\bbelow|\babove|\bat most|\bat least|\bup to|\bwithin|\bgoal:?"
    r"|\bbound|\blimit|\bbudget)\s*\**\s*$",
    re.IGNORECASE,
)


BENCH_NOTES = [REPO / "docs" / "bench" / "README.md", REPO / "docs" / "bench" / "scale_notes.md"]


def row(records: list[dict], **fields) -> dict:
    """The first record whose fields have these values."""
    for record in records:
        if all(record.get(k) == v for k, v in fields.items()):
            return record
    raise LookupError(f"no record with {fields}")


@dataclass(frozen=True)
class Figure:
    doc: str
    line: int
    text: str  # the figure as printed
    problem: str | None  # None: it agrees with its data


def _tolerance(text: str) -> float:
    """Half the last printed digit's place: the rounding the figure may carry."""
    mantissa, _, exponent = text.replace(",", "").lower().partition("e")
    decimals = len(mantissa.partition(".")[2])
    return 0.5 * 10.0 ** (int(exponent or 0) - decimals) * (1 + 1e-9)


def _load(path: str, cache: dict) -> object:
    if path not in cache:
        text = (REPO / path).read_text()
        records = filter(str.strip, text.splitlines()) if path.endswith(".jsonl") else None
        cache[path] = json.loads(text) if records is None else [json.loads(x) for x in records]
    return cache[path]


def _evaluate(expr: str, data: object, cache: dict) -> float:
    names = {"d": data, "row": row, "median": statistics.median, "mine_hours": mine.projected_hours}
    names |= {"load": lambda path: _load(path, cache), "min": min, "max": max, "sum": sum}
    names |= {"len": len, "abs": abs, "round": round, "__builtins__": {}}
    # globals, so that a comprehension in the expression sees them too
    return float(eval(expr, names))  # noqa: S307 - the repo's own docs


def _prose(line: str) -> str:
    """The line with inline code, link targets and markers blanked (same length)."""
    blank = lambda m: " " * len(m.group(0))  # noqa: E731
    line = re.sub(r"`[^`]*`", blank, line)
    line = re.sub(r"\]\([^)]*\)", blank, line)
    return re.sub(r"<!--.*?-->", blank, line)


def _check_marker(doc, n, line, marker, start, cache) -> tuple[list[Figure], set[int]]:
    """The marker's figures checked, and where on the line they start."""
    exprs = [e.strip() for e in marker.group("exprs").split(";")]
    prose = _prose(line)
    numbers = list(re.finditer(rf"(?<![\w.])({NUMBER})", prose[start : marker.start()]))
    if len(numbers) < len(exprs):
        problem = f"{len(exprs)} sources, {len(numbers)} figures"
        return [Figure(doc, n, marker.group(0), problem)], set()
    out, covered = [], set()
    for number, expr in zip(numbers[len(numbers) - len(exprs) :], exprs, strict=True):
        text = number.group(0)
        covered.add(start + number.start())
        try:
            value = _evaluate(expr, _load(marker.group("file"), cache), cache)
        except Exception as exc:  # a source that does not resolve is the finding
            out.append(Figure(doc, n, text, f"{expr}: {type(exc).__name__}: {exc}"))
            continue
        ok = math.isclose(float(text.replace(",", "")), value, abs_tol=_tolerance(text))
        out.append(Figure(doc, n, text, None if ok else f"the data gives {value:.6g}"))
    return out, covered


def _line_figures(doc: str, n: int, line: str, cache: dict) -> list[Figure]:
    figures, start, covered = [], 0, set()
    for marker in MARKER.finditer(line):
        found, at = _check_marker(doc, n, line, marker, start, cache)
        figures += found
        covered |= at
        start = marker.end()
    if EXEMPT.search(line):
        return figures
    prose = _prose(line)
    for m in MEASURED.finditer(prose):
        if m.start() in covered or BOUND.search(prose[max(0, m.start() - 16) : m.start()]):
            continue
        figures.append(Figure(doc, n, m.group(0), "no source"))
    return figures


def check(docs: list[Path] | None = None) -> list[Figure]:
    """Every marked and every measured-looking figure of the docs, with what is wrong."""
    docs = docs or [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *BENCH_NOTES]
    cache: dict = {}
    figures: list[Figure] = []
    for path in docs:
        fenced = False
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if line.lstrip().startswith("```"):
                fenced = not fenced
                continue
            if not fenced:
                name = str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)
                figures += _line_figures(name, n, line, cache)
    return figures


def main() -> None:
    figures = check()
    wrong = [f for f in figures if f.problem]
    for f in wrong:
        print(f"{f.doc}:{f.line}: {f.text}: {f.problem}")
    print(f"{len(figures) - len(wrong)} figures agree with their data, {len(wrong)} do not")
    raise SystemExit(1 if wrong else 0)


if __name__ == "__main__":
    main()
