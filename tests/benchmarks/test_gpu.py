"""The GPU suite's dry run (no CUDA here): every section runs at toy size or says why it was
skipped, both files are written, and the page states that its figures are a CPU rehearsal. The
page's goals are checked on figures made up to sit on either side of each goal."""

from __future__ import annotations

import contextlib
import json
import signal
import sys

import pytest
import torch
import typer

from benchmarks.gpu.report import goals, markdown
from tests.support.cli import run_benchmark


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu")
    proc = run_benchmark("gpu", "--out", str(out), "--dry-run", timeout=1200)
    return proc, json.loads((out / "gpu.json").read_text()), (out / "gpu.md").read_text()


def test_dry_run_runs_every_cpu_section_without_error(dry_run):
    proc, report, page = dry_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert report["dry_run"] is True
    sections = report["sections"]
    assert list(sections) == [
        "exactness",
        "mixed_precision",
        "command_line",
        "memory",
        "chunk_too_large",
        "largest_full_batch",
        "speed",
        "encoding",
        "teacher_scoring",
        "compilation",
        "llm",  # its figures: tests/benchmarks/test_gpu_llm.py
        "fsdp",  # its figures: tests/benchmarks/test_gpu_fsdp.py
    ]
    assert sections.pop("chunk_too_large") == {"skipped": "needs a GPU to run out of"}
    assert sections.pop("largest_full_batch") == {"skipped": "needs a GPU to fill"}
    assert sections.pop("compilation") == {"skipped": "needs a GPU (a CPU compile takes minutes)"}
    for name, section in sections.items():
        assert "result" in section, (name, section.get("error"), section.get("traceback"))
    assert page.startswith("# dpr-cache on a GPU\n\n**Dry run on the CPU**")


def test_dry_run_figures_hold_what_the_cpu_can_show(dry_run):
    _, report, _ = dry_run
    s = report["sections"]
    exact = s["exactness"]["result"]
    assert all(row["ok"] for row in exact["fp64"])
    assert all(row["ok"] for row in exact["replay"]) and exact["finite_difference"]["ok"]
    assert all(row["ok"] for row in s["mixed_precision"]["result"]["rows"])
    overflow = s["mixed_precision"]["result"]["fp16_overflow"]
    assert overflow["ok"] and overflow["skipped"] >= 1
    cli = s["command_line"]["result"]
    assert cli["pipeline"]["ok"], cli["pipeline"]["commands"]
    starts = [row["started_s"] for row in cli["pipeline"]["commands"][:3]]  # train, index, eval
    assert 0 <= starts[0] < starts[1] < starts[2], starts
    assert cli["ran_beside"] == []  # on the CPU, in its place
    assert cli["commands_s"] <= s["command_line"]["seconds"] + 1
    row = cli["resume"]["deterministic"]
    assert row["killed_mid_run"] and row["resumed_vs_unbroken"]["bitwise_equal"], row
    assert row["two_unbroken_runs"]["bitwise_equal"], row
    assert exact["compiled"] == {"not_run": "a dry run compiles nothing"}
    first, second = s["speed"]["result"]["comparisons"]
    assert first["best"]["dpr-cache"] and first["best"]["full batch"]
    assert (first["batch"], first["warmups"], second["batch"], second["warmups"]) == (8, 1, 16, 0)
    rows = first["rows"]
    assert rows["dpr-cache chunk 2"]["chunks"] == [4, 8] and rows["full batch"]["chunks"] == [1, 1]
    assert rows["dpr-cache chunk 8/4"]["chunks"] == [1, 4], rows["dpr-cache chunk 8/4"]
    assert rows["CachedMNRL rows 2"]["chunks"] == [4, 8]
    assert rows["GradCache library chunk 2"]["engine"] == "GradCache library"
    bucket = rows["dpr-cache chunk 2 bucket 8"]
    assert "pairs_per_s" in bucket and bucket["engine"] == "dpr-cache bucket 8", bucket
    # the larger batch: no full batch, the peers' chunks below 4 left out, no warm-up
    assert "full batch" not in second["rows"] and "CachedMNRL rows 2" not in second["rows"]
    assert second["rows"]["dpr-cache chunk 2"]["warmup_s"] == []
    assert all("pairs_per_s" in r for r in second["rows"].values()), second["rows"]
    assert [t["batch"] for t in s["speed"]["result"]["tokens"]] == [8, 16]
    page = dry_run[2].split("## Speed")[1].split("## Encoding")[0]
    assert "\nB=8, fp32 (" in page and "\nB=16, fp32 (" in page
    assert "| dpr-cache chunk 2 | " in page and "| dpr-cache | " in page, page
    assert "b: ms a chunk" in page, page
    assert "no warm-up of its own" in page and "the peers' chunks below 4 left out" in page
    encoded = s["encoding"]["result"]["command"]
    assert encoded["passages"] == 300 and encoded["passages_per_s"] > 0, encoded
    assert s["encoding"]["result"]["encoder_alone"]["mean_words"] == 100
    t = encoded["timings"]
    working = t["open_seconds"] + t["encode_seconds"]
    assert 0 < t["first_batch_seconds"] < t["encode_seconds"] and working < encoded["seconds"], t
    assert t["first_batch_passages"] == 64, t  # the dry plan's batch
    scoring = s["teacher_scoring"]["result"]
    runs = [(row["round"], row["precision"]) for row in scoring["rows"]]
    assert runs == [(1, "fp32"), (1, "bf16"), (2, "bf16"), (2, "fp32")], runs
    assert all(row["pairs"] == 64 and row["pairs_a_second"] > 0 for row in scoring["rows"])
    alone = scoring["model_alone"]
    assert [a["precision"] for a in alone] == ["fp32", "bf16"], alone
    assert all(a["pairs_a_second"] > 0 for a in alone), alone
    first = scoring["first_pass"]
    assert first["order"] == ["bf16", "fp32"] and first["batches"] == 3, first  # 64 pairs / 16
    assert first["pairs"] == 48 and 1 <= first["new_lengths"] <= 3, first
    assert list(first["seconds"]) == ["bf16", "fp32"] and min(first["seconds"].values()) > 0
    assert list(first["again_seconds"]) == ["bf16", "fp32"], first


def _comparison(rates: dict[str, float], batch: int = 512) -> dict:
    """A speed comparison at ``batch``, fp16, of settings timed at these pairs/s (each row's
    engine and chunks as the section records them)."""
    from benchmarks.gpu.perf import _FAMILIES, _best
    from benchmarks.gpu.report import setting_of

    rows = {}
    for name, rate in rates.items():
        row = {"pairs_per_s": rate, "step_s": batch / rate}
        rows[name] = {**row, **setting_of(name, {}, batch)}
    best = {family: _best(rows, family) for family in _FAMILIES}
    return {"batch": batch, "precision": "fp16", "rows": rows, "best": best}


