"""safetensors reader/writer against the reference `safetensors` library (numpy and torch
front ends), a real upstream checkpoint, and every malformed-header case we validate.

Equality is exact everywhere (bit patterns compared as bytes): the format stores raw bits, and
the only conversions (integer widening, 8-bit floats to f16/f32) are lossless by construction.
"""

import json
import struct

import numpy as np
import pytest
import safetensors
import safetensors.numpy as ref_numpy
import safetensors.torch as ref_torch
import torch

from candle_web.core.errors import CandleError, DTypeMismatch, FormatError, ModelNotFound
from candle_web.core.errors import UnsupportedError
from candle_web.io import safetensors as st

try:
    from candle_web import Tensor
    import candle_web as cw
except ImportError:  # the core is written in parallel; these tests run as soon as it imports
    Tensor = None
requires_tensor = pytest.mark.skipif(Tensor is None, reason="candle_web.Tensor not importable")

RNG = np.random.default_rng(1234)

# torch dtype -> (safetensors name, numpy dtype get_numpy returns, integer dtype to view bits)
TORCH_DTYPES = {
    torch.bool: ("BOOL", np.bool_, None),
    torch.uint8: ("U8", np.uint8, None),
    torch.int8: ("I8", np.int8, None),
    torch.int16: ("I16", np.int16, None),
    torch.uint16: ("U16", np.uint16, None),
    torch.int32: ("I32", np.int32, None),
    torch.uint32: ("U32", np.uint32, None),
    torch.int64: ("I64", np.int64, None),
    torch.uint64: ("U64", np.uint64, None),
    torch.float16: ("F16", np.float16, None),
    torch.bfloat16: ("BF16", np.uint16, torch.int16),
    torch.float32: ("F32", np.float32, None),
    torch.float64: ("F64", np.float64, None),
    torch.float8_e4m3fn: ("F8_E4M3", np.uint8, torch.uint8),
    torch.float8_e5m2: ("F8_E5M2", np.uint8, torch.uint8),
    torch.float8_e8m0fnu: ("F8_E8M0", np.uint8, torch.uint8),
    torch.float8_e4m3fnuz: ("F8_E4M3FNUZ", np.uint8, torch.uint8),
    torch.float8_e5m2fnuz: ("F8_E5M2FNUZ", np.uint8, torch.uint8),
    torch.complex64: ("C64", np.complex64, None),
}
SHAPES = [(3, 5), (), (0,), (2, 0, 3), (7,)]


def random_torch(dtype, shape):
    if dtype is torch.bool:
        return torch.from_numpy(RNG.integers(0, 2, shape).astype(bool))
    if dtype.is_floating_point and dtype.itemsize == 1:
        return torch.from_numpy(RNG.integers(0, 256, shape).astype(np.uint8)).view(dtype)
    if dtype.is_floating_point or dtype.is_complex:
        return (torch.randn(shape, dtype=torch.float64) * 100).to(dtype)
    info = torch.iinfo(dtype)
    low, high = max(info.min, -2**62), min(info.max, 2**62)
    return torch.from_numpy(RNG.integers(low, high, shape, dtype=np.int64)).to(dtype)


def torch_bits(tensor) -> bytes:
    """The little-endian bytes torch stores for a tensor."""
    _, _, view_as = TORCH_DTYPES[tensor.dtype]
    if view_as is not None:
        tensor = tensor.view(view_as)
    return tensor.contiguous().numpy().tobytes()


def make_file(header, data: bytes = b"") -> bytes:
    """A safetensors buffer from a header dict (or raw header bytes) and data bytes."""
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + data


def entry(dtype, shape, offsets):
    return {"dtype": dtype, "shape": shape, "data_offsets": offsets}


def reference_accepts(buffer: bytes) -> bool:
    try:
        safetensors.deserialize(buffer)
        return True
    except Exception:
        return False


# ------------------------------------------------------------------------------------------
# Library-written files read by candle_web


def torch_fixture():
    tensors = {}
    for index, dtype in enumerate(TORCH_DTYPES):
        shape = SHAPES[index % len(SHAPES)]
        tensors[f"t{index}.{str(dtype).split('.')[-1]}"] = random_torch(dtype, shape)
    return tensors


