"""A long study's state saved in the repository, so that the study outlives the machine it ran on.

The teachers' studies take many machine hours, so they span sessions, and a session may start on
a fresh clone where ``runs/`` (not in git) is gone. Once a study's set-up is done, and after each
student, its ``run.sh`` calls ``save``, which copies into the study's saved folder (committed)
what later steps and the page need, in a form small enough to commit. A study's
:class:`Layout` names its set-up steps' done markers, the training files its students read and
its students' arms (``studies/squad_teachers/saved.py``, ``studies/squad_crossfit/saved.py``):

- the set-up steps' small files: summaries, the teacher's weight and temperature, the splits;
- the training files the students read (``Layout.packed``, in OUT itself) as
  ``.ids.jsonl.gz``: each ctx's title and text replaced by 0 where the passages file holds the
  same, put back by ``restore`` byte for byte (checked when packed: a line that would not come
  back the same is kept whole);
- each finished run (trained, indexed, evaluated and, for a student, fused with BM25): its
  run.json, config, training log, metrics and timings, with each ``retrieval.json`` (2,777
  questions x 100 passages with their texts) replaced by each question's rank of its first
  passage with the answer (``retrieval.ranks.json``), which is all the page's paired intervals
  read.

Models, indexes, checkpoints, caches, plots, eval's TREC and pyserini exports, parts of
unfinished commands and runs not yet finished stay out: a run cut by a session's end goes on
from its checkpoint where its folder survived, and starts again where it did not.

All or nothing: the set-up is saved only once every one of its steps is done (a half set-up,
restored, would need round 1's model and the candidates files, which are not saved) and
restored only when every one of its markers was saved; each run's folder is saved whole (written
aside, then renamed), after the set-up. ``restore`` copies the saved state into OUT where OUT
lacks it, so ``run.sh`` skips every saved step. A saved file is never rewritten: delete it to
save afresh.

    python -m studies.<study>.saved save --out runs/<study> --saved DIR
    python -m studies.<study>.saved restore --saved DIR --out runs/<study> \\
        --passages data/squad/passages.tsv
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import shutil
from dataclasses import dataclass
from pathlib import Path

from dpr_cache.data.passages import read_passages
from dpr_cache.runtime.atomic import write_atomic, write_dir_atomic, write_text_atomic
from studies.squad_hard_negatives.collect import RANKS_NAME, first_ranks


@dataclass(frozen=True)
class Layout:
    """A study's saved state: its set-up steps' done markers (saved and restored all together
    or not at all), the training files its students read (packed) and its students' arm
    folders (a student's run is finished once its ``run_steps`` are done: each a folder of the
    run with its metrics.json; by default its three fusions with BM25). ``arm_steps`` names an
    arm's own steps where they differ."""

    setup: tuple[str, ...]
    packed: tuple[str, ...]
    arms: tuple[str, ...]
    run_steps: tuple[str, ...] = ("eval-rrf", "eval-linear-a", "eval-linear-b")
    arm_steps: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def steps_of(self, arm: str) -> tuple[str, ...]:
        """The folders a finished run of ``arm`` holds (with their metrics.json)."""
        return dict(self.arm_steps).get(arm, self.run_steps)


PACKED_SUFFIX = ".ids.jsonl.gz"
LEFT_OUT_DIRS = ("model", "checkpoints", "index", "cross-encoder", "tensorboard", ".cache")
LEFT_OUT_NAMES = ("run.trec", "retrieval.pyserini.json")  # eval's exports of retrieval.json
RUN_MARKS = ("run.json", "model", "checkpoints", "train_log.jsonl")  # what makes a run folder
MAX_BYTES = 1 << 20  # a plain file larger than this is left out (and named); a marker never
FROM_PASSAGES = 0  # a packed ctx's title or text: the passages file's, put back by restore

Passages = dict[str, tuple[str, str]]  # passage id -> (title, text)


def load_passages(path: Path) -> Passages:
    """The study's corpus (2,067 SQuAD paragraphs, 1.6 MB), held in memory."""
    return {pid: (title, text) for pid, text, title in read_passages(path)}


def _dumps(record: dict) -> str:
    return json.dumps(record, ensure_ascii=False)  # as mine and score write their files


