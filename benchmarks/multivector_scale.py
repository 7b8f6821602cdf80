"""Late interaction's cost on one small box, beside one vector a passage: bytes a passage, encode
rate, exact and fast search latency, on SQuAD and on 1M synthetic passages of SQuAD's token
counts, projected to 21M; resumable, each measurement a fresh process measured by ``wait4``::

    python -m benchmarks.multivector_scale --work runs/multivector_scale --out docs/bench
"""

from __future__ import annotations

import functools
import json
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks import harness, nq_like

TINY = harness.SCALE_TINY
CONFIG = "configs/toy.yaml" if TINY else "configs/squad_reproduce.yaml"
# The dev questions' records, their positives' titles naming their articles (the toy has none).
DEV_RECORDS = None if TINY else "data/squad/dev.jsonl"
PASSAGE_TOKENS = 64 if TINY else 256  # the length SQuAD is indexed at
SYNTH_ROWS = 4_000 if TINY else 1_000_000
SHARD_ROWS = 1_000 if TINY else 50_000
PIECE_ROWS = 500 if TINY else 2_000  # passages generated at once
TOPICS = 64 if TINY else 8_192
NLIST = 16 if TINY else 2_048
PQ_M = 16  # bytes a token in the ivfpq index
EXACT_QUESTIONS = 4 if TINY else 16  # the exact scan at 1M reads every token once a batch
FAST_QUESTIONS = 16 if TINY else 256
TAIL_QUESTIONS = 16 if TINY else 500  # questions whose exact top scores' spread is measured
QUESTION_TOKENS = 16  # a SQuAD question's tokens, about
KNOBS = (
    (2, 10, 16), (20, 10, 16), (20, 30, 16), (100, 30, 16), (100, 60, 32),
    (20, 20, 32), (20, 30, 32), (20, 20, 64), (20, 30, 64), (50, 30, 64),
)[: 2 if TINY else None]  # fmt: skip
"""The fast path's search knobs tried at 1M: ivf_token_hits, ivf_candidates, ivf_nprobe."""
DEFAULT_KNOBS = "20-10-16"  # index.*'s defaults, among KNOBS
RECALL_GOAL, SPEEDUP_GOAL = 0.99, 10  # the fast path's: recall@100 of exact, at this speed-up
K = 100
MEMORY_GB = 4.0
GB = harness.GB
SINGLE_MODEL = "data/toy/tiny-bert" if TINY else harness.MINILM


def _run(work: Path, log: str, name: str, **args) -> dict:
    """``_child_NAME(**args)`` in a fresh process: its figures and those it printed."""
    cmd = [sys.executable, "-m", "benchmarks.multivector_scale", "child", name]
    return harness.measured([*cmd, json.dumps(args, default=str)], work / "logs" / log, True)


def _search(work: Path, tag: str, index: Path, queries: Path, n=None, knobs=None, cold=False):
    """:func:`_child_search` in a fresh process: its figures and the rows it found."""
    rows = work / f"rows-{tag}.npy"
    args = {"index": index, "queries": queries, "rows": rows, "n": n, "knobs": knobs, "cold": cold}
    return _run(work, f"search-{tag}.txt", "search", **args), np.load(rows)


def squad_index(work: Path, kind: str) -> dict:
    """SQuAD's passages indexed flat by the model of ``kind`` (single or multi), cut at 256."""
    out, model = work / f"squad-{kind}", SINGLE_MODEL
    if kind == "multi":
        model = str(work / "model-multi")
        _run(work, "model.txt", "model", out=model)
    sets = [f"output_dir={out}", f"model.max_passage_length={PASSAGE_TOKENS}"]
    flags = [x for s in sets for x in ("--set", s)]
    figures = harness.run_cli(
        work, f"index-{kind}", "index", *flags, "-q", config=CONFIG, model=model
    )
    meta = json.loads((out / "index" / "meta.json").read_text())
    disk = sum(p.stat().st_size for p in (out / "index" / "shards").iterdir())
    return {
        **figures,
        "rows": meta["rows"],
        "tokens": meta.get("tokens"),
        "bytes_per_passage": round(disk / meta["rows"]),
        "encode_seconds": meta["timings"]["encode_seconds"],
        "passages_per_s": meta["timings"]["passages_per_second"],
    }


