"""The twin check: the same candle_web computation in the browser worker and natively.

softmax(a @ b) with a [64, 128], b [128, 128] from candle_web.worker.twin_check (the very
module the worker imports). The inputs must be bit-identical (same SHA-256). The outputs need
not be: in the page candle_web's matmul is the wasm kernels' gemm_f32 (SIMD lanes, FMA with
relaxed SIMD; scipy's sgemm on the numpy backend), natively it is numpy's matmul (OpenBLAS
with AVX kernels) or numba's; all are correct f32 matmuls that add the 128 products in
different orders, so most outputs differ in the last bits.

Tolerance. A k-term f32 dot product is off by about sqrt(k) * 2**-24 * sum|a_i b_i| (here
sum|a_i b_i| ~ 8, so ~5e-6 at worst, ~1.5e-6 measured natively against float64), and softmax
turns a logit error d into a probability error of at most 2 * p * max|d| with p <= 0.25 here:
a few 1e-7. So we require each side within TWIN_ATOL = 1e-6 of a float64 reference (the
ground truth) and browser vs native within TWIN_ATOL; the measured numbers are printed
(about 1e-7 vs float64). A wrong kernel, transposed operand or f16 rounding is off by >1e-5.
(k = 256 would double the logit error and leave too little margin under 1e-6.)
"""
from __future__ import annotations

import base64

import numpy as np
import pytest

TWIN_SEED = 20250101
TWIN_SHAPE = {"m": 64, "k": 128, "n": 128}
TWIN_ATOL = 1e-6
CANCEL_REPEAT = 1_000_000  # ~minutes of work if the cancel does not land
CANCEL_WAIT_MS = 60_000

pytestmark = pytest.mark.ui


def load_twin_module():
    from candle_web.worker import twin_check

    return twin_check


def eval_twin_in_browser(page, **fields) -> dict:
    """Run eval_twin in the worker; the transferred f32 bytes come back base64-encoded."""
    return page.evaluate("""async (fields) => {
        const reply = await window.candleWeb.client.request('eval_twin', fields);
        const bytes = new Uint8Array(reply.output);
        let binary = '';
        for (let i = 0; i < bytes.length; i += 0x8000) {
            binary += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
        }
        return {...reply, output: btoa(binary),
                outputIsArrayBuffer: reply.output instanceof ArrayBuffer};
    }""", fields)


def float64_reference(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    logits = a.astype(np.float64) @ b.astype(np.float64)
    shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return shifted / shifted.sum(axis=-1, keepdims=True)


def ulp_distance(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Distance in float32 units in the last place (both arrays positive here)."""
    return np.abs(x.view(np.int32).astype(np.int64) - y.view(np.int32).astype(np.int64))


@pytest.fixture(scope="module")
def browser_twin(ready_page) -> dict:
    """The browser's eval_twin reply for TWIN_SEED / TWIN_SHAPE (computed once)."""
    return eval_twin_in_browser(ready_page, seed=TWIN_SEED, **TWIN_SHAPE)


# "numpy" is the reference backend natively (numpy matmul vs the browser's sgemm); None is the
# CPU default, i.e. the native twin's own kernels (numba) when candle_native is installed.
@pytest.mark.parametrize("native_backend", ["numpy", None], ids=["numpy", "default"])
def test_twin_matches_native(browser_twin, report, native_backend):
    twin = load_twin_module()
    native = twin.run_twin(seed=TWIN_SEED, backend=native_backend, **TWIN_SHAPE)
    reply = browser_twin

    assert reply["type"] == "result"
    assert reply["outputIsArrayBuffer"] is True
    assert reply["dtype"] == "f32"
    assert reply["shape"] == [TWIN_SHAPE["m"], TWIN_SHAPE["n"]]
    assert reply["inputsSha256"] == native["inputs_sha256"], "inputs differ: hash not portable"
    browser = np.frombuffer(base64.b64decode(reply["output"]), dtype="<f4").reshape(reply["shape"])
    native_out = native["output"]
    assert browser.shape == native_out.shape

    a, b = twin.twin_inputs(TWIN_SEED, TWIN_SHAPE["m"], TWIN_SHAPE["k"], TWIN_SHAPE["n"])
    reference = float64_reference(a, b)
    browser_error = np.abs(browser - reference).max()
    native_error = np.abs(native_out - reference).max()
    twin_diff = np.abs(browser.astype(np.float64) - native_out).max()
    ulps = ulp_distance(browser, native_out)
    report(f"\n[ui] twin ({native_backend or 'default'} backend natively): browser vs native "
           f"max |diff| {twin_diff:.3g} (max {ulps.max()} ulp, "
           f"{np.count_nonzero(ulps)}/{ulps.size} elements differ); vs float64: browser "
           f"{browser_error:.3g}, native {native_error:.3g}; browser eval "
           f"{reply['timingsMs'][0]:.1f} ms")

    assert np.all(np.isfinite(browser))
    np.testing.assert_allclose(browser.sum(axis=-1), 1.0, atol=1e-5)
    assert browser_error <= TWIN_ATOL
    assert native_error <= TWIN_ATOL
    assert twin_diff <= TWIN_ATOL


def test_twin_inputs_change_with_the_seed(ready_page):
    """Guards against a twin check that could not fail: another seed, another result."""
    first = eval_twin_in_browser(ready_page, seed=1, m=8, k=16, n=8)
    second = eval_twin_in_browser(ready_page, seed=2, m=8, k=16, n=8)
    assert first["inputsSha256"] != second["inputsSha256"]
    assert first["output"] != second["output"]


def test_cancel_interrupts_running_python(ready_page):
    outcome = ready_page.evaluate("""async ([repeat, waitMs]) => {
        const client = window.candleWeb.client;
        let started;
        const running = new Promise((resolve) => { started = resolve; });
        const job = client.start('eval_twin', {seed: 7, m: 32, k: 32, n: 32, repeat},
                                 {onProgress: (message) => started(message.done)});
        const roundsBeforeCancel = await running;
        await client.cancel(job.id);
        const timeout = new Promise(
            (resolve) => setTimeout(() => resolve({name: 'Timeout'}), waitMs));
        const settled = await Promise.race([
            job.result.then(() => ({name: 'Finished'}),
                            (e) => ({name: e.name, message: e.message})),
            timeout,
        ]);
        // The runtime must still work after the interrupt.
        const after = await client.request('eval_twin', {seed: 7, m: 4, k: 4, n: 4});
        return {roundsBeforeCancel, settled, afterShape: after.shape};
    }""", [CANCEL_REPEAT, CANCEL_WAIT_MS])
    assert outcome["roundsBeforeCancel"] >= 1
    assert outcome["settled"]["name"] == "Cancelled", outcome
    assert outcome["afterShape"] == [4, 4]


def test_cancel_before_start_drops_a_queued_job(ready_page):
    """A job cancelled while another one runs never reaches Python."""
    outcome = ready_page.evaluate("""async () => {
        const client = window.candleWeb.client;
        const first = client.start('eval_twin', {seed: 1, m: 64, k: 64, n: 64, repeat: 20});
        const queued = client.start('eval_twin', {seed: 2, m: 4, k: 4, n: 4});
        const cancelReply = client.cancel(queued.id);
        const describe = (p) => p.then((r) => ({name: 'result', shape: r.shape}),
                                       (e) => ({name: e.name}));
        return {first: await describe(first.result), queued: await describe(queued.result),
                cancel: (await cancelReply).target === queued.id};
    }""")
    assert outcome["first"] == {"name": "result", "shape": [64, 64]}
    assert outcome["queued"]["name"] == "Cancelled"
    assert outcome["cancel"] is True
