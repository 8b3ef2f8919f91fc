/* Row kernels (softmax, log-softmax, layer and RMS norm), elementwise activations and RoPE.
 *
 * Each follows the numpy reference's formula operation by operation (same roundings, in the
 * same order), except for the row sums (any order: SIMD lanes) and the transcendental
 * functions, which are this module's own (kernels.h: vexp, vtanh, verf, slog). NaN and inf
 * propagate as in numpy: the maxima are IEEE maximum (NaN wins), a row of -inf gives NaN.
 */
#include "kernels.h"

#define NEG_INF (-__builtin_inff())

/* ---- softmax ------------------------------------------------------------------------------ */

INLINE float row_max(int n, const float *x) {
    f32x4 m0 = F4(NEG_INF), m1 = F4(NEG_INF);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        m0 = wasm_f32x4_max(m0, LOAD(x + i));
        m1 = wasm_f32x4_max(m1, LOAD(x + i + 4));
    }
    for (; i + 4 <= n; i += 4) m0 = wasm_f32x4_max(m0, LOAD(x + i));
    if (i < n) m0 = wasm_f32x4_max(m0, load_partial(x + i, n - i, NEG_INF));
    return hmax(wasm_f32x4_max(m0, m1));
}

KERNEL void softmax_rows(int rows, int n, const float *X, float *Y) {
    for (int r = 0; r < rows; r++) {
        const float *x = X + r * n;
        float *y = Y + r * n;
        f32x4 m = F4(row_max(n, x));
        f32x4 s0 = F4(0), s1 = F4(0);
        int i = 0;
        for (; i + 8 <= n; i += 8) {
            f32x4 e0 = vexp(wasm_f32x4_sub(LOAD(x + i), m));
            f32x4 e1 = vexp(wasm_f32x4_sub(LOAD(x + i + 4), m));
            STORE(y + i, e0);
            STORE(y + i + 4, e1);
            s0 = wasm_f32x4_add(s0, e0);
            s1 = wasm_f32x4_add(s1, e1);
        }
        for (; i + 4 <= n; i += 4) {
            f32x4 e = vexp(wasm_f32x4_sub(LOAD(x + i), m));
            STORE(y + i, e);
            s0 = wasm_f32x4_add(s0, e);
        }
        if (i < n) {
            f32x4 e = vexp(wasm_f32x4_sub(load_partial(x + i, n - i, 0.0f), m));
            store_partial(y + i, n - i, e);
            s1 = wasm_f32x4_add(s1, keep_low_lanes(e, n - i));
        }
        f32x4 s = F4(hsum(wasm_f32x4_add(s0, s1)));
        i = 0;
        for (; i + 4 <= n; i += 4) STORE(y + i, wasm_f32x4_div(LOAD(y + i), s));
        if (i < n) store_partial(y + i, n - i, wasm_f32x4_div(load_partial(y + i, n - i, 0.0f), s));
    }
}

KERNEL void log_softmax_rows(int rows, int n, const float *X, float *Y) {
    for (int r = 0; r < rows; r++) {
        const float *x = X + r * n;
        float *y = Y + r * n;
        f32x4 m = F4(row_max(n, x));
        f32x4 s0 = F4(0), s1 = F4(0);
        int i = 0;
        for (; i + 8 <= n; i += 8) {
            s0 = wasm_f32x4_add(s0, vexp(wasm_f32x4_sub(LOAD(x + i), m)));
            s1 = wasm_f32x4_add(s1, vexp(wasm_f32x4_sub(LOAD(x + i + 4), m)));
        }
        for (; i + 4 <= n; i += 4) s0 = wasm_f32x4_add(s0, vexp(wasm_f32x4_sub(LOAD(x + i), m)));
        if (i < n) {
            f32x4 e = vexp(wasm_f32x4_sub(load_partial(x + i, n - i, 0.0f), m));
            s1 = wasm_f32x4_add(s1, keep_low_lanes(e, n - i));
        }
        f32x4 log_sum = F4(slog(hsum(wasm_f32x4_add(s0, s1))));
        i = 0;
        for (; i + 4 <= n; i += 4)
            STORE(y + i, wasm_f32x4_sub(wasm_f32x4_sub(LOAD(x + i), m), log_sum));
        if (i < n)
            store_partial(y + i, n - i,
                          wasm_f32x4_sub(wasm_f32x4_sub(load_partial(x + i, n - i, 0.0f), m), log_sum));
    }
}

/* ---- norms --------------------------------------------------------------------------------- */

INLINE float row_sum(int n, const float *x) {
    f32x4 s0 = F4(0), s1 = F4(0);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        s0 = wasm_f32x4_add(s0, LOAD(x + i));
        s1 = wasm_f32x4_add(s1, LOAD(x + i + 4));
    }
    for (; i + 4 <= n; i += 4) s0 = wasm_f32x4_add(s0, LOAD(x + i));
    if (i < n) s1 = wasm_f32x4_add(s1, load_partial(x + i, n - i, 0.0f));
    return hsum(wasm_f32x4_add(s0, s1));
}

