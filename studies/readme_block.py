"""A study's block of the project README: the lines between its begin and end markers, written
again from the study's figures (every study's page writer calls this one)."""

from __future__ import annotations

from pathlib import Path

from dpr_cache.runtime.atomic import write_text_atomic


def write_readme_block(
    readme: Path, markers: tuple[str, str], lines: list[str], check_only: bool = False
) -> None:
    """Replace what lies between ``markers`` (begin, end) in ``readme`` with ``lines``; with
    ``check_only``, only check that each marker is there once (before anything is written)."""
    begin, end = markers
    text = readme.read_text(encoding="utf-8")
    if text.count(begin) != 1 or text.count(end) != 1 or text.index(begin) > text.index(end):
        raise SystemExit(f"error: {readme}: needs one {begin} line and, after it, one {end} line")
    if check_only:
        return
    head, rest = text.split(begin)
    _, tail = rest.split(end)
    write_text_atomic(readme, head + begin + "\n" + "\n".join(lines) + "\n" + end + tail)
