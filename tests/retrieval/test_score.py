"""``dpr-cache score``: each teacher's scores against a reference computed here (transformers run
directly for the cross-encoder, bm25s for BM25, BM25 + w * the index's stored vectors for the
hybrid), every other key kept, the hard negatives the teacher scores near the positive left out
by the rule worked out here, a cut run resumed from its parts, 2 gloo ranks writing the file one
process writes, and bad input as one line with nothing written lost."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import bm25s
import numpy as np
import pytest
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from dpr_cache.model.loading import load_encoder
from dpr_cache.retrieval.dense.encode import encode_question_texts
from tests.support.cli import index_toy, run_cli
from tests.support.fixtures import TOY, index_vectors, plant_another_runs_part

TINY = TOY / "tiny-bert"
CROSS = TOY / "tiny-cross-encoder"
PASSAGES = TOY / "passages.tsv"
RECORDS = [json.loads(line) for line in (TOY / "train.jsonl").read_text().splitlines()]
SCORED = ("positive_ctxs", "hard_negative_ctxs")


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    """A cache folder and the toy passages indexed by the tiny BERT (both towers)."""
    root = tmp_path_factory.mktemp("score")
    index_toy(root, TINY)
    return root


@pytest.fixture(scope="module")
def train(root) -> Path:
    """The first 40 toy records, one of them without a title on a hard negative."""
    records = [json.loads(json.dumps(r)) for r in RECORDS[:40]]
    records[3]["hard_negative_ctxs"][0]["title"] = ""
    path = root / "train40.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _score(root: Path, train: Path, out: Path, *extra: str, check: bool = True, world: int = 1):
    return run_cli(
        "score",
        "--train",
        str(train),
        "--out",
        str(out),
        "--cache-dir",
        str(root / "cache"),
        "-q",
        *extra,
        check=check,
        world=world,
    )


def _read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _scores(records: list[dict]) -> list[list[float]]:
    return [[c["teacher_score"] for key in SCORED for c in r[key]] for r in records]


def _without_scores(record: dict) -> dict:
    record = json.loads(json.dumps(record))
    for key in SCORED:
        for ctx in record[key]:
            del ctx["teacher_score"]
    return record


def _check_keys_kept(scored: list[dict], train: Path) -> None:
    original = _read(train)
    assert [_without_scores(r) for r in scored] == original
    for record in scored:
        assert all(isinstance(c["teacher_score"], float) for k in SCORED for c in record[k])
        assert all("teacher_score" not in c for c in record.get("negative_ctxs", []))


def test_cross_encoder_scores_equal_transformers(root, train, tmp_path) -> None:
    out = tmp_path / "ce.jsonl"
    done = _score(root, train, out, "--teacher", str(CROSS), "--batch", "7", "--batch-size", "5")
    scored = _read(out)
    _check_keys_kept(scored, train)
    tokenizer = AutoTokenizer.from_pretrained(CROSS)
    model = AutoModelForSequenceClassification.from_pretrained(CROSS).eval()
    want = []
    for record in _read(train):  # one pair at a time, no padding, fp32
        row = []
        for ctx in [c for key in SCORED for c in record[key]]:
            passage = f"{ctx['title']} {ctx['text']}" if ctx["title"] else ctx["text"]
            inputs = tokenizer(
                record["question"],
                passage,
                truncation="only_second",
                max_length=256,
                return_tensors="pt",
            )
            with torch.no_grad():
                row.append(float(model(**inputs).logits[0, 0]))
        want.append(row)
    got = _scores(scored)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=0, atol=1e-5)
    flat = np.concatenate([np.array(g) for g in got])
    assert flat.std() > 0.05  # negative control: the scores differ far beyond the tolerance
    summary = json.loads((tmp_path / "ce.summary.json").read_text())
    assert summary["questions"] == 40 and summary["positives"] == 40
    assert summary["hard_negatives"] == sum(len(r["hard_negative_ctxs"]) for r in scored)
    assert summary["teacher"]["teacher"] == "cross-encoder"
    assert summary["teacher"]["precision"] == "fp32" and summary["settings"]["batch"] == 7
    assert {"load the teacher", "score", "write the part"} <= set(summary["seconds_by_stage"])
    assert "scored: 40 positives" in done.stdout
    assert not (tmp_path / "ce.jsonl.parts").exists()


def _bm25_reference(records: list[dict]) -> list[list[float]]:
    """bm25s over the toy passages (title + text, Lucene's k1=0.9, b=0.4, English stopwords)."""
    with open(PASSAGES, encoding="utf-8", newline="") as f:
        rows = list(csv.reader(f, delimiter="\t"))[1:]
    row_of = {pid: r for r, (pid, _, _) in enumerate(rows)}
    retriever = bm25s.BM25(k1=0.9, b=0.4, method="lucene")
    corpus = [f"{title} {text}" for _, text, title in rows]
    retriever.index(
        bm25s.tokenize(corpus, stopwords="en", show_progress=False), show_progress=False
    )
    out = []
    for record in records:
        query = bm25s.tokenize(
            [record["question"]], stopwords="en", return_ids=False, show_progress=False
        )[0]
        every = retriever.get_scores(query)
        out.append([float(every[row_of[c["passage_id"]]]) for k in SCORED for c in record[k]])
    return out


def test_bm25_scores_equal_bm25s(root, train, tmp_path) -> None:
    out = tmp_path / "bm25.jsonl"
    _score(root, train, out, "--teacher", "bm25", "--passages", str(PASSAGES))
    scored = _read(out)
    _check_keys_kept(scored, train)
    got, want = _scores(scored), _bm25_reference(_read(train))
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)
    # negative control: positives tend to share the question's words, hard negatives less so
    assert np.mean([g[0] for g in got]) > 1 and len({round(x, 3) for g in got for x in g}) > 20
    summary = json.loads((tmp_path / "bm25.summary.json").read_text())
    assert summary["teacher"] == {"teacher": "bm25", "passages": str(PASSAGES)}


