"""Robustness of the GGUF parser against corrupted and lying files.

A small valid file (every metadata kind, quantized and plain tensors) is mutated by hypothesis:
random bytes, huge or boundary integers written over length/count/offset fields, truncations,
insertions and deletions. Whatever the mutation, parsing (and decoding every tensor the parser
accepted) may only fail with a CandleError: never struct.error, MemoryError, OverflowError,
RecursionError or an unbounded loop. A tracemalloc check shows that lying lengths make the
parser allocate nothing in proportion to the lie.
"""

from __future__ import annotations

import io
import struct
import tracemalloc

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from candle_web.core.errors import CandleError, FormatError
from candle_web.io.gguf import GgufFile, GgufValueType, write_gguf
from candle_web.quantized import QTensor

V = GgufValueType


def build_base_file() -> bytes:
    rng = np.random.default_rng(3)
    metadata = {
        "general.architecture": "llama",
        "llama.block_count": 2,
        "llama.rope.freq_base": 10000.0,
        "flag": True,
        "tokenizer.ggml.tokens": ["<s>", "</s>", "a", "b", "Ġab"],
        "tokenizer.ggml.scores": np.array([0.0, 0.0, -1.0, -2.0, -3.0], dtype=np.float32),
        "nested": [[1, 2], [3]],
        "big": np.uint64(2**60),
    }
    tensors = {
        "q4_0": QTensor.from_float(rng.standard_normal((2, 32)).astype(np.float32), "Q4_0"),
        "q6_k": QTensor.from_float(rng.standard_normal((1, 256)).astype(np.float32), "Q6_K"),
        "f32": rng.standard_normal(4).astype(np.float32),
    }
    out = io.BytesIO()
    write_gguf(out, metadata, tensors)
    return out.getvalue()


BASE = build_base_file()
# Values that break naive parsers: sign-bit and all-ones lengths, 32-bit boundaries, small
# counts that point just past the end.
LIES = [0, 1, 2**31, 2**32 - 1, 2**32, 2**62, 2**63 - 1, 2**63, 2**64 - 1, len(BASE),
        len(BASE) + 1]


def parse_and_decode(raw: bytes) -> None:
    try:
        parsed = GgufFile(raw)
        for name in parsed.tensors:
            parsed.qtensor(name).dequantize()
    except CandleError:
        pass


@st.composite
def mutated_files(draw):
    raw = bytearray(BASE)
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["bytes", "u64", "u32", "truncate", "insert", "delete"]))
        position = draw(st.integers(0, max(0, len(raw) - 1)))
        if kind == "bytes":
            chunk = draw(st.binary(min_size=1, max_size=4))
            raw[position:position + len(chunk)] = chunk
        elif kind in ("u64", "u32"):
            fmt, limit = ("<Q", 2**64) if kind == "u64" else ("<I", 2**32)
            value = draw(st.sampled_from(LIES)) % limit
            if position + struct.calcsize(fmt) <= len(raw):
                struct.pack_into(fmt, raw, position, value)
        elif kind == "truncate":
            del raw[position:]
        elif kind == "insert":
            raw[position:position] = draw(st.binary(min_size=1, max_size=16))
        else:
            del raw[position:position + draw(st.integers(1, 16))]
    return bytes(raw)


@settings(max_examples=400, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(mutated_files())
def test_mutated_files_raise_only_candle_errors(raw):
    parse_and_decode(raw)


def length_and_count_fields() -> list[int]:
    """Offsets of every u64 length/count field of BASE's header, found by walking it."""
    view = memoryview(BASE)
    fields = [8, 16]  # tensor count, kv count
    pos = 24
    n_tensors, n_kv = struct.unpack_from("<QQ", view, 8)

    def walk_value(value_type):
        nonlocal pos
        if value_type == V.STRING:
            fields.append(pos)
            pos += 8 + struct.unpack_from("<Q", view, pos)[0]
        elif value_type == V.ARRAY:
            item_type = struct.unpack_from("<I", view, pos)[0]
            fields.append(pos + 4)
            count = struct.unpack_from("<Q", view, pos + 4)[0]
            pos += 12
            for _ in range(count):
                walk_value(item_type)
        else:
            pos += {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}[
                value_type]

    for _ in range(n_kv):
        walk_value(V.STRING)
        value_type = struct.unpack_from("<I", view, pos)[0]
        pos += 4
        walk_value(value_type)
    for _ in range(n_tensors):
        walk_value(V.STRING)
        n_dims = struct.unpack_from("<I", view, pos)[0]
        fields.extend(pos + 4 + 8 * d for d in range(n_dims))
        pos += 4 + 8 * n_dims + 4
        fields.append(pos)  # data offset
        pos += 8
    return fields


FIELDS = length_and_count_fields()


def test_the_field_walk_found_the_header():
    # 2 counts + 8 keys + 2 strings + 3 arrays (5 + 5 + 2 items, 2 inner arrays) + 5 tokens
    # + 3 names + 6 dims + 3 offsets
    assert len(FIELDS) > 30


@pytest.mark.parametrize("lie", [2**63, 2**64 - 1, 2**62, 2**40, len(BASE) + 1])
def test_every_lying_length_fails_fast_without_allocating(lie):
    for offset in FIELDS:
        raw = bytearray(BASE)
        struct.pack_into("<Q", raw, offset, lie)
        tracemalloc.start()
        try:
            with pytest.raises(FormatError):
                GgufFile(bytes(raw))
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert peak < 256 * 1024, f"lie {lie} at byte {offset} made the parser allocate {peak}"


def test_deeply_nested_arrays_are_refused():
    key = b"deep"
    value = b""
    depth = 10_000
    for _ in range(depth):
        value += struct.pack("<IQ", V.ARRAY, 1)
    value += struct.pack("<IQ", V.INT32, 0)
    raw = (b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", len(key)) + key
           + struct.pack("<I", V.ARRAY) + value)
    with pytest.raises(FormatError, match="nested deeper than 8"):
        GgufFile(raw)