def squad_search(work: Path) -> dict:
    """SQuAD's dev questions encoded once, then searched: single flat, multi flat, multi ivfpq
    (built over the multi index's shards); seconds a question, recall@100 against exact."""
    indexes = {f"{k} flat": work / f"squad-{k}" / "index" for k in ("single", "multi")}
    for kind, index in zip(("single", "multi"), indexes.values(), strict=True):
        args = {"config": CONFIG, "index": index, "out": work / f"q-{kind}.npy"}
        _run(work, f"questions-{kind}.txt", "questions", **args)
    indexes["multi ivfpq"] = work / "squad-multi-ivfpq"
    args = {"shards": indexes["multi flat"], "out": indexes["multi ivfpq"], "nlist": None}
    build = _run(work, "build-squad.txt", "build", **args)
    result, found = {}, {}
    for name, index in indexes.items():
        queries = work / f"q-{name.split()[0]}.npy"
        result[name], found[name] = _search(work, name.replace(" ", "-"), index, queries)
    result["multi ivfpq"]["recall_at_100"] = _recall(found["multi ivfpq"], found["multi flat"])
    result["multi ivfpq"]["build"] = build
    return result


def synth_build(work: Path) -> dict:
    """The 1M passages' flat index (its meta) and ivfpq index (trained, filled, merged)."""
    shards = work / "synth"
    _run(work, "flat.txt", "build", shards=shards, out=work / "synth-flat", type="flat")
    return _run(work, "build.txt", "build", shards=shards, out=work / "synth-ivfpq", nlist=NLIST)


def synth_search(work: Path) -> dict:
    """Exact MaxSim for the first questions, the fast path for more (its recall@100 on the
    first against exact), and one vector a passage (384-d, flat) for as many questions."""
    queries, result, found = work / "synth" / "questions.npy", {}, {}
    for name, n in (("multi flat", EXACT_QUESTIONS), ("multi ivfpq", FAST_QUESTIONS)):
        index, tag = work / f"synth-{name.split()[1]}", f"synth-{name.replace(' ', '-')}"
        result[name], found[name] = _search(work, tag, index, queries, n, cold=True)
    exact = found["multi flat"]
    result["multi ivfpq"]["recall_at_100"] = _recall(found["multi ivfpq"][: len(exact)], exact)
    single = work / "synth-single"
    paths = nq_like.write_vectors(single / "vectors", SYNTH_ROWS, 384, SHARD_ROWS * 4)
    questions = nq_like.write_queries(single / "queries.npy", FAST_QUESTIONS, 384)
    args = {"shards": paths, "queries": questions, "cold": True}
    flat = _run(work, "search-synth-single.txt", "search", **args)
    result["single flat"] = {**flat, "bytes_per_passage": 384 * 2}
    return result


def synth_tradeoff(work: Path) -> dict:
    """The fast path at each of :data:`KNOBS` on the questions searched exactly."""
    exact, result = np.load(work / "rows-synth-multi-flat.npy"), {}
    index, queries = work / "synth-ivfpq", work / "synth" / "questions.npy"
    for hits, candidates, nprobe in KNOBS:
        knobs = {"ivf_token_hits": hits, "ivf_candidates": candidates, "ivf_nprobe": nprobe}
        name = f"{hits}-{candidates}-{nprobe}"
        run, rows = _search(work, f"knobs-{name}", index, queries, len(exact), knobs, cold=True)
        result[name] = {**knobs, **run, "recall_at_100": _recall(rows, exact)}
    return result


def _recall(found: np.ndarray, exact: np.ndarray) -> float:
    pairs = zip(found, exact, strict=True)
    hits = [len(set(f[f >= 0]) & set(e[e >= 0])) / max((e >= 0).sum(), 1) for f, e in pairs]
    return round(float(np.mean(hits)), 4)


# ---- the children: each runs in its own process, prints its figures as JSON last ----


def _child_model(out: str) -> dict:
    """all-MiniLM-L6-v2 as a multi-vector model (a projection to 128 drawn at seed 0), saved."""
    import torch

    from dpr_cache.model.biencoder import BiEncoder

    torch.manual_seed(0)
    model = BiEncoder.from_pretrained(SINGLE_MODEL, shared=True, pooling="mean", vectors="multi")
    model.save_pretrained(out)
    return {}


