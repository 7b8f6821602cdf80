"""Training on several sources in the layouts people keep data in, from the command line:
one source a batch, each named in the log and TensorBoard with its prompts in the saved model;
a run from those layouts indexes and evaluates; a resume mid-epoch is bit-exact; bad sources are
one line with nothing written."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pandas as pd
import pytest
import yaml

from tests.e2e.test_resume import assert_identical, wait_for
from tests.support.cli import popen_cli, run_cli
from tests.support.fixtures import REPO, saved_weights
from tests.support.layouts import st_rows, tevatron_rows, write_beir_folder, write_jsonl


def sources_config(tmp_path: Path, **train) -> Path:
    """The toy records as three sources (sentence-transformers Parquet, tevatron JSON Lines, a
    BEIR folder), taken in turn, two with instructions of their own."""
    data = tmp_path / "data"
    data.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(st_rows()).to_parquet(data / "st.parquet")
    write_jsonl(data / "tev.jsonl", tevatron_rows())
    if not (data / "beir").exists():
        write_beir_folder(data / "beir")
    toy = yaml.safe_load((REPO / "configs" / "toy.yaml").read_text())
    toy["output_dir"] = str(tmp_path / "run")
    toy["data"].update(
        cache_dir=str(tmp_path / "cache"),
        batching="round_robin",
        train=[
            {"path": str(data / "st.parquet"), "name": "st", "query_prefix": "triplet: "},
            {"path": str(data / "tev.jsonl"), "name": "tev", "query_prefix": "tevatron: "},
            {"path": str(data / "beir"), "name": "beir", "hard_negatives": 0},
        ],
    )
    small = {"batch_size": 8, "chunk_size": 4, "max_steps": 6, "checkpoint_every": 3}
    toy["train"].update({**small, "num_threads": 1, **train})
    path = tmp_path / "sources.yaml"
    path.write_text(yaml.safe_dump(toy))
    return path


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("sources")
    config = sources_config(root)
    run_cli("train", "--config", str(config), "-q")
    run_cli("index", "--config", str(config))
    run_cli("eval", "--config", str(config))
    return root


def test_each_step_names_its_source_in_turn(trained):
    lines = [json.loads(x) for x in (trained / "run" / "train_log.jsonl").read_text().splitlines()]
    assert [x["source"] for x in lines] == ["st", "tev", "beir"] * 2
    assert [x["source_batches"] for x in lines] == [1, 1, 1, 2, 2, 2]


def test_tensorboard_has_a_curve_a_source(trained):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(trained / "run" / "tensorboard"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    for name in ("st", "tev", "beir"):
        assert {f"source/{name}/loss", f"source/{name}/batches"} <= tags
    assert [e.value for e in events.Scalars("source/tev/batches")] == [1, 2]


def test_the_model_records_each_source_s_prompts(trained):
    from sentence_transformers import SentenceTransformer

    query = SentenceTransformer(str(trained / "run" / "model" / "query_encoder"), device="cpu")
    assert {"st": "triplet: ", "tev": "tevatron: "}.items() <= query.prompts.items()
    assert "beir" not in query.prompts  # a source without prompts of its own takes the model's
    named = query.encode(["who won?"], prompt_name="tev")
    assert (named == query.encode(["tevatron: who won?"])).all()
    assert not (named == query.encode(["who won?"])).all()
    meta = json.loads((trained / "run" / "model" / "biencoder.json").read_text())
    assert meta["source_prompts"]["tev"] == {"query": "tevatron: ", "passage": ""}


def test_a_run_from_these_layouts_indexes_and_evaluates(trained):
    metrics = json.loads((trained / "run" / "eval" / "metrics.json").read_text())
    assert metrics["n_questions"] > 0 and 0.0 <= metrics["top100"] <= 100.0


def test_a_resume_mid_epoch_is_bit_exact(tmp_path):
    config = sources_config(tmp_path / "a", max_steps=8)
    run_cli("train", "--config", str(config), "-q")
    want = saved_weights(tmp_path / "a" / "run" / "model")
    config = sources_config(tmp_path / "b", max_steps=8)
    run_dir = tmp_path / "b" / "run"
    proc = popen_cli("train", "--config", str(config), "-q")
    wait_for(run_dir / "checkpoints" / "step-00000003" / "state.pt", proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (run_dir / "model").exists(), "the run ended before the kill: nothing tested"
    run_cli("train", "--config", str(run_dir / "config.yaml"), "--resume", "-q")
    assert_identical(saved_weights(run_dir / "model"), want)


def test_bad_sources_are_one_line_and_write_nothing(tmp_path):
    config = sources_config(tmp_path, batch_size=16)
    small = yaml.safe_load(config.read_text())
    small["data"]["train"][1]["path"] = str(tmp_path / "few.jsonl")
    write_jsonl(tmp_path / "few.jsonl", tevatron_rows()[:10])
    config.write_text(yaml.safe_dump(small))
    done = run_cli("train", "--config", str(config), check=False)
    lines = done.stderr.strip().splitlines()
    assert done.returncode != 0 and len(lines) == 1, done.stderr[-2000:]
    assert "source tev has 10 questions, fewer than train.batch_size=16" in lines[0]
    assert not (tmp_path / "run" / "model").exists()
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_eval_on_several_dev_sets_gives_a_row_a_set_and_their_pool(trained, tmp_path):
    """Each set evaluated alone into its folder; the pooled figures equal one evaluation of the
    sets' questions together (within the rounding of each set's figures)."""
    lines = (REPO / "data" / "toy" / "dev.qa.tsv").read_text().splitlines(keepends=True)
    (tmp_path / "first.qa.tsv").write_text("".join(lines[:25]))
    (tmp_path / "second.qa.tsv").write_text("".join(lines[25:60]))
    (tmp_path / "both.qa.tsv").write_text("".join(lines[:60]))
    config = str(trained / "sources.yaml")
    sets = f"data.dev_qa=[{tmp_path / 'first.qa.tsv'}, {tmp_path / 'second.qa.tsv'}]"
    done = run_cli("eval", "--config", config, "--set", sets, "--out", str(tmp_path / "two"), "-q")
    assert [line.split("|")[0].strip() for line in done.stdout.splitlines()[2:5]] == [
        "first",
        "second",
        "all",
    ]
    both = f"data.dev_qa={tmp_path / 'both.qa.tsv'}"
    run_cli("eval", "--config", config, "--set", both, "--out", str(tmp_path / "one"), "-q")
    pooled = json.loads((tmp_path / "two" / "metrics.json").read_text())
    whole = json.loads((tmp_path / "one" / "metrics.json").read_text())
    assert pooled["n_questions"] == whole["n_questions"] == 60
    for key in ("top1", "top5", "top20", "top100", "mrr@10", "ndcg@10", "recall@20"):
        assert abs(pooled[key] - whole[key]) <= 0.015 + 1e-9, key  # two roundings, each 0.005
    first = json.loads((tmp_path / "two" / "first" / "metrics.json").read_text())
    assert pooled["sets"]["first"]["top20"] == first["top20"] and first["n_questions"] == 25
    assert pooled["sets"]["first"]["top20"] != pooled["sets"]["second"]["top20"]  # not one set


def test_mine_reads_a_layout_as_it_reads_its_dpr_form(tmp_path):
    from tests.support.layouts import tevatron_as_dpr

    pd.DataFrame(tevatron_rows()).to_parquet(tmp_path / "tev.parquet")
    write_jsonl(tmp_path / "dpr.jsonl", tevatron_as_dpr())
    mined = {}
    for name in ("tev.parquet", "dpr.jsonl"):
        out = tmp_path / f"{name}.mined.jsonl"
        run_cli("mine", "--ranker", "bm25", "--match", "none", "--passages",
                str(REPO / "data" / "toy" / "passages.tsv"), "--train", str(tmp_path / name),
                "--out", str(out))  # fmt: skip
        mined[name] = [json.loads(line) for line in out.read_text().splitlines()]
    assert mined["tev.parquet"] == mined["dpr.jsonl"]
    assert all(r["hard_negative_ctxs"] for r in mined["dpr.jsonl"])
