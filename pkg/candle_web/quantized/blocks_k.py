"""The k-quants: 256-element super-blocks Q2_K, Q3_K, Q4_K, Q5_K, Q6_K and Q8_K.

As in :mod:`blocks_legacy`, ``blocks`` is ``(n_blocks, type_size)`` uint8 and the float side
``(n_blocks, 256)`` float32. Byte layouts (offsets within one block) follow ggml-common.h:

- Q2_K (84):  scales[16] (4-bit scale | 4-bit min << 4), qs[64] (2-bit), d f16, dmin f16
- Q3_K (110): hmask[32] (3rd bit), qs[64] (low 2 bits), scales[12] (16 x 6-bit), d f16
- Q4_K (144): d f16, dmin f16, scales[12] (8 x 6-bit scale + 8 x 6-bit min), qs[128]
- Q5_K (176): d f16, dmin f16, scales[12], qh[32] (5th bit), qs[128]
- Q6_K (210): ql[128] (low 4 bits), qh[64] (high 2 bits), scales[16] (i8), d f16
- Q8_K (292): d f32, qs[256] (i8), bsums[16] (i16 sums of 16 quants, for dot products)

The low-bit quants are interleaved: in Q2_K/Q3_K/Q6_K a byte ``l`` of each 32-byte group holds
elements ``l, l+32, l+64, l+96`` of a 128-element half at shifts 0, 2, 4, 6; in Q4_K/Q5_K the two
nibbles of byte ``l`` of 64-element chunk ``c`` are elements ``64c + l`` and ``64c + 32 + l``.

Dequantization multiplies in the same order as ggml (``(d * scale) * q - dmin * min``), so the
results are bit-identical to llama.cpp's and to ``gguf.quants``.

The quantizers (Q4_K, Q6_K, Q8_K) port ggml's reference C functions (``quantize_row_*_ref``,
without an importance matrix) to whole-tensor numpy: same search grids, same f32 operations in
the same order, sums accumulated left to right. During development their bytes were compared
with the C code compiled locally: identical on every block tried (gaussian, heavy-tailed,
positive, sparse, tiny, constant and real Gemma-3 weights).
"""

from __future__ import annotations

import numpy as np

from ._bits import f16_bytes, f16_field, f32_field, field, nearest_int, sequential_sum

QK_K = 256

# Offsets of the fields inside one block.
Q2K_SCALES, Q2K_QS, Q2K_D, Q2K_DMIN = 0, 16, 80, 82
Q3K_HMASK, Q3K_QS, Q3K_SCALES, Q3K_D = 0, 32, 96, 108
Q4K_D, Q4K_DMIN, Q4K_SCALES, Q4K_QS = 0, 2, 4, 16
Q5K_D, Q5K_DMIN, Q5K_SCALES, Q5K_QH, Q5K_QS = 0, 2, 4, 16, 48
Q6K_QL, Q6K_QH, Q6K_SCALES, Q6K_D = 0, 128, 192, 208
Q8K_D, Q8K_QS, Q8K_BSUMS = 0, 4, 260

_TWO_BIT_SHIFTS = np.array([0, 2, 4, 6], dtype=np.uint8)
_NIBBLE_SHIFTS = np.array([0, 4], dtype=np.uint8)
_BIT_SHIFTS = np.arange(8, dtype=np.uint8)

# Search settings of ggml's reference quantizers (quantize_row_q4_K_ref / make_qkx2_quants and
# quantize_row_q6_K_ref / make_qx_quants); keeping them makes our output match llama.cpp's.
Q4K_SEARCH_RMIN, Q4K_SEARCH_RDELTA, Q4K_SEARCH_STEPS = -1.0, 0.1, 20
Q6K_SEARCH_STEPS = 9  # trial scales (32 + 0.1 * k) / max for k in -9..9
GROUP_MAX_EPS = 1e-15  # below this a group counts as all zero


# ------------------------------------------------------------------------ 2-bit interleave