def pack_line(line: str, passages: Passages) -> str:
    """``line`` with each ctx's title and text that match the passages file replaced by 0;
    ``line`` itself when the packed line would not unpack to it."""
    if not line.strip():
        return line
    record = json.loads(line)
    for key in ("positive_ctxs", "hard_negative_ctxs"):
        for ctx in record.get(key) or []:
            known = passages.get(str(ctx.get("passage_id")))
            if known is not None and (ctx.get("title"), ctx.get("text")) == known:
                ctx["title"] = ctx["text"] = FROM_PASSAGES
    packed = _dumps(record) + "\n"
    return packed if unpack_line(packed, passages) == line else line


def unpack_line(line: str, passages: Passages) -> str:
    """A packed line with its ctxs' titles and texts put back from the passages file (a line
    kept whole, as it is)."""
    if not line.strip():
        return line
    record = json.loads(line)
    put_back = 0
    for key in ("positive_ctxs", "hard_negative_ctxs"):
        for ctx in record.get(key) or []:
            if ctx.get("text") == FROM_PASSAGES and type(ctx.get("text")) is int:
                ctx["title"], ctx["text"] = passages[str(ctx["passage_id"])]
                put_back += 1
    return _dumps(record) + "\n" if put_back else line


def pack(train: Path, out: Path, passages: Passages) -> int:
    """Write ``train`` packed into ``out`` (gzip, no timestamp: the same bytes each time);
    return how many lines are kept whole."""
    whole = 0

    def write(tmp: Path) -> None:
        nonlocal whole
        with (
            train.open(encoding="utf-8", newline="") as f,
            tmp.open("wb") as raw,
            gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as g,
        ):
            for line in f:
                packed = pack_line(line, passages)
                whole += packed is line and bool(line.strip())
                g.write(packed.encode("utf-8"))

    write_atomic(out, write)
    return whole


def unpack(packed: Path, out: Path, passages: Passages) -> None:
    def write(tmp: Path) -> None:
        with gzip.open(packed, "rt", encoding="utf-8", newline="") as f, tmp.open("wb") as g:
            for n, line in enumerate(f, 1):
                try:
                    g.write(unpack_line(line, passages).encode("utf-8"))
                except KeyError as e:
                    raise SystemExit(
                        f"error: {packed} line {n}: passage {e} is not in the passages file"
                    ) from None

    write_atomic(out, write)


def _is_run(folder: Path) -> bool:
    return any((folder / mark).exists() for mark in RUN_MARKS)


def finished(layout: Layout, run: Path, suffix: str) -> bool:
    """A run folder is saved once it has its run.json and, for a student (an arm of the page),
    its steps (:meth:`Layout.steps_of`)."""
    if not (run / "run.json").is_file():
        return False
    arm = run.parent.name.removesuffix(suffix) if suffix else run.parent.name
    steps = layout.steps_of(arm)
    return arm not in layout.arms or all((run / h / "metrics.json").is_file() for h in steps)


def setup_done(layout: Layout, folder: Path, packed: bool = False) -> bool:
    """Every set-up step done in ``folder`` (OUT, or the saved folder: ``packed``)."""
    names = [n.removesuffix(".jsonl") + PACKED_SUFFIX if packed else n for n in layout.packed]
    return all((folder / name).is_file() for name in (*layout.setup, *names))


def _left_out(rel: Path) -> bool:
    name = rel.name
    return (
        any(part in LEFT_OUT_DIRS or part.endswith(".parts") for part in rel.parts[:-1])
        or name in LEFT_OUT_NAMES
        or ".tmp" in name
        or name.endswith((".lock", ".log", ".png"))
    )


def _how(layout: Layout, path: Path, rel: Path) -> tuple[Path, str] | None:
    """Where a file of OUT goes in the saved folder and how (copy, ranks, pack or too-large);
    None: left out."""
    if not path.is_file() or _left_out(rel):
        return None
    if path.name == "retrieval.json":
        return rel.with_name(RANKS_NAME), "ranks"
    if len(rel.parts) == 1 and path.name in layout.packed:
        return rel.with_name(path.name.removesuffix(".jsonl") + PACKED_SUFFIX), "pack"
    if path.suffix == ".jsonl" and path.name != "train_log.jsonl":
        return None  # the other training files: mined, candidates, samples
    if path.stat().st_size > MAX_BYTES and rel.as_posix() not in layout.setup:
        return rel, "too-large"
    return rel, "copy"


