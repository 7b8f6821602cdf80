"""studies/squad_multivector/run.sh end to end at toy scale (DRY_RUN=1: toy data, tiny BERT, 2
steps a run, one seed): the loss study's script trains the control and the multi arm (a vector a
token, at temperature 1) on the same batches, each is fused with BM25, the page shows the five
systems, their differences and the split by BM25's top-1, its block of docs/studies.md renders,
the loss study's page leaves the multi arm out, and a fresh start from the saved states trains
and fuses nothing again. The study runs as it is run beside the loss study: the control alone
first (ARMS=control, fused while its model is there), then both arms."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from dpr_cache.runtime.processes import child_env
from tests.support.cli import fork_python
from tests.support.fixtures import REPO

SCRIPT = REPO / "studies" / "squad_multivector" / "run.sh"
RUN = "gradcache-b32-s1"
SYSTEMS = ["BM25", "control", "multi", "BM25 + control", "BM25 + multi"]
RUN_KW = {"capture_output": True, "text": True, "timeout": 1800, "cwd": REPO}


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> dict:
    """One dry run of the study (seed 1) with saved states: its folders and its environment."""
    root = tmp_path_factory.mktemp("multivector")
    out = root / "squad_multivector-dry"
    env = {
        **child_env(),
        "DRY_RUN": "1",
        "OUT": str(out),
        "PY": fork_python(),
        "SEEDS": "1",
        "DIMS": "64",  # the control at its own width only (the loss study's smaller dims: its own)
        "SAVED": str(root / "saved"),
        "LOSSES_SAVED": str(root / "losses-saved"),
    }
    first = subprocess.run(["bash", str(SCRIPT)], env={**env, "ARMS": "control"}, **RUN_KW)
    assert first.returncode == 0, first.stderr[-3000:]
    control = {
        "arms": sorted(p.name for p in (root / "squad_losses-dry").iterdir() if p.is_dir()),
        "fused": sorted(p.parent.parent.name for p in out.glob(f"*/{RUN}/run.json")),
        "model": (root / "squad_losses-dry" / "control-dry" / RUN / "model").stat().st_mtime_ns,
        "record": (out / "control-dry" / RUN / "run.json").read_bytes(),
    }
    done = subprocess.run(["bash", str(SCRIPT)], env={**env, "KEEP_OUT": "1"}, **RUN_KW)
    assert done.returncode == 0, done.stderr[-3000:]
    losses = root / "squad_losses-dry"
    return {"root": root, "out": out, "losses": losses, "env": env, "control first": control}


def test_the_control_alone_first_then_the_multi_arm_beside_it(study: dict) -> None:
    first = study["control first"]
    assert first["arms"] == ["control-dry"] and first["fused"] == ["control-dry"]
    model = study["losses"] / "control-dry" / RUN / "model"
    assert model.stat().st_mtime_ns == first["model"], "the control trained again"
    record = study["out"] / "control-dry" / RUN / "run.json"
    assert record.read_bytes() == first["record"], "the control fused again"


@pytest.mark.parametrize(
    ("arms", "said"),
    [
        ("control mult", "unknown arm mult (control, multi)"),
        ("  ", "no arm named (control, multi)"),
    ],
)
def test_a_wrong_arm_is_one_line_and_writes_nothing(tmp_path: Path, arms: str, said: str) -> None:
    env = {**child_env(), "DRY_RUN": "1", "OUT": str(tmp_path / "x-dry"), "ARMS": arms}
    done = subprocess.run(["bash", str(SCRIPT)], env=env, **RUN_KW)
    assert done.returncode == 2 and done.stderr == f"error: ARMS: {said}\n"
    assert not list(tmp_path.iterdir())


def test_the_arms_train_on_the_same_batches_and_are_fused(study: dict) -> None:
    runs = {arm: study["losses"] / f"{arm}-dry" / RUN for arm in ("control", "multi")}
    configs = {arm: yaml.safe_load((r / "config.yaml").read_text()) for arm, r in runs.items()}
    assert configs["multi"]["model"]["vectors"] == "multi"
    assert configs["multi"]["train"]["temperature"] == 1.0
    assert configs["control"]["model"]["vectors"] is None
    assert configs["control"]["train"]["temperature"] == 0.05
    meta = json.loads((runs["multi"] / "index" / "meta.json").read_text())
    assert meta["vectors"] == "multi" and meta["tokens"] > meta["rows"]
    for arm in ("control", "multi"):
        fused = study["out"] / f"{arm}-dry" / RUN
        for step in ("eval-rrf", "eval-linear-a", "eval-linear-b"):
            assert (fused / step / "metrics.json").is_file(), (arm, step)
        assert "weight" in json.loads((fused / "eval-linear-a" / "fusion.json").read_text())
        record = json.loads((fused / "run.json").read_text())
        assert record["arm"] == arm and record["seed"] == 1
    assert not list((study["losses"] / "multi-dry" / RUN).glob("eval-dim-*"))


def test_the_page_shows_the_five_systems(study: dict) -> None:
    out = study["out"]
    data = json.loads((out / "results.json").read_text())
    assert [r["system"] for r in data["systems"]] == SYSTEMS
    assert data["questions"] == 263 and data["same_batches"] == {"1": True}
    assert set(SYSTEMS) <= set(data["curves"]) and len(data["curves"]["multi"]) == 100
    assert {r["arm"]: r["vectors"] for r in data["index"]} == {
        "control": "single",
        "multi": "multi",
    }
    assert [s["stratum"] for s in data["where"]] == ["BM25 right at top-1", "BM25 wrong at top-1"]
    page = (out / "results.md").read_text()
    for row in ("| BM25 + multi (linear) | 1 |", "| multi - control, seed 1 |", "| BM25 wrong"):
        assert row in page, row
    assert (out / "plot.png").stat().st_size > 0


def test_the_readme_block_renders_from_the_kept_results(study: dict, tmp_path: Path) -> None:
    readme = tmp_path / "studies.md"
    shutil.copy(REPO / "docs" / "studies.md", readme)
    shutil.copy(study["out"] / "results.json", tmp_path / "results.json")
    args = ["--kept", "--md", str(tmp_path / "results.md"), "--png", str(tmp_path / "plot.png")]
    table = [study["env"]["PY"], "-m", "studies.squad_multivector.table", *args]
    done = subprocess.run([*table, "--readme", str(readme)], env=study["env"], **RUN_KW)
    assert done.returncode == 0, done.stderr[-3000:]
    block = readme.read_text().split("<!-- multivector_table:begin -->")[1]
    block = block.split("<!-- multivector_table:end -->")[0]
    assert "| BM25 + multi (linear) | 1 |" in block and "| multi - control, seed 1 |" in block
    assert (tmp_path / "results.md").read_text() == (study["out"] / "results.md").read_text()


def test_the_loss_studys_page_leaves_the_multi_arm_out(study: dict, tmp_path: Path) -> None:
    args = ["--runs", str(study["losses"]), "--suffix=-dry", "--md", str(tmp_path / "l.md")]
    table = [study["env"]["PY"], "-m", "studies.squad_losses.table", *args]
    done = subprocess.run([*table, "--png", str(tmp_path / "l.png")], env=study["env"], **RUN_KW)
    assert done.returncode == 0, done.stderr[-3000:]
    page = (tmp_path / "l.md").read_text()
    assert "control: contrastive" in page and "multi" not in page


def test_a_fresh_start_from_the_saved_states_does_nothing_again(study: dict) -> None:
    again = study["root"] / "again" / "squad_multivector-dry"
    done = subprocess.run(["bash", str(SCRIPT)], env={**study["env"], "OUT": str(again)}, **RUN_KW)
    assert done.returncode == 0, done.stderr[-3000:]
    assert not list(again.parent.glob("squad_losses-dry/*/*/model")), "a student trained again"
    assert not list(again.glob("*/*/eval-rrf/retrieval.json")), "a fusion ran again"
    assert (again / "results.md").read_text() == (study["out"] / "results.md").read_text()
