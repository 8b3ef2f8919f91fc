/* linear_q for the k-quants (256-element super-blocks): Q2_K, Q3_K, Q4_K, Q5_K, Q6_K
 * (see linear.c). */
#include "quant_linear.h"

void linear_qk(int type, int M, int N, int K, const float *X, int x_rs, const uint8_t *W,
               float *Y, int y_rs, uint8_t *scratch) {
    switch (type) {
    case T_Q2_K: linear_typed(T_Q2_K, M, N, K, X, x_rs, W, Y, y_rs, scratch); break;
    case T_Q3_K: linear_typed(T_Q3_K, M, N, K, X, x_rs, W, Y, y_rs, scratch); break;
    case T_Q4_K: linear_typed(T_Q4_K, M, N, K, X, x_rs, W, Y, y_rs, scratch); break;
    case T_Q5_K: linear_typed(T_Q5_K, M, N, K, X, x_rs, W, Y, y_rs, scratch); break;
    case T_Q6_K: linear_typed(T_Q6_K, M, N, K, X, x_rs, W, Y, y_rs, scratch); break;
    default: break; /* not reached: linear_q passes only this file's types */
    }
}
