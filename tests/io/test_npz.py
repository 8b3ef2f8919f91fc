"""npy/npz reader and writer against numpy itself (np.save, np.savez, np.savez_compressed,
np.lib.format.write_array, np.load with allow_pickle=False), plus malformed headers and zip
bombs. Values are compared exactly: npy stores raw bits and nothing is converted lossily.
"""

import io
import pickle
import struct
import tracemalloc
import zipfile

import numpy as np
import pytest

from candle_web.core.errors import CandleError, DTypeMismatch, FormatError, ModelNotFound
from candle_web.core.errors import UnsupportedError
from candle_web.io import npz

try:
    from candle_web import Tensor
    import candle_web as cw
except ImportError:  # the core is written in parallel; these tests run as soon as it imports
    Tensor = None
requires_tensor = pytest.mark.skipif(Tensor is None, reason="candle_web.Tensor not importable")

RNG = np.random.default_rng(99)
NUMERIC_DTYPES = ["?", "u1", "i1", "<i2", ">i2", "<u2", "<i4", ">u4", "<i8", ">u8", "<f2",
                  ">f2", "<f4", ">f4", "<f8", ">f8"]


def sample(dtype, shape):
    dtype = np.dtype(dtype)
    if dtype.kind == "b":
        return RNG.integers(0, 2, shape).astype(dtype)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return RNG.integers(info.min, info.max, shape, dtype=dtype.newbyteorder("="),
                            endpoint=True).astype(dtype)
    return (RNG.standard_normal(shape) * 1000).astype(dtype)


def np_save_bytes(array, version=None) -> bytes:
    buffer = io.BytesIO()
    if version is None:
        np.save(buffer, array, allow_pickle=False)
    else:
        np.lib.format.write_array(buffer, array, version=version, allow_pickle=False)
    return buffer.getvalue()


def assert_same_array(ours, expected):
    expected = np.asarray(expected)
    assert ours.shape == expected.shape
    assert ours.dtype == expected.dtype.newbyteorder("=")  # native order on our side
    assert ours.dtype.isnative
    np.testing.assert_array_equal(ours, expected)


# ------------------------------------------------------------------------------------------
# npy


@pytest.mark.parametrize("dtype", NUMERIC_DTYPES)
@pytest.mark.parametrize("order", ["C", "F"])
def test_read_npy_written_by_numpy(dtype, order):
    array = np.asarray(sample(dtype, (3, 4, 2)), order=order)
    assert_same_array(npz.read_npy(np_save_bytes(array)), array)


@pytest.mark.parametrize("version", [(1, 0), (2, 0), (3, 0)])
def test_read_every_npy_format_version(version):
    array = np.asfortranarray(sample("<f4", (5, 3)))
    data = np_save_bytes(array, version)
    assert data[6:8] == bytes(version)
    ours = npz.read_npy(data)
    assert_same_array(ours, array)
    assert ours.flags.f_contiguous  # Fortran data comes back as a Fortran view


def test_read_npy_scalar_empty_and_zero_copy(tmp_path):
    for array in (np.array(7.5, np.float32), np.zeros((0, 3), np.int16), np.zeros((2, 0)),
                  np.array([], dtype=bool)):
        assert_same_array(npz.read_npy(np_save_bytes(array)), array)
    array = sample("<f8", (64,))
    data = np_save_bytes(array)
    ours = npz.read_npy(data)
    assert np.shares_memory(ours, np.frombuffer(data, np.uint8))  # a view, not a copy
    path = tmp_path / "x.npy"
    path.write_bytes(data)
    assert_same_array(npz.read_npy(path), array)  # memory-mapped
    assert_same_array(npz.read_npy(str(path)), array)
    with pytest.raises(ModelNotFound):
        npz.read_npy(tmp_path / "missing.npy")


@pytest.mark.parametrize("dtype", NUMERIC_DTYPES)
def test_write_npy_loads_in_numpy_and_matches_np_save_bytes(dtype, tmp_path):
    array = sample(dtype, (4, 3))
    ours = npz.write_npy(array)
    assert_same_array(np.load(io.BytesIO(ours), allow_pickle=False), array)
    if np.dtype(dtype).isnative:
        assert ours == np_save_bytes(array)  # same header text, padding and data
        fortran = np.asfortranarray(array)
        assert npz.write_npy(fortran) == np_save_bytes(fortran)  # fortran_order kept
    path = tmp_path / "w.npy"
    assert npz.write_npy(array, path) is None
    assert_same_array(np.load(path, allow_pickle=False), array)


