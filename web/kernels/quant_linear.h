/* The linear layers' row loops, written once for every weight type and compiled per type
 * with `type` a constant (linear_typed): linear.c instantiates f16, linear_q32.c the
 * 32-element block types, linear_qk.c the k-quants. Header-only; see linear.c for the method.
 */
#ifndef CANDLE_KERNELS_QUANT_LINEAR_H
#define CANDLE_KERNELS_QUANT_LINEAR_H

#include "quant.h"

/* Weights 32g .. 32g+31 of one block of `type` (g < block_elems / 32), sc = scales_of(blk). */
INLINE vec8 dq32(const int type, const uint8_t *blk, int g, block_scales sc) {
    const v128_t low_nibble = wasm_i8x16_splat(0x0F);
    switch (type) {
    case T_F16: { /* blk points at the group's 32 halves; g and sc are unused */
        v128_t h0 = LOAD(blk), h1 = LOAD(blk + 16), h2 = LOAD(blk + 32), h3 = LOAD(blk + 48);
        v128_t mag = wasm_i16x8_splat(0x7fff);
        v128_t e0 = wasm_v128_and(h0, mag), e1 = wasm_v128_and(h1, mag);
        v128_t e2 = wasm_v128_and(h2, mag), e3 = wasm_v128_and(h3, mag);
        v128_t top = wasm_u16x8_max(wasm_u16x8_max(e0, e1), wasm_u16x8_max(e2, e3));
        v128_t bottom = wasm_u16x8_min(wasm_u16x8_min(e0, e1), wasm_u16x8_min(e2, e3));
        vec8 w;
        if (!wasm_v128_any_true(wasm_v128_or(wasm_u16x8_ge(top, wasm_i16x8_splat(0x7c00)),
                                             wasm_u16x8_lt(bottom, wasm_i16x8_splat(0x0400))))) {
            HALF8_NORMAL_TO_F32(h0, e0, w.v0, w.v1);
            HALF8_NORMAL_TO_F32(h1, e1, w.v2, w.v3);
            HALF8_NORMAL_TO_F32(h2, e2, w.v4, w.v5);
            HALF8_NORMAL_TO_F32(h3, e3, w.v6, w.v7);
            return w;
        }
        /* a zero, subnormal, inf or NaN among the 32: the general conversion */
        w.v0 = half4_to_f32(wasm_i32x4_extend_low_i16x8(h0));
        w.v1 = half4_to_f32(wasm_i32x4_extend_high_i16x8(h0));
        w.v2 = half4_to_f32(wasm_i32x4_extend_low_i16x8(h1));
        w.v3 = half4_to_f32(wasm_i32x4_extend_high_i16x8(h1));
        w.v4 = half4_to_f32(wasm_i32x4_extend_low_i16x8(h2));
        w.v5 = half4_to_f32(wasm_i32x4_extend_high_i16x8(h2));
        w.v6 = half4_to_f32(wasm_i32x4_extend_low_i16x8(h3));
        w.v7 = half4_to_f32(wasm_i32x4_extend_high_i16x8(h3));
        return w;
    }
    case T_Q4_0: {
        v128_t qs = LOAD(blk + 2), eight = wasm_i8x16_splat(8);
        v128_t lo = wasm_i8x16_sub(wasm_v128_and(qs, low_nibble), eight);
        v128_t hi = wasm_i8x16_sub(wasm_u8x16_shr(qs, 4), eight);
        return scale8(from_i8(lo, hi), F4(sc.d));
    }
    case T_Q4_1: {
        v128_t qs = LOAD(blk + 4);
        vec8 w = from_u8(wasm_v128_and(qs, low_nibble), wasm_u8x16_shr(qs, 4));
        return mul_add8(w, F4(sc.d), F4(sc.m));
    }
    case T_Q5_0: {
        uint32_t qh = u32_at(blk + 2);
        v128_t qs = LOAD(blk + 6), sixteen = wasm_i8x16_splat(16);
        v128_t lo = wasm_v128_or(wasm_v128_and(qs, low_nibble), q5_high_bits(qh, 0));
        v128_t hi = wasm_v128_or(wasm_u8x16_shr(qs, 4), q5_high_bits(qh, 16));
        return scale8(from_i8(wasm_i8x16_sub(lo, sixteen), wasm_i8x16_sub(hi, sixteen)),
                      F4(sc.d));
    }
    case T_Q5_1: {
        uint32_t qh = u32_at(blk + 4);
        v128_t qs = LOAD(blk + 8);
        v128_t lo = wasm_v128_or(wasm_v128_and(qs, low_nibble), q5_high_bits(qh, 0));
        v128_t hi = wasm_v128_or(wasm_u8x16_shr(qs, 4), q5_high_bits(qh, 16));
        return mul_add8(from_u8(lo, hi), F4(sc.d), F4(sc.m));
    }
    case T_Q8_0:
        return scale8(from_i8(LOAD(blk + 2), LOAD(blk + 18)), F4(sc.d));
    case T_Q2_K: {
        /* element 128h + 32j + l: (qs[32h + l] >> 2j) & 3; scale/min byte per 16 elements */
        int h = g >> 2, j = g & 3;
        const uint8_t *qs = blk + 16 + 32 * h;
        v128_t three = wasm_i8x16_splat(3);
        v128_t lo = wasm_v128_and(wasm_u8x16_shr(LOAD(qs), 2 * j), three);
        v128_t hi = wasm_v128_and(wasm_u8x16_shr(LOAD(qs + 16), 2 * j), three);
        float d = sc.d, dmin = sc.m;
        int sa = blk[2 * g], sb = blk[2 * g + 1];
        return affine8(from_u8(lo, hi), F4(d * (float)(sa & 0x0F)), F4(dmin * (float)(sa >> 4)),
                       F4(d * (float)(sb & 0x0F)), F4(dmin * (float)(sb >> 4)));
    }
    case T_Q3_K: {
        /* low 2 bits as Q2_K; bit g of hmask[l] clear means "subtract 4" */
        int h = g >> 2, j = g & 3;
        const uint8_t *qs = blk + 32 + 32 * h;
        v128_t three = wasm_i8x16_splat(3), four = wasm_i8x16_splat(4);
        v128_t lo = wasm_v128_and(wasm_u8x16_shr(LOAD(qs), 2 * j), three);
        v128_t hi = wasm_v128_and(wasm_u8x16_shr(LOAD(qs + 16), 2 * j), three);
        v128_t bit = wasm_i8x16_splat((int8_t)(1 << g));
        v128_t m_lo = wasm_i8x16_eq(wasm_v128_and(LOAD(blk), bit), wasm_i8x16_splat(0));
        v128_t m_hi = wasm_i8x16_eq(wasm_v128_and(LOAD(blk + 16), bit), wasm_i8x16_splat(0));
        lo = wasm_i8x16_sub(lo, wasm_v128_and(m_lo, four));
        hi = wasm_i8x16_sub(hi, wasm_v128_and(m_hi, four));
        const uint8_t *packed = blk + 96;
        vec8 w = from_i8(lo, hi);
        f32x4 da = F4(sc.d * (float)q3k_scale(packed, 2 * g));
        f32x4 db = F4(sc.d * (float)q3k_scale(packed, 2 * g + 1));
        w.v0 = wasm_f32x4_mul(da, w.v0); w.v1 = wasm_f32x4_mul(da, w.v1);
        w.v2 = wasm_f32x4_mul(da, w.v2); w.v3 = wasm_f32x4_mul(da, w.v3);
        w.v4 = wasm_f32x4_mul(db, w.v4); w.v5 = wasm_f32x4_mul(db, w.v5);
        w.v6 = wasm_f32x4_mul(db, w.v6); w.v7 = wasm_f32x4_mul(db, w.v7);
        return w;
    }
    case T_Q4_K:
    case T_Q5_K: {
        /* sub-block g: nibble (g & 1) of qs[32 (g >> 1) + l]; Q5_K adds bit g of qh[l] << 4 */
        const uint8_t *qs = blk + (type == T_Q4_K ? 16 : 48) + 32 * (g >> 1);
        v128_t q0 = LOAD(qs), q1 = LOAD(qs + 16);
        v128_t lo, hi;
        if (g & 1) {
            lo = wasm_u8x16_shr(q0, 4);
            hi = wasm_u8x16_shr(q1, 4);
        } else {
            lo = wasm_v128_and(q0, low_nibble);
            hi = wasm_v128_and(q1, low_nibble);
        }
        if (type == T_Q5_K) {
            v128_t one = wasm_i8x16_splat(1);
            lo = wasm_v128_or(lo, wasm_i8x16_shl(wasm_v128_and(wasm_u8x16_shr(LOAD(blk + 16), g), one), 4));
            hi = wasm_v128_or(hi, wasm_i8x16_shl(wasm_v128_and(wasm_u8x16_shr(LOAD(blk + 32), g), one), 4));
        }
        const uint8_t *packed = blk + 4;
        f32x4 ds = F4(sc.d * (float)k4_scale(packed, g));
        f32x4 dm = F4(sc.m * (float)k4_min(packed, g));
        return affine8(from_u8(lo, hi), ds, dm, ds, dm);
    }
    case T_Q6_K: {
        /* element 128h + 32j + l: low nibble of ql[64h + 32 (j & 1) + l] at 4 (j >> 1), top
         * 2 bits of qh[32h + l] at 2j, minus 32; int8 scale per 16 elements */
        int h = g >> 2, j = g & 3;
        const uint8_t *ql = blk + 64 * h + 32 * (j & 1);
        const uint8_t *qh = blk + 128 + 32 * h;
        v128_t l0 = LOAD(ql), l1 = LOAD(ql + 16);
        if (j >> 1) {
            l0 = wasm_u8x16_shr(l0, 4);
            l1 = wasm_u8x16_shr(l1, 4);
        } else {
            l0 = wasm_v128_and(l0, low_nibble);
            l1 = wasm_v128_and(l1, low_nibble);
        }
        v128_t three = wasm_i8x16_splat(3), bias = wasm_i8x16_splat(32);
        v128_t h0 = wasm_i8x16_shl(wasm_v128_and(wasm_u8x16_shr(LOAD(qh), 2 * j), three), 4);
        v128_t h1 = wasm_i8x16_shl(wasm_v128_and(wasm_u8x16_shr(LOAD(qh + 16), 2 * j), three), 4);
        vec8 w = from_i8(wasm_i8x16_sub(wasm_v128_or(l0, h0), bias),
                         wasm_i8x16_sub(wasm_v128_or(l1, h1), bias));
        const int8_t *scale = (const int8_t *)(blk + 192);
        f32x4 da = F4(sc.d * (float)scale[2 * g]), db = F4(sc.d * (float)scale[2 * g + 1]);
        w.v0 = wasm_f32x4_mul(da, w.v0); w.v1 = wasm_f32x4_mul(da, w.v1);
        w.v2 = wasm_f32x4_mul(da, w.v2); w.v3 = wasm_f32x4_mul(da, w.v3);
        w.v4 = wasm_f32x4_mul(db, w.v4); w.v5 = wasm_f32x4_mul(db, w.v5);
        w.v6 = wasm_f32x4_mul(db, w.v6); w.v7 = wasm_f32x4_mul(db, w.v7);
        return w;
    }
    default: {
        vec8 w;
        w.v0 = w.v1 = w.v2 = w.v3 = w.v4 = w.v5 = w.v6 = w.v7 = F4(__builtin_nanf(""));
        return w;
    }
    }
}

