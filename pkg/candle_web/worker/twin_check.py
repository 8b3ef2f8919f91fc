"""The twin check: one small candle_web computation, run in the browser worker and natively.

softmax(a @ b) over the last dim, on inputs made from a counter-based integer hash rather than
numpy.random: the worker runs Pyodide's numpy 2.0.2, the native side a newer numpy, and the
hash depends only on uint32 arithmetic, so both sides start from the same bits whatever their
numpy versions (the SHA-256 of the inputs is reported to prove it). The values are multiples
of 2**-24 in [-0.5, 0.5), exact in float32.

In Pyodide candle_web's numpy backend does the matmul with scipy's sgemm (OpenBLAS built for
wasm32); natively it is numpy's matmul (OpenBLAS with SIMD kernels). Both are correct f32
matmuls that sum in different orders, so the products may differ in the last bits; the test
states its tolerance against a float64 reference.

The worker's `eval_twin` command calls `eval_twin`; tests/ui/test_twin.py calls `run_twin`
natively and compares.
"""
from __future__ import annotations

import hashlib
import time

import numpy as np

from candle_web.worker.session import python_value, split_reply

# murmur3's 32-bit finaliser: a bijection on uint32 that mixes every input bit into every
# output bit, so consecutive counters give unrelated values.
COUNTER_STEP = 0x9E3779B1  # 2**32 / golden ratio, odd: counter * step is a bijection too
FMIX_MULTIPLIER_1 = 0x85EBCA6B
FMIX_MULTIPLIER_2 = 0xC2B2AE35
UNIFORM_BITS = 24  # float32 holds 24-bit integers exactly
SEED_STREAM_B = 0x5BD1E995  # keeps the two operands' streams apart
MAX_DIM = 2048  # bounds a request's memory: three f32 matrices of at most 16 MiB each
MAX_REPEAT = 1_000_000  # long enough to cancel, finite if nobody does


def hashed_uniform(seed: int, count: int) -> np.ndarray:
    """`count` float32 values in [-0.5, 0.5), a pure function of (seed, index)."""
    counter = np.arange(count, dtype=np.uint32)
    x = counter * np.uint32(COUNTER_STEP) + np.uint32(seed & 0xFFFFFFFF)  # wraps mod 2**32
    x ^= x >> np.uint32(16)
    x *= np.uint32(FMIX_MULTIPLIER_1)
    x ^= x >> np.uint32(13)
    x *= np.uint32(FMIX_MULTIPLIER_2)
    x ^= x >> np.uint32(16)
    top_bits = (x >> np.uint32(32 - UNIFORM_BITS)).astype(np.float32)
    return top_bits * np.float32(2.0 ** -UNIFORM_BITS) - np.float32(0.5)


def _checked_count(name: str, value, limit: int) -> int:
    from candle_web.core.errors import ShapeError

    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value) \
            or not 1 <= int(value) <= limit:
        raise ShapeError(f"eval_twin: {name} must be an integer in 1..{limit}, got {value!r}")
    return int(value)


def twin_inputs(seed: int, m: int, k: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    a = hashed_uniform(seed, m * k).reshape(m, k)
    b = hashed_uniform(seed ^ SEED_STREAM_B, k * n).reshape(k, n)
    return a, b


def inputs_digest(a: np.ndarray, b: np.ndarray) -> str:
    digest = hashlib.sha256()
    digest.update(np.ascontiguousarray(a, dtype="<f4").tobytes())
    digest.update(np.ascontiguousarray(b, dtype="<f4").tobytes())
    return digest.hexdigest()


def twin_compute(a: np.ndarray, b: np.ndarray, backend: str | None = None) -> np.ndarray:
    """softmax(a @ b) along the last dim with candle_web: [m, k] x [k, n] -> [m, n] f32.

    backend: None for the CPU device's default backend (numpy in the browser; numba natively
    when candle_native is installed), or a name such as "numpy" to pin one."""
    from candle_web import Device, Tensor
    from candle_web.nn.ops import softmax_last_dim

    device = Device.cpu(backend)
    a_tensor = Tensor.from_numpy(a, device=device)  # [m, k]
    b_tensor = Tensor.from_numpy(b, device=device)  # [k, n]
    logits = a_tensor.matmul(b_tensor)  # [m, n]
    probabilities = softmax_last_dim(logits)  # [m, n], rows sum to 1
    return np.ascontiguousarray(probabilities.to_numpy(), dtype=np.float32)


def run_twin(seed: int = 0, m: int = 64, k: int = 128, n: int = 128, repeat: int = 1,
             on_progress=None, backend: str | None = None) -> dict:
    """The worker's `eval_twin`: the result of the last of `repeat` runs and their timings.

    `repeat` > 1 is for timing and for exercising cancellation: each round returns to the
    interpreter loop, where Pyodide checks the interrupt buffer.
    """
    m = _checked_count("m", m, MAX_DIM)
    k = _checked_count("k", k, MAX_DIM)
    n = _checked_count("n", n, MAX_DIM)
    repeat = _checked_count("repeat", repeat, MAX_REPEAT)
    a, b = twin_inputs(int(seed), m, k, n)
    timings_ms = []
    result = None
    for round_index in range(repeat):
        start = time.perf_counter()
        result = twin_compute(a, b, backend)
        timings_ms.append((time.perf_counter() - start) * 1000.0)
        if on_progress is not None:
            on_progress(round_index + 1, repeat)
    return {
        "inputs_sha256": inputs_digest(a, b),
        "output": result,
        "shape": [m, n],
        "dtype": "f32",
        "timings_ms": timings_ms,
    }


def eval_twin(request=None, on_progress=None) -> tuple:
    """The worker's `eval_twin`: run_twin with the fields the page set (run_twin owns the
    defaults), as (result JSON, {"output": f32 array}) for the worker to transfer."""
    result = run_twin(**(python_value(request) or {}), on_progress=on_progress)
    return split_reply({"dtype": result["dtype"], "shape": result["shape"],
                        "inputsSha256": result["inputs_sha256"],
                        "timingsMs": result["timings_ms"], "output": result["output"]})
