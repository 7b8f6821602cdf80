"""The dev questions in two halves by article (articles alternate, in file order), so that linear
fusion's weight is picked on one half and scored on the other, then the other way round: every
dev question is scored with a weight tuned without it. Without articles (the toy's questions),
the rows alternate.

    python -m studies.squad_hard_negatives.split_dev --dev data/squad/dev.jsonl \
        --qa data/squad/dev.qa.tsv --out runs/squad_hard_negatives/dev-split

Writes ``dev-a.qa.tsv``, ``dev-b.qa.tsv`` and ``split.json`` (each half's rows of the full file).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from dpr_cache.runtime.atomic import write_json_atomic, write_text_atomic


def halves(dev: Path | None, n: int) -> dict[str, list[int]]:
    """Rows of half a and half b: by article (a passage title) when ``dev`` is given."""
    if dev is None:
        return {"a": list(range(0, n, 2)), "b": list(range(1, n, 2))}
    titles = [json.loads(line)["positive_ctxs"][0]["title"] for line in dev.open()]
    if len(titles) != n:
        raise SystemExit(f"error: {dev}: {len(titles)} questions, the qas file has {n}")
    order = list(dict.fromkeys(titles))  # articles in file order
    side = {title: "ab"[i % 2] for i, title in enumerate(order)}
    return {h: [i for i, t in enumerate(titles) if side[t] == h] for h in "ab"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dev", default="", help="DPR JSONL of the dev questions (articles).")
    parser.add_argument("--qa", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    lines = args.qa.read_text(encoding="utf-8").splitlines()
    split = halves(Path(args.dev) if args.dev else None, len(lines))
    for half, rows in split.items():
        write_text_atomic(args.out / f"dev-{half}.qa.tsv", "".join(lines[i] + "\n" for i in rows))
    write_json_atomic(args.out / "split.json", split)
    print(f"dev halves: {len(split['a'])} and {len(split['b'])} questions")


if __name__ == "__main__":
    main()
