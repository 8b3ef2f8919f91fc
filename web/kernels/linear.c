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
 *
 * Files: quant.h (the block formats), quant_linear.h (the row loops and the tile path, compiled
 * per type), this file (f16, linear_q's checks and dispatch), linear_q32.c (Q4_0, Q4_1, Q5_0,
 * Q5_1, Q8_0) and linear_qk.c (Q2_K .. Q6_K).
 */
#include "quant_linear.h"

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
    if (block_elems(type) == 256) linear_qk(type, M, N, K, X, x_rs, W, Y, y_rs, scratch);
    else linear_q32(type, M, N, K, X, x_rs, W, Y, y_rs, scratch);
}

/* Bytes of one row of K weights as the fused steps pass matrices: type 0 f32, 1 f16 bits,
 * else a GGML type (K a whole number of its blocks). The team's row shares start at row
 * offsets of this size. Not exported. The block sizes come from two immediates, one byte per
 * type: a switch here would be compiled to a lookup table, i.e. a data segment. */
int matrix_row_bytes(int type, int K) {
    type &= MATRIX_TYPE_MASK; /* the int8 flags (abi.py's MATRIX_FLAGS) do not change the bytes */
    if (type == MATRIX_F32) return 4 * K;
    if (type == T_F16) return 2 * K;
    if (type < T_Q4_0 || type > T_Q6_K) return 0;
    /* types 2..9: Q4_0 18, Q4_1 20, -, -, Q5_0 22, Q5_1 24, Q8_0 34, -; 10..14: the k-quants */
    const uint64_t small = 0x0022181600001412ull, large = 0xd2b0906e54ull;
    int bytes = type < T_Q2_K ? (int)((small >> (8 * (type - T_Q4_0))) & 0xff)
                              : (int)((large >> (8 * (type - T_Q2_K))) & 0xff);
    return (K / block_elems(type)) * bytes;
}
