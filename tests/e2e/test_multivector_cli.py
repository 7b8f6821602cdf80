"""``model.vectors: multi`` through the CLI on the toy config: ``verify --double`` proves the
configured multi-vector step (every loss option, a token budget, distillation) equal to the
full batch; with LoRA the base stays frozen, the adapters and the projection train, GradCache
stays exact and the merged export loads in sentence-transformers; what a multi-vector model does
not take is refused in one line. (What ``train`` saves, loaded by sentence-transformers:
``test_multivector_retrieval_cli.py``, on its trained run.)"""

from __future__ import annotations

import pytest
import torch

from dpr_cache.model.biencoder import BiEncoder
from tests.support.cli import run_cli, toy_overrides

st = pytest.importorskip("sentence_transformers")

pytestmark = pytest.mark.slow

MULTI = ["--set", "model.vectors=multi", "--set", "model.multi_dim=16"]


def _gap(stdout: str) -> float:
    line = next(x for x in stdout.splitlines() if "max relative grad difference" in x)
    return float(line.split(":")[1].split()[0])


def test_verify_proves_the_multi_vector_step(tmp_path) -> None:
    options = [
        "train.directions=[query_to_passage,passage_to_query,query_to_query,passage_to_passage]",
        "train.hardness=all",
        "train.hardness_strength=5",
        "train.chunk_tokens=300",
        "train.loss_tile_size=5",
    ]
    sets = [a for o in options for a in ("--set", o)]
    args = ["--config", "configs/toy.yaml", *toy_overrides(tmp_path), *MULTI]
    proof = run_cli("verify", *args, *sets, "--double")
    assert "verdict: equal" in proof.stdout and _gap(proof.stdout) <= 1e-10


@pytest.mark.parametrize(
    "extra, message",
    [
        (
            "train.matryoshka_dims=[16,8]",
            "error: train.matryoshka_dims: a multi-vector model (model.vectors: multi) trains "
            "its token vectors at one width (model.multi_dim)",
        ),
        ("model.multi_dim=1000", "error: model.multi_dim: 1000 is not 1 to the model's width"),
        ("model.vectors=single", "error: model.multi_dim: 16, but the model encodes one vector"),
        ("model.normalize=false", "error: model.normalize: false, but a multi-vector model's"),
        (
            "train.eval_every=2",
            "error: train.eval_every: validation during training scores one vector a text",
        ),
    ],
)
def test_what_a_multi_vector_model_does_not_take_is_one_line(tmp_path, extra, message) -> None:
    args = ["--config", "configs/toy.yaml", *toy_overrides(tmp_path), *MULTI]
    refused = run_cli("train", *args, "--set", extra, check=False)
    assert refused.returncode == 2
    assert refused.stderr.strip().startswith(message), refused.stderr
    assert not (tmp_path / "run" / "model").exists()


def _token_vectors(model: BiEncoder, texts: list[str]) -> torch.Tensor:
    tok = model.tokenizer(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        return model.encode_query(dict(tok))


def test_lora_on_a_multi_vector_model(tmp_path) -> None:
    lora = ["--set", "model.lora={r: 4, alpha: 8}"]
    args = ["--config", "configs/toy.yaml", *toy_overrides(tmp_path), *MULTI, *lora]
    proof = run_cli("verify", *args, "--double")
    assert "verdict: equal" in proof.stdout and _gap(proof.stdout) <= 1e-10
    run_cli("train", *args, "-q")
    saved = tmp_path / "run" / "model"
    assert (saved / "query_encoder" / "adapter_config.json").is_file()
    assert (saved / "query_encoder" / "1_Dense" / "model.safetensors").is_file()
    trained = BiEncoder.from_pretrained(saved).eval()
    texts = ["Who wrote Hamlet?", "What is the capital of France?"]
    ours = _token_vectors(trained, texts)
    run_cli("export", "--format", "merged", "--model", str(saved), "--out", str(tmp_path / "m"))
    merged = BiEncoder.from_pretrained(tmp_path / "m").eval()
    assert not merged.has_adapters
    torch.testing.assert_close(_token_vectors(merged, texts), ours, atol=1e-5, rtol=0)
    peer = st.MultiVectorEncoder(str(tmp_path / "m" / "query_encoder"), device="cpu").eval()
    for mine, theirs in zip(ours, peer.encode_query(texts), strict=True):
        mine = mine[mine.abs().sum(-1) > 0]
        cos = torch.nn.functional.cosine_similarity(mine, torch.as_tensor(theirs), dim=-1)
        assert (1 - cos).max() <= 1e-5


def test_verify_proves_distillation_on_a_multi_vector_model(tmp_path) -> None:
    """A teacher's scores learnt by MaxSim scores (distill_kl mixed with the contrastive
    loss, 2 hard negatives, tiled)."""
    from tests.support.teacher import write_scored_toy

    (tmp_path / "teacher").mkdir()
    scored = write_scored_toy(tmp_path / "teacher" / "train.jsonl")
    args = toy_overrides(tmp_path, **{"data.train": scored, "train.chunk_size": 3})
    options = ["train.loss=distill_kl", "train.distill_weight=0.5", "train.hard_negatives=2"]
    sets = [a for o in options for a in ("--set", o)]
    proof = run_cli("verify", "--config", "configs/toy.yaml", *args, *MULTI, *sets, "--double")
    assert "distill_kl" in proof.stdout and "verdict: equal" in proof.stdout
    assert _gap(proof.stdout) <= 1e-10
