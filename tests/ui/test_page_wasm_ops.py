"""The wasm kernels in the page: the backend the worker picks, and the op suite run through the
wasm backend against the numpy reference in the same page.

Which backend (each on a fresh page, i.e. a fresh worker start):
- by default the page runs "wasm" on the best kernel build this Chromium validates (relaxed
  SIMD) without loading scipy, and the footer says "backend: wasm (relaxed SIMD, 2 threads)";
- `?backend=wasm-simd128` runs the plain-SIMD build (what browsers without relaxed SIMD get);
- `?backend=numpy` runs the numpy reference (with scipy's BLAS) and says it was asked for;
- when kernels.wasm answers 404 the page still starts, on numpy, and the footer says why;
  `?backend=wasm` then refuses to start with an error naming the missing kernels;
- an unknown `?backend=` is refused, naming the field.

The op suite, on each of the two builds: inputs are made here (numpy, seeded), sent to the
page's worker, and each op runs there twice, through the page's wasm backend (on a host that
records the kernels it calls, so a silent fall-through to numpy cannot pass) and through the
numpy backend; both results come back and are compared here within the bounds
tests/tolerances_testlib.py derives for two f32
evaluations of the same op (any summation order, FMA or not): dot products for matmul and the
f16 / GGML linears, the softmax, norm and attention bounds from their lengths and weights, and
the ulps of the activations. The shapes include the real models' (whisper-tiny's 384/1536
widths and 1500-frame attention, SmolLM2's 576-wide RMS norm, a decode step's one row).
Python in the worker is reached through Playwright's Worker.evaluate: the worker's own
`pyodide`, after its own start-up, so what is tested is what the views use.
"""
from __future__ import annotations

import base64
import json
import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pytest

from candle_web.backend.wasm import abi as wasm_abi
from candle_web.quantized import GgmlDType, QTensor

from tests.wasm_testlib import (QUANT_EXTRA_ROUNDINGS, f32, quant_term_magnitudes, random_qweight,
                                rope_bound)
from tests.tolerances_testlib import (assert_within, attention_bound, dot_bound, layer_norm_bound,
                                      log_softmax_bound, rms_norm_bound, silu_mul_bound,
                                      softmax_bound, unary_bound)

pytestmark = pytest.mark.ui

SEED = 20251202

# -- which backend -------------------------------------------------------------------------------


def footer_backend(page) -> str:
    return page.locator("#runtime-backend").inner_text()


def missing_kernels() -> dict:
    """Routes under which both kernel builds answer 404 (as on a server that never built them)."""
    return {"**/vendor/kernels*.wasm": lambda route: route.fulfill(status=404, body="not built")}


def start_result(page) -> dict:
    """The worker's init reply, or {failed, name, message} when the start was refused."""
    page.wait_for_function("() => window.candleWeb !== undefined")
    return page.evaluate("""() => window.candleWeb.ready.then(
        (r) => r, (e) => ({failed: true, name: e.name, message: e.message}))""")


def test_the_page_runs_wasm_by_default_and_says_so(ready_page, ready_summary):
    backend = ready_summary["backend"]
    assert backend["name"] == "wasm", f"the page fell back: {backend['reason']}"
    assert backend["requested"] == "auto"
    # Headless Chromium 156 validates relaxed SIMD, so the relaxed build is the one chosen.
    assert backend["variant"] == "relaxed-simd" and backend["kernels"]["file"] == "kernels.wasm"
    assert backend["reason"] is None
    threads = ", 2 threads" if backend["threads"] == 2 else ""  # two: the default on two cores
    assert footer_backend(ready_page) == f"backend: wasm (relaxed SIMD{threads})"
    # scipy is only for the numpy backend's BLAS: not loaded when the kernels run.
    assert ready_summary["versions"]["scipy"] is None
    assert "scipy" not in ready_page.locator("footer").inner_text()
    assert set(ready_summary["phases"]) == {"runtime", "kernels", "wheel", "packages", "backend"} | (
        {"threads"} if backend["threads"] == 2 else set())
    assert worker_python(ready_page, "from candle_web import Device\n"
                                     "from candle_web.backend import backend_for\n"
                                     "result = backend_for(Device.cpu()).name") == "wasm"
    # Served as application/wasm, which streaming compilation requires.
    assert ready_page.evaluate("""async () => (await fetch('vendor/kernels.wasm', {method: 'HEAD'}))
        .headers.get('Content-Type')""") == "application/wasm"