def test_write_npy_scalars_empty_and_strided():
    for array in (np.float64(2.5), np.array(3, np.uint8), np.zeros((0, 5), np.float32),
                  sample("<i4", (6, 8))[::2, 1::3]):
        assert_same_array(np.load(io.BytesIO(npz.write_npy(array)), allow_pickle=False), array)


def test_writer_refuses_unsupported_dtypes():
    for bad in (np.array([object()]), np.array(["text"]), np.array([1 + 2j]),
                np.zeros(2, dtype=[("a", "<f4")])):
        with pytest.raises(DTypeMismatch, match="not supported"):
            npz.write_npy(bad)


def npy_with_header(literal: str, data: bytes = b"", version=(1, 0)) -> bytes:
    header = literal.encode("latin1")
    length = struct.pack("<H" if version[0] == 1 else "<I", len(header))
    return b"\x93NUMPY" + bytes(version) + length + header + data


GOOD_HEADER = "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }"
BAD_NPY = [
    ("not npy", b"PK\x03\x04 not an npy file", FormatError, "not an npy file"),
    ("short", b"\x93NUM", FormatError, "not an npy file"),
    ("version 4", npy_with_header(GOOD_HEADER, bytes(8), (4, 0)), FormatError,
     "version 4.0"),
    ("minor version", npy_with_header(GOOD_HEADER, bytes(8), (1, 1)), FormatError,
     "version 1.1"),
    ("header past end", b"\x93NUMPY\x01\x00\xff\x00{'descr'", FormatError, "runs past the end"),
    ("header over cap", b"\x93NUMPY\x02\x00" + struct.pack("<I", 2**31) + b"{",
     FormatError, "exceeds the 10000-byte cap"),
    ("header not literal", npy_with_header("{'descr': __import__('os')}"), FormatError,
     "not a Python literal"),
    ("header not dict", npy_with_header("[1, 2]"), FormatError, "must be a dict"),
    ("missing key", npy_with_header("{'descr': '<f4', 'shape': (2,)}", bytes(8)), FormatError,
     "header keys"),
    ("extra key", npy_with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), "
                                  "'x': 1}", bytes(8)), FormatError, "header keys"),
    ("fortran not bool", npy_with_header("{'descr': '<f4', 'fortran_order': 0, 'shape': (2,)}",
                                         bytes(8)), FormatError, "fortran_order"),
    ("negative dim", npy_with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (-2,)}",
                                     bytes(8)), FormatError, "'shape'"),
    ("shape list", npy_with_header("{'descr': '<f4', 'fortran_order': False, 'shape': [2]}",
                                   bytes(8)), FormatError, "'shape'"),
    ("shape float", npy_with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (2.0,)}",
                                    bytes(8)), FormatError, "'shape'"),
    ("shape overflow", npy_with_header(
        "{'descr': '<f8', 'fortran_order': False, 'shape': (2**40, 2**40)}".replace(
            "2**40", str(2**40))), FormatError, "overflows"),
    ("truncated data", npy_with_header(GOOD_HEADER, bytes(7)), FormatError,
     "truncated data: 7 bytes.*needs 8"),
    ("trailing data", npy_with_header(GOOD_HEADER, bytes(9)), FormatError, "1 trailing bytes"),
    ("no byte order", npy_with_header("{'descr': '|f4', 'fortran_order': False, 'shape': (2,)}",
                                      bytes(8)), FormatError, "byte order"),
    ("object", npy_with_header("{'descr': '|O', 'fortran_order': False, 'shape': (2,)}",
                               bytes(16)), UnsupportedError, "object array.*unpickling"),
    ("structured", npy_with_header("{'descr': [('a', '<f4')], 'fortran_order': False, "
                                   "'shape': (2,)}", bytes(8)), UnsupportedError, "structured"),
    ("complex", npy_with_header("{'descr': '<c8', 'fortran_order': False, 'shape': (1,)}",
                                bytes(8)), UnsupportedError, "'<c8'"),
    ("float128", npy_with_header("{'descr': '<f16', 'fortran_order': False, 'shape': (1,)}",
                                 bytes(16)), UnsupportedError, "'<f16'"),
    ("bad utf-8 v3", b"\x93NUMPY\x03\x00" + struct.pack("<I", 4) + b"{\xff\xfe}", FormatError,
     "not valid utf"),
]


