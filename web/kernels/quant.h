/* The GGML block formats as the linear layers read them (linear.c, linear_q32.c, linear_qk.c):
 * type ids, block sizes, and the pieces that rebuild 32 weights of a block in registers with
 * exactly the roundings of candle_web.quantized (see linear.c). Header-only, always inline:
 * each file that includes it compiles the code for the types it runs.
 */
#ifndef CANDLE_KERNELS_QUANT_H
#define CANDLE_KERNELS_QUANT_H

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

#endif
