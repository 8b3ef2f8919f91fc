/* f32 GEMM: C = A @ B (+ C), batched, any strides.
 *
 * Large products: GotoBLAS-style blocking. B is packed per (KC x NC) block into panels of
 * NR = 8 columns ([k][8], zero-padded), A per (MC x KC) block into panels of MR = 4 rows
 * ([k][4]); a 4x8 register-blocked micro-kernel (8 accumulators, 2 B vectors, 1 broadcast A)
 * runs over each panel pair. Edge tiles are computed into a scratch tile and copied out.
 * Packing reads any strides; row-major and transposed operands have SIMD fast paths (4x4
 * transposes), so a transposed weight costs nothing extra.
 *
 * Decode shapes are memory-bound and skip the packing:
 * - M <= 4 with B's rows contiguous in k (b_rs == 1: B = W^T for a weight W[N, K]): one dot
 *   product per output, 4 weight rows at a time, reading W once ("GEMV");
 * - N == 1 with A's rows contiguous (a_cs == 1): the same with A as the weight;
 * - M <= 4 with B row-major (b_cs == 1): x[k] * B[k, :] accumulated over 32-column strips.
 */
#include "kernels.h"

KERNEL int abi_version(void) { return ABI_VERSION; }
KERNEL int scratch_bytes(void) { return SCRATCH_BYTES; }

/* 4x4 transpose: rows r0..r3 -> columns. */
#define TRANSPOSE4(r0, r1, r2, r3, o0, o1, o2, o3)                         \
    do {                                                                    \
        f32x4 t0_ = wasm_i32x4_shuffle(r0, r1, 0, 4, 1, 5);                 \
        f32x4 t1_ = wasm_i32x4_shuffle(r0, r1, 2, 6, 3, 7);                 \
        f32x4 t2_ = wasm_i32x4_shuffle(r2, r3, 0, 4, 1, 5);                 \
        f32x4 t3_ = wasm_i32x4_shuffle(r2, r3, 2, 6, 3, 7);                 \
        o0 = wasm_i32x4_shuffle(t0_, t2_, 0, 1, 4, 5);                      \
        o1 = wasm_i32x4_shuffle(t0_, t2_, 2, 3, 6, 7);                      \
        o2 = wasm_i32x4_shuffle(t1_, t3_, 0, 1, 4, 5);                      \
        o3 = wasm_i32x4_shuffle(t1_, t3_, 2, 3, 6, 7);                      \
    } while (0)

/* ---- packing ------------------------------------------------------------------------------ */

/* B[k0 + k, n0 + j] for k < kc, j < nc -> panels of NR columns: dst[(p * kc + k) * NR + j]. */
static void pack_b(int kc, int nc, const float *B, int b_rs, int b_cs, float *dst) {
    for (int j0 = 0; j0 < nc; j0 += GEMM_NR) {
        int nr = imin(GEMM_NR, nc - j0);
        const float *src = B + j0 * b_cs;
        float *out = dst + j0 * kc;
        if (nr == GEMM_NR && b_cs == 1) {
            for (int k = 0; k < kc; k++) {
                const float *row = src + k * b_rs;
                STORE(out + k * GEMM_NR, wasm_v128_load(row));
                STORE(out + k * GEMM_NR + 4, wasm_v128_load(row + 4));
            }
        } else if (nr == GEMM_NR && b_rs == 1) {
            /* columns are contiguous in k: 8 columns x 4 k, two 4x4 transposes */
            const float *c0 = src, *c1 = src + b_cs, *c2 = src + 2 * b_cs, *c3 = src + 3 * b_cs;
            const float *c4 = src + 4 * b_cs, *c5 = src + 5 * b_cs, *c6 = src + 6 * b_cs;
            const float *c7 = src + 7 * b_cs;
            int k = 0;
            for (; k + 4 <= kc; k += 4) {
                f32x4 o0, o1, o2, o3, p0, p1, p2, p3;
                TRANSPOSE4(LOAD(c0 + k), LOAD(c1 + k), LOAD(c2 + k), LOAD(c3 + k), o0, o1, o2, o3);
                TRANSPOSE4(LOAD(c4 + k), LOAD(c5 + k), LOAD(c6 + k), LOAD(c7 + k), p0, p1, p2, p3);
                float *o = out + k * GEMM_NR;
                STORE(o, o0); STORE(o + 4, p0);
                STORE(o + 8, o1); STORE(o + 12, p1);
                STORE(o + 16, o2); STORE(o + 20, p2);
                STORE(o + 24, o3); STORE(o + 28, p3);
            }
            for (; k < kc; k++) {
                float *o = out + k * GEMM_NR;
                o[0] = c0[k]; o[1] = c1[k]; o[2] = c2[k]; o[3] = c3[k];
                o[4] = c4[k]; o[5] = c5[k]; o[6] = c6[k]; o[7] = c7[k];
            }
        } else {
            for (int k = 0; k < kc; k++) {
                float *o = out + k * GEMM_NR;
                const float *row = src + k * b_rs;
                int j = 0;
                for (; j < nr; j++) o[j] = row[j * b_cs];
                for (; j < GEMM_NR; j++) o[j] = 0.0f;
            }
        }
    }
}