def _step_rates(a: float, b_ms: float, peers_slower: float, batch: int = 512) -> dict:
    """Pairs/s of dpr-cache, CachedMNRL and the library at chunks 32 to 512 whose step is
    ``a + b x chunks a step``, the peers' ``peers_slower`` times longer."""
    rates = {}
    for chunk in (32, 64, 128, 256, 512):
        n = -(-batch // chunk) + -(-2 * batch // chunk)
        step = a + b_ms / 1e3 * n
        rates[f"dpr-cache chunk {chunk}"] = batch / step
        rates[f"CachedMNRL rows {chunk}"] = batch / (peers_slower * step)
        rates[f"GradCache library chunk {chunk}"] = batch / (peers_slower * step)
    return rates


def _report(ratio_mem: float, b_ms: float, peers_slower: float, encode_s: float) -> dict:
    """A run's figures: dpr-cache's step 0.45 s + ``b_ms`` a chunk, the full batch's 0.5 s."""
    rates = {**_step_rates(0.45, b_ms, peers_slower), "full batch": 512 / 0.5}
    rows = [
        {"batch": 128, "chunk": 128, "fits": True, "peak_bytes": 10},
        {"batch": 8192, "chunk": 128, "fits": True, "peak_bytes": 10 * ratio_mem},
    ]
    encoding = {
        "nq_projected_s": encode_s,
        "nq_limit_s": 480.0,
        "share_of_limit": 480.0 / encode_s,
        "passage_words": 100,
    }
    return {
        "sections": {
            "memory": {"result": {"rows": rows}},
            "speed": {"result": {"comparisons": [_comparison(rates)]}},
            "encoding": {"result": encoding},
        }
    }


@pytest.mark.parametrize(
    "figures, met",
    [((1.1, 3.0, 1.6, 1500.0), True), ((1.3, 50.0, 1.25, 4000.0), False)],
)
def test_goals_are_judged_on_either_side(figures, met):
    """At 3 ms a chunk dpr-cache's chunk 128, 64 and 32 are 1.03, 0.96 and 0.84x the full
    batch; at 50 ms far below. Each goal names its batch, precision and chunk."""
    judged = goals(_report(*figures))
    names = [g["goal"] for g in judged]
    assert names[0] == "bf16, chunk 128: memory at B=8192 over B=128"
    chunks = [f"B=512 fp16, chunk {c}: dpr-cache over the full batch" for c in (128, 64, 32)]
    assert names[1:4] == chunks
    assert names[4:10] == [
        f"B=512 fp16, chunk {c}: dpr-cache over {peer}"
        for c in (32, 64, 128)
        for peer in ("CachedMNRL", "GradCache library")
    ]
    assert (
        names[10]
        == "B=512 fp16: the cost of a chunk, dpr-cache (step = a + b x chunks a step, fitted)"
    )
    assert names[11].startswith("fp16, batches of 512: encode NQ's 21,015,324 passages")
    assert [g["met"] for g in judged] == [met] * 12, judged
    cost = judged[10]["measured"]
    assert cost.startswith(f"{figures[1]:.1f} ms: dpr-cache, chunks 32 to 512 (48 to 3 chunks"), (
        cost
    )
    assert (
        judged[1]["measured"].startswith("1.03x: dpr-cache chunk 128 (4 + 8 chunks a step)")
        or not met
    )


_DEVICE = {
    "device": "cuda:0",
    "device_name": "H100",
    "driver": "580",
    "memory_bytes": 80 * 2**30,
    "torch": "2.11",
    "cuda": "13.0",
    "python": "3.12",
    "date": "today",
    "host": {"cpu": "x", "cores": 16, "transformers": "5"},
}


def test_a_skipped_or_failed_section_is_named_on_the_page():
    report = {
        "dry_run": False,
        "environment": _DEVICE,
        "sections": {
            "memory": {"skipped": "out of time (10 s left)"},
            "speed": {"error": "RuntimeError: boom", "seconds": 3.0},
        },
    }
    page = markdown({**report, "goals": goals(report)})
    assert "Device: **H100**, driver 580, 80 GiB" in page
    assert "## Memory\n\nSkipped: out of time (10 s left)." in page
    assert "## Speed\n\nFailed after 3.0 s: `RuntimeError: boom`" in page


def test_speed_cut_short_shows_and_judges_what_it_measured():
    comparison = {
        "batch": 512,
        "precision": "fp16",
        "rows": {
            "dpr-cache chunk 32": {"pairs_per_s": 150.0, "step_s": 3.41},
            "full batch": {"failed": "out of memory"},
            "CachedMNRL rows 32": {"pairs_per_s": 100.0, "step_s": 5.12},
        },
        "best": {
            "dpr-cache": {"setting": "dpr-cache chunk 32", "pairs_per_s": 150.0},
            "full batch": None,
            "CachedMNRL": {"setting": "CachedMNRL rows 32", "pairs_per_s": 100.0},
        },
    }
    partial = {"comparisons": [comparison], "tokens": {"batch": 512, "questions": 7, "passages": 9}}
    report = _report(1.1, 1.4, 0.9, 3000.0)
    report["sections"]["speed"] = {"error": "SectionTimeout: stopped", "seconds": 600.0,
                                   "partial": partial}  # fmt: skip
    report["dry_run"], report["environment"] = False, _DEVICE
    judged = {g["goal"]: g for g in goals(report) if "B=512" in g["goal"]}
    over_cmnrl = judged["B=512 fp16, chunk 32: dpr-cache over CachedMNRL"]
    assert over_cmnrl["met"] is True, over_cmnrl  # 1.5x, from the partial
    assert judged["B=512 fp16, chunk 32: dpr-cache over the full batch"]["met"] is None  # no fit
    report["sections"] = {
        "memory": {"error": "x", "seconds": 1.0, "partial": {"rows": []}},
        "speed": report["sections"]["speed"],
    }
    page = markdown({**report, "goals": goals(report)})
    assert "What it measured before it stopped:" in page
    assert "| dpr-cache chunk 32 | 150 | 3.410 | 16 + 32 |" in page
    # a section other than speed keeps its partial figures in gpu.json only
    assert "is in gpu.json (`partial`)" in page.split("## Speed")[0]


def test_host_waits_show_where_they_were_measured():
    syncs = {"count": 14, "top": {"engine.py:210": 12, "modeling_bert.py:88": 2}}
    rows = {
        "dpr-cache chunk 128": {"pairs_per_s": 678.0, "step_s": 0.756, "syncs": syncs},
        "full batch": {"failed": "out of memory"},
    }
    comparison = {"batch": 128, "precision": "fp16", "rows": rows, "best": {}}
    speed = {
        "comparisons": [comparison, {**comparison, "rows": {"x": rows["full batch"]}}],
        "tokens": {"batch": 128, "questions": 7, "passages": 9},
    }
    section = {"result": speed, "seconds": 200.0}
    report = {"dry_run": False, "environment": _DEVICE, "sections": {"speed": section}}
    page = markdown({**report, "goals": goals(report)}).split("## Speed")[1]
    assert "| dpr-cache chunk 128 | 678 | 0.756 | 1 + 2 | 14 (`engine.py:210` 12, " in page
    assert "| full batch | out of memory | | the whole batch |  |" in page
    assert "| x | out of memory | | – |\n" in page  # no column where nothing was measured


def test_score_rounds_and_the_model_alone_are_on_the_page_its_profiles_in_gpu_json_only():
    row = {"pairs": 10_000, "seconds": 5.0, "pairs_a_second": 2000.0, "nq_hours": 0.25}
    profile = {
        "on": "device",
        "wall_ms": 30.0,
        "self_ms": 25.5,
        "top": [{"op": "sm90_gemm_bf16", "calls": 36, "ms": 12.25}],
    }
    result = {
        "rows": [
            {**row, "round": 1, "precision": "bf16"},
            {**row, "round": 2, "precision": "fp32"},
        ],
        "model_alone": [{"precision": "bf16", "seconds": 0.25, "pairs_a_second": 40_000.0}],
        "first_pass": {
            "order": ["fp32", "bf16"],
            "batches": 23,
            "pairs": 5_888,
            "new_lengths": 20,
            "seconds": {"fp32": 0.9, "bf16": 1.5},
            "again_seconds": {"fp32": 0.5, "bf16": 0.3},
        },
        "profiles": {"bf16": profile, "fp32": {"error": "RuntimeError: no CUPTI"}},
        "tokenize_s": 0.6,
        "mean_tokens": 170.2,
        "batch_size": 256,
        "max_length": 256,
        "model": {"layers": 6, "hidden": 384},
        "nq_pairs": 1_825_280,
    }
    section = {"result": result, "seconds": 40.0}
    report = {"dry_run": False, "environment": _DEVICE, "sections": {"teacher_scoring": section}}
    page = markdown({**report, "goals": goals(report)}).split("## Teacher scoring")[1]
    assert "tokenize s 0.6; mean tokens 170.2; batch size 256; max length 256" in page
    assert "| pairs | seconds | pairs a second | nq hours | round | precision |" in page
    assert "| 10,000 | 5 | 2,000 | 0.25 | 1 | bf16 |" in page
    assert "| 10,000 | 5 | 2,000 | 0.25 | 2 | fp32 |" in page
    assert "| bf16 | 0.25 | 40,000 |" in page
    assert (
        "order fp32, bf16; batches 23; pairs 5,888; new lengths 20; seconds fp32 0.9, bf16 1.5; "
        "again seconds fp32 0.5, bf16 0.3." in page
    )
    assert "sm90_gemm_bf16" not in page and "CUPTI" not in page


@pytest.mark.parametrize(
    "only, sections, seconds, measured",
    [
        ([], ["memory", "speed"], 300.0, "5.0 min"),
        (None, ["memory", "speed"], 400.0, "6.7 min"),
        (
            ["speed"],
            ["memory", "speed"],
            100.0,
            "not run whole (--only: sections joined from runs)",
        ),
        ("absent", ["memory", "speed"], 100.0, "not run whole (--only: sections joined from runs)"),
        (None, ["memory", "skipped"], 100.0, "not run whole (a section skipped)"),
        (None, ["memory"], 100.0, "not run whole (cut short)"),  # the page after a section
    ],
)
def test_the_whole_suites_minutes_are_judged_only_for_a_whole_run(
    only, sections, seconds, measured
):
    done = {"memory": {"result": {"rows": []}, "seconds": 1.0}}
    if "speed" in sections:
        done["speed"] = {"result": {"comparisons": []}, "seconds": 1.0}
    if "skipped" in sections:
        done["speed"] = {"skipped": "out of time (3 s left)"}
    report = {
        "dry_run": False,
        "environment": _DEVICE,
        "planned": ["memory", "speed"],
        "sections": done,
        "seconds": seconds,
    }
    if only != "absent":  # a page joined by hand says nothing of --only
        report["only"] = only
    (suite,) = [g for g in goals(report) if g["goal"] == "the whole suite in one run"]
    assert suite["measured"] == measured
    assert suite["met"] is {"5.0 min": True, "6.7 min": False}.get(measured)
    assert not [g for g in goals({**report, "dry_run": True}) if "suite" in g["goal"]]


def test_a_chunk_too_large_is_judged_by_its_one_line_and_a_hang_shows_its_stack():
    line = "error: train.chunk_size: chunk 2048 ran out of GPU memory ...; chunk 256 fits: set ..."
    row = {"rc": 2, "seconds": 31.0, "last_line": line, "chunk": 2048, "ok": True}
    sections = {"chunk_too_large": {"result": row, "seconds": 31.0}}
    report = {"dry_run": False, "environment": _DEVICE, "only": None, "sections": sections}
    (goal,) = [g for g in goals(report) if g["goal"].startswith("a chunk too large")]
    assert goal["met"] is True and goal["measured"] == "exit 2"
    page = markdown({**report, "goals": goals(report)}).split("## Chunk too large")[1]
    assert f"rc 2; seconds 31; last line {line}; chunk 2,048" in page and "stack" not in page
    stack = ["Thread 0x1 (most recent call first):", '  File "x.py", line 3 in probe']
    hung = {**row, "rc": None, "ok": False, "last_line": "out of time after 100 s", "stack": stack}
    report["sections"]["chunk_too_large"]["result"] = hung
    (goal,) = [g for g in goals(report) if g["goal"].startswith("a chunk too large")]
    assert goal["met"] is False
    page = markdown({**report, "goals": goals(report)})
    assert '  File "x.py", line 3 in probe\n```' in page.split("\nstack:\n\n```\n")[1]


def test_command_line_cut_short_shows_the_commands_it_ran():
    row = {
        "command": "dpr-cache index --config configs/toy.yaml --set a=b",
        "rc": 0,
        "seconds": 15.2,
        "last_line": "index written",
        "stdout": [],
    }
    partial = {"pipeline": {"commands": [row], "metrics": None, "ok": True}}
    report = {
        "dry_run": False,
        "environment": _DEVICE,
        "sections": {
            "command_line": {"error": "SectionTimeout: x", "seconds": 9.0, "partial": partial}
        },
    }
    page = markdown({**report, "goals": goals(report)})
    assert "| dpr-cache index --config configs/toy.yaml | 0 | 15.2 | index written |" in page
    assert "resume" not in page  # the resume check had not run
    timed = {**partial["pipeline"], "commands": [{**row, "started_s": 64.6}]}
    report["sections"]["command_line"]["partial"] = {"pipeline": timed}
    page = markdown({**report, "goals": goals(report)})
    assert "| dpr-cache index --config configs/toy.yaml | 0 | 15.2 | index written | 64.6 |" in page


def test_only_reruns_the_named_sections_and_keeps_the_rest_with_their_date(tmp_path, monkeypatch):
    from benchmarks.gpu import suite

    calls = []

    def fake_sections(plan, device, work, tokenizer, partial):
        def section(name, value):
            def run():
                calls.append(name)
                return value

            return suite.Section(name, None, 1, run)

        return [section("exactness", {"v": len(calls)}), section("memory", {"v": len(calls)})]

    monkeypatch.setattr(suite, "_sections", fake_sections)
    monkeypatch.setattr(suite, "write_page", lambda report, out: None)
    out = tmp_path / "out"
    out.mkdir()
    first = suite.run_suite(out, budget_s=60, tokenizer="t", dry=True)
    earlier = json.loads(json.dumps(first).replace(first["environment"]["date"], "earlier"))
    (out / "gpu.json").write_text(json.dumps(earlier))
    calls.clear()
    second = suite.run_suite(out, budget_s=60, tokenizer="t", dry=True, only=["memory"])
    assert calls == ["memory"]
    assert list(second["sections"]) == ["exactness", "memory"]
    assert second["sections"]["exactness"]["date"] == "earlier"
    assert second["sections"]["memory"]["date"] == second["environment"]["date"] != "earlier"
    fresh = tmp_path / "fresh"
    calls.clear()
    alone = suite.run_suite(fresh, budget_s=60, tokenizer="t", dry=True, only=["memory"])
    assert calls == ["memory"]
    assert alone["sections"]["exactness"] == {"skipped": "not asked for (--only), none in gpu.json"}
    calls.clear()  # run in --only's order, shown in the suite's
    both = suite.run_suite(
        fresh, budget_s=60, tokenizer="t", dry=True, only=["memory", "exactness"]
    )
    assert calls == ["memory", "exactness"] and list(both["sections"]) == ["exactness", "memory"]
    with pytest.raises(typer.BadParameter, match="unknown section"):
        suite.run_suite(out, budget_s=60, tokenizer="t", dry=True, only=["speeed"])
    (out / "gpu.json").write_text(json.dumps({**first, "dry_run": False}))
    with pytest.raises(typer.BadParameter, match="GPU run"):
        suite.run_suite(out, budget_s=60, tokenizer="t", dry=True, only=["memory"])


def test_on_a_device_a_section_stops_at_its_cap_and_the_next_one_still_runs(tmp_path, monkeypatch):
    import time

    from benchmarks.gpu import suite

    def fake_sections(plan, device, work, tokenizer, partial):
        return [
            suite.Section("speed", None, 1, lambda: time.sleep(30) or {}),
            suite.Section("encoding", None, 1, lambda: {"rate": 1}),
        ]

    monkeypatch.setattr(suite, "_sections", fake_sections)
    monkeypatch.setattr(suite, "environment", lambda device: {"date": "d", "device": str(device)})
    monkeypatch.setattr(suite, "write_page", lambda report, out: None)
    monkeypatch.setattr(suite, "SECTION_CAP", 2)
    report = suite.run_suite(tmp_path, budget_s=60, tokenizer="t", dry=False)
    speed = report["sections"]["speed"]
    assert speed["error"].startswith("SectionTimeout: stopped after 2 s") and speed["seconds"] < 5
    assert report["sections"]["encoding"]["result"] == {"rate": 1}


def _suite_with_commands(monkeypatch, order: list[str], budget_s: float = 60, **run):
    """run_suite over fake sections: ``exactness`` (hosts commands), ``speed`` (does not), each
    noting whether the commands had started by then, and ``command_line``, whose commands
    record that they started and then wait for a release (or until stopped)."""
    import threading

    from benchmarks.gpu import suite
    from benchmarks.gpu.cli import Beside

    started, release, seen = threading.Event(), threading.Event(), {}

    def fake_sections(plan, device, work, tokenizer, partial):
        into = {}

        def commands_task():
            started.set()
            release.wait(timeout=5)
            return "done"

        beside = Beside({"commands": commands_task}, into)

        def section(name):
            def look():
                seen[name] = started.wait(timeout=1)
                release.set()
                return {}

            return look

        def commands():
            beside.wait()
            return {"commands": into["commands"], "ran_beside": beside.ran_beside}

        return [
            suite.Section("exactness", None, 1, section("exactness"), hosts_commands=True),
            suite.Section("speed", None, 1, section("speed")),
            suite.Section("command_line", None, 1, commands, beside),
        ]

    monkeypatch.setattr(suite, "_sections", fake_sections)
    monkeypatch.setattr(suite, "environment", lambda device: {"date": "d", "device": str(device)})
    monkeypatch.setattr(suite, "write_page", lambda report, out: None)
    report = suite.run_suite(run.pop("out"), budget_s=budget_s, tokenizer="t", only=order, **run)
    return report, seen


def test_on_a_device_commands_start_with_the_suite_beside_sections_that_host_them(
    tmp_path, monkeypatch
):
    report, seen = _suite_with_commands(
        monkeypatch, ["exactness", "command_line"], out=tmp_path, dry=False
    )
    assert seen == {"exactness": True}  # started beside it
    assert report["sections"]["command_line"]["result"] == {
        "commands": "done",
        "ran_beside": ["exactness"],
    }
    # on the CPU they run in their own place: after exactness
    report, seen = _suite_with_commands(
        monkeypatch, ["exactness", "command_line"], out=tmp_path / "cpu", dry=True
    )
    assert seen == {"exactness": False}
    assert report["sections"]["command_line"]["result"]["ran_beside"] == []


def test_commands_never_start_beside_a_section_that_times_or_fills_the_gpu(tmp_path, monkeypatch):
    # --only may put speed before command_line: the commands then wait for their own place
    report, seen = _suite_with_commands(
        monkeypatch, ["exactness", "speed", "command_line"], out=tmp_path, dry=False
    )
    assert seen == {"exactness": False, "speed": False}
    assert report["sections"]["command_line"]["result"] == {"commands": "done", "ran_beside": []}


def test_commands_whose_section_is_skipped_for_time_are_stopped(tmp_path, monkeypatch):
    import os

    from benchmarks.gpu import suite
    from benchmarks.gpu.cli import Beside, child

    pid = tmp_path / "pid"
    code = f"import os, time\nopen({str(pid)!r}, 'w').write(str(os.getpid()))\ntime.sleep(60)"
    beside = Beside({"long": lambda: child([sys.executable, "-c", code], 120)}, {})

    def first():
        _wait_for(pid)
        return {}

    def fake_sections(plan, device, work, tokenizer, partial):
        return [
            suite.Section("exactness", None, 1, first, hosts_commands=True),
            suite.Section("command_line", None, 1000, lambda: beside.wait(), beside),
        ]

    monkeypatch.setattr(suite, "_sections", fake_sections)
    monkeypatch.setattr(suite, "environment", lambda device: {"date": "d", "device": str(device)})
    monkeypatch.setattr(suite, "write_page", lambda report, out: None)
    report = suite.run_suite(tmp_path, budget_s=60, tokenizer="t", dry=False)
    assert report["sections"]["command_line"]["skipped"].startswith("out of time")
    with pytest.raises(ProcessLookupError):  # its command killed, not left running
        os.kill(int(pid.read_text()), 0)


def _wait_for(path, seconds: float = 30) -> None:
    import time

    deadline = time.monotonic() + seconds
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)


