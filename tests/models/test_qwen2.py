"""Qwen2.5-Coder-0.5B-Instruct (the official Q4_K_M GGUF) against the recorded transformers
reference, on the numpy reference path and through the numba backend's fused decode step.

tests/reference/record_qwen2.py loaded the same file with transformers' own GGUF loader (which
dequantizes every Q5_0, Q8_0, Q4_K and Q6_K tensor to f32), rendered each chat prompt with the
file's Jinja template (`apply_chat_template`) and recorded its greedy ids, the top logits of
the last prompt position and each greedy decision's lead of the chosen logit over the
runner-up. Both sides multiply the same f32 values (candle-web's dequantizers are bit-exact
against gguf-py's, tests/quantized), so only the summation order differs: the top logits
measured <= 1e-5 apart (logits up to 22; 24 blocks). LOGIT_TOLERANCE is 2e-3, and every
recorded greedy lead is checked to exceed twice it (the smallest is 0.0204, at the 4th token of
"reverse"), so ids equal within the tolerance are not a lucky tie-break. Ids must be equal.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from tests.models.llama_testlib import one_blas_thread

from candle_web import Device
from candle_web.backend import parts
from candle_web.core.errors import BackendUnavailable
from candle_web.generation import GenerationOptions, generate
from candle_web.generation.chat_templates import chat_template_for

REFERENCE = Path(__file__).resolve().parent.parent / "reference" / "qwen2_reference.json"
LOGIT_TOLERANCE = 2e-3
MODEL = "qwen2.5-coder-0.5b-instruct"
GGUF_NAME = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
PROMPT_NAMES = ["arithmetic", "reverse", "hashmap"]


@pytest.fixture(scope="module", autouse=True)
def _blas_threads():
    with one_blas_thread():
        yield


@pytest.fixture(scope="module")
def reference():
    return json.loads(REFERENCE.read_text())


def record(reference, name):
    return next(r for r in reference["prompts"] if r["name"] == name)


@pytest.fixture(scope="module")
def qwen(model_file):
    """The numpy backend's model (weights dequantized at load: ~2 GB of f32)."""
    from candle_web.pipelines import load_llama

    loaded = load_llama(model_file(MODEL, GGUF_NAME), device=Device.cpu(backend="numpy"))
    return loaded.model, loaded.tokenizer


@pytest.fixture(scope="module")
def qwen_numba(model_file):
    """The numba backend's model: quantized blocks kept, decoded by the fused step."""
    from candle_web.backend import get_backend
    from candle_web.pipelines import load_llama

    try:
        get_backend("numba")
    except BackendUnavailable as e:
        pytest.skip(f"numba backend unavailable: {e}")
    loaded = load_llama(model_file(MODEL, GGUF_NAME), device=Device.cpu(backend="numba"))
    return loaded.model, loaded.tokenizer


def test_config_read_from_gguf_metadata(qwen):
    model, tokenizer = qwen
    cfg = model.config
    assert cfg.family == "qwen2" and cfg.qkv_bias
    assert (cfg.num_layers, cfg.hidden_size, cfg.intermediate_size) == (24, 896, 4864)
    assert (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.vocab_size) == (14, 2, 64, 151936)
    assert cfg.rope_theta == 1e6 and not cfg.rope_interleaved  # HF's half-split rows (NEOX)
    assert not cfg.tie_word_embeddings  # the file has its own output.weight (Q8_0)
    assert [tokenizer.id_to_token(i) for i in cfg.eos_token_ids] == ["<|im_end|>"]


def test_reference_leads_exceed_the_tolerance(reference):
    """Every greedy decision transformers made won by more than two tolerances: an
    implementation within the tolerance of its logits must pick the same ids."""
    for rec in reference["prompts"]:
        assert min(rec["margins"]) > 2 * LOGIT_TOLERANCE, rec["name"]
        assert len(rec["margins"]) == len(rec["generated_ids"]) + 1


def test_chat_prompts_equal_transformers_rendering(qwen, reference):
    """The file's own template (Qwen's default system message included), as `--chat` uses it."""
    model, tokenizer = qwen
    template = chat_template_for(model, tokenizer)
    for rec in reference["prompts"]:
        rendered = template.render([{"role": "user", "content": rec["text"]}])
        assert rendered == rec["prompt"], rec["name"]
        assert tokenizer.encode(rendered, add_special_tokens=False).ids == rec["prompt_ids"]


def test_last_prompt_logits_match_the_reference(qwen, reference):
    model = qwen[0]
    for rec in reference["prompts"]:
        model.clear_kv_cache()
        logits = model.forward(rec["prompt_ids"]).to_numpy()[0]
        top = rec["top_logits"]
        assert np.argsort(-logits, kind="stable")[:len(top["ids"])].tolist() == top["ids"]
        np.testing.assert_allclose(logits[top["ids"]], top["values"], atol=LOGIT_TOLERANCE,
                                   rtol=0)


def assert_generates_the_reference(model, tokenizer, reference, name):
    rec = record(reference, name)
    options = GenerationOptions(max_new_tokens=reference["max_new_tokens"])
    result = generate(model, tokenizer, rec["prompt_ids"], options)
    assert result.token_ids == rec["generated_ids"]
    assert result.text == rec["generated_text"]
    assert result.stop_reason == ("eos" if rec["stopped_at_eos"] else "max_tokens")


@pytest.mark.parametrize("name", PROMPT_NAMES)
def test_greedy_ids_equal_the_reference(qwen, reference, name):
    model, tokenizer = qwen
    assert type(parts.start_causal_decoding(model)) is parts.ReferenceSteps
    assert_generates_the_reference(model, tokenizer, reference, name)


@pytest.mark.parametrize("name", PROMPT_NAMES)
def test_fused_numba_decode_gives_the_reference_ids(qwen_numba, reference, name):
    """Every new token after the prompt goes through the numba llama.decoder_step part (QKV
    bias; Q5_0, Q8_0, Q4_K and Q6_K weights, q|k|v of mixed types joined)."""
    model, tokenizer = qwen_numba
    assert type(parts.start_causal_decoding(model)) is parts.FusedCausalSteps
    assert_generates_the_reference(model, tokenizer, reference, name)


def test_fused_step_logits_match_the_reference_path(qwen, qwen_numba, reference):
    """The fused step's logits at each decoded position equal the numpy path's (fed the same
    reference ids) within the tolerance."""
    rec = record(reference, "arithmetic")
    ids = rec["prompt_ids"] + rec["generated_ids"]
    prompt = len(rec["prompt_ids"])
    rows = {}
    for label, model in (("numpy", qwen[0]), ("numba", qwen_numba[0])):
        steps = parts.start_causal_decoding(model)
        model.clear_kv_cache()
        steps([rec["prompt_ids"]], 0)
        rows[label] = np.stack([steps([[token]], pos).to_numpy()[0]
                                for pos, token in enumerate(ids[prompt:], start=prompt)])
    np.testing.assert_allclose(rows["numba"], rows["numpy"], atol=LOGIT_TOLERANCE, rtol=0)
    assert rows["numba"].argmax(axis=1).tolist()[:-1] == rec["generated_ids"][1:]
