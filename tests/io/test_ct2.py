"""candle_web.io.ct2: the real faster-whisper tiny.en model.bin, a round trip through a small
writer written here from the format description, targeted corruptions, and a fuzz test."""

from __future__ import annotations

import math
import re
import struct
import tracemalloc

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from candle_web.core.errors import CandleError, FormatError, ModelNotFound, UnsupportedError
from candle_web.io.ct2 import read_ct2

# ------------------------------------------------------------------------------------------
# A tiny writer (the test's own, from DESIGN.md section 4) for synthetic files
# ------------------------------------------------------------------------------------------

DTYPE_IDS = {"float32": (0, "<f4"), "int8": (1, "i1"), "int16": (2, "<i2"), "int32": (3, "<i4"),
             "float16": (4, "<f2"), "bfloat16": (5, "<u2")}


def pack_string(text: str) -> bytes:
    raw = text.encode("utf-8") + b"\0"
    return struct.pack("<H", len(raw)) + raw


def write_ct2(variables, aliases=(), version=6, spec="TestSpec", revision=2) -> bytes:
    """variables: [(name, ct2 type name, array)]; aliases: [(alias, target)]."""
    out = [struct.pack("<I", version)]
    if version >= 2:
        out += [pack_string(spec), struct.pack("<I", revision)]
    out.append(struct.pack("<I", len(variables)))
    for name, type_name, array in variables:
        type_id, storage = DTYPE_IDS[type_name]
        data = np.ascontiguousarray(array, dtype=storage).tobytes()
        out += [pack_string(name), struct.pack("<B", array.ndim),
                struct.pack(f"<{array.ndim}I", *array.shape)]
        if version >= 4:
            out.append(struct.pack("<BI", type_id, len(data)))
        else:
            out.append(struct.pack("<BI", np.dtype(storage).itemsize, array.size))
        out.append(data)
    if version >= 3:
        out.append(struct.pack("<I", len(aliases)))
        for alias, target in aliases:
            out += [pack_string(alias), pack_string(target)]
    return b"".join(out)


RNG = np.random.default_rng(7)
SMALL_VARIABLES = [
    ("encoder/weight", "float32", RNG.standard_normal((2, 3)).astype(np.float32)),
    ("encoder/half", "float16", RNG.standard_normal(4).astype(np.float16)),
    ("decoder/bf16", "bfloat16", np.array([[0x3F80, 0xC000], [0x0000, 0x7F80]], np.uint16)),
    ("decoder/num_heads", "int8", np.array(6, np.int8)),
    ("decoder/ids", "int32", np.array([1, -2, 3], np.int32)),
]
SMALL_ALIASES = [("decoder/projection", "encoder/weight")]
SMALL_FILE = write_ct2(SMALL_VARIABLES, SMALL_ALIASES)


def test_round_trip_of_every_dtype_and_alias():
    model = read_ct2(SMALL_FILE)
    assert (model.spec_name, model.revision, model.binary_version) == ("TestSpec", 2, 6)
    assert list(model.variables) == [name for name, _, _ in SMALL_VARIABLES]
    for name, type_name, array in SMALL_VARIABLES:
        assert model.dtypes[name] == type_name
        assert model[name].dtype == np.dtype(DTYPE_IDS[type_name][1])
        np.testing.assert_array_equal(model[name], array)  # exact: bytes are not converted
    assert model.aliases == dict(SMALL_ALIASES)
    assert model["decoder/projection"] is model["encoder/weight"]
    assert "decoder/projection" in model and "nothing" not in model
    assert model.scalar("decoder/num_heads") == 6
    assert model.get("nothing") is None and model.get("decoder/projection") is not None
    widened = model.get_f32("decoder/bf16")  # bf16 bits 0x3F80 = 1.0, 0xC000 = -2.0
    np.testing.assert_array_equal(widened, np.array([[1.0, -2.0], [0.0, np.inf]], np.float32))
    assert model.get_f32("encoder/half").dtype == np.float32
    with pytest.raises(ModelNotFound, match="nothing"):
        model["nothing"]


