"""Whisper's fused decode step with its weight matrices kept as float16 (numba_kernels/half.py).

Checked here:
- `widen` turns every one of the 65536 half bit patterns into numpy's float16 -> float32 value,
  bit for bit (zeros, subnormals, inf; NaN stays NaN): the widening is exact, so the f16 path
  multiplies the very same numbers as the f32 path;
- a decoder whose matrices hold only f16 values (as the CTranslate2 files do) takes the f16
  path, and its logits over a prompt, fused steps and a beam reorder are as close to the same
  decoder's float64 logits as MEASURED_FACTOR times the numpy backend's f32 generic path
  (assert_near_truth, as test_numba_whisper.py);
- the same decoder with CANDLE_WEB_WHISPER_F16=0 (f32 storage) is held to the same bound: the
  widening is exact, so both multiply the same numbers (same kernel, same order, only the vector
  code generated for the two loads may differ);
- a decoder with one matrix that is not f16-exact keeps every matrix in f32.
The real model's greedy tokens (tests/models/test_whisper*.py on the numba backend) exercise the
f16 path on tiny.en / base, whose files store f16.
"""

from __future__ import annotations

import numpy as np
import pytest
from candle_web.backend.settings import reload_settings

from tests.parts_testlib import (decode_logits, generic_and_truth, ran_fused, random_text_decoder,
                                 whisper_decoder_part)
from tests.tolerances_testlib import assert_near_truth


@pytest.fixture(scope="module")
def half(numba_backend):
    from candle_native.numba.kernels import half

    return half


def test_widen_is_exact_for_every_half_bit_pattern(half):
    from numba import njit

    @njit
    def widen_all(bits, out):
        for i in range(bits.size):
            out[i] = half.widen(bits[i])

    bits = np.arange(1 << 16, dtype=np.uint16)
    got = np.empty(bits.size, np.float32)
    widen_all(bits, got)
    want = bits.view(np.float16).astype(np.float32)
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    assert np.array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))


def test_exact_half_bits_accepts_only_half_values(half):
    values = np.array([0.0, -0.0, 1.5, 65504.0, 2.0 ** -24, -np.inf], np.float32)
    bits = half.exact_half_bits(values)
    assert bits is not None and bits.dtype == np.uint16
    assert np.array_equal(bits.view(np.float16).astype(np.float32), values)
    assert half.exact_half_bits(np.array([0.1], np.float32)) is None  # 0.1 rounds in f16
    assert half.exact_half_bits(np.array([1.0, np.nan], np.float32)) is None


def _matrices(decoder):
    found = [decoder.token_embedding]
    for block in decoder.blocks:
        found += [block.attn.qkv.weight, block.attn.out.weight, block.cross_attn.q.weight,
                  block.cross_attn.kv.weight, block.cross_attn.out.weight, block.mlp.fc1.weight,
                  block.mlp.fc2.weight]
    return found


def _half_valued_decoder(device, seed, dtype=np.float32):
    """The random test decoder with every weight matrix rounded to f16 values in place, as a
    checkpoint stored in f16 and widened at load (dtype float64: the same values in float64)."""
    decoder = random_text_decoder(device, np.random.default_rng(seed), dtype=dtype)
    for tensor in _matrices(decoder):
        values = tensor.storage_numpy()
        values[...] = values.astype(np.float16).astype(dtype)
    return decoder


def _fused_logits(device, decoder, audio, fed=None):
    got, state, _ = decode_logits(decoder, audio, device, steps=6, reorder_at=3, fed=fed)
    assert ran_fused(state), "the numba device should have taken the fused path"
    return got


@pytest.fixture
def devices(numba_backend):
    from candle_web import Device

    return Device.cpu(backend="numba"), Device.cpu(backend="numpy")


AUDIO = np.random.default_rng(8).standard_normal((2, 30, 64)).astype(np.float32)


def test_half_weights_take_the_f16_path_and_match_the_generic_path(devices, monkeypatch):
    fast, _ = devices
    monkeypatch.delenv("CANDLE_WEB_WHISPER_F16", raising=False)
    reload_settings()  # the switches are read once
    want, truth, fed = generic_and_truth(
        lambda device, dtype: _half_valued_decoder(device, 7, dtype), AUDIO, steps=6, reorder_at=3)
    decoder = _half_valued_decoder(fast, 7)
    got = _fused_logits(fast, decoder, AUDIO, fed)
    assert whisper_decoder_part(decoder).projection.dtype == np.uint16
    assert whisper_decoder_part(decoder).blocks[0].weights[2].dtype == np.uint16
    assert_near_truth(got, want, truth, "f16 storage")

    monkeypatch.setenv("CANDLE_WEB_WHISPER_F16", "0")
    reload_settings()  # the switches are read once
    f32_decoder = _half_valued_decoder(fast, 7)
    f32_got = _fused_logits(fast, f32_decoder, AUDIO, fed)
    assert whisper_decoder_part(f32_decoder).projection.dtype == np.float32
    assert_near_truth(f32_got, want, truth, "f32 storage")


def test_one_inexact_matrix_keeps_all_matrices_f32(devices, monkeypatch):
    fast, _ = devices
    monkeypatch.delenv("CANDLE_WEB_WHISPER_F16", raising=False)
    reload_settings()  # the switches are read once
    decoder = _half_valued_decoder(fast, 5)
    fc2 = decoder.blocks[-1].mlp.fc2.weight.storage_numpy()
    fc2[0, 0] = np.float32(0.1)  # not an f16 value
    _fused_logits(fast, decoder, AUDIO)
    fused = whisper_decoder_part(decoder)
    assert fused.projection.dtype == np.float32
    assert all(w.dtype == np.float32 for b in fused.blocks for w in b.weights[2::2])
