/* Integer arithmetic for the linear layers on GGML blocks (the compute type int8): each row of
 * X quantized to int8 in blocks of 32, exact integer dot products with the weights' integer
 * levels, one fixed f32 epilogue. Every bit is candle_web.quantized.int8_rows' (its module doc
 * has the arithmetic; numba's kernels/qint8.py gives the same bits natively):
 *
 *   activations, per 32-element block: amax = max |x|, q = nearest(x * (127 / amax)) (half to
 *   even: f32x4.nearest), d = amax / 127; amax < 2^-120 gives d = 0, q = 0; inf or NaN gives
 *   d = NaN, q = 0;
 *   products, per 64-element block: 16 lanes of 4 consecutive elements, L = sum level * q
 *   (exact), f[l] = f[l] + f32(L) * (s * d) with the 16-element quarter's weight scale s and the
 *   32-element half's d (no FMA: -ffp-contract=off and never relaxed_madd); a last 32-element
 *   block fills lanes 0..7; the lanes folded in the fixed tree (8, 4, (0 + 2) + (1 + 3));
 *   weights with offsets add fold(o), o[g mod 16] += offset_g * (d * sum q over group g).
 *
 * The levels stay packed: 32 of a block are unpacked into two i8x16 registers as the float
 * path does (quant.h, quant_linear.h's dq32), as unsigned values level + bias in 0..127 (Q4_0
 * + 8, Q5_0 + 16, Q3_K + 4, Q6_K + 32, the other types' levels as they are) except Q8_0,
 * whose levels are signed bytes. Integer lane sums:
 *   - relaxed build, unsigned levels: i32x4.relaxed_dot_i8x16_i7x16_add_s(q, level + bias,
 *     -bias * (the lane's sum of q)): the second operand's lanes are 0..127, where the
 *     instruction is defined on every engine and CPU (no implementation-defined lane reaches a
 *     result), and the start makes the sum the signed level-dot exactly;
 *   - plain simd128 build, and Q8_0 in both: the signed levels and q widened to i16,
 *     i32x4.dot_i16x8_s (pairs), two shuffles and an add (lanes of 4).
 * Both are exact, so the two builds give the same bits.
 *
 * Projections the fused steps pass piece by piece (q|k|v, gate|up) are one joined weight on
 * numba (parts/llama_decoder.py: groups of the smallest size, zero offsets for pieces without):
 * the type word's INT8_OFFSETS_16 and INT8_OFFSETS_JOINED bits (abi.py) say how the joined
 * weight's offsets are grouped, so every piece gives numba's bits.
 *
 * Scratch: per row of X (up to 4 at a time) its q, lane sums of q, d and the offset factors,
 * 2.5 K bytes, from offset 0 (the float path's GEMM regions; this file calls no GEMM).
 */
#include "quant.h"

/* Bytes of one quantized activation row in scratch: q [K] i8, lane sums [K/4] i32, d [K/32],
 * factors per 16 [K/16] and per 32 [K/32] f32. */
INLINE int act_row_bytes(int K) { return K + K + K / 8 + K / 4 + K / 8; }

typedef struct {
    const int8_t *q;
    const int32_t *sum4;
    const float *d, *f16, *f32;
} act_row;

INLINE act_row act_row_at(const uint8_t *base, int K) {
    act_row a;
    a.q = (const int8_t *)base;
    a.sum4 = (const int32_t *)(base + K);
    a.d = (const float *)(base + 2 * K);
    a.f16 = a.d + K / 32;
    a.f32 = a.f16 + K / 16;
    return a;
}

/* 8 f32 lanes of x times inv, rounded half to even, clamped to +-127, as i8x16 lanes 0..7. */
INLINE v128_t round8(f32x4 a, f32x4 b, f32x4 inv) {
    f32x4 lim = F4(127.0f), neg = F4(-127.0f);
    v128_t ia = wasm_i32x4_trunc_sat_f32x4(
        wasm_f32x4_max(wasm_f32x4_min(wasm_f32x4_nearest(wasm_f32x4_mul(a, inv)), lim), neg));
    v128_t ib = wasm_i32x4_trunc_sat_f32x4(
        wasm_f32x4_max(wasm_f32x4_min(wasm_f32x4_nearest(wasm_f32x4_mul(b, inv)), lim), neg));
    return wasm_i16x8_narrow_i32x4(ia, ib);
}