def test_hybrid_scores_are_bm25_plus_w_dense(root, train, tmp_path) -> None:
    out = tmp_path / "hybrid.jsonl"
    _score(
        root,
        train,
        out,
        "--teacher",
        "hybrid",
        "--model",
        str(TINY),
        "--index",
        str(root / "index"),
        "--fusion-weight",
        "3.5",
    )
    scored = _read(out)
    _check_keys_kept(scored, train)
    vectors, ids = index_vectors(root / "index")  # the stored float16, as float32
    row_of = {pid: r for r, pid in enumerate(ids)}
    records = _read(train)
    model = load_encoder(TINY, pooling="mean", query_only=True)  # as the toy config indexed
    q = encode_question_texts(
        model, [r["question"] for r in records], max_length=32, device=torch.device("cpu")
    )
    bm25 = _bm25_reference(records)
    got = _scores(scored)
    dense_parts = []
    for i, record in enumerate(records):
        rows = [row_of[c["passage_id"]] for k in SCORED for c in record[k]]
        dense = vectors[rows].astype(np.float64) @ q[i].astype(np.float64)
        dense_parts.append(dense)
        np.testing.assert_allclose(got[i], np.array(bm25[i]) + 3.5 * dense, rtol=1e-5, atol=1e-4)
    # negative control: the dense part matters (it moves the scores far beyond the tolerance)
    assert np.abs(np.concatenate(dense_parts)).max() * 3.5 > 0.1
    summary = json.loads((tmp_path / "hybrid.summary.json").read_text())
    assert summary["teacher"]["teacher"] == "hybrid" and summary["teacher"]["fusion_weight"] == 3.5


def _near_positive(
    negative: float, positive: float, margin: float | None, relative: float | None
) -> bool:
    """The teacher's rule, written out: at least positive - M, or positive - (1 - R) |positive|."""
    if margin is not None and negative >= positive - margin:
        return True
    return relative is not None and negative >= positive - (1 - relative) * abs(positive)


