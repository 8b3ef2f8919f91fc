"""Error bounds derived from the computation, for comparing two floating-point evaluations of
the same thing (a native backend or a fused model step against the numpy reference, or one of
them against a float64 truth). Imported as
`tests.tolerances_testlib` (see tests/__init__.py).

Why not a fixed tolerance ("1e-5 of the largest magnitude"): that is one machine's measurement.
The rounding error of a sum depends on its order (BLAS blocking, vector lanes, threads), on FMA
contraction and on which libm ran (numpy picks its SIMD exp by CPU), so another machine lands
past it: test_numba_whisper's peaked decode step measured 1.28e-5 against 1e-5 on a fresh
machine (there the f32 *reference* was the inaccurate side: 1.0e-5 from the float64 truth,
the fused step 1.8e-6).

The model (Higham, "Accuracy and Stability of Numerical Algorithms", 2nd ed., ch. 2-3):
- every +, -, *, / and sqrt returns the exact result times (1 + d), |d| <= u, with u the unit
  roundoff (2**-24 in f32, half of F32_EPS); n roundings in a chain stay within gamma(n);
- a dot product of length K, summed in any order (blocked, in lanes, with FMA), is within
  gamma(K) * sum_i |a_i b_i| of the exact one (Higham eq. 3.5); two f32 evaluations are within
  twice that of each other, which is what `evaluations=2` (the default) means everywhere;
- a library function (exp, log, tanh, ...) is within some ulps of its exact value, and c ulps
  of y are at most c * eps * |y|.
The bounds are first order (terms in u**2 dropped, a relative slack of about K * u). Every
builder returns float64 allowed absolute errors, broadcastable to the result, and computes
from float64 copies of the inputs (the exact values of the f32 inputs).
Whole-network comparisons use a measured bound instead (assert_near_truth): propagating these
through a model by hand would be unreadable, and the network can be run in float64.
"""

from __future__ import annotations

import math

import numpy as np

F32_EPS = float(np.finfo(np.float32).eps)  # 2**-23: the spacing of f32 at 1
# The smallest normal f32. Below it results are subnormal (absolute spacing 2**-149) or flushed
# to 0, so relative bounds stop holding; allowed as an absolute error per evaluation.
F32_TINY = float(np.finfo(np.float32).tiny)

# ulps of one library function evaluation (exp, log, sin, cos, tanh), in any implementation
# the tests meet: numpy's own f32 accuracy contract (numpy/_core/tests/data/
# umath-validation-set-*.csv: exp 3, log 4, sin/cos/tanh 2), CUDA's expf/sinf/cosf/tanhf 2 and
# logf 1 (CUDA C Programming Guide, single-precision maximum ulp error), glibc's <= 2, and
# numba's vectorised exp_f32 (relative 3e-7, 2.5 ulps; candle_native/numba/kernels/vector_math).
LIBM_ULPS = 4
# Absolute error of one erf, in eps (|erf| <= 1, so ulps of the result would not do near 0,
# where numpy's f32 fit computes 1 - erfc and cancels). f32: the fit's 1.2e-7 (candle_web
# numpy_backend _ERFC_COEFFS, 1 eps) + exp inside it (LIBM_ULPS of erfc <= 1) + the f32
# evaluation of t, the polynomial and 1 - erfc (~1 eps); numba's fit is 4e-8 plus its f32
# evaluation. f64: numpy_backend._erf_f64 sums at most 2 * 6**2 + 60 = 132 positive series
# terms, each from two roundings: gamma(264) = 132 eps (measured 11.5).
ERF_ABS_ULPS = {np.dtype(np.float32): 6, np.dtype(np.float64): 132}
# Whole networks: the f32 path under test may be this many times as far from the float64
# truth as the numpy f32 reference is (the numba paths measured 0.2-2x), plus FLOOR_ULPS of
# the largest magnitude so that a reference that happens to be nearly exact asks for no miracle.
MEASURED_FACTOR = 4.0
FLOOR_ULPS = 4
# A float64 "truth" this far (relative to the largest magnitude) from the f32 reference did not
# compute the same function (a weight left out of the float64 copy, other tokens fed); the
# networks tested here measure 2e-7-1e-5. A guard against a truth that would excuse anything.
SAME_FUNCTION = 2.0 ** -10
# Attention kernels may drop softmax weights below exp(-64) (numba's SOFTMAX_NEGLIGIBLE,
# taken as 0 to avoid subnormal arithmetic): an absolute error, allowed explicitly.
NEGLIGIBLE_WEIGHT = math.exp(-64.0)


