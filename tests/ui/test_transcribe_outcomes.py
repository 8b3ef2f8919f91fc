"""Transcriptions that end without a whole transcript, as a person meets them (whisper-tiny.en):

- a recording with no speech (4 s of digital silence) ends "Done: no speech heard in ...",
  its list says so, and no export button is offered (there is nothing to export);
- a transcription cancelled after its first 30 s window keeps the segments it had, and they
  can be exported: the TXT link holds exactly their text, the SRT their times, written by the
  worker's own subtitles module as for a whole transcript.
Real speech: the vendored LibriVox clips, joined into one ~50 s recording.
"""
from __future__ import annotations

import base64
import io
import wave

import pytest
from tests.ui.transcribe_testlib import (MODEL_TINY, SAMPLES_DIR, TRANSCRIBE_TIMEOUT_MS,
                                         choose_model, drop_files, samples_manifest,
                                         view_state, wait_idle_with_clip)

RATE = 16_000
GAP_SECONDS = 0.6


def wav_bytes(frames: bytes) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(RATE)
        wav.writeframes(frames)
    return out.getvalue()


def joined_clips(rounds: int) -> bytes:
    """The vendored 16 kHz clips, `rounds` times over with short gaps: one long recording."""
    frames = []
    for _ in range(rounds):
        for clip in samples_manifest():
            with wave.open(str(SAMPLES_DIR / clip["file"]), "rb") as wav:
                assert (wav.getnchannels(), wav.getsampwidth(), wav.getframerate()) == (1, 2, RATE)
                frames.append(wav.readframes(wav.getnframes()))
            frames.append(b"\0\0" * int(GAP_SECONDS * RATE))
    return wav_bytes(b"".join(frames))


@pytest.fixture
def page(module_page, model_cache_left_as_found):
    page = module_page
    page.click("#tab-transcribe")
    choose_model(page, MODEL_TINY)
    return page


def exports_shown(page) -> bool:
    return page.locator("#exports").is_visible()


def link_text(page, format_: str) -> str:
    return page.evaluate("""async (id) => {
        const href = document.getElementById(id).href;
        return await (await fetch(href)).text();
    }""", f"download-{format_}")


def test_no_speech_is_said_and_offers_no_export(page):
    drop_files(page, [("quiet.wav", wav_bytes(b"\0\0" * 4 * RATE), "audio/wav")])
    wait_idle_with_clip(page, "quiet.wav")
    runs = view_state(page, "s.runs")
    page.click("#transcribe-button")
    page.wait_for_function("(runs) => window.candleWeb.transcribe.runs > runs", arg=runs,
                           timeout=TRANSCRIBE_TIMEOUT_MS)
    assert page.text_content("#job-phase") == "Done: no speech heard in quiet.wav (4.00 s of audio)."
    assert page.inner_text("#segments") == "No speech heard in this recording."
    assert not exports_shown(page)
    label = page.evaluate("""() => Array.from(document.querySelectorAll('#clip-queue .queue-item'))
        .find((row) => row.textContent.includes('quiet.wav'))?.querySelector('.queue-status')
        ?.textContent ?? null""")
    assert label in (None, "4.00 s · Done · no speech heard")  # the list shows from 2 entries


def test_a_cancelled_transcription_keeps_and_exports_its_segments(page):
    drop_files(page, [("joined.wav", joined_clips(2), "audio/wav")])
    wait_idle_with_clip(page, "joined.wav")
    seconds = view_state(page, "s.clip.seconds")
    assert seconds > 40  # two 30 s windows at least
    page.click("#transcribe-button")
    # The first window's segments are in; Cancel in the second window.
    page.wait_for_function("""() => { const s = window.candleWeb.transcribe;
        return s.busy && s.streamed.segments >= 2 && s.streamed.windows >= 2; }""",
                           timeout=TRANSCRIBE_TIMEOUT_MS)
    page.click("#cancel-button")
    page.wait_for_function("() => window.candleWeb.transcribe.clip.status === 'cancelled'"
                           " && window.candleWeb.transcribe.clip.result !== null",
                           timeout=TRANSCRIBE_TIMEOUT_MS)
    kept = view_state(page, "s.clip.segments.filter((x) => x.text.trim())"
                            ".map((x) => ({start: x.start, end: x.end, text: x.text}))")
    assert len(kept) >= 2 and kept[-1]["end"] <= seconds
    phase = page.text_content("#job-phase")
    assert phase.startswith("Cancelled joined.wav at ")
    assert f"The {len(kept)} segments before it are kept: export them below." in phase
    assert exports_shown(page)
    assert page.get_attribute("#download-txt", "download") == "joined-partial.txt"
    assert page.get_attribute("#download-txt", "aria-label") == \
        f"Download the {len(kept)} kept segments of joined.wav as TXT"
    assert link_text(page, "txt") == "".join(s["text"].strip() + "\n" for s in kept)
    srt = link_text(page, "srt")
    assert srt.count(" --> ") == len(kept)
    assert srt.startswith("1\n")
    # The shown transcript is the kept one, and the stats (no timings for it) are hidden.
    assert page.locator("#segments li.segment").count() == len(kept)
    assert page.locator("#stats").is_hidden()


def test_time_left_counts_windows_not_seconds_of_audio(ready_page):
    """The issue's 60.64 s file: two 30 s windows took 10 s each, then the 0.64 s tail window
    (a window's work: the encoder reads it padded to 30 s, the decoder writes up to ~450
    tokens). Seconds of audio set the pace only until a window has ended."""
    left = ready_page.evaluate("""async () => {
        const { WindowClock } = await import('./transcribe/time_left.js');
        const clock = new WindowClock();
        const total = 60.64;
        const at = (now, reached) => clock.left(now, reached, total);
        const seen = {};
        clock.window(0, 0);
        seen.firstWindow = at(4000, 0);           // nothing measured yet
        seen.firstSegments = at(8000, 20);        // 20 s of audio in 8 s: the audio pace
        clock.window(30, 10000);
        seen.secondWindow = at(12000, 30);
        clock.window(60, 20000);
        seen.tailStarts = at(20000, 60);
        seen.tailHalfway = at(25000, 60);
        seen.tailOverdue = at(36000, 60);
        return seen;
    }""")
    assert left["firstWindow"] == {"seconds": None, "finishing": False}
    assert left["firstSegments"]["seconds"] == pytest.approx(8 / 20 * 40.64)
    # One window (10 s) after this one, and 8 s of this one.
    assert left["secondWindow"] == {"seconds": pytest.approx(18.0), "finishing": False}
    # The tail window is a whole window's time, not 0.64 s of audio at the audio pace (0.26 s).
    assert left["tailStarts"] == {"seconds": pytest.approx(10.0), "finishing": False}
    assert left["tailHalfway"] == {"seconds": pytest.approx(5.0), "finishing": False}
    assert left["tailOverdue"] == {"seconds": 0, "finishing": True}
