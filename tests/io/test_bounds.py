"""Issue 28, the readers' stated bounds (README "Bounds"): an npz deflate bomb inside the old
caps, and paths that are not regular files. Each reproducer runs in a child process capped at
200 MB over the interpreter (tests/bounded_run_testlib.py) and must end in a typed error or a correct
result."""

from __future__ import annotations

import os
import struct
import zlib

import numpy as np
import pytest

from tests.bounded_run_testlib import assert_typed_error, run_bounded
from candle_web.core.errors import FormatError
from candle_web.io import npz
from candle_web.io.files import check_regular_file, open_regular_file

MIB = 1 << 20


def deflated_zeros_npz(name: str, total_bytes: int) -> bytes:
    """An npz whose one deflated member is an npy of `total_bytes` (header included) of
    float32 zeros, built without inflating or deflating it all: after a full flush a deflate
    stream forgets its history, so one compressed MiB of zeros can be repeated. The CRC is left
    at 0: the reader must refuse the member before it could check it."""
    header = npz.encode_npy_header(np.dtype("<f4"), ((total_bytes - 128) // 4,), False)
    assert len(header) == 128 and (total_bytes - 128) % 4 == 0
    compressor = zlib.compressobj(9, zlib.DEFLATED, -15)
    head = compressor.compress(header) + compressor.flush(zlib.Z_FULL_FLUSH)
    block = compressor.compress(bytes(MIB)) + compressor.flush(zlib.Z_FULL_FLUSH)
    blocks, rest = divmod(total_bytes - len(header), MIB)
    tail = compressor.compress(bytes(rest)) + compressor.flush()
    stream = head + block * blocks + tail
    filename = (name + ".npy").encode()
    local = struct.pack("<4s5H3L2H", b"PK\x03\x04", 20, 0, 8, 0, 0x21, 0, len(stream),
                        total_bytes, len(filename), 0) + filename
    central = struct.pack("<4s6H3L5H2L", b"PK\x01\x02", 20, 20, 0, 8, 0, 0x21, 0,
                          len(stream), total_bytes, len(filename), 0, 0, 0, 0, 0, 0) + filename
    end = struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, 1, 1, len(central),
                      len(local) + len(stream), 0)
    return local + stream + central + end


def test_the_bomb_builder_makes_a_real_npz():
    """The same construction at 3 MiB inflates to what numpy reads (CRC apart)."""
    data = deflated_zeros_npz("w", 3 * MIB + 128)
    archive = npz.NpzFile(data)
    member = archive.info("w")
    assert member.compressed and member.file_size == 3 * MIB + 128
    assert member.file_size / member.compress_size > 500  # zeros: far above 100x
    with pytest.raises(FormatError, match="CRC"):  # inflated in full, then the fake CRC
        archive.get_numpy("w")


def test_npz_deflate_bomb_of_1_9_gb_is_refused_within_200_mb(tmp_path):
    """The finding: 1.9 GB of zeros in one deflated member of a 1.94 MB file passed the 2 GiB
    member cap and the 1032x deflate limit; get_numpy took 43 s and 1.98 GB."""
    path = tmp_path / "bomb.npz"
    path.write_bytes(deflated_zeros_npz("w", 1_900_000_128))
    assert path.stat().st_size < 2_000_000
    result = run_bounded("npz.NpzFile(path).get_numpy('w')",
                         setup=f"from candle_web.io import npz\npath = {str(path)!r}")
    message = assert_typed_error(result, "bomb.npz member 'w.npy'", "1900000128",
                                 "max_deflate_ratio")
    assert "64 MiB" in message


def test_the_same_bomb_reads_when_the_user_raises_the_ratio():
    """A bounded, correct result on request: 80 MiB of zeros with max_deflate_ratio raised."""
    data = deflated_zeros_npz("w", 80 * MIB + 128)
    with pytest.raises(FormatError, match="max_deflate_ratio"):
        npz.NpzFile(data).get_numpy("w")
    # The fake CRC is the only thing wrong with it: give it the right one.
    crc = zlib.crc32(bytes(80 * MIB), zlib.crc32(npz.encode_npy_header(
        np.dtype("<f4"), (80 * MIB // 4,), False)))
    fixed = bytearray(data)
    central = fixed.rfind(b"PK\x01\x02")
    fixed[14:18] = fixed[central + 16:central + 20] = struct.pack("<L", crc)
    array = npz.NpzFile(bytes(fixed), max_deflate_ratio=2000).get_numpy("w")
    assert array.shape == (80 * MIB // 4,) and not array.any()


def test_highly_compressed_members_share_one_allowance_per_archive(tmp_path):
    """Near-constant members (masks, zero buffers) above 100x read while their total stays
    within 64 MiB: GPT-2's twelve 4 MiB causal masks do; then 10 MiB of zeros fit, a second
    10 MiB does not."""
    mask = np.tril(np.ones((1024, 1024), np.float32))[None, None]  # 4 MiB
    path = tmp_path / "masks.npz"
    np.savez_compressed(path, **{f"h.{i}.attn.bias": mask for i in range(12)},
                        a=np.zeros(10 * MIB // 4, np.float32), b=np.zeros(10 * MIB // 4,
                                                                         np.float32))
    archive = npz.NpzFile(path)
    first = archive.info("h.0.attn.bias")
    assert first.file_size > 100 * first.compress_size  # the masks do count
    for i in range(12):
        assert np.array_equal(archive.get_numpy(f"h.{i}.attn.bias"), mask)
    assert np.array_equal(archive.get_numpy("h.0.attn.bias"), mask)  # a re-read counts once
    assert not archive.get_numpy("a").any()  # 48 + 10 MiB
    with pytest.raises(FormatError, match=r"member 'b\.npy'.*max_deflate_ratio"):
        archive.get_numpy("b")  # 48 + 10 + 10 MiB > 64 MiB


def test_real_weights_deflate_far_below_the_ratio():
    """What the ratio is measured against: random-initialised float weights deflate ~1.1x."""
    weights = np.random.default_rng(0).standard_normal((512, 512)).astype(np.float32)
    archive = npz.NpzFile(npz.save({"w": weights}, compressed=True))
    member = archive.info("w")
    assert member.file_size / member.compress_size < 2
    assert np.array_equal(archive.get_numpy("w"), weights)


# ---- paths that are not regular files --------------------------------------------------------

@pytest.fixture()
def fifo(tmp_path):
    path = tmp_path / "stream.wav"
    os.mkfifo(path)
    return path


@pytest.mark.parametrize("kind", ["/dev/zero", "fifo", "folder"])
def test_special_files_are_refused_without_reading_or_blocking(kind, fifo, tmp_path):
    path = {"/dev/zero": "/dev/zero", "fifo": str(fifo), "folder": str(tmp_path)}[kind]
    what = {"/dev/zero": "a character device", "fifo": "a FIFO (named pipe)",
            "folder": "a directory"}[kind]
    result = run_bounded("load_audio(path)", hang_seconds=20,
                         setup=f"from candle_web.io.audio import load_audio\npath = {path!r}")
    assert_typed_error(result, f"{path}: is {what}, not a regular file", "audio")
    for check in (check_regular_file, open_regular_file):
        with pytest.raises(FormatError, match="not a regular file"):
            check(path)


@pytest.mark.parametrize("suffix", [".gguf", ".safetensors", ".bin", ".npz"])
def test_weights_from_a_fifo_are_refused(tmp_path, suffix):
    from candle_web.io.weights import open_weights

    path = tmp_path / ("model" + suffix)
    os.mkfifo(path)
    with pytest.raises(FormatError, match=r"is a FIFO \(named pipe\), not a regular file; a "
                                          r"weights file"):
        open_weights(path)


def test_a_tokenizer_json_fifo_is_refused(tmp_path):
    from candle_web.tokenizers import Tokenizer

    path = tmp_path / "tokenizer.json"
    os.mkfifo(path)
    with pytest.raises(FormatError, match=r"is a FIFO \(named pipe\), not a regular file; "
                                          r"tokenizer.json is read from regular files only"):
        Tokenizer.from_file(path)


def test_a_regular_file_opens_and_a_missing_one_is_an_os_error(tmp_path):
    path = tmp_path / "x.bin"
    path.write_bytes(b"abc")
    with open_regular_file(path) as handle:
        assert handle.read() == b"abc"
    with pytest.raises(FileNotFoundError):
        open_regular_file(tmp_path / "missing")
