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
 * are concatenated. Arithmetic and order are the kernel-by-kernel path's (backend/wasm/parts.py):
 * the same kernels on the same operands, so both give the same numbers.
 *
 * The same block code runs on a team of threads (team.h; the threads build): `tid` of `nt`,
 * products split by output rows, elementwise phases on thread 0 or split by the same columns,
 * barriers between phases that read what the other thread wrote. The exports below call it
 * with one thread; the team's jobs (llama_team_step, whisper_team_step) take all blocks of a
 * step from an argument block.
 */
#include "kernels.h"
#include "team.h"

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
    else
        linear_q(type, R, n, K, X, K, w, Y + lo, y_rs, scratch);
}

#define SHARE_LO(total, tid, nt) team_lo((total), TEAM_ROW_ALIGN, (tid), (nt))
#define SHARE_HI(total, tid, nt) team_lo((total), TEAM_ROW_ALIGN, (tid) + 1, (nt))

/* This thread's share of Y [R, rows] = X W^T (+ bias), by output columns. */
static void linear_share(int tid, int nt, int R, int type, int rows, int K, const void *W,
                         const float *X, float *Y, const float *bias, uint8_t *scratch);

static void add_into(int n, float *acc, const float *x) {
    int i = 0;
    for (; i + 4 <= n; i += 4) STORE(acc + i, wasm_f32x4_add(LOAD(acc + i), LOAD(x + i)));
    for (; i < n; i++) acc[i] += x[i];
}

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

/* ---- LLaMA ----------------------------------------------------------------------------------
 * x [d]: the hidden state, updated in place. keys, values [n_kv, capacity, head_dim]: this
 * step writes position `pos`; kv_out (may be 0) gets the same new key then value [2, n_kv *
 * head_dim]. cos_row, sin_row: the rotary tables' row of `pos` [head_dim / 2].
 * work: d + (q + 2 kv) + q + 3 ffn floats, q = n_heads * head_dim, kv = n_kv * head_dim. */
static void llama_block(int tid, int nt, TeamCtrl *team, int d, int n_heads, int n_kv,
                        int head_dim, int ffn, int interleaved, int pos, int capacity,
                        float scale, float *x, float *work, const float *attn_norm,
                        const float *mlp_norm, float eps, int q_type, int q_rows,
                        const void *q_w, int k_type, int k_rows, const void *k_w, int v_type,
                        int v_rows, const void *v_w, const float *qkv_b, int o_type,
                        const void *o_w, int g_type,
                        int g_rows, const void *g_w, int u_type, int u_rows, const void *u_w,
                        int down_type, const void *down_w, float *keys, float *values,
                        const float *cos_row, const float *sin_row, float *kv_out,
                        uint8_t *scratch) {
    int q_size = n_heads * head_dim, kv_size = n_kv * head_dim, n_rep = n_heads / n_kv;
    float *h = work;
    float *qkv = h + d;
    float *att = qkv + q_size + 2 * kv_size;
    float *gu = att + q_size;
    float *act = gu + 2 * ffn;

    team_barrier(team, nt); /* x complete: the previous block's residual was split */
    if (tid == 0) rms_norm_rows(1, d, x, attn_norm, eps, h);
    team_barrier(team, nt);
    /* qkv_b (qwen2's bias on q|k|v, 0: none) is added to each piece's own columns. */
    linear_share(tid, nt, 1, q_type, q_rows, d, q_w, h, qkv, qkv_b, scratch);
    linear_share(tid, nt, 1, k_type, k_rows, d, k_w, h, qkv + q_rows,
                 qkv_b ? qkv_b + q_rows : 0, scratch);
    linear_share(tid, nt, 1, v_type, v_rows, d, v_w, h, qkv + q_rows + k_rows,
                 qkv_b ? qkv_b + q_rows + k_rows : 0, scratch);
    team_barrier(team, nt);
    if (tid == 0) {
        rope_f32(interleaved, n_heads + n_kv, 1, head_dim, qkv, cos_row, sin_row, qkv);
        const float *k_new = qkv + q_size, *v_new = qkv + q_size + kv_size;
        for (int kh = 0; kh < n_kv; kh++) {
            float *kd = keys + (kh * capacity + pos) * head_dim;
            float *vd = values + (kh * capacity + pos) * head_dim;
            for (int c = 0; c < head_dim; c++) {
                kd[c] = k_new[kh * head_dim + c];
                vd[c] = v_new[kh * head_dim + c];
            }
        }
        if (kv_out)
            for (int c = 0; c < 2 * kv_size; c++) kv_out[c] = k_new[c];
    }
    team_barrier(team, nt);
    /* Grouped queries: the n_rep query heads of kv head g are n_rep query rows of it. */
    int g0 = HEAD_LO(n_kv, tid, nt), g1 = HEAD_HI(n_kv, tid, nt);
    if (g1 > g0)
        attention_f32(g1 - g0, n_rep, pos + 1, head_dim, qkv + g0 * n_rep * head_dim,
                      n_rep * head_dim, keys + g0 * capacity * head_dim, capacity * head_dim,
                      values + g0 * capacity * head_dim, capacity * head_dim, 0, 0, scale,
                      att + g0 * n_rep * head_dim, n_rep * head_dim, scratch);
    team_barrier(team, nt);
    linear_share(tid, nt, 1, o_type, d, q_size, o_w, att, h, 0, scratch);
    residual_share(tid, nt, 1, d, x, h, 0);
    team_barrier(team, nt);

    if (tid == 0) rms_norm_rows(1, d, x, mlp_norm, eps, h);
    team_barrier(team, nt);
    linear_share(tid, nt, 1, g_type, g_rows, d, g_w, h, gu, 0, scratch);
    linear_share(tid, nt, 1, u_type, u_rows, d, u_w, h, gu + g_rows, 0, scratch);
    team_barrier(team, nt);
    int f0 = SHARE_LO(ffn, tid, nt), f1 = SHARE_HI(ffn, tid, nt);
    if (f1 > f0) silu_mul(f1 - f0, gu + f0, gu + ffn + f0, act + f0);
    team_barrier(team, nt);
    linear_share(tid, nt, 1, down_type, d, ffn, down_w, act, h, 0, scratch);
    residual_share(tid, nt, 1, d, x, h, 0);
}

