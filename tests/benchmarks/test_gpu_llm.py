"""The GPU suite's ``llm`` section (decoder LLMs, issue 57): its dry run alone through the suite's
command (``--only llm``) on two tiny decoders, the largest full batch's search, and the page's
goals judged on figures made up to sit on either side of each."""

from __future__ import annotations

import json

import pytest

from benchmarks.gpu.llm import linear_prediction, search_largest
from benchmarks.gpu.report import goals, markdown
from tests.support.cli import run_benchmark


def dry_section(tmp_path_factory, section: str, timeout: float) -> tuple[dict, str]:
    """The suite's dry run of ``section`` alone: its gpu.json and page."""
    out = tmp_path_factory.mktemp(f"gpu-{section}")
    proc = run_benchmark("gpu", "--out", str(out), "--dry-run", "--only", section, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((out / "gpu.json").read_text()), (out / "gpu.md").read_text()


@pytest.fixture(scope="module")
def dry_llm(tmp_path_factory):
    return dry_section(tmp_path_factory, "llm", 600)


def test_the_dry_run_measures_every_part_on_both_tiny_decoders(dry_llm):
    report, _ = dry_llm
    sections = report["sections"]
    names = list(sections)  # llm last but fsdp, which leaves its process group at its end
    assert names.index("fsdp") == names.index("llm") + 1 and report["planned"] == ["llm"]
    assert set(names[names.index("fsdp") + 1 :]) <= {"rank_faults"}
    assert sections["exactness"] == {"skipped": "not asked for (--only), none in gpu.json"}
    llm = sections["llm"]
    assert "result" in llm, (llm.get("error"), llm.get("traceback"))
    big, small = llm["result"]["models"]
    assert (big["big"], small["big"]) == (True, False)
    assert big["shape"]["family"] == "mistral" and small["shape"]["family"] == "qwen2"
    for model in (big, small):
        assert "error" not in model, model["error"]
        # the trainer was built from a config asking for the model that was built
        assert model["trainer_asked"] == {
            "shared": True,
            "pooling": "last",
            "gradient_checkpointing": True,
            "dtype": "bf16",
            "normalize": False,
            "lora": {"r": 16, "alpha": 32.0, "dropout": 0.1, "target_modules": "all-linear"},
        }
        assert model["base_dtype"] == "torch.bfloat16"
        assert model["trainable_dtypes"] == ["torch.float32"]
        assert 0 < model["trainable"] < model["parameters"]
        assert [row["batch"] for row in model["memory"]] == [4, 8, 16]
        assert all(row["fits"] and row["step_s"] > 0 for row in model["memory"]), model["memory"]
        assert [row["chunk"] for row in model["memory"]] == [2, 2, 2]
        speed = model["speed"]
        assert speed["batch"] == 8
        assert set(speed["rows"]) == {"dpr-cache chunk 2", "full batch", "CachedMNRL rows 2"}
        assert all(row["pairs_per_s"] > 0 for row in speed["rows"].values()), speed["rows"]
    assert "largest_full_batch" not in small  # the goals' decoder alone is searched
    full = big["largest_full_batch"]
    # doubling from 2 to 16 (out of memory above the pretended 11), then bisection to 2
    assert list(full["tried"]) == ["2", "4", "8", "16", "12", "10"]
    assert (full["batch"], full["first_too_large"], full["resolution"]) == (10, 12, 2)
    assert full["pretended_limit"] == 11 and full["pairs_per_s"] > 0 and not full["predicted"]


def test_the_page_states_the_goals_beside_the_figures(dry_llm):
    report, page = dry_llm
    judged = [g for g in report["goals"] if g["goal"].startswith("tiny (Mistral family) shape")]
    assert [g["target"] for g in judged] == ["<= 80 GB", "<= 1.2x", ">= 1.3x", ">= 0.8x"]
    assert all("measured" in g and g["measured"] != "not measured" for g in judged), judged
    table, section = page.split("## Goals\n")[1].split("## Llm\n")
    assert all(f"| {g['goal']} | {g['measured']} | {g['target']} |" in table for g in judged)
    assert "### tiny (Mistral family) (2 layers x 32" in section
    assert "### tiny (Qwen2 family)" in section
    assert "| CachedMNRL rows 2 |" in section and "| dpr-cache chunk 2 |" in section
    assert "largest full batch: batch 10; first too large 12;" in section
    assert "largest full batch, tried:" in section and "pretended limit 11" in section


def _fits_below(limit: int, calls: list[int]):
    def fits(b: int) -> dict:
        calls.append(b)
        ok = b <= limit
        return {"fits": ok, "peak_bytes": 100 + 10 * b if ok else None, "resident_bytes": 100}

    return fits


def test_the_search_doubles_then_bisects_to_its_granularity():
    calls: list[int] = []
    found = search_largest(_fits_below(700, calls), 128, 32)
    assert calls == [128, 256, 512, 1024, 768, 640, 704, 672]
    assert (found["batch"], found["first_too_large"], found["resolution"]) == (672, 704, 32)
    calls.clear()
    assert search_largest(_fits_below(10, calls), 128, 32)["batch"] is None
    assert calls == [128, 64, 32]  # none fits: halved down to one step


def test_a_prediction_places_the_tries_and_time_stops_the_search():
    calls: list[int] = []
    # peaks 100 + 10 b bytes: 97% of 7,100 bytes is reached at b = 678.7
    predict = linear_prediction(capacity=7100)
    found = search_largest(_fits_below(700, calls), 128, 32, predict=predict)
    assert calls == [128, 256, 512, 672, 704]  # capped doubling, then one step past it
    assert (found["batch"], found["first_too_large"]) == (672, 704)
    # one fitting try: the line runs through the memory resident before it
    assert predict({128: {"fits": True, "peak_bytes": 1380, "resident_bytes": 100}}) == 678
    assert predict({128: {"fits": False, "peak_bytes": None}}) is None
    calls.clear()
    found = search_largest(
        _fits_below(700, calls), 128, 32, time_ok=lambda b, tried: "no time" if b > 300 else None
    )
    assert calls == [128, 256] and found["batch"] == 256
    assert found["stopped"] == "B=512 not tried: no time" and found["resolution"] is None


_DEVICE = {
    "device": "cuda:0",
    "device_name": "H200",
    "memory_bytes": 150e9,
    "torch": "2.11",
    "cuda": "13.0",
    "python": "3.12",
    "date": "today",
    "host": {"cpu": "x", "cores": 16, "transformers": "5"},
}


def _llm(peak_64: float, peak_1024: float | None, ours: float, cmnrl: float, full: float) -> dict:
    """A made-up ``llm`` result of the 7B: peaks in GB (None: B = 1,024 out of memory)."""

    def row(b: int, gb: float | None) -> dict:
        fits = gb is not None
        return {"batch": b, "chunk": 32, "fits": fits, "peak_bytes": gb and gb * 1e9, "step_s": 1}

    speed_rows = {
        "dpr-cache chunk 32": {"engine": "dpr-cache", "pairs_per_s": ours, "step_s": 256 / ours},
        "full batch": {"engine": "full batch", "failed": "out of memory"},
        "full batch B=128": {"engine": "full batch", "pairs_per_s": full, "step_s": 128 / full},
        "CachedMNRL rows 32": {"engine": "CachedMNRL", "pairs_per_s": cmnrl, "step_s": 1},
    }
    shape = {
        "name": "Mistral-7B",
        "family": "mistral",
        "layers": 32,
        "hidden": 4096,
        "heads": 32,
        "kv_heads": 8,
        "intermediate": 14336,
        "vocab": 32000,
    }
    big = {
        "shape": shape,
        "big": True,
        "memory": [row(64, peak_64), row(256, peak_64), row(1024, peak_1024)],
        "speed": {
            "batch": 256,
            "precision": "bf16",
            "rounds": 1,
            "warmups": 0,
            "rows": speed_rows,
        },
        "largest_full_batch": {
            "batch": 200,
            "first_too_large": 232,
            "resolution": 32,
            "pairs_per_s": full * 0.9,
            "peak_bytes": 130e9,
            "tried": {
                "128": {"fits": True, "peak_bytes": 90e9},
                "256": {"fits": False, "peak_bytes": None},
            },
            "stopped": None,
            "predicted": True,
        },
    }
    plan = {
        "q_len": 64,
        "p_len": 256,
        "chunk": 32,
        "speed_batch": 256,
        "memory_batches": [64, 256, 1024],
        "dtype": "bf16",
        "precision": "bf16",
        "lora": {"r": 16, "alpha": 32, "dropout": 0.1, "target_modules": "all-linear"},
    }
    return {"plan": plan, "models": [big]}


def _report(llm: dict) -> dict:
    return {"dry_run": False, "environment": _DEVICE, "sections": {"llm": llm}}


def _judged(result: dict, section: str = "result") -> dict[str, bool | None]:
    body = {section: result, "seconds": 300.0}
    if section == "partial":
        body["error"] = "SectionTimeout: stopped after 500 s"
    report = _report(body)
    return {g["goal"].split(": ", 1)[1]: g["met"] for g in goals(report) if "Mistral" in g["goal"]}


@pytest.mark.parametrize(
    "figures, met",
    [
        ((20.0, 23.5, 10.0, 7.5, 12.0), [True, True, True, True]),
        ((20.0, 24.5, 10.0, 8.0, 12.6), [True, False, False, False]),
        ((60.0, 81.0, 10.0, 7.5, 12.0), [False, False, True, True]),
        ((20.0, None, 10.0, 7.5, 12.0), [False, None, True, True]),
    ],
)
def test_the_goals_are_judged_on_either_side(figures, met):
    judged = _judged(_llm(*figures))
    assert list(judged.values()) == met, judged
    assert list(judged) == [
        "B=1,024 in one step",
        "memory at B=1,024 over B=64",
        "B=256, dpr-cache over CachedMNRL (same adapter, mini-batch 32)",
        "B=256, dpr-cache over the largest full batch that fits",
    ]


def test_a_section_cut_short_shows_and_judges_what_it_measured():
    result = _llm(20.0, 23.5, 10.0, 7.5, 12.0)
    big = result["models"][0]
    big["memory"][2] = {"batch": 1024, "chunk": 32, "skipped": "out of time: about 90 s needed"}
    del big["largest_full_batch"]
    judged = _judged(result, "partial")
    assert judged["B=1,024 in one step"] is None and judged["memory at B=1,024 over B=64"] is None
    assert judged["B=256, dpr-cache over the largest full batch that fits"] is True  # B=128's
    report = _report({"error": "SectionTimeout: stopped", "seconds": 500.0, "partial": result})
    page = markdown({**report, "goals": goals(report)})
    assert "What it measured before it stopped:" in page
    assert "| 1,024 | 32 | – | – | – | out of time: about 90 s needed |" in page
    assert "not measured (out of time: about 90 s needed)" in page
    assert "| full batch B=128 | full batch | 12 | 10.667 | – |" in page
