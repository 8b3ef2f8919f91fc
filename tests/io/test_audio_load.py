"""load_audio / decode_audio_file: the whole path from file bytes to 16 kHz mono samples."""

import io
import shutil
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from candle_web.io import audio
from candle_web.core.errors import CandleError, FormatError, UnsupportedError
from candle_web.io.wav import encode_wav, read_raw_int16, read_wav

soundfile = pytest.importorskip("soundfile")
signal = pytest.importorskip("scipy.signal")


def encode(samples, rate, container, subtype=None):
    buffer = io.BytesIO()
    soundfile.write(buffer, samples, rate, format=container, subtype=subtype)
    return buffer.getvalue()


def reference_resample(mono, orig_sr):
    """scipy's polyphase resampler run with our filter: an independent implementation."""
    up, down = audio.resampling_ratio(orig_sr, audio.SAMPLE_RATE)
    taps, _ = audio.design_resampling_filter(up, down)
    return signal.resample_poly(np.asarray(mono, np.float64), up, down, window=taps / up)


@pytest.fixture
def no_external_decoders(monkeypatch):
    """Simulate a machine (or Pyodide) with neither soundfile nor ffmpeg."""
    monkeypatch.setattr(audio, "_import_soundfile", lambda: None)
    monkeypatch.setattr(audio, "_find_ffmpeg", lambda: None)


@pytest.fixture(scope="module")
def speech(librivox_clips):
    samples, rate = read_wav(librivox_clips[1], mono=True)
    assert rate == 16000
    return samples


def test_16k_wav_passes_through_unchanged(librivox_clips):
    path = librivox_clips[0]
    expected, _ = soundfile.read(path, dtype="float32")
    for source in (path, str(path), path.read_bytes(),
                   np.frombuffer(path.read_bytes(), np.uint8)):
        samples = audio.load_audio(source)
        assert samples.dtype == np.float32 and samples.ndim == 1
        np.testing.assert_array_equal(samples, expected)


def test_raw_int16_by_suffix_and_by_format(speech_dir):
    path = speech_dir / "something.raw"
    expected, _ = read_raw_int16(path)
    np.testing.assert_array_equal(audio.load_audio(path), expected)
    np.testing.assert_array_equal(audio.load_audio(path.read_bytes(), format="raw"), expected)
    # Declared at 8 kHz, the same bytes are upsampled to twice as many samples.
    assert audio.load_audio(path, raw_sample_rate=8000).size == 2 * expected.size


def test_wav_named_raw_is_still_read_as_wav(tmp_path, speech):
    path = tmp_path / "mislabelled.raw"
    path.write_bytes(encode_wav(speech, 16000, "float32"))
    np.testing.assert_array_equal(audio.load_audio(path), speech)


def test_44k1_stereo_float_wav_is_downmixed_and_resampled(speech):
    up44 = signal.resample_poly(speech.astype(np.float64), 441, 160)
    stereo = np.stack([up44, 0.25 * up44], axis=1).astype(np.float32)
    samples = audio.load_audio(encode_wav(stereo, 44100, "float32"))
    expected = reference_resample(stereo.mean(axis=1), 44100)
    assert samples.shape == expected.shape
    np.testing.assert_allclose(samples, expected, atol=1e-5, rtol=0)  # float32 vs float64


def test_resampled_speech_gives_the_same_log_mel(speech):
    """16 kHz speech taken up to 48 kHz by scipy and back down by us gives Whisper the same
    features to within 0.005 (log10/4 units; measured 5e-4) below the top mel bands, which
    straddle our 7.2-8 kHz transition band. The first and last two frames are left out: there
    the two resamplers' zero-padding transients differ and reflect padding mirrors them."""
    up48 = signal.resample_poly(speech.astype(np.float64), 3, 1).astype(np.float32)
    back = audio.load_audio(encode_wav(up48, 48000, "float32"))
    assert back.size == speech.size
    original = audio.log_mel_spectrogram(speech)
    round_trip = audio.log_mel_spectrogram(back)
    inside = (slice(0, 75), slice(2, -2))
    np.testing.assert_allclose(round_trip[inside], original[inside], atol=0.005, rtol=0)


def test_eight_channels_at_96k(tmp_path):
    """An 8-channel 96 kHz 24-bit file: the mono 16 kHz result must be the channel mean,
    band-limited, with each channel's tone at 1/8 amplitude."""
    rate, frames = 96000, 96000
    t = np.arange(frames) / rate
    frequencies = [300, 700, 1100, 1900, 2900, 4100, 5300, 6700]
    channels = np.stack([0.8 * np.sin(2 * np.pi * f * t) for f in frequencies], axis=1)
    path = tmp_path / "surround.wav"
    soundfile.write(path, channels, rate, subtype="PCM_24", format="WAVEX")
    samples = audio.load_audio(path)
    decoded, _ = soundfile.read(path, dtype="float32", always_2d=True)
    expected = reference_resample(decoded.mean(axis=1), rate)
    assert samples.shape == (16000,)
    np.testing.assert_allclose(samples, expected, atol=1e-5, rtol=0)
    t16 = np.arange(16000) / 16000
    ideal = sum(0.1 * np.sin(2 * np.pi * f * t16) for f in frequencies)
    np.testing.assert_allclose(samples[500:-500], ideal[500:-500], atol=1e-4, rtol=0)


