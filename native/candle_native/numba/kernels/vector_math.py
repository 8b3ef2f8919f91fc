"""exp and erf in f32 that LLVM can vectorise, and the kernels built on them.

Why: numba here has no SVML, so `math.exp` / `math.erf` in a loop are scalar libm calls
(measured 80 ns per GELU element on the Whisper encoder's 2.3M-element activations, against
4 ns for numpy's SIMD exp). These versions are plain polynomials, a floor and an integer-to-float
bit cast, which compile to AVX vector code (2-3 ns per element, serial).

Accuracy (checked in tests/native/test_numba_vector_math.py against f64 math):
- exp_f32 on [-87, 0]: relative error < 3e-7 (Cody-Waite reduction, degree-5 polynomial fitted
  here by least squares on [-ln2/2, ln2/2], 2e-10 in f64);
- erf via erf(z)/z = P(z^2) on |z| < 1 (degree 6, 2e-9 in f64) and
  erfc(z) = exp(-z^2) * Q(1/z) on 1 <= z <= 4.5 (degree 9, 4e-8 in f64), erfc = 0 beyond
  (erfc(4.5) = 2e-10); GELU's absolute error stays below 5e-7, the size of an f32 ulp at 4.
Kernels that divide use error_model="numpy": numba's default Python error model inserts a
zero-division check per division, which blocks vectorisation.
"""

import math

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from ._jit import FAST_REDUCTIONS
from .stack_scratch import stack_f32_32

F = np.float32
LOG2E = F(1.4426950408889634)
# ln 2 split so that n * LN2_HI is exact for the n that occur (Cody-Waite).
LN2_HI = F(0.693359375)
LN2_LO = F(-2.12194440e-4)
EXP_MIN_ARG = F(-87.0)  # below, exp is (nearly) subnormal: flushed to 0
# Softmax weights exp(score - peak) below exp(-64) (1.6e-28) are taken as 0 where only the
# weighted sum of values is wanted (attention): against the peak's weight 1 the dropped ones
# total < n * 1.6e-28, ~20 orders below an f32 ulp of the sum even for n in the millions. Kept,
# a weight of 1e-37 times a value below 1e-1 is a subnormal float, which x86 computes in
# microcode: a weighted sum over 750 frames with such weights measured 12x slower. A guard for
# peaked attention (the Whisper encoder on the LibriVox clips has no such weights).
SOFTMAX_NEGLIGIBLE = F(-64.0)
# (exp(r) - 1 - r) / r^2 on |r| <= ln2 / 2, least-squares fit (coefficients of r^0..r^5)
E0, E1, E2, E3, E4, E5 = (F(0.5000000013455023), F(0.1666666671905041), F(0.041666464936633),
                          F(0.008333298462732449), F(0.0013933650379091445),
                          F(0.00019899290416477492))
# erf(z) / z as a polynomial in z^2 on [0, 1]
P0, P1, P2, P3, P4, P5, P6 = (F(1.1283791665933633), F(-0.37612629877297826),
                              F(0.11283625713184739), F(-0.026855398722036794),
                              F(0.0051912166077241586), F(-0.0008034827988504886),
                              F(7.933422441288501e-05))
# erfc(z) * exp(z^2) as a polynomial in 1/z on [1, 4.5]
Q0, Q1, Q2, Q3, Q4, Q5, Q6, Q7, Q8, Q9 = (
    F(9.22209556794031e-05), F(0.5622719055203362), F(0.01674859938311385),
    F(-0.3597705752038614), F(0.187730087417312), F(0.3116423588047234),
    F(-0.6187221290496401), F(0.49544208138744755), F(-0.20252111116081603),
    F(0.034670145359250115))
ERFC_ZERO_FROM = F(4.5)
INV_SQRT_2 = F(1.0 / math.sqrt(2.0))
HALF = F(0.5)
ONE = F(1.0)
ZERO = F(0.0)


def vector_kernel(fn):
    """Serial, cached, vectorisable (numpy error model: no zero-division checks)."""
    return njit(cache=True, fastmath=FAST_REDUCTIONS, nogil=True, error_model="numpy")(fn)


def vector_parallel_kernel(fn):
    return njit(cache=True, fastmath=FAST_REDUCTIONS, nogil=True, error_model="numpy",
                parallel=True)(fn)


