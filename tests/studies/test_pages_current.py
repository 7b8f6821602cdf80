"""Each study's committed page and its block of docs/studies.md are what its table writes from the
committed ``results.json`` (and, for the teachers' study, the GPU suite's ``docs/bench/gpu.json``):
a figure changed in one place is changed everywhere it is shown."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.fixtures import REPO

STUDIES = ["squad_batch_size", "squad_hard_negatives", "squad_teachers", "squad_crossfit"]


def _write_pages(study: str, kept: Path, tmp: Path) -> tuple[str, str]:
    """The page and docs/studies.md that ``study``'s table writes from ``kept`` (into ``tmp``)."""
    readme = tmp / "studies.md"
    shutil.copy(REPO / "docs" / "studies.md", readme)
    out = ["--runs", str(tmp / "no-runs"), "--md", str(tmp / "results.md")]
    out += ["--png", str(tmp / "plot.png"), "--readme", str(readme)]
    if study == "squad_batch_size":
        kept_args = ["--kept", str(kept)]
    else:  # the other tables read results.json beside --md
        if kept != tmp / "results.json":
            shutil.copy(kept, tmp / "results.json")
        kept_args = ["--kept"]
    subprocess.run(
        [sys.executable, "-m", f"studies.{study}.table", *kept_args, *out],
        cwd=REPO,
        check=True,
        capture_output=True,
    )
    return (tmp / "results.md").read_text(), readme.read_text()


@pytest.mark.parametrize("study", STUDIES)
def test_a_studys_page_and_readme_block_are_its_tables_output(study: str, tmp_path: Path) -> None:
    page, readme = _write_pages(study, REPO / "studies" / study / "results.json", tmp_path)
    assert page == (REPO / "studies" / study / "results.md").read_text()
    assert readme == (REPO / "docs" / "studies.md").read_text()


def test_a_changed_figure_changes_the_readme(tmp_path: Path) -> None:
    """Negative control: the comparison above sees one figure changed in results.json."""
    data = json.loads((REPO / "studies/squad_teachers/results.json").read_text())
    data["arms"][0]["top1"] = 12.34
    kept = tmp_path / "results.json"
    kept.write_text(json.dumps(data))
    page, readme = _write_pages("squad_teachers", kept, tmp_path)
    assert readme != (REPO / "docs" / "studies.md").read_text() and "| 12.3 |" in readme
    assert page != (REPO / "studies/squad_teachers/results.md").read_text()
