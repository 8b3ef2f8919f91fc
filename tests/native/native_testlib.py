"""Error bounds of the native-twin tests that need the native package (the unpacked quantized
layout) or one op's layout (RoPE); the general ones are in tests/tolerances_testlib.py."""

from __future__ import annotations

import numpy as np

from tests.tolerances_testlib import dot_bound, sum_bound

# Roundings per product term of a quantized dot beyond the product and the sum: the group scale
# times a partial sum, the offset times the group's sum of x and its add, and the rounding of
# the dequantized value itself on the reference side (scale * level + offset in f32).
QUANT_EXTRA_ROUNDINGS = 4


def quantized_term_magnitudes(qweight) -> np.ndarray:
    """float64 [n, k]: |scale * level| + |offset| per weight, the magnitudes of the terms the
    native kernels sum (they fold each group's offset through the sum of x, so a weight near 0
    that is a large scaled level plus a large negative offset counts with both). Types the
    native kernels do not unpack are multiplied as dequantized weights: their |value|."""
    from candle_native.quant_unpack import UNPACKABLE, unpack

    if qweight.dtype not in UNPACKABLE:
        return np.abs(qweight.dequantize().astype(np.float64))
    unpacked = unpack(qweight)
    n, k = unpacked.shape
    group = 1 << unpacked.group_shift
    levels = unpacked.levels.reshape(n, k // group, group).astype(np.float64)
    magnitudes = np.abs(unpacked.scales.astype(np.float64)[:, :, None] * levels)
    if unpacked.offsets is not None:
        magnitudes += np.abs(unpacked.offsets.astype(np.float64))[:, :, None]
    return magnitudes.reshape(n, k)


def qmatmul_bound(x, qweight, evaluations: int = 2):
    """x @ W^T for a quantized W, in any summation order and either kernel form (dequantized
    weights times x, or scaled level sums plus offsets times sums of x)."""
    return dot_bound(x, quantized_term_magnitudes(qweight).T, evaluations,
                     extra_roundings=QUANT_EXTRA_ROUNDINGS)


def rope_bound(x, cos, sin, interleaved: bool, evaluations: int = 2):
    """Each rotated value is a * cos -/+ b * sin of its pair (a, b): a sum of two products, so
    gamma(2) (|a| |cos| + |b| |sin|) per evaluation (an FMA only rounds less)."""
    x = np.abs(np.asarray(x, np.float64))
    c, s = np.abs(np.asarray(cos, np.float64)), np.abs(np.asarray(sin, np.float64))
    if interleaved:
        first, second = x[..., 0::2], x[..., 1::2]
    else:
        half = x.shape[-1] // 2
        first, second = x[..., :half], x[..., half:]
    magnitudes = np.empty(np.broadcast_shapes(x.shape, c.shape[:-1] + x.shape[-1:]))
    if interleaved:
        magnitudes[..., 0::2] = first * c + second * s
        magnitudes[..., 1::2] = first * s + second * c
    else:
        magnitudes[..., :half] = first * c + second * s
        magnitudes[..., half:] = second * c + first * s
    return sum_bound(magnitudes, 2, evaluations)
