"""The numba backend's fused LLaMA decode step (native/candle_native/llama_decoder.py) against
the generic tensor path of the same model on the same backend.

Both multiply the same unpacked weights; the fused kernels only re-associate f32 sums (row
pairs sharing activation loads, lanes in registers), so logits agree to ~1e-6 of their scale;
the tolerance is 1e-4 relative to the largest logit. Greedy ids must be identical. Covered:
32-element groups with and without offsets (Q4_0, Q4_1, Q5_1, Q8_0), 16-element groups
(Q6_K) and 32 with per-group offsets from K-quants (Q4_K), threaded and single-thread steps, a
KV cache that must grow during decoding, f32 weights, and the numpy backend (no fused step).
"""

from __future__ import annotations

import numpy as np
import pytest
from llama_testlib import TINY_CONFIG, random_state, to_gguf

from candle_web import Device
from candle_web.errors import BackendUnavailable
from candle_web.models.llama import Llama
from candle_web.quantized import GgmlDType

RELATIVE_TOLERANCE = 1e-4
STEPS = 12
# K-quants need rows of 256: a wider tiny model (still 2 layers, GQA 4 heads over 2).
WIDE_CONFIG = dict(TINY_CONFIG, hidden_size=256, intermediate_size=256, head_dim=64,
                   vocab_size=128)


@pytest.fixture(scope="module")
def numba_device():
    from candle_web.backend import get_backend

    try:
        get_backend("numba")
    except BackendUnavailable as e:
        pytest.skip(f"numba backend unavailable: {e}")
    return Device.cpu(backend="numba")


def decode(model, prompt, steps, fused, parallel=None):
    """(greedy ids, logits per step) with the fused step on or off."""
    model.use_fused_decode = fused
    if fused and parallel is not None:
        model._fused_decoder_for_backend().parallel = parallel
    model.clear_kv_cache(capacity=4)  # small, so decoding grows the cache
    logits = [model.forward([prompt]).to_numpy()[0]]
    ids = [int(np.argmax(logits[-1]))]
    for _ in range(steps):
        logits.append(model.forward([[ids[-1]]]).to_numpy()[0])
        ids.append(int(np.argmax(logits[-1])))
    return ids, np.array(logits)


def assert_same_decode(model, prompt):
    expected_ids, expected = decode(model, prompt, STEPS, fused=False)
    for parallel in (True, False):
        ids, logits = decode(model, prompt, STEPS, fused=True, parallel=parallel)
        scale = np.abs(expected).max()
        np.testing.assert_allclose(logits, expected, atol=RELATIVE_TOLERANCE * scale, rtol=0)
        assert ids == expected_ids


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1", "Q5_1", "Q8_0"])
def test_fused_step_equals_generic_path(numba_device, tmp_path, qtype):
    path = to_gguf(random_state(TINY_CONFIG, seed=3), TINY_CONFIG, tmp_path / f"{qtype}.gguf",
                   quantize_to=GgmlDType.parse(qtype))
    model = Llama.from_gguf(path, numba_device)
    assert model._fused_decoder_for_backend() is not None
    assert_same_decode(model, [1, 5, 9, 33, 70])


@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K"])
def test_fused_step_with_k_quants(numba_device, tmp_path, qtype):
    path = to_gguf(random_state(WIDE_CONFIG, seed=4), WIDE_CONFIG, tmp_path / f"{qtype}.gguf",
                   quantize_to=GgmlDType.parse(qtype))
    model = Llama.from_gguf(path, numba_device)
    assert model._fused_decoder_for_backend() is not None
    assert_same_decode(model, [2, 7, 100])


def test_fused_step_matches_a_full_pass(numba_device, tmp_path):
    """Position bookkeeping: the step's logits at each position equal those of one pass over
    the whole sequence (all_logits, generic path)."""
    path = to_gguf(random_state(TINY_CONFIG, seed=5), TINY_CONFIG, tmp_path / "q8.gguf",
                   quantize_to=GgmlDType.Q8_0)
    model = Llama.from_gguf(path, numba_device)
    ids, logits = decode(model, [4, 8], 6, fused=True)
    model.clear_kv_cache()
    full = model.forward([[4, 8] + ids[:-1]], all_logits=True).to_numpy()[0]
    np.testing.assert_allclose(logits, full[1:], atol=RELATIVE_TOLERANCE * np.abs(full).max(),
                               rtol=0)


def test_fused_step_with_float_weights(numba_device, tmp_path):
    """f32 matrices (a GGUF dequantized at load here; float safetensors checkpoints alike) run
    the same fused step through its f32 matrix-vector kernels."""
    path = to_gguf(random_state(TINY_CONFIG, seed=6), TINY_CONFIG, tmp_path / "f32.gguf")
    model = Llama.from_gguf(path, numba_device, mode="dequantize")
    assert not model.lm_head.is_quantized
    assert model._fused_decoder_for_backend() is not None
    assert_same_decode(model, [3, 11, 40, 2])


def test_no_fused_step_on_numpy(tmp_path):
    path = to_gguf(random_state(TINY_CONFIG, seed=6), TINY_CONFIG, tmp_path / "q8.gguf",
                   quantize_to=GgmlDType.Q8_0)
    assert Llama.from_gguf(path, Device.cpu(backend="numpy"))._fused_decoder_for_backend() is None
