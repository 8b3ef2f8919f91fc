"""Attention for many query rows (encoders, prompts), one head and one block of rows at a time.

The reference materialises every head's full score matrix (Whisper's encoder: 6 x 1500 x 1500
f32 = 54 MB per layer) and walks it five times (scale, max, subtract, exp, divide), each pass
from DRAM. Here each block of `BLOCK_ROWS` query rows of one head is done start to finish while
its scores (BLOCK_ROWS x tk, 9 MB for a Whisper head) stay in the last-level cache instead of
DRAM: scores = (q * scale) k^T by BLAS, then one numba
pass that subtracts the row max, exponentiates (vectorised exp, vector_math.py) and sums, then
BLAS multiplies by v and the rows are divided by their sums. Same f32 arithmetic as the
reference up to summation order and the scale being applied to q (exact for power-of-two
scales such as 1/8 at head size 64).
"""

from __future__ import annotations

import numpy as np

from .kernels.vector_math import exp_shifted_rows

# Whole heads up to 2048 query rows (bounds the scratch to 2048 x tk). Smaller blocks that fit
# L2 (128-256 rows) were as fast with single-threaded BLAS but 2.5x slower with two OpenBLAS
# threads on this loaded 2-core machine: every BLAS call is a thread hand-off, and Whisper's
# encoder would make 144 of them per layer instead of 12 (measured on 6 x 1500 x 1500, d 64).
BLOCK_ROWS = 2048


def blocked_attention(q, k, v, mask, scale):
    """softmax(q k^T * scale + mask) v for f32 q [b, h, tq, d], k [bk, hk, tk, d] and
    v [bk, hk, tk, dv] (bk, hk in (1, b) / (1, h)); `mask` None or broadcastable to
    [b, h, tq, tk]. Returns a new C-contiguous f32 [b, h, tq, dv]."""
    batch, heads, tq, _ = q.shape
    tk, dv = k.shape[2], v.shape[3]
    out = np.empty((batch, heads, tq, dv), np.float32)
    if mask is not None:
        mask = np.broadcast_to(mask, (batch, heads, tq, tk))
    scores_buffer = np.empty((min(BLOCK_ROWS, tq), tk), np.float32)
    sums_buffer = np.empty(min(BLOCK_ROWS, tq), np.float32)
    scale = np.float32(scale)
    for bi in range(batch):
        kb = bi if k.shape[0] > 1 else 0
        for hi in range(heads):
            kh = hi if k.shape[1] > 1 else 0
            keys_t = k[kb, kh].T  # a transposed view: BLAS reads it through its trans flag
            values = v[kb, kh]
            queries = q[bi, hi] * scale
            for start in range(0, tq, BLOCK_ROWS):
                stop = min(tq, start + BLOCK_ROWS)
                scores = scores_buffer[:stop - start]
                sums = sums_buffer[:stop - start]
                np.matmul(queries[start:stop], keys_t, out=scores)
                if mask is not None:
                    scores += mask[bi, hi, start:stop]
                exp_shifted_rows(scores, sums)
                block_out = out[bi, hi, start:stop]
                np.matmul(scores, values, out=block_out)
                block_out /= sums[:, None]
    return out
