"""The numpy reference backend: the browser path and the oracle other backends are tested against.

Under Pyodide numpy has no BLAS (0.6-2 GFLOP/s), so f32 matmul goes through
`scipy.linalg.blas.sgemm` when scipy is loaded (5.6 GFLOP/s measured in a worker).
"""

from __future__ import annotations

import math
import sys

import numpy as np

from ..core.dtype import float_to_int_saturating
from .base import Backend

SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
INV_SQRT_2 = 1.0 / math.sqrt(2.0)
GELU_TANH_CUBIC = 0.044715

# Chebyshev fit of erfc (Numerical Recipes' erfcc): fractional error < 1.2e-7 everywhere,
# i.e. at f32 precision. Pure numpy on purpose: results must not depend on scipy's presence.
_ERFC_COEFFS = (-1.26551223, 1.00002368, 0.37409196, 0.09678418, -0.18628806,
                0.27886807, -1.13520398, 1.48851587, -0.82215223, 0.17087277)


# Beyond this |x|, erf(x) is 1.0 in double precision (erfc(6) ~ 2e-17).
ERF_F64_SATURATION = 6.0
# Extra series terms once the terms start halving: 2**-60 is far below double precision.
ERF_F64_TAIL_TERMS = 60


def erf(x: np.ndarray) -> np.ndarray:
    if x.dtype == np.float64:
        return _erf_f64(x)
    return _erf_f32(x)


def _erf_f64(x: np.ndarray) -> np.ndarray:
    """erf to ~1e-15 for f64 tensors (the f32 fit below is only good to ~1e-7).

    Uses erf(z) = 2/sqrt(pi) exp(-z^2) sum_n (2z^2)^n z / (1*3*...*(2n+1)): every term is
    positive, so there is no cancellation; the term ratio 2z^2/(2n+3) drops below 1/2 once
    n > 2z^2, which bounds the number of terms by 2*6^2 + 60.
    """
    z = np.minimum(np.abs(x), ERF_F64_SATURATION)
    z2 = z * z
    finite = z2[np.isfinite(z2)]
    peak = float(finite.max()) if finite.size else 0.0
    term = z.copy()
    total = z.copy()
    for n in range(1, int(2.0 * peak) + ERF_F64_TAIL_TERMS):
        term *= 2.0 * z2 / (2 * n + 1)
        total += term
    result = (2.0 / math.sqrt(math.pi)) * np.exp(-z2) * total
    return np.copysign(result, x)


def _erf_f32(x: np.ndarray) -> np.ndarray:
    z = np.abs(x)
    t = 1.0 / (1.0 + 0.5 * z)
    poly = np.full_like(t, _ERFC_COEFFS[-1])
    for coeff in reversed(_ERFC_COEFFS[:-1]):
        poly = poly * t + coeff
    erfc = t * np.exp(-z * z + poly)
    return np.where(x >= 0, 1.0 - erfc, erfc - 1.0).astype(x.dtype, copy=False)


def _sigmoid(x):
    # exp(-|x|) never overflows; pick the branch per sign.
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e)).astype(x.dtype, copy=False)


def _round_half_away(x):
    # Candle (Rust f32::round) rounds halves away from zero, unlike numpy's half-to-even.
    # floor(|x| + 0.5) would be wrong twice over: 0.49999997 + 0.5 rounds up to 1.0 in f32,
    # and above 2**23 the sum is not representable (8388609 + 0.5 -> 8388610). Splitting off
    # the fraction is exact: x - trunc(x) never rounds.
    whole = np.trunc(x)
    fraction = x - whole
    away = np.abs(fraction) >= 0.5
    return np.where(away, whole + np.sign(x), whole).astype(x.dtype, copy=False)


def _int_div_toward_zero(a, b):
    # Candle (Rust integer `/`) truncates toward zero; numpy's floor_divide rounds toward
    # -inf, which differs for negative i64 quotients (-7 / 2 is -3, not -4). Division by
    # zero gives 0 (numpy's convention) instead of Rust's panic.
    quotient = np.floor_divide(a, b)
    if a.dtype.kind == "i":
        inexact = (quotient * b != a) & ((a < 0) != (b < 0)) & (b != 0)
        quotient = quotient + inexact.astype(quotient.dtype)
    return quotient