/* sum of (x - c)^2 (c = 0 for RMS norm) */
INLINE float row_sum_sq(int n, const float *x, float c) {
    f32x4 cv = F4(c), s0 = F4(0), s1 = F4(0);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        f32x4 d0 = wasm_f32x4_sub(LOAD(x + i), cv), d1 = wasm_f32x4_sub(LOAD(x + i + 4), cv);
        s0 = FMA(d0, d0, s0);
        s1 = FMA(d1, d1, s1);
    }
    for (; i + 4 <= n; i += 4) {
        f32x4 d = wasm_f32x4_sub(LOAD(x + i), cv);
        s0 = FMA(d, d, s0);
    }
    if (i < n) {
        f32x4 d = wasm_f32x4_sub(load_partial(x + i, n - i, c), cv); /* padded lanes: 0 */
        s1 = FMA(d, d, s1);
    }
    return hsum(wasm_f32x4_add(s0, s1));
}

/* y = (x - c) / sigma [* w] [+ b], as numpy: divide, then multiply, then add. */
INLINE f32x4 norm4(f32x4 x, f32x4 c, f32x4 sigma, const float *w, const float *b, int i, int rem) {
    f32x4 y = wasm_f32x4_div(wasm_f32x4_sub(x, c), sigma);
    if (w) y = wasm_f32x4_mul(y, rem ? load_partial(w + i, rem, 0.0f) : LOAD(w + i));
    if (b) y = wasm_f32x4_add(y, rem ? load_partial(b + i, rem, 0.0f) : LOAD(b + i));
    return y;
}

INLINE void normalize_row(int n, const float *x, float c, float sigma, const float *w,
                          const float *b, float *y) {
    f32x4 cv = F4(c), sv = F4(sigma);
    int i = 0;
    for (; i + 4 <= n; i += 4) STORE(y + i, norm4(LOAD(x + i), cv, sv, w, b, i, 0));
    if (i < n) store_partial(y + i, n - i, norm4(load_partial(x + i, n - i, 0.0f), cv, sv, w, b, i, n - i));
}

KERNEL void layer_norm_rows(int rows, int n, const float *X, const float *W, const float *B,
                            float eps, float *Y) {
    for (int r = 0; r < rows; r++) {
        const float *x = X + r * n;
        float mean = row_sum(n, x) / (float)n;
        float var = row_sum_sq(n, x, mean) / (float)n;
        normalize_row(n, x, mean, __builtin_sqrtf(var + eps), W, B, Y + r * n);
    }
}

KERNEL void rms_norm_rows(int rows, int n, const float *X, const float *W, float eps, float *Y) {
    for (int r = 0; r < rows; r++) {
        const float *x = X + r * n;
        float mean_sq = row_sum_sq(n, x, 0.0f) / (float)n;
        normalize_row(n, x, 0.0f, __builtin_sqrtf(mean_sq + eps), W, 0, Y + r * n);
    }
}

/* ---- activations ----------------------------------------------------------------------------- */

#define SQRT_2_OVER_PI 0.7978845608028654f
#define GELU_TANH_CUBIC 0.044715f
#define INV_SQRT_2 0.7071067811865476f

/* exp(-|x|) never overflows; x >= 0: 1 / (1 + e), else e / (1 + e) (the reference's branches) */
INLINE f32x4 vsigmoid(f32x4 x) {
    f32x4 e = vexp(wasm_f32x4_neg(wasm_f32x4_abs(x)));
    f32x4 den = wasm_f32x4_add(F4(1.0f), e);
    f32x4 pos = wasm_f32x4_div(F4(1.0f), den), neg = wasm_f32x4_div(e, den);
    return wasm_v128_bitselect(pos, neg, wasm_f32x4_ge(x, F4(0.0f)));
}

INLINE f32x4 unary_op(const int op, f32x4 x) {
    switch (op) {
    case UNARY_GELU: {
        /* 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x * x * x))), left to right */
        f32x4 cube = wasm_f32x4_mul(wasm_f32x4_mul(wasm_f32x4_mul(F4(GELU_TANH_CUBIC), x), x), x);
        f32x4 t = vtanh(wasm_f32x4_mul(F4(SQRT_2_OVER_PI), wasm_f32x4_add(x, cube)));
        return wasm_f32x4_mul(wasm_f32x4_mul(F4(0.5f), x), wasm_f32x4_add(F4(1.0f), t));
    }
    case UNARY_GELU_ERF: {
        f32x4 e = verf(wasm_f32x4_mul(x, F4(INV_SQRT_2)));
        return wasm_f32x4_mul(wasm_f32x4_mul(F4(0.5f), x), wasm_f32x4_add(F4(1.0f), e));
    }
    case UNARY_SILU: return wasm_f32x4_mul(x, vsigmoid(x));
    case UNARY_EXP: return vexp(x);
    case UNARY_TANH: return vtanh(x);
    case UNARY_SIGMOID: return vsigmoid(x);
    case UNARY_ERF: return verf(x);
    default: return F4(__builtin_nanf(""));
    }
}

