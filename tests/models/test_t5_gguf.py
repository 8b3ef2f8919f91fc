"""T5 from GGUF: the two tensor namings (HF names + config.json as Candle's quantized T5 uses,
and llama.cpp's `t5` arch with its metadata), float and Q8_0 weights, and bad files.

The GGUF files are written with candle-web's writer from the same seeded random weights as
test_t5.py; the float ones must reproduce the safetensors model exactly (1e-5: same f32
weights, same kernels), the Q8_0 one within the quantization error (8-bit blocks: about 0.4%
relative per weight; the bounds below are 3-7x what was observed).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from candle_web.core.errors import FormatError, ShapeMismatch, UnsupportedError
from candle_web.io.gguf import write_gguf
from candle_web.models.t5 import GenerationOptions, T5_WEIGHT_NAMES, T5ForConditionalGeneration
from candle_web.quantized.qtensor import QTensor

REFERENCE_DIR = Path(__file__).resolve().parent.parent / "reference"
PROMPT_IDS = [[31, 7, 88, 120, 5, 64, 19, 1]]
DECODER_IDS = [[0, 17, 42, 99, 5]]
EXACT_ATOL = 1e-5
# Q8_0 against f32: logits span about +-4 here, observed error 0.044; encoder outputs 0.030.
Q8_LOGITS_ATOL = 0.3
Q8_ENCODER_ATOL = 0.1


@pytest.fixture(scope="module")
def recorder():
    spec = importlib.util.spec_from_file_location("record_t5", REFERENCE_DIR / "record_t5.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def reference_models(recorder, tmp_path_factory):
    root = tmp_path_factory.mktemp("t5-st")
    return {name: T5ForConditionalGeneration.from_pretrained(
        recorder.write_model(name, root / name)) for name in ("v1_0", "v1_1")}


def llama_cpp_metadata(config: dict) -> dict:
    """What llama.cpp's converter writes for T5 (the keys its loader reads)."""
    return {"general.architecture": "t5", "t5.context_length": 512,
            "t5.embedding_length": config["d_model"], "t5.feed_forward_length": config["d_ff"],
            "t5.block_count": config["num_layers"],
            "t5.decoder_block_count": config.get("num_decoder_layers", config["num_layers"]),
            "t5.attention.head_count": config["num_heads"],
            "t5.attention.key_length": config["d_kv"], "t5.attention.value_length": config["d_kv"],
            "t5.attention.layer_norm_rms_epsilon": config["layer_norm_epsilon"],
            "t5.attention.relative_buckets_count": config["relative_attention_num_buckets"],
            "t5.decoder_start_token_id": 0, "tokenizer.ggml.eos_token_id": 1,
            "tokenizer.ggml.padding_token_id": 0}


def llama_cpp_name(hf_name: str) -> str:
    return T5_WEIGHT_NAMES.translate(hf_name, "hf", "gguf")


def outputs(model):
    encoder = model.encode(PROMPT_IDS).to_numpy()
    logits = model.forward(PROMPT_IDS, DECODER_IDS).to_numpy()
    return encoder, logits


@pytest.mark.parametrize("name", ["v1_0", "v1_1"])
def test_gguf_with_hf_names_and_config_equals_safetensors(name, recorder, reference_models, tmp_path):
    path = tmp_path / "model.gguf"
    write_gguf(path, {}, recorder.random_t5_weights(name))
    model = T5ForConditionalGeneration.load(path, recorder.config_json(name))
    for ours, expected in zip(outputs(model), outputs(reference_models[name])):
        np.testing.assert_allclose(ours, expected, rtol=0, atol=EXACT_ATOL)
    with pytest.raises(FormatError, match="pass its config.json"):
        T5ForConditionalGeneration.load(path)


def test_llama_cpp_names_agree_with_the_gguf_package(recorder):
    gguf = pytest.importorskip("gguf")
    for name in ("v1_0", "v1_1"):
        cfg = recorder.config_json(name)
        mapping = gguf.get_tensor_name_map(gguf.MODEL_ARCH.T5, cfg.get("num_decoder_layers", 2))
        for hf_name in recorder.random_t5_weights(name):
            expected = mapping.get_name(hf_name, try_suffixes=(".weight",))
            assert llama_cpp_name(hf_name) == expected, hf_name


