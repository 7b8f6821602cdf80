"""The committed benchmark pages are what ``python -m benchmarks.pages`` writes from the figures
saved beside them, and a changed figure changes its page."""

from __future__ import annotations

import json
import shutil

from benchmarks.pages import PAGES, write_pages
from tests.support.fixtures import REPO

BENCH = REPO / "docs" / "bench"


def test_every_page_is_written_again_from_its_saved_figures(tmp_path) -> None:
    written = write_pages(BENCH, tmp_path)
    assert len(written) == len(PAGES)
    for page in written:
        name = page.relative_to(tmp_path)
        assert page.read_text() == (BENCH / name).read_text(), name


def test_a_changed_figure_changes_its_page(tmp_path) -> None:
    source = tmp_path / "source"
    shutil.copytree(BENCH, source)
    saved = json.loads((source / "bench.json").read_text())
    saved["targets"][0]["value"] = 123.456
    (source / "bench.json").write_text(json.dumps(saved))
    write_pages(source, tmp_path / "out")
    page = (tmp_path / "out" / "bench.md").read_text()
    assert "123.456" in page and page != (BENCH / "bench.md").read_text()