def unit_roundoff(dtype=np.float32) -> float:
    return float(np.finfo(dtype).eps) / 2


def gamma(n, dtype=np.float32):
    """Higham's gamma_n = n u / (1 - n u): the relative error of n chained roundings."""
    nu = np.asarray(n, dtype=np.float64) * unit_roundoff(dtype)
    return nu / (1.0 - nu)


def _abs64(x) -> np.ndarray:
    return np.abs(np.asarray(x, dtype=np.float64))


# -- the assertions -----------------------------------------------------------------------------

def _check_structure(got, want, what, dtype) -> np.ndarray:
    """Same shape, dtype (want's, or `dtype`), and NaN/inf at the same places with the same
    values; returns the mask of finite elements."""
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    expected_dtype = np.dtype(dtype) if dtype is not None else want.dtype
    assert got.dtype == expected_dtype, f"{what}: dtype {got.dtype} != {expected_dtype}"
    finite = np.isfinite(want)
    assert np.array_equal(finite, np.isfinite(got)), f"{what}: non-finite values differ"
    assert np.array_equal(got[~finite], want[~finite].astype(got.dtype), equal_nan=True), \
        f"{what}: inf/nan differ"
    return finite


def assert_within(got, want, bound, what: str = "", dtype=None) -> float:
    """|got - want| <= bound element by element (bound broadcasts to the result; 0 asks for
    equality). Returns the worst error/bound ratio (for reports); a failure names the worst
    element, its values and its bound. `dtype`: the dtype got must have when want is a float64
    truth."""
    got, want = np.asarray(got), np.asarray(want)
    finite = _check_structure(got, want, what, dtype)
    if not finite.any():
        return 0.0
    bound = np.broadcast_to(np.asarray(bound, dtype=np.float64), want.shape)
    assert np.all(bound[finite] >= 0), f"{what}: negative or NaN bound"
    with np.errstate(divide="ignore", invalid="ignore"):  # inf - inf where both are inf
        err = np.where(finite, np.abs(got.astype(np.float64) - want.astype(np.float64)), 0.0)
        ratio = np.where(err == 0, 0.0, err / bound)
    worst = np.unravel_index(int(np.argmax(ratio)), ratio.shape)
    worst_ratio = float(ratio[worst])
    assert worst_ratio <= 1.0, (
        f"{what}: error {err[worst]:.3g} > bound {bound[worst]:.3g} (ratio {worst_ratio:.3g}) at "
        f"index {tuple(int(i) for i in worst)}: got {got[worst]!r}, want {want[worst]!r}")
    return worst_ratio


def measured_bound(reference, truth, factor: float = MEASURED_FACTOR,
                   floor_ulps: float = FLOOR_ULPS) -> float:
    """The allowed |got - truth| for an f32 computation whose f32 reference evaluation is
    `reference` and whose float64 evaluation is `truth`: `factor` times the reference's own
    worst error plus floor_ulps of the largest magnitude."""
    reference, truth = np.asarray(reference, np.float64), np.asarray(truth, np.float64)
    finite = np.isfinite(truth)
    if not finite.any():
        return 0.0
    reference_error = float(np.abs(reference[finite] - truth[finite]).max())
    scale = float(np.abs(truth[finite]).max())
    assert reference_error <= SAME_FUNCTION * scale, (
        f"the f32 reference is {reference_error / scale:.3g} of the scale from the float64 "
        "truth: they do not compute the same function")
    return factor * reference_error + floor_ulps * F32_EPS * scale