def test_backend_wasm_simd128_in_the_url_runs_the_plain_simd_build(ready_page_at):
    page = ready_page_at(BUILDS["simd128"])
    backend = page.ready_summary["backend"]
    assert backend["name"] == "wasm" and backend["requested"] == "wasm-simd128"
    assert backend["kernels"]["file"] == "kernels-simd128.wasm"
    assert footer_backend(page) == "backend: wasm (SIMD128)"


def test_backend_numpy_in_the_url_runs_the_reference(open_ui_page, page_ready):
    page = open_ui_page("/?backend=numpy")
    summary = page_ready(page)
    assert summary["backend"]["name"] == "numpy"
    assert summary["backend"]["requested"] == "numpy"
    assert "kernels" not in summary["phases"]  # not even fetched
    assert summary["versions"]["scipy"] == "1.14.1"
    assert footer_backend(page) == "backend: numpy (?backend=numpy asked for the numpy reference)"
    assert twin_shape(page) == [8, 8]
    assert worker_python(page, "from candle_web import Device\n"
                               "from candle_web.backend import backend_for\n"
                               "result = backend_for(Device.cpu()).name") == "numpy"
    assert page.page_log.errors == []


def test_missing_kernels_leave_the_page_on_numpy_saying_why(open_ui_page, page_ready):
    page = open_ui_page("/", routes=missing_kernels())
    summary = page_ready(page)
    backend = summary["backend"]
    assert backend["name"] == "numpy" and backend["requested"] == "auto"
    assert backend["reason"] == "kernels.wasm answered 404 Not Found"
    assert summary["versions"]["scipy"] == "1.14.1"  # the numpy backend's BLAS came instead
    assert footer_backend(page) == "backend: numpy (kernels.wasm answered 404 Not Found)"
    assert twin_shape(page) == [8, 8]  # and the page computes
    assert any("kernels.wasm answered 404" in line for line in page.page_log.console)
    assert page.page_log.errors == []


def test_backend_wasm_in_the_url_refuses_to_start_without_kernels(open_ui_page):
    page = open_ui_page("/?backend=wasm", routes=missing_kernels())
    outcome = start_result(page)
    assert outcome.get("failed"), outcome
    assert outcome["name"] == "KernelsUnavailable"
    assert "kernels.wasm answered 404" in outcome["message"]
    assert "?backend=wasm" in outcome["message"]
    page.wait_for_function(
        "() => document.getElementById('runtime-status').dataset.state === 'error'")
    assert "kernels.wasm answered 404" in page.locator("#runtime-text").inner_text()


def test_an_unknown_backend_in_the_url_is_refused_naming_the_field(open_ui_page):
    page = open_ui_page("/?backend=cuda")
    outcome = start_result(page)
    assert outcome.get("failed") and outcome["name"] == "FormatError", outcome
    assert "`backend`" in outcome["message"] and '"cuda"' in outcome["message"]


def twin_shape(page) -> list:
    return page.evaluate("""async () => (await window.candleWeb.client.request(
        'eval_twin', {seed: 3, m: 8, k: 16, n: 8})).shape""")


# -- Python in the page's worker ------------------------------------------------------------------

def page_worker(page):
    workers = [w for w in page.workers if w.url.endswith("/worker.js")]
    assert len(workers) == 1, [w.url for w in page.workers]
    return workers[0]


def worker_python(page, code: str, argument: str = ""):
    """Runs `code` in a fresh namespace of the worker's Python (with `argument`, a string, as
    ARGUMENT) and returns its variable `result` (a str, number or bool)."""
    return page_worker(page).evaluate("""([code, argument]) => {
        const namespace = pyodide.toPy({ARGUMENT: argument});
        try {
            pyodide.runPython(code, {globals: namespace});
            return namespace.get('result');
        } finally {
            namespace.destroy();
        }
    }""", [code, argument])


