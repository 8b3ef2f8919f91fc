"""The error bounds of tests/tolerances_testlib.py can fail: each one accepts another correct f32
evaluation (the float64 result rounded to f32, or another summation order) and rejects a
realistic mistake (a dropped term, half-precision accumulation, a wrong formula), with the
numpy reference backend only."""

from __future__ import annotations

import numpy as np
import pytest

from candle_web.backend import get_backend
from tests.tolerances_testlib import (assert_near_truth, assert_within, attention_bound, dot_bound,
                                      layer_norm_bound, log_softmax_bound, rms_norm_bound,
                                      softmax_bound, unary_bound)

REF = get_backend("numpy")


@pytest.fixture
def rng():
    return np.random.default_rng(12)


def rounded(values) -> np.ndarray:
    """The float64 result rounded once to f32: the most accurate f32 evaluation there is."""
    return np.asarray(values, np.float64).astype(np.float32)


def fails(got, want, bound, match="ratio"):
    with pytest.raises(AssertionError, match=match):
        assert_within(got, want, bound)


def test_assert_within_names_the_worst_element_and_checks_structure():
    want = np.array([[1.0, 2.0], [3.0, np.nan]], np.float32)
    got = want.copy()
    assert assert_within(got, want, 0.0) == 0.0  # equal, NaN at the same place
    got[1, 0] += 1e-3
    with pytest.raises(AssertionError, match=r"index \(1, 0\)"):
        assert_within(got, want, 1e-4)
    assert assert_within(got, want, 2e-3) <= 0.5
    fails(want.astype(np.float64), want, 1.0, match="dtype")
    fails(want[:1], want, 1.0, match="shape")
    moved = want.copy()
    moved[1, 1], moved[0, 0] = 1.0, np.nan
    fails(moved, want, 1.0, match="non-finite")


def test_dot_bound_takes_any_order_and_rejects_half_accumulation_and_a_dropped_term(rng):
    a = rng.standard_normal((5, 768)).astype(np.float32)
    b = rng.standard_normal((768, 9)).astype(np.float32)
    want = REF.matmul(a, b)
    bound = dot_bound(a, b)
    assert_within(rounded(a.astype(np.float64) @ b), want, bound)
    sequential = np.cumsum(a[:, :, None] * b[None], axis=1, dtype=np.float32)[:, -1]
    assert_within(sequential, want, bound)
    in_half = np.cumsum((a[:, :, None] * b[None]).astype(np.float16), axis=1)[:, -1]
    fails(in_half.astype(np.float32), want, bound)
    fails(REF.matmul(a[:, 1:], b[1:]), want, bound)  # the first of 768 terms left out


def test_unary_bound_takes_correct_rounding_and_rejects_another_formula(rng):
    x = (rng.standard_normal(4000) * 4).astype(np.float32)
    for op in ("exp", "tanh", "gelu_erf", "silu"):
        want = REF.unary(op, x)
        assert_within(rounded(REF.unary(op, x.astype(np.float64))), want, unary_bound(op, x, want))
    want = REF.unary("gelu_erf", x)
    fails(REF.unary("gelu", x), want, unary_bound("gelu_erf", x, want))  # the tanh fit
    want = REF.unary("exp", x)
    fails(want * np.float32(1 + 1e-5), want, unary_bound("exp", x, want))


def test_softmax_bounds_reject_a_sum_that_misses_a_term(rng):
    x = (rng.standard_normal((6, 1000)) * 4).astype(np.float32)
    x[:, 7] = -np.inf
    want = REF.softmax_last_dim(x)
    assert_within(rounded(REF.softmax_last_dim(x.astype(np.float64))), want, softmax_bound(x))
    weights = np.exp(x - x.max(axis=-1, keepdims=True))
    missing_one = weights / (weights.sum(axis=-1, keepdims=True) - weights[:, -1:])
    fails(missing_one, want, softmax_bound(x))
    want = REF.log_softmax_last_dim(x)
    bound = log_softmax_bound(x, want)
    assert_within(rounded(REF.log_softmax_last_dim(x.astype(np.float64))), want, bound)
    with np.errstate(divide="ignore"):
        fails(np.log(missing_one), want, bound)


def test_norm_bounds_reject_the_unbiased_variance(rng):
    x = (rng.standard_normal((5, 1031)) * 3 + 1).astype(np.float32)
    w, b = rng.standard_normal((2, 1031)).astype(np.float32)
    want = REF.layer_norm(x, w, b, 1e-5)
    bound = layer_norm_bound(x, w, b, 1e-5, want)
    assert_within(rounded(REF.layer_norm(x.astype(np.float64), w, b, 1e-5)), want, bound)
    centered = x - x.mean(axis=-1, keepdims=True)
    unbiased = centered / np.sqrt((centered ** 2).sum(-1, keepdims=True) / 1030 + 1e-5) * w + b
    fails(unbiased, want, bound)
    want = REF.rms_norm(x, w, 1e-6)
    bound = rms_norm_bound(x, 1e-6, want)
    assert_within(rounded(REF.rms_norm(x.astype(np.float64), w, 1e-6)), want, bound)
    fails(x / np.sqrt((x * x).sum(-1, keepdims=True) / 1030 + 1e-6) * w, want, bound)


def test_attention_bound_rejects_a_shifted_causal_mask_and_another_head(rng):
    q = rng.standard_normal((2, 3, 20, 64)).astype(np.float32)
    k = rng.standard_normal((2, 3, 300, 64)).astype(np.float32)
    v = rng.standard_normal((2, 3, 300, 64)).astype(np.float32)
    rows = np.arange(20)[:, None] + 280
    mask = np.where(np.arange(300)[None] > rows, -np.inf, 0.0).astype(np.float32)
    want = REF.attention(q, k, v, mask, 0.125)
    bound = attention_bound(q, k, v, mask, 0.125)
    assert_within(rounded(REF.attention(*(t.astype(np.float64) for t in (q, k, v, mask)), 0.125)),
                  want, bound)
    fails(REF.attention(q, k, v, np.roll(mask, 1, axis=1), 0.125), want, bound)
    fails(REF.attention(q, np.roll(k, 1, axis=1), np.roll(v, 1, axis=1), mask, 0.125), want, bound)


def test_near_truth_rejects_a_perturbed_output_and_a_wrong_truth(rng):
    a = rng.standard_normal((40, 256)).astype(np.float32)
    b = rng.standard_normal((256, 30)).astype(np.float32)
    truth = a.astype(np.float64) @ b
    reference = REF.matmul(a, b)
    other_order = np.cumsum(a[:, :, None] * b[None], axis=1, dtype=np.float32)[:, -1]
    assert_near_truth(other_order, reference, truth)
    perturbed = reference.copy()
    perturbed[3, 4] += 1e-4 * np.abs(truth).max()
    with pytest.raises(AssertionError, match="ratio"):
        assert_near_truth(perturbed, reference, truth)
    with pytest.raises(AssertionError, match="same function"):
        assert_near_truth(reference, reference, truth + 0.01 * np.abs(truth).max())