def test_cleaning_leaves_out_the_negatives_the_teacher_scores_near_the_positive(
    root, train, tmp_path
) -> None:
    """--teacher-relative / --teacher-margin: the scored file less exactly the hard negatives the
    rule names (worked out here from the file scored without a rule), counted as ``cleaned``;
    positives, other keys and a record without a positive untouched."""
    records = _read(train)
    bare = json.loads(json.dumps(records[5]))
    bare["positive_ctxs"] = []  # no positive to measure against: its negatives stay
    source = tmp_path / "train41.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in [*records, bare]))
    bm25 = ["--teacher", "bm25", "--passages", str(PASSAGES)]
    done = _score(root, source, tmp_path / "plain.jsonl", *bm25)
    plain = _read(tmp_path / "plain.jsonl")
    total = sum(len(r["hard_negative_ctxs"]) for r in plain)
    # negative control: with no rule nothing is left out
    assert [_without_scores(r) for r in plain] == _read(source) and total == 82
    summary = json.loads((tmp_path / "plain.summary.json").read_text())
    assert summary["cleaned"] == 0 and summary["hard_negatives"] == total
    assert "left out" not in done.stdout
    cases = [
        (["--teacher-relative", "0.95"], None, 0.95),
        (["--teacher-relative", "1"], None, 1.0),  # only those at or above the positive
        (["--teacher-margin", "1"], 1.0, None),
        (["--teacher-margin", "0.5", "--teacher-relative", "0.9"], 0.5, 0.9),  # either rule
    ]
    for n, (flags, margin, relative) in enumerate(cases):
        out = tmp_path / f"clean{n}.jsonl"
        done = _score(root, source, out, *bm25, *flags)
        want, dropped = [], 0
        for record in plain:
            record = json.loads(json.dumps(record))
            if record["positive_ctxs"]:
                positive = record["positive_ctxs"][0]["teacher_score"]
                negatives = record["hard_negative_ctxs"]
                kept = [
                    c
                    for c in negatives
                    if not _near_positive(c["teacher_score"], positive, margin, relative)
                ]
                dropped += len(negatives) - len(kept)
                record["hard_negative_ctxs"] = kept
            want.append(record)
        assert 0 < dropped < total // 2, (flags, dropped)  # the rule bites, and not everywhere
        cleaned = _read(out)
        assert cleaned == want, flags
        assert [r["positive_ctxs"] for r in cleaned] == [r["positive_ctxs"] for r in plain]
        assert cleaned[-1]["hard_negative_ctxs"] == plain[-1]["hard_negative_ctxs"]
        summary = json.loads((tmp_path / f"clean{n}.summary.json").read_text())
        assert summary["cleaned"] == dropped and summary["hard_negatives"] == total - dropped
        assert summary["positives"] == 40 and summary["no_positive"] == 1
        assert summary["settings"]["teacher_margin"] == margin
        assert summary["settings"]["teacher_relative"] == relative
        assert f"{total - dropped} hard negatives ({dropped} more left out" in done.stdout


def test_a_cut_run_resumes_its_parts(root, train, tmp_path, monkeypatch) -> None:
    from dpr_cache.retrieval import scoring
    from dpr_cache.retrieval.teacher import TeacherSpec, open_teacher

    out = tmp_path / "r.jsonl"
    teacher = open_teacher(
        TeacherSpec("bm25", PASSAGES), cache_dir=root / "cache", device=torch.device("cpu")
    )
    spec = scoring.ScoreSpec(batch=15)  # parts of 15, 15, 10 records

    def run() -> None:
        scoring.score(teacher, train, out, spec, progress=False)

    run()
    whole = out.read_bytes()
    out.unlink()
    real, calls = scoring.groups_of, []

    def cut_after_two(path, batch):
        if len(calls) == 2:
            raise KeyboardInterrupt  # the run is cut: parts 0 and 1 are on disk
        calls.append(batch[0][0])
        return real(path, batch)

    monkeypatch.setattr(scoring, "groups_of", cut_after_two)
    with pytest.raises(KeyboardInterrupt):
        run()
    parts = tmp_path / "r.jsonl.parts"
    assert sorted(p.name for p in parts.glob("part-*.jsonl")) == [
        "part-000000.jsonl",
        "part-000001.jsonl",
    ]
    assert not out.exists()
    calls.clear()
    monkeypatch.setattr(
        scoring, "groups_of", lambda path, b: calls.append(b[0][0]) or real(path, b)
    )
    run()
    assert calls == ["line 31"] and out.read_bytes() == whole  # only the third part was scored
    summary = json.loads((tmp_path / "r.summary.json").read_text())
    assert summary["questions"] == 40  # the kept parts' counts are summed in
    plant_another_runs_part(parts)  # parts of other inputs are not taken
    out.unlink()
    calls.clear()
    run()
    assert calls == ["line 1", "line 16", "line 31"] and out.read_bytes() == whole


