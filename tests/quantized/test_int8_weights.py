"""Weights quantized to int8 per output row (quantized/int8_weights.py), against a float64
re-derivation of the rule: the scale is amax / 127 correctly rounded to f32 (f64 then f32
rounding of a quotient is exact, 53 >= 2 * 24 + 2), each level is the nearest integer to
w / scale except where the f64 quotient lies within the f32 division's rounding of a half,
and every dequantized weight is within half a step of the original."""

from __future__ import annotations

import numpy as np
import pytest

from candle_web.core.errors import ShapeError
from candle_web.quantized.int8_weights import GROUP, quantize_weight_rows


def weights(rng, dtype=np.float32):
    w = (rng.standard_normal((40, 96)) * rng.uniform(0.01, 3.0, (40, 1))).astype(dtype)
    w[3] = 0.0  # a row of zeros: scale 0
    w[5, 7] = 40.0  # one loud weight beside quiet ones
    w[6, :] = np.linspace(-127, 127, 96)  # amax 127: scale 1, every level exact
    w[6, :4] = [127.0, 0.5, 1.5, -2.5]  # ties: half to even
    return w


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_levels_and_scales_match_a_float64_derivation(dtype):
    w = weights(np.random.default_rng(41), dtype)
    got = quantize_weight_rows(w)
    w64 = w.astype(np.float64)
    amax = np.abs(w64).max(axis=1)
    want_scale = (amax / 127.0).astype(np.float32)
    assert got.levels.dtype == np.int8 and got.levels.shape == w.shape
    assert got.scales.dtype == np.float32 and got.scales.shape == (40, 96 // GROUP)
    assert (got.scales == got.row_scales[:, None]).all()  # one scale per row, in every group
    assert np.array_equal(got.row_scales.view(np.uint32), want_scale.view(np.uint32))
    live = want_scale > 0
    quotient = w64[live] / want_scale[live, None].astype(np.float64)
    near_half = np.abs(np.abs(quotient - np.floor(quotient)) - 0.5) < 2.0 ** -16
    levels = got.levels[live].astype(np.float64)
    assert (np.abs(levels) <= 127).all()
    assert np.array_equal(levels[~near_half], np.rint(quotient)[~near_half])
    assert (np.abs(levels - quotient) <= 0.5 + 2.0 ** -16).all()
    step = want_scale[:, None].astype(np.float64)
    error = np.abs(got.dequantize().astype(np.float64) - w64)
    assert (error <= step * (0.5 + 2.0 ** -16)).all()
    assert not got.levels[3].any() and got.row_scales[3] == 0
    assert list(got.levels[6, :4]) == [127, 0, 2, -2]
    assert got.levels[5, 7] == 127


def test_a_non_finite_row_gives_nan_products_and_other_rows_are_unaffected():
    w = weights(np.random.default_rng(42))
    clean = quantize_weight_rows(w)
    w[2, 9] = np.nan
    w[4, 0] = -np.inf
    got = quantize_weight_rows(w)
    assert np.isnan(got.row_scales[[2, 4]]).all() and not got.levels[[2, 4]].any()
    others = [i for i in range(w.shape[0]) if i not in (2, 4)]
    assert np.array_equal(got.levels[others], clean.levels[others])
    assert np.array_equal(got.scales[others], clean.scales[others])


def test_shapes_the_products_cannot_take_are_refused():
    with pytest.raises(ShapeError, match="multiple of 32"):
        quantize_weight_rows(np.ones((4, 40), np.float32))
    with pytest.raises(ShapeError, match="float64"):
        quantize_weight_rows(np.ones((4, 64), np.float64))
