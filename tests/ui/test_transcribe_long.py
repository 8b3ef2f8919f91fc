"""Long audio in the Transcribe view, and audio you can follow.

A 10-minute recording made with sox from the test speech (the six vendored clips with a second
of silence after each, repeated and cut at 600 s) is transcribed in the page: segments stream
in, the status line says how many minutes of the ten are done and estimates the time left, and
Cancel stops it within the window being worked on. The full ten minutes take many minutes in
Pyodide, so this test stops early, in its second window (what it must show is the progress and the
cancel); `CANDLE_WEB_MEASURE_LONG=1` adds the whole run as a measurement (time, real-time factor
and the worker's heap at the start, after the first window and at the end).

Then the transcript and the player are linked: clicking a segment of a transcript seeks the
audio to the segment's start, and the segment being played is the highlighted one (on one round
of the clips, ~34 s, transcribed by that test itself: it needs no earlier test's transcript).
"""
from __future__ import annotations

import os
import re

import pytest
from tests.ui.transcribe_testlib import (MODEL_TINY, SAMPLES_DIR, assert_matches_reference,
                                         choose_model, run_to_end, run_tool, screenshot, tool,
                                         view_state, wait_idle_with_clip)

pytestmark = pytest.mark.ui

LONG_SECONDS = 600
ROUND = ("sense_and_sensibility_01_austen_64kb-0870.wav",
         "sense_and_sensibility_01_austen_64kb-0880.wav",
         "sense_and_sensibility_01_austen_64kb-0890.wav",
         "sense_and_sensibility_01_austen_64kb-0920.wav",
         "sense_and_sensibility_01_austen_64kb-0930.wav",
         "goforward.wav")
WINDOWS_BEFORE_CANCEL = 1
WINDOW_TIMEOUT_MS = 600_000  # two 30 s windows of speech: encoder + ~100 decoder steps each
# A media element seeks to the time it is given (HTML: during `seeking` the current position
# is the one set); reading it back can differ only by the media clock's rounding (~1e-6 s).
SEEK_TOLERANCE_S = 1e-3
MEASURE = os.environ.get("CANDLE_WEB_MEASURE_LONG") == "1"
PROGRESS_LINE = re.compile(r"(?P<done>\d+\.\d) of 10\.0 min transcribed · about (?P<left>\d+) "
                           r"(?P<unit>min|s) left — window \d+:\d\d\.\d\d–\d+:\d\d\.\d\d: ")


@pytest.fixture(scope="module")
def one_round(tmp_path_factory):
    """round.wav: the ROUND clips, each followed by 1 s of silence (~34 s: two windows)."""
    sox = tool("sox")
    folder = tmp_path_factory.mktemp("round")
    silence = folder / "silence.wav"
    run_tool(sox, "-n", "-r", "16000", "-c", "1", "-b", "16", str(silence), "trim", "0", "1")
    path = folder / "round.wav"
    parts = [str(path) for name in ROUND for path in (SAMPLES_DIR / name, silence)]
    run_tool(sox, *parts, str(path))
    return path


@pytest.fixture(scope="module")
def long_file(tmp_path_factory, one_round):
    """ten_minutes.wav: one_round repeated, cut at 600 s."""
    long = tmp_path_factory.mktemp("long") / "ten_minutes.wav"
    run_tool(tool("sox"), str(one_round), str(long), "repeat", "20", "trim", "0", str(LONG_SECONDS))
    return long


