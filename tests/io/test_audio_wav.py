"""WAV parsing against independent writers (stdlib ``wave``, libsndfile via ``soundfile``)."""

import io
import struct
import wave

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from candle_web.core.errors import CandleError, FormatError, ShapeError, UnsupportedError
from candle_web.io.wav import (
    encode_wav,
    parse_wav_header,
    read_raw_int16,
    read_wav,
    write_wav,
)

soundfile = pytest.importorskip("soundfile")

RATES = (8000, 16000, 44100, 48000, 96000)


def random_audio(frames, channels, seed=0):
    rng = np.random.default_rng(seed)
    return rng.uniform(-0.99, 0.99, size=(frames, channels))


def stdlib_wav(samples, rate, sample_width):
    """Encode with Python's own ``wave`` module (integer PCM, 8-bit unsigned)."""
    frames, channels = samples.shape
    bits = 8 * sample_width
    ints = np.round(samples * (2 ** (bits - 1) - 1)).astype(np.int64)
    if sample_width == 1:
        raw = (ints + 128).astype(np.uint8).tobytes()
    elif sample_width == 3:
        raw = ints.astype("<i4").view(np.uint8).reshape(-1, 4)[:, :3].tobytes()
    else:
        raw = ints.astype(f"<i{sample_width}").tobytes()
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as writer:
        writer.setnchannels(channels)
        writer.setsampwidth(sample_width)
        writer.setframerate(rate)
        writer.writeframes(raw)
    return buffer.getvalue()


def soundfile_wav(samples, rate, subtype, container="WAV", endian="FILE"):
    buffer = io.BytesIO()
    soundfile.write(buffer, samples, rate, subtype=subtype, format=container, endian=endian)
    return buffer.getvalue()


def soundfile_decode(data):
    return soundfile.read(io.BytesIO(data), dtype="float32", always_2d=True)


def chunk(tag, body):
    pad = b"\0" if len(body) % 2 else b""
    return tag + struct.pack("<I", len(body)) + body + pad


def pcm16_fmt(channels=1, rate=16000):
    return struct.pack("<HHIIHH", 1, channels, rate, rate * 2 * channels, 2 * channels, 16)


def riff(*chunks, riff_size=None):
    body = b"WAVE" + b"".join(chunks)
    size = len(body) if riff_size is None else riff_size
    return b"RIFF" + struct.pack("<I", size) + body


# --- independent writers -------------------------------------------------------------------


@pytest.mark.parametrize("sample_width", [1, 2, 3, 4])
@pytest.mark.parametrize("channels,rate", [(1, 8000), (2, 44100), (3, 48000), (1, 96000)])
def test_stdlib_wave_files_decode_like_libsndfile(sample_width, channels, rate):
    data = stdlib_wav(random_audio(1001, channels, seed=sample_width), rate, sample_width)
    samples, sr = read_wav(data)
    expected, expected_sr = soundfile_decode(data)
    assert sr == expected_sr == rate
    assert samples.dtype == np.float32 and samples.shape == (1001, channels)
    # Both scale integers by 2**-(bits-1) in float32: identical bits.
    np.testing.assert_array_equal(samples, expected)


SOUNDFILE_CASES = [("PCM_U8", "WAV")] + [
    (subtype, container) for subtype in ("PCM_16", "PCM_24", "PCM_32", "FLOAT", "DOUBLE")
    for container in ("WAV", "WAVEX", "RF64")]


@pytest.mark.parametrize("subtype,container", SOUNDFILE_CASES)
def test_soundfile_files_decode_like_libsndfile(subtype, container):
    channels, rate = (6, 48000) if container == "WAVEX" else (2, 44100)
    data = soundfile_wav(random_audio(777, channels, seed=3), rate, subtype, container)
    samples, sr = read_wav(data)
    expected, expected_sr = soundfile_decode(data)
    assert sr == expected_sr == rate
    assert samples.shape == expected.shape == (777, channels)
    np.testing.assert_array_equal(samples, expected)
    info = parse_wav_header(data)
    assert info.container == ("RF64" if container == "RF64" else "RIFF")
    assert not info.streamed and not info.truncated


@pytest.mark.parametrize("subtype", ["PCM_16", "PCM_24", "PCM_32", "FLOAT", "DOUBLE"])
def test_big_endian_rifx(subtype):
    data = soundfile_wav(random_audio(300, 2, seed=4), 22050, subtype, endian="BIG")
    assert data[:4] == b"RIFX"
    samples, sr = read_wav(data)
    expected, _ = soundfile_decode(data)
    assert sr == 22050
    np.testing.assert_array_equal(samples, expected)


