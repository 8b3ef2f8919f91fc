"""One LLaMA decoder block for one new token, fused into a single numba call.

A decode step through the generic tensor path costs ~12 Python-level ops per layer (norm,
matmul, reshape/transpose/narrow, rope, cache append, attention, add...), each a few tens of
microseconds of dispatch and temporaries; on SmolLM2-135M (30 layers) that overhead was larger
than the arithmetic. Here the whole block runs in machine code:

    h = rms_norm(x) ; q|k|v = W_qkv h (+ b_qkv) ; rope(q, k) at `pos` ; cache[pos] = k, v
    x += W_o attention(q, cache[0..pos])            (grouped-query, no mask: one token)
    h = rms_norm(x) ; g|u = W_gu h ; x += W_down (silu(g) * u)

The arithmetic is the generic path's up to re-association: rms norm as `_rms_norm_row`, rope as
the rope kernels, softmax-weighted values as `attention_rows`; the quantized products are
qrows.py's (each weight dequantized, level * scale + offset, then multiplied with x in 32
lanes folded in a fixed tree), shared with the batched step so that a row's bits do not depend
on its batch. Logits agree with the generic path to ~1e-6 of their scale
(tests/models/test_llama_fused_decode.py).

A weight is passed as a tuple ``(levels i8[n, k], scales f32[n, k/g], offsets f32[n, k/g] or a
1x1 stand-in, use_offsets, group)`` with group 32 or 16 (see quant_unpack / numba_backend), or
as a plain C-ordered f32 matrix ``[n, k]`` (float checkpoints); `project` picks the matching
matrix-vector kernel when the block step is compiled for those argument types, so quantized,
float and mixed models share one block step.
With `parallel`, matrix-vector products are split over numba's threads in chunks of rows and
attention over heads; without, everything runs on the calling thread. Each parallel region
ends in a join, five per block: on an oversubscribed machine a join can wait a whole
scheduler time slice for a descheduled worker, so the caller picks (see llama_decoder.py).
"""

import math

import numpy as np
from numba import prange, types
from numba.extending import overload

from . import qint8, qrows
from ._jit import FAST_REDUCTIONS, kernel, parallel_kernel
from .vector_math import SOFTMAX_NEGLIGIBLE

# Weight rows per parallel work item: enough to amortise scheduling, few enough to balance
# two threads on the smallest matrices: SmolLM2's 576-row out and down projections split into
# 18 items, 9 per thread (64 rows gave 9 items, 5 against 4). Same-process A/B over all of
# SmolLM2's matrices: 24.0 vs 24.5 ms per token (Q4_0), 27.1 vs 27.4 (Q8_0).
ROW_CHUNK = qrows.ROW_CHUNK


@kernel
def matvec(x, weight, out, parallel):
    """out = W x for one activation vector x (f32[k]) and a quantized weight tuple (see module
    doc), split over numba's threads when `parallel`: the batched steps' product (qrows.py)
    with one row, so a row's bits are the same alone and in a batch."""
    xs = x.reshape((1, x.size))
    outs = out.reshape((1, out.size))
    if parallel:
        qrows.rows_parallel(xs, weight, outs)
    else:
        qrows.rows_serial(xs, weight, outs)


@kernel
def _rows_f32(x, weight, out, start, stop):
    """out[i] = W[i] . x for rows start..stop-1 of an f32 matrix (re-association lets LLVM
    vectorise the dot product; the loop is bound by reading W)."""
    for i in range(start, stop):
        total = np.float32(0.0)
        for j in range(x.size):
            total += weight[i, j] * x[j]
        out[i] = total


