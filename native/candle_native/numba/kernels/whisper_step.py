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
vector accumulators (re-associated), softmax uses vector_math.softmax_weight (exp_f32, < 4e-7
relative; negligible weights as 0) and divides the weighted value sum once at the end, GELU is
vector_math.gelu_erf_f32; cross-attention groups its products differently (_cross_attend).
Weight rows are read once per step for all R rows; weight matrices may be f32 or f16 bits
(half.widen), or, under the compute type int8, qint8's int8 tuples for the six linear layers
(integer products of int8 activations, each row's bits independent of the others'; the
cross-attention's key/value weights stay f32 or f16: _cross_attend multiplies them by per-head
vectors, not by rows of activations).
"""

import numpy as np
from numba import njit, prange, types
from numba.extending import overload

from . import qint8
from ._jit import FAST_REDUCTIONS
from .half import widen
from .vector_math import (gelu_erf_f32, row_max, softmax_weight, vector_kernel,
                          vector_parallel_kernel)

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
        e = softmax_weight(scores[j] - peak)
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
def _fold_keys(q, k_w, k_b, first, stop, dh, folded, offsets):
    """For heads first..stop-1: folded[h] = W_kh^T q_h and offsets[h] = q_h . b_kh, so that the
    score of frame a is q_h . (W_kh a + b_kh) = folded[h] . a + offsets[h]."""
    d = q.size
    for h in range(first, stop):
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


@vector_kernel
def _score_quad(folded, offsets, features, scale, j, ha, hb, scores):
    """scores[h, j..j+3] for the heads h = ha and hb. Two heads and four frames per pass: each
    load of a feature feeds two multiply-adds and each load of `folded` four; the loop is bound
    by loads (one head per pass measured 1.35x slower, one head and one frame 1.9x)."""
    d = folded.shape[1]
    a0 = a1 = a2 = a3 = b0 = b1 = b2 = b3 = F(0.0)
    for i in range(d):
        fa = folded[ha, i]
        fb = folded[hb, i]
        x0 = features[j, i]
        x1 = features[j + 1, i]
        x2 = features[j + 2, i]
        x3 = features[j + 3, i]
        a0 += fa * x0
        a1 += fa * x1
        a2 += fa * x2
        a3 += fa * x3
        b0 += fb * x0
        b1 += fb * x1
        b2 += fb * x2
        b3 += fb * x3
    scores[ha, j] = (a0 + offsets[ha]) * scale
    scores[ha, j + 1] = (a1 + offsets[ha]) * scale
    scores[ha, j + 2] = (a2 + offsets[ha]) * scale
    scores[ha, j + 3] = (a3 + offsets[ha]) * scale
    scores[hb, j] = (b0 + offsets[hb]) * scale
    scores[hb, j + 1] = (b1 + offsets[hb]) * scale
    scores[hb, j + 2] = (b2 + offsets[hb]) * scale
    scores[hb, j + 3] = (b3 + offsets[hb]) * scale


@vector_kernel
def _gather_quad(scores, features, j, ha, hb, gathered):
    """gathered[h] += sum over frames j..j+3 of scores[h, frame] * features[frame] for the
    heads h = ha and hb (two rows, so that each feature load feeds both: 1.8x faster than a
    head at a time)."""
    d = gathered.shape[1]
    p0, p1, p2, p3 = scores[ha, j], scores[ha, j + 1], scores[ha, j + 2], scores[ha, j + 3]
    q0, q1, q2, q3 = scores[hb, j], scores[hb, j + 1], scores[hb, j + 2], scores[hb, j + 3]
    for i in range(d):
        x0 = features[j, i]
        x1 = features[j + 1, i]
        x2 = features[j + 2, i]
        x3 = features[j + 3, i]
        gathered[ha, i] += (p0 * x0 + p1 * x1) + (p2 * x2 + p3 * x3)
        gathered[hb, i] += (q0 * x0 + q1 * x1) + (q2 * x2 + q3 * x3)


@vector_kernel
def _attend_frames(folded, offsets, features, scale, start, stop, scores, peaks, totals, gathered):
    """Every head's attention over frames start..stop-1 alone: scores[h, j] (overwritten by
    exp(score - peak)), peaks[h] (the largest score), totals[h] = sum of the exps and
    gathered[h] = sum_j exp(score_j - peak) features[j]. A thread given a range of frames reads
    only those features, twice: 750 frames of 384 (1.15 MB) stay in its core's 2 MB L2 cache
    between the two passes (all 1500, 2.3 MB, do not). Heads go in pairs and frames in fours
    (_score_quad, _gather_quad); a last odd head and the last frames one at a time."""
    n_head, d = folded.shape
    quads = stop - (stop - start) % 4
    pairs = n_head - n_head % 2
    for j in range(start, quads, 4):
        for ha in range(0, pairs, 2):
            _score_quad(folded, offsets, features, scale, j, ha, ha + 1, scores)
    for h in range(n_head):
        first_single = start if h >= pairs else quads
        for j in range(first_single, stop):
            dot = F(0.0)
            for i in range(d):
                dot += folded[h, i] * features[j, i]
            scores[h, j] = (dot + offsets[h]) * scale
    for h in range(n_head):
        peak = row_max(scores[h, start:stop])
        total = F(0.0)
        for j in range(start, stop):
            e = softmax_weight(scores[h, j] - peak)
            scores[h, j] = e
            total += e
        peaks[h] = peak
        totals[h] = total
        for i in range(d):
            gathered[h, i] = F(0.0)
    for j in range(start, quads, 4):
        for ha in range(0, pairs, 2):
            _gather_quad(scores, features, j, ha, ha + 1, gathered)
    for h in range(n_head):
        first_single = start if h >= pairs else quads
        for j in range(first_single, stop):
            p = scores[h, j]
            for i in range(d):
                gathered[h, i] += p * features[j, i]


@vector_kernel
def _merge_frame_ranges(peaks, totals, gathered):
    """Fold the per-range results of _attend_frames (index 0 = the first range) into range 0,
    rescaled to the overall peak: afterwards gathered[0, h] / totals[0, h] is head h's
    softmax-weighted feature sum over all frames."""
    ranges, n_head, d = gathered.shape
    for h in range(n_head):
        peak = peaks[0, h]
        for t in range(1, ranges):
            peak = max(peak, peaks[t, h])
        weight = softmax_weight(peaks[0, h] - peak)
        totals[0, h] *= weight
        for i in range(d):
            gathered[0, h, i] *= weight
        for t in range(1, ranges):
            weight = softmax_weight(peaks[t, h] - peak)
            totals[0, h] += totals[t, h] * weight
            for i in range(d):
                gathered[0, h, i] += gathered[t, h, i] * weight


@vector_kernel
def _project_values(v_w, v_b, gathered, totals, dh, start, stop, out):
    """out[row] = W_v[row] . gathered[h] / totals[h] + b_v[row] for rows start..stop-1, h the
    row's head."""
    d = out.size
    for row in range(start, stop):
        h = row // dh
        acc = F(0.0)
        for i in range(d):
            acc += widen(v_w[row, i]) * gathered[h, i]
        out[row] = acc / totals[h] + v_b[row]