/* logits [rows] = W rms_norm(x); work: d floats. */
static void rms_logits(int tid, int nt, TeamCtrl *team, int d, int rows, const float *x,
                       const float *norm, float eps, int w_type, const void *w, float *work,
                       float *logits, uint8_t *scratch) {
    team_barrier(team, nt); /* x complete (the last block's residual was split) */
    if (tid == 0) rms_norm_rows(1, d, x, norm, eps, work);
    team_barrier(team, nt);
    linear_share(tid, nt, 1, w_type, rows, d, w, work, logits, 0, scratch);
}

KERNEL void llama_block_step(int d, int n_heads, int n_kv, int head_dim, int ffn,
                             int interleaved, int pos, int capacity, float scale, float *x,
                             float *work, const float *attn_norm, const float *mlp_norm,
                             float eps, int q_type, int q_rows, const void *q_w, int k_type,
                             int k_rows, const void *k_w, int v_type, int v_rows,
                             const void *v_w, const float *qkv_b, int o_type,
                             const void *o_w, int g_type,
                             int g_rows, const void *g_w, int u_type, int u_rows,
                             const void *u_w, int down_type, const void *down_w, float *keys,
                             float *values, const float *cos, const float *sin,
                             uint8_t *scratch) {
    int half = head_dim / 2;
    llama_block(0, 1, 0, d, n_heads, n_kv, head_dim, ffn, interleaved, pos, capacity, scale, x,
                work, attn_norm, mlp_norm, eps, q_type, q_rows, q_w, k_type, k_rows, k_w,
                v_type, v_rows, v_w, qkv_b, o_type, o_w, g_type, g_rows, g_w, u_type, u_rows,
                u_w,
                down_type, down_w, keys, values, cos + pos * half, sin + pos * half, 0,
                scratch);
}

KERNEL void rms_logits_step(int d, int rows, const float *x, const float *norm, float eps,
                            int w_type, const void *w, float *work, float *logits,
                            uint8_t *scratch) {
    rms_logits(0, 1, 0, d, rows, x, norm, eps, w_type, w, work, logits, scratch);
}

/* ---- Whisper --------------------------------------------------------------------------------
 * One decoder block for R rows (beams) of one new token each. x [R, d] updated in place.
 * keys, values [R, h, capacity, dh]: this step writes position `pos`; kv_out (may be 0) gets
 * the same new keys then values per row [R, 2, d]. cross_k, cross_v: the projected audio keys
 * and values [h, n_audio, dh] per audio row, audio row r at r * cross_bs (cross_bs 0: every
 * row attends to the same audio). Layer norms carry weight and bias (eps shared); every
 * linear has a bias. work: R * (6 d + ffn) floats. */
