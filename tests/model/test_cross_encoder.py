"""The cross-encoder teacher: its scores against ``transformers`` run directly (and against
sentence-transformers' CrossEncoder), the pair encoding, length-sorted batches returned in input
order, the two-label rule, refused folders and non-finite scores, bf16 autocast on the CPU."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from dpr_cache.errors import InputError
from dpr_cache.model.biencoder import BiEncoder
from dpr_cache.model.cross_encoder import (
    NonFiniteScore,
    Pair,
    load_cross_encoder,
    score_pairs,
    tokenize_pairs,
)
from tests.support.fixtures import TOY
from tests.support.tiny_bert import build_tiny_cross_encoder

CROSS = TOY / "tiny-cross-encoder"
BERT = TOY / "tiny-bert"
# fp32 logits from batches of other shapes (padding, order) differ by a few ulps per layer;
# how far apart depends on the CPU's kernels, so the bound leaves room above 1e-6.
FP32 = 1e-5


def toy_pairs(n_records: int = 12) -> list[Pair]:
    """Each record's (question, positive) and (question, hard negative) pairs of the toy training
    file, a long passage that must be truncated and two pairs without a title, shuffled so that
    the input is not in length order."""
    lines = (TOY / "train.jsonl").read_text("utf-8").splitlines()[:n_records]
    pairs = []
    for record in map(json.loads, lines):
        for ctx in record["positive_ctxs"] + record["hard_negative_ctxs"]:
            pairs.append(Pair(record["question"], ctx["title"], ctx["text"]))
    long_text = " ".join(p.text for p in pairs[:6])
    pairs.append(Pair(pairs[0].question, pairs[0].title, long_text))
    pairs.append(Pair(pairs[1].question, None, pairs[1].text))
    pairs.append(Pair(pairs[2].question, "", pairs[2].text))
    random.Random(0).shuffle(pairs)
    return pairs


def reference_logits(
    folder: Path, pairs: list[Pair], max_length: int = 256, truncation: str = "only_second"
) -> torch.Tensor:
    """``transformers`` run directly: the pairs in their order, one padded batch, fp32."""
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForSequenceClassification.from_pretrained(folder).eval()
    passages = [f"{p.title} {p.text}" if p.title else p.text for p in pairs]
    inputs = tokenizer(
        [p.question for p in pairs],
        passages,
        truncation=truncation,
        max_length=max_length,
        padding=True,
        return_tensors="pt",
    )
    with torch.no_grad():
        return model(**inputs).logits


@pytest.fixture(scope="module")
def cross():
    return load_cross_encoder(CROSS, device="cpu")


@pytest.fixture(scope="module")
def pairs() -> list[Pair]:
    return toy_pairs()


def test_scores_equal_transformers_in_input_order(cross, pairs) -> None:
    scores = score_pairs(cross, pairs, batch_size=5)  # 39 pairs: an uneven last batch
    reference = reference_logits(CROSS, pairs)[:, 0].numpy()
    assert scores.dtype == np.float32 and scores.shape == (len(pairs),)
    np.testing.assert_allclose(scores, reference, rtol=0, atol=FP32)
    # negative controls: the scores spread far beyond the tolerance, and the length order that
    # the batches run in is not the input order, so a score returned in the wrong place fails
    assert np.diff(np.sort(scores)).max() > 1e-2 and scores.std() > 0.1
    lengths = [len(ids) for ids in tokenize_pairs(cross.tokenizer, pairs, 256)["input_ids"]]
    by_length = np.argsort(-np.array(lengths), kind="stable")
    assert not np.allclose(scores[by_length], reference, rtol=0, atol=1e-3)


def test_a_group_scores_the_same_in_any_order_and_batch_size(cross, pairs) -> None:
    scores = score_pairs(cross, pairs, batch_size=64)
    perm = np.random.default_rng(1).permutation(len(pairs))
    again = score_pairs(cross, iter([pairs[i] for i in perm]), batch_size=3)
    np.testing.assert_allclose(again, scores[perm], rtol=0, atol=FP32)
    assert score_pairs(cross, []).shape == (0,)


def test_batches_run_longest_first_each_padded_to_its_longest(cross, pairs) -> None:
    widths: list[int] = []

    def record(module, args, kwargs):
        widths.append(kwargs["input_ids"].shape[1])
        assert kwargs["attention_mask"][:, -1].any()  # no column of padding only

    lengths = [len(ids) for ids in tokenize_pairs(cross.tokenizer, pairs, 256)["input_ids"]]
    handle = cross.model.register_forward_pre_hook(record, with_kwargs=True)
    try:
        score_pairs(cross, pairs, batch_size=4)
    finally:
        handle.remove()
    assert len(widths) == -(-len(pairs) // 4)
    assert widths == sorted(widths, reverse=True)
    assert widths[0] == max(lengths) == 256 and widths[-1] < 256  # the long passage is cut


def test_a_pair_without_a_title_is_its_text_alone(cross, pairs) -> None:
    titled = next(p for p in pairs if p.title)
    untitled = [
        Pair(titled.question, None, titled.text),
        Pair(titled.question, "", titled.text),
        Pair(titled.question, "  ", titled.text),
        Pair(titled.question, "", f"{titled.title} {titled.text}"),
        titled,
    ]
    ids = tokenize_pairs(cross.tokenizer, untitled, 256)["input_ids"]
    assert ids[0] == ids[1] == ids[2]  # no title, an empty one, a blank one: the text alone
    assert ids[3] == ids[4]  # the title goes before the text, a space between
    assert ids[0] != ids[4]
    # equal rows of one batch may differ in their last bits (the CPU's kernels tile the rows)
    scores = score_pairs(cross, untitled)
    text_alone = reference_logits(CROSS, [Pair(titled.question, None, titled.text)])[0, 0]
    assert all(abs(scores[i] - text_alone.item()) <= FP32 for i in range(3)), scores
    assert abs(scores[3] - scores[4]) <= FP32
    assert abs(scores[0] - scores[4]) > 1e-3  # negative control: the title does count


def test_only_the_passage_is_truncated(pairs) -> None:
    cross = load_cross_encoder(CROSS, max_length=32, device="cpu")
    assert cross.max_length == 32
    features = tokenize_pairs(cross.tokenizer, pairs, 32)
    tokenizer = AutoTokenizer.from_pretrained(CROSS)
    for pair, ids, types in zip(
        pairs, features["input_ids"], features["token_type_ids"], strict=True
    ):
        question = tokenizer(pair.question)["input_ids"]  # [CLS] question [SEP], whole
        assert len(ids) <= 32 and ids[: len(question)] == question
        assert types[: len(question)] == [0] * len(question) and set(types[len(question) :]) == {1}
    reference = reference_logits(CROSS, pairs, max_length=32)[:, 0].numpy()
    np.testing.assert_allclose(score_pairs(cross, pairs), reference, rtol=0, atol=FP32)


def test_a_question_over_the_limit_is_cut_as_well(pairs) -> None:
    cross = load_cross_encoder(CROSS, max_length=32, device="cpu")
    long_question = Pair(" ".join([pairs[0].question] * 4), pairs[0].title, pairs[0].text)
    group = [pairs[1], long_question, pairs[2]]
    scores = score_pairs(cross, group)
    assert len(tokenize_pairs(cross.tokenizer, [long_question], 32)["input_ids"][0]) == 32
    short = reference_logits(CROSS, [pairs[1], pairs[2]], max_length=32)[:, 0].numpy()
    cut = reference_logits(CROSS, [long_question], max_length=32, truncation="longest_first")
    np.testing.assert_allclose(scores, [short[0], cut[0, 0].item(), short[1]], rtol=0, atol=FP32)


def test_the_length_limit_defaults_to_the_tokenizers_and_is_checked() -> None:
    assert load_cross_encoder(CROSS, device="cpu").max_length == 256
    for bad in (0, 257):
        with pytest.raises(InputError, match=r"max length .* outside 1\.\.256"):
            load_cross_encoder(CROSS, max_length=bad, device="cpu")


def test_two_labels_score_label_1_minus_label_0(tmp_path: Path, pairs) -> None:
    folder = build_tiny_cross_encoder(BERT, tmp_path / "two", num_labels=2)
    cross = load_cross_encoder(folder, device="cpu")
    scores = score_pairs(cross, pairs, batch_size=7)
    logits = reference_logits(folder, pairs)
    np.testing.assert_allclose(scores, (logits[:, 1] - logits[:, 0]).numpy(), rtol=0, atol=FP32)
    # the score's sigmoid is the softmax probability of label 1 (what 2-label rerankers rank by)
    probability = torch.softmax(logits, dim=1)[:, 1].numpy()
    np.testing.assert_allclose(1 / (1 + np.exp(-scores.astype(np.float64))), probability, atol=1e-6)
    # negative control: label 1's logit alone is another score
    assert np.abs(scores - logits[:, 1].numpy()).max() > 1e-2


def one_line_error(excinfo: pytest.ExceptionInfo, folder: Path) -> str:
    message = str(excinfo.value)
    assert "\n" not in message and str(folder) in message
    return message


def test_three_labels_are_refused(tmp_path: Path) -> None:
    folder = build_tiny_cross_encoder(BERT, tmp_path / "three", num_labels=3)
    with pytest.raises(InputError) as excinfo:
        load_cross_encoder(folder, device="cpu")
    assert "3 labels" in one_line_error(excinfo, folder)


def test_a_plain_bert_folder_is_refused() -> None:
    with pytest.raises(InputError) as excinfo:
        load_cross_encoder(BERT, device="cpu")
    message = one_line_error(excinfo, BERT)
    assert "not a cross-encoder" in message and "BertModel" in message


def test_a_bi_encoder_folder_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "biencoder"
    BiEncoder.from_pretrained(BERT).save_pretrained(folder)
    with pytest.raises(InputError) as excinfo:
        load_cross_encoder(folder, device="cpu")
    assert "bi-encoder" in one_line_error(excinfo, folder)


def test_a_classifier_config_without_a_trained_head_is_refused(tmp_path: Path) -> None:
    """A BertModel's weights under a config that claims a classifier: the head would be random."""
    folder = tmp_path / "headless"
    shutil.copytree(BERT, folder)
    config = json.loads((folder / "config.json").read_text())
    config.update(architectures=["BertForSequenceClassification"], num_labels=1)
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(InputError) as excinfo:
        load_cross_encoder(folder, device="cpu")
    assert "classifier" in one_line_error(excinfo, folder)


