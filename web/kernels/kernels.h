/* Shared definitions of candle-web's WebAssembly SIMD kernels (see README.md for the ABI).
 *
 * The ABI's constants and every export's prototype come from kernels_abi.h, which
 * scripts/build_kernels.py generates from pkg/candle_web/backend/wasm/abi.py before compiling
 * (into web/vendor/, never committed); what one file calls in another and is not exported is
 * declared at the end of this header (team_jobs.h for the threads build's jobs).
 *
 * Rules every kernel keeps, checked at build time by scripts/wasm_check.py:
 * - no stack: no local arrays, no address-taken locals, no struct returns that survive
 *   inlining (the module runs on Pyodide's own memory, where wasm-ld's __stack_pointer points
 *   into Pyodide's heap); everything lives in wasm locals or in the caller's scratch buffer;
 * - no data segments: constants are immediates (wasm_f32x4_const/splat), never tables;
 * - no imports but env.memory: no libc (built with -nostdlib -fno-builtin).
 *
 * KERNELS_RELAXED selects the relaxed-SIMD build: FMA() is then relaxed_madd (fused where
 * the engine has FMA); the plain-SIMD build computes a * b + c as a multiply and an add.
 * Dequantization and the elementwise formulas never use FMA(): they reproduce the numpy
 * reference's roundings exactly (the sources are built with -ffp-contract=off).
 */
#ifndef CANDLE_KERNELS_H
#define CANDLE_KERNELS_H

#include <stdint.h>
#include <wasm_simd128.h>

#include "kernels_abi.h"

typedef v128_t f32x4;

#define INLINE static inline __attribute__((always_inline))
#define KERNEL __attribute__((visibility("default")))

#ifdef KERNELS_RELAXED
#define FMA(a, b, c) \
    ((v128_t)__builtin_wasm_relaxed_madd_f32x4((__f32x4)(a), (__f32x4)(b), (__f32x4)(c)))
#else
#define FMA(a, b, c) wasm_f32x4_add(wasm_f32x4_mul((a), (b)), (c))
#endif

#define F4(x) wasm_f32x4_splat(x)
#define I4(x) wasm_i32x4_splat(x)
#define LOAD(p) wasm_v128_load((const void *)(p))
#define STORE(p, v) wasm_v128_store((void *)(p), (v))
#define SPLAT_LOAD(p) wasm_v128_load32_splat((const void *)(p))

/* ---- the scratch buffer (one caller-provided block, 16-byte aligned) ----------------------
 * GEMM packing panels and the edge tile; the GEMV copies of strided rows; the dequantized
 * weight tile of the prompt-sized linear path (disjoint from what its GEMM uses); attention
 * uses the buffer on its own (it never calls the GEMM). Offsets in bytes. */
#define GEMM_MR 4
#define GEMM_NR 8
#define GEMM_KC 256
#define GEMM_NC 512
#define GEMM_MC 128
#define SCRATCH_BPACK 0                                               /* KC x NC floats */
#define SCRATCH_APACK (SCRATCH_BPACK + GEMM_KC * GEMM_NC * 4)           /* MC x KC floats */
#define SCRATCH_TILE (SCRATCH_APACK + GEMM_MC * GEMM_KC * 4)            /* MR x NR floats */
#define SCRATCH_XCOPY (SCRATCH_TILE + 4096)                             /* GEMV rows */
#define SCRATCH_XCOPY_BYTES (1024 * 1024 - SCRATCH_XCOPY)
#define SCRATCH_DEQ (1024 * 1024)                                       /* linear: W tile */
#define SCRATCH_DEQ_BYTES (1024 * 1024)
#define SCRATCH_BYTES (SCRATCH_DEQ + SCRATCH_DEQ_BYTES)

/* ---- small helpers --------------------------------------------------------------------- */
INLINE int imin(int a, int b) { return a < b ? a : b; }
INLINE int imax(int a, int b) { return a > b ? a : b; }

INLINE float bits_to_f32(uint32_t u) { return __builtin_bit_cast(float, u); }
INLINE uint32_t f32_to_bits(float f) { return __builtin_bit_cast(uint32_t, f); }

/* NaN-propagating scalar max (numpy's np.max semantics; fmaxf would drop NaN). */
INLINE float nan_max(float a, float b) {
    if (a != a) return a;
    if (b != b) return b;
    return a > b ? a : b;
}