def test_commands_beside_are_stopped_when_their_wait_runs_out_of_time(tmp_path):
    import os
    import time

    from benchmarks.gpu.cli import Beside, child, in_parallel

    pid = tmp_path / "pid"
    code = f"import os, time\nopen({str(pid)!r}, 'w').write(str(os.getpid()))\ntime.sleep(60)"
    beside = Beside({"long": lambda: child([sys.executable, "-c", code], 120)}, {})
    beside.start()
    _wait_for(pid)
    start = time.monotonic()
    with _time_up_after(3), pytest.raises(TimeoutError):
        beside.wait()
    assert time.monotonic() - start < 20
    with pytest.raises(ProcessLookupError):  # killed, not left running
        os.kill(int(pid.read_text()), 0)
    beside.stop()  # stopping again is harmless
    touch = [sys.executable, "-c", "print('again')"]
    assert in_parallel({"again": lambda: child(touch, 30)}, {})["again"]["rc"] == 0


def test_a_section_past_the_budget_is_stopped_and_named_and_a_quick_one_is_not():
    import time

    from benchmarks.gpu.suite import _timed

    env = {"date": "today", "device": "cuda:0", "device_name": "H100"}
    slow = _timed(lambda: time.sleep(5) or {}, env, limit_s=1)
    assert slow["error"].startswith("SectionTimeout: stopped after 1 s")
    assert slow["seconds"] < 3 and slow["device_name"] == "H100"
    quick = _timed(lambda: {"x": 1}, env, limit_s=1)
    time.sleep(1.5)  # the alarm was cancelled: nothing fires after the section
    assert quick["result"] == {"x": 1}