static void whisper_block(int tid, int nt, TeamCtrl *team, int R, int d, int n_head, int ffn,
                          int pos, int capacity, int n_audio, float eps, float scale, float *x,
                          float *work, const float *ln1_w, const float *ln1_b, int qkv_type,
                          const void *qkv_w, const float *qkv_b, int out_type,
                          const void *out_w, const float *out_b, const float *ln2_w,
                          const float *ln2_b, int cq_type, const void *cq_w, const float *cq_b,
                          const float *cross_k, const float *cross_v, int cross_bs,
                          int co_type, const void *co_w, const float *co_b, const float *ln3_w,
                          const float *ln3_b, int fc1_type, const void *fc1_w,
                          const float *fc1_b, int fc2_type, const void *fc2_w,
                          const float *fc2_b, float *keys, float *values, float *kv_out,
                          uint8_t *scratch) {
    int dh = d / n_head, heads = R * n_head;
    float *h = work;              /* [R, d] */
    float *qkv = h + R * d;       /* [R, 3d] */
    float *q = qkv + R * 3 * d;   /* [R, d] */
    float *att = q + R * d;       /* [R, d] */
    float *hidden = att + R * d;  /* [R, ffn] */
    int b0 = HEAD_LO(heads, tid, nt), b1 = HEAD_HI(heads, tid, nt); /* (row, head) pairs */

    /* self-attention */
    team_barrier(team, nt); /* x complete: the previous block's residual was split */
    if (tid == 0) layer_norm_rows(R, d, x, ln1_w, ln1_b, eps, h);
    team_barrier(team, nt);
    linear_share(tid, nt, R, qkv_type, 3 * d, d, qkv_w, h, qkv, qkv_b, scratch);
    team_barrier(team, nt);
    for (int b = b0; b < b1; b++) {
        int r = b / n_head, hd = b % n_head;
        const float *row = qkv + r * 3 * d;
        float *kd = keys + (b * capacity + pos) * dh;
        float *vd = values + (b * capacity + pos) * dh;
        for (int c = 0; c < dh; c++) {
            q[b * dh + c] = row[hd * dh + c];
            kd[c] = row[d + hd * dh + c];
            vd[c] = row[2 * d + hd * dh + c];
        }
        if (kv_out)
            for (int c = 0; c < dh; c++) {
                kv_out[r * 2 * d + hd * dh + c] = kd[c];
                kv_out[r * 2 * d + d + hd * dh + c] = vd[c];
            }
    }
    if (b1 > b0)
        attention_f32(b1 - b0, 1, pos + 1, dh, q + b0 * dh, dh, keys + b0 * capacity * dh,
                      capacity * dh, values + b0 * capacity * dh, capacity * dh, 0, 0, scale,
                      att + b0 * dh, dh, scratch);
    team_barrier(team, nt);
    linear_share(tid, nt, R, out_type, d, d, out_w, att, h, 0, scratch);
    residual_share(tid, nt, R, d, x, h, out_b);
    team_barrier(team, nt);

    /* cross-attention over the audio */
    if (tid == 0) layer_norm_rows(R, d, x, ln2_w, ln2_b, eps, h);
    team_barrier(team, nt);
    linear_share(tid, nt, R, cq_type, d, d, cq_w, h, q, cq_b, scratch);
    team_barrier(team, nt);
    for (int r = b0 / n_head; r < R && r * n_head < b1; r++) {
        int ha = imax(b0, r * n_head) - r * n_head, hb = imin(b1, (r + 1) * n_head) - r * n_head;
        if (hb > ha)
            attention_f32(hb - ha, 1, n_audio, dh, q + r * d + ha * dh, dh,
                          cross_k + r * cross_bs + ha * n_audio * dh, n_audio * dh,
                          cross_v + r * cross_bs + ha * n_audio * dh, n_audio * dh, 0, 0,
                          scale, att + r * d + ha * dh, dh, scratch);
    }
    team_barrier(team, nt);
    linear_share(tid, nt, R, co_type, d, d, co_w, att, h, 0, scratch);
    residual_share(tid, nt, R, d, x, h, co_b);
    team_barrier(team, nt);

    /* MLP */
    if (tid == 0) layer_norm_rows(R, d, x, ln3_w, ln3_b, eps, h);
    team_barrier(team, nt);
    linear_share(tid, nt, R, fc1_type, ffn, d, fc1_w, h, hidden, fc1_b, scratch);
    int f0 = SHARE_LO(ffn, tid, nt), f1 = SHARE_HI(ffn, tid, nt);
    if (f1 > f0)
        for (int r = 0; r < R; r++)
            unary_f32(UNARY_GELU_ERF, f1 - f0, hidden + r * ffn + f0, hidden + r * ffn + f0);
    team_barrier(team, nt);
    linear_share(tid, nt, R, fc2_type, d, ffn, fc2_w, hidden, h, 0, scratch);
    residual_share(tid, nt, R, d, x, h, fc2_b);
}

