"""The 32-element block types Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and Q8_1.

Each function works on a whole tensor at once: ``blocks`` is a ``(n_blocks, type_size)`` uint8
array, the float side is ``(n_blocks, 32)`` float32. Layout shared by the 4- and 5-bit types:
byte ``j`` of ``qs`` holds element ``j`` in its low nibble and element ``j + 16`` in its high
nibble; the 5th bit of element ``j`` is bit ``j`` of the little-endian u32 ``qh``.

The quantizers follow ggml's reference C functions (``quantize_row_*_ref``) operation by
operation in f32, so their bytes equal those of llama.cpp and of ``gguf.quants``.
"""

from __future__ import annotations

import numpy as np

from ._bits import (f16_bytes, f16_field, field, reciprocal_or_zero, round_half_away,
                    signed_absmax, split_nibbles)

BLOCK = 32
HALF = BLOCK // 2


# ----------------------------------------------------------------------------------- helpers

def _unpack_nibbles(qs: np.ndarray) -> np.ndarray:
    """(n, 16) packed bytes -> (n, 32) values 0..15 in element order."""
    low, high = split_nibbles(qs)
    return np.concatenate([low, high], axis=1)


def _pack_nibbles(q: np.ndarray) -> np.ndarray:
    """(n, 32) values 0..15 -> (n, 16) bytes (inverse of :func:`_unpack_nibbles`)."""
    return (q[:, :HALF] & np.uint8(0x0F)) | (q[:, HALF:] << np.uint8(4))


def _unpack_high_bits(qh: np.ndarray) -> np.ndarray:
    """(n, 4) bytes of a little-endian u32 -> (n, 32) bits, bit j of the u32 at column j."""
    return np.unpackbits(qh, axis=1, bitorder="little")


def _pack_high_bits(q: np.ndarray) -> np.ndarray:
    """Bit 4 of each of the 32 values -> (n, 4) bytes of a little-endian u32."""
    return np.packbits((q >> np.uint8(4)) & np.uint8(1), axis=1, bitorder="little")


def _truncate_to_levels(scaled: np.ndarray, top: int) -> np.ndarray:
    """C's ``MIN(top, (int8_t)v)`` for v >= 0: truncate, then cap at the highest level."""
    return np.minimum(np.trunc(scaled), np.float32(top)).astype(np.uint8)


# ------------------------------------------------------------------------------- dequantize

def dequantize_q4_0(blocks: np.ndarray) -> np.ndarray:
    d = f16_field(blocks, 0)
    q = _unpack_nibbles(field(blocks, 2, 18)).astype(np.int8) - np.int8(8)
    return d * q.astype(np.float32)


def dequantize_q4_1(blocks: np.ndarray) -> np.ndarray:
    d = f16_field(blocks, 0)
    m = f16_field(blocks, 2)
    q = _unpack_nibbles(field(blocks, 4, 20)).astype(np.float32)
    return d * q + m


def dequantize_q5_0(blocks: np.ndarray) -> np.ndarray:
    d = f16_field(blocks, 0)
    high = _unpack_high_bits(field(blocks, 2, 6))
    low = _unpack_nibbles(field(blocks, 6, 22))
    q = (low | (high << np.uint8(4))).astype(np.int8) - np.int8(16)
    return d * q.astype(np.float32)


def dequantize_q5_1(blocks: np.ndarray) -> np.ndarray:
    d = f16_field(blocks, 0)
    m = f16_field(blocks, 2)
    high = _unpack_high_bits(field(blocks, 4, 8))
    low = _unpack_nibbles(field(blocks, 8, 24))
    q = (low | (high << np.uint8(4))).astype(np.float32)
    return d * q + m


def dequantize_q8_0(blocks: np.ndarray) -> np.ndarray:
    d = f16_field(blocks, 0)
    return d * field(blocks, 2, 34).view(np.int8).astype(np.float32)


def dequantize_q8_1(blocks: np.ndarray) -> np.ndarray:
    # Bytes 2..3 hold s = d * sum(q), a cache for dot products; the values need only d.
    d = f16_field(blocks, 0)
    return d * field(blocks, 4, 36).view(np.int8).astype(np.float32)


# --------------------------------------------------------------------------------- quantize

def quantize_q4_0(x: np.ndarray) -> np.ndarray:
    # The value of largest magnitude maps to level 0 (-8 * d); the others round to nearest.
    d = signed_absmax(x) / np.float32(-8)
    inv_d = reciprocal_or_zero(d)
    q = _truncate_to_levels(x * inv_d + np.float32(8.5), 15)
    return np.concatenate([f16_bytes(d), _pack_nibbles(q)], axis=1)


def quantize_q4_1(x: np.ndarray) -> np.ndarray:
    low = x.min(axis=1, keepdims=True)
    high = x.max(axis=1, keepdims=True)
    d = (high - low) / np.float32(15)
    inv_d = reciprocal_or_zero(d)
    q = _truncate_to_levels((x - low) * inv_d + np.float32(0.5), 15)
    return np.concatenate([f16_bytes(d), f16_bytes(low), _pack_nibbles(q)], axis=1)


def quantize_q5_0(x: np.ndarray) -> np.ndarray:
    d = signed_absmax(x) / np.float32(-16)
    inv_d = reciprocal_or_zero(d)
    q = _truncate_to_levels(x * inv_d + np.float32(16.5), 31)
    return np.concatenate([f16_bytes(d), _pack_high_bits(q), _pack_nibbles(q)], axis=1)


def quantize_q5_1(x: np.ndarray) -> np.ndarray:
    low = x.min(axis=1, keepdims=True)
    high = x.max(axis=1, keepdims=True)
    d = (high - low) / np.float32(31)
    inv_d = reciprocal_or_zero(d)
    q = _truncate_to_levels((x - low) * inv_d + np.float32(0.5), 31)
    return np.concatenate([f16_bytes(d), f16_bytes(low), _pack_high_bits(q), _pack_nibbles(q)],
                          axis=1)


def quantize_q8_0(x: np.ndarray) -> np.ndarray:
    d = np.abs(x).max(axis=1, keepdims=True) / np.float32(127)
    inv_d = reciprocal_or_zero(d)
    q = round_half_away(x * inv_d).astype(np.int8)
    return np.concatenate([f16_bytes(d), q.view(np.uint8)], axis=1)
