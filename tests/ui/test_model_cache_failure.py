"""A model this browser cannot keep still runs, and a start that stalls says where (issue 37).

The review's reproduction: in a fresh browser context (a private window; a full disk does the
same) the Cache API's `put` rejects with "UnknownError: Failed to execute 'put' on 'Cache':
Unexpected internal error.", and the load failed after the whole download, every time. Here the
failure is made deterministic: the worker's script is served with a prefix that replaces
`Cache.prototype.put` by one rejecting with that error (Playwright's init scripts do not reach
workers, so the prefix comes through a route on /worker.js; nothing in the page knows it is
tested). Real inputs otherwise: the registry's SmolLM2-135M-Instruct, downloaded from the test
server.

What a user relies on, asserted: the model runs from the downloaded bytes with the ids a page
whose browser keeps it computes; the model note says it could not be kept, why, and that it
will be downloaded again; a reload downloads it again, without an error; a download that
`navigator.storage.estimate()` says will not fit is not offered to the cache at all, and the
page says so while it downloads; nothing half-written stays in the cache. And a start whose
numpy never arrives (its request held, never answered) ends by naming the stage and the file
instead of waiting for ever.
"""
from __future__ import annotations

import pytest
from tests.ui.conftest import PLAYWRIGHT_CONFIG
from tests.ui.text_views_testlib import leave_page_as_found, open_view, run_and_wait

pytestmark = pytest.mark.ui

MODEL = "smollm2-135m-instruct"
LABEL = "SmolLM2-135M-Instruct (Q4_1)"
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
QUESTION = "What is the capital of France?"
GREEDY = {"maxTokens": 8, "temperature": 0, "seed": 299792458, "repeatPenalty": 1}
FORM_IDS = {"maxTokens": "#generate-max-tokens", "temperature": "#generate-temperature",
            "seed": "#generate-seed", "repeatPenalty": "#generate-repeat-penalty"}
# A load (98 MB downloaded, dequantized in wasm) and 8 tokens on a busy 2-core machine.
RUN_TIMEOUT_MS = 400_000
PUT_ERROR = "UnknownError: Failed to execute 'put' on 'Cache': Unexpected internal error."

# Counts the worker's put calls (self.candleWebPutCalls) and rejects each as Chromium does
# when it cannot write.
FAILING_PUT_JS = """
self.candleWebPutCalls = 0;
Cache.prototype.put = function () {
  self.candleWebPutCalls += 1;
  return Promise.reject(new DOMException(
    "Failed to execute 'put' on 'Cache': Unexpected internal error.", "UnknownError"));
};
"""
# A browser with 50 MB left for this page (the put still fails, were it tried).
FULL_STORAGE_JS = FAILING_PUT_JS + """
StorageManager.prototype.estimate = async () => ({ quota: 60e6, usage: 10e6 });
"""

CACHED_KEYS_JS = """async (name) => {
    const cache = await caches.open('candle-web-models-v1');
    return (await cache.keys()).map((request) => request.url).filter((url) => url.includes(name));
}"""
FORGET_KEYS_JS = """async (name) => {
    const cache = await caches.open('candle-web-models-v1');
    for (const request of await cache.keys()) {
        if (request.url.includes(name)) await cache.delete(request);
    }
}"""


class PatchedWorker:
    """A route for /worker.js serving the real script behind `prefix` (JS run before the
    worker's modules handle any message); set `prefix` before a (re)load."""

    def __init__(self, prefix: str):
        self.prefix = prefix

    def __call__(self, route) -> None:
        response = route.fetch()
        route.fulfill(response=response, body=self.prefix + response.text())


def worker_of(page):
    workers = [w for w in page.workers if w.url.endswith("/worker.js")]
    assert len(workers) == 1, [w.url for w in page.workers]
    return workers[0]


def generate(page) -> dict:
    """A greedy Generate run of QUESTION; {result, error, load, events, streamed, note}."""
    open_view(page, "generate")
    page.select_option("#generate-model", MODEL)
    page.fill("#generate-prompt", QUESTION)
    page.set_checked("#generate-chat", True)
    for name, selector in FORM_IDS.items():
        page.fill(selector, str(GREEDY[name]))
    state = run_and_wait(page, "generate", "#generate-button", RUN_TIMEOUT_MS)
    assert state["error"] is None, state["error"]
    state["note"] = page.text_content("#generate-model-note")
    return state


@pytest.fixture(scope="module", autouse=True)
def page_left_as_found(ready_page):
    yield from leave_page_as_found(ready_page)


@pytest.fixture(scope="module")
def model_size() -> int:
    from candle_web import hub

    return hub.default_registry()[MODEL].size


