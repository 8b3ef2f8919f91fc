"""The microphone in the Transcribe view, with Chromium's fake capture device playing real
speech (conftest's FAKE_MICROPHONE: LibriVox clips with silences, from its start whenever a
page opens the microphone): Record shows the level and the time, Stop transcribes; live mode
shows words while the speech goes on and, after Stop, the whole transcript; a refused
permission and a machine without a microphone each get an inline message, and the rest of the
page keeps working. The references are the clips' LibriVox transcripts."""
from __future__ import annotations

import pytest
from tests.ui.transcribe_testlib import (MODEL_TINY, TRANSCRIBE_TIMEOUT_MS,
                                         assert_matches_reference, choose_model, playwright_config,
                                         screenshot, view_state)

pytestmark = pytest.mark.ui

RECORD_TIMEOUT_MS = 120_000
# Live mode: the first commit needs a pass over a window of 12 s (LIVE_WINDOW_SECONDS in
# web/transcribe.js), i.e. two or three passes of the encoder; minutes on a busy machine.
LIVE_TIMEOUT_MS = 600_000


@pytest.fixture
def microphone_allowed(browser_context, ui_server_url):
    """The page may use the (fake) microphone during the test; refused again after it."""
    browser_context.grant_permissions(["microphone"], origin=ui_server_url)
    yield
    browser_context.clear_permissions()


def recorder_state(page) -> dict:
    return view_state(page, "({...s.recorder, recording: s.recording, "
                            "elapsed: document.getElementById('mic-elapsed').textContent, "
                            "meter: document.getElementById('mic-level').value, "
                            "ui: document.getElementById('recorder').dataset.state})")


def wait_recorded(page, seconds: float, timeout: int = RECORD_TIMEOUT_MS) -> None:
    page.wait_for_function(f"() => window.candleWeb.transcribe.recorder.seconds >= {seconds}",
                           timeout=timeout)


def test_a_refused_microphone_gets_an_inline_message(ready_page, browser_context):
    page = ready_page
    browser_context.clear_permissions()  # what a "Block" in the permission prompt leaves
    page.click("#record-button")
    message = page.locator("#mic-error")
    message.wait_for(state="visible")
    assert message.get_attribute("role") == "alert"
    assert "Microphone access is blocked for this page" in message.inner_text()
    state = recorder_state(page)
    assert state["error"]["name"] == "NotAllowedError" and state["recording"] is False
    assert state["ui"] == "error"
    # The rest of the view is unaffected: no error in its box, Record and the files still work.
    assert page.locator("#transcribe-error").is_hidden()
    assert page.locator("#record-button").is_enabled()
    assert page.locator("#drop-zone").is_visible()
    assert page.page_log.errors == []


def test_no_microphone_gets_an_inline_message(browser_context, network_guard, ui_server_url):
    """A browser with no capture device at all (launched without the fake one)."""
    config = playwright_config()
    browser = browser_context.chromium.launch(executable_path=config.CHROMIUM_EXECUTABLE,
                                              headless=False, args=config.CHROMIUM_ARGS)
    try:
        context = browser.new_context()
        context.route("**/*", network_guard.handle_route)
        context.grant_permissions(["microphone"], origin=ui_server_url)
        page = context.new_page()
        page.goto(ui_server_url + "/")
        page.wait_for_function("() => window.candleWeb !== undefined")
        page.click("#record-button")
        message = page.locator("#mic-error")
        message.wait_for(state="visible")
        assert "No microphone was found" in message.inner_text()
        assert view_state(page, "s.recorder.error.name") == "NotFoundError"
        assert page.locator("#record-button").is_enabled()
        screenshot(page, "transcribe-mic-no-device")
    finally:
        browser.close()


