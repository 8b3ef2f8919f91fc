"""Long audio (> 60 s) through the 30 s window seek loop, and the subtitle formats."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from candle_web.pipelines import subtitles
from candle_web.pipelines.transcribe import TranscribeOptions, transcribe

SILENCE_S = 6.0  # also exercises windows that start in silence
SRT_TIME = r"(\d\d):(\d\d):(\d\d),(\d\d\d)"
VTT_TIME = r"(\d\d):(\d\d):(\d\d)\.(\d\d\d)"


@pytest.fixture(scope="module")
def long_clip(speech_clips):
    """All test clips joined with 6 s of silence: ~72 s, with known speech intervals."""
    pieces, spans, cursor = [], [], 0.0
    silence = np.zeros(int(SILENCE_S * 16000), dtype=np.float32)
    for name in sorted(speech_clips):
        samples = speech_clips[name]
        pieces += [samples, silence]
        spans.append((cursor, cursor + len(samples) / 16000))
        cursor += (len(samples) + len(silence)) / 16000
    return np.concatenate(pieces), spans


@pytest.fixture(scope="module")
def long_transcript(long_clip, whisper_models):
    model, tokenizer = whisper_models("whisper-tiny.en")
    samples, _ = long_clip
    events = []
    result = transcribe(model, tokenizer, samples, TranscribeOptions(),
                        on_event=lambda kind, payload: events.append(kind))
    return result, events


def test_long_audio_segments_are_monotonic_and_cover_the_speech(long_clip, long_transcript):
    samples, spans = long_clip
    result, events = long_transcript
    duration = len(samples) / 16000
    assert duration > 60
    segments = [s for s in result.segments if s.text.strip()]
    assert len(segments) >= len(spans)
    for previous, current in zip(segments, segments[1:]):
        assert current.start >= previous.start
        assert current.start >= previous.end - 0.5  # at most a small overlap at window edges
    for segment in segments:
        assert 0 <= segment.start <= segment.end <= duration + 0.5
    # Every speech span overlaps at least one segment; the windows advanced past 30 s twice.
    for start, end in spans:
        assert any(s.start < end and s.end > start for s in segments), (start, end)
    assert events.count("window") >= 3
    assert "john dashwood" in result.text.lower()


def _parse_times(text, pattern):
    found = []
    for match in re.finditer(pattern + r" --> " + pattern, text):
        h1, m1, s1, ms1, h2, m2, s2, ms2 = (int(g) for g in match.groups())
        found.append((h1 * 3600 + m1 * 60 + s1 + ms1 / 1000, h2 * 3600 + m2 * 60 + s2 + ms2 / 1000))
    return found


def test_srt_parses_back_to_the_segments(long_transcript):
    result, _ = long_transcript
    srt = subtitles.render(result, "srt")
    blocks = [b for b in srt.strip().split("\n\n") if b.strip()]
    cues = [s for s in result.segments if s.text.strip()]
    assert len(blocks) == len(cues)
    for number, (block, segment) in enumerate(zip(blocks, cues), start=1):
        lines = block.split("\n")
        assert lines[0] == str(number)
        (start, end), = _parse_times(lines[1], SRT_TIME)
        assert abs(start - segment.start) < 1e-3 and abs(end - segment.end) < 1e-3
        assert " ".join(lines[2:]) == segment.text.strip()


def test_vtt_and_json_and_txt(long_transcript):
    result, _ = long_transcript
    vtt = subtitles.render(result, "vtt")
    assert vtt.startswith("WEBVTT\n")
    times = _parse_times(vtt, VTT_TIME)
    assert len(times) == len([s for s in result.segments if s.text.strip()])
    assert all(a <= b for a, b in times)
    payload = json.loads(subtitles.render(result, "json"))
    assert payload["text"] == result.text and len(payload["segments"]) == len(result.segments)
    assert subtitles.render(result, "txt").count("\n") == len(times)
    with pytest.raises(ValueError, match="unknown output format"):
        subtitles.render(result, "doc")


# -- parity with openai-whisper's transcribe() on the same recording ----------------------------
# tests/reference/whisper_words_reference.json holds openai-whisper's transcribe() of this very
# recording (record_whisper_words.long_recording: the clips in name order, each followed by 6 s of
# silence) on candle-web's weights, greedy (temperature 0), with its default thresholds.
WORDS_REFERENCE = Path(__file__).resolve().parent.parent / "reference" / "whisper_words_reference.json"


@pytest.fixture(scope="module")
def openai_long():
    return json.loads(WORDS_REFERENCE.read_text())


@pytest.mark.parametrize("name, words", [("whisper-tiny.en", False), ("whisper-tiny.en", True),
                                         ("whisper-base", False)],
                         ids=["tiny.en", "tiny.en-word-timestamps", "base"])
def test_long_recording_equals_openai_whisper_transcribe(name, words, long_clip, whisper_models,
                                                         openai_long):
    """Every window, the last partial one included (its mel clipped to the content frames and
    padded, as transcribe() does), gives openai-whisper's segments; with word timestamps the
    seek moves to the last word's end as it does there, and the text still matches."""
    model, tokenizer = whisper_models(name)
    samples, _ = long_clip
    language = "en" if model.config.is_multilingual else None
    result = transcribe(model, tokenizer, samples, TranscribeOptions(
        temperatures=(0.0,), word_timestamps=words, language=language))
    reference = openai_long[name]["long_words" if words else "long"]
    assert result.text == reference["text"]
    ours = [s for s in result.segments if s.text]
    theirs = [s for s in reference["segments"] if s["text"]]
    assert [s.text for s in ours] == [s["text"] for s in theirs]
    if not words:  # times straight from timestamp tokens: equal to the rounding
        assert [s.tokens for s in ours] == [s["tokens"] for s in theirs]
        for a, b in zip(ours, theirs):
            assert abs(a.start - b["start"]) < 1e-3 and abs(a.end - b["end"]) < 1e-3


def test_cli_long_form_options_have_openai_whisper_defaults():
    from candle_web import cli
    from candle_web.pipelines.transcribe import options_from_args

    parser = cli.build_parser()
    options = options_from_args(parser.parse_args(["transcribe", "x.wav"]))
    assert options.temperatures == (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
    assert (options.compression_ratio_threshold, options.logprob_threshold,
            options.no_speech_threshold, options.condition_on_previous_text) == (2.4, -1.0, 0.6, True)
    assert options.word_timestamps is False and options.vad is None
    options = options_from_args(parser.parse_args([
        "transcribe", "x.wav", "--temperature", "0.2", "--temperature-increment-on-fallback", "0.4",
        "--condition-on-previous-text", "False", "--logprob-threshold", "none",
        "--no-speech-threshold", "None", "--compression-ratio-threshold", "1.8"]))
    assert options.temperatures == (0.2, 0.6, 1.0)
    assert (options.condition_on_previous_text, options.logprob_threshold,
            options.no_speech_threshold, options.compression_ratio_threshold) == (False, None, None, 1.8)
    no_retry = parser.parse_args(["transcribe", "x.wav", "--temperature-increment-on-fallback", "none"])
    assert options_from_args(no_retry).temperatures == (0.0,)
    with pytest.raises(SystemExit):
        parser.parse_args(["transcribe", "x.wav", "--condition-on-previous-text", "maybe"])
