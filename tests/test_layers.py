"""The package's layers, read from the source: imports point one way, and ``Config`` stays at
the edge. A module's imports are every ``import`` / ``from`` statement in it (lazy ones too) and
every ``"dpr_cache.x"`` string it names (the lazy maps of the ``__init__`` files)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.support.fixtures import REPO

PACKAGE = REPO / "dpr_cache"
OUTSIDE = ("benchmarks.", "studies.", "tests.")  # beside the package, never installed
# layer -> the layers it may import (itself included); errors.py is below everything
ALLOWED = {
    "runtime": {"runtime", "errors"},
    "core": {"core"},
    "model": {"model", "data", "core", "runtime", "errors"},
    "data": {"data", "runtime", "errors"},
    "train": {"train", "retrieval", "model", "data", "core", "runtime", "errors", "config"},
    "retrieval": {"retrieval", "model", "data", "core", "runtime", "errors", "config"},
    "config": {"data", "runtime", "errors"},
    "errors": set(),
    "cli": {
        "cli",
        "train",
        "retrieval",
        "model",
        "core",
        "data",
        "runtime",
        "errors",
        "config",
    },
}
# the entry points that turn a Config into plain arguments
CONFIG_EDGE = {
    "__init__.py",  # load_config, public API
    "cli/app.py",
    "cli/mine.py",
    "cli/vectors.py",
    "train/loop.py",
    "train/trainer.py",
    "train/bench.py",
    "train/verify.py",
    "train/watch_setup.py",
    "retrieval/commands/index.py",
    "retrieval/commands/eval.py",
    "retrieval/commands/specs.py",
}
# the rooms of retrieval/ -> the rooms each may import (itself included)
RETRIEVAL = PACKAGE / "retrieval"
ROOMS_ALLOWED = {
    "dense": {"dense"},
    "lexical": {"lexical"},
    "fusion": {"fusion"},
    "metrics": {"metrics"},
    "results": {"results"},
    "hybrid": {"hybrid", "dense", "lexical", "fusion", "metrics", "results"},
    "mining": {"mining", "dense", "lexical", "metrics", "teacher"},
    "teacher": {"teacher", "dense", "lexical", "fusion"},
    "scoring": {"scoring", "teacher", "mining"},
    "commands": {
        "commands",
        "teacher",
        "scoring",
        "dense",
        "lexical",
        "fusion",
        "hybrid",
        "mining",
        "metrics",
        "results",
    },
}


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _layer(path: Path) -> str:
    rel = path.relative_to(PACKAGE)
    if len(rel.parts) > 1:
        return rel.parts[0]
    return {"__init__": "cli", "__main__": "cli"}.get(rel.stem, rel.stem)  # the package's face


def _imports(path: Path) -> set[str]:
    """Every module name ``path`` imports, lazily or not (``from x import y`` gives x.y too)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names |= {f"{node.module}.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if node.value.startswith(OUTSIDE + ("dpr_cache.",)) and " " not in node.value:
                names.add(node.value)  # a module named to import later, or run with -m
    return names


def _project_layers(names: set[str]) -> set[str]:
    """The layers of the dpr_cache modules among ``names``."""
    layers = set()
    for name in names:
        parts = name.split(".")
        if parts[0] == "dpr_cache" and len(parts) > 1 and (PACKAGE / parts[1]).exists():
            layers.add(parts[1])
        elif parts[0] == "dpr_cache" and len(parts) > 1 and (PACKAGE / f"{parts[1]}.py").exists():
            layers.add(parts[1])
    return layers


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_point_down(path: Path) -> None:
    layer = _layer(path)
    wrong = _project_layers(_imports(path)) - ALLOWED[layer]
    assert not wrong, f"{path.relative_to(REPO)} ({layer}) imports {sorted(wrong)}"


def test_core_is_torch_only() -> None:
    for path in (PACKAGE / "core").glob("*.py"):
        third_party = {n.split(".")[0] for n in _imports(path)} - {"dpr_cache", "torch"}
        stdlib = {"__future__", "collections", "contextlib", "dataclasses", "functools", "math"}
        assert third_party <= stdlib, f"{path.name} imports {sorted(third_party - stdlib)}"


def test_config_stays_at_the_edge() -> None:
    users = {
        str(p.relative_to(PACKAGE))
        for p in _modules()
        if "dpr_cache.config" in _imports(p) and p.name != "config.py"
    }
    assert users == CONFIG_EDGE


def _room(path: Path) -> str:
    rel = path.relative_to(RETRIEVAL)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def _rooms(names: set[str]) -> set[str]:
    """The rooms of retrieval/ among the module names ``names``."""
    prefix = "dpr_cache.retrieval."
    return {n[len(prefix) :].split(".")[0] for n in names if n.startswith(prefix)}


@pytest.mark.parametrize(
    "path",
    [
        p
        for p in sorted(RETRIEVAL.rglob("*.py"))
        if p.name != "__init__.py" or p.parent != RETRIEVAL
    ],
    ids=lambda p: str(p.relative_to(RETRIEVAL)),
)
def test_retrieval_rooms_import_one_way(path: Path) -> None:
    """Dense search knows nothing of BM25, fusion or mining; only commands/ sits on top."""
    room = _room(path)
    wrong = _rooms(_imports(path)) - ROOMS_ALLOWED[room]
    assert not wrong, f"{path.relative_to(REPO)} ({room}) imports {sorted(wrong)}"


def test_only_the_commands_read_a_config() -> None:
    readers = {
        str(p.relative_to(RETRIEVAL))
        for p in RETRIEVAL.rglob("*.py")
        if "dpr_cache.config" in _imports(p)
    }
    assert readers and all(r.startswith("commands/") for r in readers), sorted(readers)


def test_the_room_checker_sees_a_wrong_import(tmp_path: Path) -> None:
    """Negative control: dense code importing the miner is reported."""
    bad = tmp_path / "bad.py"
    bad.write_text("from dpr_cache.retrieval.mining.rules import drop_reason\n")
    assert _rooms(_imports(bad)) - ROOMS_ALLOWED["dense"] == {"mining"}


def test_the_package_imports_neither_benchmarks_nor_studies_nor_tests() -> None:
    """The harness, the studies and the tests' helpers sit beside the package: nothing
    installed may need them."""
    for path in _modules():
        outside = {n.split(".")[0] for n in _imports(path)} & {p.rstrip(".") for p in OUTSIDE}
        assert not outside, f"{path.relative_to(REPO)} imports {sorted(outside)}"


def test_the_checker_sees_a_wrong_import(tmp_path: Path) -> None:
    """Negative control: an upward import in a core module is reported."""
    bad = tmp_path / "bad.py"
    bad.write_text(
        "def f():\n    from dpr_cache.train.loop import train\n    import benchmarks\n"
        "    run('tests.support.cli')\n"
    )
    assert _project_layers(_imports(bad)) - ALLOWED["core"] == {"train"}
    assert {"benchmarks", "tests.support.cli"} <= _imports(bad)


def test_top_level_holds_at_most_eight_modules() -> None:
    assert len(list(PACKAGE.glob("*.py"))) <= 8
