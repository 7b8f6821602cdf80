"""Every command the README shows runs as printed, on a copy of the checkout after ``make demo``
(the installed package and this venv on ``PATH``, as after ``source .venv/bin/activate``).
``make demo`` runs the installed ``dpr-cache``; the commands after it find the test's stand-ins
for ``dpr-cache`` and ``python`` first on ``PATH``, which fork them from the tests' server with
their imports done (:mod:`tests.support.forkserver`), or run them in a fresh interpreter where
their environment is not the server's.

Each command of a ``bash`` block is of one kind, and a command of no kind fails this test:
- the demo's pipeline: the very lines of the Makefile's ``demo`` recipe, its fresh start
  included, so the block runs as printed (``make demo`` runs them);
- run: runs as printed, in README order, and exits 0;
- network: needs the internet (DPR's files, a hub model); run with every download sent to a port
  where nothing listens, it must stop at once with a one-line ``error:`` and exit 2 (the headline
  command's model download is shown failing clearly in ``tests/model/test_hub.py``);
- long: hours of measuring, shown on the docs page of its figures (not the README); each is
  rehearsed at toy size by the test named beside it.
The README's Python blocks run too (the engine example in ``test_readme_example.py``).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dpr_cache.runtime.processes import child_env
from tests.support.cli import fork_bin
from tests.support.fixtures import REPO

VENV = Path(sys.prefix)  # this venv (its bin/ holds dpr-cache and python)
SETUP = {"make demo", "make test"}  # README's two set-up commands: this test and CI run them
NETWORK = {"dpr-cache data nq --gunzip", "dpr-cache train --config configs/nq_bs512.yaml"}
LONG = {  # on the pages they moved to: each is rehearsed at toy size by the test beside it
    "python -m benchmarks.realtext --out docs/bench": (
        "docs/performance.md",
        "tests/benchmarks/test_realtext.py",
    ),
    "python -m benchmarks.synthetic --peers --out docs/bench": (
        "docs/performance.md",
        "tests/benchmarks/test_synthetic.py",
    ),
    "studies/squad_batch_size/run.sh": ("docs/studies.md", "tests/studies/test_run_dry.py"),
}
README_MAX_BYTES = 20_000  # the path a newcomer walks; the studies and figures are in docs/


def _blocks(language: str, page: str = "README.md") -> list[str]:
    text = (REPO / page).read_text(encoding="utf-8")
    return re.findall(rf"```{language}\n(.*?)```", text, re.S)


def readme_commands(page: str = "README.md") -> list[str]:
    """The commands of the README's (or another page's) bash blocks, in order: continuation
    lines joined, comments and blank lines dropped."""
    commands = []
    for block in _blocks("bash", page):
        for line in block.replace("\\\n", " ").splitlines():
            command = " ".join(re.sub(r"(^|\s)#.*$", "", line).split())
            if command:
                commands.append(command)
    return commands


def demo_commands() -> list[str]:
    """The lines of the Makefile's demo recipe (the fresh start, then the pipeline), as a user
    types them."""
    recipe = (REPO / "Makefile").read_text().split("\ndemo:", 1)[1].split("\n\n", 1)[0]
    lines = [line.strip().replace("$(VENV)/bin/", "") for line in recipe.splitlines()[1:]]
    return [" ".join(line.split()) for line in lines if line.startswith(("dpr-cache", "rm -rf"))]


def _copy_checkout(dest: Path) -> None:
    """The checkout's files as a fresh clone has them (tracked, and new files not ignored)."""
    listed = (
        subprocess.run(
            ["git", "ls-files", "-co", "--exclude-standard", "-z"],
            cwd=REPO,
            check=True,
            capture_output=True,
        )
        .stdout.decode()
        .split("\0")
    )
    for name in filter(None, listed):
        if (REPO / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, dest / name)


def _env(*first: str, **extra: str) -> dict[str, str]:
    env = child_env()
    return {**env, "PATH": os.pathsep.join([*first, str(VENV / "bin"), env["PATH"]]), **extra}