@pytest.mark.parametrize("case, data, error, message", BAD_NPY, ids=[c[0] for c in BAD_NPY])
def test_malformed_npy_is_refused_with_a_named_problem(case, data, error, message):
    with pytest.raises(error, match=message):
        npz.read_npy(data)


def test_object_arrays_are_refused_without_unpickling(monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("pickle must never be used")

    monkeypatch.setattr(pickle, "loads", forbidden)
    monkeypatch.setattr(pickle, "load", forbidden)
    monkeypatch.setattr(pickle, "Unpickler", forbidden)
    buffer = io.BytesIO()
    np.save(buffer, np.array([{"a": 1}, None], dtype=object), allow_pickle=True)
    with pytest.raises(UnsupportedError, match="object array"):
        npz.read_npy(buffer.getvalue())
    for writer in (np.savez, np.savez_compressed):
        archive = io.BytesIO()
        writer(archive, ok=np.arange(3), evil=np.array([object()], dtype=object))
        reader = npz.NpzFile(archive.getvalue())
        np.testing.assert_array_equal(reader.get_numpy("ok"), np.arange(3))
        with pytest.raises(UnsupportedError, match="'evil.npy'.*object array"):
            reader.get_numpy("evil")


# ------------------------------------------------------------------------------------------
# npz


def mixed_arrays():
    return {"weights": sample("<f4", (6, 5)), "ids": sample("<i8", (7,)),
            "be": sample(">f8", (2, 3)), "fortran": np.asfortranarray(sample("<u2", (3, 4))),
            "mask": sample("?", (4,)), "scalar": np.array(1.25, np.float16),
            "empty": np.zeros((0, 2), np.int32), "nested/name": sample("u1", (3,))}


@pytest.mark.parametrize("writer", [np.savez, np.savez_compressed])
def test_read_npz_written_by_numpy(writer, tmp_path):
    arrays = mixed_arrays()
    path = tmp_path / "a.npz"
    writer(path, **arrays)
    for source in (path, path.read_bytes()):
        reader = npz.NpzFile(source)
        assert reader.keys() == sorted(arrays)
        for name, array in arrays.items():
            assert_same_array(reader.get_numpy(name), array)
    loaded = npz.load_numpy(path)
    assert sorted(loaded) == sorted(arrays)


def test_stored_members_written_here_are_aligned_views_of_the_archive():
    arrays = {"big": sample("<f8", (128,)), "odd name ü": sample("<f4", (3, 5)),
              "third": sample("<i2", (7,))}
    data = npz.save(arrays)
    whole = np.frombuffer(data, np.uint8)
    reader = npz.NpzFile(data)
    for name, array in arrays.items():
        ours = reader.get_numpy(name)
        assert_same_array(ours, array)
        assert np.shares_memory(ours, whole), f"{name} was copied"
    # np.savez does not align its members: still read correctly (copied where unaligned).
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    for name, array in arrays.items():
        assert_same_array(npz.NpzFile(buffer.getvalue()).get_numpy(name), array)


@pytest.mark.parametrize("compressed", [False, True])
def test_written_npz_loads_in_numpy(compressed, tmp_path):
    arrays = mixed_arrays()
    data = npz.save(arrays, compressed=compressed)
    with np.load(io.BytesIO(data), allow_pickle=False) as loaded:
        assert sorted(loaded.files) == sorted(arrays)
        for name, array in arrays.items():
            assert_same_array(loaded[name], array)
    methods = {info.compress_type for info in zipfile.ZipFile(io.BytesIO(data)).infolist()}
    assert methods == {zipfile.ZIP_DEFLATED if compressed else zipfile.ZIP_STORED}
    path = tmp_path / "ours.npz"
    assert npz.save(arrays, path, compressed=compressed) is None
    assert path.read_bytes() == data  # deterministic: fixed timestamps
    for name, array in npz.load_numpy(path).items():
        assert_same_array(array, arrays[name])


def test_members_are_read_lazily_one_at_a_time():
    # Corrupt one stored member: the others still read; the corrupt one fails alone.
    data = bytearray(zip_bytes({"good.npy": np_save_bytes(np.arange(4)),
                                "bad.npy": np_save_bytes(np.arange(100, 104))}))
    position = data.index(np.arange(100, 104).tobytes())
    data[position] ^= 0xFF
    reader = npz.NpzFile(bytes(data))
    np.testing.assert_array_equal(reader.get_numpy("good"), np.arange(4))
    with pytest.raises(FormatError, match="'bad.npy'.*CRC"):
        reader.get_numpy("bad")


# ------------------------------------------------------------------------------------------
# Malformed archives and zip bombs


def zip_bytes(members: dict, method=zipfile.ZIP_STORED) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=method) as archive:
        for name, payload in members.items():
            archive.writestr(name, payload)
    return buffer.getvalue()