def _child_questions(config: str, index: str, out: str) -> dict:
    """The dev questions of ``config`` encoded by the model ``index`` was built with, saved."""
    import torch

    from dpr_cache.config import load_config
    from dpr_cache.data.qas import read_qas
    from dpr_cache.retrieval.dense.index import open_index
    from dpr_cache.retrieval.dense.questions import QuestionRun, query_tower, question_vectors

    opened, cpu = open_index(index), torch.device("cpu")
    model = query_tower(Path(opened.meta["model"]["dir"]), opened, cpu)
    questions = [question for question, _ in read_qas(load_config(config).data.dev_qa)]
    np.save(out, question_vectors(model, questions, QuestionRun(cpu, "fp32", 64)))
    return {"questions": len(questions)}


def _child_build(shards: str, out: str, nlist: int | None = None, type: str = "ivfpq") -> dict:
    """An index of ``type`` over the token shards of the folder ``shards`` (an index's, or the
    synthetic one), its build timed."""
    from dpr_cache.config import IndexConfig
    from dpr_cache.retrieval.dense.index import finish_index

    store = _token_store(Path(shards))
    spec = IndexConfig(type=type, ivf_nlist=nlist, pq_m=PQ_M, memory_gb=MEMORY_GB, ivf_nprobe=16)
    start = time.perf_counter()
    meta = finish_index(Path(out), store, spec)
    disk = sum(p.stat().st_size for p in Path(out).glob("faiss.*"))
    seconds = round(time.perf_counter() - start, 2)
    return {"build_seconds": seconds, "index_gb": round(disk / GB, 3), **meta["index_params"]}


def _child_search(
    queries: str, n=None, index=None, rows=None, knobs=None, shards=None, cold=False
) -> dict:
    """The first ``n`` questions (all: None) of ``queries`` searched, timed after loading: in
    ``index`` (its search ``knobs``: ``index.*`` keys; the rows found saved to ``rows``), or
    exactly over one vector a passage (``shards``, flat, streamed). ``cold``: as where the
    token vectors outgrow RAM (:func:`_cold_store`; one vector a passage held in the cache)."""
    from dpr_cache.config import IndexConfig
    from dpr_cache.retrieval.dense.index import open_index, opened_as, search_index
    from dpr_cache.retrieval.dense.search import exact_search
    from dpr_cache.retrieval.dense.store import EmbeddingStore

    vectors = np.ascontiguousarray(np.load(queries, mmap_mode="r")[:n])
    if shards:
        store = EmbeddingStore.open(shards)
        if cold:  # one vector a passage fits in RAM: held in the page cache
            for path in shards:
                harness.read_through(Path(path))
    else:
        opened = open_index(index, opened_as(IndexConfig(**(knobs or {})), index))
        if cold:
            _cold_store(opened)
    start, args = time.perf_counter(), (vectors, K, int(MEMORY_GB * GB))
    found = exact_search(store, *args) if shards else search_index(opened, *args)
    seconds = time.perf_counter() - start
    if rows:
        np.save(rows, found.rows)
    figures = {"questions": len(vectors), "search_seconds": round(seconds, 2)}
    return figures | {"ms_per_question": round(1e3 * seconds / len(vectors), 2)}


def _cold_store(opened) -> None:
    """A search's steady state where the token vectors outgrow RAM and the rest does not: the
    token shards dropped from the page cache; their offsets and an index's inverted lists read
    into it."""
    from dpr_cache.retrieval.dense.faiss_index import IVF_DATA_FILE
    from dpr_cache.retrieval.dense.tokens import offsets_path

    shards = [s.path for s in opened.store.shards]
    harness.drop_cached(shards)
    held = [*map(offsets_path, shards), *([opened.path / IVF_DATA_FILE] if opened.faiss else [])]
    for path in held:
        harness.read_through(path)


def _token_store(folder: Path):
    """The token shards in ``folder`` (an index's, in its ``shards``), in order."""
    from dpr_cache.retrieval.dense.tokens import TokenStore

    folder = folder / "shards" if (folder / "shards").is_dir() else folder
    return TokenStore.open(sorted(folder.glob("*-[0-9][0-9][0-9][0-9][0-9].npy")))


