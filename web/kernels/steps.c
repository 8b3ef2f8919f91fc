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
 *
 * Files: steps.h (the shares and the argument blocks' readers), this file (LLaMA), and
 * whisper_steps.c (Whisper's decoder blocks, and its encoder as one team job).
 */
#include "steps.h"
#include "quant.h"

/* ---- LLaMA ----------------------------------------------------------------------------------
 * x [d]: the hidden state, updated in place. keys, values [n_kv, capacity, head_dim]: this
 * step writes position `pos`; kv_out (may be 0) gets the same new key then value [2, n_kv *
 * head_dim]. cos_row, sin_row: the rotary tables' row of `pos` [head_dim / 2].
 * work: d + (q + 2 kv) + q + 3 ffn floats, q = n_heads * head_dim, kv = n_kv * head_dim; h:
 * this thread's own d floats (the first thread's are work's first d).
 *
 * On a team, four barriers a block, one before each product that reads what both threads
 * wrote (the floor for products split by output rows):
 *   1. x complete: each thread computes the whole rms_norm into its own h (the same numbers),
 *      then, for its kv heads [g0, g1), their query heads' q, k and v (+ bias), RoPE, the cache
 *      row `pos` and kv_out, and their attention (which reads only those heads);
 *   2. attention complete: its columns of the output projection and of the residual;
 *   3. x complete: the whole rms_norm again into h, its columns of gate and up, silu * up;
 *   4. the activation complete: its columns of down and of the residual;
 * the next block's (or the logits') first barrier completes x. Every product row is computed
 * by the same code on the same operands wherever the cut falls (shares start at multiples of
 * TEAM_ROW_ALIGN, else one thread takes the phase), so one and two threads agree bit for bit. */

/* Y[c] (+ bias[c]; bias may be 0) for the columns c in [lo, hi) that belong to one stored piece
 * of a projection passed piece by piece: the piece makes columns [start, start + rows). */
static void piece_cols(int lo, int hi, int start, int type, int rows, const void *W, int K,
                       const float *X, float *Y, const float *bias, uint8_t *scratch) {
    int a = imax(lo, start) - start, b = imin(hi, start + rows) - start;
    if (b <= a) return;
    matmul_cols(1, type, a, b, K, W, X, Y + start, rows, scratch);
    if (bias) add_into(b - a, Y + start + a, bias + start + a);
}

/* The int8 flags a projection's pieces add to their types so that each piece gives the bits
 * of numba's joined weight (parts/llama_decoder.py: _joined): offsets grouped by 16 where a
 * piece scales by 16 and some piece has offsets; a piece without offsets adds fold(0s) where
 * another has them. 0 unless a present piece is int8. */
static int int8_join(int t0, int r0, int t1, int r1, int t2, int r2) {
    int int8 = 0, by16 = 0, offsets = 0;
    for (int i = 0; i < 3; i++) {
        int t = i == 0 ? t0 : (i == 1 ? t1 : t2), rows = i == 0 ? r0 : (i == 1 ? r1 : r2);
        if (rows <= 0 || !(t & MATRIX_INT8)) continue;
        int g = t & MATRIX_TYPE_MASK;
        int8 = 1;
        by16 |= g == T_Q2_K || g == T_Q3_K || g == T_Q6_K;
        offsets |= g == T_Q4_1 || g == T_Q5_1 || g == T_Q2_K || g == T_Q4_K || g == T_Q5_K;
    }
    if (!int8) return 0;
    return (offsets ? INT8_OFFSETS_JOINED : 0) | (offsets && by16 ? INT8_OFFSETS_16 : 0);
}

static void llama_block(int tid, int nt, TeamCtrl *team, int d, int n_heads, int n_kv,
                        int head_dim, int ffn, int interleaved, int pos, int capacity,
                        float scale, float *x, float *work, float *h, const float *attn_norm,
                        const float *mlp_norm, float eps, int q_type, int q_rows,
                        const void *q_w, int k_type, int k_rows, const void *k_w, int v_type,
                        int v_rows, const void *v_w, const float *qkv_b, int o_type,
                        const void *o_w, int g_type,
                        int g_rows, const void *g_w, int u_type, int u_rows, const void *u_w,
                        int down_type, const void *down_w, float *keys, float *values,
                        const float *cos_row, const float *sin_row, float *kv_out,
                        uint8_t *scratch) {
    int q_size = n_heads * head_dim, kv_size = n_kv * head_dim, n_rep = n_heads / n_kv;
    float *qkv = work + d;
    float *att = qkv + q_size + 2 * kv_size;
    float *gu = att + q_size;
    float *act = gu + 2 * ffn;

    /* 1. (x complete: the caller's barrier) norm, then this thread's kv heads end to end */
    rms_norm_rows(1, d, x, attn_norm, eps, h);
    int aligned = head_dim % TEAM_ROW_ALIGN == 0;
    int g0 = aligned ? HEAD_LO(n_kv, tid, nt) : 0;
    int g1 = aligned ? HEAD_HI(n_kv, tid, nt) : (tid == 0 ? n_kv : 0);
    int qkv_join = int8_join(q_type, q_rows, k_type, k_rows, v_type, v_rows);
    q_type |= q_type & MATRIX_INT8 ? qkv_join : 0;
    k_type |= k_type & MATRIX_INT8 ? qkv_join : 0;
    v_type |= v_type & MATRIX_INT8 ? qkv_join : 0;
    int gu_join = int8_join(g_type, g_rows, u_type, u_rows, 0, 0);
    g_type |= g_type & MATRIX_INT8 ? gu_join : 0;
    u_type |= u_type & MATRIX_INT8 ? gu_join : 0;
    if (g1 > g0) {
        int qh = n_rep * head_dim, gn = g1 - g0;
        /* its columns of q, of k and of v; qkv_b (qwen2's bias on q|k|v, 0: none) on each */
        for (int part = 0; part < 3; part++) {
            int lo = part == 0 ? g0 * qh : q_size + (part - 1) * kv_size + g0 * head_dim;
            int hi = part == 0 ? g1 * qh : q_size + (part - 1) * kv_size + g1 * head_dim;
            piece_cols(lo, hi, 0, q_type, q_rows, q_w, d, h, qkv, qkv_b, scratch);
            piece_cols(lo, hi, q_rows, k_type, k_rows, k_w, d, h, qkv, qkv_b, scratch);
            piece_cols(lo, hi, q_rows + k_rows, v_type, v_rows, v_w, d, h, qkv, qkv_b, scratch);
        }
        float *q = qkv + g0 * qh, *k_new = qkv + q_size, *v_new = k_new + kv_size;
        rope_f32(interleaved, gn * n_rep, 1, head_dim, q, cos_row, sin_row, q);
        rope_f32(interleaved, gn, 1, head_dim, k_new + g0 * head_dim, cos_row, sin_row,
                 k_new + g0 * head_dim);
        for (int kh = g0; kh < g1; kh++) {
            float *kd = keys + (kh * capacity + pos) * head_dim;
            float *vd = values + (kh * capacity + pos) * head_dim;
            for (int c = 0; c < head_dim; c++) {
                kd[c] = k_new[kh * head_dim + c];
                vd[c] = v_new[kh * head_dim + c];
            }
            if (kv_out)
                for (int c = 0; c < head_dim; c++) {
                    kv_out[kh * head_dim + c] = kd[c];
                    kv_out[kv_size + kh * head_dim + c] = vd[c];
                }
        }
        /* Grouped queries: the n_rep query heads of kv head g are n_rep query rows of it. */
        attention_f32(gn, n_rep, pos + 1, head_dim, q, qh, keys + g0 * capacity * head_dim,
                      capacity * head_dim, values + g0 * capacity * head_dim,
                      capacity * head_dim, 0, 0, scale, att + g0 * qh, qh, scratch);
    }
    team_barrier(team, nt);
    /* 2. the output projection and the residual on this thread's columns (h: its own) */
    linear_share(tid, nt, 1, o_type, d, q_size, o_w, att, h, 0, scratch);
    residual_share(tid, nt, 1, d, x, h, 0);
    team_barrier(team, nt);

    /* 3. norm, then gate and up on this thread's columns of each, and their product */
    rms_norm_rows(1, d, x, mlp_norm, eps, h);
    int f0 = SHARE_LO(ffn, tid, nt), f1 = SHARE_HI(ffn, tid, nt);
    if (g_rows != ffn && ffn % TEAM_ROW_ALIGN != 0) { /* up's columns would start unaligned */
        f0 = tid == 0 ? 0 : ffn;
        f1 = tid == 0 ? ffn : ffn;
    }
    if (f1 > f0) {
        for (int half = 0; half < 2; half++) {
            int lo = half * ffn + f0, hi = half * ffn + f1;
            piece_cols(lo, hi, 0, g_type, g_rows, g_w, d, h, gu, 0, scratch);
            piece_cols(lo, hi, g_rows, u_type, u_rows, u_w, d, h, gu, 0, scratch);
        }
        silu_mul(f1 - f0, gu + f0, gu + ffn + f0, act + f0);
    }
    team_barrier(team, nt);
    /* 4. down and the residual on this thread's columns */
    linear_share(tid, nt, 1, down_type, d, ffn, down_w, act, h, 0, scratch);
    residual_share(tid, nt, 1, d, x, h, 0);
}

/* logits [rows] = W rms_norm(x); h: d floats of this thread's own. */
static void rms_logits(int tid, int nt, TeamCtrl *team, int d, int rows, const float *x,
                       const float *norm, float eps, int w_type, const void *w, float *h,
                       float *logits, uint8_t *scratch) {
    team_barrier(team, nt); /* x complete (the last block's residual was split) */
    rms_norm_rows(1, d, x, norm, eps, h);
    linear_share(tid, nt, 1, w_type, rows, d, w, h, logits, 0, scratch);
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
                work, work, attn_norm, mlp_norm, eps, q_type, q_rows, q_w, k_type, k_rows, k_w,
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

void llama_team_step(int tid, int nt, TeamCtrl *team, const int32_t *a, uint8_t *scratch) {
    int d = ARG_I(a, LH(D)), n_heads = ARG_I(a, LH(N_HEADS)), n_kv = ARG_I(a, LH(N_KV));
    int head_dim = ARG_I(a, LH(HEAD_DIM)), ffn = ARG_I(a, LH(FFN));
    int interleaved = ARG_I(a, LH(INTERLEAVED)), pos = ARG_I(a, LH(POS));
    float scale = ARG_F(a, LH(SCALE));
    int n_layers = ARG_I(a, LH(N_LAYERS)), layer_words = ARG_I(a, LH(LAYER_WORDS));
    float *x = ARG_P(a, LH(X)), *work = ARG_P(a, LH(WORK)), *kv_out = ARG_P(a, LH(KV_OUT));
    const float *cos_row = ARG_P(a, LH(COS_ROW)), *sin_row = ARG_P(a, LH(SIN_ROW));
    int kv_size = n_kv * head_dim;
    /* this thread's own d floats: the first thread's are work's first; the others' follow the
     * block's work (d + (q + 2 kv) + q + 3 ffn floats), one d each */
    float *h = tid == 0 ? work
                        : work + d + 2 * n_heads * head_dim + 2 * kv_size + 3 * ffn
                          + (tid - 1) * d;
    for (int l = 0; l < n_layers; l++) {
        const int32_t *L = a + TEAM_LLAMA_HEADER + l * layer_words;
        /* x complete: the previous block's residual was split (the host wrote the first x
         * before team_run handed the job over) */
        if (l > 0) team_barrier(team, nt);
        llama_block(tid, nt, team, d, n_heads, n_kv, head_dim, ffn, interleaved, pos,
                    ARG_I(L, LL(CAPACITY)), scale, x, work, h, ARG_P(L, LL(ATTN_NORM)),
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
                   ARG_F(a, LH(NORM_EPS)), ARG_I(a, LH(HEAD_TYPE)), ARG_P(a, LH(HEAD_W)), h,
                   logits, scratch);
}