@vector_parallel_kernel
def _cross_attend_parallel(q, k_w, k_b, v_w, v_b, features, n_head, scale,
                           folded, offsets, scores, peaks, totals, gathered, out):
    """_cross_attend on numba's threads: the key fold by heads, the frames in one contiguous
    range per row of `peaks`, the value projection by heads; three parallel regions."""
    dh = q.size // n_head
    for h in prange(n_head):
        _fold_keys(q, k_w, k_b, h, h + 1, dh, folded, offsets)
    ranges = peaks.shape[0]
    n_audio = features.shape[0]
    for t in prange(ranges):
        _attend_frames(folded, offsets, features, scale, t * n_audio // ranges,
                       (t + 1) * n_audio // ranges, scores, peaks[t], totals[t], gathered[t])
    _merge_frame_ranges(peaks, totals, gathered)
    for h in prange(n_head):
        _project_values(v_w, v_b, gathered[0], totals[0], dh, h * dh, (h + 1) * dh, out)


@vector_kernel
def _cross_attend(q, k_w, k_b, v_w, v_b, features, n_head, scale,
                  folded, offsets, scores, peaks, totals, gathered, out):
    """out [d] = cross-attention of q [d] (n_head heads) over the keys W_k a + b_k and values
    W_v a + b_v of the audio features a = features[j] [n_audio, d], never forming the keys and
    values: per head h, q_h . (W_kh a + b_kh) = (W_kh^T q_h) . a + q_h . b_kh, and
    sum_j p_j (W_vh a_j + b_vh) / sum_j p_j = W_vh (sum_j p_j a_j) / sum_j p_j + b_vh.
    Why: the projected keys and values of 1500 frames are 4.6 MB per block read from DRAM every
    step (and 3.5 GFLOP to project per window); the features are 2.3 MB shared by all blocks.
    With more than one row of `peaks` ([ranges, n_head]) the work goes to numba's threads
    (_cross_attend_parallel): the frames split into that many ranges, merged as in flash
    attention (_merge_frame_ranges).
    Same f32 arithmetic re-associated (the products are grouped differently)."""
    if peaks.shape[0] > 1:
        _cross_attend_parallel(q, k_w, k_b, v_w, v_b, features, n_head, scale,
                               folded, offsets, scores, peaks, totals, gathered, out)
        return
    dh = q.size // n_head
    _fold_keys(q, k_w, k_b, 0, n_head, dh, folded, offsets)
    _attend_frames(folded, offsets, features, scale, 0, features.shape[0], scores,
                   peaks[0], totals[0], gathered[0])
    _project_values(v_w, v_b, gathered[0], totals[0], dh, 0, q.size, out)


# Output rows per parallel work item of the block's matrix-vector products: the smallest (384 rows
# on tiny) still splits into 6 items for two threads, and a chunk of f16 rows (48 KB) is far
# larger than a work item's scheduling cost.
BLOCK_ROW_CHUNK = 64


@vector_parallel_kernel
def _affine_rows_parallel(weight, bias, xs, out):
    """affine_rows split over numba's threads in chunks of output rows."""
    n = weight.shape[0]
    for chunk in prange((n + BLOCK_ROW_CHUNK - 1) // BLOCK_ROW_CHUNK):
        start = chunk * BLOCK_ROW_CHUNK
        stop = min(n, start + BLOCK_ROW_CHUNK)
        affine_rows(weight[start:stop], bias[start:stop], xs, out[:, start:stop])


def _affine(weight, bias, xs, out, threads):
    """out[r] = weight @ xs[r] + bias for every row r, on `threads` > 1 split over numba's
    threads; weight f32, f16 bits, or int8 (qint8's tuple: the compute type int8, integer
    products after quantizing xs's rows, each row's bits its own). Kernels only: the overload
    below picks the implementation from the weight's numba type."""
    raise NotImplementedError("whisper_step._affine runs inside numba kernels only")


@overload(_affine, jit_options={"fastmath": FAST_REDUCTIONS, "nogil": True,
                                "error_model": "numpy"})
def _affine_for_type(weight, bias, xs, out, threads):
    if isinstance(weight, types.Array):
        def float_affine(weight, bias, xs, out, threads):
            if threads > 1:
                _affine_rows_parallel(weight, bias, xs, out)
            else:
                affine_rows(weight, bias, xs, out)
        return float_affine

    def int8_affine(weight, bias, xs, out, threads):
        qint8.rows(xs, weight, out, threads > 1)
        for r in range(xs.shape[0]):
            for i in range(bias.size):
                out[r, i] += bias[i]
    return int8_affine


@vector_kernel
def whisper_block_step(x, pos, n_head, eps,
                       ln1_w, ln1_b, qkv_w, qkv_b, out_w, out_b, self_k, self_v,
                       ln2_w, ln2_b, cq_w, cq_b, ck_w, ck_b, cv_w, cv_b, features, co_w, co_b,
                       ln3_w, ln3_b, fc1_w, fc1_b, fc2_w, fc2_b, threads):
    """x [R, d] in place; self_k/self_v [R, h, capacity, dh] get position `pos` written;
    features [1 or R, n_audio, d] are the audio features the cross-attention keys (ck_w, ck_b)
    and values (cv_w, cv_b) are projected from (see _cross_attend).
    `threads` > 1 (numba's thread count) splits the matrix-vector products (by output rows)
    and the cross-attention (by audio frames) over numba's threads; self-attention over at most 448
    cached positions stays on the calling thread. The count is passed in, not read here:
    numba.get_num_threads() inside a kernel stops numba from caching its machine code."""
    rows, d = x.shape
    dh = d // n_head
    scale = F(1.0) / np.sqrt(F(dh))
    h = np.empty((rows, d), np.float32)
    heads = np.empty((rows, d), np.float32)
    delta = np.empty((rows, d), np.float32)
    qkv = np.empty((rows, 3 * d), np.float32)
    hidden = np.empty((rows, fc1_b.size), np.float32)
    n_audio = features.shape[1]
    scores = np.empty(pos + 1, np.float32)
    folded = np.empty((n_head, d), np.float32)
    offsets = np.empty(n_head, np.float32)
    cross_scores = np.empty((n_head, n_audio), np.float32)
    ranges = min(threads, n_audio // 4) if threads > 1 else 1
    peaks = np.empty((ranges, n_head), np.float32)
    totals = np.empty((ranges, n_head), np.float32)
    gathered = np.empty((ranges, n_head, d), np.float32)
    # self-attention over the cache
    for r in range(rows):
        layer_norm_row(x[r], ln1_w, ln1_b, eps, h[r])
    _affine(qkv_w, qkv_b, h, qkv, threads)
    for r in range(rows):
        for head in range(n_head):
            for c in range(dh):
                self_k[r, head, pos, c] = qkv[r, d + head * dh + c]
                self_v[r, head, pos, c] = qkv[r, 2 * d + head * dh + c]
            _attend_head(qkv[r, head * dh:(head + 1) * dh], self_k[r, head], self_v[r, head],
                         pos + 1, scale, scores, heads[r, head * dh:(head + 1) * dh])
    _affine(out_w, out_b, heads, delta, threads)
    for r in range(rows):
        for j in range(d):
            x[r, j] += delta[r, j]
    # cross-attention over the audio features' keys and values
    for r in range(rows):
        layer_norm_row(x[r], ln2_w, ln2_b, eps, h[r])
    _affine(cq_w, cq_b, h, qkv[:, :d], threads)
    for r in range(rows):
        audio = features[r if features.shape[0] > 1 else 0]
        _cross_attend(qkv[r, :d], ck_w, ck_b, cv_w, cv_b, audio, n_head, scale,
                      folded, offsets, cross_scores, peaks, totals, gathered, heads[r])
    _affine(co_w, co_b, heads, delta, threads)
    for r in range(rows):
        for j in range(d):
            x[r, j] += delta[r, j]
    # MLP
    for r in range(rows):
        layer_norm_row(x[r], ln3_w, ln3_b, eps, h[r])
    _affine(fc1_w, fc1_b, h, hidden, threads)
    for r in range(rows):
        for j in range(hidden.shape[1]):
            hidden[r, j] = gelu_erf_f32(hidden[r, j])
    _affine(fc2_w, fc2_b, hidden, delta, threads)
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

