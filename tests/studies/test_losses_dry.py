"""studies/squad_losses/run.sh end to end at toy scale (DRY_RUN=1: toy data, tiny BERT, 2 steps
a run, one seed, three of the five arms): each arm's settings reach its run, the control and
Matryoshka are evaluated at every smaller dim, the page shows the arms, their differences and
the dims, and a fresh start from the saved state trains nothing again."""

from __future__ import annotations

import json
import statistics
import subprocess
from pathlib import Path

from dpr_cache.runtime.processes import child_env
from tests.support.cli import fork_python
from tests.support.fixtures import REPO

SCRIPT = REPO / "studies" / "squad_losses" / "run.sh"
RUN = "gradcache-b32-s1"


def test_dry_run_writes_the_page_and_resumes_from_the_saved_state(tmp_path: Path) -> None:
    out, saved = tmp_path / "losses-dry", tmp_path / "saved"
    env = {
        **child_env(),
        "DRY_RUN": "1",
        "OUT": str(out),
        "PY": fork_python(),
        "SEEDS": "1",
        "ARMS": "control guided matryoshka",
        "SAVED": str(saved),
    }
    run = {"capture_output": True, "text": True, "timeout": 1800, "cwd": REPO}
    done = subprocess.run(["bash", str(SCRIPT)], env=env, **run)
    assert done.returncode == 0, done.stderr[-3000:]

    runs = {arm: out / f"{arm}-dry" / RUN for arm in ("control", "guided", "matryoshka")}
    configs = {arm: (folder / "config.yaml").read_text() for arm, folder in runs.items()}
    assert "guide: data/toy/tiny-bert" in configs["guided"]
    assert "matryoshka_dims:\n  - 64\n  - 32\n  - 16" in configs["matryoshka"]
    assert "guide: null" in configs["control"] and "matryoshka_dims: null" in configs["control"]
    for arm in ("control", "matryoshka"):
        for dim in (32, 16):
            metrics = json.loads((runs[arm] / f"eval-dim-{dim}" / "metrics.json").read_text())
            assert metrics["n_questions"] == 263
            assert (
                json.loads((runs[arm] / f"dim-{dim}" / "index" / "meta.json").read_text())["dim"]
                == dim
            )
    assert not (runs["guided"] / "eval-dim-32").exists()
    page = (out / "results.md").read_text()
    for row in ("| guided - control, seed 1 |", "| matryoshka - control, seed 1 |", "| 64 |"):
        assert row in page, row
    assert "| 16 |" in page and (out / "plot.png").is_file()
    steps = json.loads((out / "results.json").read_text())["steps"]
    for arm, folder in runs.items():  # each arm's step times, read from its train log
        lines = (folder / "train_log.jsonl").read_text().splitlines()
        seconds = [json.loads(line)["seconds"] for line in lines]
        assert steps[arm] == {"median_s": statistics.median(seconds), "fastest_s": min(seconds)}
        row = page.split(f"\n| {arm} | ", 1)[1].split("\n", 1)[0]
        assert row.endswith(f" | {steps[arm]['median_s']:.1f} | {min(seconds):.1f} |"), row

    # a fresh machine with only the saved state: nothing trained or evaluated again
    again = tmp_path / "again-dry"
    done = subprocess.run(["bash", str(SCRIPT)], env={**env, "OUT": str(again)}, **run)
    assert done.returncode == 0, done.stderr[-3000:]
    assert not list(again.glob("*/*/model")), "a saved run was trained again"
    assert (again / "results.md").read_text() == page
