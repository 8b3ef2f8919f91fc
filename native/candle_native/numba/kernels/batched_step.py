"""One LLaMA decoder block for B sequences at once, each at its own position with its own KV
cache (continuous batching: the API's scheduler advances every active request in one step).

The weight-bound work (QKV, output, gate|up and down projections, the head) is one call per
weight for all B rows: each chunk of ROW_CHUNK weight rows is read from memory once and, while
it is in cache, multiplied with every row's activations, a dequantized block shared by four
rows at a time (qrows.py). Per row, every value is computed with the same arithmetic, in the
same order, as the single-sequence step (decoder_step.llama_block_step): the quantized products
are qrows.py's strict-order kernels (the single step is their one-row case), f32 ones
`_rows_f32`, then `rms_norm_vector`, `_rope_head`, `_attend_head`, `_silu_mul_halves`. So a row's
logits are bit-identical to the single step's for that sequence whatever runs beside it
(tests/backend/test_batched_decoding.py checks it bitwise), which is what lets a request's
greedy ids not depend on the batch it joins. A prompt runs the same way, its tokens as rows of
one sequence (store_and_attend_rows).

Attention reads each row's own cache (different lengths); `store_and_attend` runs per row,
called from Python between the two block halves (a row's cache buffers are its own arrays,
of its own capacity).
"""

import numpy as np
from numba import prange, types
from numba.extending import overload

from ._jit import FAST_REDUCTIONS, kernel, parallel_kernel
from . import qint8, qrows
from .decoder_step import (ROW_CHUNK, _attend_parallel, _attend_serial, _rope_head, _rows_f32,
                           _silu_mul_halves, rms_norm_vector, weight_rows)