def test_reads_every_dtype_written_by_safetensors_torch():
    tensors = torch_fixture()
    metadata = {"format": "pt", "note": "ünïcode ✓"}
    buffer = ref_torch.save(tensors, metadata=metadata)
    reader = st.SafeTensors(buffer)
    assert reader.keys() == sorted(tensors)
    assert reader.metadata == metadata
    for name, tensor in tensors.items():
        stored_name, numpy_dtype, _ = TORCH_DTYPES[tensor.dtype]
        info = reader.info(name)
        assert info.dtype == stored_name
        assert info.shape == tuple(tensor.shape)
        array = reader.get_numpy(name)
        assert array.dtype == numpy_dtype, name
        assert array.shape == tuple(tensor.shape), name
        assert array.tobytes() == torch_bits(tensor), name
        assert bytes(reader.get_bytes(name)) == torch_bits(tensor), name


def test_reads_numpy_written_file_and_keeps_bytes_zero_copy():
    arrays = {"w": RNG.standard_normal((4, 6)).astype(np.float32),
              "ids": np.arange(12, dtype=np.int64).reshape(3, 4),
              "mask": RNG.integers(0, 2, (5,)).astype(bool),
              "scalar": np.array(2.5, dtype=np.float64),
              "empty": np.zeros((0, 4), dtype=np.float16)}
    buffer = ref_numpy.save(arrays)
    loaded = st.load_numpy(buffer)
    whole = np.frombuffer(buffer, dtype=np.uint8)
    for name, array in arrays.items():
        assert loaded[name].dtype == array.dtype and loaded[name].shape == array.shape
        np.testing.assert_array_equal(loaded[name], array)
        if array.size:
            assert np.shares_memory(loaded[name], whole), f"{name} was copied"
            assert not loaded[name].flags.writeable  # a view of immutable bytes


def test_bytearray_and_memoryview_sources_are_viewed_not_copied():
    buffer = bytearray(ref_numpy.save({"x": np.arange(6, dtype=np.float32)}))
    for source in (buffer, memoryview(buffer), np.frombuffer(buffer, dtype=np.uint8)):
        array = st.SafeTensors(source).get_numpy("x")
        np.testing.assert_array_equal(array, np.arange(6, dtype=np.float32))
        assert np.shares_memory(array, np.frombuffer(buffer, dtype=np.uint8))


def test_unaligned_tensor_is_read_correctly():
    # A header length that is not a multiple of 8 leaves the f64 data unaligned in memory.
    values = np.array([1.5, -2.25, 3e300], dtype=np.float64)
    buffer = make_file(b'{"x":{"dtype":"F64","shape":[3],"data_offsets":[0,24]}}',
                       values.tobytes())
    assert (struct.unpack("<Q", buffer[:8])[0]) % 8 != 0
    assert reference_accepts(buffer)
    np.testing.assert_array_equal(st.SafeTensors(buffer).get_numpy("x"), values)


# ------------------------------------------------------------------------------------------
# candle_web-written files read by the library, byte-identical output


def test_serialize_is_byte_identical_to_safetensors_numpy():
    arrays = {
        "bool": RNG.integers(0, 2, (3,)).astype(bool),
        "u8": RNG.integers(0, 255, (2, 3)).astype(np.uint8),
        "i8": RNG.integers(-128, 127, (5,)).astype(np.int8),
        "i16": RNG.integers(-999, 999, (4,)).astype(np.int16),
        "u16": RNG.integers(0, 65535, (4,)).astype(np.uint16),
        "i32": RNG.integers(-2**31, 2**31 - 1, (3,)).astype(np.int32),
        "u32": RNG.integers(0, 2**32 - 1, (3,)).astype(np.uint32),
        "i64": RNG.integers(-2**62, 2**62, (3,)),
        "u64": np.array([0, 2**64 - 1], dtype=np.uint64),
        "f16": RNG.standard_normal((2, 2)).astype(np.float16),
        "f32": RNG.standard_normal((3, 1, 2)).astype(np.float32),
        "f64": RNG.standard_normal(()).astype(np.float64),
        "c64": (RNG.standard_normal(2) + 1j).astype(np.complex64),
        "empty": np.zeros((2, 0), dtype=np.float32),
        "name with spaces / ünïcode": np.arange(3, dtype=np.int32),
    }
    metadata = {"format": "np"}  # one key: the library orders several keys arbitrarily
    ours = st.serialize(arrays, metadata=metadata)
    assert ours == ref_numpy.save(arrays, metadata=metadata)
    back = ref_numpy.load(ours)
    for name, array in arrays.items():
        assert back[name].dtype == array.dtype and back[name].shape == array.shape
        np.testing.assert_array_equal(back[name], array)


