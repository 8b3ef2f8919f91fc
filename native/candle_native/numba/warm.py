"""Compile (or load from the cache) every numba kernel once, timing each: for `make demo`.

    python -m candle_native.numba.warm

A second run, or any later process, loads the cached machine code instead of compiling.
"""

from __future__ import annotations

import time

import numpy as np


def warm_numba_kernels(verbose: bool = True) -> float:
    """Run each kernel of the numba backend on tiny inputs; returns the seconds spent."""
    from candle_web.backend import get_backend
    from candle_web.quantized import QTensor

    from ..quant_unpack import unpack
    from .backend import PARALLEL_MIN_ELEMENTS, QMATMUL_BLAS_MIN_ROWS

    backend = get_backend("numba")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 256)).astype(np.float32)
    with_offsets = QTensor.from_float(rng.standard_normal((8, 256)).astype(np.float32), "q4_1")
    sixteen_wide = QTensor.from_float(rng.standard_normal((8, 256)).astype(np.float32), "q6_k")
    rows = rng.standard_normal((2, 64)).astype(np.float32)
    big = rng.standard_normal((PARALLEL_MIN_ELEMENTS // 64, 64)).astype(np.float32)
    ones = np.ones(64, np.float32)
    q = rng.standard_normal((1, 2, 1, 16)).astype(np.float32)
    kv = rng.standard_normal((1, 2, 5, 16)).astype(np.float32)
    angles = np.ones((1, 8), np.float32)
    steps = {
        "qmatmul (32-wide groups)": lambda: backend.qmatmul(x, with_offsets),
        "qmatmul (16-wide groups)": lambda: backend.qmatmul(x, sixteen_wide),
        "qmatmul (dequantize + BLAS)": lambda: backend.qmatmul(
            np.repeat(x, QMATMUL_BLAS_MIN_ROWS, 0), with_offsets),
        "softmax / log_softmax": lambda: (backend.softmax_last_dim(rows),
                                          backend.log_softmax_last_dim(rows)),
        "layer_norm": lambda: (backend.layer_norm(rows, ones, ones, 1e-5),
                               backend.layer_norm(big, ones, ones, 1e-5)),
        "rms_norm": lambda: (backend.rms_norm(rows, ones, 1e-5), backend.rms_norm(big, ones, 1e-5)),
        "rope / rope_i": lambda: (backend.rope(q, angles, angles), backend.rope_i(q, angles, angles)),
        "silu / silu_mul / gelu_erf": lambda: [
            (backend.unary("silu", a), backend.silu_mul(a, a), backend.unary("gelu_erf", a))
            for a in (rows, big)],
        "attention": lambda: backend.attention(q, kv, kv, None, 0.25),
        "unpack levels (Q4_K, Q5_0, Q6_K)": lambda: [
            unpack(QTensor.from_float(rng.standard_normal((2, 256)).astype(np.float32), kind))
            for kind in ("q4_k", "q5_0", "q6_k")],
    }
    total = 0.0
    for name, step in steps.items():
        start = time.perf_counter()
        step()
        spent = time.perf_counter() - start
        total += spent
        if verbose:
            print(f"{name:30s} {spent:6.2f} s")
    return total


def main():
    from .. import numba_cache_dir

    print(f"numba cache: {numba_cache_dir()}")
    print(f"total {warm_numba_kernels():.2f} s")


if __name__ == "__main__":
    main()
