"""Every benchmark page written again from the figures saved beside it, nothing measured::

    python -m benchmarks.pages                 # docs/bench: bench.md, realtext.md, scale.md, ...
    python -m benchmarks.pages --out /tmp/p    # the same pages elsewhere (the figures stay put)

Each page is what its benchmark writes at the end of a run, so a change to a report is seen on
every page without hours of measuring.
"""

from __future__ import annotations

import argparse
import importlib
import json
from pathlib import Path

# Saved figures (under the bench folder) -> the module whose ``render(result, folder, source)``
# writes their page.
PAGES = {
    "bench.json": "synthetic",
    "realtext.json": "realtext",
    "same_session/realtext.json": "realtext",
    "recheck/realtext.json": "realtext",
    "scale.json": "scale",
    "mine.json": "mine",
    "gpu.json": "gpu.report",
    "chunk_cost.json": "chunk_cost",
    "sharding.json": "sharding",
    "losses.json": "losses",
    "refusals.json": "refusals",
    "sources.json": "sources",
    "multivector_scale.json": "multivector_scale",
}


def write_pages(source: Path, out: Path) -> list[Path]:
    """The page (and plots) of every saved result under ``source``, written into ``out``."""
    written = []
    for name, module in ((n, m) for n, m in PAGES.items() if (source / n).is_file()):
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        render = importlib.import_module(f"benchmarks.{module}").render
        result = json.loads((source / name).read_text())
        written.append(render(result, (out / name).parent, (source / name).parent))
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