/* One row x [K] (K a multiple of 32) into scratch at base, by int8_rows' rule. */
static void quantize_act_row(int K, const float *x, uint8_t *base) {
    int8_t *q = (int8_t *)base;
    int32_t *sum4 = (int32_t *)(base + K);
    float *d = (float *)(base + 2 * K);
    float *f16 = d + K / 32, *f32 = f16 + K / 16;
    for (int b = 0; b < K / 32; b++) {
        const float *xb = x + 32 * b;
        f32x4 v0 = LOAD(xb), v1 = LOAD(xb + 4), v2 = LOAD(xb + 8), v3 = LOAD(xb + 12);
        f32x4 v4 = LOAD(xb + 16), v5 = LOAD(xb + 20), v6 = LOAD(xb + 24), v7 = LOAD(xb + 28);
        f32x4 big = F4(3.40282347e38f);
        /* |v| <= FLT_MAX is false for inf and NaN */
        v128_t ok = wasm_v128_and(
            wasm_v128_and(wasm_v128_and(wasm_f32x4_le(wasm_f32x4_abs(v0), big),
                                        wasm_f32x4_le(wasm_f32x4_abs(v1), big)),
                          wasm_v128_and(wasm_f32x4_le(wasm_f32x4_abs(v2), big),
                                        wasm_f32x4_le(wasm_f32x4_abs(v3), big))),
            wasm_v128_and(wasm_v128_and(wasm_f32x4_le(wasm_f32x4_abs(v4), big),
                                        wasm_f32x4_le(wasm_f32x4_abs(v5), big)),
                          wasm_v128_and(wasm_f32x4_le(wasm_f32x4_abs(v6), big),
                                        wasm_f32x4_le(wasm_f32x4_abs(v7), big))));
        int finite = wasm_i32x4_all_true(ok);
        f32x4 m = wasm_f32x4_max(
            wasm_f32x4_max(wasm_f32x4_max(wasm_f32x4_abs(v0), wasm_f32x4_abs(v1)),
                           wasm_f32x4_max(wasm_f32x4_abs(v2), wasm_f32x4_abs(v3))),
            wasm_f32x4_max(wasm_f32x4_max(wasm_f32x4_abs(v4), wasm_f32x4_abs(v5)),
                           wasm_f32x4_max(wasm_f32x4_abs(v6), wasm_f32x4_abs(v7))));
        float amax = hmax(m);
        v128_t lo = wasm_i32x4_splat(0), hi = wasm_i32x4_splat(0);
        if (finite && amax >= 0x1p-120f) {
            f32x4 inv = F4(127.0f / amax);
            lo = wasm_i8x16_narrow_i16x8(round8(v0, v1, inv), round8(v2, v3, inv));
            hi = wasm_i8x16_narrow_i16x8(round8(v4, v5, inv), round8(v6, v7, inv));
            d[b] = amax / 127.0f;
        } else {
            d[b] = finite ? 0.0f : __builtin_nanf("");
        }
        STORE(q + 32 * b, lo);
        STORE(q + 32 * b + 16, hi);
        v128_t s_lo = wasm_i32x4_extadd_pairwise_i16x8(wasm_i16x8_extadd_pairwise_i8x16(lo));
        v128_t s_hi = wasm_i32x4_extadd_pairwise_i16x8(wasm_i16x8_extadd_pairwise_i8x16(hi));
        STORE(sum4 + 8 * b, s_lo);
        STORE(sum4 + 8 * b + 4, s_hi);
        int a0 = wasm_i32x4_extract_lane(s_lo, 0) + wasm_i32x4_extract_lane(s_lo, 1)
                 + wasm_i32x4_extract_lane(s_lo, 2) + wasm_i32x4_extract_lane(s_lo, 3);
        int a1 = wasm_i32x4_extract_lane(s_hi, 0) + wasm_i32x4_extract_lane(s_hi, 1)
                 + wasm_i32x4_extract_lane(s_hi, 2) + wasm_i32x4_extract_lane(s_hi, 3);
        f16[2 * b] = (float)a0 * d[b];
        f16[2 * b + 1] = (float)a1 * d[b];
        f32[b] = (float)(a0 + a1) * d[b];
    }
}

/* ---- the weights' levels, 32 at a time ------------------------------------------------------ */
/* Levels 32g .. 32g+31 of a block (element order), unsigned level + level_bias(type) except
 * Q8_0 (signed), and the scales of their two 16-element quarters. */