def plan(layout: Layout, out: Path, suffix: str) -> tuple[list[tuple[Path, Path, str]], list[Path]]:
    """The set-up's files (each with its saved path and how) and the finished runs' folders,
    relative to ``out``. A run folder's files go with it; an unfinished run's stay out."""
    files, runs = [], []
    for path in sorted(out.rglob("*")):
        rel = path.relative_to(out)
        if len(rel.parts) == 2 and path.is_dir() and _is_run(path):
            if finished(layout, path, suffix):
                runs.append(rel)
            continue
        if len(rel.parts) > 2 and _is_run(out / rel.parts[0] / rel.parts[1]):
            continue
        if (how := _how(layout, path, rel)) is not None:
            files.append((path, *how))
    return files, runs


def _save_file(path: Path, target: Path, how: str, passages: Passages) -> str:
    if how == "ranks":
        ranks = [None if math.isinf(r) else int(r) for r in first_ranks(path)]
        write_text_atomic(target, json.dumps(ranks, separators=(",", ":")) + "\n")
    elif how == "pack":
        return f"packed ({pack(path, target, passages)} lines kept whole)"
    else:
        write_atomic(target, lambda tmp: shutil.copyfile(path, tmp))
    return how


def _save_run(layout: Layout, run: Path, into: Path) -> None:
    for path in sorted(run.rglob("*")):
        how = _how(layout, path, path.relative_to(run))
        if how is not None and how[1] != "too-large":
            _save_file(path, into / how[0], how[1], {})


def save(
    layout: Layout, out: Path, saved: Path, suffix: str = "", passages_file: Path | None = None
) -> list:
    """Save what ``out`` holds that ``saved`` lacks, once the whole set-up is done (before, a
    restored half set-up would need round 1's model and the unsaved candidates files): the
    set-up's files one by one, then each finished run's folder whole. Return (path, how) for
    each."""
    if not setup_done(layout, out):
        return []
    files, runs = plan(layout, out, suffix)
    done = []
    passages: Passages = {}
    for path, rel, how in files:
        target = saved / rel
        if target.exists():
            continue
        if how == "too-large":
            done.append((rel, f"left out: {path.stat().st_size:,} bytes"))
            continue
        if how == "pack" and not passages:
            if passages_file is None:
                raise SystemExit(f"error: {path}: --passages is needed to pack it")
            passages = load_passages(passages_file)
        done.append((rel, _save_file(path, target, how, passages)))
    for rel in runs:  # after the set-up: a saved run implies a saved set-up
        if not (saved / rel).exists():
            write_dir_atomic(saved / rel, lambda tmp, rel=rel: _save_run(layout, out / rel, tmp))
            done.append((rel, "run"))
    return done


def restore(layout: Layout, saved: Path, out: Path, passages_file: Path) -> list:
    """Copy the saved state into ``out`` where ``out`` lacks it: nothing unless the saved
    set-up is whole; the packed training files first (their summaries mark their steps done)."""
    if not setup_done(layout, saved, packed=True):
        return []
    done = []
    files = sorted(
        p
        for p in saved.rglob("*")
        if p.is_file() and not any(part.startswith((".tmp", ".old-")) for part in p.parts)
    )
    packed = [p for p in files if p.name.endswith(PACKED_SUFFIX)]
    passages = load_passages(passages_file)
    for path in packed + [p for p in files if p not in packed]:
        rel = path.relative_to(saved)
        if path in packed:
            rel = rel.with_name(rel.name.removesuffix(PACKED_SUFFIX) + ".jsonl")
        target = out / rel
        if target.exists():
            continue
        if path in packed:
            unpack(path, target, passages)
        else:
            write_atomic(target, lambda tmp, path=path: shutil.copyfile(path, tmp))
        done.append(rel)
    return done


def main(layout: Layout) -> None:
    """The ``save`` and ``restore`` commands of a study whose state is laid out as ``layout``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("save", help="Save OUT's finished steps and runs into SAVED.")
    s.add_argument("--out", type=Path, required=True)
    s.add_argument("--saved", type=Path, required=True)
    s.add_argument("--suffix", default="", help="The arms' folder suffix (-dry in a dry run).")
    s.add_argument("--passages", type=Path, help="The corpus, to pack the training files.")
    r = sub.add_parser("restore", help="Copy SAVED into OUT where OUT lacks it.")
    r.add_argument("--saved", type=Path, required=True)
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--passages", type=Path, required=True)
    args = parser.parse_args()
    if args.command == "save":
        for rel, how in save(layout, args.out, args.saved, args.suffix, args.passages):
            print(f"saved {rel}: {how}")
    else:
        restored = restore(layout, args.saved, args.out, args.passages)
        print(f"restored {len(restored)} files from {args.saved} into {args.out}")