INLINE f32x4 dot8(vec8 w, const float *x, f32x4 acc) {
    acc = FMA(w.v0, LOAD(x), acc);
    acc = FMA(w.v2, LOAD(x + 8), acc);
    acc = FMA(w.v4, LOAD(x + 16), acc);
    acc = FMA(w.v6, LOAD(x + 24), acc);
    return acc;
}
INLINE f32x4 dot8_odd(vec8 w, const float *x, f32x4 acc) {
    acc = FMA(w.v1, LOAD(x + 4), acc);
    acc = FMA(w.v3, LOAD(x + 12), acc);
    acc = FMA(w.v5, LOAD(x + 20), acc);
    acc = FMA(w.v7, LOAD(x + 28), acc);
    return acc;
}

/* Elements per block and bytes per block as the row loops see them: f16 rows are walked in
 * "blocks" of 32 halves (the K % 32 tail separately). */
INLINE int loop_block_elems(const int type) { return type == T_F16 ? 32 : block_elems(type); }
INLINE int loop_block_bytes(const int type) { return type == T_F16 ? 64 : block_bytes(type); }
INLINE int row_bytes_of(const int type, int K) {
    return type == T_F16 ? 2 * K : (K / block_elems(type)) * block_bytes(type);
}

/* The f16 tail (K % 32 weights) of one row, one x row. */
static float f16_tail_dot(const uint8_t *row, int k0, int K, const float *x) {
    float s = 0.0f;
    const uint16_t *h = (const uint16_t *)row;
    for (int k = k0; k < K; k++) s += x[k] * half_to_f32(h[k]);
    return s;
}