/* A[m0 + i, k0 + k] for i < mc, k < kc -> panels of MR rows: dst[(p * kc + k) * MR + i]. */
static void pack_a(int mc, int kc, const float *A, int a_rs, int a_cs, float *dst) {
    for (int i0 = 0; i0 < mc; i0 += GEMM_MR) {
        int mr = imin(GEMM_MR, mc - i0);
        const float *src = A + i0 * a_rs;
        float *out = dst + i0 * kc;
        if (mr == GEMM_MR && a_cs == 1) {
            const float *r0 = src, *r1 = src + a_rs, *r2 = src + 2 * a_rs, *r3 = src + 3 * a_rs;
            int k = 0;
            for (; k + 4 <= kc; k += 4) {
                f32x4 o0, o1, o2, o3;
                TRANSPOSE4(LOAD(r0 + k), LOAD(r1 + k), LOAD(r2 + k), LOAD(r3 + k), o0, o1, o2, o3);
                float *o = out + k * GEMM_MR;
                STORE(o, o0); STORE(o + 4, o1); STORE(o + 8, o2); STORE(o + 12, o3);
            }
            for (; k < kc; k++) {
                float *o = out + k * GEMM_MR;
                o[0] = r0[k]; o[1] = r1[k]; o[2] = r2[k]; o[3] = r3[k];
            }
        } else if (mr == GEMM_MR && a_rs == 1) {
            for (int k = 0; k < kc; k++) STORE(out + k * GEMM_MR, LOAD(src + k * a_cs));
        } else {
            for (int k = 0; k < kc; k++) {
                float *o = out + k * GEMM_MR;
                const float *col = src + k * a_cs;
                int i = 0;
                for (; i < mr; i++) o[i] = col[i * a_rs];
                for (; i < GEMM_MR; i++) o[i] = 0.0f;
            }
        }
    }
}

/* ---- the 4x8 micro-kernel ------------------------------------------------------------------ */

/* C[0:4, 0:8] (row stride c_rs) = (accumulate ? C : 0) + Ap (kc x 4) ^T Bp (kc x 8). */
static void micro_4x8(int kc, const float *Ap, const float *Bp, float *C, int c_rs,
                      int accumulate) {
    f32x4 c00 = F4(0), c01 = F4(0), c10 = F4(0), c11 = F4(0);
    f32x4 c20 = F4(0), c21 = F4(0), c30 = F4(0), c31 = F4(0);
    for (int k = 0; k < kc; k++) {
        f32x4 b0 = LOAD(Bp), b1 = LOAD(Bp + 4);
        f32x4 a = SPLAT_LOAD(Ap);
        c00 = FMA(a, b0, c00);
        c01 = FMA(a, b1, c01);
        a = SPLAT_LOAD(Ap + 1);
        c10 = FMA(a, b0, c10);
        c11 = FMA(a, b1, c11);
        a = SPLAT_LOAD(Ap + 2);
        c20 = FMA(a, b0, c20);
        c21 = FMA(a, b1, c21);
        a = SPLAT_LOAD(Ap + 3);
        c30 = FMA(a, b0, c30);
        c31 = FMA(a, b1, c31);
        Ap += GEMM_MR;
        Bp += GEMM_NR;
    }
    float *r0 = C, *r1 = C + c_rs, *r2 = C + 2 * c_rs, *r3 = C + 3 * c_rs;
    if (accumulate) {
        c00 = wasm_f32x4_add(c00, LOAD(r0)); c01 = wasm_f32x4_add(c01, LOAD(r0 + 4));
        c10 = wasm_f32x4_add(c10, LOAD(r1)); c11 = wasm_f32x4_add(c11, LOAD(r1 + 4));
        c20 = wasm_f32x4_add(c20, LOAD(r2)); c21 = wasm_f32x4_add(c21, LOAD(r2 + 4));
        c30 = wasm_f32x4_add(c30, LOAD(r3)); c31 = wasm_f32x4_add(c31, LOAD(r3 + 4));
    }
    STORE(r0, c00); STORE(r0 + 4, c01);
    STORE(r1, c10); STORE(r1 + 4, c11);
    STORE(r2, c20); STORE(r2 + 4, c21);
    STORE(r3, c30); STORE(r3 + 4, c31);
}

