"""Quantized weight rows times 1..B activation rows: the matrix products of the LLaMA decode
steps (one token, B sequences in a batch, or a prompt's tokens), each output bit-identical
whatever B is and whichever rows run beside it.

A weight is the decode step's tuple ``(levels i8[n, k], scales f32[n, k/g], offsets f32[n, k/g]
or a 1x1 stand-in, use_offsets, group)`` with group 32 or 16 (decoder_step.py). Per weight row
i and 32-element block of k:

    w[j] = level[i, j] * scale + offset        (the dequantized weight; with 16-element groups
                                                lanes 0-15 and 16-31 take their own group's)
    lane[b, j] += w[j] * x[b, j]                for each activation row b

and at the row's end a row's 32 lanes are folded in a fixed tree (16, 8, 4, 2, 1). The
dequantized block is computed once and used for four activation rows at a time (`_rows_x4`),
which is what makes B rows cheaper than B products of one row: on these CPUs the FP ports, not
memory, bound a batched step, and the block's convert and scale are shared. One row costs what
the earlier scale-per-product kernel cost (int8 -> f32 convert, one multiply-add for the
weight, one for the product). Same-process figures, one thread, quiet machine (ms per row of a
Qwen2.5-0.5B matrix at 8 rows, earlier kernel -> this one): gate|up 9728x896 0.72 -> 0.28,
down 896x4864 0.25 -> 0.19, head 151936x896 9.9 -> 5.0.

The kernels are compiled with strict floating point (_jit.STRICT_LANES: contraction only), so
the vectoriser cannot re-associate a lane's sum: `_rows_x1` and `_rows_x4` do the same
operations per lane in the same order and give the same bits for a row
(tests/native/test_qrows.py checks it; tests/backend/test_batched_decoding.py on whole models).
"""

import numpy as np
from numba import prange

from ._jit import parallel_kernel, strict_inline, strict_kernel
from .stack_scratch import stack_f32_32

# Weight rows per parallel work item (see decoder_step.ROW_CHUNK's measurement).
ROW_CHUNK = 32
TILE = 4  # activation rows sharing one dequantized block (4 x 32 lanes fill 16 AVX registers)


@strict_inline
def _group_layout(use_offsets, group):
    """Index arithmetic instead of branches in the block loop (a branch there, even one LLVM
    could hoist, kept the four-row kernel from keeping its lanes in registers: 3x slower):
    groups per 32-element block, the offset of the second half's group (0 for 32-element
    groups), and 0 to read the zero 1x1 offsets stand-in of a weight without offsets."""
    per = 32 // group
    return per, per - 1, 1 if use_offsets else 0


@strict_inline
def _fold(lanes):
    """The 32 lanes summed in a fixed tree (the same bits in every kernel)."""
    for j in range(16):
        lanes[j] += lanes[j + 16]
    for j in range(8):
        lanes[j] += lanes[j + 8]
    for j in range(4):
        lanes[j] += lanes[j + 4]
    return (lanes[0] + lanes[2]) + (lanes[1] + lanes[3])


@strict_kernel
def _rows_x1(xs, b, weight, outs, start, stop):
    """outs[b, i] for weight rows start..stop-1 and the one activation row b."""
    levels, scales, offsets, use_offsets, group = weight
    per, second, om = _group_layout(use_offsets, group)
    x = xs[b]
    lanes = stack_f32_32()
    for i in range(start, stop):
        row = levels[i]
        for j in range(32):
            lanes[j] = 0.0
        for block in range(levels.shape[1] // 32):
            g0 = block * per
            s0, s1 = scales[i, g0], scales[i, g0 + second]
            o0, o1 = offsets[i * om, g0 * om], offsets[i * om, (g0 + second) * om]
            base = block * 32
            for j in range(32):
                w = np.float32(row[base + j]) * (s0 if j < 16 else s1) + (o0 if j < 16 else o1)
                lanes[j] += w * x[base + j]
        outs[b, i] = _fold(lanes)


@strict_kernel
def _rows_x4(xs, b, weight, outs, start, stop):
    """outs[b..b+3, i] for weight rows start..stop-1: each dequantized block used for the four
    activation rows (the lanes of all four stay in registers)."""
    levels, scales, offsets, use_offsets, group = weight
    per, second, om = _group_layout(use_offsets, group)
    x0, x1, x2, x3 = xs[b], xs[b + 1], xs[b + 2], xs[b + 3]
    l0, l1, l2, l3 = stack_f32_32(), stack_f32_32(), stack_f32_32(), stack_f32_32()
    for i in range(start, stop):
        row = levels[i]
        for j in range(32):
            l0[j] = 0.0
            l1[j] = 0.0
            l2[j] = 0.0
            l3[j] = 0.0
        for block in range(levels.shape[1] // 32):
            g0 = block * per
            s0, s1 = scales[i, g0], scales[i, g0 + second]
            o0, o1 = offsets[i * om, g0 * om], offsets[i * om, (g0 + second) * om]
            base = block * 32
            for j in range(32):
                w = np.float32(row[base + j]) * (s0 if j < 16 else s1) + (o0 if j < 16 else o1)
                l0[j] += w * x0[base + j]
                l1[j] += w * x1[base + j]
                l2[j] += w * x2[base + j]
                l3[j] += w * x3[base + j]
        outs[b, i] = _fold(l0)
        outs[b + 1, i] = _fold(l1)
        outs[b + 2, i] = _fold(l2)
        outs[b + 3, i] = _fold(l3)


@strict_kernel
def rows_chunk(xs, weight, outs, chunk):
    """outs[:, rows of chunk] = W[rows of chunk] xs[b] for every activation row b (xs f32[B, k],
    outs f32[B, n]). From 4 rows on, tiles of 4; the last tile ends at row B (overlapping the
    one before when B is not a multiple of 4: those rows are written twice, with equal bits)."""
    n = weight[0].shape[0]
    start = chunk * ROW_CHUNK
    stop = min(n, start + ROW_CHUNK)
    rows = xs.shape[0]
    if rows < TILE:
        for b in range(rows):
            _rows_x1(xs, b, weight, outs, start, stop)
        return
    for tile in range((rows + TILE - 1) // TILE):
        _rows_x4(xs, min(tile * TILE, rows - TILE), weight, outs, start, stop)


@parallel_kernel
def rows_parallel(xs, weight, outs):
    """rows_chunk over every chunk, split over numba's threads."""
    for chunk in prange((weight[0].shape[0] + ROW_CHUNK - 1) // ROW_CHUNK):
        rows_chunk(xs, weight, outs, chunk)


@strict_kernel
def rows_serial(xs, weight, outs):
    for chunk in range((weight[0].shape[0] + ROW_CHUNK - 1) // ROW_CHUNK):
        rows_chunk(xs, weight, outs, chunk)
