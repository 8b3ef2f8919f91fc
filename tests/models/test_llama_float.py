"""The float HF checkpoint derived from the SmolLM2 GGUF, loaded through the safetensors path,
and transformers live on the same checkpoint.

The checkpoint is derived here the way tests/reference/record_llama.py does it (dequantize,
un-permute Q/K, config.json, model.safetensors written by the `safetensors` library), with
candle-web's GGUF reader in place of the `gguf` package for speed (the two dequantize
bit-identically: tests/quantized). Same weights as the recording, so the same greedy ids.
"""

from __future__ import annotations

import gc
import json
from pathlib import Path

import numpy as np
import pytest
from tests.models.llama_testlib import one_blas_thread, reference_script

from candle_web.generation import GenerationOptions, generate

REFERENCE = Path(__file__).resolve().parent.parent / "reference" / "llama_reference.json"
LOGIT_TOLERANCE = 2e-3  # see test_llama.py; measured <= 1e-4


@pytest.fixture(scope="module", autouse=True)
def _blas_threads():
    with one_blas_thread():
        yield


@pytest.fixture(scope="module")
def reference():
    return json.loads(REFERENCE.read_text())


@pytest.fixture(scope="module")
def float_checkpoint(model_file, tmp_path_factory):
    pytest.importorskip("safetensors")
    script = reference_script()
    metadata, tensors = script.read_with_candle_web(
        model_file("smollm2-135m-instruct", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    folder = tmp_path_factory.mktemp("smollm2-float")
    script.write_hf_checkpoint(metadata, tensors, folder)
    del tensors
    gc.collect()
    return folder


def test_transformers_live_equals_the_recording(float_checkpoint, reference):
    """The recording is reproducible: transformers on this checkpoint, now, gives the
    recorded ids for the chat prompt (so the JSON is not stale). First in the module, so
    the torch model is gone before candle-web's copy of the weights is loaded."""
    pytest.importorskip("transformers")
    script = reference_script()
    record = next(r for r in reference["prompts"] if r["name"] == "capital")
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as for numpy's BLAS above: faster on the shared 2 cores
    try:
        model = script.load_transformers_model(float_checkpoint)
        generated, logits = script.torch_greedy(model, record["prompt_ids"],
                                                reference["max_new_tokens"],
                                                reference["config"]["eos_token_id"])
    finally:
        torch.set_num_threads(threads)
    assert generated == record["generated_ids"]
    top = record["top_logits"]
    np.testing.assert_allclose(logits[top["ids"]], top["values"], atol=LOGIT_TOLERANCE, rtol=0)


@pytest.fixture(scope="module")
def float_model(float_checkpoint):
    from candle_web.models.llama import Llama

    return Llama.from_pretrained(float_checkpoint)


def test_float_checkpoint_config(float_model):
    cfg = float_model.config
    assert not cfg.rope_interleaved and cfg.tie_word_embeddings
    assert (cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (30, 9, 3, 64)


def test_float_checkpoint_logits_match_the_reference(float_model, reference):
    for record in reference["prompts"]:
        float_model.clear_kv_cache()
        logits = float_model.forward(record["prompt_ids"]).to_numpy()[0]
        top = record["top_logits"]
        assert np.argsort(-logits, kind="stable")[:len(top["ids"])].tolist() == top["ids"]
        np.testing.assert_allclose(logits[top["ids"]], top["values"], atol=LOGIT_TOLERANCE, rtol=0)


def test_float_checkpoint_greedy_ids_equal_the_reference(float_model, reference, model_file):
    from candle_web.io.gguf import GgufFile
    from candle_web.tokenizers import Tokenizer

    # The derived folder has no tokenizer.json; the vocabulary is the GGUF's.
    gguf = GgufFile(model_file("smollm2-135m-instruct", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    tokenizer = Tokenizer.from_gguf_metadata(gguf.metadata)
    record = next(r for r in reference["prompts"] if r["name"] == "capital")
    result = generate(float_model, tokenizer, record["prompt_ids"],
                      GenerationOptions(max_new_tokens=reference["max_new_tokens"]))
    assert result.token_ids == record["generated_ids"]
    assert result.text == record["generated_text"]