void gemm_one(int M, int N, int K, const float *A, int a_rs, int a_cs, const float *B,
              int b_rs, int b_cs, float *C, int c_rs, int beta, uint8_t *scratch) {
    float *bpack = (float *)(scratch + SCRATCH_BPACK);
    float *apack = (float *)(scratch + SCRATCH_APACK);
    float *tile = (float *)(scratch + SCRATCH_TILE);
    for (int jc = 0; jc < N; jc += GEMM_NC) {
        int nc = imin(GEMM_NC, N - jc);
        for (int pc = 0; pc < K; pc += GEMM_KC) {
            int kc = imin(GEMM_KC, K - pc);
            int accumulate = beta || pc > 0;
            pack_b(kc, nc, B + pc * b_rs + jc * b_cs, b_rs, b_cs, bpack);
            for (int ic = 0; ic < M; ic += GEMM_MC) {
                int mc = imin(GEMM_MC, M - ic);
                pack_a(mc, kc, A + ic * a_rs + pc * a_cs, a_rs, a_cs, apack);
                for (int jr = 0; jr < nc; jr += GEMM_NR) {
                    int nr = imin(GEMM_NR, nc - jr);
                    const float *bp = bpack + jr * kc;
                    for (int ir = 0; ir < mc; ir += GEMM_MR) {
                        int mr = imin(GEMM_MR, mc - ir);
                        const float *ap = apack + ir * kc;
                        float *c = C + (ic + ir) * c_rs + jc + jr;
                        if (mr == GEMM_MR && nr == GEMM_NR) {
                            micro_4x8(kc, ap, bp, c, c_rs, accumulate);
                            continue;
                        }
                        micro_4x8(kc, ap, bp, tile, GEMM_NR, 0);
                        for (int i = 0; i < mr; i++)
                            for (int j = 0; j < nr; j++) {
                                float v = tile[i * GEMM_NR + j];
                                c[i * c_rs + j] = accumulate ? c[i * c_rs + j] + v : v;
                            }
                    }
                }
            }
        }
    }
}

/* ---- memory-bound paths ---------------------------------------------------------------------- */

/* Y[m, n] (at m*y_rs + n*y_cs) = sum_k X[m*x_rs + k] W[n*w_rs + k] (+ Y), m < M <= 4:
 * 4 rows of W at a time, each read from memory once and from L1 for the other rows of X. */
