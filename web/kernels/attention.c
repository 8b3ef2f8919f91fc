/* Attention: O = softmax(Q K^T * scale + MASK) V, one head (of bh) at a time, blocked so that
 * the tq x tk score matrix never exists (Whisper's encoder: 1500 x 1500 per head).
 *
 * Query rows go in blocks of up to ATT_QB; keys in blocks of kb (256 for a full query block,
 * up to 1024 for decode rows). Per key block: scores S = Q_blk K_blk^T (dot products, 4 query
 * rows x 2 keys or 1 row x 4 keys at a time), scaled, masked; then the online softmax: the
 * running row maximum m, the sum l and the output accumulator are rescaled by
 * exp(m_old - m_new) whenever the maximum grows; then O_acc += exp(S - m) V_blk (4 rows x 8
 * columns or 1 row x 32 columns of registers). At the end O = O_acc / l.
 *
 * Semantics as numpy's softmax: the scale multiplies the finished dot product, the mask is
 * added after; -inf scores weigh 0; a row whose scores are all -inf gives NaN (0 / 0); +inf or
 * NaN scores give NaN rows. Every key's V row is multiplied by its weight, zero or not, so NaN
 * or inf in V propagate as in numpy's matmul. Scratch: S, O_acc, m and l (~100 KB).
 */
#include "kernels.h"

#define ATT_QB 32
#define ATT_S_FLOATS 8192
#define ATT_KB_MAX 1024
#define ATT_OACC_FLOATS 16384 /* ATT_QB x d for d <= 512; fewer rows for larger d */
#define ATT_SCRATCH_S 0
#define ATT_SCRATCH_OACC (ATT_SCRATCH_S + ATT_S_FLOATS * 4)
#define ATT_SCRATCH_M (ATT_SCRATCH_OACC + ATT_OACC_FLOATS * 4)
#define ATT_SCRATCH_L (ATT_SCRATCH_M + ATT_QB * 4)

#define NEG_INF (-__builtin_inff())

/* Scalar tail of a dot product (d % 4 elements). */
INLINE float dot_tail(const float *a, const float *b, int from, int d) {
    float s = 0.0f;
    for (int i = from; i < d; i++) s += a[i] * b[i];
    return s;
}

