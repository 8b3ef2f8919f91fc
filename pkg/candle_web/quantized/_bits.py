"""Small helpers shared by the block codecs: reading little-endian fields out of a
``(n_blocks, type_size)`` uint8 array, and the rounding rules of ggml's reference C code."""

from __future__ import annotations

import numpy as np


def field(blocks: np.ndarray, start: int, stop: int) -> np.ndarray:
    """Bytes ``start:stop`` of every block as a C-contiguous ``(n_blocks, stop - start)`` array
    (column slices are strided; viewing them as wider ints needs a contiguous copy)."""
    return np.ascontiguousarray(blocks[:, start:stop])


def f16_field(blocks: np.ndarray, start: int) -> np.ndarray:
    """The little-endian f16 at byte ``start`` of every block, widened to f32, shape (n, 1)."""
    return field(blocks, start, start + 2).view("<f2").astype(np.float32)


def f32_field(blocks: np.ndarray, start: int) -> np.ndarray:
    """The little-endian f32 at byte ``start`` of every block, shape (n, 1)."""
    return field(blocks, start, start + 4).view("<f4").astype(np.float32)


def f16_bytes(values: np.ndarray) -> np.ndarray:
    """Round f32 values of shape (n, 1) to f16 (nearest even, like GGML_FP32_TO_FP16) and
    return their little-endian bytes, shape (n, 2)."""
    return np.ascontiguousarray(values, dtype=np.float32).astype("<f2").view(np.uint8)


def split_nibbles(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Low and high 4-bit halves of every byte."""
    return packed & np.uint8(0x0F), packed >> np.uint8(4)


def round_half_away(values: np.ndarray) -> np.ndarray:
    """C's ``roundf``: halves go away from zero. ``floor(|v| + 0.5)`` would be wrong for the
    f32 just below 0.5 (the sum rounds up to 1.0), so the fraction is compared instead."""
    magnitude = np.abs(values)
    whole = np.floor(magnitude)
    rounded = whole + (magnitude - whole >= np.float32(0.5))
    return np.copysign(rounded, values)


def nearest_int(values: np.ndarray) -> np.ndarray:
    """ggml's ``nearest_int``: round to nearest with ties to even (it adds 1.5 * 2**23 in f32,
    which leaves the rounding to the FPU's default mode). ``np.rint`` does the same."""
    return np.rint(values)


def reciprocal_or_zero(values: np.ndarray) -> np.ndarray:
    """``d ? 1/d : 0`` in f32, without a divide-by-zero warning."""
    values = np.asarray(values, dtype=np.float32)
    safe = np.where(values == 0, np.float32(1), values)
    return np.where(values == 0, np.float32(0), np.float32(1) / safe).astype(np.float32)


def signed_absmax(blocks: np.ndarray) -> np.ndarray:
    """Per row, the value with the largest magnitude, keeping its sign (first one on ties, as the
    reference loops ``if (amax < fabsf(v))`` do). Shape (n, 1)."""
    index = np.abs(blocks).argmax(axis=-1)[..., None]
    return np.take_along_axis(blocks, index, axis=-1)


def sequential_sum(values: np.ndarray) -> np.ndarray:
    """Row sums accumulated left to right in f32, shape (n, 1).

    ggml's reference quantizers add in a plain C loop; numpy's ``sum`` adds pairwise, which
    rounds differently in the last bit, and the quantizers compare such sums to pick a scale.
    A running sum (``cumsum``) reproduces the C order, so the chosen levels match llama.cpp's."""
    return np.cumsum(values, axis=1, dtype=np.float32)[:, -1:]