/* Subnormal operands or results cost x86 a microcode assist (~100+ cycles per instruction;
 * wasm engines never set flush-to-zero), so the conversions and exp() below never multiply a
 * subnormal and only produce one when the true result is one. */

/* IEEE half bits -> f32, exact (subnormals, inf and NaN payloads included). */
INLINE float half_to_f32(uint32_t h) {
    uint32_t sign = (h & 0x8000u) << 16;
    uint32_t em = h & 0x7fffu;
    if (em - 0x0400u < 0x7800u) /* normal (exponent 1..30): rebias the exponent by 112 */
        return bits_to_f32(((em << 13) + 0x38000000u) | sign);
    if (em < 0x0400u) /* zero or subnormal: m * 2^-24, exact */
        return bits_to_f32(f32_to_bits((float)em * 0x1p-24f) | sign);
    return bits_to_f32(((em << 13) + 0x70000000u) | sign); /* inf / NaN (payload kept) */
}

/* Four halves (each sign-extended into an i32 lane) -> four f32, exact for every pattern. */
INLINE f32x4 half4_to_f32(v128_t h) {
    v128_t sign = wasm_v128_and(h, I4((int32_t)0x80000000));
    v128_t em = wasm_v128_and(h, I4(0x7fff));
    v128_t exponent = wasm_v128_and(h, I4(0x7c00));
    v128_t bias = wasm_v128_bitselect(I4(0x70000000), I4(0x38000000),
                                      wasm_i32x4_eq(exponent, I4(0x7c00)));
    v128_t normal = wasm_i32x4_add(wasm_i32x4_shl(em, 13), bias);
    v128_t small = wasm_f32x4_mul(wasm_f32x4_convert_i32x4(em), F4(0x1p-24f));
    v128_t bits = wasm_v128_bitselect(small, normal, wasm_i32x4_eq(exponent, I4(0)));
    return wasm_v128_or(bits, sign);
}

/* Eight halves (i16 lanes), all normal (exponent 1..30) -> f32 lanes 0-3 and 4-7: the f32
 * bits are built in 16-bit halves (high: sign | exponent + 112 | 7 mantissa bits, low:
 * 3 mantissa bits << 13) and interleaved; integer operations only. em = h & 0x7fff. */
#define HALF8_NORMAL_TO_F32(h, em, lo4, hi4)                                           \
    do {                                                                                \
        v128_t top_ = wasm_v128_or(wasm_i16x8_add(wasm_u16x8_shr(em, 3),                \
                                                  wasm_i16x8_splat(0x3800)),            \
                                   wasm_v128_and(h, wasm_i16x8_splat((int16_t)0x8000))); \
        v128_t bottom_ = wasm_i16x8_shl(h, 13);                                         \
        lo4 = wasm_i16x8_shuffle(bottom_, top_, 0, 8, 1, 9, 2, 10, 3, 11);              \
        hi4 = wasm_i16x8_shuffle(bottom_, top_, 4, 12, 5, 13, 6, 14, 7, 15);            \
    } while (0)

/* (sum a0, sum a1, sum a2, sum a3) */
INLINE f32x4 hsum4(f32x4 a0, f32x4 a1, f32x4 a2, f32x4 a3) {
    f32x4 s01 = wasm_f32x4_add(wasm_i32x4_shuffle(a0, a1, 0, 4, 1, 5),
                               wasm_i32x4_shuffle(a0, a1, 2, 6, 3, 7));
    f32x4 s23 = wasm_f32x4_add(wasm_i32x4_shuffle(a2, a3, 0, 4, 1, 5),
                               wasm_i32x4_shuffle(a2, a3, 2, 6, 3, 7));
    return wasm_f32x4_add(wasm_i32x4_shuffle(s01, s23, 0, 1, 4, 5),
                          wasm_i32x4_shuffle(s01, s23, 2, 3, 6, 7));
}

INLINE float hsum(f32x4 a) {
    f32x4 s = wasm_f32x4_add(a, wasm_i32x4_shuffle(a, a, 2, 3, 0, 1));
    s = wasm_f32x4_add(s, wasm_i32x4_shuffle(s, s, 1, 0, 3, 2));
    return wasm_f32x4_extract_lane(s, 0);
}