def _child_synth(folder: str, counts: str) -> dict:
    """``SYNTH_ROWS`` passages of token counts resampled from the SQuAD index at ``counts``, each
    token a unit vector near one of 4 topics of its passage, written a piece at a time (shards
    there kept); ``FAST_QUESTIONS`` questions of ``QUESTION_TOKENS`` noisy tokens of one each."""
    from dpr_cache.retrieval.dense.tokens import write_token_shard

    start = time.perf_counter()
    squad = _token_store(Path(counts))
    piece, sigma = _synth_draw(squad)
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    for k, first in enumerate(range(0, SYNTH_ROWS, SHARD_ROWS)):
        last = min(first + SHARD_ROWS, SYNTH_ROWS)
        if not (out / f"synth-{k:05d}.npy").is_file():
            pieces = (piece(p, min(PIECE_ROWS, last - p)) for p in range(first, last, PIECE_ROWS))
            write_token_shard(out / f"synth-{k:05d}.npy", pieces)

    def own(row: int) -> np.ndarray:  # its piece drawn again
        first = row - row % PIECE_ROWS
        _, tokens, count = piece(first, min(PIECE_ROWS, SYNTH_ROWS - first))
        return np.split(tokens, np.cumsum(count)[:-1])[row - first]

    questions = _questions(SYNTH_ROWS, FAST_QUESTIONS, own, sigma, squad.dim)
    np.save(out / "questions.npy", questions)
    disk = sum(p.stat().st_size for p in out.glob("synth-*"))
    lengths = piece.keywords["lengths"]
    shape = {"rows": SYNTH_ROWS, "tokens_mean": round(float(lengths.mean()), 1)}
    sizes = {"bytes_per_passage": round(disk / SYNTH_ROWS), "disk_gb": round(disk / GB, 2)}
    return shape | sizes | {"seconds": round(time.perf_counter() - start, 1)}


def _synth_draw(squad) -> tuple:
    """How synthetic passages are drawn: :func:`_piece` given the SQuAD token store's passage
    lengths and the topics' vectors, and the noise a dim (``sigma``)."""
    lengths = np.concatenate([np.diff(s.offsets()) for s in squad.shards])
    centers = nq_like.unit(np.random.default_rng(1).standard_normal((TOPICS, squad.dim), "f4"))
    sigma = 1.2 / np.sqrt(squad.dim)  # noise as long as a topic's vector, about
    return functools.partial(_piece, lengths=lengths, centers=centers, sigma=sigma), sigma


def _questions(passages: int, n: int, own, sigma: float, dim: int) -> np.ndarray:
    """[n, QUESTION_TOKENS, dim] questions (zero past their tokens), each from a passage drawn
    among ``passages``: tokens of it (``own(row)``) drawn without replacement, each with noise
    of ``sigma`` a dim."""
    questions = np.zeros((n, QUESTION_TOKENS, dim), np.float32)
    for i, row in enumerate(np.random.default_rng(2).integers(passages, size=n).tolist()):
        tokens, rng = own(row), np.random.default_rng(10**6 + i)
        some = tokens[
            rng.choice(len(tokens), size=min(QUESTION_TOKENS, len(tokens)), replace=False)
        ]
        noisy = some + sigma * rng.standard_normal(some.shape, np.float32)
        questions[i, : len(some)] = nq_like.unit(noisy)
    return questions


def score_tails(work: Path) -> dict:
    """How far apart exact MaxSim's top scores lie: SQuAD's dev questions over its real token
    vectors; the 1M synthetic passages' exact questions; and synthetic passages as many as
    SQuAD's, with questions drawn from them as the 1M's are."""
    from dpr_cache.retrieval.dense.maxsim import maxsim_search, row_maxsim

    squad, budget = _token_store(work / "squad-multi" / "index"), int(MEMORY_GB * GB)
    real = np.load(work / "q-multi.npy", mmap_mode="r")[:TAIL_QUESTIONS]
    synth, exact = _token_store(work / "synth"), np.load(work / "rows-synth-multi-flat.npy")
    made = np.load(work / "synth" / "questions.npy", mmap_mode="r")[: len(exact)]
    tops = {
        "squad": maxsim_search(squad, np.asarray(real), K, budget).scores,
        "synth 1M": np.stack([row_maxsim(synth, q, r) for q, r in zip(made, exact, strict=True)]),
        "synth squad-size": _small_synth_scores(squad),
    }
    sizes = {"squad": squad.rows, "synth 1M": synth.rows, "synth squad-size": squad.rows}
    return {name: _tail(scores) | {"passages": sizes[name]} for name, scores in tops.items()}