/* S[r, j] = (q_r . k_j) * scale + mask[r, j] for r < rows, j < cols (S row stride ldS). */
static void scores(int rows, int cols, int d, const float *Q, const float *Kb, float scale,
                   const float *mask, int mask_rs, float *S, int ldS) {
    const int d4 = d & ~3;
    const f32x4 sc = F4(scale);
    int r = 0;
    for (; r + 4 <= rows; r += 4) {
        const float *q0 = Q + r * d, *q1 = q0 + d, *q2 = q1 + d, *q3 = q2 + d;
        int j = 0;
        for (; j + 2 <= cols; j += 2) {
            const float *k0 = Kb + j * d, *k1 = k0 + d;
            f32x4 a00 = F4(0), a01 = F4(0), a10 = F4(0), a11 = F4(0);
            f32x4 a20 = F4(0), a21 = F4(0), a30 = F4(0), a31 = F4(0);
            for (int i = 0; i < d4; i += 4) {
                f32x4 kv0 = LOAD(k0 + i), kv1 = LOAD(k1 + i);
                f32x4 qv = LOAD(q0 + i);
                a00 = FMA(qv, kv0, a00); a01 = FMA(qv, kv1, a01);
                qv = LOAD(q1 + i);
                a10 = FMA(qv, kv0, a10); a11 = FMA(qv, kv1, a11);
                qv = LOAD(q2 + i);
                a20 = FMA(qv, kv0, a20); a21 = FMA(qv, kv1, a21);
                qv = LOAD(q3 + i);
                a30 = FMA(qv, kv0, a30); a31 = FMA(qv, kv1, a31);
            }
            /* (S[r][j], S[r][j+1], S[r+1][j], S[r+1][j+1]) and rows r+2, r+3 */
            f32x4 s01 = hsum4(a00, a01, a10, a11), s23 = hsum4(a20, a21, a30, a31);
            if (d4 < d) {
                s01 = wasm_f32x4_add(s01, wasm_f32x4_make(
                    dot_tail(q0, k0, d4, d), dot_tail(q0, k1, d4, d),
                    dot_tail(q1, k0, d4, d), dot_tail(q1, k1, d4, d)));
                s23 = wasm_f32x4_add(s23, wasm_f32x4_make(
                    dot_tail(q2, k0, d4, d), dot_tail(q2, k1, d4, d),
                    dot_tail(q3, k0, d4, d), dot_tail(q3, k1, d4, d)));
            }
            s01 = wasm_f32x4_mul(s01, sc);
            s23 = wasm_f32x4_mul(s23, sc);
            if (mask) {
                const float *mr = mask + r * mask_rs + j;
                v128_t m01 = wasm_v128_load64_lane(mr + mask_rs, wasm_v128_load64_zero(mr), 1);
                v128_t m23 = wasm_v128_load64_lane(mr + 3 * mask_rs,
                                                   wasm_v128_load64_zero(mr + 2 * mask_rs), 1);
                s01 = wasm_f32x4_add(s01, m01);
                s23 = wasm_f32x4_add(s23, m23);
            }
            float *sr = S + r * ldS + j;
            wasm_v128_store64_lane(sr, s01, 0);
            wasm_v128_store64_lane(sr + ldS, s01, 1);
            wasm_v128_store64_lane(sr + 2 * ldS, s23, 0);
            wasm_v128_store64_lane(sr + 3 * ldS, s23, 1);
        }
        for (; j < cols; j++) {
            const float *k0 = Kb + j * d;
            for (int rr = 0; rr < 4; rr++) {
                const float *q = Q + (r + rr) * d;
                f32x4 a = F4(0);
                for (int i = 0; i < d4; i += 4) a = FMA(LOAD(q + i), LOAD(k0 + i), a);
                float s = (hsum(a) + dot_tail(q, k0, d4, d)) * scale;
                if (mask) s += mask[(r + rr) * mask_rs + j];
                S[(r + rr) * ldS + j] = s;
            }
        }
    }
    for (; r < rows; r++) {
        const float *q = Q + r * d;
        const float *mr = mask ? mask + r * mask_rs : 0;
        float *sr = S + r * ldS;
        int j = 0;
        for (; j + 4 <= cols; j += 4) {
            const float *k0 = Kb + j * d, *k1 = k0 + d, *k2 = k1 + d, *k3 = k2 + d;
            f32x4 a0 = F4(0), a1 = F4(0), a2 = F4(0), a3 = F4(0);
            for (int i = 0; i < d4; i += 4) {
                f32x4 qv = LOAD(q + i);
                a0 = FMA(qv, LOAD(k0 + i), a0);
                a1 = FMA(qv, LOAD(k1 + i), a1);
                a2 = FMA(qv, LOAD(k2 + i), a2);
                a3 = FMA(qv, LOAD(k3 + i), a3);
            }
            f32x4 s = hsum4(a0, a1, a2, a3);
            if (d4 < d)
                s = wasm_f32x4_add(s, wasm_f32x4_make(dot_tail(q, k0, d4, d), dot_tail(q, k1, d4, d),
                                                      dot_tail(q, k2, d4, d), dot_tail(q, k3, d4, d)));
            s = wasm_f32x4_mul(s, sc);
            if (mr) s = wasm_f32x4_add(s, LOAD(mr + j));
            STORE(sr + j, s);
        }
        for (; j < cols; j++) {
            const float *k0 = Kb + j * d;
            f32x4 a = F4(0);
            for (int i = 0; i < d4; i += 4) a = FMA(LOAD(q + i), LOAD(k0 + i), a);
            float s = (hsum(a) + dot_tail(q, k0, d4, d)) * scale;
            if (mr) s += mr[j];
            sr[j] = s;
        }
    }
}

/* One row's online-softmax step over a block of scores: weights exp(s - m) written over the
 * scores; returns the factor the row's previous sum and accumulator must be multiplied by. */