/* Y[r, n] = X[r, :] . W[n, :] for r < R (R = 1..4 rows of X at once), n < N. One row of X
 * keeps two accumulators (two FMA chains); more rows keep one each, so that the 8 weight
 * vectors and the accumulators stay within the 16 SIMD registers of x86. */
INLINE void linear_rows(const int type, const int R, int N, int K, const float *X, int x_rs,
                        const uint8_t *W, float *Y, int y_rs) {
    const int be = loop_block_elems(type), bb = loop_block_bytes(type), G = be / 32;
    const int nb = K / be, row_bytes = row_bytes_of(type, K);
    const float *x0 = X, *x1 = X + x_rs, *x2 = X + 2 * x_rs, *x3 = X + 3 * x_rs;
    for (int n = 0; n < N; n++) {
        const uint8_t *row = W + n * row_bytes;
        f32x4 a0 = F4(0), b0 = F4(0), a1 = F4(0), a2 = F4(0), a3 = F4(0);
        for (int b = 0; b < nb; b++) {
            const uint8_t *blk = row + b * bb;
            block_scales sc = scales_of(type, blk);
            if (R == 1) {
                /* unrolled: the k-quants' shifts and branches on g become constants (with
                 * more rows the unrolled code runs out of registers: measured slower) */
#pragma clang loop unroll(full)
                for (int g = 0; g < G; g++) {
                    vec8 w = dq32(type, blk, g, sc);
                    int k = b * be + 32 * g;
                    a0 = dot8(w, x0 + k, a0);
                    b0 = dot8_odd(w, x0 + k, b0);
                }
            } else {
#pragma clang loop unroll(disable)
                for (int g = 0; g < G; g++) {
                    vec8 w = dq32(type, blk, g, sc);
                    int k = b * be + 32 * g;
                    a0 = dot8_odd(w, x0 + k, dot8(w, x0 + k, a0));
                    a1 = dot8_odd(w, x1 + k, dot8(w, x1 + k, a1));
                    if (R > 2) a2 = dot8_odd(w, x2 + k, dot8(w, x2 + k, a2));
                    if (R > 3) a3 = dot8_odd(w, x3 + k, dot8(w, x3 + k, a3));
                }
            }
        }
        int k0 = nb * be, tail = type == T_F16 && k0 < K;
        float *y = Y + n;
        y[0] = hsum(wasm_f32x4_add(a0, b0)) + (tail ? f16_tail_dot(row, k0, K, x0) : 0.0f);
        if (R > 1) y[y_rs] = hsum(a1) + (tail ? f16_tail_dot(row, k0, K, x1) : 0.0f);
        if (R > 2) y[2 * y_rs] = hsum(a2) + (tail ? f16_tail_dot(row, k0, K, x2) : 0.0f);
        if (R > 3) y[3 * y_rs] = hsum(a3) + (tail ? f16_tail_dot(row, k0, K, x3) : 0.0f);
    }
}