@pytest.mark.parametrize("container,subtype,exact", [("FLAC", "PCM_16", True),
                                                      ("OGG", "VORBIS", False),
                                                      ("MP3", "MPEG_LAYER_III", False)])
def test_compressed_formats_through_soundfile(speech, container, subtype, exact):
    data = encode(speech, 16000, container, subtype)
    samples = audio.load_audio(data)
    if exact:  # FLAC is lossless and the clip is 16-bit already
        np.testing.assert_array_equal(samples, speech)
        return
    # Lossy codecs: same speech, up to coding noise and the codec's delay.
    assert abs(samples.size - speech.size) < 0.1 * speech.size
    n = min(samples.size, speech.size)
    lag = int(np.argmax(signal.correlate(samples[:n], speech[:n], mode="full",
                                         method="fft"))) - (n - 1)
    aligned = samples[max(lag, 0):][: n - abs(lag)], speech[max(-lag, 0):][: n - abs(lag)]
    assert np.corrcoef(*aligned)[0, 1] > 0.95


@pytest.mark.skipif(shutil.which("ffmpeg") is None, reason="needs the ffmpeg executable "
                    "(Debian package ffmpeg)")
def test_ffmpeg_decodes_when_soundfile_is_absent(speech, monkeypatch):
    monkeypatch.setattr(audio, "_import_soundfile", lambda: None)
    flac = encode(speech, 16000, "FLAC", "PCM_16")
    np.testing.assert_array_equal(audio.load_audio(flac), speech)
    with pytest.raises(FormatError, match="could not decode"):
        audio.load_audio(b"certainly not audio" * 20)


def test_wav_codec_we_do_not_parse_falls_back_to_soundfile(speech):
    alaw = encode(speech, 16000, "WAV", "ALAW")
    expected, _ = soundfile.read(io.BytesIO(alaw), dtype="float32")
    np.testing.assert_array_equal(audio.load_audio(alaw), expected)


def test_without_decoders_compressed_audio_names_both_options(speech, no_external_decoders):
    flac = encode(speech, 16000, "FLAC", "PCM_16")
    with pytest.raises(UnsupportedError, match="FLAC.*'soundfile'.*'ffmpeg'"):
        audio.load_audio(flac)
    alaw = encode(speech, 16000, "WAV", "ALAW")
    with pytest.raises(UnsupportedError, match="A-law.*'soundfile'.*'ffmpeg'"):
        audio.load_audio(alaw)
    # WAV itself needs neither.
    np.testing.assert_array_equal(audio.load_audio(encode_wav(speech, 16000, "float32")), speech)


def test_bad_input(tmp_path):
    empty_file = tmp_path / "empty.wav"
    empty_file.write_bytes(b"")
    for empty in (b"", empty_file):
        with pytest.raises(FormatError, match="empty input"):
            audio.load_audio(empty)
    with pytest.raises(FormatError, match="empty.wav: not a WAV file"):
        read_wav(empty_file)
    with pytest.raises(FormatError, match="could not decode"):
        audio.load_audio(b"<html><body>404 not found</body></html>")
    with pytest.raises(FormatError, match="contains no audio samples"):
        audio.load_audio(encode_wav(np.zeros((0, 2)), 44100))
    truncated = encode_wav(np.zeros(1000), 16000)[:-301]
    with pytest.raises(FormatError, match="truncated"):
        audio.load_audio(truncated)
    with pytest.raises(FormatError, match="not a WAV file"):
        audio.load_audio(encode(np.zeros(100), 16000, "FLAC", "PCM_16"), format="wav")


def test_garbage_without_decoders_is_a_format_error(no_external_decoders):
    with pytest.raises(FormatError, match="not a recognised audio file"):
        audio.load_audio(b"just some text, not audio")


def test_missing_file(tmp_path):
    with pytest.raises(FormatError, match="cannot read"):
        audio.load_audio(tmp_path / "nowhere.flac")


@pytest.mark.parametrize("container", ["WAV", "AIFF"])
def test_nan_samples_are_rejected(container):
    samples = np.zeros(800, np.float32)
    samples[100] = np.nan
    data = encode(samples, 16000, container, "FLOAT")  # AIFF goes through soundfile
    with pytest.raises(FormatError, match="NaN or infinite"):
        audio.load_audio(data)


def test_implausible_sample_rate_in_header():
    data = bytearray(encode_wav(np.zeros(1000), 16000))
    data[24:28] = struct.pack("<I", 1)  # the fmt chunk's sample rate field
    with pytest.raises(FormatError, match="sample rate 1 Hz"):
        audio.load_audio(bytes(data))


SEED_WAV = encode_wav(0.1 * np.sin(np.arange(3000) / 5.0), 16000)


@settings(max_examples=120, deadline=None)
@given(st.lists(st.tuples(st.integers(0, len(SEED_WAV) - 1), st.integers(0, 255)), max_size=6),
       st.integers(8, len(SEED_WAV)))
def test_fuzzed_input_to_load_audio_only_raises_candle_errors(edits, keep):
    data = bytearray(SEED_WAV)
    for position, value in edits:
        data[position] = value
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(audio, "_import_soundfile", lambda: None)
        patch.setattr(audio, "_find_ffmpeg", lambda: None)
        try:
            samples = audio.load_audio(bytes(data[:keep]))
        except CandleError:
            return
    assert samples.dtype == np.float32 and samples.ndim == 1