def test_a_folder_without_a_model_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InputError) as excinfo:
        load_cross_encoder(tmp_path, device="cpu")
    assert "no config.json" in one_line_error(excinfo, tmp_path)
    with pytest.raises(InputError) as excinfo:
        load_cross_encoder(tmp_path / "missing", device="cpu")
    assert "no such" in one_line_error(excinfo, tmp_path / "missing")


def test_unreadable_weights_are_refused(tmp_path: Path) -> None:
    folder = tmp_path / "broken"
    shutil.copytree(CROSS, folder)
    (folder / "model.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(InputError) as excinfo:
        load_cross_encoder(folder, device="cpu")
    assert "cannot load" in one_line_error(excinfo, folder)


def test_non_finite_scores_are_refused(tmp_path: Path, pairs) -> None:
    folder = tmp_path / "inf"
    model = AutoModelForSequenceClassification.from_pretrained(CROSS)
    with torch.no_grad():
        model.classifier.weight.fill_(float("inf"))
    model.save_pretrained(folder)
    shutil.copy(CROSS / "tokenizer.json", folder)
    shutil.copy(CROSS / "tokenizer_config.json", folder)
    cross = load_cross_encoder(folder, device="cpu")
    with pytest.raises(NonFiniteScore) as excinfo:
        score_pairs(cross, pairs[:3])
    message = one_line_error(excinfo, folder)
    assert isinstance(excinfo.value, InputError) and excinfo.value.index == 0
    assert "pair 0" in message and "3 of 3 scores are not finite" in message


def test_bf16_autocast_on_cpu_stays_close_to_fp32(cross, pairs) -> None:
    """bf16 keeps 8 significant bits: each rounding is off by up to 2**-9 (0.2%) of its value.
    A score goes through two layers, the pooler and the classifier with rounded operands (fp32
    accumulation) and is itself rounded to bf16, a dozen or so roundings in a row: a few percent
    of the score's size at worst (about 1% on this model). The bound is 5% of the largest score's
    size (at least 1); the ranking must stay nearly the same (Spearman over 0.95)."""
    fp32 = score_pairs(cross, pairs, batch_size=8)
    bf16 = score_pairs(cross, pairs, batch_size=8, precision="bf16")
    scale = max(1.0, float(np.abs(fp32).max()))
    assert np.abs(bf16 - fp32).max() <= 0.05 * scale
    assert np.corrcoef(np.argsort(np.argsort(bf16)), np.argsort(np.argsort(fp32)))[0, 1] > 0.95
    assert not np.array_equal(bf16, fp32)  # negative control: bf16 did run


def test_sentence_transformers_cross_encoder_agrees(cross, pairs) -> None:
    """sentence-transformers' CrossEncoder, its activation off, gives the same logits for pairs
    under the length limit (it truncates the longest side, which only matters over it)."""
    st = pytest.importorskip("sentence_transformers")
    short = [
        p for p in pairs if len(tokenize_pairs(cross.tokenizer, [p], 10**6)["input_ids"][0]) < 256
    ]
    assert len(pairs) > len(short) > 20
    model = st.CrossEncoder(str(CROSS), device="cpu")
    passages = [f"{p.title} {p.text}" if p.title else p.text for p in short]
    theirs = model.predict(
        list(zip([p.question for p in short], passages, strict=True)),
        activation_fn=torch.nn.Identity(),
    )
    np.testing.assert_allclose(score_pairs(cross, short), theirs, rtol=0, atol=FP32)
