"""Integer arithmetic for quantized products: int8 activations times int8 weight levels, with
exact integer dot products and one fixed float epilogue. This module is the reference that
defines every bit; the numba kernels (native: candle_native/numba/kernels/qint8.py) and the
page's C kernels must give the same bytes and the same f32 results.

Activations (`quantize_activation_rows`). Each row of x (f32[B, k], k a multiple of 32) is cut
into blocks of 32 elements. Per block, with amax = max |x_j|:

    d = amax / 127                      (f32 division)
    q_j = rint(x_j * (127 / amax))      (f32 division, f32 product, round half to even; |q| <= 127)

A block whose amax is below 2^-120 (zeros, or values so small that 127 / amax would overflow)
has d = 0 and q = 0; a block holding inf or NaN has d = NaN and q = 0, so its products are NaN
as on the float path. Per element the rounding error is |x_j - d q_j| <= d/2
= amax/254 (plus an ulp or two of amax from forming d and 127/amax). The row also carries
what the products need besides q and d: for every 4 consecutive q their sum times -128 (the
integer correction of the unsigned-weight trick below), and per group of 16 and of 32 elements
`d * sum(q)` (the factor of a weight group's offset).

Weights are the flat layout of quant_unpack (native) / QTensor's block types: per row, int8
levels and per-group f32 scales (and offsets), value = scale * level + offset, groups of 16,
32 or 256 elements (offsets only with groups of 16 or 32).

Products (`int8_rows_product`). For weight row i and activation row b:

    level-dot, per "lane" of 4 consecutive elements:  L = sum(level_j * q_j)   (exact int)
    a 64-element block has 16 lanes; lane l (elements 4l..4l+3 of the block) takes the scale
    s of its 16-element quarter's weight group and d of its 32-element activation block:

        f[l] = f[l] + f32(L) * (s * d)          (f32: product, product, sum; no FMA)

    a last block of 32 elements (k = 64 m + 32) fills lanes 0..7 only. At the row's end the
    16 lanes are folded in a fixed tree (8, 4, then (0 + 2) + (1 + 3)). Weights with offsets
    add, in 16 lanes over the groups g (lane g mod 16, in order of g):

        o[g mod 16] = o[g mod 16] + offset_g * (d * sum(q over g))

    folded the same way; the output is fold(f) + fold(o).

No FMA, so numpy reproduces it exactly; the order is fixed per row, so a row's result is the
same alone, in a batch, or as a prompt's token. Why lanes of 4 and blocks of 64: VNNI's
`vpdpbusd` sums 4 u8 x s8 products into each i32 lane of a 512-bit register; wasm's
`i32x4.dot_i16x8_s` and relaxed `i32x4.relaxed_dot_i8x16_i7x16_add_s` form the same 4-element
lane sums four lanes at a time. The kernels feed VNNI's unsigned operand with level + 128
(the level's byte with its top bit flipped) and start each lane at -128 * sum(q), which gives
the signed level-dot exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..core.errors import ShapeError, UnsupportedError

BLOCK = 32  # activation elements per int8 scale
LANE = 4  # products per integer lane
LANES = 16  # integer lanes per 64-element block
Q_MAX = np.float32(127.0)
TINY_AMAX = np.float32(2.0 ** -120)  # 127 / amax stays finite from here on
UNSIGNED_SHIFT = -128  # the lane start that turns (level + 128) * q sums into level * q sums


@dataclass(frozen=True)
class ActivationRows:
    """Rows of activations as int8 blocks and what the products need beside them."""

    q: np.ndarray  # int8 [B, k]
    scales: np.ndarray  # f32 [B, k / 32]: d per block
    lane_starts: np.ndarray  # int32 [B, k / 4]: -128 * (sum of 4 consecutive q)
    offset_factors16: np.ndarray  # f32 [B, k / 16]: d * (sum of q over each 16 elements)
    offset_factors32: np.ndarray  # f32 [B, k / 32]: d * (sum of q over each 32 elements)

    def offset_factors(self, group: int) -> np.ndarray:
        if group == 16:
            return self.offset_factors16
        if group == 32:
            return self.offset_factors32
        raise UnsupportedError(f"int8 products: offsets over groups of {group} elements "
                               "(only 16 and 32 have offsets)")


def quantize_activation_rows(x: np.ndarray) -> ActivationRows:
    """The int8 blocks of f32 rows x [B, k] (k a multiple of 32), by the rule in the module
    doc."""
    x = np.asarray(x)
    if x.dtype != np.float32 or x.ndim != 2 or x.shape[1] % BLOCK:
        raise ShapeError(f"quantize_activation_rows: expected f32 [rows, k] with k a multiple "
                         f"of {BLOCK}, got {x.dtype} {x.shape}")
    rows, k = x.shape
    blocks = x.reshape(rows, k // BLOCK, BLOCK)
    finite = np.isfinite(blocks).all(axis=2)
    amax = np.where(finite, np.abs(np.where(np.isfinite(blocks), blocks, 0)).max(axis=2),
                    np.float32(0)).astype(np.float32)
    usable = finite & (amax >= TINY_AMAX)
    with np.errstate(divide="ignore", invalid="ignore"):
        inverse = np.where(usable, Q_MAX / np.where(usable, amax, 1), 0).astype(np.float32)
        products = blocks * inverse[:, :, None]
    products = np.where(usable[:, :, None], products, np.float32(0))
    q = np.clip(np.rint(products), -127, 127).astype(np.int8).reshape(rows, k)
    scales = np.where(usable, amax / Q_MAX, np.where(finite, np.float32(0), np.float32(np.nan)))
    scales = scales.astype(np.float32)
    q32 = q.astype(np.int32)
    lane_starts = (UNSIGNED_SHIFT * q32.reshape(rows, k // LANE, LANE).sum(axis=2)).astype(
        np.int32)
    sums16 = q32.reshape(rows, k // 16, 16).sum(axis=2)
    factors16 = (sums16.astype(np.float32) * np.repeat(scales, 2, axis=1)).astype(np.float32)
    sums32 = q32.reshape(rows, k // 32, 32).sum(axis=2)
    factors32 = (sums32.astype(np.float32) * scales).astype(np.float32)
    return ActivationRows(q, scales, lane_starts, factors16, factors32)


def _fold(lanes: np.ndarray) -> np.ndarray:
    """[..., 16] -> [...]: the fixed tree of the module doc."""
    lanes = lanes[..., :8] + lanes[..., 8:]
    lanes = lanes[..., :4] + lanes[..., 4:]
    return (lanes[..., 0] + lanes[..., 2]) + (lanes[..., 1] + lanes[..., 3])


def int8_rows_product(acts: ActivationRows, levels: np.ndarray, scales: np.ndarray,
                      offsets: np.ndarray | None, group: int) -> np.ndarray:
    """f32 [B, n]: every activation row times every weight row, bit for bit as the module doc
    defines it (the kernels' reference; memory O(B n k / 4), meant for tests)."""
    rows, k = acts.q.shape
    n = levels.shape[0]
    if levels.shape[1] != k or levels.dtype != np.int8:
        raise ShapeError(f"int8_rows_product: levels {levels.dtype} {levels.shape} against "
                         f"activations of length {k}")
    if group not in (16, 32, 256) or scales.shape != (n, k // group):
        raise ShapeError(f"int8_rows_product: scales {scales.shape} for groups of {group}")
    lane_dots = np.einsum("nlj,blj->bnl", levels.reshape(n, k // LANE, LANE).astype(np.int64),
                          acts.q.reshape(rows, k // LANE, LANE).astype(np.int64))
    lane_dots = lane_dots.astype(np.float32)  # |sum| < 2^17: exact
    lanes = np.zeros((rows, n, LANES), np.float32)
    for base in range(0, k, 2 * BLOCK):
        width = min(LANES, (k - base) // LANE)  # 8 in a last 32-element block
        lane = np.arange(width)
        weight_scale = scales[:, (base + 16 * (lane // 4)) // group]  # [n, width]
        act_scale = acts.scales[:, base // BLOCK + lane // 8]  # [B, width]
        factor = weight_scale[None, :, :] * act_scale[:, None, :]
        products = lane_dots[:, :, base // LANE: base // LANE + width] * factor
        lanes[:, :, :width] = lanes[:, :, :width] + products
    out = _fold(lanes)
    if offsets is not None:
        factors = acts.offset_factors(group)
        groups = k // group
        offset_lanes = np.zeros((rows, n, LANES), np.float32)
        for g in range(groups):
            offset_lanes[:, :, g % LANES] = (offset_lanes[:, :, g % LANES]
                                             + offsets[None, :, g] * factors[:, None, g])
        out = out + _fold(offset_lanes)
    return out


def activation_error_bound(x: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """[B, n]: a bound on |x W^T - (dequantized x) W^T| from rounding the activations, with W
    the f32 (dequantized) weight: sum_j |W_ij| * amax(block of j) / 254, widened by 2 ulps of
    amax for forming d and 127/amax, and by the f32 epilogue's rounding (k / 16 + 8 sums of
    terms no larger than |W_ij| |x_j| (1 + 1/127))."""
    x = np.asarray(x, np.float64)
    weight = np.asarray(weight, np.float64)
    rows, k = x.shape
    amax = np.abs(x.reshape(rows, k // BLOCK, BLOCK)).max(axis=2)
    half_step = np.repeat(amax, BLOCK, axis=1) * (0.5 / 127.0) * (1 + 4 * 2.0 ** -24)
    rounding = half_step @ np.abs(weight).T
    magnitude = (np.abs(x) + half_step) @ np.abs(weight).T
    terms = k // LANES + 8
    return rounding + magnitude * (2 * terms + 4) * 2.0 ** -24
