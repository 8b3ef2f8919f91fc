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
TILE = 4  # activation rows sharing one weight block


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
def _row_lanes(acc, starts, row, scales, q, acts_scales, shift, k):
    """acc[0:16] = the lanes of one weight row times one activation row (int8_rows' epilogue)."""
    for j in range(16):
        acc[j] = 0.0
    full = k // 64 * 64
    for base in range(0, full, 64):
        lanes_step_64(acc, starts, base >> 2, row, base, q, base,
                      scales[base >> shift], scales[(base + 16) >> shift],
                      scales[(base + 32) >> shift], scales[(base + 48) >> shift],
                      acts_scales[base >> 5], acts_scales[(base >> 5) + 1])
    if full < k:
        lanes_step_32(acc, starts, full >> 2, row, full, q, full,
                      scales[full >> shift], scales[(full + 16) >> shift], acts_scales[full >> 5])


@exact_inline
def _offset_total(lanes, offsets, factors):
    """fold(o) of int8_rows: offsets_g * factors_g summed in 16 lanes, g in order."""
    for j in range(16):
        lanes[j] = 0.0
    groups = offsets.size
    for g0 in range(0, groups, 16):
        for j in range(min(16, groups - g0)):
            lanes[j] += offsets[g0 + j] * factors[g0 + j]
    return _fold(lanes)


@exact_kernel
def _rows_x1(acts, b, weight, outs, start, stop):
    """outs[b, i] for weight rows start..stop-1 and the one activation row b."""
    q, act_scales, starts, factors16, factors32 = acts
    levels, scales, offsets, use_offsets, group = weight
    shift = _shift(group)
    factors = factors16[b] if group == 16 else factors32[b]
    k = levels.shape[1]
    acc = stack_f32_16()
    spare = stack_f32_16()
    for i in range(start, stop):
        _row_lanes(acc, starts[b], levels[i], scales[i], q[b], act_scales[b], shift, k)
        total = _fold(acc)
        if use_offsets:
            total += _offset_total(spare, offsets[i], factors)
        outs[b, i] = total


@exact_kernel
def _rows_x4(acts, b, weight, outs, start, stop):
    """outs[b..b+3, i] for weight rows start..stop-1: each weight block loaded once for the
    four activation rows."""
    q, act_scales, starts, factors16, factors32 = acts
    levels, scales, offsets, use_offsets, group = weight
    shift = _shift(group)
    k = levels.shape[1]
    full = k // 64 * 64
    a0, a1, a2, a3 = stack_f32_16(), stack_f32_16(), stack_f32_16(), stack_f32_16()
    spare = stack_f32_16()
    q0, q1, q2, q3 = q[b], q[b + 1], q[b + 2], q[b + 3]
    t0, t1, t2, t3 = starts[b], starts[b + 1], starts[b + 2], starts[b + 3]
    d0, d1, d2, d3 = act_scales[b], act_scales[b + 1], act_scales[b + 2], act_scales[b + 3]
    for i in range(start, stop):
        row = levels[i]
        ws = scales[i]
        for j in range(16):
            a0[j] = 0.0
            a1[j] = 0.0
            a2[j] = 0.0
            a3[j] = 0.0
        for base in range(0, full, 64):
            s0, s1 = ws[base >> shift], ws[(base + 16) >> shift]
            s2, s3 = ws[(base + 32) >> shift], ws[(base + 48) >> shift]
            half = base >> 5
            lane = base >> 2
            lanes_step_64(a0, t0, lane, row, base, q0, base, s0, s1, s2, s3, d0[half], d0[half + 1])
            lanes_step_64(a1, t1, lane, row, base, q1, base, s0, s1, s2, s3, d1[half], d1[half + 1])
            lanes_step_64(a2, t2, lane, row, base, q2, base, s0, s1, s2, s3, d2[half], d2[half + 1])
            lanes_step_64(a3, t3, lane, row, base, q3, base, s0, s1, s2, s3, d3[half], d3[half + 1])
        if full < k:
            s0, s1 = ws[full >> shift], ws[(full + 16) >> shift]
            half = full >> 5
            lane = full >> 2
            lanes_step_32(a0, t0, lane, row, full, q0, full, s0, s1, d0[half])
            lanes_step_32(a1, t1, lane, row, full, q1, full, s0, s1, d1[half])
            lanes_step_32(a2, t2, lane, row, full, q2, full, s0, s1, d2[half])
            lanes_step_32(a3, t3, lane, row, full, q3, full, s0, s1, d3[half])
        r0, r1, r2, r3 = _fold(a0), _fold(a1), _fold(a2), _fold(a3)
        if use_offsets:
            o = offsets[i]
            f0 = factors16[b] if group == 16 else factors32[b]
            f1 = factors16[b + 1] if group == 16 else factors32[b + 1]
            f2 = factors16[b + 2] if group == 16 else factors32[b + 2]
            f3 = factors16[b + 3] if group == 16 else factors32[b + 3]
            r0 += _offset_total(spare, o, f0)
            r1 += _offset_total(spare, o, f1)
            r2 += _offset_total(spare, o, f2)
            r3 += _offset_total(spare, o, f3)
        outs[b, i] = r0
        outs[b + 1, i] = r1
        outs[b + 2, i] = r2
        outs[b + 3, i] = r3


@exact_kernel
def rows_chunk(acts, weight, outs, chunk):
    """outs[:, rows of chunk] for every activation row (tiles of 4 as qrows.rows_chunk: the
    last tile ends at row B, overlapping the one before; overlapped rows get equal bits)."""
    n = weight[0].shape[0]
    start = chunk * ROW_CHUNK
    stop = min(n, start + ROW_CHUNK)
    rows = acts[0].shape[0]
    if rows < TILE:
        for b in range(rows):
            _rows_x1(acts, b, weight, outs, start, stop)
        return
    for tile in range((rows + TILE - 1) // TILE):
        _rows_x4(acts, min(tile * TILE, rows - TILE), weight, outs, start, stop)


@exact_kernel
def quantized_rows(xs):
    """(q, scales, lane starts, factors16, factors32) of f32 rows xs [B, k]: the fields of
    int8_rows.ActivationRows, in that order."""
    rows, k = xs.shape
    acts = (np.empty((rows, k), np.int8), np.empty((rows, k // 32), np.float32),
            np.empty((rows, k // 4), np.int32), np.empty((rows, k // 16), np.float32),
            np.empty((rows, k // 32), np.float32))
    quantize_rows(xs, acts[0], acts[1], acts[2], acts[3], acts[4])
    return acts


@exact_parallel_kernel
def rows_parallel(xs, weight, outs):
    """outs = xs W^T in int8 arithmetic (xs f32[B, k]), weight rows split over numba's
    threads."""
    acts = quantized_rows(xs)
    for chunk in prange((weight[0].shape[0] + ROW_CHUNK - 1) // ROW_CHUNK):
        rows_chunk(acts, weight, outs, chunk)


@exact_kernel
def rows_serial(xs, weight, outs):
    acts = quantized_rows(xs)
    for chunk in range((weight[0].shape[0] + ROW_CHUNK - 1) // ROW_CHUNK):
        rows_chunk(acts, weight, outs, chunk)


@exact_kernel
def rows(xs, weight, outs, parallel):
    """rows_parallel or rows_serial: the products the decode steps call (decoder_step.project,
    batched_step.project_rows)."""
    if parallel:
        rows_parallel(xs, weight, outs)
    else:
        rows_serial(xs, weight, outs)
