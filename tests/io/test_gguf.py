"""GGUF reader and writer: interoperability with the `gguf` package both ways, the real
SmolLM2 and Gemma-3 files, versions, and clear errors for malformed headers."""

from __future__ import annotations

import io
import struct

import gguf
import numpy as np
import pytest

from candle_web.core.errors import CandleError, FormatError, ModelNotFound, UnsupportedError
from candle_web.io.gguf import GgufFile, GgufValueType, read_gguf, write_gguf
from candle_web.quantized import GgmlDType, QTensor

V = GgufValueType


@pytest.fixture
def rng():
    return np.random.default_rng(7)

# One key per value type, with the type to write it as (the writer's explicit typing path).
TYPED_METADATA = {
    "t.u8": (255, V.UINT8),
    "t.i8": (-128, V.INT8),
    "t.u16": (65535, V.UINT16),
    "t.i16": (-32768, V.INT16),
    "t.u32": (4_000_000_000, V.UINT32),
    "t.i32": (-2_000_000_000, V.INT32),
    "t.f32": (0.5, V.FLOAT32),
    "t.bool": (True, V.BOOL),
    "t.string": ("héllo ✓ \u0000 end", V.STRING),
    "t.u64": (2**64 - 1, V.UINT64),
    "t.i64": (-2**63, V.INT64),
    "t.f64": (0.1, V.FLOAT64),
    "t.array.i32": (np.array([1, -2, 3], dtype=np.int32), (V.ARRAY, V.INT32)),
    "t.array.f32": (np.array([0.25, -1.5], dtype=np.float32), (V.ARRAY, V.FLOAT32)),
    "t.array.u8": (np.array([0, 7, 255], dtype=np.uint8), (V.ARRAY, V.UINT8)),
    "t.array.bool": (np.array([True, False, True]), (V.ARRAY, V.BOOL)),
    "t.array.string": (["a", "", "ünï", "Ġtoken"], (V.ARRAY, V.STRING)),
    "t.array.empty": (np.array([], dtype=np.int64), (V.ARRAY, V.INT64)),
    "t.array.nested": ([np.array([1, 2], dtype=np.int32), np.array([3], dtype=np.int32)],
                       (V.ARRAY, V.ARRAY)),
}


def sample_tensors(rng) -> dict:
    return {
        "f32.matrix": rng.standard_normal((3, 5)).astype(np.float32),
        "f16.vector": rng.standard_normal(7).astype(np.float16),
        "i32.ids": np.arange(6, dtype=np.int32).reshape(2, 3),
        "q4_0.weight": QTensor.from_float(rng.standard_normal((4, 64)).astype(np.float32), "Q4_0"),
        "q8_0.weight": QTensor.from_float(rng.standard_normal((2, 32)).astype(np.float32), "Q8_0"),
        "q4_k.weight": QTensor.from_float(rng.standard_normal((2, 256)).astype(np.float32), "Q4_K"),
        "q6_k.weight": QTensor.from_float(rng.standard_normal((3, 256)).astype(np.float32), "Q6_K"),
        "bf16.weight": QTensor.from_float(rng.standard_normal((2, 4)).astype(np.float32), "BF16"),
    }


def as_numpy_bytes(tensor) -> bytes:
    return tensor.data.tobytes() if isinstance(tensor, QTensor) else tensor.tobytes()


def write_sample(path, rng, **options):
    metadata = {key: value for key, (value, _) in TYPED_METADATA.items()}
    types = {key: value_type for key, (_, value_type) in TYPED_METADATA.items()}
    tensors = sample_tensors(rng)
    write_gguf(path, metadata, tensors, metadata_types=types, **options)
    return tensors


def assert_same_value(ours, expected):
    if isinstance(expected, np.ndarray):
        assert isinstance(ours, np.ndarray) and ours.dtype == expected.dtype
        np.testing.assert_array_equal(ours, expected)
    elif isinstance(expected, list):
        assert len(ours) == len(expected)
        for a, b in zip(ours, expected):
            assert_same_value(a, b)
    elif isinstance(expected, float):
        assert ours == pytest.approx(expected, rel=1e-7 if isinstance(ours, float) else 0)
    else:
        assert ours == expected and type(ours) is type(expected)


# ------------------------------------------------------------------- our writer -> readers

