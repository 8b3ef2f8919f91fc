"""Elementwise activations on flat C-contiguous f32 arrays.

gelu_erf (exact erf: numpy's reference evaluates a 10-term erfc fit, several times slower), silu,
and silu(gate) * up fused into one pass (the LLaMA MLP), computed in f32 like the reference.
The tanh-GELU is not here: numba's scalar tanh loses to numpy's SIMD tanh (measured 6x).
Each op has a serial driver (decode-sized vectors) and a threaded one over fixed chunks.
"""

import math

import numpy as np
from numba import prange

from ._jit import kernel, parallel_kernel

INV_SQRT_2 = np.float32(1.0 / math.sqrt(2.0))
# Elements per parallel work item: big enough to amortise scheduling, small enough to balance.
CHUNK = 4096


@kernel
def _gelu_erf_span(x, out, start, stop):
    for j in range(start, stop):
        v = x[j]
        out[j] = np.float32(0.5) * v * (np.float32(1.0) + np.float32(math.erf(v * INV_SQRT_2)))


@kernel
def _silu_span(x, out, start, stop):
    for j in range(start, stop):
        v = x[j]
        out[j] = v / (np.float32(1.0) + np.float32(math.exp(-v)))


@kernel
def _silu_mul_span(gate, up, out, start, stop):
    for j in range(start, stop):
        v = gate[j]
        out[j] = v / (np.float32(1.0) + np.float32(math.exp(-v))) * up[j]


@kernel
def gelu_erf_serial(x, out):
    _gelu_erf_span(x, out, 0, x.size)


@parallel_kernel
def gelu_erf_parallel(x, out):
    for c in prange((x.size + CHUNK - 1) // CHUNK):
        _gelu_erf_span(x, out, c * CHUNK, min(x.size, (c + 1) * CHUNK))


@kernel
def silu_serial(x, out):
    _silu_span(x, out, 0, x.size)


@parallel_kernel
def silu_parallel(x, out):
    for c in prange((x.size + CHUNK - 1) // CHUNK):
        _silu_span(x, out, c * CHUNK, min(x.size, (c + 1) * CHUNK))


@kernel
def silu_mul_serial(gate, up, out):
    _silu_mul_span(gate, up, out, 0, gate.size)


@parallel_kernel
def silu_mul_parallel(gate, up, out):
    for c in prange((gate.size + CHUNK - 1) // CHUNK):
        _silu_mul_span(gate, up, out, c * CHUNK, min(gate.size, (c + 1) * CHUNK))
