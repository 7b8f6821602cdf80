"""The GPU suite's ``fsdp`` section (FSDP2 in a process group of one, issue 58): its dry run alone
through the suite's command (``--only fsdp``) on a tiny BERT, and the page's goals judged on
figures made up to sit on either side of the bound."""

from __future__ import annotations

import pytest

from benchmarks.gpu.report import goals, markdown
from tests.benchmarks.test_gpu_llm import _DEVICE, dry_section


@pytest.fixture(scope="module")
def dry_fsdp(tmp_path_factory):
    return dry_section(tmp_path_factory, "fsdp", 300)


def test_the_dry_run_shards_a_tiny_bert_in_a_group_of_one(dry_fsdp):
    report = dry_fsdp[0]
    fsdp, names = report["sections"]["fsdp"], list(report["sections"])
    assert report["planned"] == ["fsdp"]  # last but the sections on two GPUs:
    assert set(names[names.index("fsdp") + 1 :]) <= {"rank_faults"}
    assert "result" in fsdp, (fsdp.get("error"), fsdp.get("traceback"))
    r = fsdp["result"]
    assert [row["sync"] for row in r["exactness"]["rows"]] == ["step", "chunk"]
    assert all(row["ok"] and row["relative_error"] <= 1e-12 for row in r["exactness"]["rows"])
    none, sharded = r["memory"]
    assert (none["shard"], sharded["shard"]) == ("none", "fsdp")
    # one rank: a shard is the whole parameter, so FSDP holds what the model itself holds
    for kind in ("parameters", "gradients", "optimizer_state", "held"):
        assert sharded[kind] == none[kind] > 0, kind
    assert none["optimizer_state"] >= 2 * none["gradients"]


def test_the_page_says_one_gpu_divides_nothing(dry_fsdp):
    report, page = dry_fsdp
    section = page.split("## Fsdp\n")[1]
    assert "one GPU, in a process group of one" in section
    assert "nothing to divide" in section and "Two GPUs were not available" in section
    assert "\n| step | " in section and "\n| chunk | " in section
    assert "| none |" in section and "| fsdp |" in section and "fsdp / none: peak" in section
    judged = [g for g in report["goals"] if g["goal"].startswith("FSDP2 on one GPU")]
    assert [g["met"] for g in judged] == [True, True]


@pytest.mark.parametrize("gap, met", [(3e-15, True), (2e-10, False)])
def test_the_exactness_goal_is_judged_on_either_side(gap, met):
    row = {"sync": "step", "relative_error": gap, "bound": 1e-10, "ok": gap <= 1e-10}
    result = {
        "plan": {"batch": 16, "chunk": 4},
        "exactness": {"batch": 16, "chunk": 4, "hidden": 64, "layers": 2, "rows": [row]},
    }
    report = {
        "dry_run": False,
        "environment": _DEVICE,
        "sections": {"fsdp": {"result": result, "seconds": 30.0}},
    }
    (goal,) = [g for g in goals(report) if g["goal"].startswith("FSDP2")]
    assert goal["met"] is met and goal["measured"] == f"{gap:.1e}"
    page = markdown({**report, "goals": goals(report)})
    assert ("| **no** |" in page) is not met