def test_two_ranks_write_the_file_of_one_process(root, train, tmp_path) -> None:
    common = ["--teacher", str(CROSS), "--batch", "7", "--device", "cpu"]  # 3 + 4 records a rank
    _score(root, train, tmp_path / "one.jsonl", *common)
    _score(root, train, tmp_path / "two.jsonl", *common, world=2)
    one, two = _read(tmp_path / "one.jsonl"), _read(tmp_path / "two.jsonl")
    assert len(one) == 40 and [_without_scores(r) for r in two] == _read(train)
    # each rank batches its share's pairs its own way (one thread a rank): the same scores up
    # to float rounding, each in its record's place
    for a, b in zip(_scores(one), _scores(two), strict=True):
        np.testing.assert_allclose(b, a, rtol=0, atol=1e-5)
    # negative control: any two records' scores differ far beyond the tolerance, so a record
    # written with another's scores would fail
    rows = np.array(_scores(one))  # [40, 3]: a positive and 2 hard negatives each
    apart = np.abs(rows[:, None, :] - rows[None, :, :]).max(axis=-1)
    assert apart[~np.eye(40, dtype=bool)].min() > 1e-3


def test_bad_input_is_one_line_and_loses_nothing(root, train, tmp_path) -> None:
    out = tmp_path / "o.jsonl"
    out.write_text("an earlier output\n")
    no_id = tmp_path / "noid.jsonl"
    record = json.loads(json.dumps(RECORDS[0]))
    del record["hard_negative_ctxs"][1]["passage_id"]
    no_id.write_text(json.dumps(RECORDS[1]) + "\n" + json.dumps(record) + "\n")
    foreign = tmp_path / "foreign.jsonl"
    record = json.loads(json.dumps(RECORDS[0]))
    record["positive_ctxs"][0]["passage_id"] = "nowhere"
    foreign.write_text(json.dumps(record) + "\n")
    inf = tmp_path / "inf"
    model = AutoModelForSequenceClassification.from_pretrained(CROSS)
    with torch.no_grad():
        model.classifier.weight.fill_(float("inf"))
    model.save_pretrained(inf)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(CROSS / name, inf)
    bm25 = ["--teacher", "bm25", "--passages", str(PASSAGES)]
    index = ["--model", str(TINY), "--index", str(root / "index")]
    passages = tmp_path / "passages.tsv"  # a copy: --out naming it must leave it as it is
    shutil.copy(PASSAGES, passages)
    folder = tmp_path / "a-folder"
    folder.mkdir()
    cases = [
        (["--teacher", str(TINY)], f"{TINY}: not a cross-encoder"),
        ([*bm25, "--fusion-weight", "2"], "--teacher bm25: takes no --fusion-weight"),
        ([*bm25, *index], "--teacher bm25: takes no --model, --index"),
        ([*bm25, "--max-length", "32"], "--teacher bm25: takes no --max-length"),
        ([*bm25, "--batch-size", "8"], "--teacher bm25: takes no --batch-size"),
        (["--teacher", str(CROSS), "--batch-size", "0"], "--batch-size 0 must be >= 1"),
        (["--teacher", "hybrid", "--model", str(TINY)], "hybrid: give --model DIR and --index"),
        (
            ["--teacher", "hybrid", *index, "--fusion-weight", "-1"],
            "--fusion-weight -1.0 must be >= 0, as eval's",
        ),
        (["--teacher", "bm25"], "--teacher bm25: give --passages TSV"),
        (["--teacher", str(CROSS), "--passages", str(PASSAGES)], "takes no --passages"),
        (["--teacher", str(CROSS), "--precision", "fp16", "--device", "cpu"], "fp16 needs a GPU"),
        (["--teacher", str(CROSS), "--precision", "fp8"], "--precision: 'fp8' is not one of"),
        ([*bm25, "--precision", "bf16"], "bm25 scores in fp32"),
        (
            [*bm25, "--train", str(no_id)],
            f"{no_id} line 2: hard_negative_ctxs[1] has no passage_id",
        ),
        (
            [*bm25, "--train", str(foreign)],
            f"{foreign} line 1: positive_ctxs[0]: passage 'nowhere'",
        ),
        (
            ["--teacher", str(inf)],
            f"{train} line 1: positive_ctxs[0]: the cross-encoder {inf} "
            "scored it inf or NaN under fp32",
        ),
        ([*bm25, "--batch", "0"], "--batch 0 must be >= 1"),
        ([*bm25, "--teacher-relative", "1.5"], "score: --teacher-relative 1.5 must be in (0, 1]"),
        ([*bm25, "--teacher-relative", "0"], "score: --teacher-relative 0.0 must be in (0, 1]"),
        ([*bm25, "--teacher-margin", "-1"], "score: --teacher-margin -1.0 must be >= 0"),
        (
            ["--teacher", "bm25", "--passages", str(passages), "--out", str(passages)],
            f"{passages}: the output must not overwrite the passages file",
        ),
        ([*bm25, "--out", str(train)], f"{train}: the output must not overwrite the training file"),
        ([*bm25, "--out", str(folder)], f"{folder}: a folder: give the path of the file to write"),
    ]
    for extra, message in cases:
        if "--train" not in extra:
            extra = [*extra, "--train", str(train)]
        done = run_cli(
            "score",
            "--out",
            str(out),
            "--cache-dir",
            str(root / "cache"),
            "-q",
            *extra,
            check=False,
        )
        assert done.returncode == 2, (extra, done.stderr[-500:])
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], (
            extra,
            lines,
        )
        assert out.read_text() == "an earlier output\n"  # nothing written is lost
        assert passages.read_bytes() == PASSAGES.read_bytes()
    for refused in (train, passages, folder):  # refused before the lock is taken
        assert not (refused.parent / f".{refused.name}.lock").exists(), refused