typedef struct { v128_t lo, hi; float s0, s1; } levels32;

INLINE int level_bias(const int type) {
    switch (type) {
    case T_Q4_0: return 8;
    case T_Q5_0: return 16;
    case T_Q3_K: return 4;
    case T_Q6_K: return 32;
    default: return 0;
    }
}

INLINE levels32 levels_of(const int type, const uint8_t *blk, int g, float d) {
    const v128_t low_nibble = wasm_i8x16_splat(0x0F);
    levels32 w;
    w.s0 = w.s1 = d;
    switch (type) {
    case T_Q4_0: case T_Q4_1: {
        v128_t qs = LOAD(blk + (type == T_Q4_0 ? 2 : 4));
        w.lo = wasm_v128_and(qs, low_nibble);
        w.hi = wasm_u8x16_shr(qs, 4);
        return w;
    }
    case T_Q5_0: case T_Q5_1: {
        int at = type == T_Q5_0 ? 2 : 4;
        uint32_t qh = u32_at(blk + at);
        v128_t qs = LOAD(blk + at + 4);
        w.lo = wasm_v128_or(wasm_v128_and(qs, low_nibble), q5_high_bits(qh, 0));
        w.hi = wasm_v128_or(wasm_u8x16_shr(qs, 4), q5_high_bits(qh, 16));
        return w;
    }
    case T_Q8_0:
        w.lo = LOAD(blk + 2);
        w.hi = LOAD(blk + 18);
        return w;
    case T_Q2_K: {
        int h = g >> 2, j = g & 3;
        const uint8_t *qs = blk + 16 + 32 * h;
        v128_t three = wasm_i8x16_splat(3);
        w.lo = wasm_v128_and(wasm_u8x16_shr(LOAD(qs), 2 * j), three);
        w.hi = wasm_v128_and(wasm_u8x16_shr(LOAD(qs + 16), 2 * j), three);
        w.s0 = d * (float)(blk[2 * g] & 0x0F);
        w.s1 = d * (float)(blk[2 * g + 1] & 0x0F);
        return w;
    }
    case T_Q3_K: {
        /* level + 4: the low 2 bits, plus 4 where bit g of hmask is set */
        int h = g >> 2, j = g & 3;
        const uint8_t *qs = blk + 32 + 32 * h;
        v128_t three = wasm_i8x16_splat(3), four = wasm_i8x16_splat(4);
        v128_t bit = wasm_i8x16_splat((int8_t)(1 << g));
        v128_t set_lo = wasm_i8x16_eq(wasm_v128_and(LOAD(blk), bit), bit);
        v128_t set_hi = wasm_i8x16_eq(wasm_v128_and(LOAD(blk + 16), bit), bit);
        w.lo = wasm_v128_or(wasm_v128_and(wasm_u8x16_shr(LOAD(qs), 2 * j), three),
                            wasm_v128_and(set_lo, four));
        w.hi = wasm_v128_or(wasm_v128_and(wasm_u8x16_shr(LOAD(qs + 16), 2 * j), three),
                            wasm_v128_and(set_hi, four));
        w.s0 = d * (float)q3k_scale(blk + 96, 2 * g);
        w.s1 = d * (float)q3k_scale(blk + 96, 2 * g + 1);
        return w;
    }
    case T_Q4_K: case T_Q5_K: {
        const uint8_t *qs = blk + (type == T_Q4_K ? 16 : 48) + 32 * (g >> 1);
        v128_t q0 = LOAD(qs), q1 = LOAD(qs + 16);
        if (g & 1) {
            w.lo = wasm_u8x16_shr(q0, 4);
            w.hi = wasm_u8x16_shr(q1, 4);
        } else {
            w.lo = wasm_v128_and(q0, low_nibble);
            w.hi = wasm_v128_and(q1, low_nibble);
        }
        if (type == T_Q5_K) {
            v128_t one = wasm_i8x16_splat(1);
            w.lo = wasm_v128_or(w.lo, wasm_i8x16_shl(wasm_v128_and(wasm_u8x16_shr(LOAD(blk + 16), g), one), 4));
            w.hi = wasm_v128_or(w.hi, wasm_i8x16_shl(wasm_v128_and(wasm_u8x16_shr(LOAD(blk + 32), g), one), 4));
        }
        w.s0 = w.s1 = d * (float)k4_scale(blk + 4, g);
        return w;
    }
    case T_Q6_K: {
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
        v128_t three = wasm_i8x16_splat(3);
        w.lo = wasm_v128_or(l0, wasm_i8x16_shl(wasm_v128_and(wasm_u8x16_shr(LOAD(qh), 2 * j), three), 4));
        w.hi = wasm_v128_or(l1, wasm_i8x16_shl(wasm_v128_and(wasm_u8x16_shr(LOAD(qh + 16), 2 * j), three), 4));
        const int8_t *scale = (const int8_t *)(blk + 192);
        w.s0 = d * (float)scale[2 * g];
        w.s1 = d * (float)scale[2 * g + 1];
        return w;
    }
    default:
        w.lo = w.hi = wasm_i8x16_splat(0);
        w.s0 = w.s1 = __builtin_nanf("");
        return w;
    }
}