def patch_declared_size(data: bytes, size: int) -> bytes:
    """Rewrite the uncompressed size in every central-directory and local header."""
    patched = bytearray(data)
    for signature, offset in ((b"PK\x01\x02", 24), (b"PK\x03\x04", 22)):
        start = 0
        while (start := patched.find(signature, start)) >= 0:
            patched[start + offset:start + offset + 4] = struct.pack("<I", size)
            start += 4
    return bytes(patched)


def traced_peak(function) -> int:
    """Peak bytes allocated while running function (which must raise a CandleError)."""
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        with pytest.raises(CandleError) as caught:
            function()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak - before, caught.value


def test_member_above_the_cap_is_refused_before_inflating():
    zeros = np.zeros(1 << 20, np.uint8)  # 1 MiB of zeros deflates to ~1 KiB
    data = npz.save({"zeros": zeros}, compressed=True)
    assert len(data) < 4096
    peak, error = traced_peak(
        lambda: npz.NpzFile(data, max_member_bytes=100_000).get_numpy("zeros"))
    assert isinstance(error, FormatError) and "above the cap of 100000" in str(error)
    assert peak < 64 * 1024
    np.testing.assert_array_equal(npz.NpzFile(data).get_numpy("zeros"), zeros)


def test_real_zip_bomb_is_refused_by_the_cap():
    # 64 MiB of zeros streamed through deflate: never held in memory here or in the reader.
    buffer = io.BytesIO()
    chunk = bytes(1 << 20)
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        member = zipfile.ZipInfo("bomb.npy")
        member.compress_type = zipfile.ZIP_DEFLATED
        with archive.open(member, "w") as stream:
            stream.write(npz.encode_npy_header(np.dtype("u1"), (64 << 20,), False))
            for _ in range(64):
                stream.write(chunk)
    data = buffer.getvalue()
    assert len(data) < 200_000
    peak, error = traced_peak(
        lambda: npz.NpzFile(data, max_member_bytes=16 << 20).get_numpy("bomb"))
    assert "above the cap" in str(error) and peak < 64 * 1024


def test_declared_size_impossible_for_deflate_is_refused():
    data = npz.save({"x": np.arange(10)}, compressed=True)
    lying = patch_declared_size(data, 2**31 - 1)
    peak, error = traced_peak(lambda: npz.NpzFile(lying, max_member_bytes=2**32).get_numpy("x"))
    assert isinstance(error, FormatError) and "more than deflate can produce" in str(error)
    assert peak < 64 * 1024


@pytest.mark.parametrize("method", [zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED])
def test_declared_size_disagreeing_with_npy_header_is_refused(method):
    payload = np_save_bytes(np.arange(1000, dtype=np.int64))
    data = zip_bytes({"x.npy": payload}, method)
    for size in (len(payload) - 8, len(payload) + 8000):
        lying = patch_declared_size(data, size)
        with pytest.raises(FormatError, match="'x.npy'"):
            npz.NpzFile(lying).get_numpy("x")