@intrinsic
def _f32_from_bits(typingctx, bits):
    """Reinterpret the low 32 bits of an integer as an f32 (a truncation and one LLVM bitcast,
    both vectorisable)."""
    if not isinstance(bits, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        value = args[0]
        if bits.bitwidth > 32:
            value = builder.trunc(value, ir.IntType(32))
        return builder.bitcast(value, ir.FloatType())

    return types.float32(bits), codegen


@vector_kernel
def exp_f32(y):
    """exp(y) for y <= 0 (softmax's shifted scores); -inf and anything below -87 give 0."""
    clamped = max(y, EXP_MIN_ARG)
    n = np.floor(clamped * LOG2E + HALF)  # np.floor keeps f32; math.floor would give int64
    r = clamped - n * LN2_HI - n * LN2_LO
    poly = E0 + r * (E1 + r * (E2 + r * (E3 + r * (E4 + r * E5))))
    scale = _f32_from_bits((np.int32(n) + 127) << 23)
    value = (ONE + r + r * r * poly) * scale
    return value if y >= EXP_MIN_ARG else ZERO


@vector_kernel
def softmax_weight(shifted):
    """exp(shifted) for a shifted score (score - row peak, <= 0), or 0 below SOFTMAX_NEGLIGIBLE."""
    return exp_f32(shifted) if shifted >= SOFTMAX_NEGLIGIBLE else ZERO


@vector_kernel
def gelu_erf_f32(v):
    """0.5 v (1 + erf(v / sqrt 2)), branch-free so that loops over it vectorise."""
    z = abs(v) * INV_SQRT_2
    z2 = z * z
    erf_small = z * (P0 + z2 * (P1 + z2 * (P2 + z2 * (P3 + z2 * (P4 + z2 * (P5 + z2 * P6))))))
    zc = min(max(z, ONE), ERFC_ZERO_FROM)
    u = ONE / zc
    tail = Q0 + u * (Q1 + u * (Q2 + u * (Q3 + u * (Q4 + u * (Q5 + u * (Q6 + u * (
        Q7 + u * (Q8 + u * Q9))))))))
    erfc_big = exp_f32(-(zc * zc)) * tail
    erfc_big = erfc_big if z < ERFC_ZERO_FROM else ZERO
    erfc_abs = ONE - erf_small if z < ONE else erfc_big  # erfc(|z|)
    # v >= 0: v (1 - erfc/2); v < 0: v erfc / 2 (erf is odd)
    return v - HALF * v * erfc_abs if v >= ZERO else HALF * v * erfc_abs


@vector_kernel
def _gelu_span(x, out, start, stop):
    for j in range(start, stop):
        out[j] = gelu_erf_f32(x[j])


@vector_kernel
def gelu_erf_vector_serial(x, out):
    _gelu_span(x, out, 0, x.size)


@vector_kernel
def row_max(values):
    """The largest of `values` (1-D; -inf when empty; NaNs ignored). A running `max` does not
    vectorise (without no-NaN fast-math LLVM keeps the scalar maxss chain, ~4 cycles per
    element); 32 lanes on the stack (registers, see stack_scratch) take 32 elements a pass:
    0.52 against 1.63 ns per element over 128 rows of 1500 scores."""
    lanes = stack_f32_32()
    for lane in range(32):
        lanes[lane] = F(-np.inf)
    n = values.size
    full = n - n % 32
    for j in range(0, full, 32):
        for lane in range(32):
            v = values[j + lane]
            lanes[lane] = v if v > lanes[lane] else lanes[lane]
    peak = F(-np.inf)
    for lane in range(32):
        peak = lanes[lane] if lanes[lane] > peak else peak
    for j in range(full, n):
        peak = values[j] if values[j] > peak else peak
    return peak


@vector_kernel
def exp_shifted_rows(scores, row_sums):
    """In place: each row of `scores` [r, n] becomes exp(row - row max) (softmax_weight: for
    attention, whose value product follows); row_sums[i] gets the row's sum (the softmax
    denominator, applied after the value product). A row that is all -inf (fully masked)
    becomes zeros with sum 0, as the reference's NaN-free masked case."""
    rows, width = scores.shape
    for i in range(rows):
        peak = row_max(scores[i])
        if peak == F(-np.inf):
            peak = ZERO
        total = ZERO
        for j in range(width):
            e = softmax_weight(scores[i, j] - peak)
            scores[i, j] = e
            total += e
        row_sums[i] = total
