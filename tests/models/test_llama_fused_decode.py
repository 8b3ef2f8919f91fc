"""The numba backend's fused LLaMA decode step (native/candle_native/numba/parts/llama_decoder.py) against
the generic tensor path of the same model on the same backend.

Both multiply the same unpacked weights; the fused kernels only re-associate f32 sums (row
pairs sharing activation loads, lanes in registers). Tolerance: measured against the float64
truth, transformers' LlamaForCausalLM in float64 on the weights the GGUF holds (decoded): the
numba logits (fused and generic) may be MEASURED_FACTOR times as far from it as the numpy
backend's f32 logits are, plus a floor (assert_near_truth, tests/tolerances_testlib.py; numpy's error
measured 2-5e-7 of the largest logit, worst error/bound ratio 0.33). Scales off by 1e-5 in the
numba kernels fail it. Greedy ids must be identical. Covered:
32-element groups with and without offsets (Q4_0, Q4_1, Q5_1, Q8_0), 16-element groups
(Q6_K) and 32 with per-group offsets from K-quants (Q4_K), threaded and single-thread steps, a
KV cache that must grow during decoding, f32 weights, qwen2's QKV bias with fused projections
of mixed types (Q5_0/Q6_K q|k|v, Q4_K/Q5_0 gate|up), and the numpy backend (no fused step).
"""

from __future__ import annotations

import numpy as np
import pytest
from tests.models.llama_testlib import (QWEN2_CONFIG, TINY_CONFIG, WIDE_CONFIG, dequantized_state,
                                        qwen2_mixed_gguf, random_state, to_gguf,
                                        transformers_logits)
from tests.parts_testlib import llama_part, llama_steps
from tests.tolerances_testlib import assert_near_truth

from candle_web import Device
from candle_web.models.llama import Llama
from candle_web.quantized import GgmlDType

STEPS = 12


def decode(model, prompt, steps, fused, parallel=None, feed=None):
    """(greedy ids, logits per step) with the fused step on or off; `feed` replays another
    run's ids instead of this run's argmax."""
    steps_of = llama_steps(model, fused)
    if fused and parallel is not None:
        llama_part(model).parallel = parallel
    model.clear_kv_cache(capacity=4)  # small, so decoding grows the cache
    logits = [steps_of([prompt], 0).to_numpy()[0]]
    ids = [int(np.argmax(logits[-1]))]
    for step in range(steps):
        token = ids[-1] if feed is None else feed[step]
        logits.append(steps_of([[token]], model.seq_len).to_numpy()[0])
        ids.append(int(np.argmax(logits[-1])))
    return ids, np.array(logits)


def float64_logits(config, weights, ids):
    """The truth: logits [len(ids), vocab] of `weights` (HF layout) in float64."""
    pytest.importorskip("transformers")
    return transformers_logits(config, weights, ids, dtype=np.float64)


def assert_same_decode(model, prompt, config, weights, path):
    """The fused steps give the generic path's greedy ids, and both paths' logits are within
    the measured bound of the float64 truth. The f32 error the bound scales is the numpy
    backend's (the reference), not the numba generic path's: a mistake in a numba kernel that
    both paths share must not widen it."""
    expected_ids, expected = decode(model, prompt, STEPS, fused=False)
    _, reference = decode(Llama.load(path, device=Device.cpu(backend="numpy")), prompt, STEPS,
                          fused=False, feed=expected_ids)
    # The logits read: the prompt's last position, then one per decoded token.
    truth = float64_logits(config, weights, prompt + expected_ids[:-1])[len(prompt) - 1:]
    assert_near_truth(expected, reference, truth, "generic path")
    for parallel in (True, False):
        ids, logits = decode(model, prompt, STEPS, fused=True, parallel=parallel)
        assert_near_truth(logits, reference, truth, f"parallel={parallel}")
        assert ids == expected_ids


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1", "Q5_1", "Q8_0"])
def test_fused_step_equals_generic_path(numba_device, tmp_path, qtype):
    state, kind = random_state(TINY_CONFIG, seed=3), GgmlDType.parse(qtype)
    path = to_gguf(state, TINY_CONFIG, tmp_path / f"{qtype}.gguf", quantize_to=kind)
    model = Llama.load(path, device=numba_device)
    assert llama_part(model) is not None
    assert_same_decode(model, [1, 5, 9, 33, 70], TINY_CONFIG, dequantized_state(state, kind), path)


@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K"])
def test_fused_step_with_k_quants(numba_device, tmp_path, qtype):
    state, kind = random_state(WIDE_CONFIG, seed=4), GgmlDType.parse(qtype)
    path = to_gguf(state, WIDE_CONFIG, tmp_path / f"{qtype}.gguf", quantize_to=kind)
    model = Llama.load(path, device=numba_device)
    assert llama_part(model) is not None
    assert_same_decode(model, [2, 7, 100], WIDE_CONFIG, dequantized_state(state, kind), path)


def test_fused_step_with_qkv_bias_and_mixed_types(numba_device, tmp_path):
    path, decoded = qwen2_mixed_gguf(tmp_path)
    model = Llama.load(path, device=numba_device)
    qkv = model.part_weights().layers[0].qkv
    assert [q.dtype.name for q in qkv.qweights] == ["Q5_0", "Q5_0", "Q6_K"]
    assert llama_part(model) is not None
    assert_same_decode(model, [2, 7, 100, 31], QWEN2_CONFIG, decoded, path)


def test_fused_step_matches_a_full_pass(numba_device, tmp_path):
    """Position bookkeeping: the step's logits at each position equal those of one pass over
    the whole sequence (all_logits, generic path)."""
    state = random_state(TINY_CONFIG, seed=5)
    path = to_gguf(state, TINY_CONFIG, tmp_path / "q8.gguf", quantize_to=GgmlDType.Q8_0)
    model = Llama.load(path, device=numba_device)
    ids, logits = decode(model, [4, 8], 6, fused=True)
    model.clear_kv_cache()
    sequence = [4, 8] + ids[:-1]
    full = model.forward([sequence], all_logits=True).to_numpy()[0]
    reference = Llama.load(path, device=Device.cpu(backend="numpy")).forward(
        [sequence], all_logits=True).to_numpy()[0]
    truth = float64_logits(TINY_CONFIG, dequantized_state(state, GgmlDType.Q8_0), sequence)
    assert_near_truth(full, reference, truth, "full pass")
    assert_near_truth(logits, reference[1:], truth[1:], "steps")


def test_fused_step_with_float_weights(numba_device, tmp_path):
    """f32 matrices (a GGUF dequantized at load here; float safetensors checkpoints alike) run
    the same fused step through its f32 matrix-vector kernels."""
    state = random_state(TINY_CONFIG, seed=6)
    path = to_gguf(state, TINY_CONFIG, tmp_path / "f32.gguf")
    model = Llama.load(path, device=numba_device, mode="dequantize")
    assert not model.lm_head.is_quantized
    assert llama_part(model) is not None
    assert_same_decode(model, [3, 11, 40, 2], TINY_CONFIG, state, path)


def test_no_fused_step_on_numpy(tmp_path):
    path = to_gguf(random_state(TINY_CONFIG, seed=6), TINY_CONFIG, tmp_path / "q8.gguf",
                   quantize_to=GgmlDType.Q8_0)
    assert llama_part(Llama.load(path, device=Device.cpu(backend="numpy"))) is None