def test_a_hung_child_is_stopped_with_the_stack_it_hung_in():

    from benchmarks.gpu.cli import child

    code = "import time\ndef wait_here():\n    time.sleep(60)\nwait_here()\n"
    run = child([sys.executable, "-c", code], timeout=2)
    assert run["rc"] is None and run["seconds"] < 30
    assert "wait_here" in run["stderr"]
    done = child([sys.executable, "-c", "print('ok')"], timeout=30)
    assert done["rc"] == 0 and done["stdout"].strip() == "ok"


@contextlib.contextmanager
def _time_up_after(seconds: int):
    """A section's time running out: TimeoutError raised in this thread after ``seconds``."""

    def out_of_time(signum, frame):
        raise TimeoutError("the section's time is up")

    previous = signal.signal(signal.SIGALRM, out_of_time)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def test_a_child_whose_section_ran_out_of_time_is_killed(tmp_path):
    import os
    import time

    from benchmarks.gpu.cli import child

    pid_file = tmp_path / "pid"
    code = f"import os, time\nopen({str(pid_file)!r}, 'w').write(str(os.getpid()))\ntime.sleep(60)"

    start = time.monotonic()
    with _time_up_after(3), pytest.raises(TimeoutError):
        child([sys.executable, "-c", code], timeout=120)
    assert time.monotonic() - start < 20
    with pytest.raises(ProcessLookupError):  # killed and reaped, not left running
        os.kill(int(pid_file.read_text()), 0)