@pytest.mark.parametrize("name", ["v1_0", "v1_1"])
def test_llama_cpp_gguf_with_metadata_equals_safetensors(name, recorder, reference_models, tmp_path):
    config = recorder.config_json(name)
    tensors = {llama_cpp_name(k): v for k, v in recorder.random_t5_weights(name).items()}
    path = tmp_path / "t5.gguf"
    write_gguf(path, llama_cpp_metadata(config), tensors)
    # a lone .gguf file: the config comes from the metadata
    model = T5ForConditionalGeneration.from_pretrained(path)
    assert model.config.is_gated_act == (name == "v1_1")
    assert model.config.scale_decoder_outputs == (name == "v1_0")  # no output.weight: tied
    # llama.cpp does not store the maximum distance; these test configs use non-default ones.
    model = T5ForConditionalGeneration.load(path, config)
    for ours, expected in zip(outputs(model), outputs(reference_models[name])):
        np.testing.assert_allclose(ours, expected, rtol=0, atol=EXACT_ATOL)


def test_q8_0_gguf_stays_close_and_both_matmul_modes_agree(recorder, reference_models, tmp_path):
    tensors = {}
    for hf_name, values in recorder.random_t5_weights("v1_0").items():
        quantizable = values.ndim == 2 and values.shape[1] % 32 == 0 and "relative" not in hf_name
        tensors[llama_cpp_name(hf_name)] = QTensor.from_float(values, "Q8_0") if quantizable else values
    path = tmp_path / "t5-q8_0.gguf"
    config = recorder.config_json("v1_0")
    write_gguf(path, llama_cpp_metadata(config), tensors)
    dequantized = T5ForConditionalGeneration.load(path, config, mode="dequantize")
    kept = T5ForConditionalGeneration.load(path, config, mode="quantized")
    assert kept.encoder_blocks[0].attn.q.is_quantized
    assert not dequantized.encoder_blocks[0].attn.q.is_quantized
    expected_encoder, expected_logits = outputs(reference_models["v1_0"])
    encoder, logits = outputs(dequantized)
    np.testing.assert_allclose(encoder, expected_encoder, rtol=0, atol=Q8_ENCODER_ATOL)
    np.testing.assert_allclose(logits, expected_logits, rtol=0, atol=Q8_LOGITS_ATOL)
    assert np.abs(logits - expected_logits).max() > 0  # really quantized
    for a, b in zip(outputs(kept), (encoder, logits)):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-4)
    options = GenerationOptions(max_new_tokens=5)
    assert kept.generate(PROMPT_IDS, options=options) == dequantized.generate(PROMPT_IDS, options=options)


def test_bad_gguf_files_are_refused(recorder, tmp_path):
    config = recorder.config_json("v1_0")
    tensors = {llama_cpp_name(k): v for k, v in recorder.random_t5_weights("v1_0").items()}
    metadata = llama_cpp_metadata(config)

    path = tmp_path / "no-meta.gguf"
    write_gguf(path, {k: v for k, v in metadata.items() if k != "t5.attention.head_count"}, tensors)
    with pytest.raises(FormatError, match="t5.attention.head_count"):
        T5ForConditionalGeneration.load(path)

    path = tmp_path / "llama.gguf"
    write_gguf(path, {**metadata, "general.architecture": "llama"}, tensors)
    with pytest.raises(UnsupportedError, match="'llama' is not t5"):
        T5ForConditionalGeneration.load(path)

    path = tmp_path / "bad-shape.gguf"
    bad = dict(tensors)
    bad["dec.blk.1.cross_attn_v.weight"] = bad["dec.blk.1.cross_attn_v.weight"][:16].copy()
    write_gguf(path, metadata, bad)
    with pytest.raises(ShapeMismatch, match=r"dec\.blk\.1\.cross_attn_v\.weight.*\[16, 32\].*\[32, 32\]"):
        T5ForConditionalGeneration.load(path)

    path = tmp_path / "not-t5.gguf"
    write_gguf(path, {"general.architecture": "llama"}, {"blk.0.attn_q.weight": np.zeros((4, 4), np.float32)})
    with pytest.raises(FormatError, match="not a T5 model"):
        T5ForConditionalGeneration.load(path)
