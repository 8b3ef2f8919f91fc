/* The convolutions of the vision nets (face-api's detector, landmark, descriptor and age/gender
 * nets), one image [C, H, W] at a time, as the wasm backend's conv2d_bias_act runs them
 * (backend/wasm/backend.py; the reference is Backend.conv2d_bias_act: conv2d, then the bias,
 * then the activation, each rounded to f32 in turn):
 *
 *   im2col_f32          the taps as rows, [C * KH * KW, HO * WO] (zeros where a tap falls in the
 *                       padding), rows `cols_rs` apart (the images of a batch side by side), so
 *                       that one GEMM [C_out, K] @ cols lands in NCHW;
 *   bias_act_f32        y = act(x + bias[row]) over rows of n (after that GEMM);
 *   depthwise_conv_f32  one K x K filter per channel, then the bias and the activation. Taps
 *                       summed in (i, j) order from the first in-bounds one, products and sums
 *                       rounded apart (no FMA): numpy's tap-by-tap sum, bit for bit (a tap in
 *                       the padding adds an exact zero there).
 *
 * Activations (abi.ACTIVATIONS): none; relu max(x, 0); leaky max(x, x * slope); relu6
 * min(max(x, 0), 6) - numpy's maximum/clip, so these steps give the reference's bits.
 */
#include "kernels.h"

INLINE f32x4 activate(int act, f32x4 v, f32x4 slope) {
    switch (act) {
    case ACTIVATION_RELU: return wasm_f32x4_max(v, F4(0.0f));
    case ACTIVATION_LEAKY: return wasm_f32x4_max(v, wasm_f32x4_mul(v, slope));
    case ACTIVATION_RELU6: return wasm_f32x4_min(wasm_f32x4_max(v, F4(0.0f)), F4(6.0f));
    default: return v;
    }
}

INLINE float activate1(int act, float v, float slope) {
    f32x4 out = activate(act, F4(v), F4(slope));
    return wasm_f32x4_extract_lane(out, 0);
}

/* COLS[((c * KH + i) * KW + j) * cols_rs + oy * WO + ox] = x[c][oy * stride - pad + i * dil]
 * [ox * stride - pad + j * dil], or 0 outside the image. */
KERNEL void im2col_f32(int C, int H, int W, int KH, int KW, int stride, int pad, int dilation,
                       const float *X, int cols_rs, float *COLS) {
    int HO = (H + 2 * pad - dilation * (KH - 1) - 1) / stride + 1;
    int WO = (W + 2 * pad - dilation * (KW - 1) - 1) / stride + 1;
    float *col = COLS;
    for (int c = 0; c < C; c++) {
        const float *plane = X + (long)c * H * W;
        for (int i = 0; i < KH; i++) {
            for (int j = 0; j < KW; j++, col += cols_rs) {
                int dx = j * dilation - pad;
                /* the output columns whose source column lies inside the image */
                int lo = dx < 0 ? (-dx + stride - 1) / stride : 0;
                int hi = (W - 1 - dx) < 0 ? 0 : (W - 1 - dx) / stride + 1;
                if (hi > WO) hi = WO;
                if (lo > hi) lo = hi;
                for (int oy = 0; oy < HO; oy++) {
                    float *out = col + (long)oy * WO;
                    int iy = oy * stride - pad + i * dilation;
                    if (iy < 0 || iy >= H) {
                        for (int ox = 0; ox < WO; ox++) out[ox] = 0.0f;
                        continue;
                    }
                    const float *row = plane + (long)iy * W + dx;
                    for (int ox = 0; ox < lo; ox++) out[ox] = 0.0f;
                    if (stride == 1) {
                        int ox = lo;
                        for (; ox + 4 <= hi; ox += 4) STORE(out + ox, LOAD(row + ox));
                        for (; ox < hi; ox++) out[ox] = row[ox];
                    } else {
                        for (int ox = lo; ox < hi; ox++) out[ox] = row[ox * stride];
                    }
                    for (int ox = hi; ox < WO; ox++) out[ox] = 0.0f;
                }
            }
        }
    }
}

