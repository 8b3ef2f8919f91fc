"""Quantization: bit-exact with gguf.quants where it has a quantizer, error bounds for the
k-quants it lacks (Q4_K, Q6_K, Q8_K).

Error bounds for the k-quants, and why:
- Q8_K: the largest |x| maps to -127 and d = 1/iscale is stored as f32, so |iscale * x| <= 127
  never clips and every element is off by at most d/2 (+ f32 rounding: 2**-20 relative slack).
- Q6_K and Q4_K: after choosing scales, ggml's reference re-rounds every element to the nearest
  level of the *stored* (6/8-bit, f16) scales. So each dequantized value must be the nearest
  representable one: |x - y| <= min over levels |x - level| (+ a few f32 ulps).
- Overall accuracy on N(0, 1) data, relative RMS error: a uniform quantizer with step s has RMS
  error s / sqrt(12). Q6_K: 16-element groups, s ~ max|x| / 32 ~ 1.77 / 32 -> 0.016; bound 0.02.
  Q4_K: 32-element groups spanning max - min ~ 4.1 over 15 steps -> 0.079 for a plain min/max
  grid; the reference's weighted search must do at least as well, bound 0.079.
  Q8_K: s ~ 3.0 / 127 (max of 256 samples) -> 0.0068; bound 0.008.
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from candle_web.core.errors import DTypeMismatch, ShapeError, UnsupportedError
from candle_web.quantized import GgmlDType, dequantize, quantize
from candle_web.quantized.blocks_k import unpack_k4_scales

GGUF_PY_QUANTIZERS = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "BF16", "F16"]
F32_ULP_SLACK = 2.0**-20  # relative slack for f32 rounding in scale products and divisions


def awkward_inputs(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Inputs chosen to hit the rounding corners of the reference code, 256 columns each."""
    halves = np.arange(-128, 128, dtype=np.float32) / 2  # exact .5 values: tie breaking
    constant = np.full((4, 256), 0.3, dtype=np.float32)
    one_spike = np.zeros((4, 256), dtype=np.float32)
    one_spike[:, 7] = [-3.0, 3.0, 1e-30, -1e-30]
    return {
        "gaussian": rng.standard_normal((64, 256)).astype(np.float32),
        "heavy_tailed": rng.standard_t(2, (32, 256)).astype(np.float32),
        "positive": rng.uniform(0.5, 2.0, (16, 256)).astype(np.float32),
        "tiny": (rng.standard_normal((8, 256)) * 1e-6).astype(np.float32),
        "huge": (rng.standard_normal((8, 256)) * 1e4).astype(np.float32),
        "zeros": np.zeros((2, 256), dtype=np.float32),
        "constant": constant,
        "one_spike": one_spike,
        "halves": np.tile(halves, (2, 1)),
    }


@pytest.mark.parametrize("name", GGUF_PY_QUANTIZERS)
def test_bit_exact_with_gguf_py(name, rng):
    qtype = gguf.GGMLQuantizationType[name]
    for case, values in awkward_inputs(rng).items():
        expected = gguf.quants.quantize(values, qtype).reshape(-1).view(np.uint8)
        ours = quantize(name, values)
        assert ours.dtype == np.uint8
        assert np.array_equal(ours, expected), f"{name} differs from gguf.quants on {case}"


@pytest.mark.parametrize("name", ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"])
def test_legacy_round_trip_through_gguf_py_dequantize(name, rng):
    values = rng.standard_normal((16, 64)).astype(np.float32)
    raw = quantize(name, values).reshape(16, -1)
    theirs = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[name])
    np.testing.assert_array_equal(dequantize(name, raw, values.size).reshape(16, 64), theirs)


def relative_rms_error(x: np.ndarray, y: np.ndarray) -> float:
    return float(np.sqrt(np.mean((x - y) ** 2) / np.mean(x ** 2)))


def test_q8_k_error_within_half_a_step(rng):
    for case, values in awkward_inputs(rng).items():
        raw = quantize("Q8_K", values).reshape(-1, 292)
        restored = dequantize("Q8_K", raw, values.size).reshape(-1, 256)
        blocks = values.reshape(-1, 256)
        step = np.abs(blocks).max(axis=1, keepdims=True) / 127
        error = np.abs(restored - blocks)
        assert (error <= step / 2 * (1 + F32_ULP_SLACK) + 1e-45).all(), case
        # bsums: the i16 sums of 16 consecutive quants (what the dot kernels rely on)
        quants = raw[:, 4:260].view(np.int8).astype(np.int32)
        bsums = np.ascontiguousarray(raw[:, 260:292]).view("<i2")
        np.testing.assert_array_equal(bsums, quants.reshape(-1, 16, 16).sum(axis=2))


def q6_k_stored_scales(raw: np.ndarray) -> np.ndarray:
    """(n_blocks, 16) effective scales d * sc of Q6_K blocks."""
    d = np.ascontiguousarray(raw[:, 208:210]).view("<f2").astype(np.float32)
    return d * raw[:, 192:208].view(np.int8).astype(np.float32)