def test_ten_minutes_stream_with_progress_and_cancel_within_a_window(ready_page, long_file,
                                                                    report):
    page = ready_page
    choose_model(page, MODEL_TINY)
    page.set_input_files("#file-input", str(long_file))
    wait_idle_with_clip(page, long_file.name)
    assert view_state(page, "s.clip.seconds") == LONG_SECONDS
    page.click("#transcribe-button")

    # A window done: the next has begun.
    page.wait_for_function(f"() => window.candleWeb.transcribe.streamed.windows > "
                           f"{WINDOWS_BEFORE_CANCEL}", timeout=WINDOW_TIMEOUT_MS)
    mid = view_state(page, """({progress: {...s.progress}, heap: {...s.heap},
        segments: s.clip.segments.filter((g) => g.text.trim()).map((g) => g.text),
        phase: document.getElementById('job-phase').textContent,
        bar: document.getElementById('job-progress').value})""")
    progress = mid["progress"]
    assert progress["totalSeconds"] == LONG_SECONDS
    assert 0 < progress["doneSeconds"] < LONG_SECONDS and progress["leftSeconds"] > 0
    # "2.5 of 10.0 min transcribed · about 6 min left — window 2:30–3:00: ...": the numbers
    # are the view's own, rounded to what is shown (a tenth of a minute, a minute or second).
    shown = PROGRESS_LINE.match(mid["phase"])
    assert shown, mid["phase"]
    assert float(shown["done"]) * 60 == pytest.approx(progress["doneSeconds"], abs=3.0)
    unit = 60 if shown["unit"] == "min" else 1
    assert int(shown["left"]) * unit == pytest.approx(progress["leftSeconds"], abs=unit / 2 + 1e-9)
    assert mid["bar"] == pytest.approx(progress["doneSeconds"] / LONG_SECONDS, abs=1e-6)
    # Segments streamed in as the windows were done: real text, the recording's first clip first.
    assert len(mid["segments"]) >= 2
    assert_matches_reference(ROUND[0], mid["segments"][0])
    assert page.locator("#segments .segment").count() == len(mid["segments"])
    screenshot(page, "transcribe-long-progress")

    # Counted in the same task as the click: with page.click's round trips between a separate
    # count and the click, windows that began in between were charged to the cancel (a fresh
    # clone at load 4-5 saw 2 where 1 is allowed). The Cancel button is enabled while busy.
    windows_at_cancel = page.evaluate("""() => {
        const windows = window.candleWeb.transcribe.streamed.windows;
        document.getElementById('cancel-button').click();
        return windows;
    }""")
    page.wait_for_function("() => !window.candleWeb.transcribe.busy", timeout=WINDOW_TIMEOUT_MS)
    after = view_state(page, "({error: s.lastError, windows: s.streamed.windows, status: "
                             "s.clip.status, kept: s.clip.segments.length, heap: {...s.heap},"
                             " phase: document.getElementById('job-phase').textContent})")
    assert after["error"]["name"] == "Cancelled"
    # Stopped within the window it was in: at most the one that began as Cancel was pressed.
    assert after["windows"] <= windows_at_cancel + 1
    assert after["status"] == "cancelled"
    assert after["kept"] >= len(mid["segments"])  # the transcript so far stays
    assert after["phase"].startswith(f"Cancelled {long_file.name} at ")
    assert page.locator("#job").get_attribute("data-state") == "cancelled"
    heap = after["heap"]
    report(f"[ui] 10-minute file: cancelled after {after['windows']} windows at "
           f"{progress['doneSeconds']:.1f} s; worker heap {heap['firstWindowBytes'] / 1e6:.0f} MB "
           f"at the first window, {heap['lastBytes'] / 1e6:.0f} MB at the last event")


