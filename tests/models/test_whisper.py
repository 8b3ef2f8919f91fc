"""Whisper on real weights and real speech: token ids equal to openai-whisper's.

The reference ids were recorded by tests/reference/record_whisper.py from openai-whisper
(PyTorch, its own log-mel and tiktoken tokenizer) running the same CTranslate2 weights.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from candle_web.pipelines.transcribe import TranscribeOptions, transcribe

GREEDY = TranscribeOptions(temperatures=(0.0,))
MODELS = ["whisper-tiny.en", "whisper-base"]


def _segment_tokens(transcript):
    return [s.tokens for s in transcript.segments if s.tokens]


@pytest.fixture(scope="module")
def greedy_transcripts(whisper_models, speech_clips):
    """(model name, clip, backend) -> greedy Transcript, computed once for the tests below."""
    done = {}

    def get(model_name, clip, backend=None):
        from candle_web import Device

        backend = backend or Device.cpu().backend.name  # the default, named: one cache entry
        if (model_name, clip, backend) not in done:
            model, tokenizer = whisper_models(model_name, backend)
            language = "en" if model.config.is_multilingual else None
            options = TranscribeOptions(temperatures=(0.0,), language=language)
            done[model_name, clip, backend] = transcribe(model, tokenizer, speech_clips[clip], options)
        return done[model_name, clip, backend]

    return get


def available_cpu_backends():
    """The CPU backends this machine can run (numpy always; numba with the native extra)."""
    from candle_web import BackendUnavailable, Device

    names = []
    for name in ("numpy", "numba"):
        try:
            Device.cpu(backend=name)
            names.append(name)
        except BackendUnavailable:
            pass
    return names


# tiny.en on every CPU backend; base on the default one (the backends already agree on tiny.en).
CASES = [("whisper-tiny.en", backend) for backend in available_cpu_backends()] + [("whisper-base", None)]


@pytest.mark.parametrize("model_name, backend", CASES)
def test_greedy_tokens_equal_openai_whisper(model_name, backend, greedy_transcripts, speech_clips,
                                            whisper_reference):
    mismatches = []
    for clip in speech_clips:
        expected = whisper_reference[model_name][clip]
        got = greedy_transcripts(model_name, clip, backend)
        want = [s["tokens"] for s in expected["segments"] if s["tokens"]]
        if _segment_tokens(got) != want:
            mismatches.append((clip, got.text, expected["text"]))
        else:
            assert got.text.strip() == expected["text"].strip()
    assert not mismatches, mismatches


def _words(text: str) -> list:
    text = text.lower().replace("mr.", "mister").replace("mrs.", "missus")
    return re.sub(r"[^a-z' ]+", " ", text).split()


def _word_errors(reference: list, hypothesis: list) -> int:
    row = list(range(len(hypothesis) + 1))
    for i, ref_word in enumerate(reference, start=1):
        previous, row[0] = row[0], i
        for j, hyp_word in enumerate(hypothesis, start=1):
            current = min(row[j] + 1, row[j - 1] + 1, previous + (ref_word != hyp_word))
            previous, row[j] = row[j], current
    return row[-1]


@pytest.mark.parametrize("model_name", MODELS)
def test_word_error_rate_on_librivox(model_name, greedy_transcripts, speech_clips, librivox_transcripts):
    errors = words = 0
    for clip in speech_clips:
        name = clip.split("/")[-1]
        if name not in librivox_transcripts:
            continue
        got = greedy_transcripts(model_name, clip)
        reference = librivox_transcripts[name].split()
        errors += _word_errors(reference, _words(got.text))
        words += len(reference)
    wer = errors / words
    print(f"\n{model_name}: word error rate on the 5 LibriVox clips {wer:.3f} ({errors}/{words} words)")
    # Published WER of tiny.en/base on LibriSpeech clean is ~5-6%; these 5 clips are clean
    # read speech, so anything far above that means the pipeline is broken, not the model.
    assert wer < 0.15


def test_beam_search_tokens_equal_openai_whisper(whisper_models, speech_clips, whisper_reference):
    model, tokenizer = whisper_models("whisper-tiny.en")
    options = TranscribeOptions(temperatures=(0.0,), beam_size=5)
    for clip in ("librivox/sense_and_sensibility_01_austen_64kb-0870.wav", "goforward.raw"):
        got = transcribe(model, tokenizer, speech_clips[clip], options)
        want = [s["tokens"] for s in whisper_reference["whisper-tiny.en"][clip]["beam5_segments"] if s["tokens"]]
        assert _segment_tokens(got) == want, clip


def test_without_timestamps_tokens(whisper_models, speech_clips, whisper_reference):
    from candle_web.models.whisper_decode import DecodingOptions, WhisperTokenizer, WindowDecoder
    from candle_web import Tensor
    from candle_web.io import audio

    model, tokenizer = whisper_models("whisper-tiny.en")
    tk = WhisperTokenizer(tokenizer, multilingual=False)
    clip = "something.raw"
    mel = audio.pad_or_trim(audio.log_mel_spectrogram(speech_clips[clip]), audio.N_FRAMES)
    features = model.encode(Tensor.from_numpy(mel[None]))
    result = WindowDecoder(model, tk, DecodingOptions(without_timestamps=True)).run(features)
    assert result.tokens == whisper_reference["whisper-tiny.en"][clip]["notimestamps_tokens"]


def test_language_detection_on_english_speech(whisper_models, speech_clips):
    from candle_web import Tensor
    from candle_web.io import audio
    from candle_web.models.whisper_decode import WhisperTokenizer, detect_language

    model, tokenizer = whisper_models("whisper-base")
    mel = audio.pad_or_trim(audio.log_mel_spectrogram(speech_clips["goforward.raw"]), audio.N_FRAMES)
    probs = detect_language(model, WhisperTokenizer(tokenizer, True), model.encode(Tensor.from_numpy(mel[None])))
    assert max(probs, key=probs.get) == "en" and probs["en"] > 0.5
    assert len(probs) >= 99  # every language token of the multilingual vocabulary


def test_translate_task_uses_the_translate_token(whisper_models, speech_clips):
    from candle_web.models.whisper_decode import WhisperTokenizer

    model, tokenizer = whisper_models("whisper-base")
    tk = WhisperTokenizer(tokenizer, True, "fr", "translate")
    assert tk.sot_sequence == [tk.sot, tk.language_tokens["fr"], tk.translate]
    got = transcribe(model, tokenizer, speech_clips["goforward.raw"],
                     TranscribeOptions(temperatures=(0.0,), language="en", task="translate"))
    assert "forward" in got.text.lower()


def test_live_openai_whisper_gives_the_recorded_tokens(greedy_transcripts, speech_clips, whisper_reference,
                                                        model_file):
    """openai-whisper run now, on the same weights, agrees with the recording and with us
    (so the recorded JSON cannot silently go stale)."""
    pytest.importorskip("torch")
    pytest.importorskip("whisper")
    from tests.reference import record_whisper

    clip = "goforward.raw"
    model = record_whisper.load_openai_model(model_file("whisper-tiny.en", "model.bin"))
    live = record_whisper.record(None, speech_clips[clip], model)
    recorded = whisper_reference["whisper-tiny.en"][clip]
    assert live["segments"] == recorded["segments"]
    assert [s["tokens"] for s in live["segments"] if s["tokens"]] == \
        _segment_tokens(greedy_transcripts("whisper-tiny.en", clip))
