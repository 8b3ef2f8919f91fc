"""The live-transcription policy (pipelines/transcribe.py) on recorded speech: three LibriVox
clips with silences between them (the recording the UI tests' fake microphone plays), heard
3 s more at a time as a microphone would deliver it, transcribed by the real whisper-tiny.en.

Independent references: the clips' LibriVox transcripts (the words of the whole recording), and
pipelines.transcribe.transcribe run directly on the very samples of a pass with the prompt the
policy must have given it (a pass must decode exactly that, only placed in the recording)."""
from __future__ import annotations

import re

import numpy as np
import pytest

from candle_web import hub
from candle_web.core.errors import FormatError
from candle_web.pipelines import transcribe as live_mod
from candle_web.pipelines.transcribe import LiveTranscriber

MODEL = "whisper-tiny.en"
# (seconds of silence | clip file), the UI tests' FAKE_MICROPHONE
RECORDING = (1.0, "sense_and_sensibility_01_austen_64kb-0870.wav", 1.0,
             "sense_and_sensibility_01_austen_64kb-0920.wav", 1.0,
             "sense_and_sensibility_01_austen_64kb-0890.wav", 2.0)
RATE = live_mod.SAMPLE_RATE


def speech_dir():
    directory = hub.cache_dir() / "testdata" / "speech" / "librivox"
    if not (directory / "transcription").is_file():
        pytest.fail(f"{directory} lacks the LibriVox clips: run `make test` "
                    "(scripts/fetch_test_audio.sh)")
    return directory


def references() -> dict:
    """clip stem -> its LibriVox transcript."""
    lines = (speech_dir() / "transcription").read_text().splitlines()
    found = (re.match(r"<s> (.*) </s> \((.*)\)", line) for line in lines)
    return {m.group(2): m.group(1) for m in found if m}


def words(text: str) -> list:
    return re.findall(r"[a-z0-9']+", text.lower())


def words_found_in_order(expected: list, got: list) -> int:
    position, found = 0, 0
    for word in expected:
        if word in got[position:]:
            position = got.index(word, position) + 1
            found += 1
    return found


@pytest.fixture(scope="module")
def recording():
    """(samples, [(clip stem, start s, end s)])."""
    from candle_web.io.audio import load_audio

    parts, clips, position = [], [], 0
    for part in RECORDING:
        if isinstance(part, float):
            chunk = np.zeros(int(part * RATE), dtype=np.float32)
        else:
            chunk = load_audio(str(speech_dir() / part)).astype(np.float32)
            clips.append((part[:-4], position / RATE, (position + chunk.size) / RATE))
        parts.append(chunk)
        position += chunk.size
    return np.concatenate(parts), clips


@pytest.fixture(scope="module")
def whisper(model_file):
    from candle_web.pipelines import load_whisper

    loaded = load_whisper(model_file(MODEL, "model.bin").parent)
    return loaded.model, loaded.tokenizer


def heard_in_steps(live, samples):
    """Drives `live` the way the page does: wait for next_pass_at() seconds, then hand over the
    recording from the open window's start. Returns the passes (None where one was skipped)."""
    passes = []
    while live.next_pass_at() * RATE <= samples.size:
        heard = samples[:int(live.next_pass_at() * RATE)]
        start = int(round(live.window_start * RATE))
        passes.append(live.step(heard[start:], start / RATE))
    return passes


@pytest.fixture(scope="module")
def session(whisper, recording):
    """The live run over the whole recording: its passes, the transcriber, the final transcript
    and the samples each pass read (recorded through a wrapper around the model's encode)."""
    model, tokenizer = whisper
    samples, _ = recording
    live = LiveTranscriber(model, tokenizer)
    seen = []
    original = live_mod.transcribe_placed

    def recording_placed(model_, tokenizer_, window, options=None, offset=0.0, prior=(),
                         on_event=None):
        seen.append((np.array(window), options, offset))
        return original(model_, tokenizer_, window, options, offset, prior, on_event)

    live_mod.transcribe_placed = recording_placed
    try:
        passes = heard_in_steps(live, samples)
        start = int(round(live.window_start * RATE))
        final = live.finish(samples[start:], start / RATE)
    finally:
        live_mod.transcribe_placed = original
    return passes, live, final, seen