def test_serialize_with_raw_bits_matches_safetensors_torch():
    tensors = torch_fixture()
    ours_input = {}
    for name, tensor in tensors.items():
        stored_name, numpy_dtype, view_as = TORCH_DTYPES[tensor.dtype]
        if view_as is None:
            ours_input[name] = tensor.numpy()
        else:
            ours_input[name] = st.RawTensor(tensor.view(view_as).numpy(), stored_name)
    ours = st.serialize(ours_input, metadata={"format": "pt"})
    assert ours == ref_torch.save(tensors, metadata={"format": "pt"})
    # The library's own parser (its torch front end cannot load F8_E8M0, so compare raw views).
    back = dict(safetensors.deserialize(ours))
    for name, tensor in tensors.items():
        assert back[name]["dtype"] == TORCH_DTYPES[tensor.dtype][0]
        assert back[name]["shape"] == list(tensor.shape)
        assert bytes(back[name]["data"]) == torch_bits(tensor), name


def test_header_is_padded_to_eight_bytes_and_metadata_readable_by_safe_open(tmp_path):
    metadata = {"b": "2", "a": "1", "format": "pt"}
    path = tmp_path / "x.safetensors"
    assert st.save({"x": np.ones(3, np.float32)}, path, metadata=metadata) is None
    written = path.read_bytes()
    assert written == st.serialize({"x": np.ones(3, np.float32)}, metadata=metadata)
    header_len = struct.unpack("<Q", written[:8])[0]
    assert header_len % 8 == 0 and written[8 + header_len - 1:8 + header_len] in (b" ", b"}")
    with safetensors.safe_open(str(path), framework="np") as handle:
        assert handle.metadata() == metadata
        np.testing.assert_array_equal(handle.get_tensor("x"), np.ones(3, np.float32))


def test_writer_refuses_what_the_format_cannot_hold():
    with pytest.raises(DTypeMismatch, match="'obj'.*object"):
        st.serialize({"obj": np.array([object()])})
    with pytest.raises(DTypeMismatch, match="'bits'.*BF16"):
        st.serialize({"bits": st.RawTensor(np.zeros(2, np.float32), "BF16")})
    with pytest.raises(DTypeMismatch, match="F4"):
        st.serialize({"packed": st.RawTensor(np.zeros(2, np.uint8), "F4")})
    with pytest.raises(FormatError, match="metadata"):
        st.serialize({"x": np.zeros(1)}, metadata={"k": 1})
    with pytest.raises(FormatError, match="__metadata__"):
        st.serialize({"__metadata__": np.zeros(1)})


def test_big_endian_and_non_contiguous_inputs_are_written_little_endian_c_order():
    base = RNG.standard_normal((4, 6))
    arrays = {"be": base.astype(">f4"), "strided": base[:, ::2], "fortran": np.asfortranarray(base)}
    back = ref_numpy.load(st.serialize(arrays))
    for name, array in arrays.items():
        np.testing.assert_array_equal(back[name], array)


# ------------------------------------------------------------------------------------------
# Files on disk: mmap and its fallback