def _run(command: str, cwd: Path, forked: bool = False, **extra: str):
    """``command`` in bash, the installed commands on ``PATH`` (``forked``: the stand-ins
    first)."""
    env = _env(fork_bin(), **extra) if forked else _env(**extra)
    return subprocess.run(
        ["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )


def test_every_command_has_a_kind() -> None:
    shown = readme_commands()
    assert demo_commands() and all(c in shown for c in demo_commands())
    assert all(c in shown for c in SETUP | NETWORK)  # no kind lists a stale command
    for command, (page, rehearsal) in LONG.items():
        assert command not in shown and command in readme_commands(page), (command, page)
        assert (REPO / rehearsal).is_file(), (command, rehearsal)


def test_the_readme_starts_with_the_set_up_and_stays_short() -> None:
    assert readme_commands()[:2] == ["make demo", "make test"]
    size = len((REPO / "README.md").read_bytes())
    assert size < README_MAX_BYTES, f"README.md is {size} bytes"


def _links(page: Path) -> list[str]:
    """The relative targets of a Markdown page's links and images (no web address, no anchor)."""
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    targets = re.findall(r"\]\(([^)\s]+)\)", text)
    return [t.split("#")[0] for t in targets if not re.match(r"[a-z]+:|#", t)]


@pytest.mark.parametrize(
    "page", ["README.md", *sorted(p.name for p in (REPO / "docs").glob("*.md"))]
)
def test_every_link_leads_to_a_file(page: str) -> None:
    """The README and each page of docs/ (where the README's studies and figures moved) link
    only to files that are there."""
    path = REPO / page if page == "README.md" else REPO / "docs" / page
    links = _links(path)
    missing = [t for t in links if not (path.parent / t).exists()]
    assert not missing, (page, missing)
    if page == "README.md":  # each page the README's figures and claims moved to is linked
        moved = ["setup", "commands", "proofs", "performance", "studies", "architecture"]
        assert all(f"docs/{name}.md" in links for name in moved), links


@pytest.fixture(scope="module")
def checkout(tmp_path_factory) -> Path:
    """A copy of the checkout after ``make demo``."""
    root = tmp_path_factory.mktemp("clone")
    _copy_checkout(root)
    stamp = VENV / ".installed"  # the venv is installed already: make must not install again
    done = _run(f"make demo VENV={VENV} -o {stamp}", root)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "questions: 263" in done.stdout
    (root / "runs" / "demo.stdout").write_text(done.stdout)  # for the README's expected table
    return root


def test_the_demo_writes_what_the_readme_says_train_writes(checkout: Path) -> None:
    """The README's comment on ``train`` names every entry the demo's train wrote (index and
    eval come after it, each naming its own)."""
    line = next(c for c in _blocks("bash")[1].splitlines() if c.startswith("dpr-cache train"))
    said = re.search(r"runs/toy/\{(.*?)\}", line)[1].split(",")
    wrote = [p.name + ("/" if p.is_dir() else "") for p in (checkout / "runs" / "toy").iterdir()]
    wrote = sorted(n for n in wrote if not n.startswith(".") and n not in ("index/", "eval/"))
    assert sorted(said) == wrote


def test_every_command_runs_as_printed(checkout: Path) -> None:
    skip = set(demo_commands()) | SETUP | NETWORK | set(LONG)
    ran = []
    for command in readme_commands():
        if command in skip:
            continue
        done = _run(command, checkout, forked=True)
        assert done.returncode == 0, f"{command}\n{done.stderr[-3000:]}"
        ran.append(command)
        if command.startswith("dpr-cache verify"):
            assert "verdict: equal" in done.stdout, command
    assert any(c.startswith("dpr-cache export") for c in ran)
    assert (checkout / "runs/toy-cls/dpr-hf/question_encoder/config.json").is_file()
    assert (checkout / "runs/vecs/run.trec").stat().st_size > 0
    assert (checkout / "runs/toy-beir/eval/metrics.json").is_file()


def test_the_python_examples_run_on_the_demo_model(checkout: Path) -> None:
    [st_example] = [b for b in _blocks("python") if "SentenceTransformer" in b]
    done = _run(
        f"python - <<'EOF'\n{st_example}\nprint(questions.shape, passages.shape)\nEOF", checkout
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["(1,", "64)", "(1,", "64)"]


@pytest.mark.parametrize("command", sorted(NETWORK))
def test_a_network_command_stops_at_once_with_one_line(command: str, checkout: Path) -> None:
    nowhere = "http://127.0.0.1:9"  # nothing listens: no download can start, online or not
    done = _run(
        command,
        checkout,
        HF_HUB_OFFLINE="0",
        HF_ENDPOINT=nowhere,
        HTTPS_PROXY=nowhere,
        HTTP_PROXY=nowhere,
        https_proxy=nowhere,
        http_proxy=nowhere,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr[-2000:]


def _numbers_apart(line: str) -> tuple[str, list[float]]:
    """A line's text with each number replaced by #, and its numbers."""
    pattern = r"(?<![\w@])\d+(?:\.\d+)?"
    return re.sub(pattern, "#", line), [float(n) for n in re.findall(pattern, line)]


def test_the_demo_prints_the_readmes_expected_table(checkout: Path) -> None:
    """The table the README shows under the set-up is what ``make demo`` prints: the same lines
    and, as the README says figures may differ slightly by machine, each figure within 3 points
    (a question is 0.38 of them); the number of questions exactly."""
    [expected] = [b for b in _blocks("text") if "hit rate" in b]
    printed = (checkout / "runs" / "demo.stdout").read_text().splitlines()
    start = next(i for i, line in enumerate(printed) if "hit rate" in line)
    printed = printed[start : start + len(expected.splitlines())]
    assert len(printed) == len(expected.splitlines()), printed
    for shown, got in zip(expected.splitlines(), printed, strict=True):
        (shown_text, shown_numbers), (got_text, got_numbers) = map(_numbers_apart, (shown, got))
        assert shown_text.split() == got_text.split(), (shown, got)
        for a, b in zip(shown_numbers, got_numbers, strict=True):
            assert abs(a - b) <= (0 if "questions" in shown else 3.0), (shown, got)
