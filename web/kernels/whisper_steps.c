/* Whisper's fused steps (see steps.c for the method): one call per decoder block, one for the
 * final layer norm and vocabulary projection, the team's decoder job (every block of a step),
 * and the encoder's team job (one audio window, every layer).
 */
#include "steps.h"

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