def test_path_is_memory_mapped_and_falls_back_to_reading(tmp_path, monkeypatch):
    arrays = {"a": RNG.standard_normal((8, 8)).astype(np.float32), "b": np.arange(5)}
    path = tmp_path / "m.safetensors"
    ref_numpy.save_file(arrays, str(path))

    mapped = st.SafeTensors(path)
    assert mapped._mapped is not None  # mmap used natively
    for name in arrays:
        np.testing.assert_array_equal(mapped.get_numpy(name), arrays[name])
    with st.SafeTensors(str(path)) as scoped:
        kept = scoped.get_numpy("a")
    np.testing.assert_array_equal(kept, arrays["a"])  # arrays outlive close()

    import mmap

    def no_mmap(*args, **kwargs):
        raise OSError("mmap is not available here")  # what Pyodide's emulation can do

    monkeypatch.setattr(mmap, "mmap", no_mmap)
    fallback = st.SafeTensors(path)
    assert fallback._mapped is None
    for name in arrays:
        np.testing.assert_array_equal(fallback.get_numpy(name), arrays[name])
    np.testing.assert_array_equal(st.SafeTensors(path, use_mmap=False).get_numpy("b"),
                                  arrays["b"])


def test_missing_and_empty_files(tmp_path):
    with pytest.raises(ModelNotFound, match="nope.safetensors"):
        st.SafeTensors(tmp_path / "nope.safetensors")
    empty = tmp_path / "empty.safetensors"
    empty.write_bytes(b"")
    with pytest.raises(FormatError, match="too short"):
        st.SafeTensors(empty)
    reader = st.SafeTensors(ref_numpy.save({"x": np.zeros(1)}))
    with pytest.raises(ModelNotFound, match="'y'"):
        reader.get_numpy("y")


def test_real_checkpoint_minilm(request):
    try:
        model_file = request.getfixturevalue("model_file")
    except pytest.FixtureLookupError:
        pytest.skip("tests/conftest.py does not provide model_file yet")
    path = model_file("all-minilm-l6-v2", "model.safetensors")
    reader = st.SafeTensors(path)
    reference = ref_numpy.load_file(str(path))
    assert reader.keys() == sorted(reference)
    assert reader.metadata == {"format": "pt"}
    for name, array in reference.items():
        ours = reader.get_numpy(name)
        assert ours.dtype == array.dtype and ours.shape == array.shape
        np.testing.assert_array_equal(ours, array)
    # Our writer reproduces the upstream file byte for byte (same order, header, padding).
    rewritten = st.serialize({name: reader.get_numpy(name) for name in reader.keys()},
                             metadata=reader.metadata)
    assert rewritten == path.read_bytes()


# ------------------------------------------------------------------------------------------
# Conversions to candle dtypes


FLOAT8_TO_TORCH = {"F8_E4M3": (torch.float8_e4m3fn, torch.float16),
                   "F8_E5M2": (torch.float8_e5m2, torch.float16),
                   "F8_E4M3FNUZ": (torch.float8_e4m3fnuz, torch.float16),
                   "F8_E5M2FNUZ": (torch.float8_e5m2fnuz, torch.float16),
                   "F8_E8M0": (torch.float8_e8m0fnu, torch.float32)}


@pytest.mark.parametrize("stored_name", sorted(FLOAT8_TO_TORCH))
def test_float8_widening_matches_torch_for_all_256_codes(stored_name):
    float8, wide = FLOAT8_TO_TORCH[stored_name]
    codes = np.arange(256, dtype=np.uint8)
    ours, candle_dtype = st.to_candle_storage(codes, stored_name, "x")
    assert candle_dtype.name == {torch.float16: "f16", torch.float32: "f32"}[wide]
    expected = torch.from_numpy(codes.copy()).view(float8).to(wide).numpy()
    assert np.array_equal(np.isnan(ours), np.isnan(expected))
    finite = ~np.isnan(expected)
    # Exact: compare bit patterns, so -0.0 vs 0.0 and subnormals count.
    assert ours[finite].tobytes() == expected[finite].tobytes()


