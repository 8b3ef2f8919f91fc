"""SmolLM2-135M-Instruct (the real Q4_1 GGUF) against the recorded transformers reference.

tests/reference/record_llama.py derived a float HF checkpoint from this GGUF (dequantized by
the `gguf` package, Q/K un-permuted) and recorded transformers' greedy ids, chat prompts and
the top logits of each prompt's last position. The numpy backend dequantizes at load, so both
sides multiply the same f32 weights: ids must match exactly, and the logits measured <= 1e-4
apart (f32 summation order over 30 layers); the tolerance below is 2e-3.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from tests.models.llama_testlib import one_blas_thread

from candle_web.generation.chat_templates import CHATML, chat_template_for
from candle_web.core.errors import Cancelled
from candle_web.generation import GenerationOptions, generate

REFERENCE = Path(__file__).resolve().parent.parent / "reference" / "llama_reference.json"
LOGIT_TOLERANCE = 2e-3
MODEL = "smollm2-135m-instruct"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="module", autouse=True)
def _blas_threads():
    with one_blas_thread():
        yield


@pytest.fixture(scope="module")
def reference():
    return json.loads(REFERENCE.read_text())


@pytest.fixture(scope="module")
def smollm2(model_file):
    from candle_web.pipelines import load_llama

    loaded = load_llama(model_file(MODEL, GGUF_NAME))
    return loaded.model, loaded.tokenizer


def prompt_ids(model, tokenizer, record) -> list:
    if record["kind"] == "chat":
        prompt = chat_template_for(model, tokenizer).render(
            [{"role": "user", "content": record["text"]}])
        return tokenizer.encode(prompt, add_special_tokens=False).ids
    return tokenizer.encode(record["text"]).ids


def test_config_read_from_gguf_metadata(smollm2):
    cfg = smollm2[0].config
    assert (cfg.num_layers, cfg.hidden_size, cfg.intermediate_size) == (30, 576, 1536)
    assert (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.vocab_size) == (9, 3, 64, 49152)
    assert cfg.rope_theta == 100000.0 and cfg.rope_interleaved and cfg.rope_scaling is None
    assert cfg.tie_word_embeddings  # the file has no output.weight
    assert smollm2[1].id_to_token(cfg.eos_token_ids[0]) == "<|im_end|>"


def test_chat_prompts_equal_transformers_jinja_rendering(smollm2, reference):
    model, tokenizer = smollm2
    template = chat_template_for(model, tokenizer)
    assert template.format == CHATML and "SmolLM" in template.default_system
    for record in reference["prompts"]:
        if record["kind"] == "chat":
            rendered = template.render([{"role": "user", "content": record["text"]}])
            assert rendered == record["prompt"]


def test_prompt_ids_equal_the_reference_tokenizer(smollm2, reference):
    for record in reference["prompts"]:
        assert prompt_ids(*smollm2, record) == record["prompt_ids"], record["name"]


def test_last_prompt_logits_match_the_reference(smollm2, reference):
    model = smollm2[0]
    for record in reference["prompts"]:
        model.clear_kv_cache()
        logits = model.forward(record["prompt_ids"]).to_numpy()[0]
        top = record["top_logits"]
        assert np.argsort(-logits, kind="stable")[:len(top["ids"])].tolist() == top["ids"]
        np.testing.assert_allclose(logits[top["ids"]], top["values"], atol=LOGIT_TOLERANCE, rtol=0)


@pytest.mark.parametrize("name", ["capital", "fox", "haiku"])
def test_greedy_ids_equal_the_reference(smollm2, reference, name):
    model, tokenizer = smollm2
    record = next(r for r in reference["prompts"] if r["name"] == name)
    options = GenerationOptions(max_new_tokens=reference["max_new_tokens"])
    result = generate(model, tokenizer, record["prompt_ids"], options)
    assert result.token_ids == record["generated_ids"]
    assert result.text == record["generated_text"]
    assert result.stop_reason == ("eos" if record["stopped_at_eos"] else "max_tokens")


def test_chatml_capital_of_france_answers_paris(smollm2):
    model, tokenizer = smollm2
    prompt = chat_template_for(model, tokenizer).render(
        [{"role": "user", "content": "What is the capital of France?"}])
    pieces = []

    def on_event(kind, payload):
        if kind == "token":
            pieces.append(payload["text"])

    result = generate(model, tokenizer, prompt,
                      GenerationOptions(max_new_tokens=20, add_special_tokens=False), on_event)
    assert "Paris" in result.text
    assert "".join(pieces) == result.text
    assert result.stop_reason == "eos"


def test_stop_string_ends_generation_and_is_cut(smollm2, reference):
    """The reference continues ' with a quick brown bear.\\n\\n...': stop at 'bear'."""
    model, tokenizer = smollm2
    record = next(r for r in reference["prompts"] if r["name"] == "fox")
    result = generate(model, tokenizer, record["prompt_ids"],
                      GenerationOptions(max_new_tokens=20, stop_strings=("bear",)))
    assert result.stop_reason == "stop_string" and result.stop_string == "bear"
    assert result.text == record["generated_text"].split("bear")[0]
    assert result.token_ids == record["generated_ids"][:len(result.token_ids)]
    assert "bear" in tokenizer.decode(result.token_ids)


def test_cancel_from_the_callback(smollm2, reference):
    model, tokenizer = smollm2
    seen = []

    def on_event(kind, payload):
        if kind == "token":
            seen.append(payload["id"])
            return len(seen) < 2  # False at the second token: cancel

    with pytest.raises(Cancelled):
        generate(model, tokenizer, reference["prompts"][1]["prompt_ids"],
                 GenerationOptions(max_new_tokens=10), on_event)
    assert len(seen) == 2


def test_seeded_sampling_is_reproducible(smollm2):
    model, tokenizer = smollm2
    options = GenerationOptions(max_new_tokens=6, temperature=0.9, top_k=40, top_p=0.95,
                                seed=1234, repeat_penalty=1.1)
    first = generate(model, tokenizer, "Once upon a time", options)
    second = generate(model, tokenizer, "Once upon a time", options)
    assert first.token_ids == second.token_ids and len(first.token_ids) == 6


def test_blocks_kept_quantized_give_the_same_logits(model_file, smollm2, reference):
    """mode='quantized' keeps the Q4_1/Q8_0 blocks and multiplies through backend.qmatmul
    (the numpy reference decodes bands of rows per call): the same f32 weights, so the same
    logits up to summation order."""
    from candle_web.models.llama import Llama

    packed = Llama.load(model_file(MODEL, GGUF_NAME), mode="quantized")
    assert packed.lm_head.is_quantized and packed.embed.qtable is not None
    ids = reference["prompts"][1]["prompt_ids"]
    expected = smollm2[0]
    expected.clear_kv_cache()
    np.testing.assert_allclose(packed.forward(ids).to_numpy(), expected.forward(ids).to_numpy(),
                               atol=LOGIT_TOLERANCE, rtol=0)
