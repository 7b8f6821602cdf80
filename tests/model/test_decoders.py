"""Decoder LLMs as towers: last-token pooling on either padding side, the tokenizer's EOS
appended and its pad token given (and saved), LoRA adapters on a frozen base (what trains, in
which dtype), the run's folder in peft's format loaded back, and each bad setting in one line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from dpr_cache.errors import InputError
from dpr_cache.model.biencoder import BiEncoder
from dpr_cache.model.decoders import append_eos, check_dtype_on, check_positions, ends_with_eos
from dpr_cache.model.pooling import pool
from dpr_cache.train.recipe import param_groups
from tests.support.llm import DECODERS, decoder_model, lora_settings, toy_batch

INSTRUCT = "Instruct: Given a question, retrieve passages that answer it\nQuery: "


def test_last_pooling_takes_each_rows_final_real_token_on_either_side():
    hidden = torch.arange(2 * 4 * 1, dtype=torch.float64).view(2, 4, 1)
    right = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]])
    left = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    assert pool(hidden, right, "last").flatten().tolist() == [1.0, 7.0]
    assert pool(hidden, left, "last").flatten().tolist() == [3.0, 7.0]


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_a_text_encodes_the_same_padded_on_either_side_or_alone(kind):
    model = decoder_model(kind, lora=lora_settings(), shared=True).double().eval()
    questions = ["who won super bowl 50?", "amazon", "which river runs through it?"]
    alone = []
    for q in questions:
        inputs = model.tokenizer([q], return_tensors="pt")
        alone.append(model.encode_query(dict(inputs)))
    for side in ("left", "right"):
        model.tokenizer.padding_side = side
        batch = dict(model.tokenizer(questions, padding=True, return_tensors="pt"))
        got = model.encode_query(batch)
        assert torch.allclose(got, torch.cat(alone), atol=1e-10), side  # RoPE: shift-invariant


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_eos_is_appended_pad_given_and_both_saved(kind, tmp_path: Path):
    model = BiEncoder.from_pretrained(DECODERS[kind], pooling="last")
    tok = model.tokenizer
    eos = tok.eos_token_id
    assert tok.pad_token == tok.eos_token  # llama had none; qwen2's is its EOS already
    single, pair = tok("who won")["input_ids"], tok("Title", "text")["input_ids"]
    assert single[-1] == eos and pair[-1] == eos and pair.count(eos) == 1
    if kind == "llama":  # the model's own template is kept: BOS before each text of a pair
        assert single[0] == tok.bos_token_id and pair.count(tok.bos_token_id) == 2
    cut = tok("word " * 50, truncation=True, max_length=8)["input_ids"]
    assert len(cut) == 8 and cut[-1] == eos  # truncation keeps the EOS
    model.save_pretrained(tmp_path / "m")
    for folder in (tmp_path / "m", tmp_path / "m" / "query_encoder"):
        again = AutoTokenizer.from_pretrained(folder)
        assert again("who won")["input_ids"] == single
        assert again("Title", "text")["input_ids"] == pair
        assert again.pad_token == tok.eos_token and again.padding_side == tok.padding_side
    plain = AutoTokenizer.from_pretrained(DECODERS[kind])
    assert not ends_with_eos(plain)  # control: the committed tokenizers append none
    assert ends_with_eos(append_eos(append_eos(plain)))  # once, however often asked


def test_cls_and_mean_poolings_leave_the_template_alone():
    model = BiEncoder.from_pretrained(DECODERS["llama"], pooling="mean")
    assert model.tokenizer("who won")["input_ids"][-1] != model.tokenizer.eos_token_id


def test_lora_trains_the_adapters_alone_in_fp32_over_a_bf16_base():
    model = BiEncoder.from_pretrained(
        DECODERS["llama"], pooling="last", dtype="bf16", lora=lora_settings(targets=["q_proj"])
    )
    trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}
    frozen = {n: p for n, p in model.named_parameters() if not p.requires_grad}
    assert trainable and all("lora_" in n and "q_proj" in n for n in trainable)
    assert {p.dtype for p in trainable.values()} == {torch.float32}
    assert {p.dtype for p in frozen.values()} == {torch.bfloat16}
    seen = {id(p) for group in param_groups(model, 0.01) for p in group["params"]}
    assert seen == {id(p) for p in trainable.values()}  # the optimizer sees what trains
    q, p, _ = toy_batch(model.tokenizer, 2, 0)
    assert model.encode_query(q).dtype == torch.bfloat16  # the loss casts reps to fp32


@pytest.mark.parametrize("shared", [True, False])
def test_the_run_folder_holds_peft_adapters_that_load_back(shared, tmp_path: Path):
    from peft import PeftModel
    from transformers import AutoModel

    model = decoder_model(lora=lora_settings(), shared=shared).eval()
    model.query_prefix = INSTRUCT
    model.save_pretrained(tmp_path / "m")
    tower = tmp_path / "m" / "query_encoder"
    assert {"adapter_config.json", "adapter_model.safetensors"} <= {p.name for p in tower.iterdir()}
    assert not (tower / "model.safetensors").exists()  # the base is not copied
    prompts = json.loads((tower / "config_sentence_transformers.json").read_text())["prompts"]
    assert prompts == {"query": INSTRUCT}  # multi-line, as sentence-transformers prompts
    pooling = json.loads((tower / "1_Pooling" / "config.json").read_text())
    assert pooling["pooling_mode_lasttoken"] and not pooling["pooling_mode_cls_token"]
    q, p, _ = toy_batch(model.tokenizer, 3, 1, prefix=INSTRUCT)
    want_q, want_p = model.encode_query(q), model.encode_passage(p)
    again = BiEncoder.from_pretrained(tmp_path / "m", shared=shared).eval()
    assert again.has_adapters and again.pooling == "last" and again.query_prefix == INSTRUCT
    assert torch.allclose(again.encode_query(q), want_q, atol=1e-6)
    assert torch.allclose(again.encode_passage(p), want_p, atol=1e-6)
    peft = PeftModel.from_pretrained(AutoModel.from_pretrained(DECODERS["llama"]), str(tower))
    reps = pool(peft(**q).last_hidden_state, q["attention_mask"], "last")
    assert torch.allclose(reps, want_q, atol=1e-6)  # peft's own loader reads the folder


def test_loaded_adapters_are_frozen_unless_training_goes_on(tmp_path: Path):
    decoder_model(lora=lora_settings(), shared=True).save_pretrained(tmp_path / "m")
    frozen = BiEncoder.from_pretrained(tmp_path / "m", shared=True)
    assert not any(p.requires_grad for p in frozen.parameters())
    going_on = BiEncoder.from_pretrained(tmp_path / "m", shared=True, lora=lora_settings())
    assert all("lora_" in n for n, p in going_on.named_parameters() if p.requires_grad)
    assert any(p.requires_grad for p in going_on.parameters())


# -- bad input: one line each ------------------------------------------------------------------


def test_target_modules_naming_nothing_lists_the_linear_layers():
    with pytest.raises(InputError) as err:
        BiEncoder.from_pretrained(
            DECODERS["llama"], pooling="last", lora=lora_settings(targets=["q_proj", "query"])
        )
    message = str(err.value)
    assert "\n" not in message and "'query' names no linear layer" in message
    for name in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"):
        assert name in message


def test_last_pooling_without_eos_or_pad_is_refused(tmp_path: Path):
    folder = tmp_path / "no-eos"
    shutil.copytree(DECODERS["llama"], folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.update(eos_token=None, pad_token=None)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(InputError, match="neither") as err:
        BiEncoder.from_pretrained(folder, pooling="last")
    assert "\n" not in str(err.value)
    BiEncoder.from_pretrained(folder, pooling="mean")  # control: other poolings need neither


def test_fp16_weights_on_a_cpu_are_refused():
    with pytest.raises(InputError, match="model.dtype: fp16"):
        check_dtype_on("fp16", torch.device("cpu"))
    check_dtype_on("bf16", torch.device("cpu"))  # control
    check_dtype_on("fp16", torch.device("cuda"))


def test_a_decoder_shorter_than_the_passages_is_refused():
    model = BiEncoder.from_pretrained(DECODERS["qwen2"], shared=True, pooling="last")
    with pytest.raises(InputError, match="model.max_passage_length: 512 tokens") as err:
        check_positions(model.passage_encoder, 512, "model.max_passage_length")
    assert "at most 256" in str(err.value)
    check_positions(model.passage_encoder, 256, "model.max_passage_length")  # control


def test_flash_attention_where_not_installed_is_refused():
    from transformers.utils import is_flash_attn_2_available

    if is_flash_attn_2_available():
        pytest.skip("flash-attn is installed here")
    with pytest.raises(InputError, match="flash_attention_2 needs the flash-attn package"):
        BiEncoder.from_pretrained(DECODERS["llama"], attn_implementation="flash_attention_2")
    eager = BiEncoder.from_pretrained(DECODERS["llama"], attn_implementation="eager")
    assert eager.query_encoder.config._attn_implementation == "eager"


def test_a_decoders_norm_weights_take_no_weight_decay():
    model = BiEncoder.from_pretrained(DECODERS["llama"], shared=True)
    names = {id(p): n for n, p in model.named_parameters()}
    decay, no_decay = (
        {names[id(p)] for p in group["params"]} for group in param_groups(model, 0.01)
    )
    assert {n.split(".")[-2] for n in no_decay} == {
        "input_layernorm",
        "post_attention_layernorm",
        "norm",
    }
    assert all(n.endswith("proj.weight") or "embed" in n for n in decay)