def assert_near_truth(got, reference, truth, what: str = "",
                      factor: float = MEASURED_FACTOR) -> float:
    """A whole network's f32 output `got` against its float64 `truth`, allowed `factor` times
    the error of the f32 `reference` (same shape, dtype and non-finite places as got); returns
    the worst error/bound ratio."""
    got, reference = np.asarray(got), np.asarray(reference)
    _check_structure(got, reference, what, None)
    bound = measured_bound(reference, truth, factor)
    return assert_within(got, np.asarray(truth, np.float64), bound, what, dtype=got.dtype)


# -- sums and products ----------------------------------------------------------------------------

def sum_bound(magnitudes, terms, evaluations: int = 2, dtype=np.float32):
    """A sum of `terms` rounded operations per element (e.g. K products and their sum) whose
    term magnitudes add up to `magnitudes`: evaluations * gamma(terms) * magnitudes."""
    return evaluations * gamma(terms, dtype) * _abs64(magnitudes)


def dot_bound(a, b, evaluations: int = 2, extra_roundings: int = 0, dtype=np.float32):
    """a @ b (numpy matmul broadcasting) computed in f32 in any order: gamma(K + extra) *
    (|a| @ |b|) per evaluation. extra_roundings: per-term roundings beyond the product and the
    sum (a scale applied to each group, an offset added)."""
    k = np.shape(a)[-1]
    return sum_bound(np.matmul(_abs64(a), _abs64(b)), k + extra_roundings, evaluations, dtype)


# -- elementwise ----------------------------------------------------------------------------------

def elementwise_bound(scale, ulps, evaluations: int = 2, dtype=np.float32):
    """ulps * eps * |scale| per evaluation (ulps of the result when scale is the result)."""
    return evaluations * ulps * float(np.finfo(dtype).eps) * _abs64(scale)


# Per op: (ulps per evaluation, what they are ulps of). "out": |y|; "in+out": |x| + |y| for
# compositions that cancel (1 + tanh(z) near -1), where the error is absolute in |x|; "erf":
# ERF_ABS_ULPS absolute plus the ulps of |y|; "gelu_erf": half of ERF_ABS_ULPS + 1 of |x| plus
# the ulps of |y|.
UNARY_ULPS = {
    # Exact in every implementation.
    "abs": (0, "out"), "neg": (0, "out"), "relu": (0, "out"), "sign": (0, "out"),
    "floor": (0, "out"), "ceil": (0, "out"), "round": (0, "out"),
    # One IEEE-rounded operation (half an ulp); one ulp allows x * (1/y) for a division.
    "sqr": (1, "out"), "sqrt": (1, "out"), "recip": (1, "out"),
    "exp": (LIBM_ULPS, "out"), "log": (LIBM_ULPS, "out"), "sin": (LIBM_ULPS, "out"),
    "cos": (LIBM_ULPS, "out"), "tanh": (LIBM_ULPS, "out"),
    # 1 / (1 + e) or e / (1 + e): exp's ulps plus two roundings; silu one more product.
    "sigmoid": (LIBM_ULPS + 1, "out"), "silu": (LIBM_ULPS + 2, "out"),
    "erf": (LIBM_ULPS, "erf"),
    # 0.5 x (1 + t): an absolute error e in t costs 0.5 |x| e. tanh form: e <= LIBM_ULPS eps
    # + tanh'(z) |z| * 3u for the rounded argument (|z| sech^2 z <= 0.45), so 0.5 (4 + 0.7 + 1)
    # = 2.9 eps of |x| (4 allowed); erf form: e <= ERF_ABS_ULPS eps, plus 1 + erf's rounding.
    # Plus 2 roundings of y.
    "gelu": (4, "in+out"), "gelu_erf": (1, "gelu_erf"),
}