def test_integer_and_bool_conversions_are_lossless():
    cases = {
        "I8": (np.array([-128, -1, 0, 127], np.int8), "i64"),
        "I16": (np.array([-32768, 32767], np.int16), "i64"),
        "I32": (np.array([-2**31, 2**31 - 1], np.int32), "i64"),
        "U16": (np.array([0, 65535], np.uint16), "u32"),
        "U64": (np.array([0, 2**63 - 1], np.uint64), "i64"),
    }
    for stored_name, (values, candle_name) in cases.items():
        converted, candle_dtype = st.to_candle_storage(values, stored_name, "x")
        assert candle_dtype.name == candle_name
        assert converted.dtype == candle_dtype.np_storage
        assert converted.tolist() == values.tolist()
    raw_bool = np.array([0, 1, 2, 255], np.uint8).view(np.bool_)  # non-canonical true bytes
    converted, candle_dtype = st.to_candle_storage(raw_bool, "BOOL", "mask")
    assert candle_dtype.name == "u8" and converted.tolist() == [0, 1, 1, 1]


def test_unrepresentable_dtypes_are_refused_naming_the_tensor():
    with pytest.raises(UnsupportedError, match="'big'.*U64"):
        st.to_candle_storage(np.array([2**63], np.uint64), "U64", "big")
    reader = st.SafeTensors(ref_torch.save({"z": torch.zeros(2, dtype=torch.complex64)}))
    with pytest.raises(UnsupportedError, match="'z'.*C64"):
        reader.get_candle_numpy("z")
    packed = st.SafeTensors(make_file({"p": entry("F4", [4], [0, 2])}, b"\x12\x34"))
    assert packed.info("p").dtype == "F4" and packed.info("p").nbytes == 2
    with pytest.raises(UnsupportedError, match="'p'.*F4"):
        packed.get_numpy("p")


# ------------------------------------------------------------------------------------------
# Malformed headers: FormatError naming the problem, checked against the reference verdict

F32_4 = np.arange(1, dtype=np.float32).tobytes()  # 4 bytes
HUGE_INT = "1" + "0" * 5000  # longer than Python's default int-parsing limit