def test_passes_follow_the_speaker_and_windows_become_final_at_12_s(session, recording):
    passes, live, _, seen = session
    samples, _ = recording
    ran = [p for p in passes if p is not None]
    assert ran and len(ran) == live.passes - 1  # finish() is the last pass
    # Every pass read one open window: from its start, at most 30 s, ending where heard ended.
    for done in ran:
        assert done.window_end <= done.heard + 1e-9
    for (window, _, offset), done in zip(seen, ran):
        assert window.size <= live_mod.WINDOW_SECONDS * RATE
        assert offset + window.size / RATE == pytest.approx(done.window_end)
    # A window is final exactly when it reached 12 s; then the next starts at its last kept
    # segment's successor (the segment redone) or at its end.
    for (window, _, offset), done in zip(seen, ran):
        assert done.committed == (window.size / RATE >= live_mod.LIVE_WINDOW_SECONDS)
    commits = [i for i, done in enumerate(ran) if done.committed]
    assert commits and live.commits == len(commits)
    first = ran[commits[0]]
    assert first.final and all(s.text.strip() for s in first.final)
    following = seen[commits[0] + 1][2]  # where the pass after the first commit started
    redone = first.partial[0].start if first.partial else first.window_end
    assert following == pytest.approx(redone)
    assert following < first.window_end  # the cut segment is heard again, not lost


def test_kept_segments_stay_word_for_word_and_the_whole_speech_is_there(session, recording):
    passes, live, final, _ = session
    _, clips = recording
    kept = [s.text for s in next(p for p in passes if p is not None and p.committed).final]
    texts = [s.text for s in final.segments if s.text.strip()]
    assert texts[:len(kept)] == kept
    assert [s.id for s in final.segments] == list(range(len(final.segments)))
    starts = [s.start for s in final.segments]
    assert starts == sorted(starts)
    expected = references()
    for stem, _, _ in clips:  # every clip's words, in order (tiny.en spells some its own way)
        reference = words(expected[stem])
        assert words_found_in_order(reference, words(final.text)) >= 0.75 * len(reference), \
            (stem, final.text)
    assert final.segments[0].start < clips[0][1] + 1.0
    assert final.segments[-1].end >= clips[-1][1]
    assert live.partial == []


def test_a_pass_decodes_its_window_with_the_kept_text_as_prompt(session, whisper):
    """Reference: pipelines.transcribe.transcribe on the same samples with the prompt the policy
    promises (the last PROMPT_CHARACTERS of the kept text), placed by hand."""
    from dataclasses import replace

    from candle_web.pipelines.transcribe import TranscribeOptions, transcribe

    passes, _, _, seen = session
    model, tokenizer = whisper
    ran = [p for p in passes if p is not None]
    index = next(i for i, done in enumerate(ran) if done.committed) + 1
    kept = "".join(s.text for s in ran[index - 1].final).strip()
    window, options, offset = seen[index]
    assert options.initial_prompt == kept[-live_mod.PROMPT_CHARACTERS:]
    direct = transcribe(model, tokenizer, window,
                        replace(TranscribeOptions(), initial_prompt=options.initial_prompt))
    got = ran[index].transcript
    assert [s.tokens for s in got.segments] == [s.tokens for s in direct.segments]
    assert [s.start for s in got.segments] == pytest.approx(
        [s.start + offset for s in direct.segments], abs=1e-3)
    # The first pass had nothing kept: no prompt.
    assert seen[0][1].initial_prompt is None


def test_too_little_new_audio_is_no_pass_and_a_late_start_is_refused(whisper):
    model, tokenizer = whisper
    live = LiveTranscriber(model, tokenizer)
    assert live.next_pass_at() == live_mod.LIVE_STEP_SECONDS
    quiet = np.zeros(int(0.4 * RATE), dtype=np.float32)
    assert live.step(quiet, 0.0) is None
    assert live.passes == 0 and live.heard == pytest.approx(0.4)
    live.window_start = 5.0
    with pytest.raises(FormatError, match="after the open window"):
        live.step(np.zeros(RATE, dtype=np.float32), 6.0)
    with pytest.raises(FormatError, match="mono"):
        live.step(np.zeros((2, RATE), dtype=np.float32), 0.0)
