/* Linear layers on packed weights: Y[m, n] = sum_k X[m, k] * W[n, k], W as f16 bits or GGML
 * blocks (the raw GGUF bytes), N rows of K weights each.
 *
 * Semantics equal the numpy reference (dequantize to f32, then an f32 dot product): each
 * weight is rebuilt with exactly the roundings of candle_web.quantized (d * q, d * q + m,
 * (d * sc) * q - dmin * mn, multiplications and additions kept separate), only the dot product
 * is free to use FMA and its own summation order. x is never quantized.
 *
 * Decode (one row of X; up to 8 for the 32-element types, see rows_path_max_m): weights are
 * dequantized 32 at a time into registers and multiplied with up to 4 rows of X at once, so each
 * weight is read from memory once per 4 rows. More rows (prompts, beams): a tile of weight rows
 * is dequantized into scratch as f32 once and multiplied by the GEMM (gemm.c: its GEMV path for
 * up to 4 rows, the packed GEMM above), which then runs at cache or compute speed.
 */
#include "kernels.h"

/* GGML type ids (candle_web.quantized.ggml_dtype.GgmlDType). */
enum {
    T_Q4_0 = 2, T_Q4_1 = 3, T_Q5_0 = 6, T_Q5_1 = 7, T_Q8_0 = 8,
    T_Q2_K = 10, T_Q3_K = 11, T_Q4_K = 12, T_Q5_K = 13, T_Q6_K = 14,
    T_F16 = 1 /* internal: linear_f16 shares the code, 32 halves a "block" */
};

INLINE int block_elems(int type) {
    return (type >= T_Q2_K && type <= T_Q6_K) ? 256 : 32;
}

/* Up to this many rows of X go through the register path (4 rows per pass), more through the
 * tile + GEMM. Measured in V8 (Node 20, CPU time): for the 32-element types the register path
 * wins up to 8 rows; for the k-quants and f16, whose dequantization needs more registers, the
 * tile wins from 2 rows on. */
INLINE int rows_path_max_m(const int type) {
    return (type == T_F16 || block_elems(type) == 256) ? 1 : 8;
}

INLINE int block_bytes(int type) {
    switch (type) {
    case T_F16: return 64;
    case T_Q4_0: return 18;
    case T_Q4_1: return 20;
    case T_Q5_0: return 22;
    case T_Q5_1: return 24;
    case T_Q8_0: return 34;
    case T_Q2_K: return 84;
    case T_Q3_K: return 110;
    case T_Q4_K: return 144;
    case T_Q5_K: return 176;
    case T_Q6_K: return 210;
    default: return 0;
    }
}

typedef struct __attribute__((packed)) { uint16_t v; } u16_unaligned;
typedef struct __attribute__((packed)) { uint32_t v; } u32_unaligned;

INLINE float f16_at(const uint8_t *p) { return half_to_f32(((const u16_unaligned *)p)->v); }
INLINE uint32_t u32_at(const uint8_t *p) { return ((const u32_unaligned *)p)->v; }

/* 32 dequantized weights, elements 4i..4i+3 in v[i]. Returned by value from always-inline
 * functions: it lives in locals (the build check proves no stack is used). */
typedef struct { f32x4 v0, v1, v2, v3, v4, v5, v6, v7; } vec8;

/* 16 unsigned bytes -> 4 f32x4 in element order. */
#define U8_TO_F32(bytes, o0, o1, o2, o3)                                      \
    do {                                                                       \
        v128_t lo_ = wasm_u16x8_extend_low_u8x16(bytes);                       \
        v128_t hi_ = wasm_u16x8_extend_high_u8x16(bytes);                      \
        o0 = wasm_f32x4_convert_i32x4(wasm_u32x4_extend_low_u16x8(lo_));       \
        o1 = wasm_f32x4_convert_i32x4(wasm_u32x4_extend_high_u16x8(lo_));      \
        o2 = wasm_f32x4_convert_i32x4(wasm_u32x4_extend_low_u16x8(hi_));       \
        o3 = wasm_f32x4_convert_i32x4(wasm_u32x4_extend_high_u16x8(hi_));      \
    } while (0)

/* 16 signed bytes -> 4 f32x4. */
#define I8_TO_F32(bytes, o0, o1, o2, o3)                                      \
    do {                                                                       \
        v128_t lo_ = wasm_i16x8_extend_low_i8x16(bytes);                       \
        v128_t hi_ = wasm_i16x8_extend_high_i8x16(bytes);                      \
        o0 = wasm_f32x4_convert_i32x4(wasm_i32x4_extend_low_i16x8(lo_));       \
        o1 = wasm_f32x4_convert_i32x4(wasm_i32x4_extend_high_i16x8(lo_));      \
        o2 = wasm_f32x4_convert_i32x4(wasm_i32x4_extend_low_i16x8(hi_));       \
        o3 = wasm_f32x4_convert_i32x4(wasm_i32x4_extend_high_i16x8(hi_));      \
    } while (0)