def test_eight_channels_at_96k_every_channel_correct():
    frames, rate = 9600, 96000
    t = np.arange(frames) / rate
    # A different tone per channel, so a channel mix-up or interleave error cannot pass.
    tones = np.stack([0.5 * np.sin(2 * np.pi * (500 + 700 * c) * t) for c in range(8)], axis=1)
    data = soundfile_wav(tones, rate, "PCM_24", "WAVEX")
    samples, sr = read_wav(data)
    assert sr == rate and samples.shape == (frames, 8)
    np.testing.assert_allclose(samples, tones, atol=2.0 ** -23)  # 24-bit quantisation step
    mono, _ = read_wav(data, mono=True)
    np.testing.assert_allclose(mono, tones.mean(axis=1), atol=2.0 ** -22)


def test_all_source_kinds_agree(tmp_path):
    data = soundfile_wav(random_audio(100, 2), 16000, "PCM_16")
    path = tmp_path / "clip.wav"
    path.write_bytes(data)
    expected, _ = read_wav(data)
    for source in (str(path), path, bytearray(data), memoryview(data),
                   np.frombuffer(data, np.uint8), open(path, "rb")):
        samples, sr = read_wav(source)
        np.testing.assert_array_equal(samples, expected)
        assert sr == 16000


def test_real_librivox_clip_matches_libsndfile(librivox_clips):
    path = librivox_clips[0]
    samples, sr = read_wav(path, mono=True)
    expected, expected_sr = soundfile.read(path, dtype="float32")
    assert sr == expected_sr == 16000
    np.testing.assert_array_equal(samples, expected)


# --- chunk layout ----------------------------------------------------------------------------


def test_unknown_and_odd_sized_chunks_are_skipped():
    audio = np.arange(-5, 6, dtype="<i2")
    data = riff(chunk(b"JUNK", b"abc"),  # odd size: one pad byte follows
                chunk(b"fmt ", pcm16_fmt()),
                chunk(b"LIST", b"INFOISFT\x05\x00\x00\x00test\x00"),
                chunk(b"data", audio.tobytes()),
                chunk(b"id3 ", b"trailing metadata"))
    samples, sr = read_wav(data, mono=True)
    np.testing.assert_array_equal(samples, audio / 32768.0)
    np.testing.assert_array_equal(samples, soundfile_decode(data)[0][:, 0])


def test_missing_pad_byte_after_odd_chunk_is_tolerated():
    audio = np.array([7, -7, 300], "<i2")
    unpadded_junk = b"JUNK" + struct.pack("<I", 3) + b"abc"  # no pad byte
    data = riff(unpadded_junk, chunk(b"fmt ", pcm16_fmt()), chunk(b"data", audio.tobytes()))
    samples, _ = read_wav(data, mono=True)
    np.testing.assert_array_equal(samples, audio / 32768.0)


def test_odd_sized_8bit_data_with_pad_byte():
    audio = np.array([0, 64, 128, 192, 255], np.uint8)
    data = riff(chunk(b"fmt ", struct.pack("<HHIIHH", 1, 1, 8000, 8000, 1, 8)),
                chunk(b"data", audio.tobytes()), chunk(b"LIST", b"xxxx"))
    samples, _ = read_wav(data, mono=True)
    np.testing.assert_array_equal(samples, (audio.astype(np.float32) - 128) / 128)


def test_fmt_after_data_is_accepted():
    audio = np.array([1000, -1000, 2000], "<i2")
    data = riff(chunk(b"data", audio.tobytes()), chunk(b"fmt ", pcm16_fmt()))
    samples, _ = read_wav(data, mono=True)
    np.testing.assert_array_equal(samples, audio / 32768.0)


# --- lying sizes and truncation ---------------------------------------------------------------


def test_truncated_file_is_an_error_unless_allowed():
    audio = np.arange(1000, dtype="<i2")
    whole = riff(chunk(b"fmt ", pcm16_fmt(channels=2)), chunk(b"data", audio.tobytes()))
    cut = whole[:-3]  # the last stereo frame loses 3 of its 4 bytes
    with pytest.raises(FormatError, match="truncated"):
        read_wav(cut)
    samples, _ = read_wav(cut, allow_truncated=True)
    assert samples.shape == (499, 2)  # the partial frame is dropped
    np.testing.assert_array_equal(samples.reshape(-1), audio[:998] / 32768.0)
    assert parse_wav_header(cut, allow_truncated=True).truncated