/* NaN-propagating (f32x4.max is IEEE maximum: NaN if either lane is NaN). */
INLINE float hmax(f32x4 a) {
    f32x4 s = wasm_f32x4_max(a, wasm_i32x4_shuffle(a, a, 2, 3, 0, 1));
    s = wasm_f32x4_max(s, wasm_i32x4_shuffle(s, s, 1, 0, 3, 2));
    return wasm_f32x4_extract_lane(s, 0);
}

/* The first `rem` (1..3) floats at p in the low lanes, `pad` in the others; and back. */
INLINE f32x4 load_partial(const float *p, int rem, float pad) {
    f32x4 v = F4(pad);
    v = wasm_f32x4_replace_lane(v, 0, p[0]);
    if (rem > 1) v = wasm_f32x4_replace_lane(v, 1, p[1]);
    if (rem > 2) v = wasm_f32x4_replace_lane(v, 2, p[2]);
    return v;
}

INLINE void store_partial(float *p, int rem, f32x4 v) {
    p[0] = wasm_f32x4_extract_lane(v, 0);
    if (rem > 1) p[1] = wasm_f32x4_extract_lane(v, 1);
    if (rem > 2) p[2] = wasm_f32x4_extract_lane(v, 2);
}

/* v with lanes rem..3 set to 0 (rem in 0..4). */
INLINE f32x4 keep_low_lanes(f32x4 v, int rem) {
    v128_t lane = wasm_i32x4_make(0, 1, 2, 3);
    return wasm_v128_and(v, wasm_i32x4_lt(lane, I4(rem)));
}

/* ---- exp: exp(x) = 2^n * e^r, n = nearest(x / ln 2), |r| <= ln2 / 2 ------------------------
 * r = x - n ln2 in two steps (Cody-Waite: ln2_hi has 9 significant bits, so n * ln2_hi is
 * exact for |n| < 2^15); e^r = 1 + (r + r^2 P(r)) with P a degree-4 least-squares fit of
 * (e^r - 1 - r) / r^2 (relative error 1e-8 before rounding).
 * Results in the normal range (x in [-87.33, 88]) take one scaling by 2^n. A vector with a
 * lane outside takes the wide path: 2^n applied as two factors 2^(n>>1) 2^(n - (n>>1)), so
 * results near overflow and gradual underflow (subnormals) round once and correctly; lanes
 * below -104 (exp rounds to 0) are computed from 0 and zeroed, so a -inf mask costs no
 * subnormal arithmetic. NaN lanes stay NaN (min/max propagate it; comparisons are false).
 * Accuracy: README.md (tested). */
#define EXP_LN2_HI 0.693359375f
#define EXP_LN2_LO -2.12194440e-4f
#define EXP_LOG2E 1.44269504f
#define EXP_NORMAL_LO -87.33f /* exp(x) >= FLT_MIN above */
#define EXP_NORMAL_HI 88.0f   /* n <= 127 below */
#define EXP_ZERO_BELOW -104.0f /* exp(-104) < 2^-150: rounds to 0 */

INLINE f32x4 pow2i(v128_t n) { return wasm_i32x4_shl(wasm_i32x4_add(n, I4(127)), 23); }

/* e^r and n for x: y = e^r (r reduced), *n_out = n as integers. */
INLINE f32x4 exp_reduced(f32x4 x, v128_t *n_out) {
    f32x4 n = wasm_f32x4_nearest(wasm_f32x4_mul(x, F4(EXP_LOG2E)));
    f32x4 r = wasm_f32x4_sub(x, wasm_f32x4_mul(n, F4(EXP_LN2_HI)));
    r = wasm_f32x4_sub(r, wasm_f32x4_mul(n, F4(EXP_LN2_LO)));
    f32x4 p = F4(1.375140739e-03f);
    p = FMA(p, r, F4(8.368915878e-03f));
    p = FMA(p, r, F4(4.166953266e-02f));
    p = FMA(p, r, F4(1.666651815e-01f));
    p = FMA(p, r, F4(4.999998808e-01f));
    f32x4 r2 = wasm_f32x4_mul(r, r);
    *n_out = wasm_i32x4_trunc_sat_f32x4(n); /* NaN -> 0: the result is NaN anyway */
    return wasm_f32x4_add(F4(1.0f), FMA(r2, p, r));
}