def test_a_child_slow_to_print_its_stack_is_killed_when_its_section_runs_out_of_time(tmp_path):
    import os
    import time

    from benchmarks.gpu.cli import child

    pid = tmp_path / "pid"
    code = (  # SIGABRT ignored: the grace given to print the stack runs on
        "import os, signal, time\nsignal.signal(signal.SIGABRT, signal.SIG_IGN)\n"
        f"open({str(pid)!r}, 'w').write(str(os.getpid()))\ntime.sleep(60)"
    )
    start = time.monotonic()
    with _time_up_after(4), pytest.raises(TimeoutError):
        child([sys.executable, "-c", code], timeout=2)
    assert time.monotonic() - start < 12  # in the grace, not after it
    with pytest.raises(ProcessLookupError):  # killed and reaped, not left running
        os.kill(int(pid.read_text()), 0)


def test_commands_run_at_the_same_time_and_a_section_out_of_time_stops_them_all(
    tmp_path, monkeypatch
):
    import os
    import time

    import benchmarks.gpu.cli
    from benchmarks.gpu.cli import child, in_parallel

    monkeypatch.setattr(benchmarks.gpu.cli, "_WORKERS", 2)  # a GPU machine's, on any machine

    def sleeper(name: str, seconds: int) -> list[str]:
        pid = tmp_path / name
        code = f"import os, time\nopen({str(pid)!r}, 'w').write(str(os.getpid()))\n"
        return [sys.executable, "-c", code + f"time.sleep({seconds})"]

    start = time.monotonic()
    done = in_parallel({n: lambda n=n: child(sleeper(n, 2), 30) for n in "ab"}, {})
    assert [done[n]["rc"] for n in "ab"] == [0, 0]
    assert time.monotonic() - start < 3.9  # together, not one after the other

    marker = tmp_path / "started after the stop"
    touch = [sys.executable, "-c", f"open({str(marker)!r}, 'w')"]
    tasks = {
        "long": lambda: child(sleeper("long", 60), 120),
        "chain": lambda: (child(sleeper("chain", 60), 120), child(touch, 30)),
    }

    start = time.monotonic()
    with _time_up_after(3), pytest.raises(TimeoutError):
        in_parallel(tasks, {})
    assert time.monotonic() - start < 20
    time.sleep(2)  # time enough for the chain's next command, were it started
    assert not marker.exists()
    for name in ("long", "chain"):
        with pytest.raises(ProcessLookupError):  # killed, not left running
            os.kill(int((tmp_path / name).read_text()), 0)
    assert in_parallel({"again": lambda: child(touch, 30)}, {})["again"]["rc"] == 0