/* logits [R, rows] = W layer_norm(x); work: R * d floats. */
static void ln_logits(int tid, int nt, TeamCtrl *team, int R, int d, int rows, const float *x,
                      const float *ln_w, const float *ln_b, float eps, int w_type,
                      const void *w, float *work, float *logits, uint8_t *scratch) {
    team_barrier(team, nt);
    if (tid == 0) layer_norm_rows(R, d, x, ln_w, ln_b, eps, work);
    team_barrier(team, nt);
    linear_share(tid, nt, R, w_type, rows, d, w, work, logits, 0, scratch);
}

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
    whisper_block(0, 1, 0, R, d, n_head, ffn, pos, capacity, n_audio, eps, scale, x, work,
                  ln1_w, ln1_b, qkv_type, qkv_w, qkv_b, out_type, out_w, out_b, ln2_w, ln2_b,
                  cq_type, cq_w, cq_b, cross_k, cross_v, cross_bs, co_type, co_w, co_b, ln3_w,
                  ln3_b, fc1_type, fc1_w, fc1_b, fc2_type, fc2_w, fc2_b, keys, values, 0,
                  scratch);
}

KERNEL void ln_logits_step(int R, int d, int rows, const float *x, const float *ln_w,
                           const float *ln_b, float eps, int w_type, const void *w,
                           float *work, float *logits, uint8_t *scratch) {
    ln_logits(0, 1, 0, R, d, rows, x, ln_w, ln_b, eps, w_type, w, work, logits, scratch);
}

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

void llama_team_step(int tid, int nt, TeamCtrl *team, const int32_t *a, uint8_t *scratch) {
    int d = ARG_I(a, LH(D)), n_heads = ARG_I(a, LH(N_HEADS)), n_kv = ARG_I(a, LH(N_KV));
    int head_dim = ARG_I(a, LH(HEAD_DIM)), ffn = ARG_I(a, LH(FFN));
    int interleaved = ARG_I(a, LH(INTERLEAVED)), pos = ARG_I(a, LH(POS));
    float scale = ARG_F(a, LH(SCALE));
    int n_layers = ARG_I(a, LH(N_LAYERS)), layer_words = ARG_I(a, LH(LAYER_WORDS));
    float *x = ARG_P(a, LH(X)), *work = ARG_P(a, LH(WORK)), *kv_out = ARG_P(a, LH(KV_OUT));
    const float *cos_row = ARG_P(a, LH(COS_ROW)), *sin_row = ARG_P(a, LH(SIN_ROW));
    int kv_size = n_kv * head_dim;
    for (int l = 0; l < n_layers; l++) {
        const int32_t *L = a + TEAM_LLAMA_HEADER + l * layer_words;
        llama_block(tid, nt, team, d, n_heads, n_kv, head_dim, ffn, interleaved, pos,
                    ARG_I(L, LL(CAPACITY)), scale, x, work, ARG_P(L, LL(ATTN_NORM)),
                    ARG_P(L, LL(MLP_NORM)), ARG_F(L, LL(EPS)),
                    ARG_I(L, LL(Q_TYPE)), ARG_I(L, LL(Q_ROWS)), ARG_P(L, LL(Q_W)),
                    ARG_I(L, LL(K_TYPE)), ARG_I(L, LL(K_ROWS)), ARG_P(L, LL(K_W)),
                    ARG_I(L, LL(V_TYPE)), ARG_I(L, LL(V_ROWS)), ARG_P(L, LL(V_W)),
                    ARG_P(L, LL(QKV_B)), ARG_I(L, LL(O_TYPE)), ARG_P(L, LL(O_W)),
                    ARG_I(L, LL(G_TYPE)), ARG_I(L, LL(G_ROWS)), ARG_P(L, LL(G_W)),
                    ARG_I(L, LL(U_TYPE)), ARG_I(L, LL(U_ROWS)), ARG_P(L, LL(U_W)),
                    ARG_I(L, LL(DOWN_TYPE)), ARG_P(L, LL(DOWN_W)),
                    ARG_P(L, LL(KEYS)), ARG_P(L, LL(VALUES)), cos_row, sin_row,
                    kv_out ? kv_out + l * 2 * kv_size : 0, scratch);
    }
    float *logits = ARG_P(a, LH(LOGITS));
    if (logits)
        rms_logits(tid, nt, team, d, ARG_I(a, LH(VOCAB)), x, ARG_P(a, LH(NORM)),
                   ARG_F(a, LH(NORM_EPS)), ARG_I(a, LH(HEAD_TYPE)), ARG_P(a, LH(HEAD_W)), work,
                   logits, scratch);
}

