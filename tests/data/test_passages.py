"""DPR passages TSV and qas files: csv quoting, gzip, errors with line numbers."""

from __future__ import annotations

import csv
import gzip
import json
from pathlib import Path

import pytest

from dpr_cache.data.passages import load_passages, read_passages
from dpr_cache.data.qas import qas_line, read_qas
from dpr_cache.errors import InputError

PASSAGES = [
    ("1", 'He said "hello"\tand left.', "Greeting"),
    ("2", "Plain text, with a comma.", 'Title "quoted"'),
    ("3", '"Starts with a quote', "Q"),
    ("wiki:4", "multi\nline", "Lines"),
]


def write_tsv(path: Path, rows: list, header: tuple = ("id", "text", "title")) -> Path:
    with open(path, "w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f, delimiter="\t", lineterminator="\n")
        writer.writerow(header)
        writer.writerows(rows)
    return path


def test_quoted_fields_round_trip(tmp_path: Path) -> None:
    path = write_tsv(tmp_path / "p.tsv", PASSAGES)
    assert '"He said ""hello""' in path.read_text()  # really csv-quoted on disk
    assert list(read_passages(path)) == PASSAGES


def test_gzip_and_arrow_cache(tmp_path: Path) -> None:
    plain = write_tsv(tmp_path / "p.tsv", PASSAGES)
    gz = tmp_path / "p.tsv.gz"
    gz.write_bytes(gzip.compress(plain.read_bytes()))
    assert list(read_passages(gz)) == PASSAGES
    ds = load_passages(gz, tmp_path / "cache")
    assert ds.column_names == ["id", "text", "title"]
    assert [(r["id"], r["text"], r["title"]) for r in ds] == PASSAGES
    again = load_passages(gz, tmp_path / "cache")
    assert again.cache_files == ds.cache_files


def test_wrong_field_count_names_the_line(tmp_path: Path) -> None:
    path = write_tsv(tmp_path / "p.tsv", PASSAGES)
    with open(path, "a", encoding="utf-8") as f:
        f.write("5\tonly two fields\n")
    # header + 4 rows, one of them quoted over two lines: the bad row is physical line 7
    with pytest.raises(InputError, match=r"p\.tsv line 7: expected 3 tab-separated fields, got 2"):
        list(read_passages(path))


def test_bad_header_and_missing_file(tmp_path: Path) -> None:
    path = write_tsv(tmp_path / "p.tsv", PASSAGES, header=("id", "title", "text"))
    with pytest.raises(InputError, match=r"p\.tsv line 1: header must be"):
        list(read_passages(path))
    with pytest.raises(InputError, match=r"none\.tsv: no such file"):
        list(read_passages(tmp_path / "none.tsv"))


def test_qas_json_and_python_literal_lists(tmp_path: Path) -> None:
    path = tmp_path / "nq-test.qa.csv"
    path.write_text(
        'who sang "thriller"\t["Michael Jackson"]\n'
        "when was it released\t['1982', \"November 30, 1982\"]\n"
        "\n"
        "what is 2+2\t[4]\n",
        encoding="utf-8",
    )
    assert read_qas(path) == [
        ('who sang "thriller"', ["Michael Jackson"]),
        ("when was it released", ["1982", "November 30, 1982"]),
        ("what is 2+2", ["4"]),
    ]


def test_a_qas_line_reads_back_as_written(tmp_path: Path) -> None:
    """Questions a bare line would lose (an opening quote, a tab, a line break) read back whole,
    through read_qas and through csv.reader on tabs (DPR's own reader); bare lines stay bare."""
    qas = [
        ('"Bairn" and "hyem" come from what culture?', ["Scandinavia"]),
        ("a tab\there and a break\nthere", ['say "yes"', "naïve"]),
        ('who sang "thriller"', ["Michael Jackson"]),
        ("none", []),
    ]
    path = tmp_path / "dev.qa.tsv"
    path.write_text("".join(qas_line(q, a) for q, a in qas), encoding="utf-8")
    assert read_qas(path) == qas
    with path.open(encoding="utf-8", newline="") as f:
        assert [(q, json.loads(a)) for q, a in csv.reader(f, delimiter="\t")] == qas
    assert qas_line(*qas[2]) == 'who sang "thriller"\t["Michael Jackson"]\n'
    # negative control: the opening-quote question written bare does not read back
    path.write_text(f"{qas[0][0]}\t{json.dumps(qas[0][1])}\n", encoding="utf-8")
    assert read_qas(path) != qas[:1]


def test_qas_errors_name_the_line(tmp_path: Path) -> None:
    path = tmp_path / "dev.qa.tsv"
    path.write_text('q1\t["a"]\nq2\tnot a list\n', encoding="utf-8")
    with pytest.raises(InputError, match=r"dev\.qa\.tsv line 2: answers are not a JSON or Python"):
        read_qas(path)
    path.write_text('q1\t["a"]\nq2\n', encoding="utf-8")
    with pytest.raises(InputError, match=r"dev\.qa\.tsv line 2: expected 'question<TAB>"):
        read_qas(path)


def test_rows_of_ids_and_columns_of_rows(tmp_path: Path) -> None:
    """Ids map to their rows through the cached hash table (an unknown id to -1), and the
    columns read through a short-lived map equal the dataset's own rows."""
    from dpr_cache.data.passages import passage_columns, passage_rows

    tsv = tmp_path / "p.tsv"
    with open(tsv, "w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f, delimiter="\t", lineterminator="\n")
        writer.writerow(["id", "text", "title"])
        writer.writerows([f"doc{i}", f"text {i}", f"title {i}"] for i in range(250))
    dataset = load_passages(tsv, tmp_path / "cache")
    rows = passage_rows(dataset, ["doc7", "nope", "doc249", "doc0", "doc7"])
    assert rows.tolist() == [7, -1, 249, 0, 7]
    assert list((tmp_path / "cache").glob("*.idhash.npy"))  # cached for the next call
    assert passage_rows(dataset, ["doc249"]).tolist() == [249]
    columns = passage_columns(dataset, [249, 3, 3])
    want = dataset[[249, 3, 3]]
    assert columns == {k: want[k] for k in ("id", "title", "text")}


def test_columns_and_rows_across_record_batches(tmp_path: Path) -> None:
    """25,001 passages of about 500 characters make three record batches (10,000 rows, over
    the 4 MB a batch is written at) in the cache: rows from every batch, unsorted and repeated,
    come back in the order asked, equal to the dataset's."""
    from dpr_cache.data.passages import passage_columns, passage_rows

    n = 25_001
    rows = [(f"d{i}", f"text {i} " + "x" * 500, f"t{i}") for i in range(n)]
    tsv = write_tsv(tmp_path / "p.tsv", rows)
    dataset = load_passages(tsv, tmp_path / "cache")
    import pyarrow as pa

    with pa.memory_map(dataset.cache_files[0]["filename"]) as source:
        assert sum(1 for _ in pa.ipc.open_stream(source)) >= 3  # the case under test
    asked = [25_000, 3, 19_999, 10_000, 3, 9_999, 20_000]
    columns = passage_columns(dataset, asked)
    want = dataset[asked]
    assert columns == {k: want[k] for k in ("id", "title", "text")}
    assert passage_columns(dataset, []) == {"id": [], "title": [], "text": []}
    with pytest.raises(IndexError):
        passage_columns(dataset, [n])
    rows = passage_rows(dataset, ["d25000", "d10000", "d0", "x"])
    assert rows.tolist() == [25_000, 10_000, 0, -1]