def test_a_model_this_browser_cannot_keep_still_runs_and_says_so(
        ready_page, open_ui_page, page_ready, model_size, model_cache_left_as_found, report):
    # The failing page must download: no copy of the model in the shared profile's cache.
    ready_page.evaluate(FORGET_KEYS_JS, GGUF)
    patch = PatchedWorker(FAILING_PUT_JS)
    page = open_ui_page("/", routes={"**/worker.js": patch})
    page_ready(page)

    first = generate(page)
    load = first["load"]
    assert load["cached"] is False and load["downloadedBytes"] == model_size
    assert load["notKept"] == {"reason": PUT_ERROR, "bytes": model_size}
    assert (f"Could not keep {LABEL} in this browser's storage ({PUT_ERROR}); "
            "it will be downloaded again next time.") in first["note"]
    assert worker_of(page).evaluate("() => self.candleWebPutCalls") == 1
    assert page.evaluate(CACHED_KEYS_JS, GGUF) == []  # nothing half-written kept

    # A second visit downloads it again, and runs again.
    page.reload()
    page_ready(page)
    second = generate(page)
    assert second["load"]["cached"] is False
    assert second["load"]["downloadedBytes"] == model_size
    assert second["load"]["notKept"]["reason"] == PUT_ERROR
    assert second["result"]["tokenIds"] == first["result"]["tokenIds"]

    # Storage that says it is too small: the download is not offered to the cache at all,
    # and the page says so from the start of the download, not at its end.
    patch.prefix = FULL_STORAGE_JS
    page.reload()
    page_ready(page)
    full = generate(page)
    reason = (f"it needs {model_size / 1e6:.1f} MB and this browser's storage for this page "
              "has 50.0 MB free")
    assert full["load"]["notKept"] == {"reason": reason, "bytes": model_size}
    assert worker_of(page).evaluate("() => self.candleWebPutCalls") == 0
    events = [(e["phase"], e["state"]) for e in full["events"]]
    assert events.index(("download", "not-kept")) < events.index(("download", "running"))
    assert f"Could not keep {LABEL} in this browser's storage ({reason})" in full["note"]
    assert full["result"]["tokenIds"] == first["result"]["tokenIds"]

    # The same ids as a page whose browser keeps the model.
    kept = generate(ready_page)
    if kept["events"]:  # loaded by this run (else held from an earlier module's)
        assert kept["load"]["notKept"] is None
    assert kept["result"]["tokenIds"] == first["result"]["tokenIds"]
    assert kept["result"]["text"] == first["result"]["text"]
    report(f"[ui] SmolLM2 not kept (put rejected): runs, {len(first['result']['tokenIds'])} "
           f"ids equal a caching page's; downloaded {model_size / 1e6:.1f} MB on each of 3 visits; "
           f"download {load['timingsMs']['download'] / 1000:.1f} s")


def test_a_start_stage_whose_request_is_never_answered_is_named(open_ui_page):
    """numpy's wheel is requested by Pyodide's package loader, which on its own would log the
    failure and let a later import fail far from it, or wait for ever for an answer."""
    held = []

    def hold(route) -> None:  # never continued nor fulfilled: the request waits for ever
        held.append(route)

    # A 12-second deadline (the page's ?answerDeadline=, 30 s by default): long enough to see
    # the stage's time counted (from 10 s on), 18 s less to wait.
    page = open_ui_page("/?answerDeadline=12", routes={"**/vendor/pyodide/numpy-*.whl": hold})
    # While it waits, the page names the stage and counts its time (from 10 s on).
    page.wait_for_function(
        r"() => /Loading (.*, )?numpy \(\d+\.\d s\)/.test("
        "document.getElementById('runtime-text').textContent)",
        timeout=PLAYWRIGHT_CONFIG.PAGE_READY_TIMEOUT_MS)
    page.wait_for_function(
        "() => document.getElementById('runtime-status').dataset.state === 'error'",
        timeout=PLAYWRIGHT_CONFIG.PAGE_READY_TIMEOUT_MS)
    text = page.text_content("#runtime-text")
    assert held, "the numpy wheel was never requested"
    wheel = held[0].request.url.rsplit("/", 1)[-1]
    assert text == (f"The Python runtime failed to start: numpy stalled ({wheel} got no answer "
                    "in 12 s)"), text
    error = page.evaluate("() => window.candleWeb.ready.catch((e) => ({name: e.name,"
                          " message: e.message}))")
    assert error == {"name": "StartStalled",
                     "message": f"the packages stage stalled: {wheel} got no answer in 12 s"}


def test_an_answer_deadline_the_page_cannot_use_is_refused(open_ui_page):
    bad = open_ui_page("/?answerDeadline=0")
    bad.wait_for_function(
        "() => document.getElementById('runtime-status').dataset.state === 'error'",
        timeout=PLAYWRIGHT_CONFIG.PAGE_READY_TIMEOUT_MS)
    assert ("`answerDeadline` (the page's ?answerDeadline=) must be a number of seconds from 1 "
            "to 3600, got 0") in bad.locator("#runtime-text").inner_text()