def squad_articles(work: Path) -> dict:
    """Exact MaxSim's top 100 on SQuAD against each question's own article (its positive
    passage's title), for ``TAIL_QUESTIONS`` dev questions spread evenly over all of them (so
    over every dev article): their spread as :func:`_tail` reads it, and :func:`_own_shares`."""
    from collections import Counter

    from dpr_cache.config import load_config
    from dpr_cache.data.folds import article
    from dpr_cache.data.passages import read_passages
    from dpr_cache.data.qas import read_qas
    from dpr_cache.data.records import iter_rows
    from dpr_cache.retrieval.dense.maxsim import maxsim_search

    if DEV_RECORDS is None:
        return {"questions": 0}
    data, dev = load_config(CONFIG).data, Path(DEV_RECORDS)
    records = list(iter_rows(dev))
    if [q for q, _ in read_qas(data.dev_qa)] != [r["question"] for _, r in records]:
        raise ValueError(f"{dev}: not the questions of {data.dev_qa}, in order")
    picked = np.linspace(0, len(records) - 1, min(TAIL_QUESTIONS, len(records))).astype(int)
    squad = _token_store(work / "squad-multi" / "index")
    questions = np.load(work / "q-multi.npy", mmap_mode="r")[picked]
    top = maxsim_search(squad, np.asarray(questions), K, int(MEMORY_GB * GB))
    titles = {pid: title for pid, _, title in read_passages(data.passages)}
    found = [[titles.get(p, "") for p in squad.ids_of(row)] for row in top.rows]
    own = [article(records[i][1], records[i][0], dev) for i in picked.tolist()]
    sizes = Counter(titles.values())
    asked = sorted(sizes[t] for t in set(own))
    first = {article(r, where, dev) for where, r in records[:TAIL_QUESTIONS]}  # score_tails'
    return (
        _tail(top.scores)
        | _own_shares(found, own, top.scores)
        | {"articles": len(asked), "article_paragraphs": [asked[0], asked[-1]]}
        | {"first_questions_paragraphs": sorted(sizes[t] for t in first)}
    )


