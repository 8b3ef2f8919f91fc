"""WAV (RIFF/RIFX/RF64) reading and writing, plus headerless int16 PCM, in pure numpy.

Supported encodings: integer PCM in 8-bit (unsigned), 16/24/32-bit (signed) containers and IEEE
float in 32/64 bits, with any number of channels, in plain ``fmt`` or WAVE_FORMAT_EXTENSIBLE
form. Samples come back as float32 in [-1, 1) (float files as stored), shaped [frames, channels].

Policies for damaged or unusual files (each one explicit, so callers know what they get):

- Chunks are 2-byte aligned: an odd-sized chunk is followed by one pad byte (a writer that
  forgot it is recognised by where the next chunk id is). Unknown chunks (LIST, fact, JUNK,
  bext, cue ...) are skipped. A missing final pad byte is tolerated.
- The RIFF size field is not trusted for the chunk walk (writers often get it wrong); chunk
  sizes are checked against the bytes actually present.
- A ``data`` chunk that declares more bytes than remain ("lying data size") is read up to the
  end of the buffer only when the header says so: the file is a *streamed* WAV whose writer
  could not seek back (a placeholder size 0, 0x7FFFFFFF or 0xFFFFFFFF in the data or RIFF
  field, as ffmpeg leaves on a pipe), or the RIFF size matches the buffer length exactly (the
  file is whole and only the data size is wrong). Otherwise the file was cut short and
  FormatError says so, unless the caller passes ``allow_truncated=True``.
- A trailing partial frame (data length not a multiple of the frame size) is dropped, as
  libsndfile does.
- Float samples that are NaN or infinite raise FormatError (they would poison every later step).
- A well-formed file with an empty ``data`` chunk gives an empty [0, channels] array; an empty
  buffer, or bytes that are not a WAV, raise FormatError.

Nothing is allocated from a header value: the samples are a view of the input buffer until the
final float32 conversion, whose size is bounded by the buffer's own length.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

import numpy as np

from ..core.errors import FormatError, ShapeError, UnsupportedError
from .files import open_regular_file

WAVE_FORMAT_PCM = 0x0001
WAVE_FORMAT_IEEE_FLOAT = 0x0003
WAVE_FORMAT_ALAW = 0x0006
WAVE_FORMAT_MULAW = 0x0007
WAVE_FORMAT_EXTENSIBLE = 0xFFFE

# WAVE_FORMAT_EXTENSIBLE carries the real format tag in the first two bytes of a GUID whose
# remaining 14 bytes are this fixed KSDATAFORMAT suffix.
KSDATAFORMAT_GUID_SUFFIX = bytes.fromhex("000000001000800000aa00389b71")

# Placeholder sizes left by writers that stream to a pipe and never seek back: ffmpeg writes
# 0xFFFFFFFF, some recorders INT32_MAX, others leave 0.
STREAMING_SIZE_PLACEHOLDERS = (0, 0x7FFFFFFF, 0xFFFFFFFF)
# RF64 stores the real sizes in the ds64 chunk and puts this in the 32-bit fields.
RF64_SIZE_MARKER = 0xFFFFFFFF

RIFF_HEADER_BYTES = 12  # "RIFF" + u32 size + "WAVE"
RIFF_CHUNK_HEADER_BYTES = 8  # the RIFF size counts everything after "RIFF" + u32 size
CHUNK_HEADER_BYTES = 8  # 4-byte id + u32 size
FMT_MIN_BYTES = 16
FMT_EXTENSIBLE_MIN_BYTES = 40
DS64_MIN_BYTES = 24  # riff size u64, data size u64, sample count u64

MAX_CHANNELS = 1024  # far above any real layout; a larger value is a corrupt header
# Sample rates read_wav, read_raw_int16, encode_wav and load_audio accept: the one limit of
# the package. Real audio runs from 4-8 kHz (telephony, old games) to 384-768 kHz (studio) and
# 1 MHz (ultrasound recorders); outside this range a rate is a corrupt header, and a tiny one
# (1 Hz) would make resampling to 16 kHz produce 16000 outputs per input sample.
MIN_SAMPLE_RATE = 1000
MAX_SAMPLE_RATE = 1_000_000
PCM_CONTAINER_BYTES = (1, 2, 3, 4)
FLOAT_CONTAINER_BYTES = (4, 8)

FORMAT_NAMES = {
    WAVE_FORMAT_PCM: "integer PCM",
    WAVE_FORMAT_IEEE_FLOAT: "IEEE float",
    WAVE_FORMAT_ALAW: "A-law",
    WAVE_FORMAT_MULAW: "mu-law",
    0x0002: "Microsoft ADPCM",
    0x0011: "IMA ADPCM",
    0x0055: "MPEG layer 3",
}


@dataclass(frozen=True)
class WavInfo:
    """What the header of a WAV file says, after validation against the buffer."""

    container: str  # "RIFF", "RIFX" (big-endian) or "RF64"
    format_tag: int  # WAVE_FORMAT_PCM or WAVE_FORMAT_IEEE_FLOAT (EXTENSIBLE resolved)
    channels: int
    sample_rate: int
    bits_per_sample: int  # as declared; the container width is bytes_per_sample * 8
    bytes_per_sample: int
    data_offset: int  # where the sample bytes start in the buffer
    data_bytes: int  # sample bytes actually used (whole frames only)
    frames: int
    streamed: bool  # sizes were placeholders; data ran to the end of the buffer
    truncated: bool  # the data chunk declared more bytes than the buffer holds

    @property
    def duration_s(self) -> float:
        return self.frames / self.sample_rate


def source_bytes(source, what: str) -> tuple[memoryview, str]:
    """Bytes of ``source`` (bytes-like, 1-D uint8 array, path, or binary file object) as a
    memoryview, and a name to use in messages (the path, or ``what``)."""
    # Always hand back a memoryview: slicing it is free, slicing bytes would copy the audio.
    if isinstance(source, (bytes, bytearray)):
        return memoryview(source), what
    if isinstance(source, memoryview):
        if not source.c_contiguous:
            raise FormatError(f"{what}: memoryview must be contiguous")
        return source.cast("B"), what
    if isinstance(source, np.ndarray):
        if source.dtype != np.uint8 or source.ndim != 1:
            raise ShapeError(f"{what}: a numpy buffer must be 1-D uint8, got {source.dtype} "
                             f"with shape {source.shape}")
        return memoryview(np.ascontiguousarray(source)), what
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        try:
            # /dev/zero would read until memory runs out, a FIFO block for ever: refused.
            with open_regular_file(path, "audio") as handle:
                return memoryview(handle.read()), path
        except FileNotFoundError:
            raise FormatError(f"{path}: cannot read it: no such file") from None
        except OSError as exc:
            raise FormatError(f"{path}: cannot read it: {exc.strerror or exc}") from exc
    if hasattr(source, "read"):
        data = source.read()
        if not isinstance(data, (bytes, bytearray)):
            raise FormatError(f"{what}: file object must be opened in binary mode")
        return memoryview(data), str(getattr(source, "name", what))
    raise FormatError(f"{what}: expected bytes, a path or a binary file object, "
                      f"got {type(source).__name__}")


def _describe_start(buffer) -> str:
    head = bytes(buffer[:12])
    return f"first bytes {head!r}" if head else "it is empty"


def parse_wav_header(buffer, *, name: str = "WAV data", allow_truncated: bool = False) -> WavInfo:
    """Walk the chunks of a WAV file held in ``buffer`` and validate its format and sizes."""
    length = len(buffer)
    if length < RIFF_HEADER_BYTES:
        raise FormatError(f"{name}: not a WAV file ({length} bytes, {_describe_start(buffer)}); "
                          f"a WAV file starts with a {RIFF_HEADER_BYTES}-byte RIFF header")
    magic = bytes(buffer[0:4])
    form = bytes(buffer[8:12])
    if magic not in (b"RIFF", b"RIFX", b"RF64") or form != b"WAVE":
        raise FormatError(f"{name}: not a WAV file ({_describe_start(buffer)}; expected "
                          f"'RIFF'/'RIFX'/'RF64' then 'WAVE' at byte 8)")
    container = magic.decode("ascii")
    endian = ">" if container == "RIFX" else "<"
    u16 = struct.Struct(endian + "H")
    u32 = struct.Struct(endian + "I")
    riff_size = u32.unpack_from(buffer, 4)[0]

    fmt = None
    data_offset = data_declared = None
    rf64_data_size = None
    offset = RIFF_HEADER_BYTES
    while offset + CHUNK_HEADER_BYTES <= length:
        chunk_id = bytes(buffer[offset:offset + 4])
        chunk_size = u32.unpack_from(buffer, offset + 4)[0]
        body = offset + CHUNK_HEADER_BYTES
        remaining = length - body
        if chunk_id == b"data":
            data_offset, data_declared = body, chunk_size
            if rf64_data_size is not None and chunk_size == RF64_SIZE_MARKER:
                data_declared = rf64_data_size
            if fmt is not None:
                break  # everything needed is known; what follows the audio is metadata
            # Some writers put fmt after data: skip over the audio (bounded by the buffer).
            offset = _next_chunk(buffer, body, min(data_declared, remaining))
            continue
        if chunk_size > remaining:
            # Only the data chunk may run past the end (handled above); any other chunk that
            # does, before both fmt and data were seen, is a corrupt or truncated header.
            raise FormatError(f"{name}: chunk {chunk_id.decode('latin-1')!r} at byte {offset} "
                              f"declares {chunk_size} bytes but only {remaining} remain "
                              f"(truncated or corrupt header)")
        if chunk_id == b"fmt ":
            fmt = _parse_fmt(buffer, body, chunk_size, u16, u32, name)
        elif chunk_id == b"ds64" and container == "RF64":
            if chunk_size < DS64_MIN_BYTES:
                raise FormatError(f"{name}: RF64 ds64 chunk is {chunk_size} bytes, "
                                  f"needs at least {DS64_MIN_BYTES}")
            rf64_data_size = struct.unpack_from("<Q", buffer, body + 8)[0]
        offset = _next_chunk(buffer, body, chunk_size)

    if fmt is None:
        raise FormatError(f"{name}: WAV file has no 'fmt ' chunk in its {length} bytes")
    if data_offset is None:
        raise FormatError(f"{name}: WAV file has no 'data' chunk")
    if container == "RF64" and rf64_data_size is None:
        raise FormatError(f"{name}: RF64 file has no ds64 chunk before its data")

    format_tag, channels, sample_rate, bits, bytes_per_sample = fmt
    frame_bytes = channels * bytes_per_sample
    available = length - data_offset
    data_bytes, streamed, truncated = _data_extent(
        container, riff_size, data_declared, available, length, allow_truncated)
    if data_bytes is None:
        raise FormatError(f"{name}: data chunk declares {data_declared} bytes but only "
                          f"{available} remain and the RIFF size ({riff_size}) says the file "
                          f"is longer than the {length} bytes given: the file is truncated "
                          f"(pass allow_truncated=True to read the "
                          f"{available // frame_bytes} whole frames that are there)")
    frames = data_bytes // frame_bytes
    return WavInfo(container=container, format_tag=format_tag, channels=channels,
                   sample_rate=sample_rate, bits_per_sample=bits,
                   bytes_per_sample=bytes_per_sample, data_offset=data_offset,
                   data_bytes=frames * frame_bytes, frames=frames, streamed=streamed,
                   truncated=truncated)


def _next_chunk(buffer, body: int, size: int) -> int:
    """Offset of the chunk after one of ``size`` bytes starting at ``body``.

    Odd-sized chunks are followed by a pad byte, but some writers forget it: when the padded
    position does not hold a plausible chunk id and the unpadded one does, trust the latter.
    """
    unpadded = body + size
    if size % 2 == 0:
        return unpadded
    padded = unpadded + 1
    if not _plausible_chunk_id(buffer, padded) and _plausible_chunk_id(buffer, unpadded):
        return unpadded
    return padded


def _plausible_chunk_id(buffer, offset: int) -> bool:
    tag = bytes(buffer[offset:offset + 4])
    return len(tag) == 4 and all(0x20 <= byte < 0x7F for byte in tag)


def _data_extent(container: str, riff_size: int, data_declared: int, available: int,
                 length: int, allow_truncated: bool):
    """How many data bytes to use: (bytes or None when truncated, streamed, truncated)."""
    if data_declared <= available:
        riff_is_placeholder = riff_size in STREAMING_SIZE_PLACEHOLDERS
        if data_declared == 0 and available > 0 and riff_is_placeholder and container != "RF64":
            # Streamed before the sizes were patched: the data runs to the end.
            return available, True, False
        return data_declared, False, False
    if container != "RF64" and (data_declared in STREAMING_SIZE_PLACEHOLDERS
                                or riff_size in STREAMING_SIZE_PLACEHOLDERS):
        return available, True, False
    # The data size lies but the RIFF size agrees with the bytes we have: the file is whole,
    # so what is there is all there is.
    riff_total = RIFF_CHUNK_HEADER_BYTES + riff_size
    if container != "RF64" and riff_total == length:
        return available, False, False
    if allow_truncated:
        return available, False, True
    return None, False, True


def _parse_fmt(buffer, body: int, size: int, u16, u32, name: str):
    if size < FMT_MIN_BYTES:
        raise FormatError(f"{name}: 'fmt ' chunk is {size} bytes, needs at least {FMT_MIN_BYTES}")
    format_tag = u16.unpack_from(buffer, body)[0]
    channels = u16.unpack_from(buffer, body + 2)[0]
    sample_rate = u32.unpack_from(buffer, body + 4)[0]
    block_align = u16.unpack_from(buffer, body + 12)[0]
    bits = u16.unpack_from(buffer, body + 14)[0]
    if format_tag == WAVE_FORMAT_EXTENSIBLE:
        if size < FMT_EXTENSIBLE_MIN_BYTES:
            raise FormatError(f"{name}: WAVE_FORMAT_EXTENSIBLE 'fmt ' chunk is {size} bytes, "
                              f"needs {FMT_EXTENSIBLE_MIN_BYTES}")
        guid = bytes(buffer[body + 24:body + 40])
        if guid[2:] != KSDATAFORMAT_GUID_SUFFIX:
            raise UnsupportedError(f"{name}: WAVE_FORMAT_EXTENSIBLE with an unknown sub-format "
                                   f"GUID {guid.hex()}")
        format_tag = struct.unpack_from("<H", guid, 0)[0]
    if format_tag not in (WAVE_FORMAT_PCM, WAVE_FORMAT_IEEE_FLOAT):
        label = FORMAT_NAMES.get(format_tag, "unknown")
        raise UnsupportedError(f"{name}: WAV encoding 0x{format_tag:04x} ({label}) is not "
                               f"supported natively; only integer PCM and IEEE float are "
                               f"(load_audio can decode it with soundfile or ffmpeg)")
    if not 1 <= channels <= MAX_CHANNELS:
        raise FormatError(f"{name}: channel count {channels} is out of range "
                          f"1..{MAX_CHANNELS}")
    check_sample_rate(sample_rate, name)
    if block_align == 0 or block_align % channels != 0:
        raise FormatError(f"{name}: block align {block_align} is not a positive multiple of "
                          f"the channel count {channels}")
    bytes_per_sample = block_align // channels
    allowed = PCM_CONTAINER_BYTES if format_tag == WAVE_FORMAT_PCM else FLOAT_CONTAINER_BYTES
    if bytes_per_sample not in allowed:
        kind = FORMAT_NAMES[format_tag]
        raise UnsupportedError(f"{name}: {kind} with {bytes_per_sample}-byte samples "
                               f"(block align {block_align}, {channels} channels) is not "
                               f"supported; expected {', '.join(str(b) for b in allowed)} bytes")
    # Valid bits may be fewer than the container (e.g. 20 bits in 3 bytes, left-justified);
    # decoding the whole container gives the right value, so only reject impossible claims.
    if bits > bytes_per_sample * 8:
        raise FormatError(f"{name}: {bits} bits per sample do not fit the {bytes_per_sample}-byte "
                          f"sample container implied by block align {block_align}")
    return format_tag, channels, sample_rate, bits, bytes_per_sample


def check_sample_rate(rate: int, name: str) -> None:
    """Refuse a rate outside MIN_SAMPLE_RATE..MAX_SAMPLE_RATE (the one limit of this package)."""
    if not MIN_SAMPLE_RATE <= rate <= MAX_SAMPLE_RATE:
        raise FormatError(f"{name}: sample rate {rate} Hz is outside the accepted range "
                          f"{MIN_SAMPLE_RATE}..{MAX_SAMPLE_RATE} Hz (MIN_SAMPLE_RATE.."
                          f"MAX_SAMPLE_RATE; corrupt header?)")


def decode_pcm(raw, format_tag: int, bytes_per_sample: int, channels: int,
               big_endian: bool = False) -> np.ndarray:
    """Convert little- (or big-) endian sample bytes into float32 [frames, channels]."""
    order = ">" if big_endian else "<"
    if format_tag == WAVE_FORMAT_IEEE_FLOAT:
        values = np.frombuffer(raw, dtype=f"{order}f{bytes_per_sample}").astype(np.float32)
    elif bytes_per_sample == 1:
        # 8-bit WAV is unsigned with 128 as silence.
        values = (np.frombuffer(raw, dtype=np.uint8).astype(np.float32) - 128.0) / 128.0
    elif bytes_per_sample == 3:
        values = _decode_int24(raw, big_endian)
    else:
        ints = np.frombuffer(raw, dtype=f"{order}i{bytes_per_sample}")
        scale = np.float32(1.0 / (1 << (8 * bytes_per_sample - 1)))
        values = ints.astype(np.float32) * scale
    return values.reshape(-1, channels)


def _decode_int24(raw, big_endian: bool) -> np.ndarray:
    # Place the three bytes in the top of an int32 (the low byte stays zero), so the sign comes
    # for free, then scale by 2**-31.
    triples = np.frombuffer(raw, dtype=np.uint8).reshape(-1, 3)
    widened = np.zeros((triples.shape[0], 4), dtype=np.uint8)
    widened[:, 1:] = triples[:, ::-1] if big_endian else triples
    ints = widened.view("<i4").reshape(-1)
    return ints.astype(np.float32) * np.float32(1.0 / 2**31)


def read_wav(source, *, mono: bool = False, allow_truncated: bool = False,
             name: str | None = None) -> tuple[np.ndarray, int]:
    """Read a WAV file from bytes, a path or a binary file object.

    Returns ``(samples, sample_rate)``: float32 [frames, channels], or [frames] when ``mono``
    (channels averaged). See the module docstring for the handling of damaged files. ``name``
    overrides how the source is called in error messages.
    """
    buffer, default_name = source_bytes(source, "read_wav")
    name = name or default_name
    info = parse_wav_header(buffer, name=name, allow_truncated=allow_truncated)
    raw = buffer[info.data_offset:info.data_offset + info.data_bytes]
    samples = decode_pcm(raw, info.format_tag, info.bytes_per_sample, info.channels,
                         big_endian=info.container == "RIFX")
    if info.format_tag == WAVE_FORMAT_IEEE_FLOAT:
        _reject_non_finite(samples, name)
    if mono:
        samples = downmix(samples)
    return samples, info.sample_rate


def _reject_non_finite(samples: np.ndarray, name: str) -> None:
    finite = np.isfinite(samples)
    if not finite.all():
        bad = np.flatnonzero(~finite.reshape(-1))
        frame = bad[0] // samples.shape[1]
        raise FormatError(f"{name}: {bad.size} samples are NaN or infinite (first at frame "
                          f"{frame}); refusing to decode corrupt float audio")


def downmix(samples: np.ndarray) -> np.ndarray:
    """Average the channels of a [frames, channels] array into float32 [frames]."""
    if samples.ndim == 1:
        return samples.astype(np.float32, copy=False)
    if samples.shape[1] == 1:
        return samples[:, 0].copy()
    return samples.mean(axis=1, dtype=np.float32)


def read_raw_int16(source, sample_rate: int = 16000, *, name: str | None = None
                   ) -> tuple[np.ndarray, int]:
    """Read headerless mono little-endian int16 PCM; returns (float32 [n], sample_rate)."""
    buffer, default_name = source_bytes(source, "read_raw_int16")
    name = name or default_name
    check_sample_rate(sample_rate, name)
    if len(buffer) % 2 != 0:
        raise FormatError(f"{name}: raw int16 data must have an even byte count, got "
                          f"{len(buffer)}")
    ints = np.frombuffer(buffer, dtype="<i2")
    return ints.astype(np.float32) * np.float32(1.0 / 32768.0), sample_rate


def encode_wav(samples, sample_rate: int, sample_format: str = "pcm16") -> bytes:
    """Encode float samples ([n] or [n, channels]) as a WAV file: "pcm16" or "float32"."""
    array = np.asarray(samples)
    if array.ndim == 1:
        array = array[:, None]
    if array.ndim != 2 or array.shape[1] < 1:
        raise ShapeError(f"encode_wav: samples must be [n] or [n, channels], got shape "
                         f"{array.shape}")
    channels = array.shape[1]
    if not 1 <= channels <= MAX_CHANNELS:
        raise ShapeError(f"encode_wav: {channels} channels is out of range 1..{MAX_CHANNELS}")
    if not isinstance(sample_rate, (int, np.integer)):
        raise FormatError(f"encode_wav: sample rate must be an integer, got {sample_rate!r}")
    check_sample_rate(int(sample_rate), "encode_wav")  # never write what read_wav refuses
    if sample_format == "pcm16":
        # Full scale is 32768 so that decoding (x / 32768) inverts it; +1.0 clips to 32767.
        scaled = np.rint(np.asarray(array, dtype=np.float64) * 32768.0)
        payload = np.clip(scaled, -32768, 32767).astype("<i2").tobytes()
        format_tag, sample_bytes = WAVE_FORMAT_PCM, 2
    elif sample_format == "float32":
        payload = np.asarray(array, dtype="<f4").tobytes()
        format_tag, sample_bytes = WAVE_FORMAT_IEEE_FLOAT, 4
    else:
        raise UnsupportedError(f"encode_wav: sample_format must be 'pcm16' or 'float32', got "
                               f"{sample_format!r}")
    block_align = channels * sample_bytes
    if len(payload) > 0xFFFFFFFF - 64:
        raise UnsupportedError(f"encode_wav: {len(payload)} bytes of audio exceed what a RIFF "
                               f"file can hold")
    fmt_body = struct.pack("<HHIIHH", format_tag, channels, int(sample_rate),
                           int(sample_rate) * block_align, block_align, sample_bytes * 8)
    chunks = []
    if format_tag == WAVE_FORMAT_IEEE_FLOAT:
        # Non-PCM formats carry cbSize in fmt and a fact chunk with the frame count.
        fmt_body += struct.pack("<H", 0)
        chunks.append(b"fmt " + struct.pack("<I", len(fmt_body)) + fmt_body)
        chunks.append(b"fact" + struct.pack("<II", 4, array.shape[0]))
    else:
        chunks.append(b"fmt " + struct.pack("<I", len(fmt_body)) + fmt_body)
    pad = b"\x00" if len(payload) & 1 else b""
    chunks.append(b"data" + struct.pack("<I", len(payload)) + payload + pad)
    body = b"WAVE" + b"".join(chunks)
    return b"RIFF" + struct.pack("<I", len(body)) + body


def write_wav(path, samples, sample_rate: int, sample_format: str = "pcm16") -> None:
    """Write ``samples`` to ``path`` as a WAV file (see :func:`encode_wav`)."""
    data = encode_wav(samples, sample_rate, sample_format)
    with open(os.fspath(path), "wb") as handle:
        handle.write(data)
