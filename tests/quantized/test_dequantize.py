"""Dequantization of every GGML type against independent references.

References: ``gguf.quants.dequantize`` (llama.cpp's own pure-numpy port) for every type it has;
for Q8_1 and Q8_K, which it lacks, a scalar decoder written here from the C struct layout.
Comparisons are bit-exact (float32 bit patterns), on random blocks and on real blocks of the
SmolLM2 (Q4_1, Q8_0) and Gemma-3 (Q4_K, Q6_K, Q5_0, Q8_0) GGUF files.
"""

from __future__ import annotations

import struct

import gguf
import numpy as np
import pytest

from candle_web.core.errors import FormatError, ShapeError, UnsupportedError
from candle_web.io.gguf import GgufFile
from candle_web.quantized import GgmlDType, dequantize

from tests.quantized.quantized_testlib import random_blocks

BLOCK_TYPES_IN_GGUF_PY = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0",
                          "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"]
N_RANDOM_BLOCKS = 300


def assert_bit_exact(actual: np.ndarray, expected: np.ndarray) -> None:
    actual = np.asarray(actual, dtype=np.float32).reshape(-1)
    expected = np.asarray(expected, dtype=np.float32).reshape(-1)
    assert actual.shape == expected.shape
    mismatch = actual.view(np.uint32) != expected.view(np.uint32)
    assert not mismatch.any(), (
        f"{mismatch.sum()} of {mismatch.size} values differ; first at {np.argmax(mismatch)}: "
        f"{actual[mismatch][:4]} vs {expected[mismatch][:4]}")


def gguf_reference(dtype: GgmlDType, blocks: np.ndarray) -> np.ndarray:
    return gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType[dtype.name])


@pytest.mark.parametrize("name", BLOCK_TYPES_IN_GGUF_PY)
def test_random_blocks_match_gguf_py(name, rng):
    dtype = GgmlDType[name]
    blocks = random_blocks(dtype, N_RANDOM_BLOCKS, rng)
    ours = dequantize(dtype, blocks, N_RANDOM_BLOCKS * dtype.block_size)
    assert ours.dtype == np.float32
    assert_bit_exact(ours, gguf_reference(dtype, blocks))


def test_random_blocks_with_nan_and_inf_scales_match_gguf_py(rng):
    # Unsanitised bytes: some f16 scales are inf/NaN. Both must propagate them identically.
    for name in BLOCK_TYPES_IN_GGUF_PY:
        dtype = GgmlDType[name]
        blocks = rng.integers(0, 256, size=(64, dtype.type_size), dtype=np.uint8)
        with np.errstate(invalid="ignore", over="ignore"):
            expected = gguf_reference(dtype, blocks).reshape(-1)
        ours = dequantize(dtype, blocks, 64 * dtype.block_size)
        np.testing.assert_array_equal(ours, expected)  # NaN == NaN here


@pytest.mark.parametrize("name,numpy_dtype", [("F32", "<f4"), ("F16", "<f2")])
def test_plain_floats_match_gguf_py(name, numpy_dtype, rng):
    values = rng.standard_normal(1000).astype(numpy_dtype)
    raw = values.view(np.uint8)
    expected = gguf.quants.dequantize(values, gguf.GGMLQuantizationType[name])
    assert_bit_exact(dequantize(name, raw, values.size), expected)


def test_bf16_matches_gguf_py(rng):
    bits = rng.integers(0, 2**16, size=4096, dtype=np.uint16)
    finite = (bits & 0x7F80) != 0x7F80  # drop inf/NaN patterns for a bitwise comparison
    bits = bits[finite]
    expected = gguf.quants.dequantize(bits.view(np.uint8).reshape(-1, 2),
                                      gguf.GGMLQuantizationType.BF16)
    assert_bit_exact(dequantize("BF16", bits.view(np.uint8), bits.size), expected)


@pytest.mark.parametrize("name,numpy_dtype", [("I8", "i1"), ("I16", "<i2"), ("I32", "<i4"),
                                              ("F64", "<f8")])
def test_plain_integer_and_f64_types_are_cast(name, numpy_dtype, rng):
    values = (rng.standard_normal(100) * 100).astype(numpy_dtype)
    ours = dequantize(name, values.view(np.uint8), values.size)
    np.testing.assert_array_equal(ours, values.astype(np.float32))


