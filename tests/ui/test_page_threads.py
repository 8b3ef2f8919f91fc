"""Two threads in the real page (the default where the browser reports two cores, ?threads=2
to ask, ?threads=1 to turn them off): Whisper's encoder and the decode steps on a helper worker
sharing a WebAssembly.Memory (web/team_helper.js) give the same token ids as one thread, and
the page says when it cannot run them.

What is asserted is what a user relies on: the footer and the ready answer say two threads, the
helper really took part in the steps (its job count in the shared control block grows, so a
team that silently ran alone fails), and Whisper's transcription and SmolLM2's greedy answer
are the same ids as the one-thread page's. Speed is bench/browser.py's business (its
`backend=wasm&threads=2` column), never asserted here.
"""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.ui

CLIP = "sense_and_sensibility_01_austen_64kb-0870.wav"
PROMPT = "Name three colours of the rainbow."
TIMEOUT_MS = 240_000

TRANSCRIBE_JS = """async ([file]) => {
    const {decodeToMono16k} = await import('./transcribe.js');
    const bytes = await (await fetch('vendor/samples/' + file)).arrayBuffer();
    const samples = await decodeToMono16k(bytes, file);
    const client = window.candleWeb.client;
    await client.request('load', {model: 'whisper-tiny.en', kind: 'whisper'});
    const reply = await client.request('transcribe', {model: 'whisper-tiny.en', samples,
                                                      options: {}});
    return {text: reply.text, tokens: reply.segments.map((s) => s.tokens)};
}"""

GENERATE_JS = """async ([prompt]) => {
    const client = window.candleWeb.client;
    await client.request('load', {model: 'smollm2-135m-instruct', kind: 'llama'});
    const reply = await client.request('generate', {model: 'smollm2-135m-instruct', prompt,
        chat: true, options: {maxTokens: 24, temperature: 0, seed: 1, repeatPenalty: 1}});
    return {text: reply.text, ids: reply.tokenIds};
}"""


def helper_jobs(page) -> int:
    workers = [w for w in page.workers if w.url.endswith("/worker.js")]
    assert len(workers) == 1, [w.url for w in page.workers]
    return workers[0].evaluate("""() => pyodide.runPython(
        "from candle_web.backend.wasm import install; install().team.helper_jobs")""")


# The model cache is left as this module found it (conftest: model_cache_left_as_found).
@pytest.fixture(scope="module", autouse=True)
def _model_cache_left_as_found(model_cache_left_as_found):
    yield


@pytest.fixture(scope="module")
def threads_page(ready_page_at):
    return ready_page_at("/?threads=2")


@pytest.fixture(scope="module")
def one_thread_page(ready_page_at):
    return ready_page_at("/?threads=1")


def test_two_threads_are_the_default_where_there_are_two_cores(ready_page):
    cores = ready_page.evaluate("() => navigator.hardwareConcurrency")
    backend = ready_page.ready_summary["backend"]
    if cores >= 2:
        assert backend["threads"] == 2 and backend["threadsReason"] is None, backend
    else:
        assert backend["threads"] == 1
        assert backend["threadsReason"] == f"the browser reports {cores} core"


def test_the_page_starts_its_second_thread(threads_page, report):
    backend = threads_page.ready_summary["backend"]
    assert backend["name"] == "wasm" and backend["threads"] == 2, backend
    assert backend["threadsReason"] is None
    assert backend["threadsKernels"]["file"] == "kernels-threads.wasm"
    assert "2 threads" in threads_page.locator("#runtime-backend").inner_text()
    assert any(w.url.endswith("/team_helper.js") for w in threads_page.workers)
    phases = threads_page.ready_summary["phases"]
    report(f"\n[ui] ?threads=2: ready in {threads_page.ready_summary['totalMs'] / 1000:.2f} s "
           f"(second thread {phases['threads'] / 1000:.2f} s, overlapped)")


def test_whisper_on_two_threads_gives_the_one_thread_tokens(threads_page, one_thread_page):
    backend = one_thread_page.ready_summary["backend"]
    assert backend["threads"] == 1 and backend["threadsReason"] == "?threads=1 asked for one thread"
    assert "threads" not in one_thread_page.locator("#runtime-backend").inner_text()
    jobs = helper_jobs(threads_page)
    two = threads_page.evaluate(TRANSCRIBE_JS, [CLIP])
    steps = sum(len(tokens) for tokens in two["tokens"])
    assert helper_jobs(threads_page) >= jobs + steps, "the helper took no part in the steps"
    one = one_thread_page.evaluate(TRANSCRIBE_JS, [CLIP])
    assert two["tokens"] == one["tokens"] and two["text"] == one["text"]
    assert len(two["text"].split()) > 5


def test_smollm2_on_two_threads_gives_the_one_thread_ids(threads_page, one_thread_page):
    jobs = helper_jobs(threads_page)
    two = threads_page.evaluate(GENERATE_JS, [PROMPT])
    # every token after the first comes from a decode step (the first from the prompt's pass)
    assert helper_jobs(threads_page) >= jobs + len(two["ids"]) - 1, "the helper took no part"
    one = one_thread_page.evaluate(GENERATE_JS, [PROMPT])
    assert len(two["ids"]) > 5
    assert two["ids"] == one["ids"] and two["text"] == one["text"]


def test_threads_the_page_cannot_run_are_refused_or_said(open_ui_page, page_ready):
    page = open_ui_page("/?threads=2&backend=wasm-simd128")
    backend = page_ready(page)["backend"]
    assert backend["threads"] == 1
    assert backend["threadsReason"] == "?backend=wasm-simd128 runs one thread"
    bad = open_ui_page("/?threads=3")
    bad.wait_for_function("() => document.getElementById('runtime-status').dataset.state === 'error'",
                          timeout=TIMEOUT_MS)
    assert "`threads` (the page's ?threads=) must be 1, 2 or auto, got 3" in \
        bad.locator("#runtime-text").inner_text()
