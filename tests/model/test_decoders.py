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


# -- a saved LoRA folder loaded again ----------------------------------------------------------


def _saved_lora(folder: Path) -> Path:
    """A shared tiny-Llama run folder with adapters r=4 (alpha 8) on q_proj, dropout 0.3."""
    lora = lora_settings(dropout=0.3, targets=["q_proj"])
    decoder_model(lora=lora, shared=True).save_pretrained(folder)
    return folder


def _lora_dropouts(model: BiEncoder) -> list[torch.nn.Module]:
    return [m for n, m in model.named_modules() if ".lora_dropout." in n]


@pytest.mark.parametrize(
    ("field", "change", "shown"),
    [
        ("r", {"r": 8, "alpha": 8.0}, "model.lora.r: 8, but the adapters saved in"),
        ("alpha", {"alpha": 16.0}, "model.lora.alpha: 16.0, but"),
        ("target_modules", {"target_modules": ["q_proj", "v_proj"]}, "q_proj, v_proj, but"),
        ("target_modules", {"target_modules": "all-linear"}, "have q_proj:"),
    ],
)
def test_saved_adapters_that_model_lora_contradicts_are_one_line(field, change, shown, tmp_path):
    folder = _saved_lora(tmp_path / "m")
    lora = lora_settings(dropout=0.0, targets=["q_proj"])
    lora.__dict__.update(change)
    with pytest.raises(InputError) as err:
        BiEncoder.from_pretrained(folder, shared=True, lora=lora)
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"model.lora.{field}: ") and shown in message
    assert "have 4" in message if field == "r" else True  # both values named


def test_saved_adapters_train_on_with_model_loras_dropout(tmp_path: Path):
    folder = _saved_lora(tmp_path / "m")
    assert json.loads((folder / "query_encoder" / "adapter_config.json").read_text())[
        "lora_dropout"
    ] == pytest.approx(0.3)
    off = BiEncoder.from_pretrained(folder, shared=True, lora=lora_settings(0.0, ["q_proj"]))
    dropouts = _lora_dropouts(off)
    assert dropouts and all(isinstance(m, torch.nn.Identity) for m in dropouts)  # was p=0.3
    assert any(p.requires_grad for p in off.parameters())
    off.train()
    q, _, _ = toy_batch(off.tokenizer, 3, 0)
    assert torch.equal(off.encode_query(q), off.encode_query(q))  # no dropout left anywhere
    other = BiEncoder.from_pretrained(folder, shared=True, lora=lora_settings(0.1, ["q_proj"]))
    assert {m.p for m in _lora_dropouts(other)} == {0.1}
    other.save_pretrained(tmp_path / "again")  # the dropout it trained with is what it records
    saved = json.loads((tmp_path / "again" / "query_encoder" / "adapter_config.json").read_text())
    assert saved["lora_dropout"] == pytest.approx(0.1)
    frozen = BiEncoder.from_pretrained(folder, shared=True)  # control: encoding keeps the folder's
    assert {m.p for m in _lora_dropouts(frozen)} == {0.3}


def test_a_lora_folder_with_model_lora_null_is_refused_for_training(tmp_path: Path):
    from dpr_cache.model.loading import load_biencoder, load_encoder

    folder = _saved_lora(tmp_path / "m")
    with pytest.raises(InputError) as err:
        load_biencoder(folder, shared=True, source="model.name_or_path")
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"model.name_or_path: {folder} holds LoRA")
    assert "set model.lora" in message and "give the base model" in message
    encoder = load_encoder(folder)  # control: encoding loads it frozen
    assert encoder.has_adapters and not any(p.requires_grad for p in encoder.parameters())
    trained = load_biencoder(folder, shared=True, lora=lora_settings(0.0, ["q_proj"]))
    assert any(p.requires_grad for p in trained.parameters())  # control: model.lora set