INLINE vec8 scale8(vec8 w, f32x4 d) {
    w.v0 = wasm_f32x4_mul(d, w.v0); w.v1 = wasm_f32x4_mul(d, w.v1);
    w.v2 = wasm_f32x4_mul(d, w.v2); w.v3 = wasm_f32x4_mul(d, w.v3);
    w.v4 = wasm_f32x4_mul(d, w.v4); w.v5 = wasm_f32x4_mul(d, w.v5);
    w.v6 = wasm_f32x4_mul(d, w.v6); w.v7 = wasm_f32x4_mul(d, w.v7);
    return w;
}

/* (first four) * da - ma, (last four) * db - mb: the k-quants' (d * sc) * q - dmin * mn. */
INLINE vec8 affine8(vec8 w, f32x4 da, f32x4 ma, f32x4 db, f32x4 mb) {
    w.v0 = wasm_f32x4_sub(wasm_f32x4_mul(da, w.v0), ma);
    w.v1 = wasm_f32x4_sub(wasm_f32x4_mul(da, w.v1), ma);
    w.v2 = wasm_f32x4_sub(wasm_f32x4_mul(da, w.v2), ma);
    w.v3 = wasm_f32x4_sub(wasm_f32x4_mul(da, w.v3), ma);
    w.v4 = wasm_f32x4_sub(wasm_f32x4_mul(db, w.v4), mb);
    w.v5 = wasm_f32x4_sub(wasm_f32x4_mul(db, w.v5), mb);
    w.v6 = wasm_f32x4_sub(wasm_f32x4_mul(db, w.v6), mb);
    w.v7 = wasm_f32x4_sub(wasm_f32x4_mul(db, w.v7), mb);
    return w;
}

/* d * q + m, in that order (legacy types with a minimum). */
INLINE vec8 mul_add8(vec8 w, f32x4 d, f32x4 m) {
    w.v0 = wasm_f32x4_add(wasm_f32x4_mul(d, w.v0), m);
    w.v1 = wasm_f32x4_add(wasm_f32x4_mul(d, w.v1), m);
    w.v2 = wasm_f32x4_add(wasm_f32x4_mul(d, w.v2), m);
    w.v3 = wasm_f32x4_add(wasm_f32x4_mul(d, w.v3), m);
    w.v4 = wasm_f32x4_add(wasm_f32x4_mul(d, w.v4), m);
    w.v5 = wasm_f32x4_add(wasm_f32x4_mul(d, w.v5), m);
    w.v6 = wasm_f32x4_add(wasm_f32x4_mul(d, w.v6), m);
    w.v7 = wasm_f32x4_add(wasm_f32x4_mul(d, w.v7), m);
    return w;
}

INLINE vec8 from_u8(v128_t lo16, v128_t hi16) {
    vec8 w;
    U8_TO_F32(lo16, w.v0, w.v1, w.v2, w.v3);
    U8_TO_F32(hi16, w.v4, w.v5, w.v6, w.v7);
    return w;
}

INLINE vec8 from_i8(v128_t lo16, v128_t hi16) {
    vec8 w;
    I8_TO_F32(lo16, w.v0, w.v1, w.v2, w.v3);
    I8_TO_F32(hi16, w.v4, w.v5, w.v6, w.v7);
    return w;
}

/* The 5th bits of Q5_0/Q5_1 (bit j of the u32 qh for element j) as 0x10 bytes for elements
 * first..first+15 (first = 0 or 16). */
