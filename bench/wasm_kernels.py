"""Microbenchmark of the browser's WebAssembly SIMD kernels, run natively under wasmtime
(Cranelift: not V8, so the figures are indicative of the code, not of the page), beside numpy
in the same process. GEMM and attention in GFLOP/s; the memory-bound matvecs in GB/s of weight
bytes read. No thresholds: a table.

    python bench/wasm_kernels.py                 # both builds, best of --repeat (CPU time)
    python bench/wasm_kernels.py --build relaxed --repeat 7
    python bench/wasm_kernels.py --accuracy      # exp/tanh/erf over every f32 of their range
                                                 # (minutes): the README's ulp figures
    python bench/wasm_kernels.py --v8            # the same module under V8 (Node), the
                                                 # browser's engine (bench/wasm_kernels_v8.mjs)
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "pkg"))

BUILDS = {"relaxed": "kernels.wasm", "simd128": "kernels-simd128.wasm"}


# The clock: process CPU time by default. On a machine shared with other work, wall time mostly
# measures the scheduler (this one runs ~7 agents on 2 cores); CPU time counts what the kernel
# itself took (still inflated by a busy sibling hyperthread). --wall switches to wall time.
CLOCK = {"cpu": time.process_time, "wall": time.perf_counter}
clock = CLOCK["cpu"]
CLOCK_NAME = "cpu"
MIN_SECONDS = 0.02  # calls are repeated until one sample takes this long (clock resolution)


def best_time(fn, repeat: int) -> float:
    """Seconds per call: the fastest of `repeat` samples (the least disturbed one)."""
    fn()  # warm: caches, page faults
    best = float("inf")
    for _ in range(repeat):
        calls = 1
        while True:
            start = clock()
            for _ in range(calls):
                fn()
            elapsed = clock() - start
            if elapsed >= MIN_SECONDS:
                break
            calls *= 2
        best = min(best, elapsed / calls)
    return best


def gemm_cases(km, rng):
    """(label, flop, kernel call, numpy call)."""
    cases = []

    def add(label, m, n, k, b_transposed):
        a = rng.standard_normal((m, k)).astype(np.float32)
        if b_transposed:
            bt = rng.standard_normal((n, k)).astype(np.float32)
            b_np, B, b_rs, b_cs = bt.T, km.put(bt), 1, k
        else:
            b = rng.standard_normal((k, n)).astype(np.float32)
            b_np, B, b_rs, b_cs = b, km.put(b), n, 1
        A, C = km.put(a), km.empty((m, n))

        def run():
            km.call("gemm_f32", 1, m, n, k, A, 0, k, 1, B, 0, b_rs, b_cs, C, 0, n, 0.0, km.scratch)

        cases.append((label, 2.0 * m * n * k, run, lambda: a @ b_np))

    add("gemm 1500x384 @ 384x1536", 1500, 1536, 384, False)
    add("gemm 1500x1536 @ 1536x384", 1500, 384, 1536, False)
    add("gemm 1500x384 @ (1536x384)^T", 1500, 1536, 384, True)
    add("gemm 64x576 @ (1536x576)^T", 64, 1536, 576, True)
    return cases


def attention_cases(km, rng):
    from candle_web.backend.numpy_backend import NumpyBackend

    backend = NumpyBackend()
    cases = []
    for label, bh, tq, tk, d in [("attention encoder 6x1500x1500x64", 6, 1500, 1500, 64),
                                 ("attention decode 6x1x448x64", 6, 1, 448, 64),
                                 ("attention decode 9x1x2048x64", 9, 1, 2048, 64)]:
        q = rng.standard_normal((bh, tq, d)).astype(np.float32)
        k = rng.standard_normal((bh, tk, d)).astype(np.float32)
        v = rng.standard_normal((bh, tk, d)).astype(np.float32)
        Q, K, V, O = km.put(q), km.put(k), km.put(v), km.empty((bh, tq, d))

        def run(bh=bh, tq=tq, tk=tk, d=d, Q=Q, K=K, V=V, O=O):
            km.call("attention_f32", bh, tq, tk, d, Q, tq * d, K, tk * d, V, tk * d, 0, 0,
                    0.125, O, tq * d, km.scratch)

        cases.append((label, 4.0 * bh * tq * tk * d, run,
                      lambda q=q, k=k, v=v: backend.attention(q, k, v, None, np.float32(0.125))))
    return cases


def linear_cases(km, rng):
    """(label, weight bytes, flop, kernel call, numpy call: dequantize + matmul)."""
    from candle_web.quantized import GgmlDType, dequantize, quantize

    cases = []
    w_vocab = (rng.standard_normal((51864, 384)) * 0.05).astype(np.float32)
    x1 = rng.standard_normal((1, 384)).astype(np.float32)
    W = km.put(w_vocab.astype(np.float16).view(np.uint16))
    X, Y = km.put(x1), km.empty((1, 51864))
    w16 = w_vocab.astype(np.float16)
    cases.append(("linear_f16 1x384 @ (51864x384)^T", w16.nbytes, 2.0 * w16.size,
                  lambda: km.call("linear_f16", 1, 51864, 384, X, 384, W, Y, 51864, km.scratch),
                  lambda: x1 @ w16.astype(np.float32).T))
    Wf = km.put(w_vocab)
    cases.append(("gemm f32 1x384 @ (51864x384)^T", w_vocab.nbytes, 2.0 * w_vocab.size,
                  lambda: km.call("gemm_f32", 1, 1, 51864, 384, X, 0, 384, 1, Wf, 0, 1, 384, Y, 0,
                                  51864, 0.0, km.scratch),
                  lambda: x1 @ w_vocab.T))
    for name in ("Q4_0", "Q4_1", "Q8_0", "Q5_0", "Q4_K", "Q6_K"):
        dtype = GgmlDType[name]
        # SmolLM2-135M's MLP up/gate projection; the k-quants: Gemma 3 270M's ffn_down
        n, k = (1536, 576) if dtype.block_size == 32 else (640, 2048)
        w = (rng.standard_normal((n, k)) * 0.05).astype(np.float32)
        raw = quantize(dtype, w)
        Wq = km.put(raw)
        for m in (1, 64):
            x = rng.standard_normal((m, k)).astype(np.float32)
            Xq, Yq = km.put(x), km.empty((m, n))

            def run(dtype=dtype, m=m, n=n, k=k, Xq=Xq, Wq=Wq, Yq=Yq):
                km.call("linear_q", int(dtype), m, n, k, Xq, k, Wq, Yq, n, km.scratch)

            cases.append((f"linear_q {name} {m}x{k} @ ({n}x{k})^T", raw.nbytes, 2.0 * m * n * k,
                          run, lambda dtype=dtype, raw=raw, x=x, n=n, k=k:
                          x @ dequantize(dtype, raw, n * k).reshape(n, k).T))
    return cases


def bench(build: str, repeat: int, numpy_too: bool) -> None:
    from tests.kernels.wasm_harness_testlib import KernelModule, KernelsUnavailable

    try:
        km = KernelModule.load(BUILDS[build])
    except KernelsUnavailable as exc:
        print(f"[{build}] skipped: {exc}")
        return
    rng = np.random.default_rng(0)
    print(f"\n[{build}] {km.path.name} under wasmtime, best of {repeat} ({CLOCK_NAME} time); numpy "
          f"{np.__version__} in the same process (OPENBLAS_NUM_THREADS="
          f"{os.environ.get('OPENBLAS_NUM_THREADS', 'unset')})")
    print(f"{'work':44s} {'wasm':>16s} {'numpy':>16s}")
    for label, flop, run, ref in gemm_cases(km, rng) + attention_cases(km, rng):
        t = best_time(run, repeat)
        tn = best_time(ref, repeat) if numpy_too else float("nan")
        print(f"{label:44s} {flop / t / 1e9:9.2f} GFLOP/s {flop / tn / 1e9:9.2f} GFLOP/s"
              f"   ({t * 1e3:.1f} ms)")
    km.reset()
    for label, nbytes, flop, run, ref in linear_cases(km, rng):
        t = best_time(run, repeat)
        tn = best_time(ref, max(1, repeat // 2)) if numpy_too else float("nan")
        print(f"{label:44s} {nbytes / t / 1e9:9.2f} GB/s    {nbytes / tn / 1e9:9.2f} GB/s   "
              f" ({t * 1e3:.2f} ms, {flop / t / 1e9:.1f} GFLOP/s)")
    km.reset()


def accuracy(build: str) -> None:
    """Every f32 in each function's range, against float64 (scipy's erf)."""
    from scipy import special
    from tests.kernels.wasm_harness_testlib import KernelModule

    km = KernelModule.load(BUILDS[build])
    chunk = 1 << 22
    for op, code, truth_fn, hi in [("exp", 3, np.exp, None), ("tanh", 4, np.tanh, 10.0),
                                   ("erf", 6, special.erf, 4.0)]:
        # exp over [-103.97, 88.72] (below: 0 or the smallest subnormal; above: inf)
        ranges = [(-103.97, 88.72)] if op == "exp" else [(-hi, hi)]
        worst, where = 0.0, None
        for lo, top in ranges:
            for sign, limit in ((1.0, top), (-1.0, -lo)):
                last = int(np.float32(limit).view(np.int32))
                for start in range(0, last + 1, chunk):
                    bits = np.arange(start, min(start + chunk, last + 1), dtype=np.int32)
                    x = bits.view(np.float32) * np.float32(sign)
                    km.reset()
                    X, Y = km.put(x), km.empty(x.shape)
                    km.call("unary_f32", code, x.size, X, Y)
                    got = Y.get().astype(np.float64)
                    truth = truth_fn(x.astype(np.float64))
                    spacing = np.spacing(np.abs(truth).astype(np.float32)).astype(np.float64)
                    ulps = np.abs(got - truth) / spacing
                    i = int(np.argmax(ulps))
                    if ulps[i] > worst:
                        worst, where = float(ulps[i]), float(x[i])
        print(f"[{build}] {op}: at most {worst:.3f} ulps (at x = {where!r})", flush=True)


def v8(build: str) -> None:
    """bench/wasm_kernels_v8.mjs under Node (V8); Node 20 needs a flag for relaxed SIMD."""
    import shutil
    import subprocess

    node = shutil.which("node")
    path = REPO / "web" / "vendor" / BUILDS[build]
    if node is None or not path.exists():
        print(f"[{build}] V8 skipped: {'node is not installed' if node is None else f'{path} is not built'}")
        return
    script = str(REPO / "bench" / "wasm_kernels_v8.mjs")
    for flags in (["--experimental-wasm-relaxed-simd"], []):
        done = subprocess.run([node, *flags, script, str(path)], capture_output=True, text=True)
        if done.returncode == 0 or "bad option" not in done.stderr:
            break
    print(f"\n[{build}] " + (done.stdout or done.stderr).rstrip())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", choices=["relaxed", "simd128", "both"], default="both")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--no-numpy", action="store_true", help="skip the numpy column")
    parser.add_argument("--wall", action="store_true", help="wall-clock time instead of CPU time")
    parser.add_argument("--v8", action="store_true", help="run the module under Node (V8) instead")
    parser.add_argument("--accuracy", action="store_true",
                        help="sweep exp/tanh/erf over every f32 instead of timing")
    args = parser.parse_args(argv)
    try:
        import wasmtime  # noqa: F401
    except ImportError:
        if not args.v8:
            print("wasm_kernels: wasmtime is not installed (dev extra); nothing to measure")
            return 0
    global clock, CLOCK_NAME
    CLOCK_NAME = "wall" if args.wall else "cpu"
    clock = CLOCK[CLOCK_NAME]
    builds = list(BUILDS) if args.build == "both" else [args.build]
    for build in builds:
        if args.v8:
            v8(build)
        elif args.accuracy:
            accuracy(build)
        else:
            bench(build, args.repeat, not args.no_numpy)
    return 0


if __name__ == "__main__":
    sys.exit(main())