def test_a_clicked_segment_seeks_the_player_and_the_playing_one_is_highlighted(ready_page,
                                                                              one_round):
    page = ready_page
    choose_model(page, MODEL_TINY)
    page.set_input_files("#file-input", str(one_round))
    wait_idle_with_clip(page, one_round.name)
    state = run_to_end(page, WINDOW_TIMEOUT_MS)
    spoken = [s for s in state["result"]["segments"] if s["text"].strip()]
    rows = page.evaluate("""() => [...document.querySelectorAll('#segments li.segment')]
        .map((li) => ({start: Number(li.dataset.start), end: Number(li.dataset.end)}))""")
    assert len(rows) == len(spoken) >= 4, spoken  # a segment to click and a later one to play
    assert page.locator("#segments li.playing").count() == 0  # nothing played yet
    target = 2
    # The click seeks, then plays on: the position the seek goes to, and where it plays from.
    page.evaluate("""() => { const player = document.getElementById('clip-player');
        window.seek = {to: null, landed: null};
        player.addEventListener('seeking', () => { window.seek.to = player.currentTime; },
                                {once: true});
        player.addEventListener('seeked', () => { window.seek.landed = player.currentTime; },
                                {once: true}); }""")
    page.locator("#segments li.segment").nth(target).locator(".segment-text").click()
    page.wait_for_function("() => window.seek.landed !== null")
    seek = page.evaluate("() => window.seek")
    assert seek["to"] == pytest.approx(rows[target]["start"], abs=SEEK_TOLERANCE_S)
    # Playback may have moved on a few ms by the time `seeked` is handled: still this segment.
    assert rows[target]["start"] - SEEK_TOLERANCE_S <= seek["landed"] < rows[target]["end"]
    highlighted = page.locator("#segments li.playing")
    assert highlighted.count() == 1
    assert highlighted.get_attribute("aria-current") == "true"
    assert page.evaluate("() => [...document.querySelectorAll('#segments li.segment')]"
                         ".findIndex((li) => li.classList.contains('playing'))") == target
    screenshot(page, "transcribe-follow-seek")

    # While it plays, the highlight moves on: start just before the next segment.
    following = next(index for index in range(target + 1, len(rows))
                     if rows[index]["start"] >= rows[target]["end"])
    page.evaluate("""(at) => { const player = document.getElementById('clip-player');
        player.currentTime = at; return player.play(); }""", rows[following]["start"] - 0.4)
    page.wait_for_function(
        """(index) => { const li = document.querySelectorAll('#segments li.segment')[index];
            return li.classList.contains('playing')
                && !document.getElementById('clip-player').paused; }""",
        arg=following, timeout=15_000)
    playing = page.evaluate("() => document.getElementById('clip-player').currentTime")
    assert rows[following]["start"] <= playing < rows[following]["end"]
    assert page.locator("#segments li.playing").count() == 1
    screenshot(page, "transcribe-follow-playing")
    page.evaluate("() => document.getElementById('clip-player').pause()")


@pytest.mark.skipif(not MEASURE, reason="the whole 10 minutes: a measurement, "
                                        "CANDLE_WEB_MEASURE_LONG=1 runs it")
def test_measure_the_whole_ten_minutes(ready_page, long_file, report):
    page = ready_page
    choose_model(page, MODEL_TINY)
    page.set_input_files("#file-input", str(long_file))
    wait_idle_with_clip(page, long_file.name)
    runs = view_state(page, "s.runs")
    page.click("#transcribe-button")
    page.wait_for_function(f"() => !window.candleWeb.transcribe.busy && "
                           f"window.candleWeb.transcribe.runs > {runs}",
                           timeout=LONG_SECONDS * 20 * 1000)
    state = view_state(page, "({result: s.lastResult, heap: {...s.heap}, error: s.lastError})")
    assert state["error"] is None
    result, heap = state["result"], state["heap"]
    timings = result["timings"]
    segments = [s for s in result["segments"] if s["text"].strip()]
    assert segments[-1]["end"] > LONG_SECONDS - 60  # to the end of the recording
    words_total = len(re.findall(r"\w+", result["text"]))
    report(f"[ui] MEASURE 10-minute file: {timings['audioSeconds']:.0f} s of audio in "
           f"{timings['elapsedMs'] / 1000:.0f} s (RTF {timings['rtf']:.2f}; encoder "
           f"{timings['encodeMs'] / 1000:.0f} s, decoder {timings['decodeMs'] / 1000:.0f} s, "
           f"{timings['windows']} windows, {len(segments)} segments, {words_total} words); "
           f"worker heap at start {heap['startBytes'] / 1e6:.0f} MB, after the first window "
           f"{heap['firstWindowBytes'] / 1e6:.0f} MB, at the end {heap['endBytes'] / 1e6:.0f} MB; "
           f"at the start of windows 1, 3, {len(heap['windows']) // 2 + 1} and "
           f"{len(heap['windows'])}: "
           + ", ".join(f"{heap['windows'][i] / 1e6:.0f}" for i in
                       (0, min(2, len(heap["windows"]) - 1), len(heap["windows"]) // 2, -1))
           + " MB")
    screenshot(page, "transcribe-long-done")
