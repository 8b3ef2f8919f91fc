"""The Whisper front end against openai-whisper itself (whisper.audio, torch.stft)."""

import os

import numpy as np
import pytest

from candle_web.io import audio
from candle_web.core.errors import DTypeMismatch, FormatError, ShapeError
from candle_web.io.wav import read_raw_int16, read_wav

torch = pytest.importorskip("torch")
whisper_audio = pytest.importorskip("whisper.audio")

# The log-mel values are (log10(power) + 4) / 4, so 1e-4 here is 4e-4 in log10, i.e. a 0.1 %
# power difference: far above float32 STFT rounding (measured max 2e-5 on speech), far below
# anything that changes a transcript.
LOG_MEL_ATOL = 1e-4


def whisper_log_mel(samples, n_mels, padding=0):
    return whisper_audio.log_mel_spectrogram(torch.from_numpy(samples), n_mels,
                                             padding=padding).numpy()


def test_constants_match_whisper():
    for name in ("SAMPLE_RATE", "N_FFT", "HOP_LENGTH", "CHUNK_LENGTH", "N_SAMPLES", "N_FRAMES",
                 "FRAMES_PER_SECOND"):
        assert getattr(audio, name) == getattr(whisper_audio, name), name


@pytest.mark.parametrize("n_mels", [80, 128])
def test_mel_filters_match_whispers_shipped_bank(n_mels):
    """whisper/assets/mel_filters.npz was made with librosa.filters.mel; ours is computed.
    Float32 both: agreement to 1e-6 relative (a float32 ulp or two)."""
    assets = os.path.join(os.path.dirname(whisper_audio.__file__), "assets", "mel_filters.npz")
    with np.load(assets, allow_pickle=False) as bank:
        expected = bank[f"mel_{n_mels}"]
    ours = audio.mel_filters(n_mels)
    assert ours.dtype == np.float32 and ours.shape == expected.shape == (n_mels, 201)
    np.testing.assert_allclose(ours, expected, rtol=1e-6, atol=1e-9)


def test_slaney_mel_scale_points():
    # Linear below 1 kHz (200/3 Hz per mel), logarithmic above with 27 mels per factor 6.4.
    np.testing.assert_allclose(audio.hz_to_mel([0.0, 200.0, 1000.0, 6400.0]),
                               [0.0, 3.0, 15.0, 42.0], atol=1e-12)
    hz = np.array([0.0, 55.0, 999.0, 1000.0, 4321.0, 8000.0])
    np.testing.assert_allclose(audio.mel_to_hz(audio.hz_to_mel(hz)), hz, rtol=1e-12)