def test_corrupted_deflate_stream_and_crc_are_refused():
    payload = np_save_bytes(sample("<f8", (500,)))
    data = bytearray(zip_bytes({"x.npy": payload}, zipfile.ZIP_DEFLATED))
    data[len(data) // 3] ^= 0x55  # inside the compressed stream
    with pytest.raises(FormatError, match="'x.npy'"):
        npz.NpzFile(bytes(data)).get_numpy("x")


BAD_ARCHIVES = [
    ("not a zip", b"definitely not a zip archive", FormatError, "not a valid zip"),
    ("empty", b"", FormatError, "not a valid zip"),
    ("truncated", zip_bytes({"x.npy": np_save_bytes(np.arange(50))})[:-30], FormatError,
     "not a valid zip"),
]


@pytest.mark.parametrize("case, data, error, message", BAD_ARCHIVES,
                         ids=[c[0] for c in BAD_ARCHIVES])
def test_malformed_archives_are_refused(case, data, error, message):
    with pytest.raises(error, match=message):
        npz.NpzFile(data)


def test_duplicate_members_encrypted_members_and_missing_names():
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("x.npy", np_save_bytes(np.arange(2)))
        with pytest.warns(UserWarning, match="Duplicate name"):
            archive.writestr("x.npy", np_save_bytes(np.arange(3)))
    with pytest.raises(FormatError, match="'x.npy' appears twice"):
        npz.NpzFile(buffer.getvalue())

    encrypted = bytearray(zip_bytes({"x.npy": np_save_bytes(np.arange(2))}))
    for signature, offset in ((b"PK\x01\x02", 8), (b"PK\x03\x04", 6)):
        start = encrypted.find(signature)
        encrypted[start + offset] |= 0x1  # the "encrypted" general-purpose flag
    with pytest.raises(UnsupportedError, match="encrypted"):
        npz.NpzFile(bytes(encrypted)).get_numpy("x")

    reader = npz.NpzFile(npz.save({"a": np.zeros(1)}))
    with pytest.raises(ModelNotFound, match="'b'"):
        reader.get_numpy("b")


# ------------------------------------------------------------------------------------------
# Tensor level (the core Tensor is written in parallel)


@requires_tensor
def test_npz_and_npy_to_tensors_with_candle_dtypes():
    arrays = {"f32": sample("<f4", (2, 3)), "be_f64": sample(">f8", (3,)),
              "i8": sample("i1", (4,)), "i16": sample("<i2", (2, 2)), "i32": sample(">i4", (3,)),
              "u16": sample("<u2", (3,)), "bool": sample("?", (5,)),
              "u64": np.array([0, 2**63 - 1], np.uint64), "f16": sample("<f2", ()),
              "fortran": np.asfortranarray(sample("<f4", (3, 4)))}
    expected = {"f32": "f32", "be_f64": "f64", "i8": "i64", "i16": "i64", "i32": "i64",
                "u16": "u32", "bool": "u8", "u64": "i64", "f16": "f16", "fortran": "f32"}
    for compressed in (False, True):
        loaded = npz.load(npz.save(arrays, compressed=compressed))
        for name, array in arrays.items():
            assert isinstance(loaded[name], Tensor)
            assert loaded[name].dtype.name == expected[name], name
            assert tuple(loaded[name].shape) == array.shape
            np.testing.assert_array_equal(loaded[name].to_numpy(), array.astype(
                loaded[name].dtype.np_storage), err_msg=name)
    tensor = npz.load_npy(np_save_bytes(arrays["fortran"]))
    np.testing.assert_array_equal(tensor.to_numpy(), arrays["fortran"])


@requires_tensor
def test_tensors_are_written_with_bf16_widened_exactly():
    bits = np.array([0x3F80, 0xC049, 0x0001, 0x7F80], dtype=np.uint16)  # 1, -3.14.., tiny, inf
    tensors = {"bf16": Tensor.from_numpy(bits, dtype=cw.bf16),
               "u32": Tensor.from_numpy(np.array([1, 2**32 - 1], np.uint32)),
               "scalar": Tensor.from_numpy(np.array(5.5, np.float64))}
    with np.load(io.BytesIO(npz.save(tensors)), allow_pickle=False) as loaded:
        widened = loaded["bf16"]
        assert widened.dtype == np.float32
        assert (widened.view(np.uint32) >> 16).astype(np.uint16).tolist() == bits.tolist()
        assert (widened.view(np.uint32) & 0xFFFF).max() == 0  # widening is exact
        assert loaded["u32"].tolist() == [1, 2**32 - 1]
        assert loaded["scalar"].shape == () and float(loaded["scalar"]) == 5.5
    single = np.load(io.BytesIO(npz.write_npy(tensors["u32"])), allow_pickle=False)
    assert single.tolist() == [1, 2**32 - 1]