/* Rows [0, rows) of W dequantized into dst (rows x K f32, row-major). */
INLINE void dequantize_rows(const int type, int rows, int K, const uint8_t *W, float *dst) {
    const int be = loop_block_elems(type), bb = loop_block_bytes(type), G = be / 32;
    const int nb = K / be, row_bytes = row_bytes_of(type, K);
    for (int n = 0; n < rows; n++) {
        const uint8_t *row = W + n * row_bytes;
        float *out = dst + n * K;
        for (int b = 0; b < nb; b++) {
            const uint8_t *blk = row + b * bb;
            block_scales sc = scales_of(type, blk);
            for (int g = 0; g < G; g++) {
                vec8 w = dq32(type, blk, g, sc);
                float *o = out + b * be + 32 * g;
                STORE(o, w.v0); STORE(o + 4, w.v1); STORE(o + 8, w.v2); STORE(o + 12, w.v3);
                STORE(o + 16, w.v4); STORE(o + 20, w.v5); STORE(o + 24, w.v6); STORE(o + 28, w.v7);
            }
        }
        if (type == T_F16) {
            const uint16_t *h = (const uint16_t *)row;
            for (int k = nb * be; k < K; k++) out[k] = half_to_f32(h[k]);
        }
    }
}

INLINE void linear_typed(const int type, int M, int N, int K, const float *X, int x_rs,
                         const uint8_t *W, float *Y, int y_rs, uint8_t *scratch) {
    const int row_bytes = row_bytes_of(type, K);
    int tile_rows = (SCRATCH_DEQ_BYTES / 4) / (K > 0 ? K : 1) / GEMM_NR * GEMM_NR;
    if (M > rows_path_max_m(type) && tile_rows >= GEMM_NR) {
        float *tile = (float *)(scratch + SCRATCH_DEQ);
        for (int n0 = 0; n0 < N; n0 += tile_rows) {
            int nt = imin(tile_rows, N - n0);
            dequantize_rows(type, nt, K, W + n0 * row_bytes, tile);
            /* Y[:, n0:n0+nt] = X @ tile^T: B[k, n] = tile[n * K + k] */
            gemm_2d(M, nt, K, X, x_rs, 1, tile, 1, K, Y + n0, y_rs, 0, scratch);
        }
        return;
    }
    int m = 0;
    for (; m + 4 <= M; m += 4) linear_rows(type, 4, N, K, X + m * x_rs, x_rs, W, Y + m * y_rs, y_rs);
    switch (M - m) {
    case 3: linear_rows(type, 3, N, K, X + m * x_rs, x_rs, W, Y + m * y_rs, y_rs); break;
    case 2: linear_rows(type, 2, N, K, X + m * x_rs, x_rs, W, Y + m * y_rs, y_rs); break;
    case 1: linear_rows(type, 1, N, K, X + m * x_rs, x_rs, W, Y + m * y_rs, y_rs); break;
    default: break;
    }
}

/* linear_q's types, one file per family (K a whole number of blocks, checked by linear_q). */
void linear_q32(int type, int M, int N, int K, const float *X, int x_rs, const uint8_t *W,
                float *Y, int y_rs, uint8_t *scratch); /* linear_q32.c: Q4_0 .. Q8_0 */
void linear_qk(int type, int M, int N, int K, const float *X, int x_rs, const uint8_t *W,
               float *Y, int y_rs, uint8_t *scratch); /* linear_qk.c: Q2_K .. Q6_K */

#endif
