"""Every benchmark page written again from the figures saved beside it, nothing measured::

    python -m benchmarks.pages                 # docs/bench: bench.md, realtext.md, scale.md, ...
    python -m benchmarks.pages --out /tmp/p    # the same pages elsewhere (the figures stay put)

Each page is what its benchmark writes at the end of a run (``python -m benchmarks.synthetic``,
``benchmarks.realtext``, ``benchmarks.scale``, ``benchmarks.mine``, ``benchmarks.gpu``,
``benchmarks.chunk_cost``, ``benchmarks.sharding``), so a change to a report is seen on every
page without hours of measuring.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks import (
    chunk_cost_report,
    gpu_report,
    mine_report,
    realtext_report,
    scale_report,
    sharding_report,
    synthetic_report,
)
from dpr_cache.runtime.atomic import write_text_atomic

__all__ = ["PAGES", "write_pages"]

PAGES = {
    "bench.json": "synthetic",
    "realtext.json": "realtext",
    "same_session/realtext.json": "realtext",
    "scale.json": "scale",
    "mine.json": "mine",
    "gpu.json": "gpu",
    "chunk_cost.json": "chunk_cost",
    "sharding.json": "sharding",
}
"""Saved figures (relative to the bench folder) -> the benchmark whose report they feed."""


def write_pages(source: Path, out: Path) -> list[Path]:
    """Write the page (and plots) of every saved result under ``source`` into ``out``."""
    written = []
    for name, kind in PAGES.items():
        path = source / name
        if not path.is_file():
            continue
        result = json.loads(path.read_text())
        folder = (out / name).parent
        folder.mkdir(parents=True, exist_ok=True)
        if kind == "synthetic":
            write_text_atomic(folder / "bench.md", synthetic_report.markdown(result))
            synthetic_report.plot(result, folder)
            written.append(folder / "bench.md")
        elif kind == "realtext":
            write_text_atomic(folder / "realtext.md", realtext_report.markdown(result))
            realtext_report.plot(result, folder / "realtext.png")
            written.append(folder / "realtext.md")
        elif kind == "gpu":
            gpu_report.write_page(result, folder)
            written.append(folder / "gpu.md")
        elif kind == "chunk_cost":
            written.append(chunk_cost_report.write_page(result, folder))
        elif kind == "sharding":
            write_text_atomic(folder / sharding_report.PAGE, sharding_report.markdown(result))
            written.append(folder / sharding_report.PAGE)
        elif kind == "mine":
            written.append(mine_report.write_report(result, folder, path.parent))
        else:
            notes = path.parent / "scale_notes.md"
            written.append(scale_report.write_report(result, folder, notes))
    return written


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, default=Path("docs/bench"))
    parser.add_argument("--out", type=Path, default=None, help="Default: --source.")
    args = parser.parse_args(argv)
    for path in write_pages(args.source, args.out or args.source):
        print(path)


if __name__ == "__main__":
    main()
