"""Shared fixtures for the model tests: real weights, loaded once per session."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

REFERENCE_DIR = Path(__file__).resolve().parent.parent / "reference"


@pytest.fixture(scope="session")
def whisper_reference():
    return json.loads((REFERENCE_DIR / "whisper_reference.json").read_text())


@pytest.fixture(scope="session")
def speech_clips(model_file):
    """name -> float32 16 kHz samples of the pocketsphinx test speech (as recorded)."""
    from candle_web import hub
    from candle_web.io.audio import load_audio
    from candle_web.io.wav import read_raw_int16

    speech = hub.cache_dir() / "testdata" / "speech"
    if not (speech / "librivox").is_dir():
        pytest.fail("test speech is missing: run `make test` (scripts/fetch_test_audio.sh)")
    clips = {}
    for wav in sorted((speech / "librivox").glob("*.wav")):
        clips[f"librivox/{wav.name}"] = load_audio(str(wav))
    for raw in ("goforward.raw", "something.raw"):
        samples, _ = read_raw_int16(str(speech / raw))
        clips[raw] = np.asarray(samples, dtype=np.float32)
    return clips


@pytest.fixture(scope="session")
def librivox_transcripts():
    """clip file name -> reference transcript (upper case words) from the Debian package."""
    from candle_web import hub

    lines = (hub.cache_dir() / "testdata" / "speech" / "librivox" / "transcription").read_text().splitlines()
    out = {}
    for line in lines:
        text, _, ident = line.rpartition("(")
        if ident:
            words = text.replace("<s>", " ").replace("</s>", " ").split()
            out[ident.rstrip(")").strip() + ".wav"] = " ".join(words)
    return out


@pytest.fixture(scope="session")
def whisper_models():
    """whisper_models(name, backend=None) -> (model, tokenizer), loaded once per pair.
    backend=None is Device.cpu()'s default (numba when installed); "numpy"/"numba" pin one."""
    from candle_web import Device
    from candle_web.pipelines import load_whisper

    loaded = {}

    def get(name, backend=None):
        if (name, backend) not in loaded:
            device = Device.cpu(backend=backend) if backend else None
            pipeline = load_whisper(name, device=device)
            loaded[name, backend] = pipeline.model, pipeline.tokenizer
        return loaded[name, backend]

    return get

