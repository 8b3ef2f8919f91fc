/* Fused decode steps: one call per LLaMA block and one per Whisper decoder block (plus one
 * for the final norm and vocabulary projection each), composed of this module's own kernels.
 *
 * Why: in Pyodide a kernel call from Python costs ~3 us plus 4-7 us per pointer it looks up,
 * and a block on the kernel-by-kernel path is a dozen calls and a few small numpy writes
 * (~0.2 ms per LLaMA block, 30 blocks per SmolLM2 token). Here the whole block is one call;
 * Python passes the weights and KV buffers in place and a `work` buffer for the activations
 * (the scratch buffer is the inner kernels' own).
 *
 * A matrix argument is (type, rows, pointer) with type 0 = f32 rows [rows, K], 1 = f16 bits,
 * else a GGML type id (linear_q). A projection made of several stored tensors (LLaMA's q, k
 * and v; gate and up) is passed piece by piece, rows 0 for an absent piece; the pieces' outputs
 * are concatenated. Arithmetic and order are the kernel-by-kernel path's (backend/wasm_parts.py):
 * the same kernels on the same operands, so both give the same numbers.
 */
#include "kernels.h"

void gemm_f32(int batch, int M, int N, int K, const float *A, int a_bs, int a_rs, int a_cs,
              const float *B, int b_bs, int b_rs, int b_cs, float *C, int c_bs, int c_rs,
              float beta, uint8_t *scratch);
void linear_f16(int M, int N, int K, const float *X, int x_rs, const uint16_t *W, float *Y,
                int y_rs, uint8_t *scratch);
void linear_q(int type, int M, int N, int K, const float *X, int x_rs, const uint8_t *W,
              float *Y, int y_rs, uint8_t *scratch);
void rms_norm_rows(int rows, int n, const float *X, const float *W, float eps, float *Y);
void layer_norm_rows(int rows, int n, const float *X, const float *W, const float *B, float eps,
                     float *Y);
void rope_f32(int interleaved, int bh, int t, int d, const float *X, const float *COS,
              const float *SIN, float *Y);
void attention_f32(int bh, int tq, int tk, int d, const float *Q, int q_bs, const float *K,
                   int k_bs, const float *V, int v_bs, const float *MASK, int mask_bs,
                   float scale, float *O, int o_bs, uint8_t *scratch);
void silu_mul(int n, const float *G, const float *U, float *Y);
void unary_f32(int op, int n, const float *X, float *Y);

#define MATRIX_F32 0
#define MATRIX_F16 1
#define UNARY_GELU_ERF 1

/* y[rows] = W x for one stored matrix of `rows` rows and K columns. */
static void matvec(int type, int rows, int K, const void *W, const float *x, float *y,
                   uint8_t *scratch) {
    if (rows <= 0) return;
    if (type == MATRIX_F32)
        gemm_f32(1, 1, rows, K, x, 0, K, 1, (const float *)W, 0, 1, K, y, 0, rows, 0.0f, scratch);
    else if (type == MATRIX_F16)
        linear_f16(1, rows, K, x, K, (const uint16_t *)W, y, rows, scratch);
    else
        linear_q(type, 1, rows, K, x, K, (const uint8_t *)W, y, rows, scratch);
}

/* Y [R, rows] = X [R, K] W^T for R rows of activations (Whisper's beams). */
static void matmul_rows(int R, int type, int rows, int K, const void *W, const float *X,
                        float *Y, uint8_t *scratch) {
    if (type == MATRIX_F32)
        gemm_f32(1, R, rows, K, X, 0, K, 1, (const float *)W, 0, 1, K, Y, 0, rows, 0.0f, scratch);
    else if (type == MATRIX_F16)
        linear_f16(R, rows, K, X, K, (const uint16_t *)W, Y, rows, scratch);
    else
        linear_q(type, R, rows, K, X, K, (const uint8_t *)W, Y, rows, scratch);
}

static void add_into(int n, float *acc, const float *x) {
    int i = 0;
    for (; i + 4 <= n; i += 4) STORE(acc + i, wasm_f32x4_add(LOAD(acc + i), LOAD(x + i)));
    for (; i < n; i++) acc[i] += x[i];
}

/* acc [R, n] += x [R, n] + bias [n] (bias may be 0): the bias first, as the kernel-by-kernel
 * path adds it to the product before the residual. */