# What runs in the page: every case through the wasm backend on a recording host and through
# the numpy backend. Arrays travel as base64 of their bytes; operands are a Python expression
# over them, evaluated the same way here (for the bounds) and there (for the calls).
PAGE_PROGRAM = """
import base64, json
import numpy as np
from candle_web.backend import get_backend
from candle_web.backend.wasm.backend import WasmBackend
from candle_web.quantized import GgmlDType, QTensor


class RecordingHost:
    def __init__(self, host):
        self.host, self.kind, self.names = host, "recording", []

    def call(self, name, *args):
        self.names.append(name)
        return self.host.call(name, *args)

    def kernel(self, name):
        run = self.host.kernel(name)

        def recorded(*args):
            self.names.append(name)
            return run(*args)

        return recorded


def decode(spec):
    data = np.frombuffer(base64.b64decode(spec["data"]), dtype=spec["dtype"])
    return data.reshape(spec["shape"]).copy()  # writable and aligned, like the views' arrays


def encode(array):
    array = np.ascontiguousarray(array)
    return {"dtype": array.dtype.str, "shape": list(array.shape),
            "data": base64.b64encode(array.tobytes()).decode("ascii")}


host = RecordingHost(get_backend("wasm").host)
backends = {"wasm": WasmBackend(host), "numpy": get_backend("numpy")}
replies = []
for case in json.loads(ARGUMENT):
    arrays = {name: decode(spec) for name, spec in case["arrays"].items()}
    operands = eval(case["operands"], {"np": np, "QTensor": QTensor, "GgmlDType": GgmlDType},
                    arrays)
    reply = {}
    for name, backend in backends.items():
        host.names.clear()
        with np.errstate(all="ignore"):  # NaN and inf inputs are part of the suite
            reply[name] = encode(getattr(backend, case["op"])(*operands))
        if name == "wasm":
            reply["kernels"] = list(host.names)
    replies.append(reply)
result = json.dumps(replies)
"""


# -- the cases ------------------------------------------------------------------------------------

@dataclass
class Case:
    name: str
    op: str  # the Backend method
    arrays: dict  # name -> np.ndarray, sent to the page
    operands: str  # the method's arguments, a Python expression over `arrays`
    kernel: str  # the kernel the wasm backend must call for it
    bound: Callable  # (operands, want) -> allowed |wasm - numpy| per element


def evaluate_operands(case: Case):
    return eval(case.operands, {"np": np, "QTensor": QTensor, "GgmlDType": GgmlDType},
                dict(case.arrays))


def encode(array: np.ndarray) -> dict:
    array = np.ascontiguousarray(array)
    return {"dtype": array.dtype.str, "shape": list(array.shape),
            "data": base64.b64encode(array.tobytes()).decode("ascii")}


def decode(spec: dict) -> np.ndarray:
    return np.frombuffer(base64.b64decode(spec["data"]), dtype=spec["dtype"]).reshape(
        spec["shape"])


def matmul_cases(rng):
    dot = lambda ops, want: dot_bound(ops[0], ops[1])  # noqa: E731
    yield Case("whisper MLP in: 300x384 @ (1536x384)^T", "matmul",
               {"x": f32(rng, 300, 384), "w": f32(rng, 1536, 384, scale=0.05)},
               "(x, w.T)", "gemm_f32", dot)
    yield Case("whisper MLP out: 300x1536 @ (384x1536)^T", "matmul",
               {"x": f32(rng, 300, 1536), "w": f32(rng, 384, 1536, scale=0.05)},
               "(x, w.T)", "gemm_f32", dot)
    yield Case("decode row: 1x384 @ (2000x384)^T", "matmul",
               {"x": f32(rng, 1, 384), "w": f32(rng, 2000, 384, scale=0.05)},
               "(x, w.T)", "gemm_f32", dot)
    yield Case("both transposed", "matmul", {"a": f32(rng, 19, 6), "b": f32(rng, 37, 19)},
               "(a.T, b.T)", "gemm_f32", dot)
    yield Case("strided rows and columns", "matmul",
               {"a": f32(rng, 5, 40), "b": f32(rng, 60, 9)}, "(a[:, ::2], b[::3])",
               "gemm_f32", dot)
    yield Case("K not a multiple of 4", "matmul", {"a": f32(rng, 3, 7), "b": f32(rng, 7, 5)},
               "(a, b)", "gemm_f32", dot)
    yield Case("batched heads: q @ k^T", "matmul",
               {"q": f32(rng, 6, 50, 64), "k": f32(rng, 6, 70, 64)},
               "(q, np.swapaxes(k, -1, -2))", "gemm_f32", dot)
    yield Case("batch broadcast", "matmul", {"a": f32(rng, 1, 1, 4, 9), "b": f32(rng, 2, 3, 9, 5)},
               "(a, b)", "gemm_f32", dot)
    yield Case("heads as a transposed view", "matmul",
               {"a": f32(rng, 2, 4, 3, 8), "b": f32(rng, 2, 3, 8, 4)},
               "(a.transpose(0, 2, 1, 3), b)", "gemm_f32", dot)