_UNARY = {
    "exp": np.exp,
    "log": np.log,
    "sin": np.sin,
    "cos": np.cos,
    "tanh": np.tanh,
    "abs": np.abs,
    "sqr": np.square,
    "sqrt": np.sqrt,
    "recip": np.reciprocal,
    "neg": np.negative,
    "gelu": lambda x: 0.5 * x * (1.0 + np.tanh(SQRT_2_OVER_PI * (x + GELU_TANH_CUBIC * x * x * x))),
    "gelu_erf": lambda x: 0.5 * x * (1.0 + erf(x * INV_SQRT_2)),
    "erf": erf,
    "relu": lambda x: np.maximum(x, 0),
    "silu": lambda x: x * _sigmoid(x),
    "sigmoid": _sigmoid,
    "floor": np.floor,
    "ceil": np.ceil,
    "round": _round_half_away,
    "sign": np.sign,
}

_BINARY = {
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "div": np.divide,
    "maximum": np.maximum,
    "minimum": np.minimum,
    "pow": np.power,
}

# Ops run without an np.errstate block: entering one costs several microseconds, more than
# the op itself on small tensors (the decode hot path). These cannot divide by zero or take a
# log/sqrt of a negative; at worst add/sub/mul overflow or compute inf - inf, where numpy
# emits a RuntimeWarning and returns the same inf/NaN as the silenced path.
# (round is not here: for x = inf it computes inf - trunc(inf).)
_NO_FP_EXCEPTION_OPS = frozenset(("add", "sub", "mul", "maximum", "minimum", "neg", "abs", "relu",
                                  "sign", "floor", "ceil"))

_COMPARE = {
    "eq": np.equal,
    "ne": np.not_equal,
    "lt": np.less,
    "le": np.less_equal,
    "gt": np.greater,
    "ge": np.greater_equal,
}


def _find_pyodide_sgemm():
    """scipy's BLAS sgemm, but only under Pyodide where numpy's own matmul has no BLAS."""
    if sys.platform != "emscripten":
        return None
    try:
        from scipy.linalg.blas import sgemm
    except ImportError:
        return None
    return sgemm


def _fortran_operand(x):
    """(array, trans) with op(array) == x.T and `array` Fortran-contiguous, copying only when
    x is neither C- nor F-contiguous."""
    if x.flags.c_contiguous:
        return x.T, 0
    if x.flags.f_contiguous:
        return x, 1
    return np.ascontiguousarray(x).T, 0