def _unpack_two_bit_planes(qs: np.ndarray) -> np.ndarray:
    """(n, 64) bytes -> (n, 256) values 0..3: byte ``32h + l`` holds elements ``128h + 32j + l``
    at bit shift ``2j``."""
    n = qs.shape[0]
    planes = (qs.reshape(n, 2, 1, 32) >> _TWO_BIT_SHIFTS.reshape(1, 1, 4, 1)) & np.uint8(3)
    return planes.reshape(n, QK_K)


def _unpack_bit_planes(bits: np.ndarray, n_planes: int) -> np.ndarray:
    """(n, 32) bytes -> (n, n_planes, 32): plane ``p`` is bit ``p`` of every byte."""
    n = bits.shape[0]
    shifts = _BIT_SHIFTS[:n_planes].reshape(1, n_planes, 1)
    return (bits.reshape(n, 1, 32) >> shifts) & np.uint8(1)


# ------------------------------------------------------------------ 6-bit scales of Q4/Q5_K

def unpack_k4_scales(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The 12 scale bytes of Q4_K/Q5_K -> (scales, mins), each (n, 8) uint8 in 0..63.

    Sub-blocks 0..3 keep their 6 bits in the low bits of bytes 0..3 (scale) and 4..7 (min);
    sub-blocks 4..7 put their low 4 bits in the nibbles of bytes 8..11 and their top 2 bits in
    the spare top bits of bytes 0..3 (scale) and 4..7 (min)."""
    first, second, third = packed[:, 0:4], packed[:, 4:8], packed[:, 8:12]
    low6 = np.uint8(0x3F)
    scales = np.concatenate(
        [first & low6, (third & np.uint8(0x0F)) | ((first >> np.uint8(6)) << np.uint8(4))], axis=1)
    mins = np.concatenate(
        [second & low6, (third >> np.uint8(4)) | ((second >> np.uint8(6)) << np.uint8(4))], axis=1)
    return scales, mins


def pack_k4_scales(scales: np.ndarray, mins: np.ndarray) -> np.ndarray:
    """Inverse of :func:`unpack_k4_scales`: two (n, 8) arrays of 0..63 -> (n, 12) bytes."""
    scales = scales.astype(np.uint8)
    mins = mins.astype(np.uint8)
    top2 = np.uint8(6)
    first = scales[:, :4] | ((scales[:, 4:] >> np.uint8(4)) << top2)
    second = mins[:, :4] | ((mins[:, 4:] >> np.uint8(4)) << top2)
    third = (scales[:, 4:] & np.uint8(0x0F)) | ((mins[:, 4:] & np.uint8(0x0F)) << np.uint8(4))
    return np.concatenate([first, second, third], axis=1)


def _unpack_q3k_scales(packed: np.ndarray) -> np.ndarray:
    """The 12 scale bytes of Q3_K -> (n, 16) signed scales in -32..31.

    Scale ``i`` has its low 4 bits in byte ``i % 8`` (low nibble for i < 8, high nibble after)
    and its top 2 bits in byte ``8 + i % 4`` at shift ``2 * (i // 4)``."""
    n = packed.shape[0]
    low_bytes = packed[:, 0:8]
    low = np.concatenate([low_bytes & np.uint8(0x0F), low_bytes >> np.uint8(4)], axis=1)
    high = (packed[:, 8:12].reshape(n, 1, 4) >> _TWO_BIT_SHIFTS.reshape(1, 4, 1)) & np.uint8(3)
    six_bit = low | (high.reshape(n, 16) << np.uint8(4))
    return six_bit.astype(np.int8) - np.int8(32)


# ------------------------------------------------------------------------------ dequantize

def dequantize_q2_k(blocks: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    packed_scales = field(blocks, Q2K_SCALES, Q2K_QS)
    d = f16_field(blocks, Q2K_D)
    dmin = f16_field(blocks, Q2K_DMIN)
    scale = (d * (packed_scales & np.uint8(0x0F)).astype(np.float32))[:, :, None]
    offset = (dmin * (packed_scales >> np.uint8(4)).astype(np.float32))[:, :, None]
    q = _unpack_two_bit_planes(field(blocks, Q2K_QS, Q2K_D)).reshape(n, 16, 16)
    return (scale * q.astype(np.float32) - offset).reshape(n, QK_K)


def dequantize_q3_k(blocks: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    d = f16_field(blocks, Q3K_D)
    scale = (d * _unpack_q3k_scales(field(blocks, Q3K_SCALES, Q3K_D)).astype(np.float32))
    low = _unpack_two_bit_planes(field(blocks, Q3K_QS, Q3K_SCALES)).astype(np.int8)
    # hmask bit p of byte l belongs to element 32p + l; a *clear* bit means "subtract 4".
    high_bit = _unpack_bit_planes(field(blocks, Q3K_HMASK, Q3K_QS), 8).reshape(n, QK_K)
    q = low - ((high_bit ^ np.uint8(1)).astype(np.int8) << np.int8(2))
    return (scale[:, :, None] * q.reshape(n, 16, 16).astype(np.float32)).reshape(n, QK_K)


def _nibble_sub_blocks(qs: np.ndarray) -> np.ndarray:
    """(n, 128) bytes -> (n, 8, 32) values 0..15: chunk c's low nibbles are sub-block 2c,
    its high nibbles sub-block 2c + 1."""
    n = qs.shape[0]
    nibbles = (qs.reshape(n, 4, 1, 32) >> _NIBBLE_SHIFTS.reshape(1, 1, 2, 1)) & np.uint8(0x0F)
    return nibbles.reshape(n, 8, 32)


def dequantize_q4_k(blocks: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    d = f16_field(blocks, Q4K_D)
    dmin = f16_field(blocks, Q4K_DMIN)
    sc, mn = unpack_k4_scales(field(blocks, Q4K_SCALES, Q4K_QS))
    scale = (d * sc.astype(np.float32))[:, :, None]
    offset = (dmin * mn.astype(np.float32))[:, :, None]
    q = _nibble_sub_blocks(field(blocks, Q4K_QS, Q4K_QS + 128)).astype(np.float32)
    return (scale * q - offset).reshape(n, QK_K)


def dequantize_q5_k(blocks: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    d = f16_field(blocks, Q5K_D)
    dmin = f16_field(blocks, Q5K_DMIN)
    sc, mn = unpack_k4_scales(field(blocks, Q5K_SCALES, Q5K_QH))
    scale = (d * sc.astype(np.float32))[:, :, None]
    offset = (dmin * mn.astype(np.float32))[:, :, None]
    low = _nibble_sub_blocks(field(blocks, Q5K_QS, Q5K_QS + 128))
    high = _unpack_bit_planes(field(blocks, Q5K_QH, Q5K_QS), 8)  # bit s of qh[l] -> sub-block s
    q = (low | (high << np.uint8(4))).astype(np.float32)
    return (scale * q - offset).reshape(n, QK_K)


def dequantize_q6_k(blocks: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    d = f16_field(blocks, Q6K_D)
    scale = d * field(blocks, Q6K_SCALES, Q6K_D).view(np.int8).astype(np.float32)
    # Within each 128-element half, element 32j + l takes its low nibble from
    # ql[64h + l + 32 * (j & 1)] at shift 4 * (j >> 1), and its top 2 bits from qh[32h + l]
    # at shift 2j.
    ql = field(blocks, Q6K_QL, Q6K_QH).reshape(n, 2, 1, 2, 32)
    low = (ql >> _NIBBLE_SHIFTS.reshape(1, 1, 2, 1, 1)) & np.uint8(0x0F)
    qh = field(blocks, Q6K_QH, Q6K_SCALES).reshape(n, 2, 1, 32)
    high = (qh >> _TWO_BIT_SHIFTS.reshape(1, 1, 4, 1)) & np.uint8(3)
    q = (low.reshape(n, 2, 4, 32) | (high << np.uint8(4))).astype(np.int8) - np.int8(32)
    return (scale[:, :, None] * q.reshape(n, 16, 16).astype(np.float32)).reshape(n, QK_K)


def dequantize_q8_k(blocks: np.ndarray) -> np.ndarray:
    d = f32_field(blocks, Q8K_D)
    return d * field(blocks, Q8K_QS, Q8K_BSUMS).view(np.int8).astype(np.float32)


# -------------------------------------------------------------------------------- quantize

def quantize_q8_k(x: np.ndarray) -> np.ndarray:
    """As quantize_row_q8_K_ref: the value of largest magnitude maps to -127, d = 1/iscale in
    f32, so every |error| <= d/2 (no clipping happens: |iscale * x| <= 127)."""
    n = x.shape[0]
    magnitude = np.abs(x)
    index = magnitude.argmax(axis=1)[:, None]
    signed_max = np.take_along_axis(x, index, axis=1)
    all_zero = np.take_along_axis(magnitude, index, axis=1) == 0
    safe_max = np.where(all_zero, np.float32(1), signed_max)
    inv_scale = np.float32(-127) / safe_max
    q = np.minimum(nearest_int(inv_scale * x), np.float32(127)).astype(np.int8)
    q[all_zero[:, 0]] = 0
    d = np.where(all_zero, np.float32(0), np.float32(1) / inv_scale).astype("<f4")
    bsums = q.reshape(n, 16, 16).sum(axis=2).astype("<i2")  # |sum| <= 16 * 127 fits i16
    return np.concatenate([d.view(np.uint8), q.view(np.uint8), bsums.view(np.uint8)], axis=1)


def _fit_affine_levels(x: np.ndarray, weights: np.ndarray, top: int, rmin: float, rdelta: float,
                       steps: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ggml's make_qkx2_quants for many groups at once: find (scale, offset) with
    x ~ scale * L - offset, L in 0..top, minimising the weighted squared error.

    Rows of ``x`` are groups. Starts from the min/max grid, then tries ``steps + 1`` slightly
    different grid densities, refitting scale and minimum by weighted least squares for each
    level assignment and keeping the best. As in ggml, each trial grid is anchored at the best
    minimum found so far (the search is path dependent; matching it keeps our bytes equal to
    llama.cpp's). Returns (scale, offset), shape (groups, 1), and the levels; offset >= 0
    (the fitted minimum is never above zero: offsets are subtracted)."""
    minimum = np.minimum(x.min(axis=1, keepdims=True), np.float32(0))
    maximum = x.max(axis=1, keepdims=True)
    flat = maximum == minimum
    sum_w = sequential_sum(weights)
    sum_x = sequential_sum(weights * x)

    def span():
        width = maximum - minimum
        return np.where(width > 0, width, np.float32(1))

    inv = np.float32(top) / span()
    scale = np.float32(1) / inv
    levels = np.clip(nearest_int(inv * (x - minimum)), 0, top)
    best_error = sequential_sum(weights * np.square(scale * levels + minimum - x))

    for step in range(steps + 1):
        density = np.float32(rmin) + np.float32(rdelta) * np.float32(step) + np.float32(top)
        trial = np.clip(nearest_int(density / span() * (x - minimum)), 0, top)
        sum_l = sequential_sum(weights * trial)
        sum_l2 = sequential_sum(weights * trial * trial)
        sum_xl = sequential_sum(weights * trial * x)
        det = sum_w * sum_l2 - sum_l * sum_l
        usable = det > 0
        safe_det = np.where(usable, det, np.float32(1))
        trial_scale = (sum_w * sum_xl - sum_x * sum_l) / safe_det
        trial_min = (sum_l2 * sum_x - sum_l * sum_xl) / safe_det
        # A positive minimum is not representable (offsets subtract): refit the scale alone.
        positive = trial_min > 0
        safe_l2 = np.where(sum_l2 > 0, sum_l2, np.float32(1))
        trial_scale = np.where(positive, sum_xl / safe_l2, trial_scale)
        trial_min = np.where(positive, np.float32(0), trial_min)
        error = sequential_sum(weights * np.square(trial_scale * trial + trial_min - x))
        better = usable & (error < best_error) & ~flat
        best_error = np.where(better, error, best_error)
        scale = np.where(better, trial_scale, scale)
        minimum = np.where(better, trial_min, minimum)
        levels = np.where(better, trial, levels)

    scale = np.where(flat, np.float32(0), scale).astype(np.float32)
    offset = (-minimum).astype(np.float32)
    levels = np.where(flat, 0, levels).astype(np.uint8)
    return scale, offset, levels


def _requantize_affine(x: np.ndarray, scale: np.ndarray, offset: np.ndarray, top: int,
                       fitted_levels: np.ndarray) -> np.ndarray:
    """Levels 0..top of x for the *stored* (rounded) scale and offset: the nearest level, as the
    final pass of the reference quantizers. Groups whose stored scale is 0 keep the levels of the
    fit (they all decode to -offset anyway), as ggml does."""
    usable = scale != 0
    safe = np.where(usable, scale, np.float32(1))
    levels = np.clip(nearest_int((x + offset) / safe), 0, top)
    return np.where(usable, levels, fitted_levels).astype(np.uint8)


def quantize_q4_k(x: np.ndarray) -> np.ndarray:
    """Reference-style Q4_K (quantize_row_q4_K_ref without an importance matrix): per 32-element
    sub-block an affine fit x ~ d_s * q - m_s (q in 0..15) with weights ``rms + |x|``; the 8
    scales and 8 mins are coded with 6 bits against f16 super-scales; finally every element
    takes the nearest level of the stored scales."""
    n = x.shape[0]
    groups = x.reshape(n * 8, 32)
    rms = np.sqrt(sequential_sum(np.square(groups)) / np.float32(32))
    weights = rms + np.abs(groups)
    scales, mins, fitted = _fit_affine_levels(groups, weights, 15, Q4K_SEARCH_RMIN,
                                              Q4K_SEARCH_RDELTA, Q4K_SEARCH_STEPS)
    scales = scales.reshape(n, 8)
    mins = mins.reshape(n, 8)

    # Both start at 0 in the reference loop, so a block of negative scales codes d = 0.
    max_scale = np.maximum(scales.max(axis=1, keepdims=True), np.float32(0))
    max_min = np.maximum(mins.max(axis=1, keepdims=True), np.float32(0))
    inv_scale = np.where(max_scale > 0, np.float32(63) / np.where(max_scale > 0, max_scale, 1),
                         np.float32(0)).astype(np.float32)
    inv_min = np.where(max_min > 0, np.float32(63) / np.where(max_min > 0, max_min, 1),
                       np.float32(0)).astype(np.float32)
    six_bit_scales = np.clip(nearest_int(inv_scale * scales), 0, 63).astype(np.uint8)
    six_bit_mins = np.clip(nearest_int(inv_min * mins), 0, 63).astype(np.uint8)
    d_bytes = f16_bytes(max_scale / np.float32(63))
    dmin_bytes = f16_bytes(max_min / np.float32(63))

    d = d_bytes.view("<f2").astype(np.float32)
    dmin = dmin_bytes.view("<f2").astype(np.float32)
    stored_scale = (d * six_bit_scales.astype(np.float32)).reshape(n * 8, 1)
    stored_offset = (dmin * six_bit_mins.astype(np.float32)).reshape(n * 8, 1)
    levels = _requantize_affine(groups, stored_scale, stored_offset, 15, fitted)
    levels = levels.reshape(n, 4, 2, 32)
    qs = levels[:, :, 0, :] | (levels[:, :, 1, :] << np.uint8(4))
    return np.concatenate([d_bytes, dmin_bytes, pack_k4_scales(six_bit_scales, six_bit_mins),
                           qs.reshape(n, 128)], axis=1)


def _fit_symmetric_levels(x: np.ndarray, top: int, steps: int) -> tuple[np.ndarray, np.ndarray]:
    """ggml's make_qx_quants with rmse_type 1 (weights x**2) for many groups at once: a scale with
    x ~ scale * l, l in -top..top-1, chosen among 2 * steps + 1 grid densities by weighted least
    squares. Returns (scale (groups, 1), levels l + top as uint8)."""
    signed_max = np.take_along_axis(x, np.abs(x).argmax(axis=1)[:, None], axis=1)
    all_zero = np.abs(signed_max) < GROUP_MAX_EPS
    safe_max = np.where(all_zero, np.float32(1), signed_max)
    weights = x * x

    def assign(inv):
        return np.clip(nearest_int(inv * x), -top, top - 1)

    levels = assign(np.float32(-top) / safe_max)
    sum_lx = sequential_sum(weights * x * levels)
    sum_l2 = sequential_sum(weights * levels * levels)
    scale = np.where(sum_l2 != 0, sum_lx / np.where(sum_l2 != 0, sum_l2, 1), np.float32(0))
    best = scale * sum_lx
    for k in range(-steps, steps + 1):
        if k == 0:
            continue
        inv = -(np.float32(top) + np.float32(0.1) * np.float32(k)) / safe_max
        trial = assign(inv)
        trial_lx = sequential_sum(weights * x * trial)
        trial_l2 = sequential_sum(weights * trial * trial)
        # sumlx**2 / suml2 is the error reduction of the least-squares scale: bigger is better.
        better = (trial_l2 > 0) & (trial_lx * trial_lx > best * trial_l2)
        trial_scale = trial_lx / np.where(trial_l2 > 0, trial_l2, 1)
        levels = np.where(better, trial, levels)
        scale = np.where(better, trial_scale, scale)
        best = np.where(better, trial_scale * trial_lx, best)
    scale = np.where(all_zero, np.float32(0), scale).astype(np.float32)
    levels = np.where(all_zero, 0, levels + top).astype(np.uint8)
    return scale, levels


def quantize_q6_k(x: np.ndarray) -> np.ndarray:
    """Reference-style Q6_K (quantize_row_q6_K_ref): per 16-element sub-block a symmetric scale
    (q in -32..31), the 16 scales coded as int8 against one f16 super-scale (the largest maps to
    -128), then every element takes the nearest level of its stored scale."""
    n = x.shape[0]
    groups = x.reshape(n * 16, 16)
    scales, levels = _fit_symmetric_levels(groups, 32, Q6K_SEARCH_STEPS)
    scales = scales.reshape(n, 16)
    levels = levels.reshape(n, 16, 16)

    signed_max_scale = np.take_along_axis(scales, np.abs(scales).argmax(axis=1)[:, None], axis=1)
    zero_block = np.abs(signed_max_scale) < GROUP_MAX_EPS
    inv = np.float32(-128) / np.where(zero_block, np.float32(1), signed_max_scale)
    int8_scales = np.minimum(nearest_int(inv * scales), np.float32(127)).astype(np.int8)
    d_bytes = f16_bytes(np.where(zero_block, np.float32(0), np.float32(1) / inv))
    int8_scales[zero_block[:, 0]] = 0

    d = d_bytes.view("<f2").astype(np.float32)
    stored_scale = (d * int8_scales.astype(np.float32))[:, :, None]
    usable = stored_scale != 0
    requantized = np.clip(nearest_int(x.reshape(n, 16, 16) / np.where(usable, stored_scale, 1)),
                          -32, 31) + 32
    # Where the stored scale is 0 the search's levels stay (the values decode to 0 anyway).
    levels = np.where(usable, requantized, levels).astype(np.uint8)
    levels[zero_block[:, 0]] = 0

    # Pack each 128-element half: elements l, l+32, l+64, l+96 share ql/qh bytes.
    halves = levels.reshape(n, 2, 4, 32)
    q1, q2, q3, q4 = (halves[:, :, j, :] for j in range(4))
    nib = np.uint8(0x0F)
    ql = np.concatenate([(q1 & nib) | ((q3 & nib) << np.uint8(4)),
                         (q2 & nib) | ((q4 & nib) << np.uint8(4))], axis=2)
    qh = ((q1 >> np.uint8(4)) | ((q2 >> np.uint8(4)) << np.uint8(2))
          | ((q3 >> np.uint8(4)) << np.uint8(4)) | ((q4 >> np.uint8(4)) << np.uint8(6)))
    return np.concatenate([ql.reshape(n, 128), qh.reshape(n, 64), int8_scales.view(np.uint8),
                           d_bytes], axis=1)