def test_chunk_settings_leave_out_those_equal_at_the_batch():
    from benchmarks.gpu.perf import chunk_settings

    chunks = [128, 256, 512, (512, 128), (512, 256)]
    assert chunk_settings(chunks, 512, 1024) == {
        "chunk 128": (128, 128),
        "chunk 256": (256, 256),
        "chunk 512": (512, 512),
        "chunk 512/128": (512, 128),
        "chunk 512/256": (512, 256),
    }
    # at B=128 (256 passages): 512 is all the rows, as 256 already is; the question chunks
    # are all 128 questions, as in the plain chunks
    assert chunk_settings(chunks, 128, 256) == {"chunk 128": (128, 128), "chunk 256": (128, 256)}
    assert chunk_settings([512], 128, 256) == {"chunk 512": (128, 256)}  # all rows, alone


def test_a_full_batch_out_of_memory_is_timed_at_the_largest_half_that_fits(monkeypatch):
    import benchmarks.gpu.perf as perf

    tried, waits = [], []

    def fake_interleave(steppers, batch, model, precision, rounds, host_waits=True):
        (name,) = steppers
        tried.append(batch)
        waits.append(host_waits)
        if batch > 128:
            return {name: {"failed": "out of memory"}}
        return {name: {"step_s": 1.0, "pairs_per_s": float(batch), "times_s": [1.0]}}

    monkeypatch.setattr(perf, "_interleave", fake_interleave)
    monkeypatch.setattr(perf, "_own_stepper", lambda model, chunk: object())
    rows = {
        "dpr-cache chunk 32": {"step_s": 2.0, "pairs_per_s": 256.0},
        "full batch": {"failed": "out of memory"},
    }
    comparison = {"batch": 512, "precision": "fp16", "rows": rows, "best": {"full batch": None}}
    out = perf.add_fitting_full_batch(None, comparison, batch_of=lambda n: n)
    assert tried == [256, 128]  # halved until it fits, each a batch of that size
    assert waits == [(), ()]  # no host waits counted
    full = {"engine": "full batch", "chunks": [1, 1]}
    assert out["rows"]["full batch B=256"] == {"failed": "out of memory", **full}
    assert out["best"]["full batch"] == {"setting": "full batch B=128", "pairs_per_s": 128.0}
    tried.clear()  # a full batch that fitted at the comparison's batch is left alone
    fitted = {"batch": 8, "precision": "fp32", "rows": {"full batch": {"pairs_per_s": 5.0}}}
    assert perf.add_fitting_full_batch(None, fitted, batch_of=lambda n: n) is fitted
    assert tried == [] and "best" not in fitted


def test_memory_rows_run_beside_the_commands_say_so_above_their_table():
    from benchmarks.gpu import report

    row = {"batch": 128, "chunk": 128, "peak_bytes": 1e9, "step_s": 1.0}
    lines = report._figures({"rows": [row], "beside_commands": True})
    table = lines.index("| batch | chunk | peak bytes | step s |")
    assert "beside commands yes" in " ".join(lines[:table]) and lines[table - 1] == ""
    assert lines[table + 2] == "| 128 | 128 | 1.00 GB | 1 |"
    alone = report._figures({"rows": [row], "beside_commands": False})
    assert "beside commands no" in " ".join(alone)


def test_a_section_stopped_part_way_keeps_what_it_measured():
    """A section that writes its figures into ``partial`` as it goes (teacher_scoring) keeps
    them when its time runs out mid-way (a profiler that never returns, say)."""
    import time as clock

    from benchmarks.gpu import suite

    partial: dict[str, dict] = {}

    def run() -> dict:
        out = partial.setdefault("teacher_scoring", {})
        out["rows"] = [{"precision": "bf16", "pairs_a_second": 2000.0}]
        clock.sleep(30)
        return out

    section = suite.Section("teacher_scoring", None, 1, run)
    report = {"environment": _DEVICE}
    result = suite._run_section(section, True, 1.5, report, partial)
    assert result["error"].startswith("SectionTimeout: stopped after 2 s"), result
    assert result["partial"] == {"rows": [{"precision": "bf16", "pairs_a_second": 2000.0}]}
    assert result["seconds"] < 10


def test_each_row_names_its_chunks_and_one_chunk_a_tower_says_so():
    """Rows of a run that recorded no chunks are read from their names (one hard negative);
    a dpr-cache row whose towers are one chunk each re-encodes nothing: no GradCache work."""
    from benchmarks.gpu.report import chunks_text, setting_of

    assert setting_of("dpr-cache chunk 32", {}, 512) == {
        "engine": "dpr-cache",
        "chunk": "32",
        "chunks": [16, 32],
    }
    assert setting_of("dpr-cache chunk 512/256", {}, 512)["chunks"] == [1, 4]
    assert setting_of("CachedMNRL rows 128", {}, 512)["chunks"] == [4, 8]
    assert setting_of("CachedMNRL tokens 32768", {}, 512)["engine"] == "CachedMNRL tokens"
    recorded = {"engine": "dpr-cache bucket 64", "chunk": "32", "chunks": [16, 32], "x": 1}
    assert setting_of("anything", recorded, 512) == {k: recorded[k] for k in list(recorded)[:3]}
    one = setting_of("dpr-cache chunk 256", {}, 128)
    assert one["chunks"] == [1, 1]
    assert chunks_text([1, 1], "dpr-cache") == (
        "one chunk a tower: nothing re-encoded, no GradCache work"
    )
    assert chunks_text([1, 1], "GradCache library") == "one chunk a tower"
    assert chunks_text([16, 32], "dpr-cache", prose=True) == "16 + 32 chunks a step"
    assert chunks_text(None, "CachedMNRL tokens") == "chunks by tokens"
    assert chunks_text([1, 1], "full batch") == "the whole batch"


