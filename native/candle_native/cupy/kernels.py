"""CUDA sources of the cupy backend's RawKernels, compiled once per process and device.

Float kernels are written for f32 (the compute dtype of every model); f64 inputs take the
composed cupy path in cupy_backend. Row kernels run one thread block per row and reduce in
shared memory; the quantized matvec runs one warp per weight row.
"""

from __future__ import annotations

BLOCK_THREADS = 256
WARP = 32

_BLOCK_REDUCE = r"""
#define NEG_INF __int_as_float(0xff800000)
// Reduce `value` over the block (blockDim.x a multiple of 32, <= 1024); every thread gets the
// result. `scratch` holds 32 floats of shared memory.
__device__ float block_reduce(float value, float* scratch, bool take_max) {
    for (int offset = 16; offset > 0; offset >>= 1) {
        float other = __shfl_down_sync(0xffffffff, value, offset);
        value = take_max ? fmaxf(value, other) : value + other;
    }
    int lane = threadIdx.x & 31;
    int warp = threadIdx.x >> 5;
    __syncthreads();  // scratch may still be read by a previous reduction
    if (lane == 0) scratch[warp] = value;
    __syncthreads();
    int n_warps = blockDim.x >> 5;
    value = (threadIdx.x < n_warps) ? scratch[threadIdx.x] : (take_max ? NEG_INF : 0.0f);
    if (warp == 0) {
        for (int offset = 16; offset > 0; offset >>= 1) {
            float other = __shfl_down_sync(0xffffffff, value, offset);
            value = take_max ? fmaxf(value, other) : value + other;
        }
        if (lane == 0) scratch[0] = value;
    }
    __syncthreads();
    return scratch[0];
}
"""

ROW_KERNELS = _BLOCK_REDUCE + r"""
extern "C" __global__ void softmax_rows(const float* x, float* out, int d, int log_mode) {
    __shared__ float scratch[32];
    const float* row = x + (size_t)blockIdx.x * d;
    float* dst = out + (size_t)blockIdx.x * d;
    float peak = NEG_INF;
    for (int j = threadIdx.x; j < d; j += blockDim.x) peak = fmaxf(peak, row[j]);
    peak = block_reduce(peak, scratch, true);
    float total = 0.0f;
    for (int j = threadIdx.x; j < d; j += blockDim.x) {
        float e = expf(row[j] - peak);
        if (!log_mode) dst[j] = e;
        total += e;
    }
    total = block_reduce(total, scratch, false);
    if (log_mode) {
        float log_total = logf(total);
        for (int j = threadIdx.x; j < d; j += blockDim.x) dst[j] = (row[j] - peak) - log_total;
    } else {
        for (int j = threadIdx.x; j < d; j += blockDim.x) dst[j] = dst[j] / total;
    }
}

// mode 0: layer norm (weight, bias may be null); mode 1: rms norm (weight may be null).
extern "C" __global__ void norm_rows(const float* x, const float* weight, const float* bias,
                                     float eps, float* out, int d, int rms) {
    __shared__ float scratch[32];
    const float* row = x + (size_t)blockIdx.x * d;
    float* dst = out + (size_t)blockIdx.x * d;
    float mean = 0.0f;
    if (!rms) {
        float total = 0.0f;
        for (int j = threadIdx.x; j < d; j += blockDim.x) total += row[j];
        mean = block_reduce(total, scratch, false) / (float)d;
    }
    float squares = 0.0f;
    for (int j = threadIdx.x; j < d; j += blockDim.x) {
        float c = row[j] - mean;
        squares += c * c;
    }
    squares = block_reduce(squares, scratch, false);
    float inv = 1.0f / sqrtf(squares / (float)d + eps);
    for (int j = threadIdx.x; j < d; j += blockDim.x) {
        float v = (row[j] - mean) * inv;
        if (weight) v *= weight[j];
        if (bias) v += bias[j];
        dst[j] = v;
    }
}

// One thread per rotated pair. x is [rows, d] with row r at position r % t; cos/sin [t, d/2].
extern "C" __global__ void rope_rows(const float* x, const float* cos_t, const float* sin_t,
                                     float* out, long long rows, int d, int t, int interleaved) {
    long long pair = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    int half = d / 2;
    if (pair >= rows * half) return;
    long long r = pair / half;
    int i = (int)(pair % half);
    int p = (int)(r % t);
    float c = cos_t[p * half + i];
    float s = sin_t[p * half + i];
    const float* row = x + r * d;
    float* dst = out + r * d;
    if (interleaved) {
        float a = row[2 * i], b = row[2 * i + 1];
        dst[2 * i] = a * c - b * s;
        dst[2 * i + 1] = a * s + b * c;
    } else {
        float a = row[i], b = row[i + half];
        dst[i] = a * c - b * s;
        dst[i + half] = b * c + a * s;
    }
}

// Attention for one (batch, head, query) row per block: scores in dynamic shared memory.
// k/v are [bk, hk, tk, d] with bk in {1, b}, hk in {1, h}; the mask is read through element
// strides (0 on broadcast dims) so a broadcast mask needs no copy.
extern "C" __global__ void attention_rows(
        const float* q, const float* k, const float* v, const float* mask,
        long long ms0, long long ms1, long long ms2, long long ms3,
        float scale, float* out, int heads, int tq, int tk, int d, int dv,
        int k_batched, int k_headed) {
    extern __shared__ float scores[];
    __shared__ float scratch[32];
    int row = blockIdx.x;
    int bi = row / (heads * tq);
    int hi = (row / tq) % heads;
    int qi = row % tq;
    int kb = k_batched ? bi : 0;
    int kh = k_headed ? hi : 0;
    int k_heads = k_headed ? heads : 1;
    const float* qrow = q + (size_t)row * d;
    const float* kbase = k + ((size_t)kb * k_heads + kh) * (size_t)tk * d;
    const float* vbase = v + ((size_t)kb * k_heads + kh) * (size_t)tk * dv;
    float peak = NEG_INF;
    for (int j = threadIdx.x; j < tk; j += blockDim.x) {
        const float* krow = kbase + (size_t)j * d;
        float dot = 0.0f;
        for (int c = 0; c < d; ++c) dot += qrow[c] * krow[c];
        float s = dot * scale;
        if (mask) s += mask[bi * ms0 + hi * ms1 + qi * ms2 + j * ms3];
        scores[j] = s;
        peak = fmaxf(peak, s);
    }
    peak = block_reduce(peak, scratch, true);
    float total = 0.0f;
    for (int j = threadIdx.x; j < tk; j += blockDim.x) {
        float e = expf(scores[j] - peak);
        scores[j] = e;
        total += e;
    }
    total = block_reduce(total, scratch, false);
    for (int c = threadIdx.x; c < dv; c += blockDim.x) {
        float acc = 0.0f;
        for (int j = 0; j < tk; ++j) acc += (scores[j] / total) * vbase[(size_t)j * dv + c];
        out[(size_t)row * dv + c] = acc;
    }
}

extern "C" __global__ void silu_mul(const float* gate, const float* up, float* out, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
}
"""

