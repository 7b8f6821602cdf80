"""How fast each command refuses (a lock held, another run's checkpoints, a finished run resumed,
an input missing), each a whole process timed against ``dpr-cache --help`` over interleaved
rounds; the goal: every refusal's median within 1.5x ``--help``'s::

    python -m benchmarks.refusals --out docs/bench        # a minute or two
"""

from __future__ import annotations

import json
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Annotated

import typer

from benchmarks.harness import cpu_info, markdown_table, measured_text, save_result, write_page
from dpr_cache.runtime.processes import child_env

GOAL = 1.5  # a refusal's time over --help's
TOY, TINY = "data/toy", "data/toy/tiny-bert"

# {root}: the folder of its inputs, {toy}: the toy data, {tiny}: the tiny BERT.
SCENARIOS = {
    "--help": "--help",
    "train: a config key unknown": "train {config} --set train.lrr=1",
    "train: another run's checkpoints": "train {config} --set output_dir={root}/run",
    "train: a run in use": "train {config} --set output_dir={root}/held",
    "train --resume: a finished run": "train {config} --set output_dir={root}/done --resume",
    "train: a training file missing": "train {config} --set data.train=/nowhere.jsonl",
    "index: the passages file missing":
        "index {config} --model {tiny} --set data.passages=/nowhere.tsv",
    "eval: before index": "eval {config} --model {tiny} --set output_dir={root}/none",
    "encode: the model missing":
        "encode --model /nowhere --questions {toy}/dev.qa.tsv --out {root}/e",
    "search: the index missing":
        "search --index /nowhere --questions {toy}/dev.qa.tsv --model {tiny} --out {root}/r.trec",
    "mine: the index missing":
        "mine --model {tiny} --index /nowhere --train {toy}/train.jsonl --out {root}/m.jsonl",
    "score: the training file missing": "score --teacher bm25 --passages {toy}/passages.tsv"
        " --train /nowhere.jsonl --out {root}/s.jsonl",
    "export: the model missing": "export --model /nowhere --out {root}/x",
}  # fmt: skip


def scenarios(root: Path) -> dict[str, list[str]]:
    """Each refusal's command line, its inputs made under ``root`` (the lock: :func:`_holder`)."""
    for run, step in (("run", 1), ("done", 2)):
        state = root / run / "checkpoints" / f"step-{step:08d}" / "state.pt"
        state.parent.mkdir(parents=True)
        state.write_bytes(b"")
    (root / "done" / "model").mkdir()
    settings = {"data.train": f"{TOY}/train.jsonl", "train.batch_size": 64, "train.epochs": 6}
    settings["train.max_steps"] = None
    (root / "done" / "finished.json").write_text(json.dumps({"step": 2, "settings": settings}))
    names = {k: shlex.quote(str(v)) for k, v in {"root": root, "toy": TOY, "tiny": TINY}.items()}
    names["config"] = "--config configs/toy.yaml"
    return {name: shlex.split(line.format(**names)) for name, line in SCENARIOS.items()}


def _holder(root: Path) -> subprocess.Popen:
    """A process holding the lock of ``root/held`` until killed."""
    code = (
        "import time\nfrom dpr_cache.runtime.lock import output_lock\n"
        f"with output_lock({str(root / 'held')!r}):\n    print('held', flush=True)\n"
        "    time.sleep(3600)\n"
    )
    cmd = [sys.executable, "-c", code]
    proc = subprocess.Popen(cmd, env=child_env(), stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def _time(args: list[str]) -> tuple[float, int, str]:
    """Wall seconds of ``python -m dpr_cache ARGS``, its exit code and its last stderr line."""
    start = time.perf_counter()
    cmd = [sys.executable, "-m", "dpr_cache", *args]
    done = subprocess.run(cmd, env=child_env(), capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - start
    return seconds, done.returncode, (done.stderr.strip().splitlines() or [""])[-1]


def run(rounds: int) -> dict:
    """Every scenario ``rounds`` times, interleaved: medians, exit codes, lines, ratios to help."""
    with tempfile.TemporaryDirectory() as tmp:
        commands = scenarios(Path(tmp))
        holder = _holder(Path(tmp))
        rows: dict[str, dict] = {name: {"rounds": []} for name in commands}
        try:
            for _ in range(rounds):
                for name, args in commands.items():
                    seconds, rows[name]["exit"], rows[name]["line"] = _time(args)
                    rows[name]["rounds"].append(seconds)
        finally:
            holder.kill()
            holder.wait()
    help_s = statistics.median(rows["--help"]["rounds"])
    for r in rows.values():
        r["seconds"] = statistics.median(r["rounds"])
        r["vs_help"] = r["seconds"] / help_s
    worst = max(r["vs_help"] for n, r in rows.items() if n != "--help")
    return {"rows": rows, "help_s": help_s, "worst_vs_help": worst, "goal": GOAL}


def render(result: dict, folder: Path, source: Path | None = None) -> Path:
    """``refusals.md`` in ``folder`` from the saved ``refusals.json``."""
    rounds = len(next(iter(result["rows"].values()))["rounds"])
    rows = [
        [name, f"{r['seconds']:.2f}", f"{r['vs_help']:.2f}", r["exit"]]
        + [r["line"].replace("|", "\\|")[:110]]
        for name, r in result["rows"].items()
    ]
    met = "met" if result["worst_vs_help"] <= GOAL else "not met"
    return write_page(
        folder / "refusals.md",
        "How fast each command refuses",
        measured_text(result, "python -m benchmarks.refusals --out docs/bench", "refusals.json"),
        f"Each refusal a whole process (`python -m dpr_cache ...`), the median of {rounds}"
        " interleaved rounds; each before torch, transformers and FAISS are imported"
        f" (`tests/cli/test_refusals_before_imports.py`). Goal: at most {GOAL}x `--help`.",
        markdown_table(["command", "seconds", "x --help", "exit", "what it said"], rows),
        f"The slowest refusal: {result['worst_vs_help']:.2f}x `--help`: **{met}**.",
    )


def main(
    out: Annotated[Path, typer.Option(help="Where refusals.json and refusals.md go.")],
    rounds: Annotated[int, typer.Option(help="Times each command runs.")] = 5,
) -> None:
    save_result(out / "refusals.json", run(rounds), cpu_info(), render)


if __name__ == "__main__":
    typer.run(main)