def test_lying_data_size_is_read_when_the_riff_size_says_the_file_is_whole():
    audio = np.arange(100, dtype="<i2")
    body = chunk(b"fmt ", pcm16_fmt()) + b"data" + struct.pack("<I", 10_000) + audio.tobytes()
    data = riff(body)  # RIFF size = exactly the bytes present
    samples, _ = read_wav(data, mono=True)
    np.testing.assert_array_equal(samples, audio / 32768.0)
    # The same data size with a RIFF size that also claims more bytes: a truncated file.
    with pytest.raises(FormatError, match="truncated"):
        read_wav(riff(body, riff_size=len(body) + 20_000))


@pytest.mark.parametrize("riff_size,data_size", [(0xFFFFFFFF, 0xFFFFFFFF), (0, 0),
                                                 (0x7FFFFFFF, 0x7FFFFFFF), (1234, 0xFFFFFFFF)])
def test_streamed_wav_placeholders_read_to_the_end(riff_size, data_size):
    audio = np.arange(-50, 50, dtype="<i2")
    body = chunk(b"fmt ", pcm16_fmt()) + b"data" + struct.pack("<I", data_size) + audio.tobytes()
    data = riff(body, riff_size=riff_size)
    samples, _ = read_wav(data, mono=True)
    np.testing.assert_array_equal(samples, audio / 32768.0)
    assert parse_wav_header(data).streamed


def test_data_size_not_a_whole_number_of_frames_drops_the_partial_frame():
    audio = np.arange(10, dtype="<i2").tobytes() + b"\x01"  # 21 bytes of stereo int16
    data = riff(chunk(b"fmt ", pcm16_fmt(channels=2)), chunk(b"data", audio))
    samples, _ = read_wav(data)
    assert samples.shape == (5, 2)
    assert soundfile_decode(data)[0].shape == (5, 2)  # libsndfile does the same


def test_zero_length_audio_is_an_empty_array():
    data = riff(chunk(b"fmt ", pcm16_fmt(channels=3)), chunk(b"data", b""))
    samples, sr = read_wav(data)
    assert samples.shape == (0, 3) and samples.dtype == np.float32 and sr == 16000
    assert read_wav(data, mono=True)[0].shape == (0,)


# --- bad input ------------------------------------------------------------------------------


@pytest.mark.parametrize("data,message", [
    (b"", "not a WAV file"),
    (b"hello, this is plainly not audio at all", "not a WAV file"),
    (b"RIFF\x10\x00\x00\x00AVI LIST", "not a WAV file"),
    (b"\xff\xfb\x90\x64" + bytes(100), "not a WAV file"),  # an MP3 frame header
])
def test_non_wav_bytes(data, message):
    with pytest.raises(FormatError, match=message):
        read_wav(data)


def test_header_cut_before_the_data_chunk():
    data = soundfile_wav(random_audio(50, 1), 16000, "PCM_16")
    with pytest.raises(FormatError, match="no 'data' chunk"):
        read_wav(data[:40])
    with pytest.raises(FormatError, match="chunk 'fmt ' at byte 12 declares 16 bytes but only"):
        read_wav(data[:20])


@pytest.mark.parametrize("fmt_body,error,message", [
    (struct.pack("<HHIIHH", 1, 0, 16000, 0, 0, 16), FormatError, "channel count 0"),
    (struct.pack("<HHIIHH", 1, 1, 0, 0, 2, 16), FormatError, "sample rate 0 Hz is outside"),
    (struct.pack("<HHIIHH", 1, 2, 16000, 0, 3, 16), FormatError, "block align 3"),
    (struct.pack("<HHIIHH", 1, 1, 16000, 0, 2, 24), FormatError, "24 bits"),
    (struct.pack("<HHIIHH", 1, 1, 16000, 0, 5, 40), UnsupportedError, "5-byte"),
    (struct.pack("<HHIIHH", 3, 1, 16000, 0, 2, 16), UnsupportedError, "IEEE float with 2"),
    (struct.pack("<HHIIHHH", 6, 1, 8000, 8000, 1, 8, 0), UnsupportedError, "A-law"),
    (struct.pack("<HHIIHH", 1, 1, 16000, 0, 2, 16)[:12], FormatError, "needs at least 16"),
])
def test_bad_fmt_chunks(fmt_body, error, message):
    data = riff(chunk(b"fmt ", fmt_body), chunk(b"data", bytes(8)))
    with pytest.raises(error, match=message):
        read_wav(data)


def test_unknown_extensible_subformat():
    guid = bytes(16)
    body = struct.pack("<HHIIHHHHI", 0xFFFE, 1, 16000, 32000, 2, 16, 22, 16, 4) + guid
    with pytest.raises(UnsupportedError, match="GUID"):
        read_wav(riff(chunk(b"fmt ", body), chunk(b"data", bytes(8))))


