"""Where index and eval encode, and in what precision, come from their own keys (index.device,
index.precision, eval.device, eval.precision), and what encode ran with is written beside its
vectors: the precision asked is the one used (the stored vectors differ), train's keys are
refused on the command line and noted when only the config sets them; a config file that
contradicts how the index encoded is refused as a ``--set`` is."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from tests.support.cli import run_cli, toy_overrides
from tests.support.fixtures import REPO, TOY, index_vectors

TINY = str(TOY / "tiny-bert")
N_TOY_PASSAGES = len((TOY / "passages.tsv").read_text().splitlines()) - 1  # less the header


def test_index_and_eval_encode_in_their_own_precision(tmp_path) -> None:
    """fp32 and bf16 as asked; auto (the default) is fp32 on the CPU: recorded as fp32, never
    as auto, the same bits and the same shards as fp32 asked for."""
    runs, keys = {}, {}
    for precision in ("fp32", "bf16", "auto"):
        asked = {"index.precision": precision, "eval.precision": precision}
        if precision == "auto":
            asked = {}  # the default
        args = ["--config", "configs/toy.yaml", "--model", TINY, "-q"]
        args += toy_overrides(tmp_path / precision, **asked)
        run_cli("index", *args)
        run_cli("eval", *args)
        out = tmp_path / precision / "run"
        meta = json.loads((out / "index" / "meta.json").read_text())
        used = "fp32" if precision == "auto" else precision
        assert meta["model"]["precision"] == used and meta["encode"]["precision"] == used
        metrics = json.loads((out / "eval" / "metrics.json").read_text())
        assert metrics["measured"]["questions_encoded"] == {"device": "cpu", "precision": used}
        keys[precision] = meta["shard_key"]
        runs[precision] = (index_vectors(out / "index")[0], (out / "eval" / "run.trec").read_text())
    (fp32, run32), (bf16, run16) = runs["fp32"], runs["bf16"]
    assert (fp32 != bf16).mean() > 0.1  # bf16 asked, bf16 used (fp32 twice: the same bits)
    np.testing.assert_allclose(fp32, bf16, atol=0.01)
    assert run32 != run16  # the questions too: other scores
    auto, run_auto = runs["auto"]
    assert np.array_equal(auto, fp32) and run_auto == run32  # auto on the CPU: fp32's bits
    assert keys["auto"] == keys["fp32"] != keys["bf16"]  # the key holds the precision used


def test_train_keys_are_train_own(tmp_path) -> None:
    args = ["--config", "configs/toy.yaml", "--model", TINY, "-q", *toy_overrides(tmp_path)]
    for command in ("index", "eval"):
        for key in ("train.device=cpu", "train.precision=bf16"):
            done = run_cli(command, *args, "--set", key, check=False)
            name = key.split("=")[0].split(".")[1]
            assert done.returncode == 2
            assert done.stderr.strip() == (
                f"error: {key.split('=')[0]}: {command} encodes on {command}.{name}; set that "
                "instead"
            )
    noted = _index_nq_config(tmp_path, "auto")
    assert "note: index encodes with index.precision: auto (train.precision: fp16" in noted.stderr
    unnoted = _index_nq_config(tmp_path, "fp32")
    assert "note:" not in unnoted.stderr  # index.precision set apart from its default


def test_encode_records_what_it_ran_with(tmp_path) -> None:
    model = str(TOY / "tiny-bert")
    base = ["encode", "--model", model, "-q", "--cache-dir", str(tmp_path / "cache")]
    run_cli(*base, "--questions", str(TOY / "dev.qa.tsv"), "--out", str(tmp_path / "q"))
    record = json.loads((tmp_path / "q" / "encode.json").read_text())
    assert record["max_length"] == 32 and record["pooling"] == "cls"  # DPR's, as the model says
    assert record["store_dtype"] == "float32" and record["precision"] == "fp32"  # auto on CPU
    for precision in ("fp32", "bf16"):
        out = tmp_path / f"p-{precision}"
        run_cli(
            *base,
            "--passages",
            str(TOY / "passages.tsv"),
            "--out",
            str(out),
            "--precision",
            precision,
            "--max-length",
            "64",
        )
        record = json.loads((out / "encode.json").read_text())
        assert (record["precision"], record["max_length"], record["pooling"]) == (
            precision,
            64,
            "cls",
        )
        assert record["normalize"] is False and record["passage_prefix"] == ""
        timings = record["timings"]
        assert timings["encoded_passages"] == N_TOY_PASSAGES and timings["open_seconds"] > 0
        assert 0 < timings["first_batch_seconds"] < timings["encode_seconds"], timings
        assert timings["first_batch_passages"] == 128  # encode's default batch
        seconds = timings["encode_seconds"]  # to the millisecond: the rate from it is that close
        rate = pytest.approx(N_TOY_PASSAGES / seconds, rel=0.0005 / seconds + 1e-4, abs=0.05)
        assert timings["passages_per_second"] == rate
    again_args = ["--out", str(tmp_path / "p-fp32"), "--precision", "fp32", "--max-length", "64"]
    run_cli(*base, "--passages", str(TOY / "passages.tsv"), *again_args)
    again = json.loads((tmp_path / "p-fp32" / "encode.json").read_text())["timings"]
    assert again["encoded_passages"] == 0 and again["passages_per_second"] is None  # on disk
    assert again["first_batch_seconds"] is None and again["first_batch_passages"] is None
    keys = {
        json.loads((tmp_path / f"p-{p}" / "encode.json").read_text())["shard_key"]
        for p in ("fp32", "bf16")
    }
    assert len(keys) == 2  # another precision, other shards
    bad = run_cli(
        *base,
        "--questions",
        str(TOY / "dev.qa.tsv"),
        "--out",
        str(tmp_path / "x"),
        "--precision",
        "fp8",
        check=False,
    )
    assert bad.returncode == 2 and "--precision: " in bad.stderr and "'fp8'" in bad.stderr


def test_a_yaml_key_that_contradicts_the_index_is_the_set_error(tmp_path) -> None:
    """A config file edited after ``index`` (its ``model.query_prefix`` now not the index's) is
    refused by ``eval`` with the very line a ``--set`` saying the same gets, both values named;
    the file that agrees with the index evaluates (control)."""
    args = ["--model", TINY, "-q", *toy_overrides(tmp_path)]
    run_cli("index", "--config", "configs/toy.yaml", *args)
    toy = yaml.safe_load((REPO / "configs" / "toy.yaml").read_text())
    edited, agreeing = tmp_path / "edited.yaml", tmp_path / "agreeing.yaml"
    for path, prefix in ((edited, "question: "), (agreeing, "")):
        path.write_text(yaml.safe_dump({**toy, "model": {**toy["model"], "query_prefix": prefix}}))
    by_file = run_cli("eval", "--config", str(edited), *args, check=False)
    contradicting = ["--set", "model.query_prefix=question: "]
    by_set = run_cli("eval", "--config", "configs/toy.yaml", *args, *contradicting, check=False)
    assert by_file.returncode == by_set.returncode == 2
    said = [proc.stderr.splitlines()[-1] for proc in (by_file, by_set)]  # after train.* notes
    assert said == 2 * [
        "error: model.query_prefix: 'question: ', but the index was built with '': set it back "
        "or rerun `dpr-cache index`"
    ]
    run_cli("eval", "--config", str(agreeing), *args)


def _index_nq_config(tmp_path: Path, precision: str):
    """``index`` under configs/nq_bs512.yaml (train.precision fp16) of the toy passages by the
    tiny BERT, at ``index.precision``: the finished process."""
    sets = {"data.passages": TOY / "passages.tsv", "index.precision": precision}
    args = ["--config", "configs/nq_bs512.yaml", "--model", TINY, "-q"]
    return run_cli("index", *args, *toy_overrides(tmp_path / "nq", **sets))
