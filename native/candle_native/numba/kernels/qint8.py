"""Quantized weight rows times 1..B activation rows in integer arithmetic: the activations
quantized to int8 blocks, integer dot products with the weights' int8 levels, one f32
epilogue; every bit as candle_web.quantized.int8_rows defines it (its module doc has the
arithmetic; tests/native/test_qint8.py compares bytes and results).

A weight is qrows.py's tuple with its levels viewed as uint8: ``(levels u8[n, k] (the int8
levels' bytes), scales f32[n, k/g], offsets f32[n, k/g] or a 1x1 stand-in, use_offsets,
group)``. The view costs nothing and its dtype is what makes decoder_step.project and
batched_step.project_rows pick these kernels (the compute type int8, chosen where the fused
parts build their weights).

Per weight row and 64-element block the integer step is int_lanes.lanes_step_64: one
`vpdpbusd` per activation row on AVX-512 VNNI CPUs (64 multiply-adds), against qrows.py's
convert, scale and 32 f32 multiply-adds per 32 elements. The weight block is loaded and its
top bits flipped once for the four activation rows of a tile (LLVM keeps it in a register).
As in qrows.py each output row is computed alone, in a fixed order, so its bits do not depend
on the batch it is in.
"""

import numpy as np
from numba import prange

from ._jit import exact_inline, exact_kernel, exact_parallel_kernel
from .int_lanes import lanes_step_32, lanes_step_64
from .stack_scratch import stack_f32_16

TINY_AMAX = np.float32(2.0 ** -120)  # int8_rows.TINY_AMAX: smaller blocks count as zeros
ROW_CHUNK = 32  # weight rows per parallel work item (as qrows.ROW_CHUNK)
# Activation rows per pass over the weight: as many as keep their int8 rows, lane starts and
# lane scales (9 bytes per element) within this many bytes, in L2 beside the streaming weight,
# and at least 16. All 128 rows of a prompt chunk at once ran at half the per-row speed of 8
# rows on Qwen2.5's 896x4864 down projection (5.6 MB of activations).
GROUP_BYTES = 1 << 19
MIN_GROUP = 16