@pytest.mark.parametrize("version", [1, 2, 3, 4, 5])
def test_older_binary_versions(version):
    # Before v4 the dtype was guessed from the item size: only f32/i16/i8 survive the trip.
    variables = [v for v in SMALL_VARIABLES if v[1] in ("float32", "int8")] if version < 4 \
        else SMALL_VARIABLES
    aliases = SMALL_ALIASES if version >= 3 else ()
    model = read_ct2(write_ct2(variables, aliases, version=version))
    assert model.binary_version == version
    assert model.spec_name == ("TestSpec" if version >= 2 else "")
    for name, _, array in variables:
        np.testing.assert_array_equal(model[name], array)
    assert model.aliases == dict(aliases)


def offset_of_field(data: bytes, name: str) -> int:
    """Offset just after a variable's name (where its rank byte is)."""
    return data.index(name.encode() + b"\0") + len(name) + 1


def test_targeted_corruptions_name_the_variable_and_offset():
    rank_at = offset_of_field(SMALL_FILE, "encoder/half")  # rank 1, dims (4,), dtype, count
    dtype_at = rank_at + 1 + 4
    bad_dtype = bytearray(SMALL_FILE)
    bad_dtype[dtype_at] = 9
    with pytest.raises(FormatError, match=r"'encoder/half' at offset \d+: unknown dtype id 9"):
        read_ct2(bytes(bad_dtype))

    huge_count = bytearray(SMALL_FILE)
    huge_count[dtype_at + 1:dtype_at + 5] = struct.pack("<I", 0xFFFFFFFF)
    with pytest.raises(FormatError, match=r"'encoder/half' at offset \d+: 4294967295 bytes"):
        read_ct2(bytes(huge_count))

    huge_dims = bytearray(SMALL_FILE)
    huge_dims[rank_at + 1:rank_at + 5] = struct.pack("<I", 0xFFFFFFFF)
    with pytest.raises(FormatError, match="do not hold shape"):
        read_ct2(bytes(huge_dims))

    too_many = bytearray(SMALL_FILE)
    count_at = 4 + len(pack_string("TestSpec")) + 4
    too_many[count_at:count_at + 4] = struct.pack("<I", 0xFFFFFFFF)
    with pytest.raises(FormatError, match="variable count 4294967295"):
        read_ct2(bytes(too_many))

    with pytest.raises(UnsupportedError, match="binary version 7"):
        read_ct2(struct.pack("<I", 7) + SMALL_FILE[4:])
    with pytest.raises(FormatError, match="unexpected bytes"):
        read_ct2(SMALL_FILE + b"\0")
    with pytest.raises(FormatError, match="missing variable 'nowhere'"):
        read_ct2(write_ct2(SMALL_VARIABLES, [("a", "nowhere")]))
    with pytest.raises(FormatError, match="appears twice"):
        read_ct2(write_ct2(SMALL_VARIABLES[:1] * 2))
    with pytest.raises(FormatError, match="not UTF-8"):
        read_ct2(SMALL_FILE.replace(b"encoder/half", b"encoder/ha\xff\xfe"))
    with pytest.raises(FormatError):
        read_ct2(12345)


def test_every_truncation_is_a_format_error():
    for length in range(len(SMALL_FILE)):
        with pytest.raises(FormatError, match="offset"):
            read_ct2(SMALL_FILE[:length])


# Mutations: (kind, relative position in [0, 1), value)
MUTATION = st.tuples(st.sampled_from(["byte", "u32", "truncate", "insert", "delete"]),
                     st.floats(0, 1, exclude_max=True), st.integers(0, 2**32 - 1))
BIG_ALLOCATION_BYTES = 1 << 20


def mutate(data: bytes, mutations) -> bytes:
    buffer = bytearray(data)
    for kind, where, value in mutations:
        position = int(where * len(buffer)) if buffer else 0
        if kind == "byte" and buffer:
            buffer[position] = value & 0xFF
        elif kind == "u32":
            buffer[position:position + 4] = struct.pack("<I", value)
        elif kind == "truncate":
            del buffer[position:]
        elif kind == "insert":
            buffer[position:position] = struct.pack("<I", value)[: 1 + value % 4]
        elif kind == "delete":
            del buffer[position:position + 1 + value % 8]
    return bytes(buffer)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(MUTATION, min_size=1, max_size=4))
def test_fuzzed_files_raise_only_candle_errors_without_big_allocations(mutations):
    data = mutate(SMALL_FILE, mutations)
    tracemalloc.start()
    try:
        model = read_ct2(data)
    except CandleError:
        model = None
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert peak < BIG_ALLOCATION_BYTES, f"{peak} bytes allocated for a {len(data)}-byte file"
    if model is not None:
        # Whatever was accepted is a view inside the input.
        assert sum(array.nbytes for array in model.variables.values()) <= len(data)