# -- a plain decoder folder: its pooling -------------------------------------------------------


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_a_plain_decoder_folder_pools_its_last_token_by_default(kind):
    from dpr_cache.model.loading import load_encoder

    model = load_encoder(DECODERS[kind])
    assert model.pooling == "last"
    assert model.tokenizer("who won")["input_ids"][-1] == model.tokenizer.eos_token_id
    model.tokenizer.padding_side = "left"  # the side that made cls read a pad
    inputs = model.tokenizer(["who won", "where is the big old bridge"], padding=True)
    inputs = {k: torch.tensor(v) for k, v in inputs.items()}
    with torch.no_grad():
        reps = model.encode_query(inputs)
    assert not torch.allclose(reps[0], reps[1], atol=1e-4)  # the vectors see the text
    bert = load_encoder(Path(DECODERS[kind]).parent / "tiny-bert")
    assert bert.pooling == "cls"  # control: an encoder keeps DPR's default


def test_cls_pooling_on_a_decoder_is_refused():
    from transformers import AutoConfig

    with pytest.raises(InputError) as err:
        BiEncoder.from_pretrained(DECODERS["llama"], pooling="cls")
    message = str(err.value)
    assert "\n" not in message and message.startswith("model.pooling: cls on a decoder-only")
    with pytest.raises(InputError, match="model.pooling: cls"):
        BiEncoder.from_config(AutoConfig.from_pretrained(DECODERS["qwen2"]), pooling="cls")
    assert BiEncoder.from_config(AutoConfig.from_pretrained(DECODERS["qwen2"])).pooling == "last"


def test_from_config_takes_and_records_a_dtype(tmp_path: Path):
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(DECODERS["llama"])
    model = BiEncoder.from_config(config, shared=True, dtype="bf16", lora=lora_settings())
    frozen = {p.dtype for p in model.parameters() if not p.requires_grad}
    assert frozen == {torch.bfloat16} and model.weights_dtype == "bf16"
    model.tokenizer = AutoTokenizer.from_pretrained(DECODERS["llama"])
    model.save_pretrained(tmp_path / "m")
    assert json.loads((tmp_path / "m" / "biencoder.json").read_text())["dtype"] == "bf16"


def test_adapters_on_a_hub_base_name_it_by_its_hub_name(tmp_path: Path, monkeypatch):
    """The base loaded from the Hugging Face cache is recorded as ``org/name``, not as this
    machine's snapshot folder; a local base by its absolute path."""
    import huggingface_hub.constants

    revision = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--dpr-cache-test--tiny-llama"
    shutil.copytree(DECODERS["llama"], repo / "snapshots" / revision)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model = BiEncoder.from_pretrained(
        "dpr-cache-test/tiny-llama", shared=True, lora=lora_settings()
    )
    model.save_pretrained(tmp_path / "m")
    saved = json.loads((tmp_path / "m" / "query_encoder" / "adapter_config.json").read_text())
    assert saved["base_model_name_or_path"] == "dpr-cache-test/tiny-llama"
    again = BiEncoder.from_pretrained(tmp_path / "m", shared=True)  # found on the hub again
    assert again.has_adapters
    local = BiEncoder.from_pretrained(DECODERS["llama"], shared=True, lora=lora_settings())
    local.save_pretrained(tmp_path / "local")
    saved = json.loads((tmp_path / "local" / "query_encoder" / "adapter_config.json").read_text())
    assert saved["base_model_name_or_path"] == str(Path(DECODERS["llama"]).resolve())


def test_the_poolings_and_dtypes_are_the_configs():
    """model/ may not import the config (tests/test_layers.py), so pooling.POOLINGS and
    decoders.DTYPES repeat model.pooling's and model.dtype's values: they must agree."""
    from typing import get_args

    from dpr_cache.config import ModelConfig
    from dpr_cache.model.decoders import DTYPES
    from dpr_cache.model.pooling import POOLINGS

    fields = ModelConfig.model_fields
    pooling, none = get_args(fields["pooling"].annotation)  # a value, or null: the model's
    assert POOLINGS == get_args(pooling) and none is type(None)
    assert tuple(DTYPES) == get_args(fields["dtype"].annotation)