static void gemv_rows(int M, int N, int K, const float *X, int x_rs, const float *W, int w_rs,
                      float *Y, int y_rs, int y_cs, int beta) {
    int n = 0;
    for (; n + 4 <= N; n += 4) {
        const float *w0 = W + n * w_rs, *w1 = w0 + w_rs, *w2 = w1 + w_rs, *w3 = w2 + w_rs;
        for (int m = 0; m < M; m++) {
            const float *x = X + m * x_rs;
            f32x4 a0 = F4(0), a1 = F4(0), a2 = F4(0), a3 = F4(0);
            f32x4 b0 = F4(0), b1 = F4(0), b2 = F4(0), b3 = F4(0);
            int k = 0;
            for (; k + 8 <= K; k += 8) {
                f32x4 xa = LOAD(x + k), xb = LOAD(x + k + 4);
                a0 = FMA(xa, LOAD(w0 + k), a0);
                a1 = FMA(xa, LOAD(w1 + k), a1);
                a2 = FMA(xa, LOAD(w2 + k), a2);
                a3 = FMA(xa, LOAD(w3 + k), a3);
                b0 = FMA(xb, LOAD(w0 + k + 4), b0);
                b1 = FMA(xb, LOAD(w1 + k + 4), b1);
                b2 = FMA(xb, LOAD(w2 + k + 4), b2);
                b3 = FMA(xb, LOAD(w3 + k + 4), b3);
            }
            for (; k + 4 <= K; k += 4) {
                f32x4 xa = LOAD(x + k);
                a0 = FMA(xa, LOAD(w0 + k), a0);
                a1 = FMA(xa, LOAD(w1 + k), a1);
                a2 = FMA(xa, LOAD(w2 + k), a2);
                a3 = FMA(xa, LOAD(w3 + k), a3);
            }
            f32x4 s = hsum4(wasm_f32x4_add(a0, b0), wasm_f32x4_add(a1, b1),
                            wasm_f32x4_add(a2, b2), wasm_f32x4_add(a3, b3));
            if (k < K) {
                int rem = K - k;
                f32x4 xt = load_partial(x + k, rem, 0.0f);
                /* both operands padded with 0: the padded lanes add 0 * 0 */
                f32x4 t0 = wasm_f32x4_mul(xt, load_partial(w0 + k, rem, 0.0f));
                f32x4 t1 = wasm_f32x4_mul(xt, load_partial(w1 + k, rem, 0.0f));
                f32x4 t2 = wasm_f32x4_mul(xt, load_partial(w2 + k, rem, 0.0f));
                f32x4 t3 = wasm_f32x4_mul(xt, load_partial(w3 + k, rem, 0.0f));
                s = wasm_f32x4_add(s, hsum4(t0, t1, t2, t3));
            }
            float *y = Y + m * y_rs + n * y_cs;
            if (y_cs == 1) {
                if (beta) s = wasm_f32x4_add(s, wasm_v128_load(y));
                wasm_v128_store(y, s);
            } else {
                float s0 = wasm_f32x4_extract_lane(s, 0), s1 = wasm_f32x4_extract_lane(s, 1);
                float s2 = wasm_f32x4_extract_lane(s, 2), s3 = wasm_f32x4_extract_lane(s, 3);
                if (beta) {
                    s0 += y[0]; s1 += y[y_cs]; s2 += y[2 * y_cs]; s3 += y[3 * y_cs];
                }
                y[0] = s0; y[y_cs] = s1; y[2 * y_cs] = s2; y[3 * y_cs] = s3;
            }
        }
    }
    for (; n < N; n++) {
        const float *w = W + n * w_rs;
        for (int m = 0; m < M; m++) {
            const float *x = X + m * x_rs;
            f32x4 a = F4(0), b = F4(0);
            int k = 0;
            for (; k + 8 <= K; k += 8) {
                a = FMA(LOAD(x + k), LOAD(w + k), a);
                b = FMA(LOAD(x + k + 4), LOAD(w + k + 4), b);
            }
            for (; k + 4 <= K; k += 4) a = FMA(LOAD(x + k), LOAD(w + k), a);
            float s = hsum(wasm_f32x4_add(a, b));
            for (; k < K; k++) s += x[k] * w[k];
            float *y = Y + m * y_rs + n * y_cs;
            *y = beta ? *y + s : s;
        }
    }
}

