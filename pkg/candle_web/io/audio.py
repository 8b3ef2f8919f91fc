"""Audio input and the Whisper log-mel front end, in pure numpy.

- :func:`decode_audio_file` / :func:`load_audio`: WAV and headerless int16 natively; other
  containers (FLAC, Ogg, MP3, ...) through ``soundfile`` or an ``ffmpeg`` executable when either
  is present (both looked up at call time, so this module imports in Pyodide). ``max_seconds``
  caps the duration while decoding (:class:`AudioTooLong`): a server is bounded by its cap, not
  by what an upload holds.
- :func:`resample` (io/resample.py): band-limited polyphase resampling with a Kaiser-windowed sinc.
- :func:`mel_filters` and :func:`log_mel_spectrogram`: the same numbers as openai-whisper's
  ``audio.py`` (Slaney mel bank as librosa computes it; periodic Hann STFT with reflect padding).
"""

from __future__ import annotations

import io
import math
import os
import re
from functools import lru_cache

import numpy as np

from ..core.errors import DTypeMismatch, FormatError, ShapeError, UnsupportedError
from .resample import (SAMPLE_RATE, design_resampling_filter, filter_half_length, kaiser_window,  # noqa: F401
                       resample, resampling_ratio, uses_blocked_matmul)
from .wav import (MAX_SAMPLE_RATE, MIN_SAMPLE_RATE, check_sample_rate, downmix, parse_wav_header,
                  read_raw_int16, read_wav, source_bytes)

# Whisper's fixed audio hyper-parameters.
N_FFT = 400
HOP_LENGTH = 160
CHUNK_LENGTH = 30  # seconds of audio per encoder window
N_SAMPLES = CHUNK_LENGTH * SAMPLE_RATE  # 480000
N_FRAMES = N_SAMPLES // HOP_LENGTH  # 3000 mel frames per window
FRAMES_PER_SECOND = SAMPLE_RATE // HOP_LENGTH  # 100

# log-mel details of openai-whisper.
LOG_MEL_FLOOR = 1e-10  # power floor before log10
LOG_MEL_DYNAMIC_RANGE = 8.0  # keep 8 decades (80 dB) below the loudest bin
STFT_BATCH_FRAMES = 256  # frames per rfft batch: stays in L2 cache (measured 3-5x faster
# than one 3000-frame rfft)
MEL_BATCH_FRAMES = N_FRAMES  # frames per mel-filter matmul: bounds memory on long audio

# Slaney's auditory-toolbox mel scale (librosa's default, htk=False): linear below 1 kHz,
# logarithmic above.
SLANEY_HZ_PER_MEL = 200.0 / 3.0
SLANEY_BREAK_HZ = 1000.0
SLANEY_BREAK_MEL = SLANEY_BREAK_HZ / SLANEY_HZ_PER_MEL  # 15 mels
SLANEY_LOG_STEP = math.log(6.4) / 27.0

# Signatures of compressed/other containers, for a precise message when no decoder exists.
KNOWN_SIGNATURES = (
    (0, b"fLaC", "FLAC"),
    (0, b"OggS", "Ogg"),
    (0, b"ID3", "MP3"),
    (0, b"FORM", "AIFF"),
    (0, b"\x1aE\xdf\xa3", "Matroska/WebM"),
    (4, b"ftyp", "MP4/M4A"),
    (0, b".snd", "Sun AU"),
    (0, b"caff", "CAF"),
)
RAW_INT16_SUFFIXES = (".raw", ".pcm")
# Source rates load_audio accepts: read_wav's limits, so that external decoders are held to the
# same range as WAV files (the names predate the shared constant).
MIN_SOURCE_RATE = MIN_SAMPLE_RATE
MAX_SOURCE_RATE = MAX_SAMPLE_RATE
# Frames soundfile decodes per read: each block is downmixed into the mono result before the
# next, so a stereo file never holds all its channels at once (1 MB of float32 per channel).
DECODE_BLOCK_FRAMES = 1 << 18
# ffmpeg is told to stop this long past the cap (`-t`): output beyond the cap proves the audio
# too long without decoding the rest of it.
FFMPEG_CAP_MARGIN_S = 1.0


