"""One Whisper decoder block for one new token per sequence, fused into a single numba call.

Through the generic tensor path a decode step costs ~60 tensor ops per block (norms, linears as
matmul + bias + reshapes, head splits, cache append, two attentions, GELU, residual adds); on
whisper tiny (4 blocks) that dispatch overhead, and a thread hand-off per BLAS call, cost more
than the arithmetic. Here a block is, for each of the R rows (1 greedy, beam size in a beam
search) and all on the calling thread (no thread joins: on an oversubscribed machine each join
can wait a scheduler time slice):

    h = LN(x); qkv = W_qkv h + b; cache[pos] = k, v; x += W_o attend(q, cache[0..pos]) + b_o
    h = LN(x); q = W_q h + b_q; x += W_co attend(q, W_ck A + b_ck, W_cv A + b_cv) + b_co  (A: audio)
    h = LN(x); x += W_2 gelu(W_1 h + b_1) + b_2

Same f32 arithmetic as the generic path up to summation order: matrix-vector products keep
vector accumulators (re-associated), softmax uses vector_math.exp_f32 (< 4e-7 relative) and
divides the weighted value sum once at the end, GELU is vector_math.gelu_erf_f32; cross-attention
groups its products differently (_cross_attend_features). Weight rows are read once per step for
all R rows; weight matrices may be f32 or f16 bits (half.widen).
"""

import numpy as np
from numba import njit, prange

from ._jit import FAST_REDUCTIONS
from .half import widen
from .vector_math import exp_f32, gelu_erf_f32, vector_kernel

F = np.float32
FRAMES_PER_PASS = 4  # audio frames per pass of the cross-attention loops (register blocking)


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
def project_rows(weight, xs, out):
    """out[r] = weight @ xs[r] for every row r; weight [n, k] (f32, or f16 bits: see half.py)
    is read once. Alone it is the tied vocabulary projection (no bias)."""
    n, k = weight.shape
    rows = xs.shape[0]
    for i in range(n):
        for r in range(rows):
            acc = F(0.0)
            for j in range(k):
                acc += widen(weight[i, j]) * xs[r, j]
            out[r, i] = acc


@vector_kernel
def affine_rows(weight, bias, xs, out):
    """out[r] = weight @ xs[r] + bias for every row r."""
    project_rows(weight, xs, out)
    for r in range(xs.shape[0]):
        for i in range(weight.shape[0]):
            out[r, i] += bias[i]


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
def _cross_attend_features(q, k_w, k_b, v_w, v_b, features, n_head, scale,
                           folded, offsets, scores, gathered, out):
    """out [d] = cross-attention of q [d] (n_head heads) over the keys W_k a + b_k and values
    W_v a + b_v of the audio features a = features[j] [n_audio, d], never forming the keys and
    values: per head h, q_h . (W_kh a + b_kh) = (W_kh^T q_h) . a + q_h . b_kh, and
    sum_j p_j (W_vh a_j + b_vh) / sum_j p_j = W_vh (sum_j p_j a_j) / sum_j p_j + b_vh.
    Why: the projected keys and values of 1500 frames are 4.6 MB per block read from DRAM every
    step (and 3.5 GFLOP to project per window); the features are 2.3 MB shared by all blocks.
    Same f32 arithmetic re-associated (the products are grouped differently)."""
    d = q.size
    dh = d // n_head
    n_audio = features.shape[0]
    for h in range(n_head):
        for i in range(d):
            folded[h, i] = F(0.0)
        offset = F(0.0)
        for c in range(dh):
            row = h * dh + c
            qc = q[row]
            offset += qc * k_b[row]
            for i in range(d):
                folded[h, i] += qc * widen(k_w[row, i])
        offsets[h] = offset
    # Four frames per pass: each load of `folded` feeds four multiply-adds (one per frame), or
    # the loop is bound by loads (measured 1.4x slower with one frame per pass).
    quads = n_audio - n_audio % FRAMES_PER_PASS
    for j in range(0, quads, FRAMES_PER_PASS):
        for h in range(n_head):
            dot0 = dot1 = dot2 = dot3 = F(0.0)
            for i in range(d):
                f = folded[h, i]
                dot0 += f * features[j, i]
                dot1 += f * features[j + 1, i]
                dot2 += f * features[j + 2, i]
                dot3 += f * features[j + 3, i]
            scores[h, j] = (dot0 + offsets[h]) * scale
            scores[h, j + 1] = (dot1 + offsets[h]) * scale
            scores[h, j + 2] = (dot2 + offsets[h]) * scale
            scores[h, j + 3] = (dot3 + offsets[h]) * scale
    for j in range(quads, n_audio):
        for h in range(n_head):
            dot = F(0.0)
            for i in range(d):
                dot += folded[h, i] * features[j, i]
            scores[h, j] = (dot + offsets[h]) * scale
    for h in range(n_head):
        peak = F(-np.inf)
        for j in range(n_audio):
            peak = max(peak, scores[h, j])
        total = F(0.0)
        for j in range(n_audio):
            e = exp_f32(scores[h, j] - peak)
            scores[h, j] = e
            total += e
        offsets[h] = F(1.0) / total
        for i in range(d):
            gathered[h, i] = F(0.0)
    for j in range(0, quads, FRAMES_PER_PASS):
        for h in range(n_head):
            p0, p1, p2, p3 = scores[h, j], scores[h, j + 1], scores[h, j + 2], scores[h, j + 3]
            for i in range(d):
                gathered[h, i] += (p0 * features[j, i] + p1 * features[j + 1, i]
                                   + p2 * features[j + 2, i] + p3 * features[j + 3, i])
    for j in range(quads, n_audio):
        for h in range(n_head):
            p = scores[h, j]
            for i in range(d):
                gathered[h, i] += p * features[j, i]
    for h in range(n_head):
        inv = offsets[h]
        for c in range(dh):
            row = h * dh + c
            acc = F(0.0)
            for i in range(d):
                acc += widen(v_w[row, i]) * gathered[h, i]
            out[row] = acc * inv + v_b[row]


