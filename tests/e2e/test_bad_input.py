"""Bad input: one `error: ...` line on stderr naming the file, line or key; exit 2; no traceback.
An operating-system error that is not bad input keeps its own message, errno and path: exit 1."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from tests.support.cli import run_cli, toy_overrides
from tests.support.fixtures import REPO


def expect_error(proc, *fragments: str, code: int = 2) -> None:
    assert proc.returncode == code, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: ")
    assert "Traceback" not in proc.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


@pytest.fixture
def bad_train_file(tmp_path):
    path = tmp_path / "train.jsonl"
    good = {"question": "q?", "answers": ["a"], "positive_ctxs": [{"title": "t", "text": "a"}]}
    path.write_text(json.dumps(good) + "\n" + json.dumps(good) + "\n{not json\n")
    return path


def train(tmp_path, *sets: str):
    args = toy_overrides(tmp_path)
    for item in sets:
        args += ["--set", item]
    return run_cli("train", "--config", "configs/toy.yaml", *args, "-q", check=False)


def test_missing_config_file(tmp_path):
    proc = run_cli("train", "--config", str(tmp_path / "nope.yaml"), check=False)
    expect_error(proc, "nope.yaml", "no such config file")


def test_unknown_key(tmp_path):
    expect_error(train(tmp_path, "train.lrr=1"), "--set: unknown key 'train.lrr'")


def test_mistyped_and_negative_values(tmp_path):
    expect_error(train(tmp_path, "train.batch_size=many"), "train.batch_size")
    expect_error(train(tmp_path, "train.lr=-1"), "--set: train.lr takes a number > 0 (got -1)")


def test_a_set_value_of_another_type_is_blamed_on_set_and_says_what_the_key_takes(tmp_path):
    """Not on the config file given beside it, and not as pydantic's union members one by one."""
    proc = train(tmp_path, "train.chunk_size=abc")
    expect_error(proc, "error: --set: train.chunk_size takes an integer >= 1 or 'auto' (got 'abc')")
    assert "configs/toy.yaml" not in proc.stderr and "literal" not in proc.stderr


def test_missing_training_file(tmp_path):
    proc = train(tmp_path, f"data.train={tmp_path / 'absent.jsonl'}")
    expect_error(proc, "absent.jsonl")
    assert "data nq" not in proc.stderr  # not one of DPR's files: no download to name


def test_a_missing_nq_file_names_the_command_that_downloads_it(tmp_path):
    """configs/nq_bs512.yaml before `dpr-cache data nq`: its training file, or one elsewhere."""
    sets = [
        "--set",
        f"output_dir={tmp_path / 'run'}",
        "--set",
        "model.name_or_path=data/toy/tiny-bert",
    ]
    proc = run_cli("train", "--config", "configs/nq_bs512.yaml", *sets, check=False)
    if not (REPO / "data" / "nq" / "biencoder-nq-train.json").exists():  # not downloaded here
        expect_error(
            proc,
            "data/nq/biencoder-nq-train.json: no such file",
            "downloaded by: dpr-cache data nq --gunzip",
        )
    elsewhere = tmp_path / "nq" / "biencoder-nq-train.json.gz"
    proc = run_cli(
        "train",
        "--config",
        "configs/nq_bs512.yaml",
        *sets,
        "--set",
        f"data.train={elsewhere}",
        check=False,
    )
    expect_error(
        proc, f"{elsewhere}: no such file", f"dpr-cache data nq --gunzip --out {tmp_path / 'nq'}"
    )
    assert not (tmp_path / "run").exists()


def test_malformed_json_line_names_file_and_line(tmp_path, bad_train_file):
    expect_error(train(tmp_path, f"data.train={bad_train_file}"), "train.jsonl", "line 3")


def test_batch_larger_than_the_data(tmp_path):
    expect_error(train(tmp_path, "train.batch_size=4096"), "train.batch_size", "4096")


def test_eval_before_index(tmp_path):
    args = toy_overrides(tmp_path)
    proc = run_cli(
        "eval", "--config", "configs/toy.yaml", *args, "--model", "data/toy/tiny-bert", check=False
    )
    expect_error(proc, "dpr-cache index")
    assert not (tmp_path / "run").exists()  # a failed eval leaves no empty folder behind


def test_index_without_a_model(tmp_path):
    proc = run_cli("index", "--config", "configs/toy.yaml", *toy_overrides(tmp_path), check=False)
    expect_error(proc, "model")