class AudioTooLong(FormatError):
    """The audio lasts longer than the caller's ``max_seconds``. Raised from the header's frame
    count when the container states it (``exact``), else as soon as decoding passes the cap
    (``duration_s`` is then how far it got: "more than")."""

    def __init__(self, name: str, duration_s: float, max_seconds: float, exact: bool):
        self.duration_s, self.max_seconds, self.exact = duration_s, max_seconds, exact
        super().__init__(f"{name}: the audio lasts {self.lasts}, above the limit of "
                         f"{max_seconds:g} s")

    @property
    def lasts(self) -> str:
        """"7200.0 s", or "more than 61.0 s" when decoding stopped past the cap."""
        return f"{self.duration_s:.1f} s" if self.exact else f"more than {self.duration_s:.1f} s"


def _check_duration(frames: int, rate: int, max_seconds: float | None, name: str,
                    exact: bool = True) -> None:
    if max_seconds is not None and rate > 0 and frames > max_seconds * rate:
        raise AudioTooLong(name, frames / rate, max_seconds, exact)


# ----------------------------------------------------------------------------------------------
# Decoding


def decode_audio_file(source, *, format: str | None = None, raw_sample_rate: int = SAMPLE_RATE,
                      max_seconds: float | None = None) -> tuple[np.ndarray, int]:
    """Decode audio into (float32 mono samples, native sample rate).

    ``source``: a path, bytes-like object, 1-D uint8 numpy array or binary file object.

    ``format``: None to detect (WAV by its header, other ``.raw``/``.pcm`` paths as headerless
    int16), "wav", "raw" (mono int16 little-endian at ``raw_sample_rate``), or anything else to
    go to the external decoders directly. Non-finite samples raise FormatError.

    ``max_seconds``: audio longer than this raises :class:`AudioTooLong` without being decoded
    past the cap (WAV, raw int16 and soundfile from the header's frame count; ffmpeg stops
    FFMPEG_CAP_MARGIN_S after it), so the samples held never exceed the cap.
    """
    if max_seconds is not None and not max_seconds > 0:
        raise ShapeError(f"decode_audio_file: max_seconds must be > 0, got {max_seconds!r}")
    data, name = source_bytes(source, "audio bytes")
    if format is None and name.lower().endswith(RAW_INT16_SUFFIXES) and not _looks_like_wav(data):
        format = "raw"
    if format == "raw":
        check_sample_rate(raw_sample_rate, name)
        _check_duration(len(data) // 2, raw_sample_rate, max_seconds, name)
        return read_raw_int16(data, raw_sample_rate, name=name)
    if len(data) == 0:
        raise FormatError(f"{name}: empty input (0 bytes), not an audio file")
    if format in (None, "wav") and _looks_like_wav(data):
        try:
            info = parse_wav_header(data, name=name)
        except UnsupportedError as native_error:
            # A WAV codec we do not decode (A-law, ADPCM...): an external decoder may.
            return _decode_external(data, name, native_error, max_seconds)
        _check_duration(info.frames, info.sample_rate, max_seconds, name)
        return read_wav(data, mono=True, name=name)
    if format == "wav":
        raise FormatError(f"{name}: not a WAV file (first bytes {bytes(data[:12])!r})")
    return _decode_external(data, name, None, max_seconds)


def load_audio(source, sr: int = SAMPLE_RATE, *, format: str | None = None,
               raw_sample_rate: int = SAMPLE_RATE, max_seconds: float | None = None) -> np.ndarray:
    """Decode ``source`` (see :func:`decode_audio_file`, ``max_seconds`` included), downmix to
    mono and resample to ``sr``: float32 [n]. Audio with no samples raises FormatError."""
    samples, rate = decode_audio_file(source, format=format, raw_sample_rate=raw_sample_rate,
                                      max_seconds=max_seconds)
    name = os.fspath(source) if isinstance(source, (str, os.PathLike)) else "audio bytes"
    if samples.size == 0:
        raise FormatError(f"{name}: contains no audio samples (0 frames at {rate} Hz)")
    check_sample_rate(rate, name)  # WAV checked it already; soundfile and ffmpeg did not
    return resample(samples, rate, sr)


def _looks_like_wav(data) -> bool:
    return len(data) >= 12 and bytes(data[0:4]) in (b"RIFF", b"RIFX", b"RF64") \
        and bytes(data[8:12]) == b"WAVE"


def _container_name(data) -> str | None:
    head = bytes(data[:16])
    for offset, magic, label in KNOWN_SIGNATURES:
        if head[offset:offset + len(magic)] == magic:
            return label
    # MPEG audio / ADTS AAC frames start with an 11-bit sync word.
    if len(head) >= 2 and head[0] == 0xFF and (head[1] & 0xE0) == 0xE0:
        return "MPEG audio"
    return None


def _decode_external(data, name: str, native_error: Exception | None,
                     max_seconds: float | None = None) -> tuple[np.ndarray, int]:
    """Try soundfile, then ffmpeg; raise a message that says what was tried and why it failed."""
    failures = []
    tried_any = False
    soundfile = _import_soundfile()
    if soundfile is not None:
        tried_any = True
        try:
            return _finite_or_error(*_decode_with_soundfile(soundfile, data, name, max_seconds),
                                    name)
        except FormatError:
            raise
        except Exception as exc:  # libsndfile reports every failure as some RuntimeError
            # It names its input by path or by repr ("<_io.BytesIO object at 0x...>"); the
            # message already starts with the name, so say "the file" instead.
            said = re.sub(r"<_io\.BytesIO object at 0x[0-9a-fA-F]+>", "the file", str(exc))
            failures.append("soundfile: " + said.replace(name, "the file"))
    ffmpeg = _find_ffmpeg()
    if ffmpeg is not None:
        tried_any = True
        try:
            return _finite_or_error(*_decode_with_ffmpeg(ffmpeg, data, name, max_seconds),
                                    name)
        except AudioTooLong:
            raise
        except FormatError as exc:
            failures.append(f"ffmpeg: {exc}")

    container = _container_name(data)
    if not tried_any:
        if native_error is not None:
            raise UnsupportedError(f"{native_error}; neither the 'soundfile' package nor an "
                                   f"'ffmpeg' executable is available to decode it")
        if container is not None:
            raise UnsupportedError(
                f"{name}: {container} audio needs a decoder: install the 'soundfile' package "
                f"(pip install soundfile) or put an 'ffmpeg' executable on PATH; WAV and raw "
                f"int16 are read natively")
        raise FormatError(f"{name}: not a recognised audio file (first bytes "
                          f"{bytes(data[:12])!r}); WAV and raw int16 are read natively, other "
                          f"formats need the 'soundfile' package or an 'ffmpeg' executable")
    kind = f"{container} " if container else ""
    kind = kind if kind.endswith("audio ") else kind + "audio "  # not "MPEG audio audio"
    raise FormatError(f"{name}: could not decode {kind}({len(data)} bytes, first bytes "
                      f"{bytes(data[:12])!r}): " + "; ".join(failures))


def _import_soundfile():
    try:
        import soundfile
    except (ImportError, OSError):  # OSError: the package is there but libsndfile is not
        return None
    return soundfile


def _find_ffmpeg():
    import shutil

    return shutil.which("ffmpeg")


def _decode_with_soundfile(soundfile, data, name: str = "audio bytes",
                           max_seconds: float | None = None) -> tuple[np.ndarray, int]:
    with soundfile.SoundFile(io.BytesIO(bytes(data))) as sound:
        rate = int(sound.samplerate)
        # soundfile reads no further than the frame count libsndfile states, so checking it
        # bounds what follows; a file over the cap is refused from its header alone.
        _check_duration(sound.frames, rate, max_seconds, name)
        samples = np.empty(sound.frames, dtype=np.float32)
        filled = 0
        while filled < samples.size:
            block = sound.read(DECODE_BLOCK_FRAMES, dtype="float32", always_2d=True)
            if len(block) == 0:
                break  # fewer frames than the header said: keep what is there
            samples[filled:filled + len(block)] = downmix(block)
            filled += len(block)
    return samples[:filled], rate


def _decode_with_ffmpeg(ffmpeg: str, data, name: str = "audio bytes",
                        max_seconds: float | None = None) -> tuple[np.ndarray, int]:
    import subprocess

    # Ask for float WAV at the native rate and parse it ourselves, so resampling is ours too.
    # On a pipe ffmpeg cannot seek back to patch sizes; read_wav accepts its placeholders.
    # Under a cap, `-t` stops the output a margin past it: decoding costs the cap, not the file.
    limit = [] if max_seconds is None else ["-t", f"{max_seconds + FFMPEG_CAP_MARGIN_S:g}"]
    command = [ffmpeg, "-nostdin", "-hide_banner", "-loglevel", "error", "-i", "pipe:0",
               "-vn", "-map_metadata", "-1", "-ac", "1", "-c:a", "pcm_f32le", *limit, "-f", "wav",
               "pipe:1"]
    completed = subprocess.run(command, input=bytes(data), capture_output=True, check=False)
    if completed.returncode != 0:
        message = completed.stderr.decode("utf-8", "replace").strip().splitlines()
        raise FormatError(message[-1] if message else f"exit status {completed.returncode}")
    samples, rate = read_wav(completed.stdout, mono=True)
    # What ffmpeg wrote past the cap is all that is known of the length: "more than".
    _check_duration(samples.size, rate, max_seconds, name, exact=False)
    return samples, rate


def _finite_or_error(samples: np.ndarray, rate: int, name: str) -> tuple[np.ndarray, int]:
    finite = np.isfinite(samples)
    if not finite.all():
        bad = np.flatnonzero(~finite)
        raise FormatError(f"{name}: {bad.size} decoded samples are NaN or infinite (first at "
                          f"sample {bad[0]})")
    return samples, rate


# ----------------------------------------------------------------------------------------------
# Whisper front end


def pad_or_trim(array, length: int = N_SAMPLES, *, axis: int = -1) -> np.ndarray:
    """Zero-pad at the end or cut ``array`` along ``axis`` to exactly ``length`` items."""
    array = np.asarray(array)
    if length < 0:
        raise ShapeError(f"pad_or_trim: length must be >= 0, got {length}")
    current = array.shape[axis]
    if current > length:
        return np.take(array, np.arange(length), axis=axis)
    if current < length:
        widths = [(0, 0)] * array.ndim
        widths[axis] = (0, length - current)
        return np.pad(array, widths)
    return array


def hz_to_mel(frequencies):
    """Slaney mel scale (librosa's ``htk=False``)."""
    hz = np.asarray(frequencies, dtype=np.float64)
    linear = hz / SLANEY_HZ_PER_MEL
    with np.errstate(divide="ignore"):
        logarithmic = SLANEY_BREAK_MEL + np.log(np.maximum(hz, 1e-300) / SLANEY_BREAK_HZ) \
            / SLANEY_LOG_STEP
    return np.where(hz >= SLANEY_BREAK_HZ, logarithmic, linear)


def mel_to_hz(mels):
    """Inverse of :func:`hz_to_mel`."""
    mel = np.asarray(mels, dtype=np.float64)
    linear = mel * SLANEY_HZ_PER_MEL
    logarithmic = SLANEY_BREAK_HZ * np.exp(SLANEY_LOG_STEP * (mel - SLANEY_BREAK_MEL))
    return np.where(mel >= SLANEY_BREAK_MEL, logarithmic, linear)


@lru_cache(maxsize=8)
def mel_filters(n_mels: int = 80, sample_rate: int = SAMPLE_RATE, n_fft: int = N_FFT
                ) -> np.ndarray:
    """Slaney-normalised triangular mel filter bank, float32 [n_mels, n_fft//2 + 1].

    Same construction as librosa.filters.mel(sr, n_fft, n_mels) with its defaults (fmin 0,
    fmax sr/2, Slaney scale and area normalisation), which is what Whisper ships.
    """
    if n_mels <= 0 or n_fft <= 0 or sample_rate <= 0:
        raise ShapeError(f"mel_filters: n_mels, sample_rate and n_fft must be positive, got "
                         f"{n_mels}, {sample_rate}, {n_fft}")
    fft_hz = np.fft.rfftfreq(n_fft, d=1.0 / sample_rate)
    # n_mels triangles need n_mels + 2 edges evenly spaced on the mel axis.
    edges_hz = mel_to_hz(np.linspace(hz_to_mel(0.0), hz_to_mel(sample_rate / 2.0), n_mels + 2))
    widths = np.diff(edges_hz)
    distance = edges_hz[:, None] - fft_hz[None, :]  # [n_mels + 2, bins]
    rising = -distance[:-2] / widths[:-1, None]
    falling = distance[2:] / widths[1:, None]
    triangles = np.maximum(0.0, np.minimum(rising, falling))
    # Slaney normalisation: each triangle has unit area over its width in Hz.
    area_norm = 2.0 / (edges_hz[2:] - edges_hz[:-2])
    bank = (triangles * area_norm[:, None]).astype(np.float32)
    bank.flags.writeable = False
    return bank


def hann_window_periodic(length: int) -> np.ndarray:
    """Periodic Hann window (torch.hann_window's default), float32."""
    n = np.arange(length, dtype=np.float64)
    return (0.5 - 0.5 * np.cos(2.0 * np.pi * n / length)).astype(np.float32)


def log_mel_spectrogram(samples, n_mels: int = 80, padding: int = 0) -> np.ndarray:
    """Whisper's log-mel spectrogram of 16 kHz mono audio: float32 [n_mels, n_frames].

    n_frames = (len(samples) + padding) // HOP_LENGTH (the STFT's last frame is dropped, as in
    openai-whisper). ``padding`` zeros are appended first (Whisper passes N_SAMPLES).
    """
    if hasattr(samples, "to_numpy") and not isinstance(samples, np.ndarray):
        samples = samples.to_numpy()
    audio = np.asarray(samples)
    if audio.dtype.kind != "f":
        raise DTypeMismatch(f"log_mel_spectrogram: samples must be float audio in [-1, 1], got "
                            f"{audio.dtype} (integer PCM needs scaling first)")
    if audio.ndim != 1:
        raise ShapeError(f"log_mel_spectrogram: samples must be 1-D mono, got shape "
                         f"{audio.shape}")
    if padding < 0:
        raise ShapeError(f"log_mel_spectrogram: padding must be >= 0, got {padding}")
    audio = audio.astype(np.float32, copy=False)
    if not np.isfinite(audio).all():
        count = int(np.count_nonzero(~np.isfinite(audio)))
        raise FormatError(f"log_mel_spectrogram: {count} samples are NaN or infinite")
    total = audio.size + padding
    if total == 0:
        raise ShapeError("log_mel_spectrogram: no samples (length 0 and padding 0)")

    filters = mel_filters(n_mels)
    half_window = N_FFT // 2
    padded = np.zeros(total + 2 * half_window, dtype=np.float32)
    padded[half_window:half_window + audio.size] = audio
    # Centre the frames like torch.stft(center=True, pad_mode="reflect"): mirror the (already
    # zero-extended) signal at both ends without repeating the edge sample.
    body = padded[half_window:half_window + total]
    _reflect_edges(padded, body, half_window)

    n_frames = total // HOP_LENGTH  # torch yields one more frame; Whisper drops it
    frames = np.lib.stride_tricks.as_strided(
        padded, shape=(n_frames, N_FFT), strides=(HOP_LENGTH * padded.itemsize, padded.itemsize),
        writeable=False)
    window = hann_window_periodic(N_FFT)
    filters_t = np.ascontiguousarray(filters.T)  # [bins, n_mels]
    mel = np.empty((n_frames, n_mels), dtype=np.float32)
    power = np.empty((min(n_frames, MEL_BATCH_FRAMES), N_FFT // 2 + 1), dtype=np.float32)
    for start in range(0, n_frames, MEL_BATCH_FRAMES):
        stop = min(n_frames, start + MEL_BATCH_FRAMES)
        for fft_start in range(start, stop, STFT_BATCH_FRAMES):
            fft_stop = min(stop, fft_start + STFT_BATCH_FRAMES)
            spectrum = np.fft.rfft(frames[fft_start:fft_stop] * window, axis=-1)
            rows = power[fft_start - start:fft_stop - start]
            np.square(spectrum.real, out=rows)
            rows += np.square(spectrum.imag)
        # One large product per batch: many small ones cost more in BLAS thread hand-offs.
        np.matmul(power[:stop - start], filters_t, out=mel[start:stop])

    log_spec = np.log10(np.maximum(mel, np.float32(LOG_MEL_FLOOR)))
    if log_spec.size:
        log_spec = np.maximum(log_spec, log_spec.max() - np.float32(LOG_MEL_DYNAMIC_RANGE))
    log_spec = (log_spec + np.float32(4.0)) / np.float32(4.0)
    return np.ascontiguousarray(log_spec.T)


def _reflect_edges(padded: np.ndarray, body: np.ndarray, width: int) -> None:
    """Fill ``width`` samples on each side of ``body`` (inside ``padded``) by reflection.

    Same as numpy's ``np.pad(body, width, mode="reflect")``, done in place to avoid a copy of
    long audio; for very short bodies numpy's repeated reflection is used.
    """
    length = body.size
    if length > width:
        padded[:width] = body[width:0:-1]
        padded[width + length:] = body[-2:-width - 2:-1]
    else:
        padded[:] = np.pad(body.copy(), width, mode="reflect")