@vector_kernel
def whisper_block_step(x, pos, n_head, eps,
                       ln1_w, ln1_b, qkv_w, qkv_b, out_w, out_b, self_k, self_v,
                       ln2_w, ln2_b, cq_w, cq_b, ck_w, ck_b, cv_w, cv_b, features, co_w, co_b,
                       ln3_w, ln3_b, fc1_w, fc1_b, fc2_w, fc2_b):
    """x [R, d] in place; self_k/self_v [R, h, capacity, dh] get position `pos` written;
    features [1 or R, n_audio, d] are the audio features the cross-attention keys (ck_w, ck_b)
    and values (cv_w, cv_b) are projected from (see _cross_attend_features)."""
    rows, d = x.shape
    dh = d // n_head
    scale = F(1.0) / np.sqrt(F(dh))
    h = np.empty((rows, d), np.float32)
    heads = np.empty((rows, d), np.float32)
    delta = np.empty((rows, d), np.float32)
    qkv = np.empty((rows, 3 * d), np.float32)
    hidden = np.empty((rows, fc1_w.shape[0]), np.float32)
    n_audio = features.shape[1]
    scores = np.empty(pos + 1, np.float32)
    folded = np.empty((n_head, d), np.float32)
    offsets = np.empty(n_head, np.float32)
    cross_scores = np.empty((n_head, n_audio), np.float32)
    gathered = np.empty((n_head, d), np.float32)
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
    for r in range(rows):
        audio = features[r if features.shape[0] > 1 else 0]
        _cross_attend_features(qkv[r, :d], ck_w, ck_b, cv_w, cv_b, audio, n_head, scale,
                               folded, offsets, cross_scores, gathered, heads[r])
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


# Vocabulary rows per parallel work item: 51864 rows split into ~25 items, enough for two threads
# to balance when one of them is preempted, few enough that scheduling costs nothing.
VOCAB_CHUNK = 2048


@njit(cache=True, fastmath=FAST_REDUCTIONS, nogil=True, error_model="numpy", parallel=True)
def whisper_logits_step_parallel(x, ln_w, ln_b, eps, embedding, logits):
    """logits [R, vocab] = embedding @ LN(x[r]), the vocabulary projection (the largest read of a
    decode step) split over numba's threads: one thread alone reads DRAM at a fraction of the
    bandwidth (here ~6 of ~13 GB/s)."""
    rows, d = x.shape
    h = np.empty((rows, d), np.float32)
    for r in range(rows):
        layer_norm_row(x[r], ln_w, ln_b, eps, h[r])
    vocab = embedding.shape[0]
    for chunk in prange((vocab + VOCAB_CHUNK - 1) // VOCAB_CHUNK):
        start = chunk * VOCAB_CHUNK
        stop = min(vocab, start + VOCAB_CHUNK)
        project_rows(embedding[start:stop], h, logits[:, start:stop])
