"""Word timestamps in the Transcribe view (issue 26): the words come from the worker as the
native pipeline computes them, each word is shown on its own, a click on a word plays from its
start, and the word at the player's position is the highlighted one.

The words are checked against openai-whisper's `transcribe(word_timestamps=True)` on the same
weights (tests/reference/whisper_words_reference.json), with the issue's bar: the same words,
starts and ends within 0.04 s (two encoder frames) for at least 95% of them.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.ui.transcribe_testlib import drop_files, run_to_end, sample_file, screenshot, wait_idle_with_clip

pytestmark = pytest.mark.ui

CLIP = "sense_and_sensibility_01_austen_64kb-0890.wav"
REFERENCE = Path(__file__).resolve().parent.parent / "reference" / "whisper_words_reference.json"
FRAME_TOLERANCE_S = 0.04
SEEK_TOLERANCE_S = 1e-3  # the media clock's rounding (see test_transcribe_long)


def test_words_are_shown_highlighted_and_clickable(ready_page, report):
    page = ready_page
    page.locator("#advanced-options summary").click()
    page.check("#word-timestamps")
    drop_files(page, [sample_file(CLIP)])
    wait_idle_with_clip(page, CLIP)
    state = run_to_end(page)
    words = [w for s in state["result"]["segments"] for w in s.get("words", [])]
    reference = json.loads(REFERENCE.read_text())["whisper-tiny.en"]["clips"][f"librivox/{CLIP}"]
    theirs = [w for s in reference for w in s["words"]]
    assert [w["word"] for w in words] == [w["word"] for w in theirs]
    close = [abs(a["start"] - b["start"]) <= FRAME_TOLERANCE_S + 1e-9
             and abs(a["end"] - b["end"]) <= FRAME_TOLERANCE_S + 1e-9 for a, b in zip(words, theirs)]
    assert sum(close) >= 0.95 * len(words)
    report(f"[ui] word timestamps: {len(words)} words, {sum(close)} within 0.04 s of openai-whisper")

    spans = page.locator("#segments span.word")
    assert spans.count() == len(words)
    assert page.locator("#segments span.word.playing").count() == 0  # nothing played yet
    target = 4
    page.evaluate("""() => { const player = document.getElementById('clip-player');
        window.wordSeek = {to: null, playing: null};
        player.addEventListener('seeking', () => { window.wordSeek.to = player.currentTime; },
                                {once: true});
        player.addEventListener('seeked', () => {
            const words = [...document.querySelectorAll('#segments span.word')];
            window.wordSeek.playing = words.findIndex((w) => w.classList.contains('playing'));
            player.pause(); }, {once: true}); }""")
    spans.nth(target).click()
    page.wait_for_function("() => window.wordSeek.playing !== null")
    seek = page.evaluate("() => window.wordSeek")
    assert seek["to"] == pytest.approx(words[target]["start"], abs=SEEK_TOLERANCE_S)
    assert seek["playing"] == target
    assert page.locator("#segments span.word.playing").count() <= 1
    screenshot(page, "transcribe-word-playing")
    # The exports carry the words too: JSON per word, SRT cues from the words' times.
    exports = state["result"]["exports"]
    exported = [w for s in json.loads(exports["json"])["segments"] for w in s.get("words", [])]
    assert [w["word"] for w in exported] == [w["word"] for w in words]


def test_skip_silence_loads_silero_vad_and_keeps_the_times(ready_page, tmp_path, report):
    """Skip silence: the page loads Silero VAD beside Whisper (1.2 MB, once), and a clip with
    6 s of silence before and after it gives the clip's words at the clip's place."""
    import subprocess

    from tests.ui.transcribe_testlib import SAMPLES_DIR, assert_matches_reference, tool

    page = ready_page
    clip = "sense_and_sensibility_01_austen_64kb-0880.wav"
    sox = tool("sox")
    silence = tmp_path / "silence.wav"
    subprocess.run([sox, "-n", "-r", "16000", "-c", "1", "-b", "16", str(silence), "trim", "0", "6"],
                   check=True)
    padded = tmp_path / "padded.wav"
    subprocess.run([sox, str(silence), str(SAMPLES_DIR / clip), str(silence), str(padded)], check=True)
    if not page.locator("#advanced-options").evaluate("(d) => d.open"):
        page.locator("#advanced-options summary").click()
    page.check("#vad")
    page.uncheck("#word-timestamps")
    drop_files(page, [("padded.wav", padded.read_bytes(), "audio/wav")])
    wait_idle_with_clip(page, "padded.wav")
    state = run_to_end(page)
    page.uncheck("#vad")
    assert page.evaluate("() => window.candleWeb.transcribe.vadLoaded") is True
    result = state["result"]
    assert_matches_reference(clip, result["text"])
    spoken = [s for s in result["segments"] if s["text"].strip()]
    clip_seconds = float(subprocess.run([tool("soxi"), "-D", str(SAMPLES_DIR / clip)], check=True,
                                        capture_output=True, text=True).stdout)
    assert all(6.0 - 0.5 <= s["start"] and s["end"] <= 6.0 + clip_seconds + 0.5 for s in spoken)
    report(f"[ui] skip silence: {result['timings']['windows']} window(s), segments "
           f"{[(s['start'], s['end']) for s in spoken]} for speech at 6.0-{6.0 + clip_seconds:.2f} s")
