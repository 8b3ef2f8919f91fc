"""One Whisper decoder block for one new token per sequence, fused into a single numba call.

Through the generic tensor path a decode step costs ~60 tensor ops per block (norms, linears as
matmul + bias + reshapes, head splits, cache append, two attentions, GELU, residual adds); on
whisper tiny (4 blocks) that dispatch overhead, and a thread hand-off per BLAS call, cost more
than the arithmetic. Here a block is, for each of the R rows (1 greedy, beam size in a beam
search) and all on the calling thread (no thread joins: on an oversubscribed machine each join
can wait a scheduler time slice):

    h = LN(x); qkv = W_qkv h + b; cache[pos] = k, v; x += W_o attend(q, cache[0..pos]) + b_o
    h = LN(x); q = W_q h + b_q; x += W_co attend(q, cross k, cross v) + b_co
    h = LN(x); x += W_2 gelu(W_1 h + b_1) + b_2

Same f32 arithmetic as the generic path up to summation order: matrix-vector products keep
vector accumulators (re-associated), softmax uses vector_math.exp_f32 (< 4e-7 relative) and
divides the weighted value sum once at the end, GELU is vector_math.gelu_erf_f32. Weight rows
are read once per step for all R rows.
"""

import numpy as np

from .vector_math import exp_f32, gelu_erf_f32, vector_kernel

F = np.float32


@vector_kernel
def layer_norm_row(x, weight, bias, eps, out):
    n = x.size
    total = F(0.0)
    for j in range(n):
        total += x[j]
    mean = total / F(n)
    sq = F(0.0)
    for j in range(n):
        c = x[j] - mean
        sq += c * c
    inv = F(1.0) / np.sqrt(sq / F(n) + eps)
    for j in range(n):
        out[j] = (x[j] - mean) * inv * weight[j] + bias[j]


@vector_kernel
def affine_rows(weight, bias, xs, out):
    """out[r] = weight @ xs[r] + bias for every row r; weight [n, k] is read once."""
    n, k = weight.shape
    rows = xs.shape[0]
    for i in range(n):
        for r in range(rows):
            acc = F(0.0)
            for j in range(k):
                acc += weight[i, j] * xs[r, j]
            out[r, i] = acc + bias[i]


@vector_kernel
def project_rows(weight, xs, out):
    """out[r] = weight @ xs[r] (no bias): the tied vocabulary projection."""
    n, k = weight.shape
    rows = xs.shape[0]
    for i in range(n):
        for r in range(rows):
            acc = F(0.0)
            for j in range(k):
                acc += weight[i, j] * xs[r, j]
            out[r, i] = acc


@vector_kernel
def _attend_head(q, keys, values, length, scale, scores, out):
    """out = softmax(keys[:length] q * scale) @ values[:length] for one head."""
    dh = q.size
    peak = F(-np.inf)
    for j in range(length):
        dot = F(0.0)
        for c in range(dh):
            dot += q[c] * keys[j, c]
        s = dot * scale
        scores[j] = s
        peak = max(peak, s)
    total = F(0.0)
    for j in range(length):
        e = exp_f32(scores[j] - peak)
        scores[j] = e
        total += e
    for c in range(dh):
        out[c] = F(0.0)
    for j in range(length):
        p = scores[j]
        for c in range(dh):
            out[c] += p * values[j, c]
    inv = F(1.0) / total
    for c in range(dh):
        out[c] *= inv


@vector_kernel
def whisper_block_step(x, pos, n_head, eps,
                       ln1_w, ln1_b, qkv_w, qkv_b, out_w, out_b, self_k, self_v,
                       ln2_w, ln2_b, cq_w, cq_b, cross_k, cross_v, co_w, co_b,
                       ln3_w, ln3_b, fc1_w, fc1_b, fc2_w, fc2_b):
    """x [R, d] in place; self_k/self_v [R, h, capacity, dh] get position `pos` written;
    cross_k/cross_v [1 or R, h, n_audio, dh]."""
    rows, d = x.shape
    dh = d // n_head
    scale = F(1.0) / np.sqrt(F(dh))
    h = np.empty((rows, d), np.float32)
    heads = np.empty((rows, d), np.float32)
    delta = np.empty((rows, d), np.float32)
    qkv = np.empty((rows, 3 * d), np.float32)
    hidden = np.empty((rows, fc1_w.shape[0]), np.float32)
    scores = np.empty(max(pos + 1, cross_k.shape[2]), np.float32)
    # self-attention over the cache
    for r in range(rows):
        layer_norm_row(x[r], ln1_w, ln1_b, eps, h[r])
    affine_rows(qkv_w, qkv_b, h, qkv)
    for r in range(rows):
        for head in range(n_head):
            for c in range(dh):
                self_k[r, head, pos, c] = qkv[r, d + head * dh + c]
                self_v[r, head, pos, c] = qkv[r, 2 * d + head * dh + c]
            _attend_head(qkv[r, head * dh:(head + 1) * dh], self_k[r, head], self_v[r, head],
                         pos + 1, scale, scores, heads[r, head * dh:(head + 1) * dh])
    affine_rows(out_w, out_b, heads, delta)
    for r in range(rows):
        for j in range(d):
            x[r, j] += delta[r, j]
    # cross-attention over the audio features' keys and values
    for r in range(rows):
        layer_norm_row(x[r], ln2_w, ln2_b, eps, h[r])
    affine_rows(cq_w, cq_b, h, qkv[:, :d])
    n_audio = cross_k.shape[2]
    for r in range(rows):
        rk = r if cross_k.shape[0] > 1 else 0
        for head in range(n_head):
            _attend_head(qkv[r, head * dh:(head + 1) * dh], cross_k[rk, head], cross_v[rk, head],
                         n_audio, scale, scores, heads[r, head * dh:(head + 1) * dh])
    affine_rows(co_w, co_b, heads, delta)
    for r in range(rows):
        for j in range(d):
            x[r, j] += delta[r, j]
    # MLP
    for r in range(rows):
        layer_norm_row(x[r], ln3_w, ln3_b, eps, h[r])
    affine_rows(fc1_w, fc1_b, h, hidden)
    for r in range(rows):
        for j in range(hidden.shape[1]):
            hidden[r, j] = gelu_erf_f32(hidden[r, j])
    affine_rows(fc2_w, fc2_b, hidden, delta)
    for r in range(rows):
        for j in range(d):
            x[r, j] += delta[r, j]


@vector_kernel
def whisper_logits_step(x, ln_w, ln_b, eps, embedding, logits):
    """logits [R, vocab] = embedding @ LN(x[r])."""
    rows, d = x.shape
    h = np.empty((rows, d), np.float32)
    for r in range(rows):
        layer_norm_row(x[r], ln_w, ln_b, eps, h[r])
    project_rows(embedding, h, logits)