def test_missing_passages_file_keeps_what_was_written(tmp_path):
    args = toy_overrides(tmp_path, **{"train.max_steps": 2})
    run_cli("train", "--config", "configs/toy.yaml", *args, "-q")
    model = tmp_path / "run" / "model" / "query_encoder" / "model.safetensors"
    before = model.read_bytes()
    proc = run_cli(
        "index",
        "--config",
        "configs/toy.yaml",
        *args,
        "--set",
        f"data.passages={tmp_path / 'gone.tsv'}",
        check=False,
    )
    expect_error(proc, "gone.tsv")
    assert model.read_bytes() == before


def test_a_missing_model_name_is_bad_input(tmp_path):
    proc = train(tmp_path, f"model.name_or_path={tmp_path / 'no-model'}")
    expect_error(proc, "model.name_or_path", "no-model")


def test_an_os_error_keeps_its_errno_and_path_and_exits_1(tmp_path):
    """The output folder cannot be made (its parent is a file): not bad input, a system error
    reported as the system says it, and nothing half-written."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    proc = train(tmp_path, f"output_dir={blocker / 'run'}", "train.max_steps=1")
    expect_error(proc, "[Errno 20]", "Not a directory", str(blocker), code=1)
    assert blocker.read_text() == "not a folder"
    assert not list(tmp_path.rglob("*.tmp*")) and not list(tmp_path.rglob("config.yaml"))


# -- distillation: the teacher's scores --------------------------------------------------------


def test_a_record_without_a_teacher_score_is_named_and_nothing_written_is_lost(tmp_path):
    from tests.support.teacher import write_scored_toy

    args = toy_overrides(tmp_path, **{"train.max_steps": 2})
    run_cli("train", "--config", "configs/toy.yaml", *args, "-q")
    run = tmp_path / "run"

    def written() -> dict:  # the run's files but the lock (which names its last holder)
        return {p: p.read_bytes() for p in run.rglob("*") if p.is_file() and p.suffix != ".lock"}

    before = written()
    path = write_scored_toy(tmp_path / "scored.jsonl", unscored=4)
    more = [
        "--set",
        f"data.train={path}",
        "--set",
        "train.loss=distill_kl",
        "--set",
        "train.max_steps=4",
    ]
    proc = run_cli(
        "train", "--config", "configs/toy.yaml", *args, *more, "--resume", "-q", check=False
    )
    expect_error(proc, "scored.jsonl line 5: hard_negative_ctxs[1] has no teacher_score")
    assert written() == before and len(before) > 10


def test_a_contrastive_run_needs_no_teacher_score(tmp_path):
    from tests.support.teacher import write_scored_toy

    path = write_scored_toy(tmp_path / "scored.jsonl", unscored=4)
    proc = train(tmp_path, f"data.train={path}", "train.max_steps=1")
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("bad", ["NaN", "-Infinity", '"high"', "1e300", "-3.5e38"])
def test_a_bad_teacher_score_is_named(tmp_path, bad):
    from tests.support.teacher import write_scored_toy

    path = write_scored_toy(tmp_path / "scored.jsonl", bad=bad)
    proc = train(tmp_path, f"data.train={path}", "train.loss=margin_mse")
    expect_error(proc, "scored.jsonl line 1: positive_ctxs[0]: teacher_score")


def test_fewer_scored_hard_negatives_than_asked_is_named(tmp_path):
    from tests.support.teacher import write_scored_toy

    path = write_scored_toy(tmp_path / "scored.jsonl")
    proc = train(tmp_path, f"data.train={path}", "train.loss=distill_kl", "train.hard_negatives=3")
    expect_error(proc, "scored.jsonl line 1: 2 hard negatives", "train.hard_negatives is 3")


@pytest.mark.parametrize(
    ("sets", "fragments"),
    [
        (["train.distill_weight=0.5"], ["train.distill_weight is set", "contrastive"]),
        (["train.loss=distill_kl", "train.teacher_temperature=0"], ["train.teacher_temperature"]),
        (["train.loss=margin_mse", "train.teacher_temperature=2"], ["train.teacher_temperature"]),
        (["train.loss=distill_kl", "train.hard_negatives=0"], ["train.hard_negatives"]),
    ],
)
def test_contradicting_distillation_options_name_the_key(tmp_path, sets, fragments):
    expect_error(train(tmp_path, *sets), "--set", *fragments)


MISSING_INPUTS = [
    "mine --ranker bm25 --passages data/toy/passages.tsv --train {x} --out {out}",
    "mine --ranker bm25 --passages {x} --train data/toy/train.jsonl --out {out}",
    "score --teacher bm25 --passages data/toy/passages.tsv --train {x} --out {out}",
    "encode --model data/toy/tiny-bert --questions {x} --out {out}",
    "search --index {out} --questions {x} --model data/toy/tiny-bert --out {out}",
    "search --index {out} --query-embeddings {x} --out {out}",
]


@pytest.mark.parametrize("line", MISSING_INPUTS, ids=lambda line: line.split(" {x}")[0])
def test_a_missing_input_file_is_named_with_its_option_before_the_heavy_imports(tmp_path, line):
    """Checked at the command's edge: a wrong path is told in about a second, not after torch,
    FAISS, datasets and bm25s have loaded; nothing is written."""
    option = line.split(" {x}")[0].split()[-1]
    argv = line.format(x=tmp_path / "nope.txt", out=tmp_path / "out").split()
    code = (
        "import sys\n"
        "from typer.testing import CliRunner\n"
        "from dpr_cache.cli import app\n"
        f"r = CliRunner().invoke(app, {argv!r})\n"
        "print(r.exit_code, r.output.strip().splitlines())\n"
        "print([m for m in ('torch', 'faiss', 'datasets', 'bm25s') if m in sys.modules])\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    status, heavy = proc.stdout.strip().splitlines()
    assert status == f"2 ['error: {option} {tmp_path / 'nope.txt'}: no such file']"
    assert heavy == "[]"
    assert not (tmp_path / "out").exists()
    # negative control: the same command with the file there goes past that check (to the
    # next one, or to the heavy imports)
    (tmp_path / "nope.txt").write_text("")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    status = proc.stdout.strip().splitlines()[0]
    assert f"{option} {tmp_path / 'nope.txt'}" not in status, status


@pytest.mark.parametrize(
    ("out", "message"),
    [
        ("q.npy", "q.npy: the output must not overwrite the query vectors"),
        (".", ": a folder: give the path of the file to write"),
    ],
)
def test_search_refuses_an_output_that_is_its_input_or_a_folder(tmp_path, out, message):
    """Refused before the index is opened (there is none here): the query vectors stay."""
    queries = tmp_path / "q.npy"
    np.save(queries, np.zeros((2, 4), dtype=np.float32))
    before = queries.read_bytes()
    args = ["--index", str(tmp_path / "none"), "--query-embeddings", str(queries)]
    proc = run_cli("search", *args, "--out", str(tmp_path / out), check=False)
    expect_error(proc, message)
    assert queries.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["q.npy"]  # no lock, no folder


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (
            "encode --model data/toy/tiny-bert --questions data/toy/dev.qa.tsv --out {file}",
            "{file}: a file: give the folder to write into",
        ),
        (
            "encode --model python:no_such_package --questions data/toy/dev.qa.tsv --out {dir}",
            "not an installed package that ships a model (ModuleNotFoundError)",
        ),
        (
            "index --config configs/toy.yaml --set output_dir={dir} --out {dir}/elsewhere",
            "index --out: with --config the index goes to output_dir/index",
        ),
        (
            "mine --ranker bm25 --passages data/toy/passages.tsv --train data/toy/train.jsonl "
            "--out {dir}/m.jsonl --nprobe 0",
            "--nprobe: Input should be greater than or equal to 1",
        ),
    ],
    ids=["out-a-file", "python-package", "index-config-out", "mine-nprobe"],
)
def test_an_output_or_option_a_command_cannot_use_is_one_line(tmp_path, line, message):
    file = tmp_path / "a-file"
    file.write_text("kept\n")
    words = line.format(file=file, dir=tmp_path / "d").split()
    expect_error(run_cli(*words, check=False), message.format(file=file))
    assert file.read_text() == "kept\n" and not (tmp_path / "d" / "elsewhere").exists()


def test_a_flag_of_one_number_is_told_as_one_number(tmp_path):
    """search's --k is one number (the config's eval.top_k a list): its error says so."""
    vectors = tmp_path / "q.npy"
    vectors.write_bytes(b"")
    proc = run_cli(
        "search",
        "--index",
        str(tmp_path / "index"),
        "--query-embeddings",
        str(vectors),
        "--k",
        "0",
        "--out",
        str(tmp_path / "run.trec"),
        check=False,
    )
    expect_error(proc, "error: --k: takes an integer >= 1 (got 0)")
    assert "list" not in proc.stderr


def test_a_download_that_cannot_start_leaves_no_folder(tmp_path):
    out = tmp_path / "data" / "nq"
    nowhere = "http://127.0.0.1:9"  # nothing listens there
    proc = run_cli(
        "data",
        "nq",
        "--out",
        str(out),
        "--file",
        "nq-test.qa.csv",
        "--base-url",
        nowhere,
        check=False,
    )
    expect_error(proc, "127.0.0.1:9", "cannot download")
    assert not (tmp_path / "data").exists()