/* Y[r][i] = act(X[r][i] + BIAS[r]) (BIAS null: no bias). Y may equal X. */
KERNEL void bias_act_f32(int rows, int n, const float *X, const float *BIAS, int act, float slope,
                         float *Y) {
    f32x4 s = F4(slope);
    for (int r = 0; r < rows; r++) {
        const float *x = X + (long)r * n;
        float *y = Y + (long)r * n;
        int i = 0;
        if (BIAS) {
            f32x4 b = F4(BIAS[r]);
            for (; i + 4 <= n; i += 4) STORE(y + i, activate(act, wasm_f32x4_add(LOAD(x + i), b), s));
            for (; i < n; i++) y[i] = activate1(act, x[i] + BIAS[r], slope);
        } else {
            for (; i + 4 <= n; i += 4) STORE(y + i, activate(act, LOAD(x + i), s));
            for (; i < n; i++) y[i] = activate1(act, x[i], slope);
        }
    }
}

/* One output row of one channel: out[ox] for ox in [lo, hi), every tap in bounds along x
 * (stride 1: four outputs per vector). */
INLINE void dw_row(const float *plane, int H, int W, int K, int stride, int pad, const float *w,
                   int oy, int lo, int hi, float *out) {
    int ox = lo;
    if (stride == 1) {
        for (; ox + 4 <= hi; ox += 4) {
            f32x4 acc = F4(0.0f);
            int first = 1;
            for (int i = 0; i < K; i++) {
                int iy = oy - pad + i;
                if (iy < 0 || iy >= H) continue;
                const float *src = plane + (long)iy * W + ox - pad;
                for (int j = 0; j < K; j++) {
                    f32x4 p = wasm_f32x4_mul(LOAD(src + j), F4(w[i * K + j]));
                    acc = first ? p : wasm_f32x4_add(acc, p);
                    first = 0;
                }
            }
            STORE(out + ox, acc);
        }
    }
    for (; ox < hi; ox++) {
        float acc = 0.0f;
        int first = 1;
        for (int i = 0; i < K; i++) {
            int iy = oy * stride - pad + i;
            if (iy < 0 || iy >= H) continue;
            const float *src = plane + (long)iy * W + ox * stride - pad;
            for (int j = 0; j < K; j++) {
                float p = src[j] * w[i * K + j];
                acc = first ? p : acc + p;
                first = 0;
            }
        }
        out[ox] = acc;
    }
}

/* A column near the edge: taps outside the image skipped (they add exact zeros). */
INLINE float dw_edge(const float *plane, int H, int W, int K, int stride, int pad,
                     const float *w, int oy, int ox) {
    float acc = 0.0f;
    int first = 1;
    for (int i = 0; i < K; i++) {
        int iy = oy * stride - pad + i;
        if (iy < 0 || iy >= H) continue;
        for (int j = 0; j < K; j++) {
            int ix = ox * stride - pad + j;
            if (ix < 0 || ix >= W) continue;
            float p = plane[(long)iy * W + ix] * w[i * K + j];
            acc = first ? p : acc + p;
            first = 0;
        }
    }
    return acc;
}

/* Y[c] = act(depthwise K x K filter c over X[c] (zero padding `pad`, `stride`) + BIAS[c]);
 * W [C, K * K]; BIAS null: none. */
KERNEL void depthwise_conv_f32(int C, int H, int W, int K, int stride, int pad, const float *X,
                               const float *WTS, const float *BIAS, int act, float slope,
                               float *Y) {
    int HO = (H + 2 * pad - K) / stride + 1;
    int WO = (W + 2 * pad - K) / stride + 1;
    /* output columns whose taps all lie inside the image along x */
    int lo = (pad + stride - 1) / stride;
    int hi = (W - K + pad) < 0 ? 0 : (W - K + pad) / stride + 1;
    if (hi > WO) hi = WO;
    if (lo > hi) lo = hi;
    for (int c = 0; c < C; c++) {
        const float *plane = X + (long)c * H * W;
        const float *w = WTS + (long)c * K * K;
        float *y = Y + (long)c * HO * WO;
        for (int oy = 0; oy < HO; oy++) {
            float *out = y + (long)oy * WO;
            for (int ox = 0; ox < lo; ox++) out[ox] = dw_edge(plane, H, W, K, stride, pad, w, oy, ox);
            dw_row(plane, H, W, K, stride, pad, w, oy, lo, hi, out);
            for (int ox = hi; ox < WO; ox++) out[ox] = dw_edge(plane, H, W, K, stride, pad, w, oy, ox);
        }
        bias_act_f32(1, HO * WO, y, BIAS ? BIAS + c : 0, act, slope, y);
    }
}

/* ---- the images' resampling (io/image.resize) ----------------------------------------------- */