def test_gguf_py_reads_what_we_write(tmp_path, rng):
    path = tmp_path / "ours.gguf"
    tensors = write_sample(path, rng, alignment=64)
    reader = gguf.GGUFReader(path)
    assert reader.alignment == 64
    for key, (value, declared) in TYPED_METADATA.items():
        field = reader.fields[key]
        main_type = declared[0] if isinstance(declared, tuple) else declared
        assert field.types[0] == main_type, key
        if key == "t.array.nested":
            assert field.contents() == [1, 2, 3]  # gguf-py flattens nested arrays
        elif key == "t.f32":
            assert field.contents() == pytest.approx(0.5)
        elif isinstance(value, np.ndarray):
            assert field.contents() == value.tolist(), key
        else:
            assert field.contents() == value, key
    assert [t.name for t in reader.tensors] == list(tensors)
    for t in reader.tensors:
        ours = tensors[t.name]
        if isinstance(ours, QTensor):
            assert t.tensor_type.name == ours.dtype.name
            assert tuple(reversed(t.shape.tolist())) == ours.shape
        else:
            assert tuple(reversed(t.shape.tolist())) == ours.shape
        assert t.data_offset % 64 == 0
        assert np.asarray(t.data).tobytes() == as_numpy_bytes(ours), t.name


def test_our_round_trip_keeps_values_types_and_bytes(tmp_path, rng):
    path = tmp_path / "ours.gguf"
    tensors = write_sample(path, rng)
    with GgufFile(path) as parsed:
        assert parsed.version == 3 and parsed.alignment == 32
        for key, (value, declared) in TYPED_METADATA.items():
            assert parsed.metadata_types[key] == declared, key
            if key == "t.f32":
                assert parsed.metadata[key] == 0.5
            else:
                assert_same_value(parsed.metadata[key], value)
        assert list(parsed.tensors) == list(tensors)
        for name, tensor in tensors.items():
            assert parsed.tensor_bytes(name).tobytes() == as_numpy_bytes(tensor)
            qt = parsed.qtensor(name)
            expected = tensor.dequantize() if isinstance(tensor, QTensor) \
                else tensor.astype(np.float32)
            np.testing.assert_array_equal(qt.dequantize(), expected)
        # Writing what we read (with its types) reproduces the file byte for byte.
        again = io.BytesIO()
        write_gguf(again, parsed.metadata, {n: parsed.qtensor(n) for n in parsed.tensors},
                   metadata_types=parsed.metadata_types)
    assert again.getvalue() == path.read_bytes()


def test_inferred_metadata_types(tmp_path):
    path = tmp_path / "inferred.gguf"
    write_gguf(path, {"int": 3, "big": 2**40, "huge": 2**63, "float": 1.5, "flag": False,
                      "np.u16": np.uint16(9), "np.f64": np.float64(0.1), "text": "x",
                      "ints": [1, 2**33], "words": ["a", "b"], "floats": [0.5, 1.0],
                      "matrix": [[1, 2], [3]]}, {})
    parsed = GgufFile(path)
    assert parsed.metadata_types == {
        "int": V.INT32, "big": V.INT64, "huge": V.UINT64, "float": V.FLOAT32, "flag": V.BOOL,
        "np.u16": V.UINT16, "np.f64": V.FLOAT64, "text": V.STRING, "ints": (V.ARRAY, V.INT64),
        "words": (V.ARRAY, V.STRING), "floats": (V.ARRAY, V.FLOAT32),
        "matrix": (V.ARRAY, V.ARRAY)}
    assert parsed.metadata["np.f64"] == 0.1 and parsed.metadata["huge"] == 2**63
    assert [a.tolist() for a in parsed.metadata["matrix"]] == [[1, 2], [3]]


# ------------------------------------------------------------------ gguf-py writer -> ours

