"""Fixtures for the generation tests: the real SmolLM2 tokenizer (from its GGUF metadata) and
a tiny random-weight Llama over the same vocabulary, so the generate loop runs for real in
milliseconds per token."""

from __future__ import annotations

import numpy as np
import pytest

SMOLLM2 = ("smollm2-135m-instruct", "SmolLM2-135M-Instruct.Q4_1.gguf")
TINY_CONTEXT = 64


@pytest.fixture(scope="module", autouse=True)
def _one_blas_thread():
    """numpy's BLAS on one thread: on the shared 2-core test machine multithreaded OpenBLAS
    gemm measured ~10x slower under oversubscription (results are identical)."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        yield
        return
    with threadpool_limits(limits=1, user_api="blas"):
        yield


@pytest.fixture(scope="session")
def smollm2_tokenizer(model_file):
    from candle_web.io.gguf import GgufFile
    from candle_web.tokenizers import Tokenizer

    return Tokenizer.from_gguf_metadata(GgufFile(model_file(*SMOLLM2)).metadata)


@pytest.fixture(scope="session")
def tiny_llama(smollm2_tokenizer):
    """Random weights, the SmolLM2 vocabulary size and EOS, a 64-position context."""
    from candle_web.io.safetensors import serialize
    from candle_web.models.llama import Llama, LlamaConfig

    vocab = smollm2_tokenizer.get_vocab_size()
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=48, num_layers=2,
                      num_heads=4, num_kv_heads=2, head_dim=8, max_position_embeddings=TINY_CONTEXT,
                      tie_word_embeddings=True,
                      eos_token_ids=(smollm2_tokenizer.token_to_id("<|im_end|>"),))
    rng = np.random.default_rng(7)

    def matrix(rows, cols):
        return (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float32)

    d, hd = cfg.hidden_size, cfg.head_dim
    tensors = {"model.embed_tokens.weight": rng.standard_normal((vocab, d)).astype(np.float32),
               "model.norm.weight": np.ones(d, np.float32)}
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        tensors.update({
            p + "input_layernorm.weight": np.ones(d, np.float32),
            p + "post_attention_layernorm.weight": np.ones(d, np.float32),
            p + "self_attn.q_proj.weight": matrix(cfg.num_heads * hd, d),
            p + "self_attn.k_proj.weight": matrix(cfg.num_kv_heads * hd, d),
            p + "self_attn.v_proj.weight": matrix(cfg.num_kv_heads * hd, d),
            p + "self_attn.o_proj.weight": matrix(d, cfg.num_heads * hd),
            p + "mlp.gate_proj.weight": matrix(cfg.intermediate_size, d),
            p + "mlp.up_proj.weight": matrix(cfg.intermediate_size, d),
            p + "mlp.down_proj.weight": matrix(d, cfg.intermediate_size),
        })
    return Llama.load(serialize(tensors), cfg)
