"""`candle-web transcribe` and `candle-web models` as a user runs them, including bad input."""

from __future__ import annotations

import subprocess
import sys
import wave
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]


def _run(*args, timeout=600):
    env_path = f"{REPO / 'pkg'}:{REPO / 'native'}"
    import os

    env = dict(os.environ, PYTHONPATH=env_path, CANDLE_WEB_OFFLINE="1")
    return subprocess.run([sys.executable, "-m", "candle_web.cli", *args], capture_output=True,
                          text=True, timeout=timeout, env=env)


def test_transcribe_writes_srt_with_progress(tmp_path, speech_clips):
    from candle_web.io.wav import write_wav

    clip = tmp_path / "something.wav"
    write_wav(str(clip), speech_clips["something.raw"], 16000)
    out = _run("transcribe", str(clip), "--format", "srt", "--output-dir", str(tmp_path))
    assert out.returncode == 0, out.stderr
    srt = (tmp_path / "something.srt").read_text()
    assert srt.startswith("1\n00:00:00,000 --> ")
    assert "s audio" in out.stderr and "real-time factor" in out.stderr


@pytest.mark.parametrize("content, problem", [
    (b"", "empty"),
    (b"this is not audio at all, just text" * 10, "not"),
    (b"RIFF\x24\x00\x00\x00WAVEfmt ", "truncated"),
])
def test_bad_audio_gives_a_clear_error(tmp_path, content, problem):
    bad = tmp_path / "bad.wav"
    bad.write_bytes(content)
    out = _run("transcribe", str(bad))
    assert out.returncode == 1
    assert "bad.wav" in out.stderr and "Traceback" not in out.stderr
    assert problem in out.stderr.lower() or "wav" in out.stderr.lower()


def test_zero_length_wav_is_a_clear_error(tmp_path):
    path = tmp_path / "empty.wav"
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(b"")
    out = _run("transcribe", str(path))
    assert out.returncode == 1 and "Traceback" not in out.stderr and "empty.wav" in out.stderr


def test_unknown_model_names_the_known_ones():
    out = _run("transcribe", "x.wav", "--model", "whisper-huge-v9")
    assert out.returncode == 2
    assert "whisper-huge-v9" in out.stderr and "whisper-tiny.en" in out.stderr


def test_models_lists_registry_and_cache_state():
    out = _run("models")
    assert out.returncode == 0
    assert "whisper-tiny.en" in out.stdout and "smollm2-135m-instruct" in out.stdout
    assert "yes" in out.stdout  # the test set-up fetched the defaults


def test_eight_channel_96k_audio_transcribes(tmp_path, speech_clips, whisper_models):
    """Multichannel high-rate input is downmixed and resampled, then transcribed."""
    from candle_web.io.audio import load_audio
    from candle_web.io.wav import write_wav
    from candle_web.pipelines.transcribe import TranscribeOptions, transcribe

    mono16k = speech_clips["goforward.raw"]
    # upsample 16k -> 96k by linear interpolation (speech stays intelligible), 8 channels
    t_in = np.arange(len(mono16k)) / 16000
    t_out = np.arange(int(len(mono16k) * 6)) / 96000
    upsampled = np.interp(t_out, t_in, mono16k).astype(np.float32)
    channels = np.stack([upsampled * (0.5 + 0.05 * c) for c in range(8)], axis=1)
    path = tmp_path / "eight.wav"
    write_wav(str(path), channels, 96000)
    samples = load_audio(str(path))
    assert abs(len(samples) - len(mono16k)) <= 2
    model, tokenizer = whisper_models("whisper-tiny.en")
    text = transcribe(model, tokenizer, samples, TranscribeOptions(temperatures=(0.0,))).text.lower()
    assert "forward" in text and "ten meters" in text.replace("10", "ten")