def _own_shares(found: list[list[str]], own: list[str], scores: np.ndarray) -> dict:
    """Of each question's ranked titles (``found``, their scores descending), the share in its
    own article (``own``): the median over questions in its top ``K``, and pooled over every
    question's ranks 90 to 100; and, as :func:`_tail` reads it, the 90th score's median gap over
    the 100th where those ranks hold none of the question's article and where they hold some."""
    width = min(K, np.shape(scores)[1])
    inside = np.array(
        [[t == mine for t in row[:width]] for row, mine in zip(found, own, strict=True)]
    )
    tenth = width - 1 - max(1, width // 10)
    none = ~inside[:, tenth:].any(axis=1)
    scores = np.asarray(scores)

    def gap(rows: np.ndarray) -> float | None:
        return _tail(scores[rows])["gap_90_100"] if rows.any() else None

    return {
        "own_share_top_100": round(float(np.median(inside.mean(axis=1))), 4),
        "own_share_90_100_pooled": round(float(inside[:, tenth:].mean()), 4),
        "none_of_it_questions": int(none.sum()),
        "gap_90_100_none_of_it": gap(none),
        "gap_90_100_some_of_it": gap(~none),
    }


TAIL_BATCH = 16
"""Questions scored at once against every token of the SQuAD-size synthetic corpus."""


def _small_synth_scores(squad) -> np.ndarray:
    """[TAIL_QUESTIONS, passages] exact MaxSim over as many synthetic passages as ``squad``
    holds, drawn as the 1M's are, of questions drawn from them as the 1M's are."""
    from dpr_cache.retrieval.dense.maxsim import QueryTokens, block_scores

    piece, sigma = _synth_draw(squad)
    _, tokens, count = piece(0, squad.rows)
    own = np.split(tokens, np.cumsum(count)[:-1])
    questions = _questions(squad.rows, TAIL_QUESTIONS, own.__getitem__, sigma, squad.dim)
    offsets = np.concatenate([[0], np.cumsum(count)])
    return np.concatenate(
        [
            block_scores(QueryTokens.of(questions[i : i + TAIL_BATCH]), tokens, offsets)
            for i in range(0, TAIL_QUESTIONS, TAIL_BATCH)
        ]
    )


def _tail(scores: np.ndarray) -> dict:
    """Medians over questions (rows of ``scores``) of their exact top scores' spread: the 2nd
    and the last of the top ``K`` over the 1st, and the gap from the 90th to the 100th over the
    100th."""
    top = -np.sort(-np.asarray(scores, np.float64), axis=1)[:, :K]
    last = top.shape[1] - 1
    tenth = last - max(1, top.shape[1] // 10)

    def median(values: np.ndarray) -> float:
        return round(float(np.median(values)), 4)

    return {
        "questions": len(top),
        "second_over_first": median(top[:, 1] / top[:, 0]),
        "last_over_first": median(top[:, last] / top[:, 0]),
        "gap_90_100": median((top[:, tenth] - top[:, last]) / top[:, last]),
    }


def _piece(first: int, n: int, lengths: np.ndarray, centers: np.ndarray, sigma: float) -> tuple:
    """Passages ``first`` to ``first + n`` (their ids, tokens and counts), drawn from a
    generator seeded by ``first``."""
    rng = np.random.default_rng(first)
    count = lengths[rng.integers(len(lengths), size=n)]
    topics = rng.integers(len(centers), size=(n, 4))
    pick = topics[np.repeat(np.arange(n), count), rng.integers(4, size=int(count.sum()))]
    noise = rng.standard_normal((int(count.sum()), centers.shape[1]), np.float32)
    tokens = nq_like.unit(centers[pick] + sigma * noise)
    return [str(first + i) for i in range(n)], tokens, count


CHILDREN = {
    "model": _child_model,
    "questions": _child_questions,
    "build": _child_build,
    "search": _child_search,
    "synth": _child_synth,
}
"""What :func:`_run` runs in a child process, by name."""

STEPS = {
    "squad_single": lambda work: squad_index(work, "single"),
    "squad_multi": lambda work: squad_index(work, "multi"),
    "squad_search": squad_search,
    "synth_write": lambda work: _run(  # see _child_synth
        work, "synth.txt", "synth", folder=work / "synth", counts=work / "squad-multi" / "index"
    ),
    "synth_build": synth_build,
    "synth_search": synth_search,
    "synth_tradeoff": synth_tradeoff,
    "score_tails": score_tails,
    "squad_articles": squad_articles,
}


def render(results: dict, out: Path, source: Path | None = None) -> Path:
    """``out/multivector_scale.md``: targets, costs, speeds, the projection to 21M."""
    machine = harness.cpu_text(results["machines"]["synth_search"])
    intro = (
        "Written by `python -m benchmarks.multivector_scale --work runs/multivector_scale --out"
        f" docs/bench` (resumable; data: `multivector_scale.json`). {machine}. Searches: top {K}"
        f" within `--memory-gb {MEMORY_GB:g}`, a batch timed once loaded (ms a question: its"
        " seconds over its size); peak RSS: the whole process's (`wait4`)."
    )
    return harness.write_page(
        Path(out) / "multivector_scale.md",
        "Late interaction at scale, on a CPU",
        intro,
        "## Targets",
        harness.targets_table(_targets(results)),
        *harness.step_machines(results["machines"]),
        *_squad_section(results),
        *_synth_section(results),
        "## Projected to 21M passages (DPR's Wikipedia)",
        "Linear in passages: disk; exact search's seconds (it reads every token once a batch; its"
        " memory is the budget's); the fast path's latency, an estimate (its lists grow with the"
        " corpus; at 21M they and the shards outgrow RAM). Its peak RSS counts the touched pages"
        " of its memory-mapped lists (droppable file pages, growing to the index's size).",
        harness.format_table(PROJECTION, _projection(results)),
    )


PROJECTION = ("at 21M | disk GB | RAM GB | ms a question", "{name} | {disk} | {ram} | {ms}")
SEARCH = (
    "search | questions | ms a question | speed-up on exact multi | peak RSS GB"
    " | recall@100 vs exact",
    "{name} | {questions} | {ms_per_question} | {speedup} | {peak_rss_gb} | {recall}",
)
TRADEOFF = (
    "token hits | candidates | nprobe | ms a question | speed-up on exact | recall@100 vs exact",
    "{ivf_token_hits} | {ivf_candidates} | {ivf_nprobe} | {ms_per_question} | {speedup} | {recall}",
)
COST = (
    "model | bytes a passage | tokens a passage | encode passages/s | index peak RSS GB",
    "{name} | {bytes_per_passage:,} | {per} | {passages_per_s} | {peak_rss_gb}",
)


def _targets(results: dict) -> list[dict]:
    fast = results["synth_tradeoff"][DEFAULT_KNOBS]
    speedup = results["synth_search"]["multi flat"]["ms_per_question"] / fast["ms_per_question"]
    peaks = [r["peak_rss_gb"] for r in results["synth_search"].values()]
    detail = (
        f"1M synthetic passages, ivfpq at its defaults against exact MaxSim, top {K}, the same"
        f" {EXACT_QUESTIONS} questions"
    )
    targets = (
        ("fast path's recall@100 of exact", fast["recall_at_100"], f">= {RECALL_GOAL}", detail),
        ("fast path's speed-up on exact", speedup, f">= {SPEEDUP_GOAL}", detail),
        ("peak RSS of a search, GB", max(peaks), f"<= {MEMORY_GB:g}", "--memory-gb bound"),
    )
    return [harness.goal_target(*target) for target in targets]


def _squad_section(results: dict) -> list:
    single, multi, squad = (results[k] for k in ("squad_single", "squad_multi", "squad_search"))
    build = squad["multi ivfpq"]["build"]
    per = round(multi["tokens"] / multi["rows"], 1)
    rows = [{**single, "name": "single (384-d)", "per": "-"}]
    rows.append({**multi, "name": "multi (128-d a token)", "per": per})
    return [
        f"## SQuAD: {single['rows']:,} passages, all-MiniLM-L6-v2, {PASSAGE_TOKENS} tokens",
        "Multi-vector: all-MiniLM-L6-v2 with a new projection to 128 dims; fp16 token vectors,"
        " every token kept ([CLS], [SEP] too). Encoding: the index command's rate (fp32, model"
        " loading left out).",
        harness.format_table(COST, rows),
        harness.format_table(SEARCH, _speedups(squad, squad)),
        f"The ivfpq index: {build['nlist']} lists, {PQ_M}-byte codes and an 8-byte id a token,"
        f" {build['index_gb']} GB, built in {build['build_seconds']} s. At this size the fast path"
        " only adds work, its shortlist half the corpus: its recall here says little. The shards"
        " here are held in the page cache (they fit in RAM).",
    ]


def _synth_section(results: dict) -> list:
    write, build, synth = results["synth_write"], results["synth_build"], results["synth_search"]
    return [
        f"## {write['rows']:,} synthetic passages",
        f"Token vectors written directly: token counts drawn from the SQuAD index's (mean"
        f" {write['tokens_mean']}), each token near one of 4 topics of its passage (of {TOPICS:,});"
        f" questions: {QUESTION_TOKENS} noisy tokens of one passage. Shards: {write['disk_gb']} GB"
        f" ({write['bytes_per_passage']:,} bytes a passage). The ivfpq index: {build['nlist']}"
        f" lists, {PQ_M}-byte codes and an 8-byte id a token, {build['index_gb']} GB, built in"
        f" {build['build_seconds']} s (peak RSS {build['peak_rss_gb']} GB, the merged lists"
        f" mapped). Exact search: the first {EXACT_QUESTIONS} questions in one pass (the fast"
        " path's recall on them: a few points either way). One vector a passage: as many"
        " clustered 384-d fp16 vectors, searched flat. Before each timed search the token shards"
        " are dropped from the page cache (`posix_fadvise`: they outgrow this machine's RAM, so a"
        " question's candidates come from disk) and what fits is read into it, as a running"
        " search service holds it: the token offsets, the ivfpq index's lists, the shards of one"
        " vector a passage. One timing each.",
        harness.format_table(SEARCH, _speedups(synth, synth)),
        f"The fast path's knobs (`index.ivf_token_hits`, `index.ivf_candidates`, a passage asked"
        f" for each; `index.ivf_nprobe`) on the {EXACT_QUESTIONS} questions searched exactly:",
        harness.format_table(TRADEOFF, _speedups(results.get("synth_tradeoff", {}), synth)),
        f"{_tails_text(results['score_tails'], results.get('squad_articles'))} Recall@100 of"
        " exact here measures the order of"
        " near-ties: it climbs slowly with depth, and"
        f" {_meeting(results.get('synth_tradeoff', {}), synth)}.",
    ]


def _spread(t: dict) -> str:
    """A :func:`_tail` record in words."""
    return (
        f"the 2nd {t['second_over_first']} of the 1st, the 100th {t['last_over_first']}, the"
        f" 90th {100 * t['gap_90_100']:.2f}% above the 100th"
    )


def _tails_text(tails: dict, articles: dict | None) -> str:
    """What the exact top scores' spread says of the synthetic ranks, beside SQuAD's (and where
    SQuAD's top 100 lies against the questions' own articles, when measured)."""
    synth, small, squad = (tails[k] for k in ("synth 1M", "synth squad-size", "squad"))
    return (
        f"Exact's top scores (medians over questions; data: `score_tails`): here"
        f" ({synth['questions']} questions) {_spread(synth)} ({100 * small['gap_90_100']:.2f}% over"
        f" {small['passages']:,} passages drawn the same way, where the ranks below the first"
        " share no topic): below the first, the ranks are ordered by noise. On SQuAD's real"
        " token vectors"
        f" ({squad['questions']} dev questions, {squad['passages']:,} passages) {_spread(squad)}."
        + _articles_text(articles, squad["questions"])
    )


def _articles_text(articles: dict | None, first_asked: int) -> str:
    """SQuAD's spread over questions of every dev article, beside that of the ``first_asked``
    dev questions, and against each question's own article (nothing if unmeasured)."""
    if not articles or not articles["questions"]:
        return ""
    a, first = articles, articles["first_questions_paragraphs"]
    low, high = a["article_paragraphs"]
    where = {
        "some": "hold some of it",
        "none": f"hold none ({a['none_of_it_questions']} questions)",
    }
    split = " and ".join(
        f"{100 * a[f'gap_90_100_{k}_of_it']:.2f}% where they {text}"
        for k, text in where.items()
        if a[f"gap_90_100_{k}_of_it"] is not None
    )
    return (
        f" Those {first_asked} are the first dev questions, from {len(first)} of its articles"
        f" ({', '.join(map(str, first))} paragraphs). Over {a['questions']} questions spread"
        f" evenly over all {a['articles']} dev articles ({low} to {high} paragraphs; data:"
        f" `squad_articles`): {_spread(a)}. A median {100 * a['own_share_top_100']:.0f}% of a"
        " question's top 100 lie in its own article, and"
        f" {100 * a['own_share_90_100_pooled']:.0f}% of all their ranks 90 to 100; the 90th's"
        f" gap over the 100th: {split}."
    )


def _meeting(tradeoff: dict, synth: dict) -> str:
    """Which settings tried reach the goal's recall@100 at its speed-up on the exact search."""
    exact = synth["multi flat"]["ms_per_question"]
    met = [
        name
        for name, r in tradeoff.items()
        if r["recall_at_100"] >= RECALL_GOAL and exact / r["ms_per_question"] >= SPEEDUP_GOAL
    ]
    goal = f"{RECALL_GOAL} at {SPEEDUP_GOAL}x"
    return f"{' and '.join(met)} reach {goal}" if met else f"no setting tried reaches {goal}"


def _speedups(runs: dict, searches: dict) -> list[dict]:
    """``runs``' rows, each named, with its speed-up on the exact multi search of ``searches``."""
    exact = searches["multi flat"]["ms_per_question"]
    return [
        {**r, "name": name, "speedup": round(exact / r["ms_per_question"], 1)}
        | {"recall": r.get("recall_at_100", "-")}
        for name, r in runs.items()
    ]


def _projection(results: dict) -> list[dict]:
    """Disk, RAM and ms a question at 21M: the 1M figures scaled linearly."""
    scale = harness.NQ_PASSAGES / results["synth_write"]["rows"]
    tokens_gb = results["synth_write"]["disk_gb"] * scale
    index_gb = results["synth_build"]["index_gb"] * scale
    single = 384 * 2 * harness.NQ_PASSAGES / GB
    disk = {"single flat": single, "multi flat": tokens_gb, "multi ivfpq": tokens_gb + index_gb}
    ram = {"multi ivfpq": f"{MEMORY_GB:g} + {index_gb:.0f} mapped"}
    ms = {name: round(r["ms_per_question"] * scale) for name, r in results["synth_search"].items()}
    return [
        {"name": n, "disk": round(gb), "ram": ram.get(n, f"{MEMORY_GB:g}"), "ms": ms[n]}
        for n, gb in disk.items()
    ]


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["child"]:
        print(json.dumps(CHILDREN[argv[1]](**json.loads(argv[2]))), flush=True)
        return
    work = Path("runs/multivector_scale")
    harness.run_steps(argv, __doc__.split("\n")[0], STEPS, work, "multivector_scale.json", render)


if __name__ == "__main__":
    main()