/* The block's f16 scale d as quant_unpack forms the scales: the legacy types' d, the k-quants'
 * super-scale (their sub-scales are applied in levels_of). */
INLINE float block_d(const int type, const uint8_t *blk) { return scales_of(type, blk).d; }

/* i32x4: per lane (4 consecutive elements) the sum of level * q over 16 elements, exact. */
INLINE v128_t lane_dots(const int type, v128_t levels, v128_t q, const int32_t *sum4) {
    const int bias = level_bias(type);
#ifdef KERNELS_RELAXED
    if (type != T_Q8_0) {
        v128_t start = bias ? wasm_i32x4_mul(LOAD(sum4), I4(-bias)) : I4(0);
        return wasm_i32x4_relaxed_dot_i8x16_i7x16_add(q, levels, start);
    }
#endif
    v128_t w = (type == T_Q8_0 || !bias) ? levels : wasm_i8x16_sub(levels, wasm_i8x16_splat((int8_t)bias));
    v128_t lo = wasm_i32x4_dot_i16x8(wasm_i16x8_extend_low_i8x16(w), wasm_i16x8_extend_low_i8x16(q));
    v128_t hi = wasm_i32x4_dot_i16x8(wasm_i16x8_extend_high_i8x16(w), wasm_i16x8_extend_high_i8x16(q));
    return wasm_i32x4_add(wasm_i32x4_shuffle(lo, hi, 0, 2, 4, 6), wasm_i32x4_shuffle(lo, hi, 1, 3, 5, 7));
}

/* acc + f32(L) * (s * d), the reference's order. */
INLINE f32x4 lane_epilogue(f32x4 acc, v128_t dots, float s, float d) {
    return wasm_f32x4_add(acc, wasm_f32x4_mul(wasm_f32x4_convert_i32x4(dots), F4(s * d)));
}

typedef struct { f32x4 a, b, c, e; } lanes16;

/* The 16 lanes after the 32 elements at k (global 32-element group index k / 32): lanes 0..7
 * for an even group, 8..15 for an odd one. */
INLINE lanes16 step32(const int type, lanes16 f, levels32 w, act_row x, int k) {
    float d = x.d[k >> 5];
    v128_t l0 = lane_dots(type, w.lo, LOAD(x.q + k), x.sum4 + (k >> 2));
    v128_t l1 = lane_dots(type, w.hi, LOAD(x.q + k + 16), x.sum4 + (k >> 2) + 4);
    if ((k >> 5) & 1) {
        f.c = lane_epilogue(f.c, l0, w.s0, d);
        f.e = lane_epilogue(f.e, l1, w.s1, d);
    } else {
        f.a = lane_epilogue(f.a, l0, w.s0, d);
        f.b = lane_epilogue(f.b, l1, w.s1, d);
    }
    return f;
}

INLINE float fold16(lanes16 f) {
    f32x4 c = wasm_f32x4_add(wasm_f32x4_add(f.a, f.c), wasm_f32x4_add(f.b, f.e));
    return (wasm_f32x4_extract_lane(c, 0) + wasm_f32x4_extract_lane(c, 2))
           + (wasm_f32x4_extract_lane(c, 1) + wasm_f32x4_extract_lane(c, 3));
}

/* Whether the type's values carry an offset (value = scale * level + offset). */
INLINE int has_offsets(const int type) {
    return type == T_Q4_1 || type == T_Q5_1 || type == T_Q2_K || type == T_Q4_K || type == T_Q5_K;
}

