"""The package's layers, read from the source: imports point one way, ``Config`` stays at the
edge, and no module but ``config.py`` writes a config key's default again. A module's imports
are every ``import`` / ``from`` statement in it (lazy ones too) and every ``"dpr_cache.x"``
string it names (the lazy maps of the ``__init__`` files, ``{"name": "dpr_cache.x"}``, giving
``dpr_cache.x.name``)."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from dpr_cache.config import Config
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
# the entry points that read a whole Config (or load one) and hand its sections on
CONFIG_EDGE = {
    "__init__.py",  # load_config, public API
    "cli/app.py",
    "train/loop.py",
    "train/resume.py",
    "train/settle.py",
    "train/trainer.py",
    "train/bench.py",
    "train/step.py",  # build_step: the step a Config describes
    "train/verify.py",
    "train/watch_setup.py",
    "retrieval/drivers/index.py",
    "retrieval/drivers/eval.py",
    "retrieval/drivers/overrides.py",
}
WHOLE_CONFIG = {"dpr_cache.config.Config", "dpr_cache.config.load_config"}
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
    "drivers": {
        "drivers",
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
        elif isinstance(node, ast.Dict):  # a lazy map: {"name": "dpr_cache.x"}
            for key, value in zip(node.keys, node.values, strict=True):
                if isinstance(key, ast.Constant) and isinstance(value, ast.Constant):
                    if str(value.value).startswith("dpr_cache."):
                        names.add(f"{value.value}.{key.value}")
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
    """Only the entry points read a whole ``Config``; the parts below take its sections."""
    users = {
        str(p.relative_to(PACKAGE))
        for p in _modules()
        if _imports(p) & WHOLE_CONFIG and p.name != "config.py"
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
    """Dense search knows nothing of BM25, fusion or mining; only drivers/ sits on top."""
    room = _room(path)
    wrong = _rooms(_imports(path)) - ROOMS_ALLOWED[room]
    assert not wrong, f"{path.relative_to(REPO)} ({room}) imports {sorted(wrong)}"


def test_only_the_drivers_read_a_config() -> None:
    readers = {
        str(p.relative_to(RETRIEVAL)) for p in RETRIEVAL.rglob("*.py") if _imports(p) & WHOLE_CONFIG
    }
    assert readers and all(r.startswith("drivers/") for r in readers), sorted(readers)


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


# where the functions and specs below the config live, whose parameters and fields could
# write a config key's default again
DEFAULTS_CHECKED = ("retrieval", "train", "cli")


def _config_defaults() -> dict[str, list[tuple[str, Any]]]:
    """Each config key's name -> (key, default) of every section holding a key of that name."""
    keys: dict[str, list[tuple[str, Any]]] = {}
    for section, field in Config.model_fields.items():
        model = field.annotation
        if isinstance(model, type) and issubclass(model, BaseModel):
            for name, inner in model.model_fields.items():
                default = inner.get_default(call_default_factory=True)
                keys.setdefault(name, []).append((f"{section}.{name}", default))
        else:
            keys.setdefault(section, []).append((section, field.get_default()))
    return keys


def _declared_defaults(tree: ast.AST) -> list[tuple[str, ast.expr]]:
    """Every (name, default) a module declares: its functions' parameters with a default, and
    the fields of its classes (``name: type = value``: dataclass, pydantic, NamedTuple)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            a = node.args
            positional = a.posonlyargs + a.args
            pairs = zip(positional[len(positional) - len(a.defaults) :], a.defaults, strict=True)
            found += [(arg.arg, default) for arg, default in pairs]
            found += [(arg.arg, d) for arg, d in zip(a.kwonlyargs, a.kw_defaults, strict=True) if d]
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.AnnAssign) and item.value is not None:
                    if isinstance(item.target, ast.Name):
                        found.append((item.target.id, item.value))
    return found


def _rewritten_defaults(source: str, keys: dict[str, list[tuple[str, Any]]]) -> list[str]:
    """The parameters and fields of ``source`` named like a config key whose default is written
    as a literal equal to that key's default: the default written a second time. A name the
    sections default differently (``precision``: fp32 for train, auto for index and eval) counts
    only where the literal is every such key's default; None ("not given") never counts, and a
    default looked up (``default_of``, a section's field) is not a literal."""
    wrong = []
    for name, node in _declared_defaults(ast.parse(source)):
        try:
            value = ast.literal_eval(node)
        except ValueError:
            continue  # not a literal: looked up, or computed
        same = [(k, d) for k, d in keys.get(name, []) if type(d) is type(value) and d == value]
        if value is not None and same and len(same) == len(keys[name]):
            named = ", ".join(k for k, _ in same)
            wrong.append(f"line {node.lineno}: {name} = {value!r} (the default of {named})")
    return wrong


@pytest.mark.parametrize(
    "path",
    [p for layer in DEFAULTS_CHECKED for p in sorted((PACKAGE / layer).rglob("*.py"))],
    ids=lambda p: str(p.relative_to(PACKAGE)),
)
def test_no_module_writes_a_config_default_again(path: Path) -> None:
    """A setting's default is written once, in ``config.py``: a spec field or a flag that
    mirrors a key takes it from there (``default_of``, or the section itself)."""
    wrong = _rewritten_defaults(path.read_text(encoding="utf-8"), _config_defaults())
    assert not wrong, f"{path.relative_to(REPO)}: " + "; ".join(wrong)


def test_the_default_checker_sees_a_default_written_again() -> None:
    """Negative control: a dataclass field, a flag's default and a keyword parameter that copy
    config defaults are reported; looked-up defaults, None, other values and a value only some
    sections' key of that name defaults to are not."""
    source = (
        "@dataclass\nclass Spec:\n    batch_size: int = 128\n    pooling: str | None = None\n"
        "    fusion_depth: int = default_of('eval.fusion_depth')\n    hnsw_m: int = 33\n"
        "    precision: str = 'fp32'\n"
        "def search(device: Annotated[str, typer.Option()] = 'auto', *, top_k=[1, 5, 20, 100],"
        " shard_size=50_000.0):\n    pass\n"
    )
    wrong = _rewritten_defaults(source, _config_defaults())
    assert [line.split(":")[1].split("=")[0].strip() for line in wrong] == [
        "batch_size",
        "device",
        "top_k",
    ]