def scalar_q8_1(block: bytes) -> list[float]:
    """block_q8_1 {ggml_half d; ggml_half s; int8 qs[32]}: y = d * q (s is d*sum(q))."""
    d = np.float32(struct.unpack_from("<e", block, 0)[0])
    return [np.float32(d * np.float32(q)) for q in struct.unpack_from("<32b", block, 4)]


def scalar_q8_k(block: bytes) -> list[float]:
    """block_q8_K {float d; int8 qs[256]; int16 bsums[16]}: y = d * q."""
    d = np.float32(struct.unpack_from("<f", block, 0)[0])
    return [np.float32(d * np.float32(q)) for q in struct.unpack_from("<256b", block, 4)]


@pytest.mark.parametrize("name,scalar", [("Q8_1", scalar_q8_1), ("Q8_K", scalar_q8_k)])
def test_types_missing_from_gguf_py_match_a_scalar_decoder(name, scalar, rng):
    dtype = GgmlDType[name]
    blocks = random_blocks(dtype, 40, rng)
    expected = [v for block in blocks for v in scalar(block.tobytes())]
    assert_bit_exact(dequantize(dtype, blocks, 40 * dtype.block_size), np.array(expected))


def test_zero_elements():
    assert dequantize("Q4_K", b"", 0).shape == (0,)


def test_wrong_byte_count_is_a_format_error():
    with pytest.raises(FormatError, match="Q4_0: 64 elements take 36 bytes, got 35"):
        dequantize("Q4_0", bytes(35), 64)


def test_partial_block_is_a_shape_error():
    with pytest.raises(ShapeError, match="Q6_K packs 256 elements per block"):
        dequantize("Q6_K", bytes(210), 200)


def test_types_without_a_decoder_are_unsupported():
    with pytest.raises(UnsupportedError, match="IQ4_XS"):
        dequantize(GgmlDType.IQ4_XS, bytes(GgmlDType.IQ4_XS.type_size), 256)


# ------------------------------------------------------------------------ real model blocks

MAX_REAL_ROWS = 256  # enough blocks to cover every code path; keeps gguf-py's time small


def first_rows(gguf_file: GgufFile, name: str) -> tuple[GgmlDType, np.ndarray, int]:
    info = gguf_file.tensors[name]
    rows = min(MAX_REAL_ROWS, int(np.prod(info.shape[:-1])))
    row_bytes = info.dtype.row_bytes(info.shape[-1])
    raw = gguf_file.tensor_bytes(name)[:rows * row_bytes].reshape(rows, row_bytes)
    return info.dtype, raw, rows * info.shape[-1]


@pytest.fixture(scope="module")
def smollm2(model_file):
    return GgufFile(model_file("smollm2-135m-instruct", "SmolLM2-135M-Instruct.Q4_1.gguf"))


@pytest.fixture(scope="module")
def gemma3(model_file):
    return GgufFile(model_file("gemma3-270m-q4km", "gemma-3-270m-Q4_K_M.gguf"))


@pytest.mark.parametrize("name,expected_type", [
    ("blk.0.attn_q.weight", "Q4_1"), ("blk.29.ffn_down.weight", "Q4_1"),
    ("token_embd.weight", "Q8_0")])
def test_real_smollm2_blocks_match_gguf_py(smollm2, name, expected_type):
    dtype, raw, n = first_rows(smollm2, name)
    assert dtype.name == expected_type
    ours = dequantize(dtype, raw, n)
    assert np.isfinite(ours).all()
    assert_bit_exact(ours, gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[dtype.name]))


@pytest.mark.parametrize("name,expected_type", [
    ("blk.0.attn_output.weight", "Q4_K"), ("blk.0.ffn_down.weight", "Q6_K"),
    ("blk.0.attn_k.weight", "Q5_0"), ("token_embd.weight", "Q8_0")])
def test_real_gemma3_blocks_match_gguf_py(gemma3, name, expected_type):
    dtype, raw, n = first_rows(gemma3, name)
    assert dtype.name == expected_type
    ours = dequantize(dtype, raw, n)
    assert np.isfinite(ours).all()
    assert 0 < np.abs(ours).max() < 100  # trained weights, not garbage from a wrong offset
    assert_bit_exact(ours, gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[dtype.name]))