/* Y[o, i, :] = sum_t BAND[i, t] * X[o, FIRST[i] + t, :] over the taps with FIRST[i] + t < lines,
 * in tap order, the first product written and each further one added (no FMA): numpy's loop in
 * NumpyBackend.resample_lines, bit for bit (a tap past the end adds an exact zero there). A line
 * whose first tap lies past the end is zero. X is uint8 (XU8) or f32 (XF), the other null. */
KERNEL void resample_lines_f32(int outer, int lines, int inner, int out_lines, int taps,
                               const uint8_t *XU8, const float *XF, const int32_t *FIRST,
                               const float *BAND, float *Y) {
    for (int o = 0; o < outer; o++) {
        for (int i = 0; i < out_lines; i++) {
            float *y = Y + ((long)o * out_lines + i) * inner;
            int first = FIRST[i];
            int count = lines - first < taps ? lines - first : taps;
            if (count <= 0) {
                for (int j = 0; j < inner; j++) y[j] = 0.0f;
                continue;
            }
            for (int t = 0; t < count; t++) {
                long at = ((long)o * lines + first + t) * inner;
                f32x4 w = F4(BAND[i * taps + t]);
                float ws = BAND[i * taps + t];
                int j = 0;
                if (XU8) {
                    const uint8_t *x = XU8 + at;
                    for (; j + 4 <= inner; j += 4) {
                        v128_t wide = wasm_u32x4_extend_low_u16x8(wasm_u16x8_extend_low_u8x16(
                            wasm_v128_load32_zero(x + j)));
                        f32x4 p = wasm_f32x4_mul(wasm_f32x4_convert_u32x4(wide), w);
                        STORE(y + j, t ? wasm_f32x4_add(LOAD(y + j), p) : p);
                    }
                    for (; j < inner; j++) {
                        float p = (float)x[j] * ws;
                        y[j] = t ? y[j] + p : p;
                    }
                } else {
                    const float *x = XF + at;
                    for (; j + 4 <= inner; j += 4) {
                        f32x4 p = wasm_f32x4_mul(LOAD(x + j), w);
                        STORE(y + j, t ? wasm_f32x4_add(LOAD(y + j), p) : p);
                    }
                    for (; j < inner; j++) {
                        float p = x[j] * ws;
                        y[j] = t ? y[j] + p : p;
                    }
                }
            }
        }
    }
}

/* ---- max pooling ------------------------------------------------------------------------------ */

/* Y[c] = the max over K x K windows of X[c] [H, W], one every `stride` pixels, the rows and
 * columns past the image's end repeating its edge (pad_end of them): Backend.max_pool2d. Per
 * output row the window's rows are maxed four columns at a time into scratch (f32x4.max keeps
 * a NaN, as numpy's maximum), then each output takes the max of its K columns there. */
KERNEL void max_pool_f32(int C, int H, int W, int K, int stride, int pad_end, const float *X,
                         float *Y, uint8_t *scratch) {
    int HO = (H + pad_end - K) / stride + 1;
    int WO = (W + pad_end - K) / stride + 1;
    float *rowmax = (float *)scratch;
    if ((long)W * 4 > SCRATCH_BYTES) return; /* the backend checks this first */
    for (int c = 0; c < C; c++) {
        const float *plane = X + (long)c * H * W;
        float *y = Y + (long)c * HO * WO;
        for (int oy = 0; oy < HO; oy++) {
            int top = oy * stride;
            int bottom = top + K < H ? top + K : H; /* rows past the end repeat row H - 1 */
            if (top > H - 1) top = H - 1;
            if (bottom <= top) bottom = top + 1;
            const float *first = plane + (long)top * W;
            int x = 0;
            for (; x + 4 <= W; x += 4) {
                f32x4 m = LOAD(first + x);
                for (int iy = top + 1; iy < bottom; iy++) m = wasm_f32x4_max(m, LOAD(plane + (long)iy * W + x));
                STORE(rowmax + x, m);
            }
            for (; x < W; x++) {
                float m = first[x];
                for (int iy = top + 1; iy < bottom; iy++) m = nan_max(m, plane[(long)iy * W + x]);
                rowmax[x] = m;
            }
            float *out = y + (long)oy * WO;
            for (int ox = 0; ox < WO; ox++) {
                int left = ox * stride;
                float m = rowmax[left < W ? left : W - 1];
                for (int j = 1; j < K; j++) {
                    int ix = left + j;
                    m = nan_max(m, rowmax[ix < W ? ix : W - 1]);
                }
                out[ox] = m;
            }
        }
    }
}