/* The offset of group g (of `og` elements: 16, or the type's own 32) of one weight row. */
INLINE float offset_of(const int type, const uint8_t *row, int og, int g) {
    int bb = block_bytes(type);
    if (type == T_Q2_K) { /* groups of 16 */
        const uint8_t *blk = row + (g >> 4) * bb;
        return -(f16_at(blk + 82) * (float)(blk[g & 15] >> 4));
    }
    int g32 = og == 16 ? g >> 1 : g;
    if (type == T_Q4_1 || type == T_Q5_1) return f16_at(row + g32 * bb + 2);
    const uint8_t *blk = row + (g32 >> 3) * bb;
    return -(f16_at(blk + 2) * (float)k4_min(blk + 4, g32 & 7));
}

/* fold(o) of the reference: o[g mod 16] += offset_g * factor_g over the row's groups in order
 * (lanes past the last group get + 0.0, which leaves them as they are: a lane that starts at
 * +0 and only adds is never -0). */
INLINE float offsets_total(const int type, const uint8_t *row, int K, int og, const float *factors) {
    int groups = K / og;
    lanes16 o;
    o.a = o.b = o.c = o.e = F4(0.0f);
#define OFF_(g) ((g) < groups ? offset_of(type, row, og, (g)) * factors[(g)] : 0.0f)
#define OFF4_(g) wasm_f32x4_make(OFF_(g), OFF_((g) + 1), OFF_((g) + 2), OFF_((g) + 3))
    for (int g = 0; g < groups; g += 16) {
        o.a = wasm_f32x4_add(o.a, OFF4_(g));
        if (g + 4 < groups) o.b = wasm_f32x4_add(o.b, OFF4_(g + 4));
        if (g + 8 < groups) o.c = wasm_f32x4_add(o.c, OFF4_(g + 8));
        if (g + 12 < groups) o.e = wasm_f32x4_add(o.e, OFF4_(g + 12));
    }
#undef OFF4_
#undef OFF_
    return fold16(o);
}

/* Y[r, n] for R rows of X (quantized at `acts`, act_row_bytes(K) apart), every weight row. */
INLINE void int8_rows(const int type, const int R, int N, int K, const uint8_t *W, int join,
                      const uint8_t *acts, float *Y, int y_rs) {
    const int be = block_elems(type), bb = block_bytes(type), G = be / 32;
    const int nb = K / be, row_bytes = nb * bb, stride = act_row_bytes(K);
    const int og = (join & INT8_OFFSETS_16) || type == T_Q2_K || type == T_Q3_K || type == T_Q6_K ? 16 : 32;
    const int offsets = has_offsets(type), zero_offsets = !offsets && (join & INT8_OFFSETS_JOINED);
    act_row x0 = act_row_at(acts, K), x1 = act_row_at(acts + stride, K);
    act_row x2 = act_row_at(acts + 2 * stride, K), x3 = act_row_at(acts + 3 * stride, K);
    for (int n = 0; n < N; n++) {
        const uint8_t *row = W + n * row_bytes;
        lanes16 f0, f1, f2, f3;
        f0.a = f0.b = f0.c = f0.e = F4(0.0f);
        f1 = f2 = f3 = f0;
        for (int b = 0; b < nb; b++) {
            const uint8_t *blk = row + b * bb;
            float d = block_d(type, blk);
#pragma clang loop unroll(full)
            for (int g = 0; g < G; g++) {
                levels32 w = levels_of(type, blk, g, d);
                int k = b * be + 32 * g;
                f0 = step32(type, f0, w, x0, k);
                if (R > 1) f1 = step32(type, f1, w, x1, k);
                if (R > 2) f2 = step32(type, f2, w, x2, k);
                if (R > 3) f3 = step32(type, f3, w, x3, k);
            }
        }
        float *y = Y + n;
        y[0] = fold16(f0);
        if (R > 1) y[y_rs] = fold16(f1);
        if (R > 2) y[2 * y_rs] = fold16(f2);
        if (R > 3) y[3 * y_rs] = fold16(f3);
        if (offsets) {
            y[0] += offsets_total(type, row, K, og, og == 16 ? x0.f16 : x0.f32);
            if (R > 1) y[y_rs] += offsets_total(type, row, K, og, og == 16 ? x1.f16 : x1.f32);
            if (R > 2) y[2 * y_rs] += offsets_total(type, row, K, og, og == 16 ? x2.f16 : x2.f32);
            if (R > 3) y[3 * y_rs] += offsets_total(type, row, K, og, og == 16 ? x3.f16 : x3.f32);
        } else if (zero_offsets) {
            /* a piece without offsets in a joined weight with some: numba adds fold(0s) */
            y[0] += 0.0f;
            if (R > 1) y[y_rs] += 0.0f;
            if (R > 2) y[2 * y_rs] += 0.0f;
            if (R > 3) y[3 * y_rs] += 0.0f;
        }
    }
}