def test_log_mel_matches_whisper_on_every_librivox_clip(librivox_clips):
    for path in librivox_clips:
        samples, rate = read_wav(path, mono=True)
        assert rate == audio.SAMPLE_RATE
        ours = audio.log_mel_spectrogram(samples, 80)
        expected = whisper_log_mel(samples, 80)
        assert ours.shape == expected.shape == (80, samples.size // audio.HOP_LENGTH)
        np.testing.assert_allclose(ours, expected, atol=LOG_MEL_ATOL, rtol=0)


@pytest.mark.parametrize("n_mels", [80, 128])
@pytest.mark.parametrize("padding", [0, audio.N_SAMPLES])
def test_log_mel_matches_whisper_with_padding(librivox_clips, n_mels, padding):
    samples, _ = read_wav(librivox_clips[-1], mono=True)
    ours = audio.log_mel_spectrogram(samples, n_mels, padding=padding)
    expected = whisper_log_mel(samples, n_mels, padding=padding)
    assert ours.dtype == np.float32 and ours.flags.c_contiguous
    assert ours.shape == expected.shape == (n_mels, (samples.size + padding) // 160)
    np.testing.assert_allclose(ours, expected, atol=LOG_MEL_ATOL, rtol=0)


def test_log_mel_matches_whisper_on_raw_clip(speech_dir):
    samples, _ = read_raw_int16(speech_dir / "something.raw")
    np.testing.assert_allclose(audio.log_mel_spectrogram(samples, 128),
                               whisper_log_mel(samples, 128), atol=LOG_MEL_ATOL, rtol=0)


@pytest.mark.parametrize("n_mels", [80, 128])
@pytest.mark.parametrize("kind", ["gaussian", "loud_uniform", "tone", "silence_then_click"])
def test_log_mel_matches_whisper_on_synthetic_signals(n_mels, kind):
    rng = np.random.default_rng(7)
    length = audio.N_SAMPLES + 123  # not a multiple of the hop
    if kind == "gaussian":
        samples = 0.1 * rng.standard_normal(length)
    elif kind == "loud_uniform":
        samples = rng.uniform(-1, 1, length)
    elif kind == "tone":
        samples = 0.5 * np.sin(2 * np.pi * 440 * np.arange(length) / 16000)
    else:
        samples = np.zeros(length)
        samples[length // 2] = 1.0
    samples = samples.astype(np.float32)
    np.testing.assert_allclose(audio.log_mel_spectrogram(samples, n_mels),
                               whisper_log_mel(samples, n_mels), atol=LOG_MEL_ATOL, rtol=0)


@pytest.mark.parametrize("length", [201, 400, 1000, 16001])
def test_log_mel_matches_whisper_on_short_inputs(length):
    samples = np.random.default_rng(length).uniform(-0.5, 0.5, length).astype(np.float32)
    np.testing.assert_allclose(audio.log_mel_spectrogram(samples), whisper_log_mel(samples, 80),
                               atol=LOG_MEL_ATOL, rtol=0)


def test_silence_is_the_floor():
    # All-zero audio: every bin clamps to log10(1e-10) = -10, and (-10 + 4) / 4 = -1.5 (up to
    # float32's rounding of 1e-10).
    silence = np.zeros(1600, np.float32)
    mel = audio.log_mel_spectrogram(silence)
    assert mel.shape == (80, 10)
    np.testing.assert_allclose(mel, np.full((80, 10), -1.5), atol=1e-6, rtol=0)
    # torch's and numpy's float32 log10 differ by one ulp here (2.4e-7 after the /4).
    np.testing.assert_allclose(mel, whisper_log_mel(silence, 80), atol=1e-6, rtol=0)


def test_log_mel_accepts_float64_and_padding_only():
    samples = np.random.default_rng(3).uniform(-0.5, 0.5, 4000)
    np.testing.assert_allclose(audio.log_mel_spectrogram(samples),
                               audio.log_mel_spectrogram(samples.astype(np.float32)), atol=1e-6)
    assert audio.log_mel_spectrogram(np.zeros(0, np.float32), padding=480).shape == (80, 3)


def test_log_mel_rejects_bad_input():
    with pytest.raises(DTypeMismatch, match="int16"):
        audio.log_mel_spectrogram(np.zeros(1000, np.int16))
    with pytest.raises(ShapeError, match="1-D"):
        audio.log_mel_spectrogram(np.zeros((2, 1000), np.float32))
    with pytest.raises(ShapeError, match="padding"):
        audio.log_mel_spectrogram(np.zeros(1000, np.float32), padding=-1)
    with pytest.raises(ShapeError, match="no samples"):
        audio.log_mel_spectrogram(np.zeros(0, np.float32))
    corrupt = np.zeros(1000, np.float32)
    corrupt[[5, 9]] = [np.nan, np.inf]
    with pytest.raises(FormatError, match="2 samples are NaN or infinite"):
        audio.log_mel_spectrogram(corrupt)


@pytest.mark.parametrize("length", [0, 100, audio.N_SAMPLES, audio.N_SAMPLES + 5])
def test_pad_or_trim_matches_whisper(length):
    samples = np.arange(length, dtype=np.float32)
    np.testing.assert_array_equal(audio.pad_or_trim(samples),
                                  whisper_audio.pad_or_trim(samples))
    mel = np.ones((80, length % 4000 + 1), np.float32)
    np.testing.assert_array_equal(audio.pad_or_trim(mel, audio.N_FRAMES),
                                  whisper_audio.pad_or_trim(mel, audio.N_FRAMES))
    np.testing.assert_array_equal(audio.pad_or_trim(mel.T, 7, axis=0),
                                  whisper_audio.pad_or_trim(mel.T, 7, axis=0))