def test_the_cost_of_a_chunk_is_fitted_per_engine_and_shown_by_chunk():
    from benchmarks.gpu.report import chunk_cost_fit, render_speed

    fit = chunk_cost_fit([(3, 0.3 + 0.003 * 3), (12, 0.3 + 0.003 * 12), (48, 0.3 + 0.003 * 48)])
    assert fit["b_ms"] == pytest.approx(3.0) and fit["a_s"] == pytest.approx(0.3)
    assert fit["largest_residual_ms"] == pytest.approx(0.0, abs=1e-9) and fit["chunks"] == [3, 48]
    assert chunk_cost_fit([(12, 1.0), (12, 1.1)]) is None  # one chunk count: no line
    comp = _comparison({**_step_rates(0.45, 3.0, 1.6), "full batch": 1024.0})
    speed = {"comparisons": [comp], "tokens": [{"batch": 512, "questions": 7, "passages": 9}]}
    page = "\n".join(render_speed(speed))
    assert "| dpr-cache chunk 32 | 862 | 0.594 | 16 + 32 |" in page, page
    assert "| dpr-cache chunk 512 | 1115 | 0.459 | 1 + 2 |" in page, page
    assert "| dpr-cache | 3.0 | 0.450 | chunks 32 to 512 (48 to 3 chunks a step) | 0 |" in page
    assert "| CachedMNRL | 4.8 | 0.720 | chunks 32 to 512 (48 to 3 chunks a step) | 0 |" in page
    assert "| full batch | 1024 | 0.500 | the whole batch |" in page


def _compiled_group(chunk: int, compiled_rate: float, eager_rate: float, full: float) -> dict:
    """One compiled setting's group at B=512, fp16: it, the same eager, the full batch."""
    counts = {128: [4, 8], 32: [16, 32]}[chunk]
    rows = {
        f"dpr-cache chunk {chunk} compiled bucket 64": {
            "pairs_per_s": compiled_rate,
            "engine": "dpr-cache compiled bucket 64",
        },
        f"dpr-cache chunk {chunk} bucket 64": {
            "pairs_per_s": eager_rate,
            "engine": "dpr-cache bucket 64",
        },
    }
    for row in rows.values():
        row.update(step_s=512 / row["pairs_per_s"], chunk=str(chunk), chunks=counts)
    rows["full batch"] = {"pairs_per_s": full, "step_s": 512 / full, "engine": "full batch"}
    rows["full batch"].update(chunk=None, chunks=[1, 1], warmup_s=[0.6])
    rows[f"dpr-cache chunk {chunk} compiled bucket 64"]["warmup_s"] = [95.0, 3.0]
    best = {"full batch": {"setting": "full batch", "pairs_per_s": full}}
    return {"batch": 512, "precision": "fp16", "rounds": 2, "rows": rows, "best": best}


def test_a_goal_at_a_chunk_takes_its_fastest_setting_compiled_ones_against_their_own_full_batch():
    from benchmarks.gpu.report import render_compilation, speed_goals

    comp = _comparison({**_step_rates(0.45, 40.0, 1.6), "full batch": 1024.0})
    compiled = {
        "mode": "reduce-overhead",
        "comparisons": [
            _compiled_group(128, 1100.0, 700.0, 1000.0),
            _compiled_group(32, 1000.0, 400.0, 1010.0),
        ],
    }
    judged = {g["goal"]: g for g in speed_goals({"comparisons": [comp]}, compiled)}
    _, measured, _, met = judged["B=512 fp16, chunk 128: dpr-cache over the full batch"].values()
    assert met is True and measured.startswith(
        "1.10x: dpr-cache chunk 128 compiled bucket 64 (4 + 8 chunks a step), 1,100 pairs/s "
        "against full batch's 1,000; eager 0."
    ), measured
    _, measured, _, met = judged["B=512 fp16, chunk 32: dpr-cache over the full batch"].values()
    assert met is True and measured.startswith("0.99x: dpr-cache chunk 32 compiled"), measured
    _, cost, _, met = judged[
        "B=512 fp16: the cost of a chunk, dpr-cache (step = a + b x chunks a step, fitted)"
    ].values()
    # compiled, the two groups joined: (0.512 - 0.465) s over 36 chunks, 1.3 ms; eager 40 ms
    assert met is True and cost.startswith("1.3 ms: dpr-cache compiled bucket 64"), cost
    assert cost.endswith("; eager 40.0 ms"), cost
    page = "\n".join(render_compilation(compiled))
    assert "| dpr-cache chunk 128 compiled bucket 64 | 1100 | 0.465 | 4 + 8 | 95, 3 |" in page
    assert "| dpr-cache compiled bucket 64 | 1.3 |" in page, page  # the groups' joined fit
    assert page.count("| setting | pairs/s |") == 2


def test_a_compiled_variant_needs_compiled_towers():
    from benchmarks.gpu.perf import Variant, _variant_stepper

    with pytest.raises(ValueError, match="no compiled towers given"):
        _variant_stepper(None, Variant(4, length_bucket=8, compile_mode="default"))


def _stand_in_compiler(monkeypatch) -> list[tuple[list, str]]:
    """``compile_towers`` replaced where the suite calls it, compiling nothing: each call's
    towers and mode, recorded."""
    from benchmarks.gpu import compiled

    calls = []

    def compile_towers(towers, mode="default"):
        calls.append((towers, mode))
        return len({id(t) for t in towers})

    monkeypatch.setattr(compiled, "compile_towers", compile_towers)
    return calls


def test_the_compiled_checks_with_a_stand_in_compiler(monkeypatch):
    """The checks' logic on the CPU, the towers left eager: the float64 gradient equals the
    full batch's, the replayed re-forward equals the first pass and the control does not."""
    from benchmarks.gpu import compiled

    calls = _stand_in_compiler(monkeypatch)
    device = torch.device("cpu")
    fp64 = compiled.fp64_check(device, "default")
    assert fp64["ok"] and len(fp64["errors"]) == 3 and fp64["relative_error"] < 1e-12, fp64
    replay = compiled.replay_check(device, "default")
    assert replay["ok"] and replay["replayed"]["within_bound"] == replay["replayed"]["chunks"]
    assert replay["control_without_replay"]["largest"] > 1e-2 and replay["vs_eager_first_pass"] == 0
    assert [(len(towers), mode) for towers, mode in calls] == [(2, "default"), (2, "default")]