INLINE void unary_loop(const int op, int n, const float *x, float *y) {
    int i = 0;
    for (; i + 4 <= n; i += 4) STORE(y + i, unary_op(op, LOAD(x + i)));
    if (i < n) store_partial(y + i, n - i, unary_op(op, load_partial(x + i, n - i, 0.0f)));
}

/* op: 0 gelu (tanh form), 1 gelu_erf, 2 silu, 3 exp, 4 tanh, 5 sigmoid, 6 erf; another op
 * fills Y with NaN. Y may equal X. */
KERNEL void unary_f32(int op, int n, const float *X, float *Y) {
    switch (op) {
    case UNARY_GELU: unary_loop(UNARY_GELU, n, X, Y); break;
    case UNARY_GELU_ERF: unary_loop(UNARY_GELU_ERF, n, X, Y); break;
    case UNARY_SILU: unary_loop(UNARY_SILU, n, X, Y); break;
    case UNARY_EXP: unary_loop(UNARY_EXP, n, X, Y); break;
    case UNARY_TANH: unary_loop(UNARY_TANH, n, X, Y); break;
    case UNARY_SIGMOID: unary_loop(UNARY_SIGMOID, n, X, Y); break;
    case UNARY_ERF: unary_loop(UNARY_ERF, n, X, Y); break;
    default: unary_loop(-1, n, X, Y); break;
    }
}

KERNEL void silu_mul(int n, const float *G, const float *U, float *Y) {
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        f32x4 g = LOAD(G + i);
        STORE(Y + i, wasm_f32x4_mul(wasm_f32x4_mul(g, vsigmoid(g)), LOAD(U + i)));
    }
    if (i < n) {
        f32x4 g = load_partial(G + i, n - i, 0.0f);
        store_partial(Y + i, n - i,
                      wasm_f32x4_mul(wasm_f32x4_mul(g, vsigmoid(g)), load_partial(U + i, n - i, 0.0f)));
    }
}

/* ---- RoPE ------------------------------------------------------------------------------------ */

/* interleaved = 0 (halves): y[j] = x[j] c - x[j + d/2] s, y[j + d/2] = x[j + d/2] c + x[j] s;
 * interleaved = 1 (pairs):  y[2j] = x[2j] c - x[2j+1] s, y[2j+1] = x[2j] s + x[2j+1] c;
 * c, s = COS[i, j], SIN[i, j] for position i. Products and the sum rounded separately, as
 * numpy. Y may equal X (every element is read before its row is written). */
KERNEL void rope_f32(int interleaved, int bh, int t, int d, const float *X, const float *COS,
                     const float *SIN, float *Y) {
    int half = d / 2;
    for (int b = 0; b < bh; b++) {
        for (int i = 0; i < t; i++) {
            const float *x = X + (b * t + i) * d;
            float *y = Y + (b * t + i) * d;
            const float *cs = COS + i * half, *sn = SIN + i * half;
            int j = 0;
            if (!interleaved) {
                for (; j + 4 <= half; j += 4) {
                    f32x4 x1 = LOAD(x + j), x2 = LOAD(x + j + half);
                    f32x4 c = LOAD(cs + j), s = LOAD(sn + j);
                    STORE(y + j, wasm_f32x4_sub(wasm_f32x4_mul(x1, c), wasm_f32x4_mul(x2, s)));
                    STORE(y + j + half, wasm_f32x4_add(wasm_f32x4_mul(x2, c), wasm_f32x4_mul(x1, s)));
                }
                for (; j < half; j++) {
                    float x1 = x[j], x2 = x[j + half];
                    y[j] = x1 * cs[j] - x2 * sn[j];
                    y[j + half] = x2 * cs[j] + x1 * sn[j];
                }
            } else {
                for (; j + 4 <= half; j += 4) {
                    f32x4 v0 = LOAD(x + 2 * j), v1 = LOAD(x + 2 * j + 4);
                    f32x4 ev = wasm_i32x4_shuffle(v0, v1, 0, 2, 4, 6);
                    f32x4 od = wasm_i32x4_shuffle(v0, v1, 1, 3, 5, 7);
                    f32x4 c = LOAD(cs + j), s = LOAD(sn + j);
                    f32x4 ye = wasm_f32x4_sub(wasm_f32x4_mul(ev, c), wasm_f32x4_mul(od, s));
                    f32x4 yo = wasm_f32x4_add(wasm_f32x4_mul(ev, s), wasm_f32x4_mul(od, c));
                    STORE(y + 2 * j, wasm_i32x4_shuffle(ye, yo, 0, 4, 1, 5));
                    STORE(y + 2 * j + 4, wasm_i32x4_shuffle(ye, yo, 2, 6, 3, 7));
                }
                for (; j < half; j++) {
                    float ev = x[2 * j], od = x[2 * j + 1];
                    y[2 * j] = ev * cs[j] - od * sn[j];
                    y[2 * j + 1] = ev * sn[j] + od * cs[j];
                }
            }
        }
    }
}
