"""configs/toy_llm.yaml end to end through the CLI: a tiny Llama-shaped decoder with LoRA and
last-token pooling trained, indexed, evaluated, verified and exported merged, the export read by
sentence-transformers; and its bad settings, each one line."""

from __future__ import annotations

import json

import pytest

from tests.support.cli import run_cli, toy_overrides

CONFIG = "configs/toy_llm.yaml"


def _sets(tmp_path) -> list[str]:
    return toy_overrides(tmp_path, **{"model.max_passage_length": 64, "train.max_steps": 3})


def test_train_index_eval_verify_export(tmp_path):
    sets = _sets(tmp_path)
    run_cli("train", "--config", CONFIG, *sets, "-q")
    model = tmp_path / "run" / "model"
    assert (model / "query_encoder" / "adapter_config.json").is_file()
    run_cli("index", "--config", CONFIG, *sets)
    run_cli("eval", "--config", CONFIG, *sets)
    metrics = json.loads((tmp_path / "run" / "eval" / "metrics.json").read_text())
    assert metrics["n_questions"] > 0 and "top20" in metrics
    proof = run_cli("verify", "--config", CONFIG, *sets, "--double")
    assert "equal: GradCache gives the full batch's gradient" in proof.stdout
    merged = tmp_path / "merged"
    run_cli("export", "--format", "merged", "--model", str(model), "--out", str(merged))
    st = pytest.importorskip("sentence_transformers")
    vectors = st.SentenceTransformer(str(merged / "query_encoder"), device="cpu").encode(["q?"])
    assert vectors.shape == (1, 32)


@pytest.mark.parametrize(
    ("setting", "fragment"),
    [
        ("model.lora.r=4", "--set model.lora.r: model.lora is null"),
        ("model.dtype=fp16", "model.dtype: fp16 weights need a GPU"),
        ("model.lora={target_modules: [qkv]}", "'qkv' names no linear layer"),
        ("model.max_passage_length=300", "model.max_passage_length: 300 tokens"),
    ],
)
def test_bad_settings_are_one_line(tmp_path, setting, fragment):
    sets = _sets(tmp_path)
    if setting.startswith("model.lora.r"):  # LoRA keys on a config without model.lora
        sets += ["--set", "model.lora=null"]
    proc = run_cli("train", "--config", CONFIG, *sets, "--set", setting, "-q", check=False)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and fragment in lines[0], lines


def _saved_lora_folder(tmp_path) -> str:
    """A saved shared tiny-Llama run folder with adapters r=4 (alpha 8) on q_proj, dropout 0.3."""
    from tests.support.llm import decoder_model, lora_settings

    model = decoder_model(lora=lora_settings(dropout=0.3, targets=["q_proj"]), shared=True)
    model.query_prefix = "Instruct: Given a question, retrieve passages that answer it\nQuery: "
    model.normalize = True
    return str(model.save_pretrained(tmp_path / "saved"))


def test_verify_on_a_saved_lora_folder_turns_its_dropout_off(tmp_path):
    """verify asks for LoRA dropout 0: a folder saved with dropout 0.3 must then run with none
    (it reported DIFFERENT, a gap of 2.3, while the folder's 0.3 was kept)."""
    sets = _sets(tmp_path) + ["--set", f"model.name_or_path={_saved_lora_folder(tmp_path)}"]
    lora = "model.lora={r: 4, alpha: 8, dropout: 0.3, target_modules: [q_proj]}"
    proof = run_cli("verify", "--config", CONFIG, *sets, "--set", lora)
    assert "equal: GradCache gives the full batch's gradient" in proof.stdout, proof.stdout
    other = "model.lora={r: 8, alpha: 8, dropout: 0.3, target_modules: [q_proj]}"
    proc = run_cli("verify", "--config", CONFIG, *sets, "--set", other, check=False)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: model.lora.r: 8, but the adapters saved in"), lines


def test_training_a_saved_lora_folder_with_model_lora_null_is_one_line(tmp_path):
    sets = _sets(tmp_path) + ["--set", f"model.name_or_path={_saved_lora_folder(tmp_path)}"]
    proc = run_cli("train", "--config", CONFIG, *sets, "--set", "model.lora=null", check=False)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert "holds LoRA adapters and model.lora is null" in lines[0], lines