def test_we_read_what_gguf_py_writes(tmp_path, rng):
    path = tmp_path / "theirs.gguf"
    writer = gguf.GGUFWriter(path, arch="llama")
    writer.add_custom_alignment(128)
    writer.add_uint8("k.u8", 200)
    writer.add_int8("k.i8", -5)
    writer.add_uint16("k.u16", 60000)
    writer.add_int16("k.i16", -300)
    writer.add_uint32("k.u32", 3_000_000_000)
    writer.add_int32("k.i32", -7)
    writer.add_float32("k.f32", 1e-5)
    writer.add_uint64("k.u64", 2**50)
    writer.add_int64("k.i64", -2**50)
    writer.add_float64("k.f64", 1 / 3)
    writer.add_bool("k.bool", True)
    writer.add_string("k.str", "SmolLM ✓")
    writer.add_array("k.ints", [5, 6, 7])
    writer.add_array("k.floats", [0.5, 0.25])
    writer.add_array("k.strings", ["<s>", "</s>", "Ġthe"])
    writer.add_array("k.bools", [True, False])
    writer.add_array("k.nested", [[1, 2], [3, 4, 5]])
    f32 = rng.standard_normal((4, 8)).astype(np.float32)
    f16 = rng.standard_normal(16).astype(np.float16)
    q8 = rng.standard_normal((3, 64)).astype(np.float32)
    q8_raw = gguf.quants.quantize(q8, gguf.GGMLQuantizationType.Q8_0)
    writer.add_tensor("a.f32", f32)
    writer.add_tensor("b.f16", f16)
    writer.add_tensor("c.q8_0", q8_raw, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    parsed = GgufFile(path)
    meta, types = parsed.metadata, parsed.metadata_types
    assert parsed.alignment == 128 and types["general.alignment"] == V.UINT32
    assert meta["general.architecture"] == "llama"
    expected = {"k.u8": (200, V.UINT8), "k.i8": (-5, V.INT8), "k.u16": (60000, V.UINT16),
                "k.i16": (-300, V.INT16), "k.u32": (3_000_000_000, V.UINT32),
                "k.i32": (-7, V.INT32), "k.u64": (2**50, V.UINT64), "k.i64": (-2**50, V.INT64),
                "k.bool": (True, V.BOOL), "k.str": ("SmolLM ✓", V.STRING),
                "k.strings": (["<s>", "</s>", "Ġthe"], (V.ARRAY, V.STRING))}
    for key, (value, value_type) in expected.items():
        assert meta[key] == value and types[key] == value_type, key
    assert meta["k.f32"] == float(np.float32(1e-5)) and types["k.f32"] == V.FLOAT32
    assert meta["k.f64"] == 1 / 3 and types["k.f64"] == V.FLOAT64
    assert types["k.ints"] == (V.ARRAY, V.INT32) and meta["k.ints"].tolist() == [5, 6, 7]
    assert meta["k.floats"].dtype == np.float32 and meta["k.floats"].tolist() == [0.5, 0.25]
    assert meta["k.bools"].tolist() == [True, False]
    assert [a.tolist() for a in meta["k.nested"]] == [[1, 2], [3, 4, 5]]

    assert list(parsed.tensors) == ["a.f32", "b.f16", "c.q8_0"]
    assert all(info.offset % 128 == 0 for info in parsed.tensors.values())
    np.testing.assert_array_equal(parsed.qtensor("a.f32").dequantize(), f32)
    np.testing.assert_array_equal(parsed.qtensor("b.f16").dequantize(), f16.astype(np.float32))
    q8_tensor = parsed.qtensor("c.q8_0")
    assert q8_tensor.dtype is GgmlDType.Q8_0 and q8_tensor.shape == (3, 64)
    np.testing.assert_array_equal(
        q8_tensor.dequantize(), gguf.quants.dequantize(q8_raw, gguf.GGMLQuantizationType.Q8_0))


def test_big_endian_files_are_refused_clearly(tmp_path):
    path = tmp_path / "be.gguf"
    writer = gguf.GGUFWriter(path, arch="llama", endianess=gguf.GGUFEndian.BIG)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    with pytest.raises(UnsupportedError, match="big-endian"):
        GgufFile(path)


# ---------------------------------------------------------------------------- real files

@pytest.fixture(scope="module")
def smollm2_path(model_file):
    return model_file("smollm2-135m-instruct", "SmolLM2-135M-Instruct.Q4_1.gguf")


@pytest.fixture(scope="module")
def smollm2_reference(smollm2_path):
    return gguf.GGUFReader(smollm2_path)


def test_real_smollm2_agrees_with_gguf_reader(smollm2_path, smollm2_reference):
    reference = smollm2_reference
    parsed = GgufFile(smollm2_path)
    assert len(parsed.tensors) == len(reference.tensors) == 272
    assert parsed.data_offset == reference.data_offset
    for ref in reference.tensors:
        info = parsed.tensors[ref.name]
        assert info.dtype.name == ref.tensor_type.name
        assert info.ggml_dims == tuple(ref.shape.tolist())
        assert parsed.data_offset + info.offset == ref.data_offset
        assert info.nbytes == ref.n_bytes
    for key in ["general.architecture", "llama.block_count", "llama.context_length",
                "llama.embedding_length", "llama.attention.head_count_kv",
                "llama.rope.freq_base", "tokenizer.ggml.model", "tokenizer.ggml.bos_token_id",
                "tokenizer.chat_template"]:
        assert parsed.metadata[key] == pytest.approx(reference.fields[key].contents()), key
    assert len(reference.fields) - 3 == len(parsed.metadata)  # gguf-py adds 3 GGUF.* fields
    tokens = parsed.metadata["tokenizer.ggml.tokens"]
    assert len(tokens) == 49152
    assert tokens[:50] == reference.fields["tokenizer.ggml.tokens"].contents(slice(0, 50))
    assert tokens[-3:] == reference.fields["tokenizer.ggml.tokens"].contents(slice(-3, None))
    np.testing.assert_array_equal(parsed.metadata["tokenizer.ggml.token_type"],
                                  reference.fields["tokenizer.ggml.token_type"].contents())
    name = "blk.3.attn_v.weight"
    ref_tensor = next(t for t in reference.tensors if t.name == name)
    assert parsed.tensor_bytes(name).tobytes() == np.asarray(ref_tensor.data).tobytes()


def test_real_smollm2_from_bytes_equals_from_path(smollm2_path):
    from_path = GgufFile(smollm2_path)
    from_bytes = GgufFile(smollm2_path.read_bytes())
    assert from_bytes.tensors == from_path.tensors
    assert from_bytes.metadata["tokenizer.ggml.merges"] == \
        from_path.metadata["tokenizer.ggml.merges"]
    name = "blk.0.ffn_gate.weight"
    np.testing.assert_array_equal(from_bytes.qtensor(name).dequantize(),
                                  from_path.qtensor(name).dequantize())


def test_real_gemma3_header(model_file):
    parsed = GgufFile(model_file("gemma3-270m-q4km", "gemma-3-270m-Q4_K_M.gguf"))
    assert parsed.version == 3 and len(parsed.tensors) == 236
    assert parsed.metadata["general.architecture"] == "gemma3"
    assert parsed.metadata["gemma3.block_count"] == 18
    assert parsed.metadata["gemma3.embedding_length"] == 640
    assert len(parsed.metadata["tokenizer.ggml.tokens"]) == 262144
    assert parsed.metadata["tokenizer.ggml.scores"].shape == (262144,)
    kinds = {info.dtype.name for info in parsed.tensors.values()}
    assert {"Q4_K", "Q6_K", "Q5_0", "Q8_0", "F32"} <= kinds
    assert parsed.tensors["token_embd.weight"].shape == (262144, 640)
    # The tensors tile the data section: the last one ends at the end of the file.
    last = max(parsed.tensors.values(), key=lambda info: info.offset)
    size = parsed.data_offset + last.offset + last.nbytes
    assert size == model_file("gemma3-270m-q4km", "gemma-3-270m-Q4_K_M.gguf").stat().st_size


def test_sources_path_bytes_memoryview_file_object(tmp_path, rng):
    path = tmp_path / "s.gguf"
    write_sample(path, rng)
    raw = path.read_bytes()
    with path.open("rb") as handle:
        variants = [GgufFile(path), read_gguf(str(path)), GgufFile(raw),
                    GgufFile(memoryview(bytearray(raw))), GgufFile(handle)]
    for parsed in variants:
        assert parsed.tensors == variants[0].tensors
        assert parsed.tensor_bytes("q4_k.weight").tobytes() == \
            variants[0].tensor_bytes("q4_k.weight").tobytes()


def test_tensor_bytes_are_views_not_copies(tmp_path):
    out = io.BytesIO()
    write_gguf(out, {}, {"w": np.zeros((2, 4), np.float32)})
    buffer = bytearray(out.getvalue())
    parsed = GgufFile(buffer)
    buffer[parsed.data_offset:parsed.data_offset + 4] = np.float32(7.0).tobytes()
    assert parsed.qtensor("w").dequantize()[0, 0] == 7.0  # sees the caller's later write
    path = tmp_path / "w.gguf"
    path.write_bytes(out.getvalue())
    mapped = GgufFile(path).tensor_bytes("w")
    assert not mapped.flags.writeable  # a read-only memory map, not a private copy


def test_close_with_live_views_is_safe(tmp_path, rng):
    path = tmp_path / "c.gguf"
    write_sample(path, rng)
    with GgufFile(path) as parsed:
        kept = parsed.tensor_bytes("f32.matrix")
    assert kept.view(np.float32).shape == (15,)  # still readable after close


# ------------------------------------------------------------------------------ versions

def test_version_2_and_3_have_the_same_layout(tmp_path, rng):
    v3 = io.BytesIO()
    v2 = io.BytesIO()
    tensors = sample_tensors(rng)
    write_gguf(v3, {"a": 1, "s": "x"}, tensors)
    write_gguf(v2, {"a": 1, "s": "x"}, tensors, version=2)
    assert v2.getvalue()[:4] == v3.getvalue()[:4] == b"GGUF"
    assert struct.unpack_from("<I", v2.getvalue(), 4)[0] == 2
    assert v2.getvalue()[8:] == v3.getvalue()[8:]  # only the version differs (u64 counts)
    parsed_v2, parsed_v3 = GgufFile(v2.getvalue()), GgufFile(v3.getvalue())
    assert parsed_v2.version == 2 and parsed_v2.tensors == parsed_v3.tensors
    path = tmp_path / "v2.gguf"
    path.write_bytes(v2.getvalue())
    assert len(gguf.GGUFReader(path).tensors) == len(tensors)


def test_version_1_is_refused(tmp_path):
    header = b"GGUF" + struct.pack("<III", 1, 0, 0)  # v1: u32 counts
    with pytest.raises(UnsupportedError, match="version 1"):
        GgufFile(header)


# -------------------------------------------------------------------------------- errors

def minimal(metadata=None, tensors=None, **options) -> bytes:
    out = io.BytesIO()
    write_gguf(out, metadata or {}, tensors or {}, **options)
    return out.getvalue()


def patch(raw: bytes, offset: int, fmt: str, value) -> bytes:
    data = bytearray(raw)
    struct.pack_into(fmt, data, offset, value)
    return bytes(data)


def test_bad_magic_and_unknown_version():
    with pytest.raises(FormatError, match="not a GGUF file"):
        GgufFile(b"GGML" + bytes(20))
    with pytest.raises(FormatError, match="version 7"):
        GgufFile(patch(minimal(), 4, "<I", 7))


def test_unknown_value_type_names_the_key_and_id():
    raw = minimal({"my.key": 5})
    type_offset = 4 + 4 + 8 + 8 + 8 + len("my.key")
    with pytest.raises(FormatError, match=r"unknown metadata value type id 13 for key 'my\.key'"):
        GgufFile(patch(raw, type_offset, "<I", 13))


def test_unknown_ggml_type_names_the_tensor_and_id():
    raw = minimal(tensors={"weights.x": np.zeros(4, np.float32)})
    type_offset = 24 + 8 + len("weights.x") + 4 + 8  # name, n_dims, one dim
    with pytest.raises(FormatError, match=r"unknown GGML type id 31 \(tensor 'weights\.x'"):
        GgufFile(patch(raw, type_offset, "<I", 31))


def test_lying_lengths_fail_fast():
    raw = minimal({"k": "value"})
    string_length_at = 24 + 8 + 1 + 4
    for lie in [2**63, 2**64 - 1, len(raw)]:
        with pytest.raises(FormatError, match="needs .* bytes but only"):
            GgufFile(patch(raw, string_length_at, "<Q", lie))
    with pytest.raises(FormatError, match="metadata entries"):
        GgufFile(patch(raw, 16, "<Q", 2**62))
    with pytest.raises(FormatError, match="tensor infos"):
        GgufFile(patch(raw, 8, "<Q", 2**40))
    array = minimal({"a": np.arange(3, dtype=np.int32)})
    count_at = 24 + 8 + 1 + 4 + 4
    with pytest.raises(FormatError, match=r"array 'a' \(4611686018427387904 x int32\)"):
        GgufFile(patch(array, count_at, "<Q", 2**62))


def test_tensor_geometry_is_checked():
    raw = minimal(tensors={"t": np.zeros((2, 8), np.float32)})
    dims_at = 24 + 8 + 1 + 4
    with pytest.raises(FormatError, match="needs bytes 0..64 of the data section, which has 63"):
        GgufFile(raw[:-1])
    with pytest.raises(FormatError, match=r"tensor 't' \(F32, dims \[8, 1000000\]\)"):
        GgufFile(patch(raw, dims_at + 8, "<Q", 1_000_000))
    with pytest.raises(FormatError, match="5 dims"):
        GgufFile(patch(raw, dims_at - 4, "<I", 5))
    offset_at = dims_at + 16 + 4
    with pytest.raises(FormatError, match="offset 8 is not a multiple of the alignment 32"):
        GgufFile(patch(raw, offset_at, "<Q", 8))
    q4 = minimal(tensors={"q": QTensor.from_float(np.zeros((1, 32), np.float32), "Q4_0")})
    with pytest.raises(FormatError, match="first GGML dim 16 is not a multiple of the Q4_0 "):
        GgufFile(patch(q4, dims_at, "<Q", 16))


def test_duplicates_bad_bools_and_bad_alignment():
    raw = minimal({"aa": 1, "ab": 2})
    second_key_at = 24 + 8 + 2 + 4 + 4 + 8
    with pytest.raises(FormatError, match="duplicate metadata key 'aa'"):
        GgufFile(raw[:second_key_at] + b"aa" + raw[second_key_at + 2:])
    with pytest.raises(FormatError, match="bool must be 0 or 1, got 2"):
        GgufFile(patch(minimal({"b": True}), 24 + 8 + 1 + 4, "<B", 2))
    aligned = minimal({}, alignment=64)
    value_at = 24 + 8 + len("general.alignment") + 4
    with pytest.raises(FormatError, match="power of two, got 48"):
        GgufFile(patch(aligned, value_at, "<I", 48))


def test_every_truncation_is_a_format_error(rng):
    raw = minimal({key: value for key, (value, _) in TYPED_METADATA.items()},
                  {"w": QTensor.from_float(rng.standard_normal((1, 256)).astype(np.float32),
                                           "Q4_K")},
                  metadata_types={key: t for key, (_, t) in TYPED_METADATA.items()})
    whole = GgufFile(raw)
    tensor = whole.tensors["w"]
    # The file may end anywhere in the padding after the last tensor; before that, never.
    end_of_data = whole.data_offset + tensor.offset + tensor.nbytes
    assert end_of_data < len(raw)
    GgufFile(raw[:end_of_data])
    for length in range(end_of_data):
        with pytest.raises(FormatError):
            GgufFile(raw[:length])


def test_unknown_tensor_name_and_bad_source():
    parsed = GgufFile(minimal())
    with pytest.raises(ModelNotFound, match="no tensor named 'x'"):
        parsed.tensor_bytes("x")
    with pytest.raises(FormatError, match="cannot read from a int"):
        GgufFile(12345)
    with pytest.raises(ModelNotFound, match="cannot open"):
        GgufFile("/nonexistent/model.gguf")
    with pytest.raises(FormatError, match="the magic needs 4 bytes but only 0 remain"):
        GgufFile(b"")
    with pytest.raises(FormatError, match="contiguous"):
        GgufFile(np.zeros((4, 8), np.uint8)[:, ::2])
    parsed.close()
    with pytest.raises(FormatError, match="closed"):
        parsed.tensor_bytes("x")


def test_writer_rejects_what_it_cannot_encode(tmp_path):
    with pytest.raises(FormatError, match="give the item type of an empty array"):
        minimal({"e": []})
    with pytest.raises(FormatError, match="share one type"):
        minimal({"mixed": [1, "a"]})
    with pytest.raises(FormatError, match="not a valid UINT8"):
        minimal({"u": 300}, metadata_types={"u": V.UINT8})
    with pytest.raises(CandleError, match="uint16"):
        minimal(tensors={"bits": np.zeros(4, np.uint16)})
