"""Quantized matmul from pre-unpacked weights (see candle_native.quant_unpack).

out[r, i] = sum_g scales[i, g] * dot(levels[i, group g], x[r, group g])
          + offsets[i, g] * xsum[r, g]

Parallel over weight rows. Within a row, a small accumulator array of one group's width collects
level * x * scale element-wise and is summed once at the end: LLVM turns that into vector
registers with no horizontal add per group (a plain running sum over the row, with the scale
gathered per element, did not vectorise and was 10-20x slower).

Two kernels, one per group width (16: Q2_K/Q3_K/Q6_K, 32: everything else), because the width
must be a compile-time constant for the inner loop to be fully unrolled.
"""

import numpy as np
from numba import prange

from ._jit import exact_parallel_kernel, parallel_kernel

GROUP_32 = 32
GROUP_16 = 16


@parallel_kernel
def qmatmul_g32(x, levels, scales, offsets, xsum, use_offsets, out):
    """x f32[m, k], levels i8[n, k], scales f32[n, k/32], offsets f32[n, k/32] (read only when
    use_offsets), xsum f32[m, k/32] (sums of x per group), out f32[m, n]."""
    m = x.shape[0]
    n, k = levels.shape
    n_groups = k // 32
    for i in prange(n):
        partial = np.empty(32, np.float32)
        for r in range(m):
            for j in range(32):
                partial[j] = 0.0
            for g in range(n_groups):
                scale = scales[i, g]
                base = g * 32
                for j in range(32):
                    partial[j] += np.float32(levels[i, base + j]) * (x[r, base + j] * scale)
            total = np.float32(0.0)
            for j in range(32):
                total += partial[j]
            if use_offsets:
                for g in range(n_groups):
                    total += offsets[i, g] * xsum[r, g]
            out[r, i] = total


@parallel_kernel
def qmatmul_g16(x, levels, scales, offsets, xsum, use_offsets, out):
    """As qmatmul_g32 with 16-element groups (k is a multiple of 256 for these types). Two
    groups per step fill a 32-wide accumulator, the scale picked per lane by a select: a 16-wide
    accumulator, or two separate 16-element loops, ran 10-15x slower (measured 4096x4096)."""
    m = x.shape[0]
    n, k = levels.shape
    n_groups = k // 16
    for i in prange(n):
        partial = np.empty(32, np.float32)
        for r in range(m):
            for j in range(32):
                partial[j] = 0.0
            for pair in range(n_groups // 2):
                first = scales[i, 2 * pair]
                second = scales[i, 2 * pair + 1]
                base = pair * 32
                for j in range(32):
                    scale = first if j < 16 else second
                    partial[j] += np.float32(levels[i, base + j]) * (x[r, base + j] * scale)
            total = np.float32(0.0)
            for j in range(32):
                total += partial[j]
            if use_offsets:
                for g in range(n_groups):
                    total += offsets[i, g] * xsum[r, g]
            out[r, i] = total


@exact_parallel_kernel
def dequantize_rows_into(levels, scales, offsets, use_offsets, group, start, out):
    """Rows start .. start + out.shape[0] of the weight as f32 into out (bit-identical to the
    reference dequantizers: scale * level + offset, both f32). One group per inner loop, the
    scale hoisted and the offset test outside it, so the loop vectorises (a per-element
    `j // group` and branch ran 40x slower: 0.12 G elements/s). Group width is 32 or 16."""
    rows, k = out.shape
    n_groups = k // group
    for local in prange(rows):
        i = start + local
        row_levels = levels[i]
        row_out = out[local]
        for g in range(n_groups):
            scale = scales[i, g]
            base = g * group
            # The width is a literal in each branch so LLVM fully unrolls the group's loop.
            if use_offsets:
                offset = offsets[i, g]
                if group == GROUP_32:
                    for j in range(GROUP_32):
                        row_out[base + j] = scale * np.float32(row_levels[base + j]) + offset
                else:
                    for j in range(GROUP_16):
                        row_out[base + j] = scale * np.float32(row_levels[base + j]) + offset
            elif group == GROUP_32:
                for j in range(GROUP_32):
                    row_out[base + j] = scale * np.float32(row_levels[base + j])
            else:
                for j in range(GROUP_16):
                    row_out[base + j] = scale * np.float32(row_levels[base + j])