@pytest.mark.parametrize("bad_value", [np.nan, np.inf, -np.inf])
def test_non_finite_float_samples(bad_value):
    audio = np.zeros((100, 2), np.float32)
    audio[37, 1] = bad_value
    data = encode_wav(audio, 16000, "float32")
    with pytest.raises(FormatError, match="frame 37"):
        read_wav(data)


def test_missing_file(tmp_path):
    with pytest.raises(FormatError, match="cannot read"):
        read_wav(tmp_path / "absent.wav")


# --- raw int16 and writing -------------------------------------------------------------------


def test_raw_int16_real_clip(speech_dir):
    path = speech_dir / "goforward.raw"
    samples, sr = read_raw_int16(path)
    expected = np.fromfile(path, dtype="<i2").astype(np.float32) / 32768
    assert sr == 16000 and samples.dtype == np.float32
    np.testing.assert_array_equal(samples, expected)
    assert samples.size > 16000  # several seconds of speech
    with pytest.raises(FormatError, match="even byte count"):
        read_raw_int16(path.read_bytes()[:-1])


@pytest.mark.parametrize("channels", [1, 2, 5])
def test_written_pcm16_round_trips_and_libsndfile_agrees(tmp_path, channels):
    audio = random_audio(513, channels, seed=channels)
    path = tmp_path / "out.wav"
    write_wav(path, audio, 24000)
    samples, sr = read_wav(path)
    assert sr == 24000
    np.testing.assert_allclose(samples, audio, atol=0.5 / 32768 + 1e-9)  # rounding to int16
    expected, expected_sr = soundfile.read(path, dtype="float32", always_2d=True)
    assert expected_sr == 24000
    np.testing.assert_array_equal(samples, expected)


def test_written_float32_is_exact_and_libsndfile_agrees():
    audio = random_audio(300, 2).astype(np.float32) * 3  # float WAV may exceed [-1, 1]
    data = encode_wav(audio, 44100, "float32")
    samples, _ = read_wav(data)
    np.testing.assert_array_equal(samples, audio)
    np.testing.assert_array_equal(soundfile_decode(data)[0], audio)


def test_pcm16_encoding_clips_full_scale():
    data = encode_wav(np.array([-2.0, -1.0, 0.0, 1.0, 2.0]), 8000)
    samples, _ = read_wav(data, mono=True)
    np.testing.assert_array_equal(samples * 32768, [-32768, -32768, 0, 32767, 32767])


def test_encode_rejects_bad_arguments():
    with pytest.raises(ShapeError):
        encode_wav(np.zeros((2, 2, 2)), 16000)
    with pytest.raises(FormatError):
        encode_wav(np.zeros(4), 0)
    with pytest.raises(UnsupportedError):
        encode_wav(np.zeros(4), 16000, "mp3")


# --- fuzz -----------------------------------------------------------------------------------

SEED_FILES = [
    soundfile_wav(random_audio(40, 2), 16000, "PCM_16"),
    soundfile_wav(random_audio(30, 3), 48000, "PCM_24", "WAVEX"),
    soundfile_wav(random_audio(20, 1), 8000, "FLOAT", "RF64"),
    soundfile_wav(random_audio(20, 1), 8000, "PCM_U8"),
]


@st.composite
def mangled_wav(draw):
    data = bytearray(draw(st.sampled_from(SEED_FILES)))
    for _ in range(draw(st.integers(0, 6))):
        action = draw(st.sampled_from(["byte", "u32", "cut", "insert"]))
        if not data:
            break
        position = draw(st.integers(0, len(data) - 1))
        if action == "byte":
            data[position] = draw(st.integers(0, 255))
        elif action == "u32":
            # Header fields are 32-bit sizes/rates: try the extreme values on them.
            value = draw(st.sampled_from([0, 1, 2, 3, 0x7FFFFFFF, 0xFFFFFFFF, 0xFFFFFFFE,
                                          len(data), len(data) + 1]))
            data[position:position + 4] = struct.pack("<I", value)
        elif action == "cut":
            del data[position:]
        else:
            data[position:position] = draw(st.binary(min_size=1, max_size=9))
    return bytes(data)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(mangled_wav(), st.binary(max_size=80)))
def test_fuzzed_wav_only_raises_candle_errors(data):
    try:
        samples, rate = read_wav(data, allow_truncated=bool(len(data) % 2))
    except CandleError:
        return
    assert samples.dtype == np.float32 and samples.ndim == 2
    assert rate > 0
    # Nothing is invented: the samples fit in the buffer they came from.
    assert samples.size * 1 <= len(data)
