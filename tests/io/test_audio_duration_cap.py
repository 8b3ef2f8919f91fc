"""Issue 37: a duration cap on decoding (`load_audio(..., max_seconds=)`, the server's
`--max-audio-seconds`). A 25 MiB upload of 32 kbps audio is ~1.8 h; soundfile decoded all of it
as float32 at its source rate (~2.3 GB for 44.1 kHz stereo). The cap is enforced while decoding:
from the header's frame count (WAV, raw int16, soundfile) or by stopping ffmpeg past it, so an
over-long file is refused having cost memory bounded by the cap, not by the file. Each decoder
path is checked at the boundary (exactly the cap passes, a little more is refused) and the
hostile case runs in a child process capped at 200 MB over the interpreter."""

from __future__ import annotations

import io
import shutil

import numpy as np
import pytest

from candle_web.io import audio
from candle_web.io.audio import AudioTooLong, decode_audio_file, load_audio
from candle_web.io.wav import encode_wav
from tests.bounded_run_testlib import run_bounded

RATE = 8000  # a low rate keeps the long files small on disk
CAP_S = 2.0
HOURS_2_S = 2 * 3600

soundfile = pytest.importorskip("soundfile", reason="the dev extra installs soundfile")


def tone(seconds: float, rate: int = RATE) -> np.ndarray:
    n = int(round(seconds * rate))
    return (0.1 * np.sin(2 * np.pi * 440 * np.arange(n) / rate)).astype(np.float32)


def flac_bytes(samples: np.ndarray, rate: int = RATE) -> bytes:
    buffer = io.BytesIO()
    soundfile.write(buffer, samples, rate, format="FLAC", subtype="PCM_16")
    return buffer.getvalue()


def raw_bytes(samples: np.ndarray) -> bytes:
    return np.rint(samples * 32767).astype("<i2").tobytes()


ENCODERS = {
    "wav": lambda samples: encode_wav(samples, RATE),
    "raw": raw_bytes,
    "flac-soundfile": flac_bytes,
    "flac-ffmpeg": flac_bytes,
}


def decode_with(path_kind: str, data: bytes, monkeypatch, **options):
    if path_kind == "flac-ffmpeg":
        if shutil.which("ffmpeg") is None:
            pytest.skip("ffmpeg is not installed (`make system-deps` installs it)")
        monkeypatch.setattr(audio, "_import_soundfile", lambda: None)
    if path_kind == "raw":
        options["format"], options["raw_sample_rate"] = "raw", RATE
    return decode_audio_file(data, **options)


@pytest.mark.parametrize("path_kind", sorted(ENCODERS))
def test_audio_of_exactly_the_cap_decodes_whole(path_kind, monkeypatch):
    samples = tone(CAP_S)
    decoded, rate = decode_with(path_kind, ENCODERS[path_kind](samples), monkeypatch,
                                max_seconds=CAP_S)
    assert rate == RATE and decoded.size == samples.size
    np.testing.assert_allclose(decoded, samples, atol=2 / 32768)


@pytest.mark.parametrize("path_kind", sorted(ENCODERS))
def test_audio_past_the_cap_is_refused_naming_both(path_kind, monkeypatch):
    data = ENCODERS[path_kind](tone(CAP_S + 0.5))
    with pytest.raises(AudioTooLong) as refused:
        decode_with(path_kind, data, monkeypatch, max_seconds=CAP_S)
    error = refused.value
    assert error.max_seconds == CAP_S and "above the limit of 2 s" in str(error)
    if path_kind == "flac-ffmpeg":
        # ffmpeg stopped a margin past the cap: all that is known is "more than".
        assert not error.exact and CAP_S < error.duration_s <= CAP_S + 0.5
        assert "lasts more than" in str(error)
    else:  # the header's frame count
        assert error.exact and error.duration_s == pytest.approx(CAP_S + 0.5)
        assert "lasts 2.5 s" in str(error)