def q4_k_stored_scales(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(n_blocks, 8) effective scales d * sc and offsets dmin * m of Q4_K blocks."""
    d = np.ascontiguousarray(raw[:, 0:2]).view("<f2").astype(np.float32)
    dmin = np.ascontiguousarray(raw[:, 2:4]).view("<f2").astype(np.float32)
    sc, m = unpack_k4_scales(np.ascontiguousarray(raw[:, 4:16]))
    return d * sc.astype(np.float32), dmin * m.astype(np.float32)


def assert_nearest_level(values, restored, levels, case):
    """Each restored value is (one of) the closest of ``levels`` (broadcast on the last axis)."""
    best = np.abs(values[..., None] - levels).min(axis=-1)
    slack = F32_ULP_SLACK * (np.abs(values) + np.abs(levels).max(axis=-1)) + 1e-30
    got = np.abs(values - restored)
    assert (got <= best + slack).all(), (case, float((got - best).max()))


def test_q6_k_picks_the_nearest_level_of_its_stored_scales(rng):
    for case, values in awkward_inputs(rng).items():
        raw = quantize("Q6_K", values).reshape(-1, 210)
        restored = dequantize("Q6_K", raw, values.size).reshape(-1, 16, 16)
        groups = values.reshape(-1, 16, 16)
        scale = q6_k_stored_scales(raw)[:, :, None, None]
        levels = scale * np.arange(-32, 32, dtype=np.float32)
        assert_nearest_level(groups, restored, levels, case)


def test_q4_k_picks_the_nearest_level_of_its_stored_scales(rng):
    for case, values in awkward_inputs(rng).items():
        raw = quantize("Q4_K", values).reshape(-1, 144)
        restored = dequantize("Q4_K", raw, values.size).reshape(-1, 8, 32)
        groups = values.reshape(-1, 8, 32)
        scale, offset = q4_k_stored_scales(raw)
        levels = scale[:, :, None, None] * np.arange(16, dtype=np.float32) \
            - offset[:, :, None, None]
        assert_nearest_level(groups, restored, levels, case)


@pytest.mark.parametrize("name,bound", [("Q8_K", 0.008), ("Q6_K", 0.02), ("Q4_K", 0.079)])
def test_k_quant_accuracy_on_gaussian_weights(name, bound, rng):
    values = rng.standard_normal((128, 512)).astype(np.float32)
    restored = dequantize(name, quantize(name, values), values.size).reshape(values.shape)
    error = relative_rms_error(values, restored)
    assert error < bound, f"{name}: relative RMS error {error:.4f}"


@pytest.mark.parametrize("name", ["Q4_K", "Q6_K"])
def test_k_quant_bytes_decode_the_same_in_gguf_py(name, rng):
    values = rng.standard_normal((8, 512)).astype(np.float32)
    raw = quantize(name, values).reshape(8, -1)
    theirs = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[name])
    np.testing.assert_array_equal(dequantize(name, raw, values.size).reshape(8, 512), theirs)


def test_k_quants_of_zeros_are_zero():
    for name in ["Q4_K", "Q6_K", "Q8_K"]:
        restored = dequantize(name, quantize(name, np.zeros(512, np.float32)), 512)
        np.testing.assert_array_equal(restored, 0.0)


@pytest.mark.parametrize("name,dtype", [("blk.0.attn_output.weight", "Q4_K"),
                                        ("blk.0.ffn_down.weight", "Q6_K")])
def test_requantizing_real_gemma_weights_recovers_their_grid(model_file, name, dtype):
    """Real trained weights, decoded from Gemma-3's own Q4_K/Q6_K blocks, re-encoded in the same
    type: the values already lie on such a grid, so a sound fit must land (almost) on them.
    Measured: 0.0 for Q4_K, 3e-4 for Q6_K; the bound 1e-3 is far below a grid step (Q4_K's
    accuracy on fresh data is ~0.07, Q6_K's ~0.018)."""
    from candle_web.io.gguf import GgufFile

    weights = GgufFile(model_file("gemma3-270m-q4km", "gemma-3-270m-Q4_K_M.gguf"))
    qt = weights.qtensor(name)
    assert qt.dtype.name == dtype
    original = qt.dequantize_rows(0, 64)
    restored = dequantize(dtype, quantize(dtype, original), original.size)
    assert relative_rms_error(original, restored.reshape(original.shape)) < 1e-3


def test_quantize_validates_its_input():
    with pytest.raises(ShapeError, match="multiple of 32"):
        quantize("Q4_0", np.zeros(40, np.float32))
    with pytest.raises(DTypeMismatch, match="expects floats"):
        quantize("Q8_0", np.zeros(32, np.int32))
    with pytest.raises(UnsupportedError, match="Q2_K"):
        quantize(GgmlDType.Q2_K, np.zeros(256, np.float32))
    with pytest.raises(UnsupportedError, match="NaN or inf"):
        quantize("Q8_0", np.full(32, np.nan, np.float32))