@parallel_kernel
def _matmul_rows_f32_parallel(xs, weight, outs):
    rows = weight.shape[0]
    for chunk in prange((rows + ROW_CHUNK - 1) // ROW_CHUNK):
        start = chunk * ROW_CHUNK
        for b in range(xs.shape[0]):
            _rows_f32(xs[b], weight, outs[b], start, min(rows, start + ROW_CHUNK))


@kernel
def _matmul_rows_f32_serial(xs, weight, outs):
    rows = weight.shape[0]
    for chunk in range((rows + ROW_CHUNK - 1) // ROW_CHUNK):
        start = chunk * ROW_CHUNK
        for b in range(xs.shape[0]):
            _rows_f32(xs[b], weight, outs[b], start, min(rows, start + ROW_CHUNK))


def project_rows(xs, weight, outs, parallel):
    """outs[b] = W xs[b] for every row b, W read once per chunk of its rows; callable from
    kernels only (the overload picks the quantized or f32 form, as decoder_step.project)."""
    raise NotImplementedError("batched_step.project_rows runs inside numba kernels only")


@overload(project_rows, jit_options={"fastmath": FAST_REDUCTIONS, "nogil": True})
def _project_rows_for_type(xs, weight, outs, parallel):
    if isinstance(weight, types.Array):
        def float_rows(xs, weight, outs, parallel):
            if parallel:
                _matmul_rows_f32_parallel(xs, weight, outs)
            else:
                _matmul_rows_f32_serial(xs, weight, outs)
        return float_rows

    if weight.types[0].dtype == types.uint8:  # levels viewed as uint8: compute type int8
        def int8_rows(xs, weight, outs, parallel):
            qint8.rows(xs, weight, outs, parallel)
        return int8_rows

    def quantized_rows(xs, weight, outs, parallel):
        if parallel:
            qrows.rows_parallel(xs, weight, outs)
        else:
            qrows.rows_serial(xs, weight, outs)
    return quantized_rows


@kernel
def block_rows_before_attention(xs, attn_norm, eps, qkv_w, qkv_bias, positions, cos, sin,
                                n_heads, n_kv, head_dim, interleaved, parallel):
    """The first half of a block for B rows (xs f32[B, d], row b at positions[b]): RMS norm,
    the fused QKV projection (one pass over its weight), bias, RoPE -> qkv f32[B, n]."""
    rows, d = xs.shape
    hs = np.empty((rows, d), np.float32)
    for b in range(rows):
        rms_norm_vector(xs[b], attn_norm, eps, hs[b])
    qkvs = np.empty((rows, (n_heads + 2 * n_kv) * head_dim), np.float32)
    project_rows(hs, qkv_w, qkvs, parallel)
    for b in range(rows):
        qkv = qkvs[b]
        if qkv_bias.size:
            for j in range(qkv.size):
                qkv[j] += qkv_bias[j]
        for head in range(n_heads + n_kv):
            _rope_head(qkv, head * head_dim, head_dim, cos, sin, positions[b], interleaved)
    return qkvs


@kernel
def store_and_attend(qkv, keys, values, pos, n_heads, n_kv, head_dim, scale, attended,
                     parallel):
    """One row: write its key and value at `pos` of its own cache (keys/values f32[n_kv,
    capacity, head_dim]) and attend over positions 0..pos into attended f32[n_heads * head_dim]."""
    q_size = n_heads * head_dim
    kv_size = n_kv * head_dim
    for kh in range(n_kv):
        for c in range(head_dim):
            keys[kh, pos, c] = qkv[q_size + kh * head_dim + c]
            values[kh, pos, c] = qkv[q_size + kv_size + kh * head_dim + c]
    if parallel:
        _attend_parallel(qkv, keys, values, pos + 1, n_heads, n_kv, head_dim, scale, attended)
    else:
        _attend_serial(qkv, keys, values, pos + 1, n_heads, n_kv, head_dim, scale, attended)


@kernel
def store_and_attend_rows(qkvs, keys, values, positions, n_heads, n_kv, head_dim, scale,
                          attended, parallel):
    """store_and_attend for rows that share one cache (a prompt's tokens, positions rising):
    row b, in order, writes its key and value, then attends over positions 0..positions[b],
    so it sees the rows before it, as it would token by token."""
    for b in range(qkvs.shape[0]):
        store_and_attend(qkvs[b], keys, values, positions[b], n_heads, n_kv, head_dim, scale,
                         attended[b], parallel)


@kernel
def block_rows_after_attention(xs, attended, out_w, mlp_norm, eps, gate_up_w, down_w, parallel):
    """The second half of a block for B rows, in place on xs f32[B, d]: output projection and
    residual, RMS norm, gate|up, SiLU * up, down and residual (one pass over each weight)."""
    rows, d = xs.shape
    projected = np.empty((rows, d), np.float32)
    project_rows(attended, out_w, projected, parallel)
    hs = np.empty((rows, d), np.float32)
    for b in range(rows):
        x = xs[b]
        p = projected[b]
        for j in range(d):
            x[j] += p[j]
        rms_norm_vector(x, mlp_norm, eps, hs[b])
    gate_up = np.empty((rows, weight_rows(gate_up_w)), np.float32)
    project_rows(hs, gate_up_w, gate_up, parallel)
    hidden = gate_up.shape[1] // 2
    act = np.empty((rows, hidden), np.float32)
    for b in range(rows):
        _silu_mul_halves(gate_up[b], hidden, act[b])
    project_rows(act, down_w, projected, parallel)
    for b in range(rows):
        x = xs[b]
        p = projected[b]
        for j in range(d):
            x[j] += p[j]


@kernel
def final_logits_rows(xs, norm, eps, head_w, logits, parallel):
    """logits[b] = W_head rms_norm(xs[b]), the head read once for all rows."""
    rows, d = xs.shape
    hs = np.empty((rows, d), np.float32)
    for b in range(rows):
        rms_norm_vector(xs[b], norm, eps, hs[b])
    project_rows(hs, head_w, logits, parallel)
