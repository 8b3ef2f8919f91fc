"""Issue 17, hostile inputs: a 244-byte WAV of 100 frames declaring 167,001 Hz made load_audio
peak at ~670 MB and keep 134 MB per distinct rate in an lru_cache(16) (ten such files reached a
MemoryError at 1.27 GiB); read_wav accepted any rate >= 1 while load_audio limited it."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from candle_web.io import audio
from candle_web.io import resample as resampling
from candle_web.core.errors import FormatError
from candle_web.io import wav
from candle_web.io.wav import encode_wav, read_wav

ODD_RATE = 167_001  # coprime with 16000: the reduced ratio 16000/167001 has large terms
# Rates near it with the same property: each needs its own ~16.7 M-tap filter design.
ODD_RATES = [167_001, 166_999, 166_997, 166_993, 166_991, 166_989, 166_987, 166_983, 166_981,
             166_979]
# The bound for decoding a 244-byte file: tap evaluation works in chunks of
# RESAMPLER_TAP_CHUNK float64 values (2 MB) with under ten temporaries alive, whatever the
# rate, and the file itself yields 10 output samples. Measured ~17 MB; before the fix 670 MB.
TINY_FILE_PEAK_BYTES = 50 << 20


def hostile_wav(rate: int = ODD_RATE) -> bytes:
    """The finding's file: 100 frames of 16-bit mono PCM at an odd rate, 244 bytes."""
    assert wav.MIN_SAMPLE_RATE <= rate <= wav.MAX_SAMPLE_RATE
    return encode_wav(np.zeros(100), rate)


def peak_bytes_of(function, *args) -> tuple[int, int, object]:
    """(peak bytes, bytes still held, result) of one call, as tracemalloc sees them (numpy
    reports its buffers to tracemalloc)."""
    tracemalloc.start()
    try:
        result = function(*args)
        held, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak, held, result


@pytest.fixture(autouse=True)
def cold_caches():
    """Each test measures a cold start: no tap tables kept from earlier tests."""
    resampling._TAP_TABLES.clear()
    resampling._filter_gain.cache_clear()
    yield
    resampling._TAP_TABLES.clear()


