"""Every measured figure written by hand in README.md and docs/*.md agrees with its JSON."""

import json
import os

from benchmarks import figures


def test_every_figure_names_data_that_gives_it():
    wrong = [f"{f.doc}:{f.line}: {f.text}: {f.problem}" for f in figures.check() if f.problem]
    assert not wrong, "\n".join(wrong)


def _check(tmp_path, text: str, data: object) -> list[figures.Figure]:
    source = tmp_path / "data.json"
    source.write_text(json.dumps(data))
    doc = tmp_path / "page.md"
    doc.write_text(text.replace("SRC", os.path.relpath(source, figures.REPO)))
    return figures.check([doc])


def test_a_figure_its_data_rounds_to_agrees(tmp_path):
    data = {"ratio": 2.1049, "steps": [{"b": 8, "s": 40.04}, {"b": 128, "s": 38.46}]}
    text = (
        "ours 2.10x<!-- from SRC: d['ratio'] --> at 38.5 / 40.0 s"
        "<!-- from SRC: row(d['steps'], b=128)['s']; d['steps'][0]['s'] -->\n"
    )
    found = _check(tmp_path, text, data)
    assert [(f.text, f.problem) for f in found] == [("2.10", None), ("38.5", None), ("40.0", None)]


def test_a_figure_its_data_does_not_give_is_caught(tmp_path):
    found = _check(tmp_path, "ours 2.10x<!-- from SRC: d['ratio'] -->\n", {"ratio": 1.89})
    assert [f.problem for f in found] == ["the data gives 1.89"]
    found = _check(tmp_path, "ours 2.10x<!-- from SRC: d['gone'] -->\n", {"ratio": 2.1})
    assert "KeyError" in found[0].problem


def test_a_measured_figure_without_a_source_is_caught(tmp_path):
    text = (
        "a step takes 40.0 s and 1.53 GB, 2.1x the peer\n"
        "the goal: >= 1.3x, under 2 GB; `chunk 32 s` in code\n"
        "an H100 has 80 GB <!-- figures: the card's specification -->\n"
        "```\n3.0 s in a code block\n```\n"
    )
    found = _check(tmp_path, text, {})
    assert [(f.line, f.text, f.problem) for f in found] == [
        (1, "40.0", "no source"),
        (1, "1.53", "no source"),
        (1, "2.1", "no source"),
    ]


def test_a_marker_covers_only_its_own_figures(tmp_path):
    found = _check(tmp_path, "took 5 s and 10 s<!-- from SRC: d['b'] -->\n", {"b": 10})
    assert [(f.text, f.problem) for f in found] == [("10", None), ("5", "no source")]


def test_a_comprehension_in_a_source_sees_the_data(tmp_path):
    data = {"rows": [{"p": "bf16", "r": 2.0}, {"p": "fp16", "r": 3.0}]}
    marker = "<!-- from SRC: max(x['r'] for x in d['rows'] if x['p'] == d['rows'][0]['p']) -->"
    found = _check(tmp_path, f"best 2.0x{marker}\n", data)
    assert [(f.text, f.problem) for f in found] == [("2.0", None)]