void whisper_team_step(int tid, int nt, TeamCtrl *team, const int32_t *a, uint8_t *scratch) {
    int R = ARG_I(a, WH(R)), d = ARG_I(a, WH(D)), n_head = ARG_I(a, WH(N_HEAD));
    int ffn = ARG_I(a, WH(FFN)), pos = ARG_I(a, WH(POS)), n_audio = ARG_I(a, WH(N_AUDIO));
    float eps = ARG_F(a, WH(EPS)), scale = ARG_F(a, WH(SCALE));
    int n_blocks = ARG_I(a, WH(N_BLOCKS)), block_words = ARG_I(a, WH(BLOCK_WORDS));
    float *x = ARG_P(a, WH(X)), *work = ARG_P(a, WH(WORK)), *kv_out = ARG_P(a, WH(KV_OUT));
    int cross_bs = ARG_I(a, WH(CROSS_BS));
    for (int l = 0; l < n_blocks; l++) {
        const int32_t *B = a + TEAM_WHISPER_HEADER + l * block_words;
        whisper_block(tid, nt, team, R, d, n_head, ffn, pos, ARG_I(B, WB(CAPACITY)), n_audio,
                      eps, scale, x, work, ARG_P(B, WB(LN1_W)), ARG_P(B, WB(LN1_B)),
                      ARG_I(B, WB(QKV_TYPE)), ARG_P(B, WB(QKV_W)), ARG_P(B, WB(QKV_B)),
                      ARG_I(B, WB(OUT_TYPE)), ARG_P(B, WB(OUT_W)), ARG_P(B, WB(OUT_B)),
                      ARG_P(B, WB(LN2_W)), ARG_P(B, WB(LN2_B)),
                      ARG_I(B, WB(CQ_TYPE)), ARG_P(B, WB(CQ_W)), ARG_P(B, WB(CQ_B)),
                      ARG_P(B, WB(CROSS_K)), ARG_P(B, WB(CROSS_V)), cross_bs,
                      ARG_I(B, WB(CO_TYPE)), ARG_P(B, WB(CO_W)), ARG_P(B, WB(CO_B)),
                      ARG_P(B, WB(LN3_W)), ARG_P(B, WB(LN3_B)),
                      ARG_I(B, WB(FC1_TYPE)), ARG_P(B, WB(FC1_W)), ARG_P(B, WB(FC1_B)),
                      ARG_I(B, WB(FC2_TYPE)), ARG_P(B, WB(FC2_W)), ARG_P(B, WB(FC2_B)),
                      ARG_P(B, WB(KEYS)), ARG_P(B, WB(VALUES)),
                      kv_out ? kv_out + l * R * 2 * d : 0, scratch);
    }
    float *logits = ARG_P(a, WH(LOGITS));
    if (logits)
        ln_logits(tid, nt, team, R, d, ARG_I(a, WH(VOCAB)), x, ARG_P(a, WH(LN_W)),
                  ARG_P(a, WH(LN_B)), ARG_F(a, WH(LN_EPS)), ARG_I(a, WH(HEAD_TYPE)),
                  ARG_P(a, WH(HEAD_W)), work, logits, scratch);
}

/* ---- Whisper's encoder on the team: one audio window, every layer in one job ---------------
 * The one-thread encoder is backend/wasm/parts.py's WhisperEncoder (kernel calls from Python);
 * this is the same sequence of kernel calls on the same operands, split between the threads:
 * products by output columns (each thread fills its columns with the bias, then accumulates
 * its product into them, as `_Linear` does), row-wise norms and elementwise work by rows, and
 * attention by heads. Time-major activations [frames, d] throughout. */