def test_tiny_wav_at_an_odd_rate_stays_small():
    data = hostile_wav()
    assert len(data) == 244
    peak, held, samples = peak_bytes_of(audio.load_audio, data)
    assert samples.shape == (-(-100 * 16000 // ODD_RATE),)
    assert peak < TINY_FILE_PEAK_BYTES, f"peak {peak / 2**20:.0f} MiB"
    assert held < 1 << 20  # nothing of the filter design is kept


def test_ten_odd_rates_in_one_process_keep_memory_bounded():
    """Every distinct rate used to keep 134 MB of taps; now what stays between calls is the
    byte-bounded tap-table cache (RESAMPLER_CACHE_BYTES) and a float per ratio."""
    tracemalloc.start()
    try:
        for rate in ODD_RATES:
            audio.load_audio(hostile_wav(rate))
        held, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < TINY_FILE_PEAK_BYTES, f"peak {peak / 2**20:.0f} MiB"
    assert held < 1 << 20
    assert resampling._TAP_TABLES.nbytes <= resampling.RESAMPLER_CACHE_BYTES


def test_many_common_rates_stay_within_the_cache_budget():
    rng = np.random.default_rng(0)
    for rate in (8000, 11025, 22050, 24000, 32000, 44100, 48000, 88200, 96000, 15999, 44056):
        audio.resample(rng.standard_normal(rate).astype(np.float32), rate)
        assert resampling._TAP_TABLES.nbytes <= resampling.RESAMPLER_CACHE_BYTES


def test_byte_bounded_cache_evicts_the_least_recent_and_skips_oversized_items():
    cache = resampling._ByteBoundedCache(100)
    built = []

    def make(size):
        def build():
            built.append(size)
            return np.zeros(size, np.uint8)
        return build

    cache.get("a", make(40))
    cache.get("b", make(40))
    cache.get("a", make(40))  # a hit: "a" becomes the most recent
    cache.get("c", make(40))  # over budget: evicts "b", the least recent
    assert cache.nbytes == 80 and built == [40, 40, 40]
    cache.get("b", make(40))
    assert built == [40, 40, 40, 40]  # "b" was gone and had to be rebuilt
    big = cache.get("big", make(101))
    assert big.nbytes == 101 and cache.nbytes <= 100  # returned, not kept


def test_odd_rate_resampling_is_still_correct():
    """The chunked evaluation is the same filter: an in-band tone at 167,001 Hz comes out at
    16 kHz with its amplitude and phase (the pass-band test of test_audio_resample.py)."""
    seconds = 0.25
    t = np.arange(int(ODD_RATE * seconds)) / ODD_RATE
    y = audio.resample(np.sin(2 * np.pi * 1000 * t).astype(np.float32), ODD_RATE)
    expected = np.sin(2 * np.pi * 1000 * np.arange(y.size) / 16000)
    np.testing.assert_allclose(y[200:-200], expected[200:-200], atol=1e-4, rtol=0)


@pytest.mark.parametrize("orig_sr", [44100, 44056, 15999])
def test_banded_evaluation_gives_the_same_numbers(monkeypatch, orig_sr):
    """Tiny bands of phase rows and tiny gather steps (forcing the gather path even for
    44.1 kHz) must give the numbers of the default plan."""
    x = np.random.default_rng(orig_sr).standard_normal(orig_sr // 3).astype(np.float32)
    default = audio.resample(x, orig_sr)
    resampling._TAP_TABLES.clear()
    monkeypatch.setattr(resampling, "RESAMPLER_MAX_KERNEL_ELEMENTS", 3000)
    monkeypatch.setattr(resampling, "RESAMPLER_GATHER_ELEMENTS", 20_000)
    monkeypatch.setattr(resampling, "RESAMPLER_TAP_CHUNK", 1000)
    assert not resampling.uses_blocked_matmul(*resampling.resampling_ratio(orig_sr, 16000))
    np.testing.assert_allclose(audio.resample(x, orig_sr), default, atol=2e-6, rtol=0)


# --------------------------------------------------------------------------- one rate limit


def test_read_wav_and_load_audio_share_one_rate_limit():
    assert audio.MIN_SOURCE_RATE == wav.MIN_SAMPLE_RATE
    assert audio.MAX_SOURCE_RATE == wav.MAX_SAMPLE_RATE
    for rate in (wav.MIN_SAMPLE_RATE, wav.MAX_SAMPLE_RATE):
        assert read_wav(hostile_wav(rate))[1] == rate
    for rate in (1, wav.MIN_SAMPLE_RATE - 1, wav.MAX_SAMPLE_RATE + 1, 2**32 - 1):
        data = bytearray(hostile_wav())
        data[24:28] = rate.to_bytes(4, "little")  # the fmt chunk's sample-rate field
        expected = (rf"sample rate {rate} Hz is outside the accepted range 1000\.\.1000000 Hz "
                    r"\(MIN_SAMPLE_RATE\.\.MAX_SAMPLE_RATE")
        with pytest.raises(FormatError, match=expected):
            read_wav(bytes(data))
        with pytest.raises(FormatError, match=expected):
            audio.load_audio(bytes(data))


def test_the_rate_limit_names_the_file(tmp_path):
    data = bytearray(hostile_wav())
    data[24:28] = (5).to_bytes(4, "little")
    path = tmp_path / "slow.wav"
    path.write_bytes(bytes(data))
    with pytest.raises(FormatError, match=rf"{path}: sample rate 5 Hz"):
        read_wav(path)


def test_external_decoders_are_held_to_the_same_limit(monkeypatch):
    monkeypatch.setattr(audio, "_import_soundfile", lambda: object())
    monkeypatch.setattr(audio, "_decode_with_soundfile",
                        lambda soundfile, data, *cap: (np.zeros(10, np.float32), 5))
    with pytest.raises(FormatError, match="sample rate 5 Hz is outside the accepted range"):
        audio.load_audio(b"fLaC" + bytes(40))


def test_writers_refuse_what_the_reader_refuses(tmp_path):
    with pytest.raises(FormatError, match="MIN_SAMPLE_RATE"):
        encode_wav(np.zeros(4), wav.MIN_SAMPLE_RATE - 1)
    with pytest.raises(FormatError, match="MIN_SAMPLE_RATE"):
        wav.read_raw_int16(bytes(4), 1)
