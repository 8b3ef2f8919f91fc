"""Hostile model configurations (issue 17): every model's config is checked at load.

Whisper (CTranslate2 model.bin + config.json, HF config.json), LLaMA (HF config.json, GGUF
metadata), T5 and BERT config.json: a broken or hostile value must raise a FormatError
(a CandleError) whose message names the file, the field and the limit -- never load and then
fail later with a ZeroDivisionError, IndexError or TypeError, and never a JSONDecodeError.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from tests.models.llama_testlib import TINY_CONFIG, random_state, to_gguf

from candle_web.core.errors import CandleError, FormatError

# -- Whisper, CTranslate2 ---------------------------------------------------------------------
TINY_EN_VOCAB = 51864  # decoder/embeddings/weight rows of whisper-tiny.en


@pytest.fixture(scope="module")
def tiny_en(model_file):
    """(Ct2Model, config.json object, config.json path) of the real whisper-tiny.en."""
    from candle_web.io.ct2 import read_ct2

    config_path = model_file("whisper-tiny.en", "config.json")
    return (read_ct2(model_file("whisper-tiny.en", "model.bin")),
            json.loads(config_path.read_text()), config_path)


def with_variable(ct2, name: str, value):
    return dataclasses.replace(ct2, variables={**ct2.variables, name: np.array(value, np.int16)})


@pytest.mark.parametrize("name, value, expected", [
    ("encoder/num_heads", 0, "'encoder/num_heads' must be a positive integer, got 0"),
    ("decoder/num_heads", -6, "'decoder/num_heads' must be a positive integer, got -6"),
    ("decoder/num_heads", 5, "d_model 384 is not a multiple of decoder/num_heads 5"),
])
def test_ct2_head_counts_are_checked(tiny_en, name, value, expected):
    from candle_web.models.whisper import Whisper

    ct2, config, _ = tiny_en
    with pytest.raises(FormatError, match="CTranslate2 whisper model") as info:
        Whisper.load(with_variable(ct2, name, value), config)
    assert expected in str(info.value)


@pytest.mark.parametrize("field, value, limit", [
    ("suppress_ids", [1000000000], f"list of integers in 0..{TINY_EN_VOCAB - 1}"),
    ("suppress_ids", [-3], f"list of integers in 0..{TINY_EN_VOCAB - 1}"),
    ("suppress_ids", "1,2", "list of integers"),
    ("suppress_ids_begin", [True], "list of integers"),
    ("lang_ids", [TINY_EN_VOCAB], f"list of integers in 0..{TINY_EN_VOCAB - 1}"),
    ("lang_ids", {"en": 1}, "list of integers"),
    ("alignment_heads", "x", "[decoder layer, head] pairs with decoder layer in 0..3"),
    ("alignment_heads", [[4, 0]], "decoder layer in 0..3 and head in 0..5"),
    ("alignment_heads", [[0, 6]], "decoder layer in 0..3 and head in 0..5"),
    ("alignment_heads", [[0]], "[decoder layer, head] pairs"),
])
def test_ct2_config_json_token_lists_are_checked(tiny_en, tmp_path, field, value, limit):
    from candle_web.models.whisper import Whisper

    ct2, config, _ = tiny_en
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**config, field: value}))
    with pytest.raises(FormatError) as info:
        Whisper.load(ct2, path)
    message = str(info.value)
    assert str(path) in message and f"'{field}'" in message and limit in message, message


def test_ct2_null_lists_count_as_absent(tiny_en):
    """JSON null in an optional list (HF configs write null for "none") is not a TypeError."""
    from candle_web.models.whisper import Whisper

    ct2, config, _ = tiny_en
    model = Whisper.load(ct2, {**config, "lang_ids": None, "suppress_ids_begin": None})
    assert model.config.lang_ids == () and model.config.begin_suppress_tokens == ()
    assert len(model.config.suppress_tokens) == len(config["suppress_ids"])


@pytest.mark.parametrize("content, problem", [
    (b"{not json", "not JSON"),
    (b"\xff\xfe{}", "not JSON"),
    (b"[1, 2]", "expected a JSON object, got list"),
])
def test_whisper_config_that_is_not_a_json_object(tiny_en, tmp_path, content, problem):
    from candle_web.models.whisper import Whisper

    ct2 = tiny_en[0]
    path = tmp_path / "config.json"
    path.write_bytes(content)
    with pytest.raises(FormatError, match="whisper config.json") as info:
        Whisper.load(ct2, path)
    assert str(path) in str(info.value) and problem in str(info.value)


# -- Whisper, HF config.json ------------------------------------------------------------------
WHISPER_HF = {"num_mel_bins": 80, "vocab_size": 100, "d_model": 64, "encoder_layers": 2,
              "encoder_attention_heads": 4, "decoder_layers": 2, "decoder_attention_heads": 4,
              "suppress_tokens": [1, 2], "begin_suppress_tokens": None}


@pytest.mark.parametrize("field, value, expected", [
    ("encoder_attention_heads", 0, "'encoder_attention_heads' must be a positive integer"),
    ("decoder_attention_heads", 6, "d_model 64 is not a multiple of decoder_attention_heads 6"),
    ("d_model", "64", "'d_model' must be a positive integer, got '64'"),
    ("vocab_size", None, "missing field 'vocab_size'"),
    ("suppress_tokens", [100], "'suppress_tokens' must be a list of integers in 0..99"),
    ("max_target_positions", -1, "'max_target_positions' must be a positive integer"),
])
def test_whisper_hf_config_fields_are_checked(tmp_path, field, value, expected):
    from candle_web.models.whisper import Whisper

    (tmp_path / "config.json").write_text(json.dumps({**WHISPER_HF, field: value}))
    (tmp_path / "model.safetensors").write_bytes(b"")  # never read: the config fails first
    with pytest.raises(FormatError) as info:
        Whisper.from_pretrained(tmp_path)
    assert str(tmp_path / "config.json") in str(info.value) and expected in str(info.value)


# -- LLaMA, HF config.json --------------------------------------------------------------------
@pytest.mark.parametrize("change, expected", [
    ({"num_attention_heads": 0}, "'num_attention_heads' must be a positive integer, got 0"),
    ({"num_key_value_heads": 3}, "num_attention_heads 4 is not a multiple of num_key_value_heads 3"),
    ({"hidden_size": -64}, "'hidden_size' must be a positive integer"),
    ({"head_dim": None, "hidden_size": 66}, "hidden_size 66 is not a multiple of num_attention_heads 4"),
    ({"bos_token_id": 96}, "'bos_token_id' must be an integer in 0..95"),
    ({"eos_token_id": [2, 1000]}, "'eos_token_id' must be a token id or a list of token ids in 0..95"),
    ({"rms_norm_eps": 0}, "'rms_norm_eps' must be a positive finite number"),
    ({"rope_theta": "x"}, "'rope_theta' must be a positive finite number"),
    ({"rope_scaling": "x"}, "'rope_scaling' must be an object"),
    ({"rope_scaling": {"rope_type": "linear"}}, "missing field 'rope_scaling.factor'"),
    ({"rope_scaling": {"rope_type": "linear", "factor": -2}},
     "'rope_scaling.factor' must be a positive finite number"),
    ({"tie_word_embeddings": "yes"}, "'tie_word_embeddings' must be true or false"),
    ({"max_position_embeddings": 0}, "'max_position_embeddings' must be a positive integer"),
])
def test_llama_hf_config_fields_are_checked(tmp_path, change, expected):
    from candle_web.models.llama import Llama

    (tmp_path / "config.json").write_text(json.dumps({**TINY_CONFIG, **change}))
    (tmp_path / "model.safetensors").write_bytes(b"")  # never read: the config fails first
    with pytest.raises(FormatError) as info:
        Llama.from_pretrained(tmp_path)
    assert str(tmp_path / "config.json") in str(info.value) and expected in str(info.value)


@pytest.mark.parametrize("name, content, expected", [
    ("config.json", b"{", "llama config.json"),
    ("generation_config.json", b"nope", "generation_config.json"),
    ("generation_config.json", json.dumps({"eos_token_id": [5000]}).encode(), "'eos_token_id'"),
    ("tokenizer_config.json", b"\x00", "tokenizer_config.json"),
])
def test_llama_side_files_are_checked(tmp_path, name, content, expected):
    from candle_web.models.llama import Llama

    (tmp_path / "config.json").write_text(json.dumps(TINY_CONFIG))
    (tmp_path / "model.safetensors").write_bytes(b"")
    (tmp_path / name).write_bytes(content)
    with pytest.raises(CandleError) as info:
        Llama.from_pretrained(tmp_path)
    assert isinstance(info.value, FormatError), info.value
    assert str(tmp_path / name) in str(info.value) and expected in str(info.value)


# -- LLaMA, GGUF metadata ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_state():
    return random_state(TINY_CONFIG)


@pytest.mark.parametrize("metadata, expected", [
    ({"llama.attention.head_count": 0}, "'llama.attention.head_count' must be a positive integer"),
    ({"llama.attention.head_count_kv": 3},
     "llama.attention.head_count 4 is not a multiple of llama.attention.head_count_kv 3"),
    ({"llama.block_count": 0}, "'llama.block_count' must be a positive integer"),
    ({"llama.context_length": 0}, "'llama.context_length' must be a positive integer"),
    ({"llama.embedding_length": "64"}, "'llama.embedding_length' must be a positive integer"),
    ({"llama.rope.freq_base": -1.0}, "'llama.rope.freq_base' must be a positive finite number"),
    ({"llama.rope.scaling.factor": 0.0}, "'llama.rope.scaling.factor' must be a positive"),
    ({"tokenizer.ggml.eos_token_id": 96}, "'tokenizer.ggml.eos_token_id' must be an integer in 0..95"),
    ({"tokenizer.ggml.bos_token_id": -1}, "'tokenizer.ggml.bos_token_id' must be an integer in 0..95"),
])
def test_llama_gguf_metadata_is_checked(tiny_state, tmp_path, metadata, expected):
    from candle_web.models.llama import Llama

    path = to_gguf(tiny_state, TINY_CONFIG, tmp_path / "hostile.gguf", extra_metadata=metadata)
    with pytest.raises(FormatError) as info:
        Llama.load(path)
    message = str(info.value)
    assert message.startswith(f"GGUF {path}: ") and expected in message, message


# -- T5 and BERT config.json ------------------------------------------------------------------
T5_BASE = {"vocab_size": 10, "d_model": 8, "d_kv": 4, "d_ff": 16, "num_layers": 1, "num_heads": 2}
BERT_BASE = {"vocab_size": 10, "hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
             "intermediate_size": 16, "max_position_embeddings": 16}


@pytest.mark.parametrize("change, expected", [
    ({"num_heads": 0}, "'num_heads' must be a positive integer, got 0"),
    ({"d_kv": 4.0}, "'d_kv' must be a positive integer, got 4.0"),
    ({"num_decoder_layers": -1}, "'num_decoder_layers' must be a positive integer"),
    ({"eos_token_id": 10}, "'eos_token_id' must be a token id or a list of token ids in 0..9"),
    ({"pad_token_id": -1}, "'pad_token_id' must be an integer in 0..9"),
    ({"decoder_start_token_id": 99}, "'decoder_start_token_id' must be an integer in 0..9"),
    ({"layer_norm_epsilon": 0}, "'layer_norm_epsilon' must be a positive finite number"),
    ({"relative_attention_num_buckets": 0}, "'relative_attention_num_buckets' must be a positive"),
    ({"tie_word_embeddings": "false"}, "'tie_word_embeddings' must be true or false"),
])
def test_t5_config_fields_are_checked(tmp_path, change, expected):
    from candle_web.models.t5 import T5ForConditionalGeneration

    (tmp_path / "config.json").write_text(json.dumps({**T5_BASE, **change}))
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(FormatError) as info:
        T5ForConditionalGeneration.from_pretrained(tmp_path)
    assert str(tmp_path / "config.json") in str(info.value) and expected in str(info.value)


@pytest.mark.parametrize("change, expected", [
    ({"num_attention_heads": 0}, "'num_attention_heads' must be a positive integer, got 0"),
    ({"hidden_size": 9}, "hidden_size 9 is not a multiple of num_attention_heads 2"),
    ({"pad_token_id": 10}, "'pad_token_id' must be an integer in 0..9"),
    ({"type_vocab_size": 0}, "'type_vocab_size' must be a positive integer"),
    ({"layer_norm_eps": -1e-12}, "'layer_norm_eps' must be a positive finite number"),
    ({"layer_norm_eps": 10**400}, "'layer_norm_eps' must be a positive finite number"),
    ({"hidden_act": 3}, "'hidden_act' must be a string"),
])
def test_bert_config_fields_are_checked(tmp_path, change, expected):
    from candle_web.models.bert import BertModel

    (tmp_path / "config.json").write_text(json.dumps({**BERT_BASE, **change}))
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(FormatError) as info:
        BertModel.from_pretrained(tmp_path)
    assert str(tmp_path / "config.json") in str(info.value) and expected in str(info.value)


@pytest.mark.parametrize("model", ["t5", "bert"])
@pytest.mark.parametrize("content", [b"{\"vocab_size\": ", b"null", b"\xff",
                                     b"[" * 100_000])  # deep nesting: json's RecursionError
def test_t5_and_bert_config_that_is_not_a_json_object(tmp_path, model, content):
    from candle_web.models.bert import BertModel
    from candle_web.models.t5 import T5ForConditionalGeneration

    (tmp_path / "config.json").write_bytes(content)
    (tmp_path / "model.safetensors").write_bytes(b"")
    load = (T5ForConditionalGeneration.from_pretrained if model == "t5"
            else BertModel.from_pretrained)
    with pytest.raises(FormatError, match=f"{model} config.json") as info:
        load(tmp_path)
    assert str(tmp_path / "config.json") in str(info.value)