INLINE void int8_typed(const int type, int M, int N, int K, const float *X, int x_rs,
                       const uint8_t *W, int join, float *Y, int y_rs, uint8_t *scratch) {
    const int stride = act_row_bytes(K);
    for (int m = 0; m < M; m += 4) {
        int R = imin(4, M - m);
        for (int r = 0; r < R; r++) quantize_act_row(K, X + (m + r) * x_rs, scratch + r * stride);
        float *y = Y + m * y_rs;
        switch (R) {
        case 4: int8_rows(type, 4, N, K, W, join, scratch, y, y_rs); break;
        case 3: int8_rows(type, 3, N, K, W, join, scratch, y, y_rs); break;
        case 2: int8_rows(type, 2, N, K, W, join, scratch, y, y_rs); break;
        default: int8_rows(type, 1, N, K, W, join, scratch, y, y_rs); break;
        }
    }
}

/* type: a GGML type id, with abi.py's MATRIX_INT8 / INT8_OFFSETS_* bits allowed. An unknown
 * type, K not a whole number of blocks, or rows too long for scratch fill Y with NaN. */
KERNEL void linear_q8(int type, int M, int N, int K, const float *X, int x_rs, const uint8_t *W,
                      float *Y, int y_rs, uint8_t *scratch) {
    if (M <= 0 || N <= 0) return;
    int join = type & ~MATRIX_TYPE_MASK, t = type & MATRIX_TYPE_MASK;
    if (block_bytes(t) == 0 || t == T_F16 || K <= 0 || K % block_elems(t)
        || 4 * act_row_bytes(K) > SCRATCH_BYTES) {
        for (int m = 0; m < M; m++)
            for (int n = 0; n < N; n++) Y[m * y_rs + n] = __builtin_nanf("");
        return;
    }
    switch (t) {
    case T_Q4_0: int8_typed(T_Q4_0, M, N, K, X, x_rs, W, join, Y, y_rs, scratch); break;
    case T_Q4_1: int8_typed(T_Q4_1, M, N, K, X, x_rs, W, join, Y, y_rs, scratch); break;
    case T_Q5_0: int8_typed(T_Q5_0, M, N, K, X, x_rs, W, join, Y, y_rs, scratch); break;
    case T_Q5_1: int8_typed(T_Q5_1, M, N, K, X, x_rs, W, join, Y, y_rs, scratch); break;
    case T_Q8_0: int8_typed(T_Q8_0, M, N, K, X, x_rs, W, join, Y, y_rs, scratch); break;
    case T_Q2_K: int8_typed(T_Q2_K, M, N, K, X, x_rs, W, join, Y, y_rs, scratch); break;
    case T_Q3_K: int8_typed(T_Q3_K, M, N, K, X, x_rs, W, join, Y, y_rs, scratch); break;
    case T_Q4_K: int8_typed(T_Q4_K, M, N, K, X, x_rs, W, join, Y, y_rs, scratch); break;
    case T_Q5_K: int8_typed(T_Q5_K, M, N, K, X, x_rs, W, join, Y, y_rs, scratch); break;
    case T_Q6_K: int8_typed(T_Q6_K, M, N, K, X, x_rs, W, join, Y, y_rs, scratch); break;
    default: break;
    }
}

/* The int8 blocks of rows of X (K a multiple of 32): q [rows, K] and d [rows, K / 32], the
 * bytes int8_rows.quantize_activation_rows gives (for tests; scratch holds one row). */
KERNEL void quantize_q8_rows(int rows, int K, const float *X, uint8_t *Q, float *D,
                             uint8_t *scratch) {
    if (K <= 0 || K % 32 || act_row_bytes(K) > SCRATCH_BYTES) return;
    for (int r = 0; r < rows; r++) {
        quantize_act_row(K, X + r * K, scratch);
        act_row a = act_row_at(scratch, K);
        for (int k = 0; k < K; k++) Q[r * K + k] = (uint8_t)a.q[k];
        for (int b = 0; b < K / 32; b++) D[r * (K / 32) + b] = a.d[b];
    }
}