static void add_biased_rows(int R, int n, float *acc, float *x, const float *bias) {
    for (int r = 0; r < R; r++) {
        float *xr = x + r * n;
        if (bias) add_into(n, xr, bias);
        add_into(n, acc + r * n, xr);
    }
}

static void add_bias_rows(int R, int n, float *x, const float *bias) {
    if (!bias) return;
    for (int r = 0; r < R; r++) add_into(n, x + r * n, bias);
}

/* ---- LLaMA ----------------------------------------------------------------------------------
 * x [d]: the hidden state, updated in place. keys, values [n_kv, capacity, head_dim]: this
 * step writes position `pos`. cos, sin: the rotary tables [>= pos + 1, head_dim / 2].
 * work: d + (q + 2 kv) + q + 3 ffn floats, q = n_heads * head_dim, kv = n_kv * head_dim. */
KERNEL void llama_block_step(int d, int n_heads, int n_kv, int head_dim, int ffn,
                             int interleaved, int pos, int capacity, float scale, float *x,
                             float *work, const float *attn_norm, const float *mlp_norm,
                             float eps, int q_type, int q_rows, const void *q_w, int k_type,
                             int k_rows, const void *k_w, int v_type, int v_rows,
                             const void *v_w, int o_type, const void *o_w, int g_type,
                             int g_rows, const void *g_w, int u_type, int u_rows,
                             const void *u_w, int down_type, const void *down_w, float *keys,
                             float *values, const float *cos, const float *sin,
                             uint8_t *scratch) {
    int q_size = n_heads * head_dim, kv_size = n_kv * head_dim, n_rep = n_heads / n_kv;
    float *h = work;
    float *qkv = h + d;
    float *att = qkv + q_size + 2 * kv_size;
    float *gu = att + q_size;
    float *act = gu + 2 * ffn;

    rms_norm_rows(1, d, x, attn_norm, eps, h);
    matvec(q_type, q_rows, d, q_w, h, qkv, scratch);
    matvec(k_type, k_rows, d, k_w, h, qkv + q_rows, scratch);
    matvec(v_type, v_rows, d, v_w, h, qkv + q_rows + k_rows, scratch);
    int half = head_dim / 2;
    rope_f32(interleaved, n_heads + n_kv, 1, head_dim, qkv, cos + pos * half, sin + pos * half,
             qkv);
    const float *k_new = qkv + q_size, *v_new = qkv + q_size + kv_size;
    for (int kh = 0; kh < n_kv; kh++) {
        float *kd = keys + (kh * capacity + pos) * head_dim;
        float *vd = values + (kh * capacity + pos) * head_dim;
        for (int c = 0; c < head_dim; c++) {
            kd[c] = k_new[kh * head_dim + c];
            vd[c] = v_new[kh * head_dim + c];
        }
    }
    /* Grouped queries: the n_rep query heads of kv head g are n_rep query rows of it. */
    attention_f32(n_kv, n_rep, pos + 1, head_dim, qkv, n_rep * head_dim, keys,
                  capacity * head_dim, values, capacity * head_dim, 0, 0, scale, att,
                  n_rep * head_dim, scratch);
    matvec(o_type, d, q_size, o_w, att, h, scratch);
    add_into(d, x, h);

    rms_norm_rows(1, d, x, mlp_norm, eps, h);
    matvec(g_type, g_rows, d, g_w, h, gu, scratch);
    matvec(u_type, u_rows, d, u_w, h, gu + g_rows, scratch);
    silu_mul(ffn, gu, gu + ffn, act);
    matvec(down_type, d, ffn, down_w, act, h, scratch);
    add_into(d, x, h);
}

/* logits [rows] = W rms_norm(x); work: d floats. */
KERNEL void rms_logits_step(int d, int rows, const float *x, const float *norm, float eps,
                            int w_type, const void *w, float *work, float *logits,
                            uint8_t *scratch) {
    rms_norm_rows(1, d, x, norm, eps, work);
    matvec(w_type, rows, d, w, work, logits, scratch);
}