INLINE v128_t q5_high_bits(uint32_t qh, int first) {
    v128_t all = wasm_i32x4_splat((int32_t)qh);
    v128_t spread = first == 0
        ? wasm_i8x16_shuffle(all, all, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1)
        : wasm_i8x16_shuffle(all, all, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    v128_t bit = wasm_u8x16_make(1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128);
    v128_t set = wasm_i8x16_eq(wasm_v128_and(spread, bit), bit);
    return wasm_v128_and(set, wasm_i8x16_splat(0x10));
}

/* Q3_K: the signed 6-bit scale i (0..15) of a block's 12 scale bytes. */
INLINE int q3k_scale(const uint8_t *sc, int i) {
    int low = i < 8 ? (sc[i] & 0x0F) : (sc[i - 8] >> 4);
    int high = (sc[8 + (i & 3)] >> (2 * (i >> 2))) & 3;
    return (low | (high << 4)) - 32;
}

/* Q4_K/Q5_K: the 6-bit scale and min of sub-block g (0..7). */
INLINE int k4_scale(const uint8_t *sc, int g) {
    return g < 4 ? (sc[g] & 63) : ((sc[g + 4] & 0x0F) | ((sc[g - 4] >> 6) << 4));
}
INLINE int k4_min(const uint8_t *sc, int g) {
    return g < 4 ? (sc[g + 4] & 63) : ((sc[g + 4] >> 4) | ((sc[g] >> 6) << 4));
}

/* A block's f16 super-scales, decoded once per block: (d, m) or (d, dmin). */
typedef struct { float d, m; } block_scales;

INLINE block_scales scales_of(const int type, const uint8_t *blk) {
    block_scales s = {0.0f, 0.0f};
    switch (type) {
    case T_Q4_0: case T_Q5_0: case T_Q8_0: s.d = f16_at(blk); break;
    case T_Q4_1: case T_Q5_1: case T_Q4_K: case T_Q5_K:
        s.d = f16_at(blk);
        s.m = f16_at(blk + 2);
        break;
    case T_Q2_K: s.d = f16_at(blk + 80); s.m = f16_at(blk + 82); break;
    case T_Q3_K: s.d = f16_at(blk + 108); break;
    case T_Q6_K: s.d = f16_at(blk + 208); break;
    default: break;
    }
    return s;
}

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

static void fill_nan(int M, int N, float *Y, int y_rs) {
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) Y[m * y_rs + n] = __builtin_nanf("");
}

KERNEL void linear_f16(int M, int N, int K, const float *X, int x_rs, const uint16_t *W,
                       float *Y, int y_rs, uint8_t *scratch) {
    if (M <= 0 || N <= 0) return;
    linear_typed(T_F16, M, N, K, X, x_rs, (const uint8_t *)W, Y, y_rs, scratch);
}

/* An unknown type, or K not a whole number of blocks, fills Y with NaN (the host checks
 * both first; NaN makes a bypassed check loud). */
KERNEL void linear_q(int type, int M, int N, int K, const float *X, int x_rs, const uint8_t *W,
                     float *Y, int y_rs, uint8_t *scratch) {
    if (M <= 0 || N <= 0) return;
    if (block_bytes(type) == 0 || type == T_F16 || K <= 0 || K % block_elems(type)) {
        fill_nan(M, N, Y, y_rs);
        return;
    }
    switch (type) {
    case T_Q4_0: linear_typed(T_Q4_0, M, N, K, X, x_rs, W, Y, y_rs, scratch); break;
    case T_Q4_1: linear_typed(T_Q4_1, M, N, K, X, x_rs, W, Y, y_rs, scratch); break;
    case T_Q5_0: linear_typed(T_Q5_0, M, N, K, X, x_rs, W, Y, y_rs, scratch); break;
    case T_Q5_1: linear_typed(T_Q5_1, M, N, K, X, x_rs, W, Y, y_rs, scratch); break;
    case T_Q8_0: linear_typed(T_Q8_0, M, N, K, X, x_rs, W, Y, y_rs, scratch); break;
    case T_Q2_K: linear_typed(T_Q2_K, M, N, K, X, x_rs, W, Y, y_rs, scratch); break;
    case T_Q3_K: linear_typed(T_Q3_K, M, N, K, X, x_rs, W, Y, y_rs, scratch); break;
    case T_Q4_K: linear_typed(T_Q4_K, M, N, K, X, x_rs, W, Y, y_rs, scratch); break;
    case T_Q5_K: linear_typed(T_Q5_K, M, N, K, X, x_rs, W, Y, y_rs, scratch); break;
    case T_Q6_K: linear_typed(T_Q6_K, M, N, K, X, x_rs, W, Y, y_rs, scratch); break;
    default: fill_nan(M, N, Y, y_rs); break;
    }
}

/* Bytes of one row of K weights as the fused steps pass matrices: type 0 f32, 1 f16 bits,
 * else a GGML type (K a whole number of its blocks). The team's row shares start at row
 * offsets of this size. Not exported. The block sizes come from two immediates, one byte per
 * type: a switch here would be compiled to a lookup table, i.e. a data segment. */
int matrix_row_bytes(int type, int K) {
    if (type == MATRIX_F32) return 4 * K;
    if (type == T_F16) return 2 * K;
    if (type < T_Q4_0 || type > T_Q6_K) return 0;
    /* types 2..9: Q4_0 18, Q4_1 20, -, -, Q5_0 22, Q5_1 24, Q8_0 34, -; 10..14: the k-quants */
    const uint64_t small = 0x0022181600001412ull, large = 0xd2b0906e54ull;
    int bytes = type < T_Q2_K ? (int)((small >> (8 * (type - T_Q4_0))) & 0xff)
                              : (int)((large >> (8 * (type - T_Q2_K))) & 0xff);
    return (K / block_elems(type)) * bytes;
}