def test_the_compiled_rate_with_a_stand_in_compiler(monkeypatch, tmp_path):
    from benchmarks.gpu import compiled, suite
    from benchmarks.gpu.perf import Variant

    calls = _stand_in_compiler(monkeypatch)
    variants = [Variant(4, length_bucket=8, compile_mode="default")]
    found = dict(
        compiled.speed(
            suite.TINY, suite.SQUAD, tmp_path / "squad", torch.device("cpu"), variants, 8, 1, "fp32"
        )
    )
    (group,) = found["comparisons"]
    rows = group["rows"]
    on, eager = rows["dpr-cache chunk 4 compiled bucket 8"], rows["dpr-cache chunk 4 bucket 8"]
    assert len(on["warmup_s"]) == 2 and len(eager["warmup_s"]) == 1, rows
    assert on["chunks"] == [2, 4] and "pairs_per_s" in rows["full batch"]
    assert found["compile_call_s"] >= 0
    assert [mode for _, mode in calls] == ["default"]  # once, before the first group


def test_a_compiled_childs_figures_and_compilations_are_kept_when_it_stops(monkeypatch):
    from benchmarks.gpu import compiled

    stdout = "\n".join(
        [
            '{"key": "fp64", "value": {"relative_error": 1e-14}}',
            "    compile 1 ended: 12.5 s",
            "    dpr-cache chunk 128 compiled: warm-up 80.0 s",
            "    compile 2 ended: 3.0 s",
        ]
    )
    run = {"rc": None, "seconds": 150.0, "stdout": stdout, "stderr": "a\nThread 0x1 (most"}
    monkeypatch.setattr(compiled, "child", lambda cmd, timeout, on_start=None: run)
    found = compiled._in_child("exact", {}, 150)
    assert found["fp64"] == {"relative_error": 1e-14} and found["compiles_s"] == [12.5, 3.0]
    assert found["error"]["why"] == "out of time after 150 s"
    assert "dpr-cache chunk 128 compiled: warm-up 80.0 s" in found["error"]["progress"]


def test_a_started_child_is_killed_alone_when_its_wait_runs_out_of_time(tmp_path):
    import os
    import time

    from benchmarks.gpu.cli import Started, child

    pid = tmp_path / "pid"
    code = f"import os, time\nopen({str(pid)!r}, 'w').write(str(os.getpid()))\ntime.sleep(60)"
    started = Started(lambda on_start: child([sys.executable, "-c", code], 120, on_start=on_start))
    _wait_for(pid)
    begin = time.monotonic()
    with _time_up_after(2), pytest.raises(TimeoutError):
        started.result()
    assert time.monotonic() - begin < 20
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # killed: reaped by its thread
        try:
            os.kill(int(pid.read_text()), 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        raise AssertionError("the started child is still running")
    quick = Started(
        lambda on_start: child([sys.executable, "-c", "print(1)"], 30, on_start=on_start)
    )
    assert quick.result()["rc"] == 0


def test_encoding_passages_have_nqs_100_words(tmp_path):
    import csv

    from benchmarks.gpu import suite
    from benchmarks.gpu.perf import _passages_tsv
    from dpr_cache.data.squad import build_squad

    build_squad(suite.SQUAD, tmp_path / "squad")
    tsv = _passages_tsv(tmp_path / "squad", tmp_path / "p.tsv", 3000)
    with open(tsv, newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    assert len(rows) == 3000 and {len(r["text"].split()) for r in rows} == {100}
    assert len({r["text"] for r in rows}) > 2000  # the corpus's own passages before repeats


def test_compiled_rows_and_checks_on_the_page():
    from benchmarks.gpu import report

    exact = {
        "mode": "reduce-overhead",
        "seconds": 61.0,
        "compiles_s": [10.0, 5.0],
        "fp64": {"case": "tiny: B=8", "errors": [1e-14] * 3, "relative_error": 1e-14,
                 "bound": 1e-10, "step_s": [40.0, 0.1, 0.1], "length_bucket": 16, "ok": True},
        "replay": {"dropout": 0.1, "bound": 1e-4, "ok": True, "vs_eager_first_pass": 0.0,
                   "replayed": {"chunks": 9, "within_bound": 9, "largest": 2e-7},
                   "control_without_replay": {"chunks": 9, "within_bound": 0, "largest": 0.4}},
        "compiler": {"stats": {"unique_graphs": 4}, "recompiles": 3, "graph_breaks": 0,
                     "recompile_limit": 8},
    }  # fmt: skip
    lines = "\n".join(report._figures({"compiled": exact}))
    assert "compiled: mode reduce-overhead; seconds 61; compiles s 10, 5." in lines
    assert "length bucket 16" in lines and "step s 40, 0.1, 0.1" in lines
    assert "replayed chunks 9, within bound 9, largest 2e-07; control without replay" in lines
    assert "recompiles" not in lines  # the compiler's counters: in gpu.json only
    exact_rows = {
        "fp64": [{"relative_error": 1e-14}],
        "replay": [{"precision": "fp32", "ok": True}],
    }
    judged = report._exactness_goals({**exact_rows, "compiled": exact})
    assert [g["met"] for g in judged] == [True, True, True, True]
    assert judged[2]["goal"] == "fp64, B=8, chunk 3, towers compiled: GradCache = eager full batch"
    not_run = {"not_run": "a dry run compiles nothing"}
    assert report._figures({"compiled": not_run})[-1] == (
        "Figures: compiled not run a dry run compiles nothing."
    )
    judged = report._exactness_goals({**exact_rows, "compiled": not_run})
    assert [g["met"] for g in judged[2:]] == [None, None]
    child = {"why": "out of time after 150 s", "last_lines": ["x"], "progress": ["y"]}
    stopped = {"mode": "reduce-overhead", "seconds": 150.0, "compiles_s": [30.0], "error": child}
    page = "\n".join(report.render_compilation(stopped))
    assert "compiles s 30." in page and "error: why out of time after 150 s." in page
    assert "error, last lines:\n\n```\nx\n```" in page


def test_the_whole_suites_minutes_say_what_compilation_took():
    done = {
        "speed": {"result": {"comparisons": []}, "seconds": 140.0},
        "compilation": {"result": {"mode": "reduce-overhead", "comparisons": []}, "seconds": 150.0},
    }
    report = {
        "dry_run": False,
        "environment": _DEVICE,
        "planned": ["speed", "compilation"],
        "sections": done,
        "seconds": 480.0,
        "only": None,
    }
    (suite,) = [g for g in goals(report) if g["goal"] == "the whole suite in one run"]
    assert suite["measured"] == "8.0 min (of which compilation 150 s)" and suite["met"] is False