# GROUP (elements per scale: 16 or 32) is defined at compile time with -DGROUP=...
QMATMUL_KERNELS = r"""
// out[r, i] = sum_g scales[i, g] * dot(levels[i, g-th group], x[r, g-th group])
//           + offsets[i, g] * xsum[r, g]       (offsets only when use_offsets)
// One warp per weight row i; each lane reads 4 int8 levels (char4) and 4 floats at a time;
// k is a multiple of 16, so rows stay 4-byte (levels) and 16-byte (x) aligned.
extern "C" __global__ void qmatvec(const float* x, const signed char* levels,
                                   const float* scales, const float* offsets,
                                   const float* xsum, int use_offsets, float* out,
                                   int m, int n, int k) {
    int warp = (int)(((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5);
    int lane = threadIdx.x & 31;
    if (warp >= n) return;
    int groups = k / GROUP;
    const signed char* row = levels + (size_t)warp * k;
    const float* srow = scales + (size_t)warp * groups;
    for (int r = 0; r < m; ++r) {
        const float* xr = x + (size_t)r * k;
        float acc = 0.0f;
        for (int j = lane * 4; j < k; j += 128) {
            char4 q4 = *reinterpret_cast<const char4*>(row + j);
            float4 xv = *reinterpret_cast<const float4*>(xr + j);
            float dot = (float)q4.x * xv.x + (float)q4.y * xv.y
                      + (float)q4.z * xv.z + (float)q4.w * xv.w;
            acc += srow[j / GROUP] * dot;
        }
        if (use_offsets) {
            const float* orow = offsets + (size_t)warp * groups;
            const float* srow_x = xsum + (size_t)r * groups;
            for (int g = lane; g < groups; g += 32) acc += orow[g] * srow_x[g];
        }
        for (int offset = 16; offset > 0; offset >>= 1)
            acc += __shfl_down_sync(0xffffffff, acc, offset);
        if (lane == 0) out[(size_t)r * n + warp] = acc;
    }
}

// f32 values of rows [start, start + rows) into out[rows, k]: scale * level (+ offset), the
// same two roundings as the reference dequantizers (__fmul_rn/__fadd_rn forbid FMA fusion).
extern "C" __global__ void dequantize_rows(const signed char* levels, const float* scales,
                                           const float* offsets, int use_offsets, float* out,
                                           long long start, long long rows, int k) {
    long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= rows * k) return;
    long long i = start + e / k;
    int j = (int)(e % k);
    int groups = k / GROUP;
    float value = __fmul_rn(scales[i * groups + j / GROUP], (float)levels[i * k + j]);
    if (use_offsets) value = __fadd_rn(value, offsets[i * groups + j / GROUP]);
    out[e] = value;
}
"""