/* C[:, lo:hi] (+)= A W[lo:hi]^T for this thread's columns of an N-column output, W [N, K]
 * stored row-major, A rows of stride a_rs; C's row stride c_rs. `fill` (may be 0): C's columns
 * start as fill[lo:hi] (the bias), else C accumulates. */
static void gemm_cols(int tid, int nt, int M, int N, int K, const float *A, int a_rs,
                      const float *W, float *C, int c_rs, const float *fill, int add_bias,
                      uint8_t *scratch) {
    int lo = SHARE_LO(N, tid, nt), hi = SHARE_HI(N, tid, nt);
    if (hi <= lo) return;
    if (fill)
        for (int m = 0; m < M; m++) {
            float *c = C + m * c_rs + lo;
            if (add_bias) add_into(hi - lo, c, fill + lo);
            else
                for (int n = 0; n < hi - lo; n++) c[n] = fill[lo + n];
        }
    gemm_f32(1, M, hi - lo, K, A, 0, a_rs, 1, W + lo * K, 0, 1, K, C + lo, 0, c_rs, 1.0f,
             scratch);
}

void whisper_encoder_team_step(int tid, int nt, TeamCtrl *team, const int32_t *a,
                               uint8_t *scratch) {
    int frames_in = ARG_I(a, EH(FRAMES_IN)), n_mels = ARG_I(a, EH(N_MELS)), d = ARG_I(a, EH(D));
    int n_head = ARG_I(a, EH(N_HEAD)), ffn = ARG_I(a, EH(FFN)), n_blocks = ARG_I(a, EH(N_BLOCKS));
    int block_words = ARG_I(a, EH(BLOCK_WORDS));
    const float *mel = ARG_P(a, EH(MEL)); /* [frames_in + 2, n_mels], zero rows first and last */
    /* convolution taps [3, d, n_mels] and [3, d, d] */
    const float *conv1_w = ARG_P(a, EH(CONV1_W)), *conv1_b = ARG_P(a, EH(CONV1_B));
    const float *conv2_w = ARG_P(a, EH(CONV2_W)), *conv2_b = ARG_P(a, EH(CONV2_B));
    const float *positions = ARG_P(a, EH(POSITIONS));
    const float *ln_w = ARG_P(a, EH(LN_W)), *ln_b = ARG_P(a, EH(LN_B));
    float ln_eps = ARG_F(a, EH(LN_EPS)), scale = ARG_F(a, EH(SCALE));
    float *out = ARG_P(a, EH(OUT)), *work = ARG_P(a, EH(WORK));
    int F = (frames_in - 1) / 2 + 1, dh = d / n_head;
    float *padded = work;                         /* [frames_in + 2, d]: conv1's output */
    float *x = padded + (frames_in + 2) * d;      /* [F, d] */
    float *h = x + F * d;                         /* [F, d] */
    float *qkv = h + F * d;                       /* [F, 3d] */
    float *heads = qkv + 3 * F * d;               /* q, k, v, attended: 4 x [n_head, F, dh] */
    float *merged = heads + 4 * F * d;            /* [F, d] */
    float *hidden = merged + F * d;               /* [F, ffn] */
    int r0 = team_lo(F, 1, tid, nt), r1 = team_lo(F, 1, tid + 1, nt);
    int p0 = team_lo(frames_in, 1, tid, nt), p1 = team_lo(frames_in, 1, tid + 1, nt);
    int h0 = HEAD_LO(n_head, tid, nt), h1 = HEAD_HI(n_head, tid, nt);

    /* conv1 (stride 1) into padded's rows 1..frames_in, then GELU; rows 0 and last are 0 */
    if (tid == 0)
        for (int c = 0; c < d; c++) {
            padded[c] = 0.0f;
            padded[(frames_in + 1) * d + c] = 0.0f;
        }
    for (int j = 0; j < 3; j++)
        gemm_cols(tid, nt, frames_in, d, n_mels, mel + j * n_mels, n_mels,
                  conv1_w + j * d * n_mels, padded + d, d, j == 0 ? conv1_b : 0, 0, scratch);
    team_barrier(team, nt);
    if (p1 > p0) unary_f32(UNARY_GELU_ERF, (p1 - p0) * d, padded + (1 + p0) * d,
                           padded + (1 + p0) * d);
    team_barrier(team, nt);
    /* conv2 (stride 2): output t reads padded rows 2t, 2t + 1, 2t + 2 */
    for (int j = 0; j < 3; j++)
        gemm_cols(tid, nt, F, d, d, padded + j * d, 2 * d, conv2_w + j * d * d, x, d,
                  j == 0 ? conv2_b : 0, 0, scratch);
    team_barrier(team, nt);
    if (r1 > r0) {
        unary_f32(UNARY_GELU_ERF, (r1 - r0) * d, x + r0 * d, x + r0 * d);
        add_into((r1 - r0) * d, x + r0 * d, positions + r0 * d);
    }

    for (int l = 0; l < n_blocks; l++) {
        const int32_t *B = a + TEAM_ENCODER_HEADER + l * block_words;
        const float *qkv_w = ARG_P(B, EB(QKV_W)), *qkv_b = ARG_P(B, EB(QKV_B));
        const float *out_w = ARG_P(B, EB(OUT_W)), *out_b = ARG_P(B, EB(OUT_B));
        const float *fc1_w = ARG_P(B, EB(FC1_W)), *fc1_b = ARG_P(B, EB(FC1_B));
        const float *fc2_w = ARG_P(B, EB(FC2_W)), *fc2_b = ARG_P(B, EB(FC2_B));
        team_barrier(team, nt);
        if (r1 > r0)
            layer_norm_rows(r1 - r0, d, x + r0 * d, ARG_P(B, EB(LN1_W)), ARG_P(B, EB(LN1_B)),
                            ARG_F(B, EB(LN1_EPS)), h + r0 * d);
        team_barrier(team, nt);
        gemm_cols(tid, nt, F, 3 * d, d, h, d, qkv_w, qkv, 3 * d, qkv_b, 0, scratch);
        team_barrier(team, nt);
        /* this thread's heads: split out of qkv, attend, merge back time-major */
        float *q = heads, *k = heads + F * d, *v = heads + 2 * F * d, *att = heads + 3 * F * d;
        for (int hd = h0; hd < h1; hd++)
            for (int t = 0; t < F; t++) {
                const float *row = qkv + t * 3 * d + hd * dh;
                float *qd = q + (hd * F + t) * dh, *kd = k + (hd * F + t) * dh;
                float *vd = v + (hd * F + t) * dh;
                for (int c = 0; c < dh; c++) {
                    qd[c] = row[c];
                    kd[c] = row[d + c];
                    vd[c] = row[2 * d + c];
                }
            }
        if (h1 > h0)
            attention_f32(h1 - h0, F, F, dh, q + h0 * F * dh, F * dh, k + h0 * F * dh, F * dh,
                          v + h0 * F * dh, F * dh, 0, 0, scale, att + h0 * F * dh, F * dh,
                          scratch);
        for (int hd = h0; hd < h1; hd++)
            for (int t = 0; t < F; t++)
                for (int c = 0; c < dh; c++)
                    merged[t * d + hd * dh + c] = att[(hd * F + t) * dh + c];
        team_barrier(team, nt);
        gemm_cols(tid, nt, F, d, d, merged, d, out_w, x, d, out_b, 1, scratch);
        team_barrier(team, nt);
        if (r1 > r0)
            layer_norm_rows(r1 - r0, d, x + r0 * d, ARG_P(B, EB(LN2_W)), ARG_P(B, EB(LN2_B)),
                            ARG_F(B, EB(LN2_EPS)), h + r0 * d);
        team_barrier(team, nt);
        gemm_cols(tid, nt, F, ffn, d, h, d, fc1_w, hidden, ffn, fc1_b, 0, scratch);
        int f0 = SHARE_LO(ffn, tid, nt), f1 = SHARE_HI(ffn, tid, nt);
        if (f1 > f0)
            for (int t = 0; t < F; t++)
                unary_f32(UNARY_GELU_ERF, f1 - f0, hidden + t * ffn + f0, hidden + t * ffn + f0);
        team_barrier(team, nt);
        gemm_cols(tid, nt, F, d, ffn, hidden, ffn, fc2_w, x, d, fc2_b, 1, scratch);
    }
    team_barrier(team, nt);
    if (r1 > r0) layer_norm_rows(r1 - r0, d, x + r0 * d, ln_w, ln_b, ln_eps, out + r0 * d);
}