def linear_cases(rng):
    weight = QTensor.from_float(f32(rng, 1000, 384, scale=0.05), GgmlDType.F16)
    yield Case("linear f16: 3x384 @ (1000x384 f16)^T", "qmatmul",
               {"x": f32(rng, 3, 384), "blocks": weight.data},
               "(x, QTensor(GgmlDType.F16, (1000, 384), blocks))", "linear_f16",
               lambda ops, want: dot_bound(ops[0], np.abs(ops[1].dequantize()).T))
    for type_id in wasm_abi.LINEAR_Q_TYPES:
        kind = GgmlDType(type_id)
        k = kind.block_size * (3 if kind.block_size == 256 else 7)  # odd block counts
        weight = random_qweight(kind, 48, k, rng)
        for m in (1, 5):
            yield Case(f"linear {kind.name}: {m}x{k} @ (48x{k})^T", "qmatmul",
                       {"x": f32(rng, m, k), "blocks": weight.data},
                       f"(x, QTensor(GgmlDType.{kind.name}, (48, {k}), blocks))", "linear_q",
                       lambda ops, want: dot_bound(
                           ops[0], quant_term_magnitudes(ops[1]).T,
                           extra_roundings=QUANT_EXTRA_ROUNDINGS))


def row_cases(rng):
    x = f32(rng, 6, 1500, scale=4)
    x[0, ::3] = -np.inf  # masked entries get weight 0
    x[1] = -np.inf  # an all-masked row: NaN, as numpy gives
    yield Case("softmax 6x1500 with masked entries", "softmax_last_dim", {"x": x}, "(x,)",
               "softmax_rows", lambda ops, want: softmax_bound(ops[0]))
    yield Case("log_softmax 6x1500 with masked entries", "log_softmax_last_dim", {"x": x[[0, 2]]},
               "(x,)", "log_softmax_rows", lambda ops, want: log_softmax_bound(ops[0], want))
    yield Case("layer norm 300x384 (weight, bias)", "layer_norm",
               {"x": f32(rng, 300, 384, scale=3) + 1, "w": f32(rng, 384), "b": f32(rng, 384)},
               "(x, w, b, 1e-5)", "layer_norm_rows",
               lambda ops, want: layer_norm_bound(*ops, want))
    yield Case("layer norm without affine", "layer_norm", {"x": f32(rng, 7, 33, scale=3)},
               "(x, None, None, 1e-5)", "layer_norm_rows",
               lambda ops, want: layer_norm_bound(*ops, want))
    yield Case("RMS norm 64x576 (SmolLM2)", "rms_norm",
               {"x": f32(rng, 64, 576), "w": f32(rng, 576)}, "(x, w, 1e-5)", "rms_norm_rows",
               lambda ops, want: rms_norm_bound(ops[0], ops[2], want))
    angles = rng.uniform(-np.pi, np.pi, (20, 32))
    trig = {"cos": np.cos(angles).astype(np.float32), "sin": np.sin(angles).astype(np.float32)}
    for op, interleaved in (("rope", False), ("rope_i", True)):
        yield Case(f"{op} 9 heads x 20 x 64", op, {"x": f32(rng, 1, 9, 20, 64), **trig},
                   "(x, cos, sin)", "rope_f32",
                   lambda ops, want, i=interleaved: rope_bound(*ops, i))
    yield Case("silu_mul 3x1536", "silu_mul", {"g": f32(rng, 3, 1536, scale=3),
                                                "u": f32(rng, 3, 1536)},
               "(g, u)", "silu_mul", lambda ops, want: silu_mul_bound(want))
    for op in sorted(wasm_abi.UNARY_OPS):
        x = f32(rng, 5, 301, scale=3)
        x[0, :4] = [np.nan, np.inf, -np.inf, 0.0]
        yield Case(f"unary {op}", "unary", {"x": x}, f"({op!r}, x)", "unary_f32",
                   lambda ops, want: unary_bound(ops[0], ops[1], want))