BAD_FILES = [
    ("too short", b"\x05\x00\x00", "too short"),
    ("header over cap", struct.pack("<Q", 100_000_001) + b"{}", "exceeds the 100000000"),
    ("header past end", struct.pack("<Q", 64) + b"{}", "runs past the end"),
    ("u64 max length", struct.pack("<Q", 2**64 - 1) + b"{}", "exceeds"),
    ("not utf-8", make_file(b'{"\xff":1}'), "UTF-8"),
    ("not json", make_file(b"{not json"), "not valid JSON"),
    ("empty header", make_file(b""), "not valid JSON"),
    ("not an object", make_file(b"[1, 2]"), "must be a JSON object"),
    ("entry not object", make_file({"a": [0, 4]}, F32_4), "'a'.*expected an object"),
    ("missing dtype", make_file({"a": {"shape": [1], "data_offsets": [0, 4]}}, F32_4),
     "'a'.*missing field 'dtype'"),
    ("missing shape", make_file({"a": {"dtype": "F32", "data_offsets": [0, 4]}}, F32_4),
     "'a'.*missing field 'shape'"),
    ("missing offsets", make_file({"a": {"dtype": "F32", "shape": [1]}}, F32_4),
     "'a'.*missing field 'data_offsets'"),
    ("unknown dtype", make_file({"a": entry("F12", [1], [0, 4])}, F32_4),
     "'a' field 'dtype'.*'F12'"),
    ("dtype not str", make_file({"a": entry(7, [1], [0, 4])}, F32_4), "'a' field 'dtype'"),
    ("negative dim", make_file({"a": entry("F32", [-1], [0, 4])}, F32_4), "'a' field 'shape'"),
    ("float dim", make_file({"a": entry("F32", [1.0], [0, 4])}, F32_4), "'a' field 'shape'"),
    ("bool dim", make_file({"a": entry("F32", [True], [0, 4])}, F32_4), "'a' field 'shape'"),
    ("shape not list", make_file({"a": entry("F32", "1", [0, 4])}, F32_4), "'a' field 'shape'"),
    ("one offset", make_file({"a": entry("F32", [1], [4])}, F32_4), "'a' field 'data_offsets'"),
    ("three offsets", make_file({"a": entry("F32", [1], [0, 4, 4])}, F32_4),
     "'a' field 'data_offsets'"),
    ("string offset", make_file({"a": entry("F32", [1], ["0", 4])}, F32_4),
     "'a' field 'data_offsets'"),
    ("negative offset", make_file({"a": entry("F32", [1], [-4, 0])}, F32_4),
     "'a' field 'data_offsets'"),
    ("begin after end", make_file({"a": entry("F32", [0], [4, 0])}, F32_4),
     "'a' field 'data_offsets': begin 4 > end 0"),
    ("end beyond data", make_file({"a": entry("F32", [2], [0, 8])}, F32_4),
     "'a' field 'data_offsets': end 8 is beyond the 4 bytes"),
    ("byte count", make_file({"a": entry("F32", [2], [0, 4])}, F32_4),
     "'a' field 'data_offsets'.*holds 4 bytes.*needs 8"),
    ("overlap", make_file({"a": entry("F32", [2], [0, 8]), "b": entry("F32", [1], [4, 8])},
                          F32_4 * 2), "'b'.*overlaps tensor 'a'"),
    ("gap", make_file({"a": entry("F32", [1], [4, 8])}, F32_4 * 2), "'a'.*gap of 4 bytes"),
    ("trailing", make_file({"a": entry("F32", [1], [0, 4])}, F32_4 * 2), "4 trailing bytes"),
    ("overflow", make_file({"a": entry("F32", [2**62, 2**62], [0, 4])}, F32_4),
     "'a' field 'shape'.*overflows"),
    ("dim above u64", make_file({"a": entry("U8", [2**70], [0, 4])}, F32_4),
     "'a' field 'shape'.*overflows"),
    ("huge int literal", make_file(
        ('{"a":{"dtype":"F32","shape":[' + HUGE_INT + '],"data_offsets":[0,4]}}').encode(),
        F32_4), "not valid JSON"),
    ("deep nesting", make_file(b'{"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}"),
     "not valid JSON"),
    ("sub-byte remainder", make_file({"p": entry("F4", [3], [0, 2])}, b"\0\0"),
     "'p' field 'shape'.*byte boundary"),
    ("metadata not object", make_file({"__metadata__": ["x"]}), "'__metadata__'"),
    ("metadata value", make_file({"__metadata__": {"k": 1}}), "'__metadata__'.*'k'"),
]
# Where we are deliberately stricter than the reference (documented in the module).
STRICTER_THAN_REFERENCE = {
    "duplicate key": (make_file(b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},'
                                b'"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}', F32_4),
                      "duplicate key 'a'"),
    "zero-size but unrepresentable": (
        make_file({"a": entry("F32", [0, 2**40, 2**40], [0, 0])}), "'a' field 'shape'.*overflows"),
}


@pytest.mark.parametrize("case, buffer, message", BAD_FILES, ids=[c[0] for c in BAD_FILES])
def test_malformed_file_gives_format_error_naming_the_problem(case, buffer, message):
    with pytest.raises(FormatError, match=message):
        st.SafeTensors(buffer)
    assert not reference_accepts(buffer), f"the reference library accepts {case!r}"


@pytest.mark.parametrize("case", sorted(STRICTER_THAN_REFERENCE))
def test_stricter_than_reference(case):
    buffer, message = STRICTER_THAN_REFERENCE[case]
    assert reference_accepts(buffer)  # the difference is real, and deliberate
    with pytest.raises(FormatError, match=message):
        st.SafeTensors(buffer)


ODD_BUT_VALID = [
    ("leading and trailing whitespace",
     make_file(b' \n{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}} \t', F32_4)),
    ("extra fields ignored",
     make_file({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4], "extra": [1]}}, F32_4)),
    ("zero-size tensors share offsets",
     make_file({"a": entry("F32", [1], [0, 4]), "b": entry("F32", [0], [4, 4]),
                "c": entry("F64", [0, 3], [4, 4])}, F32_4)),
    ("null metadata", make_file({"__metadata__": None, "a": entry("F32", [1], [0, 4])}, F32_4)),
    ("no tensors", make_file({})),
    ("offsets in any header order",
     make_file({"b": entry("U8", [2], [4, 6]), "a": entry("F32", [1], [0, 4])}, F32_4 + b"xy")),
]


