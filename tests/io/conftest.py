"""Fixtures for the audio tests: the real speech clips fetched by scripts/fetch_test_audio.sh."""

import os
import pathlib

import pytest

SPEECH_FILES = ("librivox/transcription", "goforward.raw", "something.raw")


def speech_cache_dir() -> pathlib.Path:
    root = os.environ.get("CANDLE_WEB_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "candle-web")
    return pathlib.Path(root) / "testdata" / "speech"


@pytest.fixture(scope="session")
def speech_dir() -> pathlib.Path:
    """Directory with LibriVox wavs + transcription and goforward.raw / something.raw."""
    directory = speech_cache_dir()
    missing = [name for name in SPEECH_FILES if not (directory / name).is_file()]
    if missing or not list((directory / "librivox").glob("*.wav")):
        pytest.fail(f"test speech missing from {directory} ({', '.join(missing) or 'no wavs'}): "
                    f"run make test (or scripts/fetch_test_audio.sh) first")
    return directory


@pytest.fixture(scope="session")
def librivox_clips(speech_dir) -> list[pathlib.Path]:
    return sorted((speech_dir / "librivox").glob("*.wav"))