class NumpyBackend(Backend):
    name = "numpy"
    xp = np

    def __init__(self):
        self._sgemm = _find_pyodide_sgemm()

    def from_numpy(self, arr):
        return arr

    def to_numpy(self, arr):
        return arr

    # -- elementwise --------------------------------------------------------------------
    def unary(self, op, x):
        if op in _NO_FP_EXCEPTION_OPS:
            out = _UNARY[op](x)
        else:
            with np.errstate(all="ignore"):
                out = _UNARY[op](x)
        return np.asarray(out, dtype=x.dtype) if out.dtype != x.dtype else out

    def binary(self, op, a, b):
        if op in _NO_FP_EXCEPTION_OPS:
            return _BINARY[op](a, b)
        with np.errstate(all="ignore"):
            if op == "div" and a.dtype.kind in "iu":
                return _int_div_toward_zero(a, b)
            return _BINARY[op](a, b)

    def compare(self, op, a, b):
        return _COMPARE[op](a, b).view(np.uint8)

    def affine(self, x, mul, add):
        # Always add, even 0: Candle computes x * mul + add, so -0.0 * 1 + 0 is +0.0.
        out = x * np.asarray(mul, dtype=x.dtype)
        out += np.asarray(add, dtype=x.dtype)
        return out

    def powf(self, x, exponent):
        with np.errstate(all="ignore"):
            return np.power(x, np.asarray(exponent, dtype=x.dtype))

    def clamp(self, x, lo, hi):
        return np.clip(x, lo, hi).astype(x.dtype, copy=False)

    def where(self, cond, on_true, on_false):
        return np.where(cond != 0, on_true, on_false)

    def cast(self, x, np_dtype):
        np_dtype = np.dtype(np_dtype)
        if x.dtype.kind == "f" and np_dtype.kind in "iu":
            return float_to_int_saturating(np, x, np_dtype)
        with np.errstate(all="ignore"):
            return x.astype(np_dtype)

    # -- reductions -----------------------------------------------------------------------
    def reduce(self, op, x, axes, keepdims):
        if op == "sum":
            return np.sum(x, axis=axes, keepdims=keepdims, dtype=x.dtype)
        if op == "max":
            return np.max(x, axis=axes, keepdims=keepdims)
        return np.min(x, axis=axes, keepdims=keepdims)

    def arg_reduce(self, op, x, axis, keepdims):
        fn = np.argmax if op == "argmax" else np.argmin
        return fn(x, axis=axis, keepdims=keepdims).astype(np.uint32)

    def cumsum(self, x, axis):
        return np.cumsum(x, axis=axis, dtype=x.dtype)

    # -- matmul and convolutions ----------------------------------------------------------
    def matmul(self, a, b):
        if self._sgemm is not None and a.dtype == np.float32 and b.dtype == np.float32:
            return self._sgemm_matmul(a, b)
        return np.matmul(a, b)

    def _sgemm_matmul(self, a, b):
        if a.ndim == 2 and b.ndim == 2:
            return self._sgemm_2d(a, b)
        batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
        a_full = np.broadcast_to(a, batch + a.shape[-2:]).reshape(-1, *a.shape[-2:])
        b_full = np.broadcast_to(b, batch + b.shape[-2:]).reshape(-1, *b.shape[-2:])
        out = np.empty((a_full.shape[0], a.shape[-2], b.shape[-1]), dtype=np.float32)
        for i in range(a_full.shape[0]):
            out[i] = self._sgemm_2d(a_full[i], b_full[i])
        return out.reshape(batch + out.shape[-2:])

    def _sgemm_2d(self, a, b):
        # Fortran BLAS computes (a @ b).T = b.T @ a.T column-major, which is a @ b in C order.
        # Each operand goes in with the layout it already has and BLAS's trans flag does the
        # transposing: copying a transposed weight (every Linear's w.t(), the tied vocab
        # projection) cost ~110 MB of strided copies per Whisper token in the browser.
        bt, trans_b = _fortran_operand(b)
        at, trans_a = _fortran_operand(a)
        return self._sgemm(1.0, bt, at, trans_a=trans_b, trans_b=trans_a).T

    def conv1d(self, x, w, stride, padding, dilation, groups):
        # im2col: a strided view [b, c_in, l_out, k] turned into one matmul per group.
        batch, c_in, _ = x.shape
        c_out, c_in_group, kernel = w.shape
        if padding:
            x = np.pad(x, ((0, 0), (0, 0), (padding, padding)))
        length = x.shape[2]
        l_out = (length - dilation * (kernel - 1) - 1) // stride + 1
        s_b, s_c, s_l = x.strides
        cols = np.lib.stride_tricks.as_strided(
            x, shape=(batch, c_in, l_out, kernel),
            strides=(s_b, s_c, s_l * stride, s_l * dilation), writeable=False)
        cols = cols.reshape(batch, groups, c_in_group, l_out, kernel)
        cols = cols.transpose(0, 1, 3, 2, 4).reshape(batch, groups, l_out, c_in_group * kernel)
        w_groups = w.reshape(groups, c_out // groups, c_in_group * kernel)
        out = self.matmul(cols, w_groups.transpose(0, 2, 1)[None])  # [b, g, l_out, c_out_g]
        return np.ascontiguousarray(out.transpose(0, 1, 3, 2).reshape(batch, c_out, l_out))

    def conv_transpose1d(self, x, w, stride, padding, output_padding, dilation, groups):
        batch, c_in, length = x.shape
        _, c_out_group, kernel = w.shape
        full_len = (length - 1) * stride + dilation * (kernel - 1) + 1 + output_padding
        out = np.zeros((batch, groups * c_out_group, full_len), dtype=x.dtype)
        c_in_group = c_in // groups
        for g in range(groups):
            xg = x[:, g * c_in_group:(g + 1) * c_in_group]  # [b, cig, l]
            wg = w[g * c_in_group:(g + 1) * c_in_group]  # [cig, cog, k]
            # contributions[b, cog, k, l] = sum_c x[b, c, l] * w[c, cog, k]
            contributions = np.einsum("bcl,cok->bokl", xg, wg)
            for k in range(kernel):
                start = k * dilation
                stop = start + (length - 1) * stride + 1
                out[:, g * c_out_group:(g + 1) * c_out_group, start:stop:stride] += contributions[:, :, k]
        out_len = full_len - 2 * padding
        return np.ascontiguousarray(out[:, :, padding:padding + out_len])

    def conv2d(self, x, w, stride, padding, dilation, groups):
        batch, c_in, _, _ = x.shape
        c_out, c_in_group, k_h, k_w = w.shape
        if padding:
            x = np.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
        height, width = x.shape[2:]
        h_out = (height - dilation * (k_h - 1) - 1) // stride + 1
        w_out = (width - dilation * (k_w - 1) - 1) // stride + 1
        if groups == c_in == c_out:
            # Depthwise (one filter per channel, as in MobileNet and face-api's nets): k_h * k_w
            # multiply-adds over the whole map, where im2col would make one tiny GEMM per
            # channel (2-3x slower for 3x3 filters on 32-256 channels).
            out = np.zeros((batch, c_out, h_out, w_out), dtype=np.result_type(x, w))
            product = np.empty_like(out)  # one buffer for every tap (the page's allocator is slow)
            for i in range(k_h):
                for j in range(k_w):
                    top, left = i * dilation, j * dilation
                    tap = x[:, :, top:top + stride * (h_out - 1) + 1:stride,
                            left:left + stride * (w_out - 1) + 1:stride]
                    np.multiply(tap, w[None, :, 0, i, j, None, None], out=product)
                    out += product
            return out
        if k_h == k_w == 1 and stride == 1 and groups == 1:
            # Pointwise: one GEMM on the map as it lies, [c_out, c_in] @ [c_in, h * w].
            out = self.matmul(w.reshape(1, c_out, c_in), x.reshape(batch, c_in, height * width))
            return out.reshape(batch, c_out, h_out, w_out)
        # im2col with the taps as rows, [c_in * k_h * k_w, h_out * w_out], filled by one strided
        # copy per tap, so that the GEMM [c_out, K] @ [K, hw] lands in NCHW as it is: the
        # 6-D strided gather and the transposed copy of the result it replaces took 1.5-7x the
        # time (face-api's 3x3 convolutions, numpy and wasm backends; the sums are the same).
        cols = np.empty((batch, c_in, k_h, k_w, h_out, w_out), dtype=x.dtype)
        for i in range(k_h):
            for j in range(k_w):
                top, left = i * dilation, j * dilation
                cols[:, :, i, j] = x[:, :, top:top + stride * (h_out - 1) + 1:stride,
                                     left:left + stride * (w_out - 1) + 1:stride]
        cols = cols.reshape(batch, groups, c_in_group * k_h * k_w, h_out * w_out)
        w_groups = w.reshape(groups, c_out // groups, c_in_group * k_h * k_w)
        out = self.matmul(w_groups[None], cols)  # [b, g, c_out_g, hw]
        return out.reshape(batch, c_out, h_out, w_out)

    def resample_lines(self, x, first, band):
        outer, present, inner = x.shape
        out_lines, taps = band.shape
        out = np.zeros((outer, out_lines, inner), dtype=np.float32)
        # Output lines whose filter starts past the present lines see only padding: they stay
        # zero and are not computed (a landscape photo's square input is a third padding).
        live = int(np.searchsorted(first, present))
        live_out = out[:, :live]
        product = np.empty_like(live_out)  # one buffer for every tap (the page's allocator)
        for tap in range(taps if live else 0):
            source = first[:live] + tap
            tap_weights = np.where(source < present, band[:live, tap], np.float32(0))
            target = live_out if tap == 0 else product
            np.multiply(np.take(x, np.minimum(source, present - 1), axis=1),
                        tap_weights.reshape(1, live, 1), out=target)
            if tap:
                live_out += product
        return out

    # -- indexing -------------------------------------------------------------------------
    def index_select(self, x, ids, axis):
        return np.take(x, ids.astype(np.intp, copy=False), axis=axis)

    def gather(self, x, ids, axis):
        return np.take_along_axis(x, ids.astype(np.intp, copy=False), axis=axis)

    def scatter_add(self, x, ids, src, axis):
        out = x.copy()
        index = list(np.indices(ids.shape, sparse=True))
        index[axis] = ids.astype(np.intp, copy=False)
        np.add.at(out, tuple(index), src)
        return out

    def index_add(self, x, ids, src, axis):
        out = x.copy()
        np.add.at(out, (slice(None),) * axis + (ids.astype(np.intp, copy=False),), src)
        return out

    # -- fused kernels ----------------------------------------------------------------------
    def softmax_last_dim(self, x):
        out = x - np.max(x, axis=-1, keepdims=True)
        np.exp(out, out=out)
        out /= np.sum(out, axis=-1, keepdims=True)
        return out

    def log_softmax_last_dim(self, x):
        shifted = x - np.max(x, axis=-1, keepdims=True)
        return shifted - np.log(np.sum(np.exp(shifted), axis=-1, keepdims=True))

    def layer_norm(self, x, weight, bias, eps):
        mean = np.mean(x, axis=-1, keepdims=True)
        centered = x - mean
        var = np.mean(centered * centered, axis=-1, keepdims=True)
        out = centered / np.sqrt(var + np.asarray(eps, dtype=x.dtype))
        if weight is not None:
            out *= weight
        if bias is not None:
            out += bias
        return out

    def rms_norm(self, x, weight, eps):
        mean_sq = np.mean(x * x, axis=-1, keepdims=True)
        out = x / np.sqrt(mean_sq + np.asarray(eps, dtype=x.dtype))
        if weight is not None:
            out *= weight
        return out

    def rope(self, x, cos, sin):
        half = x.shape[-1] // 2
        x1 = x[..., :half]
        x2 = x[..., half:]
        out = np.empty_like(x)
        out[..., :half] = x1 * cos - x2 * sin
        out[..., half:] = x2 * cos + x1 * sin
        return out

    def rope_i(self, x, cos, sin):
        x_even = x[..., 0::2]
        x_odd = x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = x_even * cos - x_odd * sin
        out[..., 1::2] = x_even * sin + x_odd * cos
        return out

    def silu_mul(self, gate, up):
        return self.unary("silu", gate) * up

    def attention(self, q, k, v, mask, scale):
        scores = self.matmul(q, np.swapaxes(k, -1, -2))
        scores *= np.asarray(scale, dtype=scores.dtype)
        if mask is not None:
            scores += mask
        return self.matmul(self.softmax_last_dim(scores), v)

    def qmatmul(self, x, qweight):
        from ..quantized import qmatmul_ref

        return qmatmul_ref(x, qweight)

    # -- creation / memory ----------------------------------------------------------------
    def zeros(self, shape, np_dtype):
        return np.zeros(shape, dtype=np_dtype)

    def full(self, shape, value, np_dtype):
        return np.full(shape, value, dtype=np_dtype)

    def arange(self, start, end, step, np_dtype):
        return np.arange(start, end, step, dtype=np_dtype)

    def contiguous(self, x):
        # Not np.ascontiguousarray, which turns rank 0 into shape (1,).
        return x if x.flags.c_contiguous else x.copy(order="C")

    def is_contiguous(self, x):
        return x.flags.c_contiguous