def unary_bound(op: str, x, want, evaluations: int = 2, dtype=np.float32):
    """Allowed error of the unary op `op` on inputs x with reference result `want` (UNARY_ULPS),
    plus F32_TINY per evaluation for inexact ops whose results underflow."""
    ulps, kind = UNARY_ULPS[op]
    eps = float(np.finfo(dtype).eps)
    per = ulps * eps * _abs64(want)
    if kind == "in+out":
        per = per + ulps * eps * _abs64(x)
    elif kind == "erf":
        per = per + ERF_ABS_ULPS[np.dtype(dtype)] * eps
    elif kind == "gelu_erf":
        per = per + 0.5 * (ERF_ABS_ULPS[np.dtype(dtype)] + 1) * eps * _abs64(x)
    if ulps and np.dtype(dtype) == np.float32:
        per = per + F32_TINY
    return evaluations * per


def silu_mul_bound(want, evaluations: int = 2):
    """silu(gate) * up: silu's ulps plus the product's rounding, relative to the result."""
    return evaluations * ((UNARY_ULPS["silu"][0] + 1) * F32_EPS * _abs64(want) + F32_TINY)


# -- row kernels ----------------------------------------------------------------------------------

def _softmax_terms(x, exp_ulps, dtype=np.float32):
    """(p, per-element relative error of exp(x_j - max), relative error of the row sum) for
    rows of x in float64; masked entries (-inf) have p = 0 and no error."""
    x = np.asarray(x, np.float64)
    u = unit_roundoff(dtype)
    peak = np.max(x, axis=-1, keepdims=True)
    with np.errstate(invalid="ignore", over="ignore"):
        shifted = x - peak
        weights = np.exp(shifted)
        p = weights / weights.sum(axis=-1, keepdims=True)
    live = np.isfinite(shifted)
    # x_j - max rounds (u |x_j - max|, amplified 1:1 by exp), then exp's own ulps.
    exp_rel = np.where(live, u * np.abs(np.where(live, shifted, 0.0)) + exp_ulps * 2 * u, 0.0)
    n = x.shape[-1]
    sum_rel = gamma(n, dtype) + np.sum(np.where(live, p, 0.0) * exp_rel, axis=-1, keepdims=True)
    return p, exp_rel, sum_rel


def softmax_bound(x, evaluations: int = 2, exp_ulps: float = LIBM_ULPS, dtype=np.float32):
    """softmax over the last axis: exp(x_j - m) / sum. Per evaluation y_j's relative error is
    its exp's (rounded shift + ulps), the sum's (gamma(n) + the p-weighted exp errors) and the
    division's u; plus the smallest normal number for results that underflow."""
    p, exp_rel, sum_rel = _softmax_terms(x, exp_ulps, dtype)
    rel = exp_rel + sum_rel + unit_roundoff(dtype)
    return evaluations * (np.nan_to_num(p) * rel + float(np.finfo(dtype).tiny))


def log_softmax_bound(x, want, evaluations: int = 2, exp_ulps: float = LIBM_ULPS,
                      log_ulps: float = LIBM_ULPS):
    """(x_j - m) - log(sum): the shift's rounding, log(sum)'s error (the sum's relative error
    becomes absolute, plus log's ulps of |log sum|) and the final subtraction's u |y_j|."""
    x = np.asarray(x, np.float64)
    u = unit_roundoff()
    _, _, sum_rel = _softmax_terms(x, exp_ulps)
    with np.errstate(invalid="ignore"):
        shifted = x - np.max(x, axis=-1, keepdims=True)
        log_sum = np.log(np.sum(np.exp(shifted), axis=-1, keepdims=True))
    shift_error = u * np.abs(np.nan_to_num(shifted, neginf=0.0))
    per = shift_error + sum_rel + log_ulps * F32_EPS * np.abs(log_sum) + u * _abs64(want)
    return evaluations * np.nan_to_num(per, posinf=0.0)


