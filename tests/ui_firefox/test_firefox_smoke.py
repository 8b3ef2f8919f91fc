"""The demo page in Firefox ESR (Debian's firefox-esr, headless, driven over WebDriver BiDi):
the start, a transcription, Generate, Chat and Stop, with the same ids as Chromium's.

The Chromium suite (tests/ui) checks each of these against a native run of the same session
code on the numpy backend (the twin checks); the same native runs are the reference here, so
Firefox's ids equal native's equal Chromium's. Greedy decoding picks the argmax: the browsers
and native BLAS add in different orders, so logits differ in the last bits, but the ids must
be equal. The page is driven through tests/ui's own helpers (firefox_testlib.FirefoxPage has
the Playwright methods they call), so both browsers run the same steps.

Audio. Firefox's decodeAudioData converts 16-bit PCM by division, Chromium's by multiplying
with a reciprocal (tests/ui/native_whisper.py): some samples differ in their last bit. So the
transcript is checked twice: against native on Firefox's very samples (same sha256: the model
computation), and against native on Chromium's samples (what the Chromium suite asserts its
page produces): the same ids both ways.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tests.ui.test_chat import (MAX_TOKENS, SYSTEM, TURN_TIMEOUT_MS, messages_shown,
                                native_runner, send)
from tests.ui.test_generate import (CANCEL_TIMEOUT_MS, GENERATE_TIMEOUT_MS, GGUF, GREEDY_OPTIONS,
                                    MODEL, QUESTION, STORY_PROMPT, fill_form)
from tests.ui.test_page import EXPECTED_VERSIONS
from tests.ui.text_views_testlib import NativeTextJobs, open_view, run_and_wait, view_state
from tests.ui.transcribe_testlib import (SAMPLES_DIR, TRANSCRIBE_TIMEOUT_MS,
                                         assert_matches_reference, run_to_end, samples_manifest,
                                         wait_idle_with_clip)
from tests.ui_firefox.firefox_testlib import FirefoxError

import candle_web

pytestmark = pytest.mark.ui

NATIVE_WHISPER = Path(__file__).resolve().parents[1] / "ui" / "native_whisper.py"
WHISPER = "whisper-tiny.en"
CLIP = "sense_and_sensibility_01_austen_64kb-0880.wav"
NATIVE_TIMEOUT_S = 600


class NativeWhisper:
    """tests/ui/native_whisper.py on CLIP with one browser's PCM conversion (--chromium-pcm or
    --firefox-pcm), started at once so it runs while the browser works."""

    def __init__(self, conversion: str):
        environment = dict(os.environ, CANDLE_WEB_BACKEND="numpy", OPENBLAS_NUM_THREADS="1",
                           OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
        self.process = subprocess.Popen(
            [sys.executable, str(NATIVE_WHISPER), conversion, WHISPER, str(SAMPLES_DIR / CLIP)],
            env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def clip(self) -> dict:
        try:
            stdout, stderr = self.process.communicate(timeout=NATIVE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.stop()
            pytest.fail(f"native whisper gave no answer in {NATIVE_TIMEOUT_S} s", pytrace=False)
        if self.process.returncode != 0:
            pytest.fail(f"native whisper failed ({self.process.returncode}):\n{stderr[-4000:]}",
                        pytrace=False)
        return json.loads(stdout)["clips"][CLIP]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.communicate()


@pytest.fixture(scope="module")
def native_transcripts(model_file):
    for name in ("model.bin", "config.json", "tokenizer.json"):
        model_file(WHISPER, name)  # fails early, with the fetch hint, when the cache lacks it
    runs = {"firefox": NativeWhisper("--firefox-pcm"), "chromium": NativeWhisper("--chromium-pcm")}
    yield runs
    for run in runs.values():
        run.stop()


@pytest.fixture(scope="module")
def native_generate(model_file):
    run = NativeTextJobs([{"task": "generate", "gguf": str(model_file(MODEL, GGUF)),
                           "prompt": QUESTION, "chat": True, "options": GREEDY_OPTIONS}])
    yield run
    run.stop()


def test_page_is_isolated_with_relaxed_simd_two_threads_and_the_pinned_runtime(
        firefox_page, firefox_summary, firefox):
    page, summary = firefox_page, firefox_summary
    assert firefox.version.startswith("firefox/")
    assert page.evaluate("() => self.crossOriginIsolated") is True
    assert summary["crossOriginIsolated"] is True and summary["cancellable"] is True
    backend = summary["backend"]
    assert (backend["name"], backend["variant"], backend["reason"]) == ("wasm", "relaxed-simd",
                                                                        None)
    # Two threads where the browser reports two cores or more (the page's default).
    cores = page.evaluate("() => navigator.hardwareConcurrency")
    assert backend["threads"] == (2 if cores >= 2 else 1), backend["threadsReason"]
    for name, expected in EXPECTED_VERSIONS.items():
        assert summary["versions"][name] == expected, name
    assert summary["versions"]["candle_web"] == candle_web.__version__
    assert page.evaluate("() => document.getElementById('runtime-status').dataset.state") == \
        "ready"
    assert page.page_log.errors == []


def test_off_host_requests_of_page_and_worker_are_refused_and_seen(firefox_page, firefox_guard):
    """The guard itself: a fetch off 127.0.0.1 from the page and one from a worker reach the
    refusing proxy, so a test that made one would fail."""
    firefox_page.evaluate("""async () => {
        await fetch('http://192.0.2.7/page-fetch').catch(() => null);
        const source = "fetch('http://192.0.2.7/worker-fetch').catch(() => null)" +
                       ".then(() => postMessage(1))";
        const worker = new Worker(URL.createObjectURL(new Blob([source])));
        await new Promise((resolve) => { worker.onmessage = resolve; });
        worker.terminate();
    }""")
    assert sorted(firefox_guard.take_new()) == ["http://192.0.2.7/page-fetch",
                                                "http://192.0.2.7/worker-fetch"]


def test_a_wait_that_never_ends_fails_at_its_timeout_and_the_page_answers_on(firefox_page):
    """Every command is bounded: a condition that never holds fails the call (it does not hang
    the suite), and the driver and page go on."""
    with pytest.raises(FirefoxError, match="waitForFunction"):
        firefox_page.wait_for_function("() => window.neverSet === true", timeout=500)
    assert firefox_page.evaluate("(x) => x + 1", 41) == 42


def test_a_transcribed_clip_has_chromiums_token_ids(firefox_page, native_transcripts, report):
    page = firefox_page
    page.click("#tab-transcribe")
    page.click(f"button.sample[data-file='{CLIP}']")
    wait_idle_with_clip(page, next(c["title"] for c in samples_manifest() if c["file"] == CLIP))
    result = run_to_end(page, TRANSCRIBE_TIMEOUT_MS)["result"]
    ids = [segment["tokens"] for segment in result["segments"]]
    assert sum(map(len, ids)) > 5  # a real transcript, not an empty one
    assert_matches_reference(CLIP, result["text"])

    on_firefox_samples = native_transcripts["firefox"].clip()
    assert result["input"]["sha256"] == on_firefox_samples["sha256"], "decoded samples differ"
    assert ids == [segment["tokens"] for segment in on_firefox_samples["segments"]]
    assert result["text"] == on_firefox_samples["text"]
    on_chromium_samples = native_transcripts["chromium"].clip()
    assert on_chromium_samples["sha256"] != on_firefox_samples["sha256"]
    assert ids == [segment["tokens"] for segment in on_chromium_samples["segments"]]
    report(f"[firefox] {CLIP[-8:]}: {sum(map(len, ids))} ids equal native on Firefox's and on "
           f"Chromium's samples, in {result['timings']['elapsedMs'] / 1000:.1f} s: "
           f"{result['text'].strip()!r}")


def test_a_second_visit_loads_the_model_from_the_cache(firefox, firefox_page, ui_server_url):
    """The model, once in the Cache API (the shared page loads it), is read from there by a
    new page: every file reported cached, no byte downloaded."""
    load_js = """async (model) => {
        const events = [];
        const reply = await window.candleWeb.client.request('load', {model},
            {onProgress: (m) => m.phase === 'download' && m.file
                && events.push({file: m.file, cached: m.cached})});
        return {cached: reply.cached, downloadedBytes: reply.downloadedBytes, events};
    }"""
    firefox_page.evaluate(load_js, WHISPER)
    page = firefox.open(ui_server_url + "/")
    try:
        page.wait_for_function("() => window.candleWeb && window.candleWeb.transcribe.runtimeReady",
                               timeout=TRANSCRIBE_TIMEOUT_MS)
        second = page.evaluate(load_js, WHISPER)
    finally:
        page.close()
    assert second["cached"] is True and second["downloadedBytes"] == 0
    assert {event["file"] for event in second["events"]} == {"model.bin", "config.json",
                                                             "tokenizer.json"}
    assert all(event["cached"] is True for event in second["events"])


def test_generate_greedy_answer_has_chromiums_ids(firefox_page, native_generate):
    page = firefox_page
    open_view(page, "generate")
    page.select_option("#generate-model", MODEL)
    fill_form(page, QUESTION, True, GREEDY_OPTIONS)
    state = run_and_wait(page, "generate", "#generate-button", GENERATE_TIMEOUT_MS)
    assert state["error"] is None, state["error"]
    result = state["result"]
    native = native_generate.result()["results"][0]
    assert result["promptIds"] == native["promptIds"]
    assert result["tokenIds"] == native["tokenIds"]
    assert result["text"] == native["text"] and "Paris" in result["text"]
    assert state["streamed"]["tokens"] == len(result["tokenIds"])
    assert page.inner_text("#generate-output") == result["text"].strip()


def test_stop_ends_generate_mid_way_and_the_worker_goes_on(firefox_page):
    page = firefox_page
    open_view(page, "generate")
    fill_form(page, STORY_PROMPT, True, {**GREEDY_OPTIONS, "maxTokens": 400})
    page.click("#generate-button")
    page.wait_for_function("() => window.candleWeb.generate.streamed.tokens >= 2",
                           timeout=GENERATE_TIMEOUT_MS)
    page.click("#generate-stop")
    page.wait_for_function("() => !window.candleWeb.generate.busy", timeout=CANCEL_TIMEOUT_MS)
    assert view_state(page, "generate", "s.lastError") == {"name": "Cancelled",
                                                           "message": "cancelled by the page"}
    streamed = view_state(page, "generate", "s.streamed")
    assert 2 <= streamed["tokens"] < 400
    assert page.inner_text("#generate-phase") == f"Stopped after {streamed['tokens']} tokens."
    fill_form(page, QUESTION, True, {**GREEDY_OPTIONS, "maxTokens": 2})
    state = run_and_wait(page, "generate", "#generate-button", GENERATE_TIMEOUT_MS)
    assert state["error"] is None and len(state["result"]["tokenIds"]) == 2


def test_chat_two_turns_recall_a_name_with_chromiums_ids(firefox_page):
    page = firefox_page
    page.click("#tab-chat")
    page.wait_for_function("() => window.candleWeb.chat.runtimeReady", timeout=TURN_TIMEOUT_MS)
    page.evaluate("() => localStorage.removeItem('candle-web.chat.v1')")
    page.click("#chat-new")
    page.select_option("#chat-model", MODEL)
    page.fill("#chat-system", SYSTEM)
    page.dispatch_event("#chat-system", "change")
    page.fill("#chat-max-tokens", str(MAX_TOKENS))
    native = native_runner(MODEL)
    conversation = [{"role": "system", "content": SYSTEM}]
    results = []
    for text in ("My name is Ada.", "What is my name?"):
        conversation.append({"role": "user", "content": text})
        results.append(send(page, text))
        assert results[-1]["tokenIds"] == native(conversation), text
        conversation.append({"role": "assistant", "content": results[-1]["text"]})
    assert "Ada" in results[1]["text"]  # turn 2 depends on turn 1
    assert [role for role, _ in messages_shown(page)] == ["user", "assistant"] * 2
