/* linear_q for the 32-element block types: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (see linear.c). */
#include "quant_linear.h"

void linear_q32(int type, int M, int N, int K, const float *X, int x_rs, const uint8_t *W,
                float *Y, int y_rs, uint8_t *scratch) {
    switch (type) {
    case T_Q4_0: linear_typed(T_Q4_0, M, N, K, X, x_rs, W, Y, y_rs, scratch); break;
    case T_Q4_1: linear_typed(T_Q4_1, M, N, K, X, x_rs, W, Y, y_rs, scratch); break;
    case T_Q5_0: linear_typed(T_Q5_0, M, N, K, X, x_rs, W, Y, y_rs, scratch); break;
    case T_Q5_1: linear_typed(T_Q5_1, M, N, K, X, x_rs, W, Y, y_rs, scratch); break;
    case T_Q8_0: linear_typed(T_Q8_0, M, N, K, X, x_rs, W, Y, y_rs, scratch); break;
    default: break; /* not reached: linear_q passes only this file's types */
    }
}
