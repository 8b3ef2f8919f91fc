"""Attention for a few query rows (the decode step) over the KV cache, fused.

q f32[b, h, tq, d] C-contiguous, k f32[bk, hk, tk, d] and v f32[bk, hk, tk, dv] C-contiguous
with bk in (1, b) and hk in (1, h) (numpy broadcasting of the leading dims), mask an f32 view
broadcast to [b, h, tq, tk] (additive; zeros when there is none). One (b, h, query) row per
work item: scores = q.k * scale + mask, softmax, weighted sum of v rows, all in f32 as the
reference does, without materialising the [b, h, tq, tk] score tensor.
"""

import math

import numpy as np
from numba import prange

from ._jit import parallel_kernel
from .vector_math import SOFTMAX_NEGLIGIBLE


@parallel_kernel
def attention_rows(q, k, v, mask, scale, out):
    batch, heads, tq, d = q.shape
    tk = k.shape[2]
    dv = v.shape[3]
    for row in prange(batch * heads * tq):
        bi = row // (heads * tq)
        hi = (row // tq) % heads
        qi = row % tq
        kb = bi if k.shape[0] > 1 else 0
        kh = hi if k.shape[1] > 1 else 0
        scores = np.empty(tk, np.float32)
        peak = np.float32(-np.inf)
        for j in range(tk):
            dot = np.float32(0.0)
            for c in range(d):
                dot += q[bi, hi, qi, c] * k[kb, kh, j, c]
            s = dot * scale + mask[bi, hi, qi, j]
            scores[j] = s
            if s > peak:
                peak = s
        total = np.float32(0.0)
        for j in range(tk):
            shifted = scores[j] - peak  # negligible weights as 0 (vector_math.SOFTMAX_NEGLIGIBLE)
            e = np.float32(math.exp(shifted)) if shifted >= SOFTMAX_NEGLIGIBLE else np.float32(0.0)
            scores[j] = e
            total += e
        acc = np.zeros(dv, np.float32)
        for j in range(tk):
            p = scores[j] / total
            for c in range(dv):
                acc[c] += p * v[kb, kh, j, c]
        for c in range(dv):
            out[bi, hi, qi, c] = acc[c]