def test_record_then_stop_transcribes_the_speech(ready_page, fake_microphone, microphone_allowed,
                                                 report):
    page = ready_page
    choose_model(page, MODEL_TINY)
    page.uncheck("#live-mode")
    first = fake_microphone["clips"][0]
    runs = view_state(page, "s.runs")
    page.click("#record-button")
    page.wait_for_function("() => document.getElementById('recorder').dataset.state === "
                           "'recording'")
    # Into the first clip's speech: the meter moves and the clock counts.
    wait_recorded(page, first["start"] + 2.0)
    assert page.locator("#stop-record-button").is_enabled()
    assert page.locator("#record-button").is_disabled()
    wait_recorded(page, first["end"] + 0.5)
    during = recorder_state(page)
    assert during["peakLevel"] > 0  # the meter showed sound
    whole = int(during["seconds"])  # the clock and the state come from the same meter tick
    assert during["elapsed"] == f"{whole // 60}:{whole % 60:02d}"
    screenshot(page, "transcribe-mic-recording")
    page.click("#stop-record-button")

    # Stop -> transcribe, without another press.
    page.wait_for_function(f"() => {{ const s = window.candleWeb.transcribe;"
                           f" return !s.busy && !s.recording && s.runs > {runs}; }}",
                           timeout=TRANSCRIBE_TIMEOUT_MS)
    state = view_state(page, "({result: s.lastResult, error: s.lastError, clip: {name: "
                             "s.clip.name, seconds: s.clip.seconds, url: s.clip.url}, "
                             "recorder: s.recorder})")
    assert state["error"] is None
    assert state["result"]["clip"] == state["clip"]["name"]
    assert state["clip"]["name"].startswith("Recording ")
    assert state["clip"]["seconds"] >= first["end"]
    assert_matches_reference(first["file"], state["result"]["text"])
    # The player gets a WAV of the recording (a WebM from the recorder cannot be sought).
    assert state["clip"]["url"].startswith("blob:")
    page.wait_for_function("() => document.getElementById('clip-player').duration > 0")
    duration = page.evaluate("() => document.getElementById('clip-player').duration")
    assert duration == pytest.approx(state["clip"]["seconds"], abs=1e-3)
    assert recorder_state(page)["meter"] == 0  # the microphone is released
    report(f"[ui] microphone ({state['recorder']['mimeType']}): {state['clip']['seconds']:.1f} s "
           f"recorded, transcribed in {state['result']['timings']['elapsedMs'] / 1000:.1f} s: "
           f"{state['result']['text'].strip()!r}")


def test_live_mode_shows_words_while_speaking_then_the_whole_transcript(
        ready_page, fake_microphone, microphone_allowed, report):
    page = ready_page
    choose_model(page, MODEL_TINY)
    page.check("#live-mode")
    runs = view_state(page, "s.runs")
    try:
        page.click("#record-button")
        # Words appear while recording goes on: a pass's segments, shown as partial.
        page.wait_for_function("() => window.candleWeb.transcribe.recording && "
                               "document.querySelector('#segments .segment.partial') !== null",
                               timeout=LIVE_TIMEOUT_MS)
        screenshot(page, "transcribe-live-partial")
        # Until the whole speech is heard and one window has become final.
        page.wait_for_function(f"() => {{ const s = window.candleWeb.transcribe;"
                               f" return s.live.commits >= 1 && s.live.heard >= "
                               f"{fake_microphone['seconds']}; }}", timeout=LIVE_TIMEOUT_MS)
        screenshot(page, "transcribe-live-committed")
        page.click("#stop-record-button")
        page.wait_for_function(f"() => {{ const s = window.candleWeb.transcribe;"
                               f" return !s.busy && !s.recording && s.runs > {runs}; }}",
                               timeout=TRANSCRIBE_TIMEOUT_MS)
    finally:
        page.uncheck("#live-mode")
    state = view_state(page, "({result: s.lastResult, error: s.lastError, history: "
                             "s.live.history, passes: s.live.passes, commits: s.live.commits,"
                             " status: s.clip.status})")
    assert state["error"] is None and state["status"] == "done"
    history = state["history"]
    assert any(entry["partial"] for entry in history)  # words were shown before Stop
    commit = next(entry for entry in history if entry["final"])
    result = state["result"]
    texts = [s["text"] for s in result["segments"] if s["text"].strip()]
    # What a final window kept stays, word for word, at the start of the whole transcript.
    assert texts[:len(commit["final"])] == commit["final"]
    for clip in fake_microphone["clips"]:  # all the speech, in order
        assert_matches_reference(clip["file"], result["text"])
    # The exports cover the whole recording, one cue per segment.
    assert result["exports"]["srt"].count(" --> ") == len(texts)
    assert result["exports"]["txt"].splitlines() == [t.strip() for t in texts]
    assert result["segments"][0]["start"] < fake_microphone["clips"][0]["start"] + 1.0
    assert result["segments"][-1]["end"] >= fake_microphone["clips"][-1]["start"]
    report(f"[ui] live mode: {state['passes']} passes, {state['commits']} windows made final, "
           f"words first shown {history[0]['heard']:.1f} s into the recording; "
           f"{result['text'].strip()!r}")
