"""The suite writes nothing under the home folder: its commands' caches (dpr-cache's Arrow and
BM25 caches, matplotlib's, the datasets library's) go where tests/conftest.py points them, a
temporary folder. Here the commands that write caches run with a fresh, empty home folder and
the suite's settings (nothing left in it afterwards), and, the control, without the setting of
dpr-cache's cache (its folder then appears in that home)."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import HOME_CACHES
from tests.support.cli import bm25_args, run_cli_env, toy_overrides


def _commands(tmp_path: Path) -> list[list[str]]:
    """Commands that cache: train (its data and plot), index and eval (the passages), mine
    (BM25), each on its default cache folder (no data.cache_dir, no --cache-dir)."""
    sets = toy_overrides(tmp_path, **{"train.max_steps": 2, "data.cache_dir": ""})
    return [
        ["train", "--config", "configs/toy.yaml", *sets, "-q"],
        ["index", "--config", "configs/toy.yaml", "--set", f"output_dir={tmp_path / 'run'}", "-q"],
        bm25_args("mine", tmp_path / "bm25.jsonl", "-q"),
    ]


def _files(home: Path) -> list[str]:
    return sorted(str(p.relative_to(home)) for p in home.rglob("*") if p.is_file())


def test_the_suite_s_commands_write_nothing_under_home(tmp_path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    for args in _commands(tmp_path / "a"):
        run_cli_env({"HOME": str(home)}, *args)
    assert _files(home) == []
    assert (Path(HOME_CACHES["XDG_CACHE_HOME"]) / "dpr-cache").is_dir()  # they cached there


def test_without_the_suite_s_cache_setting_the_cache_lands_under_home(tmp_path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    for args in _commands(tmp_path / "b")[2:]:
        run_cli_env({"HOME": str(home), "XDG_CACHE_HOME": None}, *args)
    assert any(name.startswith(".cache/dpr-cache/") for name in _files(home))