def test_a_non_finite_score_of_any_teacher_names_the_record_and_ctx() -> None:
    from dpr_cache.errors import InputError
    from dpr_cache.retrieval.scoring import groups_of
    from dpr_cache.retrieval.teacher import score_groups

    class Stub:  # a teacher scoring 0, 1, 2, ...; with ``bad``, the second group's 2nd NaN
        def __init__(self, bad: bool) -> None:
            self.bad = bad

        def score(self, groups):
            out = [np.arange(len(g.passages), dtype=np.float64) for g in groups]
            if self.bad:
                out[1][1] = np.nan
            return out

    groups = groups_of(Path("t.jsonl"), [("line 1", RECORDS[0]), ("line 2", RECORDS[1])])
    with pytest.raises(InputError) as excinfo:
        score_groups(Stub(bad=True), groups)
    assert str(excinfo.value) == (
        "t.jsonl line 2: hard_negative_ctxs[0]: the teacher scored it nan, not a finite number"
    )
    # negative control: finite scores pass through
    assert [s.tolist() for s in score_groups(Stub(bad=False), groups)] == [[0, 1, 2], [0, 1, 2]]


def test_auto_precision_is_bf16_only_where_the_gpu_has_it_not_emulated(monkeypatch) -> None:
    """A GPU before compute capability 8.0 (which only emulates bf16, slowly) gets fp16, one
    from 8.0 on bf16; the GPU asked about is the one given."""
    from dpr_cache.retrieval.teacher import precision_for

    asked = []

    def capability(device=None):
        asked.append(device)
        return {0: (7, 5), 1: (8, 0), 2: (9, 0)}[device.index]

    monkeypatch.setattr(torch.cuda, "get_device_capability", capability)
    picks = [precision_for("auto", torch.device("cuda", i)) for i in range(3)]
    assert picks == ["fp16", "bf16", "bf16"], picks
    assert [d.index for d in asked] == [0, 1, 2]