static float softmax_block(int cols, float *s, float *m, float *l) {
    f32x4 bm = F4(NEG_INF);
    int j = 0;
    for (; j + 4 <= cols; j += 4) bm = wasm_f32x4_max(bm, LOAD(s + j));
    if (j < cols) bm = wasm_f32x4_max(bm, load_partial(s + j, cols - j, NEG_INF));
    float m_old = *m, m_new = nan_max(m_old, hmax(bm));
    /* all -inf so far: shift by 0, so exp(-inf - 0) = 0 rather than exp(-inf + inf) = NaN */
    float shift = m_new == NEG_INF ? 0.0f : m_new;
    float alpha = sexp(m_old - shift);
    f32x4 sv = F4(shift), sum0 = F4(0), sum1 = F4(0);
    j = 0;
    for (; j + 8 <= cols; j += 8) {
        f32x4 p0 = vexp(wasm_f32x4_sub(LOAD(s + j), sv));
        f32x4 p1 = vexp(wasm_f32x4_sub(LOAD(s + j + 4), sv));
        STORE(s + j, p0);
        STORE(s + j + 4, p1);
        sum0 = wasm_f32x4_add(sum0, p0);
        sum1 = wasm_f32x4_add(sum1, p1);
    }
    for (; j + 4 <= cols; j += 4) {
        f32x4 p = vexp(wasm_f32x4_sub(LOAD(s + j), sv));
        STORE(s + j, p);
        sum0 = wasm_f32x4_add(sum0, p);
    }
    if (j < cols) {
        f32x4 p = keep_low_lanes(vexp(wasm_f32x4_sub(load_partial(s + j, cols - j, 0.0f), sv)), cols - j);
        store_partial(s + j, cols - j, p);
        sum1 = wasm_f32x4_add(sum1, p);
    }
    *m = m_new;
    *l = *l * alpha + hsum(wasm_f32x4_add(sum0, sum1));
    return alpha;
}

/* O_acc[r, :] += sum_j P[r, j] V[j, :] for r < rows, j < cols (O_acc row stride d). */
static void weighted_values(int rows, int cols, int d, const float *P, int ldP, const float *Vb,
                            float *Oacc) {
    int r = 0;
    for (; r + 4 <= rows; r += 4) {
        const float *p0 = P + r * ldP, *p1 = p0 + ldP, *p2 = p1 + ldP, *p3 = p2 + ldP;
        float *o0 = Oacc + r * d, *o1 = o0 + d, *o2 = o1 + d, *o3 = o2 + d;
        int c = 0;
        for (; c + 8 <= d; c += 8) {
            f32x4 a00 = LOAD(o0 + c), a01 = LOAD(o0 + c + 4), a10 = LOAD(o1 + c), a11 = LOAD(o1 + c + 4);
            f32x4 a20 = LOAD(o2 + c), a21 = LOAD(o2 + c + 4), a30 = LOAD(o3 + c), a31 = LOAD(o3 + c + 4);
            const float *v = Vb + c;
            for (int j = 0; j < cols; j++, v += d) {
                f32x4 v0 = LOAD(v), v1 = LOAD(v + 4);
                f32x4 p = SPLAT_LOAD(p0 + j);
                a00 = FMA(p, v0, a00); a01 = FMA(p, v1, a01);
                p = SPLAT_LOAD(p1 + j);
                a10 = FMA(p, v0, a10); a11 = FMA(p, v1, a11);
                p = SPLAT_LOAD(p2 + j);
                a20 = FMA(p, v0, a20); a21 = FMA(p, v1, a21);
                p = SPLAT_LOAD(p3 + j);
                a30 = FMA(p, v0, a30); a31 = FMA(p, v1, a31);
            }
            STORE(o0 + c, a00); STORE(o0 + c + 4, a01); STORE(o1 + c, a10); STORE(o1 + c + 4, a11);
            STORE(o2 + c, a20); STORE(o2 + c + 4, a21); STORE(o3 + c, a30); STORE(o3 + c + 4, a31);
        }
        for (; c + 4 <= d; c += 4) {
            f32x4 a0 = LOAD(o0 + c), a1 = LOAD(o1 + c), a2 = LOAD(o2 + c), a3 = LOAD(o3 + c);
            const float *v = Vb + c;
            for (int j = 0; j < cols; j++, v += d) {
                f32x4 vv = LOAD(v);
                a0 = FMA(SPLAT_LOAD(p0 + j), vv, a0);
                a1 = FMA(SPLAT_LOAD(p1 + j), vv, a1);
                a2 = FMA(SPLAT_LOAD(p2 + j), vv, a2);
                a3 = FMA(SPLAT_LOAD(p3 + j), vv, a3);
            }
            STORE(o0 + c, a0); STORE(o1 + c, a1); STORE(o2 + c, a2); STORE(o3 + c, a3);
        }
        for (; c < d; c++)
            for (int j = 0; j < cols; j++) {
                float v = Vb[j * d + c];
                o0[c] += p0[j] * v; o1[c] += p1[j] * v; o2[c] += p2[j] * v; o3[c] += p3[j] * v;
            }
    }
    for (; r < rows; r++) {
        const float *p = P + r * ldP;
        float *o = Oacc + r * d;
        int c = 0;
        for (; c + 32 <= d; c += 32) {
            f32x4 a0 = LOAD(o + c), a1 = LOAD(o + c + 4), a2 = LOAD(o + c + 8), a3 = LOAD(o + c + 12);
            f32x4 a4 = LOAD(o + c + 16), a5 = LOAD(o + c + 20), a6 = LOAD(o + c + 24), a7 = LOAD(o + c + 28);
            const float *v = Vb + c;
            for (int j = 0; j < cols; j++, v += d) {
                f32x4 pj = SPLAT_LOAD(p + j);
                a0 = FMA(pj, LOAD(v), a0); a1 = FMA(pj, LOAD(v + 4), a1);
                a2 = FMA(pj, LOAD(v + 8), a2); a3 = FMA(pj, LOAD(v + 12), a3);
                a4 = FMA(pj, LOAD(v + 16), a4); a5 = FMA(pj, LOAD(v + 20), a5);
                a6 = FMA(pj, LOAD(v + 24), a6); a7 = FMA(pj, LOAD(v + 28), a7);
            }
            STORE(o + c, a0); STORE(o + c + 4, a1); STORE(o + c + 8, a2); STORE(o + c + 12, a3);
            STORE(o + c + 16, a4); STORE(o + c + 20, a5); STORE(o + c + 24, a6); STORE(o + c + 28, a7);
        }
        for (; c + 4 <= d; c += 4) {
            f32x4 a = LOAD(o + c);
            const float *v = Vb + c;
            for (int j = 0; j < cols; j++, v += d) a = FMA(SPLAT_LOAD(p + j), LOAD(v), a);
            STORE(o + c, a);
        }
        for (; c < d; c++) {
            float a = o[c];
            for (int j = 0; j < cols; j++) a += p[j] * Vb[j * d + c];
            o[c] = a;
        }
    }
}

