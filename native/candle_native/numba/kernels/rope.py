"""RoPE on C-contiguous f32 x viewed as [rows, d], row r at position r % t, cos/sin [t, d/2].

Half-rotation layout (GPT-NeoX / HF LLaMA): pairs (i, i + d/2). Interleaved layout (Candle's
rope_i, GGUF LLaMA weights): pairs (2i, 2i + 1). Same products as the numpy reference
(x1 * cos - x2 * sin), only fused into one pass; no contraction into FMA can change them by
more than an ulp.
"""

from numba import prange

from ._jit import parallel_kernel


@parallel_kernel
def rope_half_rows(x, cos, sin, out):
    rows, d = x.shape
    t = cos.shape[0]
    half = d // 2
    for r in prange(rows):
        p = r % t
        for i in range(half):
            x1 = x[r, i]
            x2 = x[r, i + half]
            out[r, i] = x1 * cos[p, i] - x2 * sin[p, i]
            out[r, i + half] = x2 * cos[p, i] + x1 * sin[p, i]


@parallel_kernel
def rope_interleaved_rows(x, cos, sin, out):
    rows, d = x.shape
    t = cos.shape[0]
    for r in prange(rows):
        p = r % t
        for i in range(d // 2):
            x_even = x[r, 2 * i]
            x_odd = x[r, 2 * i + 1]
            out[r, 2 * i] = x_even * cos[p, i] - x_odd * sin[p, i]
            out[r, 2 * i + 1] = x_even * sin[p, i] + x_odd * cos[p, i]
