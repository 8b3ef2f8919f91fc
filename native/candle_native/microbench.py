"""Micro-benchmarks of the native kernels against the numpy reference (and cuBLAS on a GPU).

    python -m candle_native.microbench          # CPU: numba vs numpy
    python -m candle_native.microbench --gpu    # also cupy vs cuBLAS on dequantized weights

Prints medians in milliseconds; the numbers are for reports, never asserted by tests.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from candle_web.quantized import GgmlDType, QTensor

MATVEC_SHAPES = [(1536, 576), (4096, 4096)]  # (n, k): SmolLM2's MLP up-projection, a 7B layer
MATVEC_TYPES = ["Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q6_K"]


def median_ms(fn, repeats=25, sync=None):
    fn()  # warm: compile, unpack, upload
    if sync:
        sync()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        if sync:
            sync()
        samples.append((time.perf_counter() - start) * 1e3)
    return statistics.median(samples)


def row(label, ms_by_impl):
    base = next(iter(ms_by_impl.values()))
    cells = "  ".join(f"{name} {ms:8.3f} ms ({base / ms:5.1f}x)" for name, ms in ms_by_impl.items())
    print(f"{label:28s} {cells}")


def cpu_bench():
    from candle_web.backend import get_backend

    ref, fast = get_backend("numpy"), get_backend("numba")
    rng = np.random.default_rng(0)
    print("== CPU: numba vs numpy (ratio = first column / this column)")
    for n, k in MATVEC_SHAPES:
        for kind in MATVEC_TYPES:
            if k % GgmlDType.parse(kind).block_size:
                continue
            weight = QTensor.from_float(rng.standard_normal((n, k)).astype(np.float32), kind)
            dense = weight.dequantize()
            x = rng.standard_normal((1, k)).astype(np.float32)
            row(f"{kind} matvec {n}x{k}", {
                "numpy deq+matmul": median_ms(lambda: ref.qmatmul(x, weight), repeats=5),
                "f32 BLAS (pre-deq)": median_ms(lambda: x @ dense.T),
                "numba": median_ms(lambda: fast.qmatmul(x, weight)),
            })
    x = rng.standard_normal((9, 1, 49152 // 9)).astype(np.float32)
    row("softmax 49152 (vocab row)", {
        "numpy": median_ms(lambda: ref.softmax_last_dim(x.reshape(1, -1))),
        "numba": median_ms(lambda: fast.softmax_last_dim(x.reshape(1, -1)))})
    h = rng.standard_normal((1, 1, 576)).astype(np.float32)
    w = rng.standard_normal(576).astype(np.float32)
    row("rms_norm 1x576 (decode)", {"numpy": median_ms(lambda: ref.rms_norm(h, w, 1e-5)),
                                    "numba": median_ms(lambda: fast.rms_norm(h, w, 1e-5))})
    hb = rng.standard_normal((1500, 384)).astype(np.float32)
    wb = rng.standard_normal(384).astype(np.float32)
    row("layer_norm 1500x384", {"numpy": median_ms(lambda: ref.layer_norm(hb, wb, wb, 1e-5)),
                                "numba": median_ms(lambda: fast.layer_norm(hb, wb, wb, 1e-5))})
    for tk in (64, 448):
        q = rng.standard_normal((1, 9, 1, 64)).astype(np.float32)
        kv = rng.standard_normal((1, 9, tk, 64)).astype(np.float32)
        row(f"attention decode 9h tk={tk}", {
            "numpy": median_ms(lambda: ref.attention(q, kv, kv, None, 0.125)),
            "numba": median_ms(lambda: fast.attention(q, kv, kv, None, 0.125))})


def gpu_bench():
    import cupy as cp

    from candle_web.backend import get_backend

    gpu = get_backend("cupy")
    sync = cp.cuda.Device(0).synchronize
    rng = np.random.default_rng(0)
    print("== GPU: cupy kernels vs cuBLAS on the dequantized f32 weight")
    for n, k in MATVEC_SHAPES + [(14336, 4096)]:
        for kind in ["Q8_0", "Q4_0", "Q4_K", "Q6_K"]:
            if k % GgmlDType.parse(kind).block_size:
                continue
            weight = QTensor.from_float(rng.standard_normal((n, k)).astype(np.float32), kind)
            dense = cp.asarray(weight.dequantize())
            for m in (1, 64):
                x = cp.asarray(rng.standard_normal((m, k)).astype(np.float32))
                row(f"{kind} m={m} {n}x{k}", {
                    "cuBLAS f32": median_ms(lambda: x @ dense.T, sync=sync),
                    "cupy qmatmul": median_ms(lambda: gpu.qmatmul(x, weight), sync=sync)})
    x = cp.asarray(rng.standard_normal((64, 49152)).astype(np.float32))
    row("softmax 64x49152", {
        "cupy composed": median_ms(lambda: gpu._softmax_composed(x, log=False), sync=sync),
        "RawKernel": median_ms(lambda: gpu.softmax_last_dim(x), sync=sync)})
    q = cp.asarray(rng.standard_normal((1, 32, 1, 128)).astype(np.float32))
    kv = cp.asarray(rng.standard_normal((1, 32, 2048, 128)).astype(np.float32))
    row("attention decode 32h tk=2048", {
        "cuBLAS composed": median_ms(lambda: cp.matmul(gpu.softmax_last_dim(
            cp.matmul(q, kv.transpose(0, 1, 3, 2)) * np.float32(0.088)), kv), sync=sync),
        "RawKernel": median_ms(lambda: gpu.attention(q, kv, kv, None, 0.088), sync=sync)})


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", action="store_true", help="also benchmark the cupy backend")
    parser.add_argument("--gpu-only", action="store_true", help="only the cupy backend")
    args = parser.parse_args(argv)
    if not args.gpu_only:
        cpu_bench()
    if args.gpu or args.gpu_only:
        gpu_bench()


if __name__ == "__main__":
    main()