KERNEL void attention_f32(int bh, int tq, int tk, int d, const float *Q, int q_bs,
                          const float *K, int k_bs, const float *V, int v_bs, const float *MASK,
                          int mask_bs, float scale, float *O, int o_bs, uint8_t *scratch) {
    if (bh <= 0 || tq <= 0 || d <= 0) return;
    float *S = (float *)(scratch + ATT_SCRATCH_S);
    float *Oacc = (float *)(scratch + ATT_SCRATCH_OACC);
    float *m = (float *)(scratch + ATT_SCRATCH_M);
    float *l = (float *)(scratch + ATT_SCRATCH_L);
    int qb = imax(1, imin(imin(ATT_QB, tq), ATT_OACC_FLOATS / d));
    int kb = imin(ATT_KB_MAX, ATT_S_FLOATS / qb) & ~3;
    for (int b = 0; b < bh; b++) {
        const float *qh = Q + b * q_bs, *kh = K + b * k_bs, *vh = V + b * v_bs;
        const float *mh = MASK ? MASK + b * mask_bs : 0;
        float *oh = O + b * o_bs;
        for (int q0 = 0; q0 < tq; q0 += qb) {
            int rows = imin(qb, tq - q0);
            for (int r = 0; r < rows; r++) {
                m[r] = NEG_INF;
                l[r] = 0.0f;
            }
            for (int i = 0; i < rows * d; i++) Oacc[i] = 0.0f;
            for (int k0 = 0; k0 < tk; k0 += kb) {
                int cols = imin(kb, tk - k0);
                scores(rows, cols, d, qh + q0 * d, kh + k0 * d, scale,
                       mh ? mh + q0 * tk + k0 : 0, tk, S, kb);
                for (int r = 0; r < rows; r++) {
                    float alpha = softmax_block(cols, S + r * kb, m + r, l + r);
                    if (alpha != 1.0f) {
                        float *o = Oacc + r * d;
                        f32x4 av = F4(alpha);
                        int c = 0;
                        for (; c + 4 <= d; c += 4) STORE(o + c, wasm_f32x4_mul(LOAD(o + c), av));
                        for (; c < d; c++) o[c] *= alpha;
                    }
                }
                weighted_values(rows, cols, d, S, kb, vh + k0 * d, Oacc);
            }
            for (int r = 0; r < rows; r++) {
                const float *o = Oacc + r * d;
                float *out = oh + (q0 + r) * d;
                f32x4 lv = F4(l[r]);
                int c = 0;
                for (; c + 4 <= d; c += 4) STORE(out + c, wasm_f32x4_div(LOAD(o + c), lv));
                for (; c < d; c++) out[c] = o[c] / l[r];
            }
        }
    }
}
