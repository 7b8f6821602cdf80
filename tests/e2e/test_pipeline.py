"""End to end on the toy corpus: train -> index -> eval through the real CLI."""

from __future__ import annotations

import json

import torch
from transformers import AutoModel, AutoTokenizer

from tests.support.cli import run_cli, toy_overrides
from tests.support.fixtures import TOY, saved_weights


def test_train_index_eval(tmp_path):
    args = ["--config", "configs/toy.yaml", *toy_overrides(tmp_path, **{"train.max_steps": 16})]
    run_cli("train", *args, "-q")
    run_cli("index", *args, "-q")
    proc = run_cli("eval", *args, "-q")
    out = tmp_path / "run"

    assert "hit rate" in proc.stdout
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == list(range(1, 17))
    assert {
        "loss",
        "lr",
        "grad_norm",
        "batch_size",
        "negatives_per_question",
        "seconds",
        "peak_memory_bytes",
    } <= log[0].keys()
    assert log[0]["negatives_per_question"] == 16 * 2 - 1
    first, last = log[0]["loss"], sum(r["loss"] for r in log[-4:]) / 4
    assert last < 0.8 * first, (first, last)  # the loss falls

    assert (out / "config.yaml").is_file()
    for tower in ("query_encoder", "passage_encoder"):
        AutoModel.from_pretrained(out / "model" / tower)  # plain Hugging Face format

    metrics = json.loads((out / "eval" / "metrics.json").read_text())
    assert {"top1", "top5", "top20", "top100", "n_questions", "mrr@10", "ndcg@10"} <= set(metrics)
    assert not any(k.startswith("top") for k in metrics["measured"])
    assert metrics["n_questions"] == 263
    results = json.loads((out / "eval" / "retrieval.json").read_text())
    for k in (1, 5, 20, 100):  # recounted here from the flags written beside each passage
        found = sum(any(c["has_answer"] for c in entry["ctxs"][:k]) for entry in results)
        assert abs(metrics[f"top{k}"] - 100 * found / len(results)) < 0.01, k
    assert len(results) == 263 and len(results[0]["ctxs"]) == 100
    assert {"id", "title", "text", "score", "has_answer"} <= results[0]["ctxs"][0].keys()
    scores = [c["score"] for c in results[0]["ctxs"]]
    assert scores == sorted(scores, reverse=True)


def _accumulate_loss_from_scratch(tmp_path, batch_size: int, micro: int) -> float:
    """Step 1's loss of plain accumulation, computed here: the untrained tiny BERT run through
    ``transformers`` (mean pooling, dropout off), each micro-batch of ``micro`` questions scored
    against its own passages only, false negatives (same passage id) masked, temperature 0.05."""
    from dpr_cache.data.batches import TrainBatches
    from dpr_cache.data.training import load_training_set
    from dpr_cache.train.recipe import BatchRecipe

    dataset = load_training_set(TOY / "train.jsonl", tmp_path / "ref-cache")
    tok = AutoTokenizer.from_pretrained(TOY / "tiny-bert")
    recipe = BatchRecipe(hard_negatives=1, max_query_length=32, max_passage_length=128, seed=42)
    batch = recipe.batch(dataset, TrainBatches(len(dataset), batch_size, 42), tok, 0)
    bert = AutoModel.from_pretrained(
        TOY / "tiny-bert", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0
    ).eval()

    def mean_pool(inputs):
        hidden = bert(**inputs).last_hidden_state
        mask = inputs["attention_mask"].unsqueeze(-1).float()
        return (hidden * mask).sum(1) / mask.sum(1)

    with torch.no_grad():
        q, p = mean_pool(batch.q_inputs), mean_pool(batch.p_inputs)
    losses = []
    for start in range(0, batch_size, micro):
        qs, ps = q[start : start + micro], p[2 * start : 2 * (start + micro)]
        ids = batch.p_ids[2 * start : 2 * (start + micro)]
        for i in range(len(qs)):
            pos = 2 * i
            keep = (ids != ids[pos]) | (torch.arange(len(ids)) == pos)
            scores = ps[keep] @ qs[i] / 0.05
            losses.append(float(torch.logsumexp(scores, 0) - ps[pos] @ qs[i] / 0.05))
    return sum(losses) / len(losses)


def test_modes_full_gradcache_and_accumulate(tmp_path):
    """Dropout off, 2 steps of B=16 in chunks of 4: the full batch and GradCache train the same
    weights; plain accumulation does not (each question meets 7 negatives, not 31), and its
    first logged loss equals the one computed from scratch above."""
    runs = {}
    for mode in ("gradcache", "full", "accumulate"):
        sets = {"train.mode": mode, "train.max_steps": 2, "model.dropout": 0.0}
        sets["train.adam_eps"] = 1e-4  # Adam would blow rounding noise up to lr-sized steps
        run_cli("train", "--config", "configs/toy.yaml", *toy_overrides(tmp_path / mode, **sets))
        log = (tmp_path / mode / "run" / "train_log.jsonl").read_text().splitlines()
        runs[mode] = (
            [json.loads(line) for line in log],
            saved_weights(tmp_path / mode / "run" / "model"),
        )
    negatives = {mode: log[0]["negatives_per_question"] for mode, (log, _) in runs.items()}
    assert negatives == {"gradcache": 16 * 2 - 1, "full": 16 * 2 - 1, "accumulate": 4 * 2 - 1}

    def gap(a: str, b: str) -> float:
        wa, wb = runs[a][1], runs[b][1]
        return max((wa[k] - wb[k]).abs().max().item() for k in wa)

    assert gap("full", "gradcache") < 1e-5
    assert gap("full", "accumulate") > 100 * max(gap("full", "gradcache"), 1e-7)
    assert abs(runs["full"][0][0]["loss"] - runs["gradcache"][0][0]["loss"]) < 1e-5
    want = _accumulate_loss_from_scratch(tmp_path, 16, 4)
    assert abs(runs["accumulate"][0][0]["loss"] - want) < 1e-4, (runs["accumulate"][0][0], want)
    assert abs(runs["full"][0][0]["loss"] - want) > 0.1  # more negatives, a larger loss


def test_verify_reports_a_tiny_gap_its_bound_and_the_verdict(tmp_path):
    proc = run_cli("verify", "--config", "configs/toy.yaml", *toy_overrides(tmp_path), "--double")
    line = next(x for x in proc.stdout.splitlines() if "max relative grad difference" in x)
    assert float(line.split(":")[1].split()[0]) < 1e-10 and "(bound 1e-10 in float64)" in line
    assert "verdict: equal" in proc.stdout


def test_verify_calls_a_wrong_gradient_different(tmp_path, monkeypatch):
    """Negative control: a GradCache whose loss is 1% off is over the bound and said so."""
    from dpr_cache.config import load_config
    from dpr_cache.train import step as step_module
    from dpr_cache.train import verify as verify_module

    real = step_module.make_stepper

    def skewed(mode, towers, loss_fn, **kwargs):
        if mode == "gradcache":
            return real(mode, towers, lambda q, p, **kw: 1.01 * loss_fn(q, p, **kw), **kwargs)
        return real(mode, towers, loss_fn, **kwargs)

    monkeypatch.setattr(step_module, "make_stepper", skewed)
    overrides = [a for a in toy_overrides(tmp_path) if a != "--set"]
    report = verify_module.verify(load_config("configs/toy.yaml", overrides), double=True)
    assert report["verdict"].startswith("DIFFERENT")
    assert float(report["max relative grad difference"].split()[0]) > 1e-3
