/* What the fused decode steps' files share (steps.c: LLaMA; whisper_steps.c: Whisper's
 * decoder and encoder): a thread's share of a product, of a residual, of heads, and the team
 * jobs' argument-block readers. Static functions: each step file compiles its own copy, as when
 * they were one file. See steps.c for the method.
 */
#ifndef CANDLE_KERNELS_STEPS_H
#define CANDLE_KERNELS_STEPS_H

#include "kernels.h"
#include "step_jobs.h"

/* Y [R, y_rs] columns [lo, hi) = X [R, K] W[lo:hi]^T for one stored matrix of K columns. */
static void matmul_cols(int R, int type, int lo, int hi, int K, const void *W, const float *X,
                        float *Y, int y_rs, uint8_t *scratch) {
    int n = hi - lo;
    if (n <= 0) return;
    const uint8_t *w = (const uint8_t *)W + lo * matrix_row_bytes(type, K);
    if (type == MATRIX_F32)
        gemm_f32(1, R, n, K, X, 0, K, 1, (const float *)w, 0, 1, K, Y + lo, 0, y_rs, 0.0f,
                 scratch);
    else if (type == MATRIX_F16)
        linear_f16(R, n, K, X, K, (const uint16_t *)w, Y + lo, y_rs, scratch);
    else if (type & MATRIX_INT8) /* the compute type int8 (linear_int8.c) */
        linear_q8(type, R, n, K, X, K, w, Y + lo, y_rs, scratch);
    else
        linear_q(type, R, n, K, X, K, w, Y + lo, y_rs, scratch);
}

#define SHARE_LO(total, tid, nt) team_lo((total), TEAM_ROW_ALIGN, (tid), (nt))
#define SHARE_HI(total, tid, nt) team_lo((total), TEAM_ROW_ALIGN, (tid) + 1, (nt))

static void add_into(int n, float *acc, const float *x) {
    int i = 0;
    for (; i + 4 <= n; i += 4) STORE(acc + i, wasm_f32x4_add(LOAD(acc + i), LOAD(x + i)));
    for (; i < n; i++) acc[i] += x[i];
}

/* This thread's share of Y [R, rows] = X W^T (+ bias), by output columns. */
static void linear_share(int tid, int nt, int R, int type, int rows, int K, const void *W,
                         const float *X, float *Y, const float *bias, uint8_t *scratch) {
    if (rows <= 0) return;
    int lo = SHARE_LO(rows, tid, nt), hi = SHARE_HI(rows, tid, nt);
    matmul_cols(R, type, lo, hi, K, W, X, Y, rows, scratch);
    if (bias && hi > lo)
        for (int r = 0; r < R; r++) add_into(hi - lo, Y + r * rows + lo, bias + lo);
}

/* acc [R, n] += y [R, n] + bias [n] (bias may be 0) on this thread's columns of the
 * linear_share that made y: the bias first, as the kernel-by-kernel path adds it to the
 * product before the residual. */
static void residual_share(int tid, int nt, int R, int n, float *acc, float *y,
                           const float *bias) {
    int lo = SHARE_LO(n, tid, nt), hi = SHARE_HI(n, tid, nt);
    if (hi <= lo) return;
    for (int r = 0; r < R; r++) {
        float *yr = y + r * n + lo;
        if (bias) add_into(hi - lo, yr, bias + lo);
        add_into(hi - lo, acc + r * n + lo, yr);
    }
}

/* Heads [lo, hi) of this thread's share of `heads`. */
#define HEAD_LO(heads, tid, nt) team_lo((heads), 1, (tid), (nt))
#define HEAD_HI(heads, tid, nt) team_lo((heads), 1, (tid) + 1, (nt))

/* ---- the team's jobs: every block of a step from one argument block -------------------------
 * i32 words (f32 scalars as their bits, pointers as offsets) that the host fills; each word
 * is read by its field's index in kernels_abi.h, generated from backend/wasm/abi.py's tables:
 * LL(Q_TYPE) is TEAM_LLAMA_LAYER_Q_TYPE, the word of field "q_type" of a LLaMA layer record. */
#define ARG_I(a, k) ((int)(a)[k])
#define ARG_F(a, k) bits_to_f32((uint32_t)(a)[k])
#define ARG_P(a, k) ((void *)(uintptr_t)(uint32_t)(a)[k])
#define LH(field) TEAM_LLAMA_HEADER_##field
#define LL(field) TEAM_LLAMA_LAYER_##field
#define WH(field) TEAM_WHISPER_HEADER_##field
#define WB(field) TEAM_WHISPER_BLOCK_##field
#define EH(field) TEAM_ENCODER_HEADER_##field
#define EB(field) TEAM_ENCODER_BLOCK_##field

#endif