# ------------------------------------------------------------------------------------------
# The real file: faster-whisper tiny.en (CTranslate2 float16)
# ------------------------------------------------------------------------------------------

D_MODEL = 384
N_LAYERS = 4
N_MELS = 80
VOCAB = 51864
N_AUDIO_CTX = 1500
N_TEXT_CTX = 448


@pytest.fixture(scope="module")
def tiny_en(model_file):
    return read_ct2(model_file("whisper-tiny.en", "model.bin"))


def sinusoids(length: int, channels: int) -> np.ndarray:
    """Whisper's fixed encoder position embedding, written from the paper's definition."""
    increment = math.log(10000) / (channels // 2 - 1)
    inverse = np.exp(-increment * np.arange(channels // 2))
    angles = np.arange(length)[:, None] * inverse[None, :]
    return np.concatenate([np.sin(angles), np.cos(angles)], axis=1)


def test_tiny_en_layout(tiny_en):
    model = tiny_en
    assert (model.spec_name, model.revision, model.binary_version) == ("WhisperSpec", 3, 6)
    assert len(model.variables) == 148
    assert model.aliases == {"decoder/projection/weight": "decoder/embeddings/weight"}
    d = D_MODEL
    expected_shapes = {
        "encoder/conv1/weight": (d, N_MELS, 3),
        "encoder/conv2/weight": (d, d, 3),
        "encoder/position_encodings/encodings": (N_AUDIO_CTX, d),
        "encoder/layer_0/self_attention/linear_0/weight": (3 * d, d),  # fused QKV
        "encoder/layer_3/self_attention/linear_1/weight": (d, d),
        "decoder/embeddings/weight": (VOCAB, d),
        "decoder/position_encodings/encodings": (N_TEXT_CTX, d),
        "decoder/layer_0/attention/linear_0/weight": (d, d),  # cross-attention q
        "decoder/layer_0/attention/linear_1/weight": (2 * d, d),  # cross-attention fused KV
        "decoder/layer_3/ffn/linear_0/weight": (4 * d, d),
        "decoder/layer_3/ffn/linear_1/weight": (d, 4 * d),
    }
    for name, shape in expected_shapes.items():
        assert model[name].shape == shape, name
        assert model.dtype_of(name) == "float16" and model[name].dtype == np.float16
    for side in ("encoder", "decoder"):
        layers = {name.split("/")[1] for name in model.variables
                  if re.match(rf"{side}/layer_\d+/", name)}
        assert layers == {f"layer_{i}" for i in range(N_LAYERS)}
        assert model.scalar(f"{side}/num_heads") == 6
    assert model["decoder/projection/weight"] is model["decoder/embeddings/weight"]
    assert not model["encoder/conv1/weight"].flags.writeable  # a view of the read-only map


def test_tiny_en_values(tiny_en, model_file):
    # The encoder position table is fixed sinusoids: an exact check that offsets are right.
    # Tolerance: float16 rounding of values in [-1, 1] is at most 2**-11 ~ 4.9e-4.
    table = tiny_en["encoder/position_encodings/encodings"].astype(np.float32)
    np.testing.assert_allclose(table, sinusoids(N_AUDIO_CTX, D_MODEL), atol=5e-4, rtol=0)
    # Whisper has no key bias: the converter fills the k slice of the fused QKV bias with 0.
    bias = tiny_en["encoder/layer_0/self_attention/linear_0/bias"]
    assert np.all(bias[D_MODEL:2 * D_MODEL] == 0) and np.any(bias[:D_MODEL] != 0)
    # Bytes and path give the same arrays.
    from_bytes = read_ct2(model_file("whisper-tiny.en", "model.bin").read_bytes())
    np.testing.assert_array_equal(from_bytes["decoder/embeddings/weight"],
                                  tiny_en["decoder/embeddings/weight"])


def test_tiny_en_as_tensor(tiny_en):
    from candle_web import f16

    tensor = tiny_en.tensor("encoder/conv1/weight")
    assert tensor.dtype == f16 and tuple(tensor.shape) == (D_MODEL, N_MELS, 3)
    np.testing.assert_array_equal(tensor.to_numpy(),
                                  tiny_en["encoder/conv1/weight"].astype(np.float32))
    with pytest.raises(UnsupportedError, match="int8"):
        tiny_en.tensor("decoder/activation")