@parallel_kernel
def _matvec_f32_parallel(x, weight, out):
    rows = weight.shape[0]
    for chunk in prange((rows + ROW_CHUNK - 1) // ROW_CHUNK):
        start = chunk * ROW_CHUNK
        _rows_f32(x, weight, out, start, min(rows, start + ROW_CHUNK))


@kernel
def _matvec_f32_serial(x, weight, out):
    _rows_f32(x, weight, out, 0, weight.shape[0])


def project(x, weight, out, parallel):
    """out = W x for a quantized weight tuple or an f32 matrix W; callable from kernels only
    (the overload below chooses the implementation from W's numba type)."""
    raise NotImplementedError("decoder_step.project runs inside numba kernels only")


@overload(project, jit_options={"fastmath": FAST_REDUCTIONS, "nogil": True})
def _project_for_type(x, weight, out, parallel):
    if isinstance(weight, types.Array):
        def float_matvec(x, weight, out, parallel):
            if parallel:
                _matvec_f32_parallel(x, weight, out)
            else:
                _matvec_f32_serial(x, weight, out)
        return float_matvec

    if weight.types[0].dtype == types.uint8:  # levels viewed as uint8: compute type int8
        def int8_matvec(x, weight, out, parallel):
            qint8.rows(x.reshape((1, x.size)), weight, out.reshape((1, out.size)), parallel)
        return int8_matvec

    def quantized_matvec(x, weight, out, parallel):
        matvec(x, weight, out, parallel)
    return quantized_matvec


def weight_rows(weight):
    """Output rows of a weight in either form (kernels only, like `project`)."""
    raise NotImplementedError("decoder_step.weight_rows runs inside numba kernels only")


@overload(weight_rows)
def _weight_rows_for_type(weight):
    if isinstance(weight, types.Array):
        return lambda weight: weight.shape[0]
    return lambda weight: weight[0].shape[0]


@kernel
def rms_norm_vector(x, weight, eps, out):
    squares = np.float32(0.0)
    for j in range(x.size):
        squares += x[j] * x[j]
    inv_rms = np.float32(1.0) / np.float32(math.sqrt(squares / np.float32(x.size) + eps))
    for j in range(x.size):
        out[j] = x[j] * inv_rms * weight[j]


@kernel
def _rope_head(v, base, head_dim, cos, sin, pos, interleaved):
    """Rotate one head (v[base : base + head_dim]) in place for position `pos`."""
    half = head_dim // 2
    for i in range(half):
        c = cos[pos, i]
        s = sin[pos, i]
        if interleaved:
            a = v[base + 2 * i]
            b = v[base + 2 * i + 1]
            v[base + 2 * i] = a * c - b * s
            v[base + 2 * i + 1] = a * s + b * c
        else:
            a = v[base + i]
            b = v[base + i + half]
            v[base + i] = a * c - b * s
            v[base + i + half] = b * c + a * s


@kernel
def _attend_head(qkv, keys, values, length, h, n_rep, head_dim, scale, out):
    """out[h] = softmax(q_h . K^T * scale) V over the first `length` cached positions of the
    key/value head serving query head h (heads grouped [n_kv, n_rep]).
    Rows are taken as slices and indexed from 0: with `qkv[q_base + c]` numba's
    negative-index wraparound on a runtime offset kept LLVM from vectorising the dot products
    (one SmolLM2 head at 141 positions: 29 us -> 12 us for the whole head)."""
    q = qkv[h * head_dim:(h + 1) * head_dim]
    head_keys = keys[h // n_rep]
    head_values = values[h // n_rep]
    scores = np.empty(length, np.float32)
    peak = np.float32(-np.inf)
    for j in range(length):
        key = head_keys[j]
        dot = np.float32(0.0)
        for c in range(head_dim):
            dot += q[c] * key[c]
        s = dot * scale
        scores[j] = s
        if s > peak:
            peak = s
    total = np.float32(0.0)
    for j in range(length):
        shifted = scores[j] - peak  # negligible weights as 0: see vector_math.SOFTMAX_NEGLIGIBLE
        e = np.float32(math.exp(shifted)) if shifted >= SOFTMAX_NEGLIGIBLE else np.float32(0.0)
        scores[j] = e
        total += e
    for j in range(length):
        scores[j] = scores[j] / total
    head_out = out[h * head_dim:(h + 1) * head_dim]
    for c in range(head_dim):
        head_out[c] = 0.0
    for j in range(length):
        p = scores[j]
        value = head_values[j]
        for c in range(head_dim):
            head_out[c] += p * value[c]


@parallel_kernel
def _attend_parallel(qkv, keys, values, length, n_heads, n_kv, head_dim, scale, out):
    for h in prange(n_heads):
        _attend_head(qkv, keys, values, length, h, n_heads // n_kv, head_dim, scale, out)


@kernel
def _attend_serial(qkv, keys, values, length, n_heads, n_kv, head_dim, scale, out):
    for h in range(n_heads):
        _attend_head(qkv, keys, values, length, h, n_heads // n_kv, head_dim, scale, out)


@kernel
def _silu_mul_halves(gate_up, hidden, out):
    for j in range(hidden):
        g = gate_up[j]
        out[j] = g / (np.float32(1.0) + np.float32(math.exp(-g))) * gate_up[hidden + j]


@kernel
def llama_block_step(x, attn_norm, mlp_norm, eps, qkv_w, qkv_bias, out_w, gate_up_w, down_w,
                     keys, values, pos, cos, sin, n_heads, n_kv, head_dim, interleaved, scale,
                     parallel):
    """Run one block for one token in place on x (f32[d], the residual stream). keys/values:
    f32[n_kv, capacity, head_dim] with capacity > pos; position `pos` is written here.
    qkv_bias: f32[(n_heads + 2 n_kv) * head_dim] added to the projection before RoPE (qwen2),
    or empty (no bias). `parallel`: split the matrix products and heads over numba's threads."""
    d = x.size
    h = np.empty(d, np.float32)
    rms_norm_vector(x, attn_norm, eps, h)
    q_size = n_heads * head_dim
    kv_size = n_kv * head_dim
    qkv = np.empty(q_size + 2 * kv_size, np.float32)
    project(h, qkv_w, qkv, parallel)
    if qkv_bias.size:
        for j in range(qkv.size):
            qkv[j] += qkv_bias[j]
    for head in range(n_heads + n_kv):  # q heads then k heads are contiguous in qkv
        _rope_head(qkv, head * head_dim, head_dim, cos, sin, pos, interleaved)
    for kh in range(n_kv):
        for c in range(head_dim):
            keys[kh, pos, c] = qkv[q_size + kh * head_dim + c]
            values[kh, pos, c] = qkv[q_size + kv_size + kh * head_dim + c]
    attended = np.empty(q_size, np.float32)
    if parallel:
        _attend_parallel(qkv, keys, values, pos + 1, n_heads, n_kv, head_dim, scale, attended)
    else:
        _attend_serial(qkv, keys, values, pos + 1, n_heads, n_kv, head_dim, scale, attended)
    projected = np.empty(d, np.float32)
    project(attended, out_w, projected, parallel)
    for j in range(d):
        x[j] += projected[j]

    rms_norm_vector(x, mlp_norm, eps, h)
    gate_up = np.empty(weight_rows(gate_up_w), np.float32)
    project(h, gate_up_w, gate_up, parallel)
    hidden = gate_up.size // 2
    act = np.empty(hidden, np.float32)
    _silu_mul_halves(gate_up, hidden, act)
    project(act, down_w, projected, parallel)
    for j in range(d):
        x[j] += projected[j]


@kernel
def final_logits(x, norm, eps, head_w, logits, parallel):
    """logits = W_head rms_norm(x)."""
    h = np.empty(x.size, np.float32)
    rms_norm_vector(x, norm, eps, h)
    project(h, head_w, logits, parallel)