def test_no_cap_decodes_what_the_cap_refuses(monkeypatch):
    """The cap is the caller's (the server's): the CLI, which passes none, reads long files."""
    data = flac_bytes(tone(CAP_S + 0.5))
    assert load_audio(data).size == round((CAP_S + 0.5) * 16000)
    with pytest.raises(AudioTooLong):
        load_audio(data, max_seconds=CAP_S)


def test_the_refusal_names_the_file(tmp_path):
    path = tmp_path / "long.wav"
    path.write_bytes(encode_wav(tone(3.0), RATE))
    with pytest.raises(AudioTooLong, match=rf"{path}: the audio lasts 3\.0 s, above the limit "
                                           r"of 2 s"):
        load_audio(path, max_seconds=CAP_S)


@pytest.mark.parametrize("bad", [0, -1.0, float("nan")])
def test_a_cap_that_is_not_positive_is_refused(bad):
    with pytest.raises(ValueError, match="max_seconds must be > 0"):
        load_audio(encode_wav(tone(0.1), RATE), max_seconds=bad)


# -- the hostile upload: two hours in a small file --------------------------------------------

# Two hours of 8 kHz mono as FLAC, made in blocks in the child's set-up (before its memory cap
# and tracemalloc start): silence compresses to ~0.2 MB, far inside a 25 MiB upload (speech at
# 32 kbps fills one in 1.8 h: the same length, a decoder does the same work).
LONG_FLAC_SETUP = f"""
import io
import numpy as np
import soundfile
from candle_web.io import audio
from candle_web.io.audio import load_audio
_buffer = io.BytesIO()
with soundfile.SoundFile(_buffer, "w", samplerate={RATE}, channels=1, format="FLAC",
                         subtype="PCM_16") as _file:
    _minute = np.zeros({RATE} * 60, np.int16)
    for _ in range({HOURS_2_S} // 60):
        _file.write(_minute)
DATA = _buffer.getvalue()
assert len(DATA) < 1 << 20, f"the hostile file should be small on disk, not {{len(DATA)}} bytes"
print(f"two hours of {RATE} Hz FLAC: {{len(DATA)}} bytes")
"""
# What decoding the whole file would allocate: its float32 samples at 8 kHz, before the 16 kHz
# copy (230 MB; without the cap the child runs out of its 200 MB headroom).
FULL_DECODE_BYTES = HOURS_2_S * RATE * 4
SERVER_CAP_S = 30 * 60


@pytest.mark.parametrize("decoder", ["soundfile", "ffmpeg"])
def test_two_hours_in_a_small_flac_are_refused_in_bounded_memory(decoder):
    if decoder == "ffmpeg" and shutil.which("ffmpeg") is None:
        pytest.skip("ffmpeg is not installed (`make system-deps` installs it)")
    # ffmpeg decodes up to the cap before it can tell: a one-minute cap keeps the child quick.
    cap = SERVER_CAP_S if decoder == "soundfile" else 60
    disable = "audio._import_soundfile = lambda: None\n" if decoder == "ffmpeg" else ""
    result = run_bounded(f"{disable}load_audio(DATA, max_seconds={cap})", setup=LONG_FLAC_SETUP)
    assert result["outcome"] == "raised" and result["type"] == "AudioTooLong", result
    assert f"above the limit of {cap} s" in result["message"]
    if decoder == "soundfile":
        assert "lasts 7200.0 s" in result["message"]  # from the header, nothing decoded
        assert result["traced_peak_bytes"] < FULL_DECODE_BYTES / 50, result
    else:
        # What ffmpeg wrote (the cap plus its margin) is what is held, about three times (its
        # WAV bytes, their float32 samples, the mono copy): far below the whole file's decode.
        held = (cap + audio.FFMPEG_CAP_MARGIN_S) * RATE * 4
        assert "lasts more than 6" in result["message"]
        assert result["traced_peak_bytes"] < 4 * held < FULL_DECODE_BYTES / 10, result