def layer_norm_bound(x, weight, bias, eps, want, evaluations: int = 2):
    """(x - mean) / sqrt(var + eps) * w + b over the last axis, per evaluation:
    - the mean of n terms is off by dmean <= gamma(n) mean|x|, which shifts every centred value;
    - var (n squares of centred values and their sum, /n) is relatively off by gamma(n + 3) (the
      mean's error cancels to first order: the centred values sum to 0), sqrt halves that, and
      + eps, sqrt and the reciprocal add gamma(3);
    - the centred value, the scaling and the weight round three times, the bias add u |y|."""
    x = np.asarray(x, np.float64)
    n = x.shape[-1]
    mean = x.mean(axis=-1, keepdims=True)
    centered = x - mean
    var = (centered * centered).mean(axis=-1, keepdims=True)
    sigma = np.sqrt(var + eps)
    mean_error = gamma(n) * np.abs(x).mean(axis=-1, keepdims=True)
    sigma_rel = gamma(n + 3) / 2 * var / (var + eps) + gamma(3)
    w = 1.0 if weight is None else _abs64(weight)
    per = w / sigma * (mean_error + np.abs(centered) * (sigma_rel + gamma(3)))
    per = per + unit_roundoff() * _abs64(want)
    return evaluations * per


def rms_norm_bound(x, eps, want, evaluations: int = 2):
    """x / sqrt(mean(x^2) + eps) * w: mean(x^2) relatively off by gamma(n + 1) (n positive
    terms), halved by sqrt, + eps, sqrt and the reciprocal gamma(3), two products gamma(2)."""
    x = np.asarray(x, np.float64)
    n = x.shape[-1]
    mean_sq = (x * x).mean(axis=-1, keepdims=True)
    rel = gamma(n + 1) / 2 * mean_sq / (mean_sq + eps) + gamma(3) + gamma(2)
    return evaluations * (rel * _abs64(want) + F32_TINY)


def attention_bound(q, k, v, mask, scale, evaluations: int = 2, exp_ulps: float = LIBM_ULPS):
    """softmax(q k^T * scale + mask) v (numpy broadcasting over the leading dims), per
    evaluation: each score s_j is off by ds_j = gamma(d + 2) scale |q|.|k_j| (the dot, the scale
    applied before or after, the mask add) + u |s_j|; a softmax weight p_j then relatively by
    ds_j + its exp's error + the sum's (as softmax_bound, with the ds in the sum); the output
    sums tk products and divides once (gamma(tk + 1) sum p_j |v_j|). Weights below
    NEGLIGIBLE_WEIGHT may be dropped outright."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    u = unit_roundoff()
    d, tk = q.shape[-1], k.shape[-2]
    k_t = np.swapaxes(k, -1, -2)
    scores = np.matmul(q, k_t) * scale
    if mask is not None:
        scores = scores + np.asarray(mask, np.float64)
    live = np.isfinite(scores)
    score_error = gamma(d + 2) * scale * np.matmul(np.abs(q), np.abs(k_t)) \
        + u * np.abs(np.where(live, scores, 0.0))
    p, exp_rel, _ = _softmax_terms(scores, exp_ulps)
    p = np.nan_to_num(p)
    weight_rel = np.where(live, score_error, 0.0) + exp_rel
    sum_rel = gamma(tk) + np.sum(p * weight_rel, axis=-1, keepdims=True)
    weight_error = p * (weight_rel + sum_rel + u)
    with np.errstate(invalid="ignore"):
        shifted = scores - scores.max(axis=-1, keepdims=True)
    dropped = np.where(live & (shifted < math.log(NEGLIGIBLE_WEIGHT)), p, 0.0)
    abs_v = np.abs(v)
    per = np.matmul(weight_error + dropped, abs_v) + gamma(tk + 1) * np.matmul(p, abs_v)
    return evaluations * per