def test_parts_made_ahead_write_the_file_made_in_turn(root, train, tmp_path) -> None:
    """On CUDA the next part is read and tokenized in a thread while a part is scored, and the
    batches' scores come back queued: forced here on the CPU, the same file byte for byte as
    each part read, tokenized and scored in turn."""
    import threading

    from dpr_cache.retrieval.scoring import ScoreSpec, score
    from dpr_cache.retrieval.teacher import TeacherSpec, open_teacher

    spec = TeacherSpec(str(CROSS), batch_size=5, device="cpu")
    teacher = open_teacher(spec, cache_dir=root / "cache", device=torch.device("cpu"))
    assert teacher.ahead is False  # the CPU scores each part in turn
    prepare, made_by = teacher.prepare, []

    def recorded(groups):
        made_by.append(threading.get_ident())
        return prepare(groups)

    teacher.prepare = recorded
    written = {}
    for ahead in (False, True):
        teacher.ahead = ahead
        out = tmp_path / f"ahead-{ahead}.jsonl"
        score(teacher, train, out, ScoreSpec(batch=7), progress=False)
        written[ahead] = out.read_bytes()
        if not ahead:
            assert made_by == []  # control: in turn, the teacher tokenizes as it scores
    assert written[True] == written[False]
    assert len(made_by) == 6 and threading.get_ident() not in made_by  # 40 records, 7 a part


def test_a_part_done_is_not_tokenized_ahead_and_a_rank_its_share(root, train, tmp_path) -> None:
    from dpr_cache.model.cross_encoder import Pair, score_pairs, tokenize_pairs
    from dpr_cache.retrieval.scoring import _parts_ahead, groups_of
    from dpr_cache.retrieval.teacher import TeacherSpec, open_teacher
    from dpr_cache.runtime.overlap import Transfer

    spec = TeacherSpec(str(CROSS), batch_size=5, device="cpu")
    teacher = open_teacher(spec, cache_dir=root / "cache", device=torch.device("cpu"))
    teacher.ahead = True
    parts = tmp_path / "parts"
    parts.mkdir()
    (parts / "part-000000.json").write_text("{}")  # part 0 done
    made = list(_parts_ahead(teacher, train, 7, parts, 1, 2))
    assert len(made) == 6 and made[0][1] is None
    batch, (groups, features) = made[1]
    assert groups == groups_of(train, batch)
    share = [Pair(g.question, p.title, p.text) for g in groups[1::2] for p in g.passages]
    encoder = teacher.encoder
    assert features == tokenize_pairs(encoder.tokenizer, share, encoder.max_length)
    everything = [Pair(g.question, p.title, p.text) for g in groups for p in g.passages]
    assert len(features["input_ids"]) < len(everything)  # control: rank 1's share only
    plain = score_pairs(encoder, share, batch_size=5)
    queued = score_pairs(
        encoder,
        share,
        batch_size=5,
        features=features,
        transfer=Transfer(pin=False, non_blocking=True),
    )
    assert np.array_equal(plain, queued) and plain.std() > 0.05
    with pytest.raises(ValueError, match="features of"):
        score_pairs(encoder, everything, features=features)
    assert teacher.prepare([]) is None  # a rank with no share has nothing to tokenize
