"""The page at ?compute=int8 (issue 36): SmolLM2's quantized products in int8 arithmetic in
the browser (web/kernels/linear_int8.c, through the wasm LLaMA part and the prompt's qmatmul),
against the native int8 run of the same session code on numba (CANDLE_WEB_COMPUTE_TYPE=int8:
kernels/qint8.py). Both multiply with candle_web.quantized.int8_rows' very bits
(tests/kernels/test_wasm_int8.py, tests/native/test_qint8.py); the float steps around the
products differ in the last bits (FMA, sum orders), as for float32, and int8 amplifies that
(tests/backend/test_wasm_int8.py: a last-bit difference can move an activation's level), so
the twin's greedy ids are compared over a short answer: natively the wasm part and numba
give the same first 19 ids of this 24-token answer.
"""
from __future__ import annotations

import pytest
from tests.ui.test_generate import GGUF, MODEL, QUESTION, fill_form
from tests.ui.text_views_testlib import NativeTextJobs, open_view, run_and_wait

OPTIONS = {"maxTokens": 12, "temperature": 0, "seed": 299792458, "repeatPenalty": 1}
GENERATE_TIMEOUT_MS = 400_000

pytestmark = [pytest.mark.ui, pytest.mark.usefixtures("model_cache_left_as_found")]


def test_int8_page_answers_with_the_native_int8_ids(ready_page_at, model_file, report):
    native = NativeTextJobs([{"task": "generate", "gguf": str(model_file(MODEL, GGUF)),
                              "prompt": QUESTION, "chat": True, "options": OPTIONS}],
                            {"CANDLE_WEB_BACKEND": "numba", "CANDLE_WEB_COMPUTE_TYPE": "int8"})
    try:
        page = ready_page_at("/?compute=int8")
        backend = page.ready_summary["backend"]
        assert backend["name"] == "wasm" and backend["computeType"] == "int8", backend
        assert "int8" in page.text_content("#runtime-backend")
        open_view(page, "generate")
        page.select_option("#generate-model", MODEL)
        fill_form(page, QUESTION, True, OPTIONS)
        state = run_and_wait(page, "generate", "#generate-button", GENERATE_TIMEOUT_MS)
        assert state["error"] is None, state["error"]
        want = native.result()
        assert want["backend"] == "numba"
        want = want["results"][0]
        got = state["result"]
        assert got["promptIds"] == want["promptIds"]
        assert got["tokenIds"] == want["tokenIds"]
        report(f"[ui] SmolLM2 Q4_1 at ?compute=int8: {len(got['tokenIds'])} greedy ids equal "
               f"native numba int8; decode {got['timings']['tokensPerSecond']:.2f} tok/s in the "
               f"page ({backend.get('threads')} thread(s))")
    finally:
        native.stop()
