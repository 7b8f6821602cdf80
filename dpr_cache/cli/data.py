"""`dpr-cache data ...`: build or fetch data in DPR's formats."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from dpr_cache.cli.app import Command, data_app, guarded


@data_app.command("squad", cls=Command)
@guarded
def data_squad(
    source: Annotated[Path, typer.Option(help="SQuAD v1.1 dev JSON (.gz ok).")] = Path(
        "data/squad/dev-v1.1.json.gz"
    ),
    out: Annotated[Path, typer.Option(help="Output folder.")] = Path("data/squad"),
) -> None:
    """DPR-format files (passages.tsv, train/dev.jsonl, dev.qa.tsv) from SQuAD v1.1 dev.

    Example: dpr-cache data squad (writes data/squad/passages.tsv, train.jsonl, dev.jsonl and
    dev.qa.tsv from the shipped data/squad/dev-v1.1.json.gz; make clean removes them)
    """
    from dpr_cache.data.squad import build_squad

    counts = build_squad(source, out)
    for key, value in counts.items():
        print(f"{key}: {value}")
    print(f"written to {out}")


@data_app.command("nq", cls=Command)
@guarded
def data_nq(
    out: Annotated[Path, typer.Option(help="Output folder.")] = Path("data/nq"),
    files: Annotated[
        list[str] | None,
        typer.Option(
            "--file", metavar="NAME", help="Only this file, e.g. nq-dev.qa.csv (repeatable)."
        ),
    ] = None,
    base_url: Annotated[str | None, typer.Option(help="Mirror of DPR's files.")] = None,
    gunzip: Annotated[bool, typer.Option(help="Decompress .gz files after download.")] = False,
) -> None:
    """Download DPR's NQ files (train/dev JSON, nq-test.qa.csv, psgs_w100.tsv); resumable.

    Example: dpr-cache data nq --gunzip (about 20 GB into data/nq, the folder configs/nq_*.yaml
    read); a cut download goes on where it stopped when run again.
    """
    from dpr_cache.data.download import download_nq

    kwargs = {"base_url": base_url} if base_url else {}
    for path in download_nq(out, files=files, gunzip=gunzip, **kwargs):
        print(path)


@data_app.command("beir", cls=Command)
@guarded
def data_beir(
    folder: Annotated[
        Path,
        typer.Argument(
            metavar="FOLDER", help="A BEIR folder (corpus.jsonl, queries.jsonl, qrels/)."
        ),
    ],
    out: Annotated[Path, typer.Option(help="Output folder.")],
    split: Annotated[str, typer.Option(help="The qrels split to judge with.")] = "test",
) -> None:
    """A BEIR set in the project's formats: passages.tsv, questions.tsv (+ .ids.txt), qrels.trec.

    Example: dpr-cache data beir scifact --out data/scifact, then eval with
    --set data.passages=data/scifact/passages.tsv --set data.dev_qa=data/scifact/questions.tsv
    --set data.qrels=data/scifact/qrels.trec
    """
    from dpr_cache.data.beir import read_beir

    for key, value in read_beir(folder, out, split).items():
        print(f"{key}: {value}")
    print(f"written to {out}")


@data_app.command("folds", cls=Command)
@guarded
def data_folds(
    train: Annotated[Path, typer.Option(help="A DPR training file (JSON or JSON Lines).")],
    out: Annotated[Path, typer.Option(help="Output folder: fold-K/ for each fold, folds.json.")],
    folds: Annotated[int, typer.Option(min=2, help="How many folds.")] = 2,
    seed: Annotated[int, typer.Option(help="Orders articles of equal size.")] = 0,
) -> None:
    """Cross-fitting folds of a training file, split by article (the positive's title).

    Writes OUT/fold-K/train.jsonl (the other folds: what fold K's model trains on),
    OUT/fold-K/held.jsonl (fold K: what that model mines and scores, never having seen it),
    OUT/fold-K/held.qa.tsv (fold K's questions: where a hybrid teacher's weight is tuned) and
    OUT/folds.json. Example: dpr-cache data folds --train data/toy/train.jsonl --out
    runs/toy/folds (the cross-fitted teacher's recipe: docs/teachers.md)
    """
    from dpr_cache.data.folds import split_folds

    summary = split_folds(train, out, folds, seed)
    pairs = zip(summary["questions"], summary["articles"], strict=True)
    for k, (n, titles) in enumerate(pairs, start=1):
        print(f"fold-{k}: {n} questions, {len(titles)} articles")
    print(f"written to {out}")