__attribute__((noinline)) static f32x4 vexp_wide(f32x4 x) {
    v128_t zero = wasm_f32x4_lt(x, F4(EXP_ZERO_BELOW));
    f32x4 xs = wasm_f32x4_min(wasm_v128_andnot(x, zero), F4(89.0f)); /* exp(89) = inf */
    v128_t ni;
    f32x4 y = exp_reduced(xs, &ni);
    v128_t n1 = wasm_i32x4_shr(ni, 1);
    y = wasm_f32x4_mul(y, pow2i(n1));
    y = wasm_f32x4_mul(y, pow2i(wasm_i32x4_sub(ni, n1)));
    return wasm_v128_andnot(y, zero);
}

INLINE f32x4 vexp(f32x4 x) {
    v128_t outside = wasm_v128_or(wasm_f32x4_lt(x, F4(EXP_NORMAL_LO)),
                                  wasm_f32x4_gt(x, F4(EXP_NORMAL_HI)));
    if (__builtin_expect(wasm_v128_any_true(outside), 0)) return vexp_wide(x);
    v128_t ni;
    f32x4 y = exp_reduced(x, &ni);
    return wasm_f32x4_mul(y, pow2i(ni));
}

INLINE float sexp(float x) { return wasm_f32x4_extract_lane(vexp(F4(x)), 0); }

/* ---- tanh ------------------------------------------------------------------------------
 * |x| < 0.9: x + x^3 P(x^2), P a degree-6 least-squares fit (relative error 1.2e-9);
 * else sign(x) (1 - 2 / (exp(2|x|) + 1)), where 2/(e+1) <= 0.284 so its error shrinks by 0.4
 * in the result; exp(2|x|) = inf gives exactly +-1. Both branches run, one is selected. */
INLINE f32x4 vtanh(f32x4 x) {
    f32x4 ax = wasm_f32x4_abs(x);
    f32x4 x2 = wasm_f32x4_mul(x, x);
    f32x4 p = F4(-4.524849937e-04f);
    p = FMA(p, x2, F4(2.574164188e-03f));
    p = FMA(p, x2, F4(-8.254989982e-03f));
    p = FMA(p, x2, F4(2.165822126e-02f));
    p = FMA(p, x2, F4(-5.392778665e-02f));
    p = FMA(p, x2, F4(1.333295852e-01f));
    p = FMA(p, x2, F4(-3.333332241e-01f));
    f32x4 small = FMA(wasm_f32x4_mul(x2, x), p, x);
    f32x4 e = vexp(wasm_f32x4_add(ax, ax));
    f32x4 big = wasm_f32x4_sub(F4(1.0f), wasm_f32x4_div(F4(2.0f), wasm_f32x4_add(e, F4(1.0f))));
    big = wasm_v128_or(big, wasm_v128_and(x, I4((int32_t)0x80000000))); /* copy the sign */
    return wasm_v128_bitselect(small, big, wasm_f32x4_lt(ax, F4(0.9f)));
}

/* ---- erf -------------------------------------------------------------------------------
 * |x| < 1: x + x P(x^2), P a degree-6 least-squares fit of erf(x)/x - 1 (relative error
 * 1.2e-9; the leading x is exact, so P's roundings are scaled by |P| <= 0.13);
 * |x| >= 1: 1 - t exp(-z^2 + Q(t)), t = 1 / (1 + z/2), the Chebyshev erfc fit the numpy
 * reference uses (numpy_backend._ERFC_COEFFS, fractional error < 1.2e-7 of erfc <= 0.16 here,
 * so < 2e-8 absolute); the sign is copied back. */