/* Y[m, :] = sum_k X[m*x_rs + k*x_cs] B[k*b_rs + :] (+ Y), B row-major: 32-column strips. */
static void axpy_rows(int M, int N, int K, const float *X, int x_rs, int x_cs, const float *B,
                      int b_rs, float *Y, int y_rs, int beta) {
    for (int m = 0; m < M; m++) {
        const float *x = X + m * x_rs;
        float *y = Y + m * y_rs;
        int n = 0;
        for (; n + 32 <= N; n += 32) {
            f32x4 a0 = F4(0), a1 = F4(0), a2 = F4(0), a3 = F4(0);
            f32x4 a4 = F4(0), a5 = F4(0), a6 = F4(0), a7 = F4(0);
            const float *b = B + n;
            for (int k = 0; k < K; k++, b += b_rs) {
                f32x4 xk = F4(x[k * x_cs]);
                a0 = FMA(xk, LOAD(b), a0);
                a1 = FMA(xk, LOAD(b + 4), a1);
                a2 = FMA(xk, LOAD(b + 8), a2);
                a3 = FMA(xk, LOAD(b + 12), a3);
                a4 = FMA(xk, LOAD(b + 16), a4);
                a5 = FMA(xk, LOAD(b + 20), a5);
                a6 = FMA(xk, LOAD(b + 24), a6);
                a7 = FMA(xk, LOAD(b + 28), a7);
            }
            float *o = y + n;
            if (beta) {
                a0 = wasm_f32x4_add(a0, LOAD(o)); a1 = wasm_f32x4_add(a1, LOAD(o + 4));
                a2 = wasm_f32x4_add(a2, LOAD(o + 8)); a3 = wasm_f32x4_add(a3, LOAD(o + 12));
                a4 = wasm_f32x4_add(a4, LOAD(o + 16)); a5 = wasm_f32x4_add(a5, LOAD(o + 20));
                a6 = wasm_f32x4_add(a6, LOAD(o + 24)); a7 = wasm_f32x4_add(a7, LOAD(o + 28));
            }
            STORE(o, a0); STORE(o + 4, a1); STORE(o + 8, a2); STORE(o + 12, a3);
            STORE(o + 16, a4); STORE(o + 20, a5); STORE(o + 24, a6); STORE(o + 28, a7);
        }
        for (; n + 4 <= N; n += 4) {
            f32x4 a = F4(0);
            const float *b = B + n;
            for (int k = 0; k < K; k++, b += b_rs) a = FMA(F4(x[k * x_cs]), LOAD(b), a);
            if (beta) a = wasm_f32x4_add(a, LOAD(y + n));
            STORE(y + n, a);
        }
        for (; n < N; n++) {
            float s = 0.0f;
            const float *b = B + n;
            for (int k = 0; k < K; k++, b += b_rs) s += x[k * x_cs] * *b;
            y[n] = beta ? y[n] + s : s;
        }
    }
}

/* Rows of a strided matrix copied contiguous into dst (rows x K); 0 if it does not fit. */
static const float *contiguous_rows(int rows, int K, const float *X, int x_rs, int x_cs,
                                    float *dst, int capacity_floats) {
    if (rows * K > capacity_floats) return 0;
    for (int r = 0; r < rows; r++)
        for (int k = 0; k < K; k++) dst[r * K + k] = X[r * x_rs + k * x_cs];
    return dst;
}

#define GEMV_MAX_M 4

void gemm_2d(int M, int N, int K, const float *A, int a_rs, int a_cs, const float *B,
                        int b_rs, int b_cs, float *C, int c_rs, int beta, uint8_t *scratch) {
    if (M <= 0 || N <= 0) return;
    if (K <= 0) {
        if (!beta)
            for (int m = 0; m < M; m++)
                for (int n = 0; n < N; n++) C[m * c_rs + n] = 0.0f;
        return;
    }
    float *xcopy = (float *)(scratch + SCRATCH_XCOPY);
    int xcap = SCRATCH_XCOPY_BYTES / 4;
    if (M <= GEMV_MAX_M && b_rs == 1) {
        const float *x = a_cs == 1 ? A : contiguous_rows(M, K, A, a_rs, a_cs, xcopy, xcap);
        if (x) {
            gemv_rows(M, N, K, x, a_cs == 1 ? a_rs : K, B, b_cs, C, c_rs, 1, beta);
            return;
        }
    }
    if (N == 1 && a_cs == 1) {
        const float *x = b_rs == 1 ? B : contiguous_rows(1, K, B, 0, b_rs, xcopy, xcap);
        if (x) {
            gemv_rows(1, M, K, x, 0, A, a_rs, C, 0, c_rs, beta);
            return;
        }
    }
    if (M <= GEMV_MAX_M && b_cs == 1) {
        axpy_rows(M, N, K, A, a_rs, a_cs, B, b_rs, C, c_rs, beta);
        return;
    }
    gemm_one(M, N, K, A, a_rs, a_cs, B, b_rs, b_cs, C, c_rs, beta, scratch);
}

KERNEL void gemm_f32(int batch, int M, int N, int K, const float *A, int a_bs, int a_rs,
                     int a_cs, const float *B, int b_bs, int b_rs, int b_cs, float *C, int c_bs,
                     int c_rs, float beta, uint8_t *scratch) {
    int accumulate = beta != 0.0f;
    for (int b = 0; b < batch; b++)
        gemm_2d(M, N, K, A + b * a_bs, a_rs, a_cs, B + b * b_bs, b_rs, b_cs,
                    C + b * c_bs, c_rs, accumulate, scratch);
}