@exact_inline
def _row_group(k):
    return max(MIN_GROUP, GROUP_BYTES // (9 * k))


@exact_kernel
def quantize_rows(xs, q, scales, starts, factors16, factors32):
    """The int8 blocks of f32 rows xs [B, k] into the given arrays (int8_rows'
    ActivationRows fields, same shapes), by the rule of int8_rows.quantize_activation_rows."""
    rows, k = xs.shape
    for b in range(rows):
        x = xs[b]
        for block in range(k // 32):
            base = block * 32
            amax = np.float32(0.0)
            finite = True
            for j in range(32):
                v = x[base + j]
                if not np.isfinite(v):
                    finite = False
                elif abs(v) > amax:
                    amax = abs(v)
            if finite and amax >= TINY_AMAX:
                inverse = np.float32(127.0) / amax
                for j in range(32):
                    r = np.rint(x[base + j] * inverse)
                    q[b, base + j] = np.int8(min(max(r, np.float32(-127.0)), np.float32(127.0)))
                scales[b, block] = amax / np.float32(127.0)
            else:
                for j in range(32):
                    q[b, base + j] = 0
                scales[b, block] = np.float32(0.0) if finite else np.float32(np.nan)
        for lane in range(k // 4):
            total = 0
            for j in range(4):
                total += q[b, 4 * lane + j]
            starts[b, lane] = -128 * total
        for g in range(k // 16):
            total = 0
            for j in range(16):
                total += q[b, 16 * g + j]
            factors16[b, g] = np.float32(total) * scales[b, g >> 1]
        for g in range(k // 32):
            total = 0
            for j in range(32):
                total += q[b, 32 * g + j]
            factors32[b, g] = np.float32(total) * scales[b, g]


@exact_inline
def _fold(lanes):
    """The 16 lanes summed in int8_rows' fixed tree."""
    for j in range(8):
        lanes[j] += lanes[j + 8]
    for j in range(4):
        lanes[j] += lanes[j + 4]
    return (lanes[0] + lanes[2]) + (lanes[1] + lanes[3])


@exact_inline
def _shift(group):
    return 4 if group == 16 else (5 if group == 32 else 8)


@exact_inline
def _row_lanes(acc, acts, b, row, scales, shift, k):
    """acc[0:16] = the lanes of one weight row times activation row b (int8_rows' epilogue)."""
    q, _, starts, lane_scales = acts[0], acts[1], acts[2], acts[5]
    for j in range(16):
        acc[j] = 0.0
    full = k // 64 * 64
    for base in range(0, full, 64):
        lanes_step_64(acc, starts[b], base >> 2, lane_scales[b], row, base, q[b],
                      scales[base >> shift], scales[(base + 16) >> shift],
                      scales[(base + 32) >> shift], scales[(base + 48) >> shift])
    if full < k:
        lanes_step_32(acc, starts[b], full >> 2, lane_scales[b], row, full, q[b],
                      scales[full >> shift], scales[(full + 16) >> shift])


@exact_inline
def _offset_total(lanes, offsets, factors):
    """fold(o) of int8_rows: offsets_g * factors_g summed in 16 lanes, g in order."""
    for j in range(16):
        lanes[j] = 0.0
    groups = offsets.size
    whole = groups // 16 * 16
    for g0 in range(0, whole, 16):  # a constant trip count: one vector multiply and add
        for j in range(16):
            lanes[j] += offsets[g0 + j] * factors[g0 + j]
    for j in range(groups - whole):
        lanes[j] += offsets[whole + j] * factors[whole + j]
    return _fold(lanes)


@exact_inline
def _offsets_of(acts, b, group):
    return acts[3][b] if group == 16 else acts[4][b]


@exact_kernel
def _rows_x1(acts, b, weight, outs, start, stop):
    """outs[b, i] for weight rows start..stop-1 and the one activation row b."""
    levels, scales, offsets, use_offsets, group = weight
    shift = _shift(group)
    k = levels.shape[1]
    acc = stack_f32_16()
    spare = stack_f32_16()
    for i in range(start, stop):
        _row_lanes(acc, acts, b, levels[i], scales[i], shift, k)
        total = _fold(acc)
        if use_offsets:
            total += _offset_total(spare, offsets[i], _offsets_of(acts, b, group))
        outs[b, i] = total


@exact_inline
def _zero(a0, a1, a2, a3):
    for j in range(16):
        a0[j] = 0.0
        a1[j] = 0.0
        a2[j] = 0.0
        a3[j] = 0.0


@exact_inline
def _four_rows_64(a0, a1, a2, a3, acts, b, row, base, s0, s1, s2, s3):
    """lanes_step_64 of one weight block for activation rows b..b+3 (LLVM loads the block
    and flips its top bits once for all four)."""
    q, starts, lane_scales = acts[0], acts[2], acts[5]
    lane = base >> 2
    lanes_step_64(a0, starts[b], lane, lane_scales[b], row, base, q[b], s0, s1, s2, s3)
    lanes_step_64(a1, starts[b + 1], lane, lane_scales[b + 1], row, base, q[b + 1], s0, s1, s2, s3)
    lanes_step_64(a2, starts[b + 2], lane, lane_scales[b + 2], row, base, q[b + 2], s0, s1, s2, s3)
    lanes_step_64(a3, starts[b + 3], lane, lane_scales[b + 3], row, base, q[b + 3], s0, s1, s2, s3)


@exact_inline
def _four_rows_32(a0, a1, a2, a3, acts, b, row, base, s0, s1):
    q, starts, lane_scales = acts[0], acts[2], acts[5]
    lane = base >> 2
    lanes_step_32(a0, starts[b], lane, lane_scales[b], row, base, q[b], s0, s1)
    lanes_step_32(a1, starts[b + 1], lane, lane_scales[b + 1], row, base, q[b + 1], s0, s1)
    lanes_step_32(a2, starts[b + 2], lane, lane_scales[b + 2], row, base, q[b + 2], s0, s1)
    lanes_step_32(a3, starts[b + 3], lane, lane_scales[b + 3], row, base, q[b + 3], s0, s1)


@exact_inline
def _four_outputs(a0, a1, a2, a3, spare, acts, b, weight, i, outs):
    """Fold the four rows' lanes (plus their offsets terms) into outs[b..b+3, i]."""
    _, _, offsets, use_offsets, group = weight
    r0, r1, r2, r3 = _fold(a0), _fold(a1), _fold(a2), _fold(a3)
    if use_offsets:
        o = offsets[i]
        r0 += _offset_total(spare, o, _offsets_of(acts, b, group))
        r1 += _offset_total(spare, o, _offsets_of(acts, b + 1, group))
        r2 += _offset_total(spare, o, _offsets_of(acts, b + 2, group))
        r3 += _offset_total(spare, o, _offsets_of(acts, b + 3, group))
    outs[b, i] = r0
    outs[b + 1, i] = r1
    outs[b + 2, i] = r2
    outs[b + 3, i] = r3


@exact_kernel
def _rows_x4(acts, b, weight, outs, start, stop):
    """outs[b..b+3, i] for weight rows start..stop-1: each weight block loaded once for the
    four activation rows."""
    levels, scales = weight[0], weight[1]
    shift = _shift(weight[4])
    k = levels.shape[1]
    full = k // 64 * 64
    a0, a1, a2, a3 = stack_f32_16(), stack_f32_16(), stack_f32_16(), stack_f32_16()
    spare = stack_f32_16()
    for i in range(start, stop):
        row = levels[i]
        ws = scales[i]
        _zero(a0, a1, a2, a3)
        for base in range(0, full, 64):
            _four_rows_64(a0, a1, a2, a3, acts, b, row, base, ws[base >> shift],
                          ws[(base + 16) >> shift], ws[(base + 32) >> shift],
                          ws[(base + 48) >> shift])
        if full < k:
            _four_rows_32(a0, a1, a2, a3, acts, b, row, full, ws[full >> shift],
                          ws[(full + 16) >> shift])
        _four_outputs(a0, a1, a2, a3, spare, acts, b, weight, i, outs)


@exact_kernel
def _rows_x8(acts, b, weight, outs, start, stop):
    """outs[b..b+7, i]: as _rows_x4 with eight activation rows per weight block (the block's
    load, top-bit flip and scale vector shared by twice the rows; 6-14% faster than two
    four-row tiles, same process, one thread)."""
    levels, scales = weight[0], weight[1]
    shift = _shift(weight[4])
    k = levels.shape[1]
    full = k // 64 * 64
    a0, a1, a2, a3 = stack_f32_16(), stack_f32_16(), stack_f32_16(), stack_f32_16()
    a4, a5, a6, a7 = stack_f32_16(), stack_f32_16(), stack_f32_16(), stack_f32_16()
    spare = stack_f32_16()
    for i in range(start, stop):
        row = levels[i]
        ws = scales[i]
        _zero(a0, a1, a2, a3)
        _zero(a4, a5, a6, a7)
        for base in range(0, full, 64):
            s0, s1 = ws[base >> shift], ws[(base + 16) >> shift]
            s2, s3 = ws[(base + 32) >> shift], ws[(base + 48) >> shift]
            _four_rows_64(a0, a1, a2, a3, acts, b, row, base, s0, s1, s2, s3)
            _four_rows_64(a4, a5, a6, a7, acts, b + 4, row, base, s0, s1, s2, s3)
        if full < k:
            s0, s1 = ws[full >> shift], ws[(full + 16) >> shift]
            _four_rows_32(a0, a1, a2, a3, acts, b, row, full, s0, s1)
            _four_rows_32(a4, a5, a6, a7, acts, b + 4, row, full, s0, s1)
        _four_outputs(a0, a1, a2, a3, spare, acts, b, weight, i, outs)
        _four_outputs(a4, a5, a6, a7, spare, acts, b + 4, weight, i, outs)


@exact_kernel
def rows_chunk(acts, weight, outs, chunk):
    """outs[:, rows of chunk] for every activation row: tiles of 8 rows, then one of 4 for a
    remainder of 4..7, then single rows (each row's arithmetic is the same in every tile, so
    its bits do not depend on which tile it lands in)."""
    n = weight[0].shape[0]
    start = chunk * ROW_CHUNK
    stop = min(n, start + ROW_CHUNK)
    rows = acts[0].shape[0]
    b = 0
    while rows - b >= 8:
        _rows_x8(acts, b, weight, outs, start, stop)
        b += 8
    if rows - b >= 4:
        _rows_x4(acts, b, weight, outs, start, stop)
        b += 4
    while b < rows:
        _rows_x1(acts, b, weight, outs, start, stop)
        b += 1


@exact_kernel
def quantized_rows(xs):
    """(q, scales, lane starts, factors16, factors32, lane scales) of f32 rows xs [B, k]: the
    fields of int8_rows.ActivationRows in that order, and each block's scale repeated over its
    8 lanes (what the kernels load)."""
    rows, k = xs.shape
    acts = (np.empty((rows, k), np.int8), np.empty((rows, k // 32), np.float32),
            np.empty((rows, k // 4), np.int32), np.empty((rows, k // 16), np.float32),
            np.empty((rows, k // 32), np.float32), np.empty((rows, k // 4), np.float32))
    quantize_rows(xs, acts[0], acts[1], acts[2], acts[3], acts[4])
    lane_scales = acts[5]
    for b in range(rows):
        for lane in range(k // 4):
            lane_scales[b, lane] = acts[1][b, lane >> 3]
    return acts


@exact_parallel_kernel
def rows_parallel(xs, weight, outs):
    """outs = xs W^T in int8 arithmetic (xs f32[B, k]), weight rows split over numba's
    threads."""
    group = _row_group(xs.shape[1])
    for first in range(0, xs.shape[0], group):
        acts = quantized_rows(xs[first:first + group])
        group_outs = outs[first:first + group]
        for chunk in prange((weight[0].shape[0] + ROW_CHUNK - 1) // ROW_CHUNK):
            rows_chunk(acts, weight, group_outs, chunk)


@exact_kernel
def rows_serial(xs, weight, outs):
    group = _row_group(xs.shape[1])
    for first in range(0, xs.shape[0], group):
        acts = quantized_rows(xs[first:first + group])
        group_outs = outs[first:first + group]
        for chunk in range((weight[0].shape[0] + ROW_CHUNK - 1) // ROW_CHUNK):
            rows_chunk(acts, weight, group_outs, chunk)


@exact_kernel
def rows(xs, weight, outs, parallel):
    """rows_parallel or rows_serial: the products the decode steps call (decoder_step.project,
    batched_step.project_rows)."""
    if parallel:
        rows_parallel(xs, weight, outs)
    else:
        rows_serial(xs, weight, outs)
