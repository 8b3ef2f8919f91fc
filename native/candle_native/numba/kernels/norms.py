"""Row-wise softmax, log-softmax, layer norm and RMS norm on a C-contiguous f32 [rows, d].

The norms have a serial and a threaded driver around the same row function: thread start-up
costs more than a decode step's small rows, so the backend picks by size. Softmax is serial
only and meant for small inputs (decode-step scores, where numpy's four passes and their call
overhead dominate): on wide rows numpy's SIMD exp beats numba's scalar one (measured 2-4x).
"""

import math

import numpy as np
from numba import prange

from ._jit import kernel, parallel_kernel


@kernel
def _softmax_row(x, out, r):
    d = x.shape[1]
    peak = x[r, 0]
    for j in range(1, d):
        if x[r, j] > peak:
            peak = x[r, j]
    total = np.float32(0.0)
    for j in range(d):
        e = np.float32(math.exp(x[r, j] - peak))
        out[r, j] = e
        total += e
    for j in range(d):
        out[r, j] /= total


@kernel
def _log_softmax_row(x, out, r):
    d = x.shape[1]
    peak = x[r, 0]
    for j in range(1, d):
        if x[r, j] > peak:
            peak = x[r, j]
    total = np.float32(0.0)
    for j in range(d):
        total += np.float32(math.exp(x[r, j] - peak))
    log_total = np.float32(math.log(total))
    for j in range(d):
        out[r, j] = (x[r, j] - peak) - log_total


@kernel
def _layer_norm_row(x, weight, bias, eps, out, r):
    d = x.shape[1]
    total = np.float32(0.0)
    for j in range(d):
        total += x[r, j]
    mean = total / np.float32(d)
    squares = np.float32(0.0)
    for j in range(d):
        centered = x[r, j] - mean
        squares += centered * centered
    inv_std = np.float32(1.0) / np.float32(math.sqrt(squares / np.float32(d) + eps))
    for j in range(d):
        out[r, j] = (x[r, j] - mean) * inv_std * weight[j] + bias[j]


@kernel
def _rms_norm_row(x, weight, eps, out, r):
    d = x.shape[1]
    squares = np.float32(0.0)
    for j in range(d):
        squares += x[r, j] * x[r, j]
    inv_rms = np.float32(1.0) / np.float32(math.sqrt(squares / np.float32(d) + eps))
    for j in range(d):
        out[r, j] = x[r, j] * inv_rms * weight[j]


@kernel
def softmax_serial(x, out):
    for r in range(x.shape[0]):
        _softmax_row(x, out, r)


@kernel
def log_softmax_serial(x, out):
    for r in range(x.shape[0]):
        _log_softmax_row(x, out, r)


@kernel
def layer_norm_serial(x, weight, bias, eps, out):
    for r in range(x.shape[0]):
        _layer_norm_row(x, weight, bias, eps, out, r)


@parallel_kernel
def layer_norm_parallel(x, weight, bias, eps, out):
    for r in prange(x.shape[0]):
        _layer_norm_row(x, weight, bias, eps, out, r)


@kernel
def rms_norm_serial(x, weight, eps, out):
    for r in range(x.shape[0]):
        _rms_norm_row(x, weight, eps, out, r)


@parallel_kernel
def rms_norm_parallel(x, weight, eps, out):
    for r in prange(x.shape[0]):
        _rms_norm_row(x, weight, eps, out, r)


def _pick(serial, parallel):
    def run(parallel_wanted, *args):
        (parallel if parallel_wanted else serial)(*args)
    return run


layer_norm_rows = _pick(layer_norm_serial, layer_norm_parallel)
rms_norm_rows = _pick(rms_norm_serial, rms_norm_parallel)