def attention_cases(rng):
    d = 64
    scale = 1 / math.sqrt(d)
    attend = lambda ops, want: attention_bound(*ops)  # noqa: E731
    yield Case("encoder: 6 heads, 100 of 1500 queries x 1500 keys", "attention",
               {"q": f32(rng, 1, 6, 100, d), "k": f32(rng, 1, 6, 1500, d),
                "v": f32(rng, 1, 6, 1500, d)},
               f"(q, k, v, None, {scale})", "attention_f32", attend)
    capacity, tq, tk = 448, 4, 37
    rows = np.arange(tq)[:, None] + tk - tq
    causal = np.where(np.arange(tk)[None, :] > rows, -np.inf, 0.0).astype(np.float32)
    yield Case("decoder on a KV cache (capacity stride) with a causal mask", "attention",
               {"q": f32(rng, 1, 6, tq, d), "keys": f32(rng, 1, 6, capacity, d),
                "values": f32(rng, 1, 6, capacity, d), "mask": causal},
               f"(q, keys[:, :, :{tk}], values[:, :, :{tk}], mask, {scale})", "attention_f32",
               attend)
    pad = np.zeros((2, 1, 1, 30), np.float32)
    pad[1, ..., 20:] = -np.inf
    yield Case("padding mask per batch, one KV head for all query heads", "attention",
               {"q": f32(rng, 2, 9, 3, d), "k": f32(rng, 2, 1, 30, d),
                "v": f32(rng, 2, 1, 30, d), "pad": pad},
               "(q, k, v, pad, 0.3)", "attention_f32", attend)


def all_cases() -> list[Case]:
    rng = np.random.default_rng(SEED)
    return [*matmul_cases(rng), *linear_cases(rng), *row_cases(rng), *attention_cases(rng)]


# The op suite runs on both kernel builds: the relaxed-SIMD one the page picks here, and the
# plain-SIMD one (what browsers without relaxed SIMD get), forced with ?backend=wasm-simd128.
BUILDS = {"relaxed-simd": None, "simd128": "/?backend=wasm-simd128"}


@pytest.fixture(scope="module", params=list(BUILDS))
def page_results(request, ready_page, ready_page_at):
    build = request.param
    page = ready_page if BUILDS[build] is None else ready_page_at(BUILDS[build])
    backend = page.ready_summary["backend"]
    if backend["name"] != "wasm" or backend["variant"] != build:
        pytest.fail(f"the page did not start the {build} wasm kernels: {backend}", pytrace=False)
    cases = all_cases()
    request_json = json.dumps([{"op": c.op, "operands": c.operands,
                                "arrays": {name: encode(a) for name, a in c.arrays.items()}}
                               for c in cases])
    replies = json.loads(worker_python(page, PAGE_PROGRAM, request_json))
    return build, dict(zip((c.name for c in cases), zip(cases, replies)))


CASE_NAMES = [c.name for c in all_cases()]


@pytest.mark.parametrize("name", CASE_NAMES)
def test_wasm_backend_in_the_page_matches_numpy_in_the_page(page_results, report, name):
    build, results = page_results
    case, reply = results[name]
    got, want = decode(reply["wasm"]), decode(reply["numpy"])
    assert case.kernel in reply["kernels"], \
        f"{name}: the wasm backend called {reply['kernels']}, not {case.kernel}"
    assert got.dtype == np.float32
    bound = case.bound(evaluate_operands(case), want)
    ratio = assert_within(got, want, bound, name)
    finite = np.isfinite(want)
    worst = float(np.abs(got[finite].astype(np.float64) - want[finite]).max()) \
        if finite.any() else 0.0
    report(f"\n[ui] wasm ({build}) vs numpy in the page, {name}: max |diff| {worst:.3g}, "
           f"{ratio:.3f} of the bound")