INLINE f32x4 verf(f32x4 x) {
    f32x4 z = wasm_f32x4_abs(x);
    f32x4 x2 = wasm_f32x4_mul(x, x);
    f32x4 p = F4(7.847259258e-05f);
    p = FMA(p, x2, F4(-8.008189034e-04f));
    p = FMA(p, x2, F4(5.188099109e-03f));
    p = FMA(p, x2, F4(-2.685369179e-02f));
    p = FMA(p, x2, F4(1.128358245e-01f));
    p = FMA(p, x2, F4(-3.761262596e-01f));
    p = FMA(p, x2, F4(1.283791661e-01f));
    f32x4 small = FMA(x, p, x);
    f32x4 t = wasm_f32x4_div(F4(1.0f), wasm_f32x4_add(F4(1.0f), wasm_f32x4_mul(F4(0.5f), z)));
    f32x4 q = F4(0.17087277f);
    q = FMA(q, t, F4(-0.82215223f));
    q = FMA(q, t, F4(1.48851587f));
    q = FMA(q, t, F4(-1.13520398f));
    q = FMA(q, t, F4(0.27886807f));
    q = FMA(q, t, F4(-0.18628806f));
    q = FMA(q, t, F4(0.09678418f));
    q = FMA(q, t, F4(0.37409196f));
    q = FMA(q, t, F4(1.00002368f));
    q = FMA(q, t, F4(-1.26551223f));
    f32x4 erfc = wasm_f32x4_mul(t, vexp(wasm_f32x4_sub(q, wasm_f32x4_mul(z, z))));
    f32x4 big = wasm_f32x4_sub(F4(1.0f), erfc);
    big = wasm_v128_or(big, wasm_v128_and(x, I4((int32_t)0x80000000)));
    return wasm_v128_bitselect(small, big, wasm_f32x4_lt(z, F4(1.0f)));
}

/* ---- log (scalar, once per row): in double precision, then rounded to f32 ---------------
 * x = 2^e f with f in [sqrt(1/2), sqrt(2)); log f = 2 atanh(u), u = (f - 1)/(f + 1),
 * |u| < 0.172, summed to u^21 (the next term is < 1e-17 of the result). */
INLINE float slog(float xf) {
    if (xf != xf || xf < 0.0f) return __builtin_nanf("");
    if (xf == 0.0f) return -__builtin_inff();
    if (xf == __builtin_inff()) return xf;
    double x = (double)xf;
    uint64_t bits = __builtin_bit_cast(uint64_t, x);
    int e = (int)((bits >> 52) & 0x7ff) - 1023; /* f32 inputs are normal doubles */
    double f = __builtin_bit_cast(double, (bits & 0x000fffffffffffffull) | 0x3ff0000000000000ull);
    if (f > 1.4142135623730951) {
        f *= 0.5;
        e += 1;
    }
    double u = (f - 1.0) / (f + 1.0), u2 = u * u;
    double s = 1.0 / 21.0;
    s = s * u2 + 1.0 / 19.0;
    s = s * u2 + 1.0 / 17.0;
    s = s * u2 + 1.0 / 15.0;
    s = s * u2 + 1.0 / 13.0;
    s = s * u2 + 1.0 / 11.0;
    s = s * u2 + 1.0 / 9.0;
    s = s * u2 + 1.0 / 7.0;
    s = s * u2 + 1.0 / 5.0;
    s = s * u2 + 1.0 / 3.0;
    s = s * u2 + 1.0;
    return (float)(2.0 * u * s + (double)e * 0.69314718055994530942);
}

/* ---- not exported, called across files ----------------------------------------------------- */
/* linear.c, for steps.c: bytes of one row of K weights of a fused step's matrix (MATRIX_F32,
 * MATRIX_F16 or a GGML type id; K a whole number of its blocks); 0 for an unknown type. */
int matrix_row_bytes(int type, int K);

/* gemm.c, for gemm.c and linear.c: */
/* C[m, n] (row stride c_rs) = A[m*a_rs + k*a_cs] @ B[k*b_rs + n*b_cs] (+ C if beta != 0);
 * one matrix, any strides, blocked and packed in scratch (uses [0, SCRATCH_DEQ)). */
void gemm_one(int M, int N, int K, const float *A, int a_rs, int a_cs, const float *B,
              int b_rs, int b_cs, float *C, int c_rs, int beta, uint8_t *scratch);
/* The same, choosing the GEMV / strip / packed path by shape (what gemm_f32 runs per batch);
 * uses [0, SCRATCH_DEQ) of scratch. */
void gemm_2d(int M, int N, int K, const float *A, int a_rs, int a_cs, const float *B, int b_rs,
             int b_cs, float *C, int c_rs, int beta, uint8_t *scratch);

#endif