/* ---- Whisper --------------------------------------------------------------------------------
 * One decoder block for R rows (beams) of one new token each. x [R, d] updated in place.
 * keys, values [R, h, capacity, dh]: this step writes position `pos`. cross_k, cross_v: the
 * projected audio keys and values [h, n_audio, dh] per audio row, audio row r at r * cross_bs
 * (cross_bs 0: every row attends to the same audio). Layer norms carry weight and bias (eps
 * shared); every linear has a bias. work: R * (d + 3d + d + 4d) floats (d_ff = 4d allowed to be
 * any `ffn`: R * (5 d + ffn + d) floats). */
KERNEL void whisper_block_step(int R, int d, int n_head, int ffn, int pos, int capacity,
                               int n_audio, float eps, float scale, float *x, float *work,
                               const float *ln1_w, const float *ln1_b, int qkv_type,
                               const void *qkv_w, const float *qkv_b, int out_type,
                               const void *out_w, const float *out_b, const float *ln2_w,
                               const float *ln2_b, int cq_type, const void *cq_w,
                               const float *cq_b, const float *cross_k, const float *cross_v,
                               int cross_bs, int co_type, const void *co_w, const float *co_b,
                               const float *ln3_w, const float *ln3_b, int fc1_type,
                               const void *fc1_w, const float *fc1_b, int fc2_type,
                               const void *fc2_w, const float *fc2_b, float *keys,
                               float *values, uint8_t *scratch) {
    int dh = d / n_head;
    float *h = work;              /* [R, d] */
    float *qkv = h + R * d;       /* [R, 3d] */
    float *q = qkv + R * 3 * d;   /* [R, d] */
    float *att = q + R * d;       /* [R, d] */
    float *hidden = att + R * d;  /* [R, ffn] */

    /* self-attention */
    layer_norm_rows(R, d, x, ln1_w, ln1_b, eps, h);
    matmul_rows(R, qkv_type, 3 * d, d, qkv_w, h, qkv, scratch);
    add_bias_rows(R, 3 * d, qkv, qkv_b);
    for (int r = 0; r < R; r++) {
        const float *row = qkv + r * 3 * d;
        for (int c = 0; c < d; c++) q[r * d + c] = row[c];
        for (int hd = 0; hd < n_head; hd++) {
            float *kd = keys + ((r * n_head + hd) * capacity + pos) * dh;
            float *vd = values + ((r * n_head + hd) * capacity + pos) * dh;
            for (int c = 0; c < dh; c++) {
                kd[c] = row[d + hd * dh + c];
                vd[c] = row[2 * d + hd * dh + c];
            }
        }
    }
    attention_f32(R * n_head, 1, pos + 1, dh, q, dh, keys, capacity * dh, values,
                  capacity * dh, 0, 0, scale, att, dh, scratch);
    matmul_rows(R, out_type, d, d, out_w, att, h, scratch);
    add_biased_rows(R, d, x, h, out_b);

    /* cross-attention over the audio */
    layer_norm_rows(R, d, x, ln2_w, ln2_b, eps, h);
    matmul_rows(R, cq_type, d, d, cq_w, h, q, scratch);
    add_bias_rows(R, d, q, cq_b);
    for (int r = 0; r < R; r++) {
        attention_f32(n_head, 1, n_audio, dh, q + r * d, dh, cross_k + r * cross_bs,
                      n_audio * dh, cross_v + r * cross_bs, n_audio * dh, 0, 0, scale,
                      att + r * d, dh, scratch);
    }
    matmul_rows(R, co_type, d, d, co_w, att, h, scratch);
    add_biased_rows(R, d, x, h, co_b);

    /* MLP */
    layer_norm_rows(R, d, x, ln3_w, ln3_b, eps, h);
    matmul_rows(R, fc1_type, ffn, d, fc1_w, h, hidden, scratch);
    add_bias_rows(R, ffn, hidden, fc1_b);
    unary_f32(UNARY_GELU_ERF, R * ffn, hidden, hidden);
    matmul_rows(R, fc2_type, d, ffn, fc2_w, hidden, h, scratch);
    add_biased_rows(R, d, x, h, fc2_b);
}

/* logits [R, rows] = W layer_norm(x); work: R * d floats. */
KERNEL void ln_logits_step(int R, int d, int rows, const float *x, const float *ln_w,
                           const float *ln_b, float eps, int w_type, const void *w,
                           float *work, float *logits, uint8_t *scratch) {
    layer_norm_rows(R, d, x, ln_w, ln_b, eps, work);
    matmul_rows(R, w_type, rows, d, w, work, logits, scratch);
}
