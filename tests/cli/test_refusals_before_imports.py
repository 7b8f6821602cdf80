"""Every command that writes or reads a run refuses before torch, transformers or FAISS is
imported: each refusal below (a config, a lock held, an output folder's state, an input missing)
is given by a fresh interpreter in which importing any of the three fails, as one ``error:``
line and exit 2. The negative control: a command that gets past its refusals meets the failing
import, so a refusal that came after it would show."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dpr_cache.runtime.processes import child_env
from tests.support.cli import bm25_args
from tests.support.fixtures import REPO, TOY

HEAVY = ("torch", "transformers", "faiss")
TOY_CONFIG = "configs/toy.yaml"
TINY = str(TOY / "tiny-bert")


@pytest.fixture(scope="module")
def blocked(tmp_path_factory) -> dict[str, str]:
    """An environment whose ``import torch`` (transformers, faiss) raises ImportError."""
    root = tmp_path_factory.mktemp("blocked")
    for name in HEAVY:
        (root / name).mkdir()
        (root / name / "__init__.py").write_text(
            f"raise ImportError('{name} is blocked: imported before a refusal')\n"
        )
    env = child_env()
    env["PYTHONPATH"] = os.pathsep.join([str(root), env["PYTHONPATH"]])
    return env


def _run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "dpr_cache", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _refused(proc: subprocess.CompletedProcess, fragment: str) -> None:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert fragment in lines[0] and "blocked" not in lines[0], lines[0]


class _Held:
    """The lock of an output held by another process for the block."""

    def __init__(self, target: Path, is_file: bool = False) -> None:
        code = (
            "import sys, time\n"
            "from dpr_cache.runtime.lock import output_lock\n"
            f"with output_lock({str(target)!r}, is_file={is_file}):\n"
            "    print('held', flush=True)\n"
            "    time.sleep(120)\n"
        )
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code], env=child_env(), stdout=subprocess.PIPE, text=True
        )

    def __enter__(self):
        assert self.proc.stdout.readline().strip() == "held"
        return self

    def __exit__(self, *exc) -> None:
        self.proc.kill()
        self.proc.wait()


def _run_dir(tmp_path: Path) -> list[str]:
    return ["--set", f"output_dir={tmp_path / 'run'}", "--set", f"data.cache_dir={tmp_path}"]


def test_the_blocked_import_fails_a_command_past_its_refusals(blocked, tmp_path) -> None:
    """The control: a train that passes every refusal imports torch, and fails there."""
    proc = _run(blocked, "train", "--config", TOY_CONFIG, *_run_dir(tmp_path))
    assert proc.returncode != 0 and "torch is blocked" in proc.stderr


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--set", "train.lrr=1"], "unknown key 'train.lrr'"),
        (["--set", "data.train=/nowhere/train.jsonl"], "/nowhere/train.jsonl: no such file"),
    ],
)
def test_train_refuses_a_bad_config_and_a_missing_file(blocked, tmp_path, args, fragment):
    _refused(_run(blocked, "train", "--config", TOY_CONFIG, *_run_dir(tmp_path), *args), fragment)


def test_train_refuses_a_folder_with_checkpoints_naming_the_command_that_continues(
    blocked, tmp_path
):
    step = tmp_path / "run" / "checkpoints" / "step-00000003"
    step.mkdir(parents=True)
    (step / "state.pt").write_bytes(b"")
    proc = _run(blocked, "train", "--config", TOY_CONFIG, *_run_dir(tmp_path))
    want = (
        f"continue it with `dpr-cache train --config {tmp_path / 'run' / 'config.yaml'} --resume`"
    )
    _refused(proc, want)


def test_train_resume_of_a_finished_run_says_so_and_ends(blocked, tmp_path):
    run = tmp_path / "run"
    (run / "checkpoints" / "step-00000004").mkdir(parents=True)
    (run / "checkpoints" / "step-00000004" / "state.pt").write_bytes(b"")
    (run / "model").mkdir()
    settings = {"data.train": "data/toy/train.jsonl", "train.batch_size": 64, "train.epochs": 6}
    settings["train.max_steps"] = None
    (run / "finished.json").write_text(__import__("json").dumps({"step": 4, "settings": settings}))
    proc = _run(blocked, "train", "--config", TOY_CONFIG, *_run_dir(tmp_path), "--resume")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"{run} finished at step 4; model at {run / 'model'}"


def _commands(tmp_path: Path) -> dict[str, list[str]]:
    """Each command reading or writing ``tmp_path/out*``, its inputs all there."""
    index = tmp_path / "index"
    return {
        "train": ["train", "--config", TOY_CONFIG, *_run_dir(tmp_path)],
        "index": ["index", "--config", TOY_CONFIG, "--model", TINY, *_run_dir(tmp_path)],
        "index --embeddings": [
            "index",
            "--embeddings",
            str(tmp_path / "emb" / "*.npy"),
            "--out",
            str(tmp_path / "out"),
        ],
        "eval": ["eval", "--config", TOY_CONFIG, "--model", TINY, *_run_dir(tmp_path)],
        "encode": [
            "encode",
            "--model",
            TINY,
            "--questions",
            str(TOY / "dev.qa.tsv"),
            "--out",
            str(tmp_path / "out"),
        ],
        "search": [
            "search",
            "--index",
            str(index),
            "--query-embeddings",
            str(tmp_path / "q.npy"),
            "--out",
            str(tmp_path / "out.trec"),
        ],
        "mine": [
            "mine",
            "--model",
            TINY,
            "--index",
            str(index),
            "--train",
            str(TOY / "train.jsonl"),
            "--out",
            str(tmp_path / "out.jsonl"),
        ],
        "score": bm25_args("score", tmp_path / "out.jsonl"),
    }


LOCKED = {  # command -> the output its lock is on
    "train": ("run", False),
    "index": ("run/index", False),
    "index --embeddings": ("out", False),
    "eval": ("run/eval", False),
    "encode": ("out", False),
    "search": ("out.trec", True),
    "mine": ("out.jsonl", True),
    "score": ("out.jsonl", True),
}


def _inputs(tmp_path: Path) -> None:
    """What the commands above read: an index (its meta), shards, query vectors."""
    import json

    import numpy as np

    (tmp_path / "index").mkdir()
    (tmp_path / "index" / "meta.json").write_text(json.dumps({"format": 2}))
    (tmp_path / "run" / "index").mkdir(parents=True)
    (tmp_path / "run" / "index" / "meta.json").write_text(json.dumps({"format": 2}))
    (tmp_path / "emb").mkdir()
    np.save(tmp_path / "emb" / "a.npy", np.zeros((2, 4), np.float32))
    np.save(tmp_path / "q.npy", np.zeros((2, 4), np.float32))


@pytest.mark.parametrize("command", list(LOCKED))
def test_a_held_output_is_refused_before_the_heavy_imports(blocked, tmp_path, command):
    _inputs(tmp_path)
    target, is_file = LOCKED[command]
    with _Held(tmp_path / target, is_file):
        started = time.monotonic()
        proc = _run(blocked, *_commands(tmp_path)[command])
    _refused(proc, "in use by pid")
    assert time.monotonic() - started < 60


@pytest.mark.parametrize(
    ("command", "args", "fragment"),
    [
        ("index", ["--set", "data.passages=/nowhere/p.tsv"], "data.passages: /nowhere/p.tsv"),
        ("index", ["--model", "/nowhere/model"], "/nowhere/model: no model folder"),
        ("index --embeddings", ["--embeddings", "/nowhere/*.npy"], "matches no file"),
        ("eval", [], "no index at"),
        ("eval", ["--set", "data.dev_qa=/nowhere/q.tsv"], "data.dev_qa: /nowhere/q.tsv"),
        ("encode", ["--model", "/nowhere/model"], "/nowhere/model: no model folder"),
        ("search", ["--index", "/nowhere/index"], "no index at /nowhere/index"),
        ("mine", ["--index", "/nowhere/index"], "no index at /nowhere/index"),
        ("mine", ["--train", "/nowhere/t.jsonl"], "--train /nowhere/t.jsonl: no such file"),
        ("score", ["--train", "/nowhere/t.jsonl"], "--train /nowhere/t.jsonl: no such file"),
    ],
)
def test_a_missing_input_is_refused_before_the_heavy_imports(
    blocked, tmp_path, command, args, fragment
):
    _inputs(tmp_path)
    if command == "eval" and not args:
        (tmp_path / "run" / "index" / "meta.json").unlink()
    base = _commands(tmp_path)[command]
    flags = {a for a in args if a.startswith("--") and a != "--set"}
    kept = []
    skip = False
    for a in base:  # the command with the flags given replaced
        if skip:
            skip = False
            continue
        if a in flags:
            skip = True
            continue
        kept.append(a)
    _refused(_run(blocked, *kept, *args), fragment)


def test_export_refuses_a_missing_model_before_the_heavy_imports(blocked, tmp_path):
    proc = _run(blocked, "export", "--model", "/nowhere/model", "--out", str(tmp_path / "x"))
    _refused(proc, "/nowhere/model: no model folder")