@pytest.mark.parametrize("case, buffer", ODD_BUT_VALID, ids=[c[0] for c in ODD_BUT_VALID])
def test_odd_but_valid_files_are_accepted_like_the_reference(case, buffer):
    assert reference_accepts(buffer)
    reader = st.SafeTensors(buffer)
    reference = safetensors.deserialize(buffer)
    assert reader.keys() == sorted(name for name, _ in reference)
    for name, view in reference:
        assert bytes(reader.get_bytes(name)) == bytes(view["data"])
        assert list(reader.info(name).shape) == view["shape"]


def test_every_error_is_a_candle_error():
    for _, buffer, _ in BAD_FILES:
        with pytest.raises(CandleError):
            st.SafeTensors(buffer)


# ------------------------------------------------------------------------------------------
# Tensor level (the core Tensor is written in parallel)


@requires_tensor
def test_load_gives_tensors_with_candle_dtypes():
    tensors = torch_fixture()
    tensors.pop(next(name for name, t in tensors.items() if t.dtype is torch.complex64))
    loaded = st.load(ref_torch.save(tensors))
    expected_dtype = {"BOOL": "u8", "U8": "u8", "I8": "i64", "I16": "i64", "U16": "u32",
                      "I32": "i64", "U32": "u32", "I64": "i64", "U64": "i64", "F16": "f16",
                      "BF16": "bf16", "F32": "f32", "F64": "f64", "F8_E4M3": "f16",
                      "F8_E5M2": "f16", "F8_E4M3FNUZ": "f16", "F8_E5M2FNUZ": "f16",
                      "F8_E8M0": "f32"}
    for name, tensor in tensors.items():
        stored_name = TORCH_DTYPES[tensor.dtype][0]
        ours = loaded[name]
        assert isinstance(ours, Tensor)
        assert ours.dtype.name == expected_dtype[stored_name], name
        assert tuple(ours.shape) == tuple(tensor.shape), name
        if tensor.dtype is torch.bfloat16:
            assert ours.storage_numpy().tobytes() == torch_bits(tensor)  # bits preserved
            continue
        if tensor.dtype is torch.uint64:
            reference = tensor.numpy().astype(np.int64)  # values below 2**62 here
        elif tensor.dtype is torch.bool:
            reference = tensor.numpy().astype(np.uint8)
        elif stored_name.startswith("F8"):
            reference = tensor.to(FLOAT8_TO_TORCH[stored_name][1]).numpy()
        else:
            reference = tensor.numpy()
        np.testing.assert_array_equal(ours.to_numpy(), reference, err_msg=name)


@requires_tensor
def test_tensors_round_trip_through_the_library_with_bf16_bits_preserved():
    bf16_bits = torch.randn(4, 5).bfloat16()
    originals = {
        "bf16": Tensor.from_numpy(bf16_bits.view(torch.int16).numpy().view(np.uint16),
                                  dtype=cw.bf16),
        "f32": Tensor.from_numpy(RNG.standard_normal((3, 2)).astype(np.float32)),
        "u8": Tensor.from_numpy(np.arange(5, dtype=np.uint8)),
        "u32": Tensor.from_numpy(np.array([0, 2**32 - 1], dtype=np.uint32)),
        "i64": Tensor.from_numpy(np.array([-2**63, 2**63 - 1], dtype=np.int64)),
        "f16": Tensor.from_numpy(np.array([[1.5, -0.0]], dtype=np.float16)),
        "f64": Tensor.from_numpy(np.array(3.25, dtype=np.float64)),  # scalar, shape []
        "empty": Tensor.from_numpy(np.zeros((0, 3), dtype=np.float32)),
    }
    buffer = st.save(originals, metadata={"format": "pt"})
    back_torch = ref_torch.load(buffer)
    assert torch.equal(back_torch["bf16"], bf16_bits)
    assert tuple(back_torch["f64"].shape) == ()
    again = st.load(buffer)
    for name, tensor in originals.items():
        assert again[name].dtype is tensor.dtype
        assert tuple(again[name].shape) == tuple(tensor.shape)
        assert again[name].storage_numpy().tobytes() == tensor.storage_numpy().tobytes()
