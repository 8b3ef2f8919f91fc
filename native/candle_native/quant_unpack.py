"""GGML blocks -> the flat layout the native qmatmul kernels read (numpy only, done once).

Every supported type becomes, per weight row, the integer levels as int8 in element order plus
one f32 scale (and, for the types with a minimum, one f32 offset) per group of ``2**shift``
elements, with value = scale * level + offset. The scale products are formed exactly as the
reference dequantizers form them (``d * sub_scale`` in f32), so ``scale * level + offset``
reproduces ``QTensor.dequantize()`` bit for bit; the kernels then only reorder the sums.

Why int8 and not the packed nibbles: a flat loop over int8 levels times f32 activations
vectorises cleanly (DESIGN.md section 3 measured a Q8_0 matvec of this shape at 2.4-3.6x BLAS's
f32 matvec, and a per-block nibble loop 3-4x slower), at the price of one byte per weight.

The unpacked form is cached per QTensor (keyed by its byte buffer, dropped when that buffer is
freed), so a model pays the unpacking once, at its first forward pass.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import numpy as np

from candle_web.core.errors import ShapeError, UnsupportedError
from candle_web.quantized import GgmlDType
from candle_web.quantized.blocks_k import unpack_k4_scales

LEGACY_GROUP_SHIFT = 5  # 32-element blocks and K-quant sub-blocks of 32
SIXTEEN_GROUP_SHIFT = 4  # Q2_K, Q3_K and Q6_K scale 16 elements at a time
Q8K_GROUP_SHIFT = 8  # Q8_K has one scale per 256-element super-block


@dataclass(frozen=True)
class UnpackedWeight:
    """A quantized [n, k] weight as int8 levels with per-group f32 scales (and offsets)."""

    dtype: GgmlDType
    levels: np.ndarray  # int8 [n, k]
    scales: np.ndarray  # f32 [n, k >> group_shift]
    offsets: np.ndarray | None  # f32 [n, k >> group_shift], or None when every offset is 0
    group_shift: int

    @property
    def shape(self) -> tuple[int, int]:
        return self.levels.shape

    def dequantize(self) -> np.ndarray:
        """The f32 weight (for tests and for the dequantize-then-BLAS path)."""
        n, k = self.levels.shape
        groups = self.levels.reshape(n, -1, 1 << self.group_shift).astype(np.float32)
        with np.errstate(invalid="ignore", over="ignore"):
            values = self.scales[:, :, None] * groups
            if self.offsets is not None:
                values = values + self.offsets[:, :, None]
        return values.reshape(n, k)


# ------------------------------------------------------------------------------ bit helpers

def _f16(blocks: np.ndarray, start: int) -> np.ndarray:
    """The little-endian f16 at byte ``start`` of every block as f32, shape (n_blocks, 1)."""
    return np.ascontiguousarray(blocks[:, start:start + 2]).view("<f2").astype(np.float32)


def _nibbles_low_then_high(packed: np.ndarray) -> np.ndarray:
    """(n, 16) bytes -> (n, 32): the low nibbles are elements 0..15, the high ones 16..31."""
    return np.concatenate([packed & 0x0F, packed >> 4], axis=1)


def _bits_little(packed: np.ndarray) -> np.ndarray:
    """(n, 4) bytes of a little-endian u32 -> (n, 32) bits, bit j in column j."""
    return np.unpackbits(np.ascontiguousarray(packed), axis=1, bitorder="little")


def _two_bit_planes(qs: np.ndarray) -> np.ndarray:
    """(n, 64) bytes -> (n, 256): byte 32h + l holds elements 128h + 32j + l at shift 2j."""
    n = qs.shape[0]
    shifts = np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)
    return ((qs.reshape(n, 2, 1, 32) >> shifts) & 3).reshape(n, 256)


def _k4_nibbles(qs: np.ndarray) -> np.ndarray:
    """(n, 128) bytes -> (n, 256): byte l of 32-byte chunk c holds elements 64c + l (low
    nibble) and 64c + 32 + l (high nibble)."""
    n = qs.shape[0]
    shifts = np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
    return ((qs.reshape(n, 4, 1, 32) >> shifts) & 0x0F).reshape(n, 256)


# --------------------------------------------------------------------- per-type unpackers
# Each takes (n_blocks, type_size) uint8 blocks and returns (levels (n_blocks, block) int8,
# scales (n_blocks, groups) f32, offsets or None, group_shift).

def _unpack_q4_0(b):
    levels = _nibbles_low_then_high(b[:, 2:18]).astype(np.int8) - 8
    return levels, _f16(b, 0), None, LEGACY_GROUP_SHIFT


def _unpack_q4_1(b):
    levels = _nibbles_low_then_high(b[:, 4:20]).astype(np.int8)
    return levels, _f16(b, 0), _f16(b, 2), LEGACY_GROUP_SHIFT


def _unpack_q5_0(b):
    levels = (_nibbles_low_then_high(b[:, 6:22]) | (_bits_little(b[:, 2:6]) << 4)).astype(np.int8)
    return (levels - 16, *_q5_0_terms(b))


def _q5_0_terms(b):
    return _f16(b, 0), None, LEGACY_GROUP_SHIFT


def _unpack_q5_1(b):
    levels = _nibbles_low_then_high(b[:, 8:24]) | (_bits_little(b[:, 4:8]) << 4)
    return levels.astype(np.int8), _f16(b, 0), _f16(b, 2), LEGACY_GROUP_SHIFT


def _unpack_q8_0(b):
    return (np.ascontiguousarray(b[:, 2:34]).view(np.int8), *_q8_0_terms(b))


def _q8_0_terms(b):
    return _f16(b, 0), None, LEGACY_GROUP_SHIFT


def _unpack_q8_1(b):
    # Bytes 2..3 cache d * sum(q) for dot products; the values need only d.
    return np.ascontiguousarray(b[:, 4:36]).view(np.int8), _f16(b, 0), None, LEGACY_GROUP_SHIFT


def _unpack_q2_k(b):
    sub = b[:, 0:16]
    scales = _f16(b, 80) * (sub & 0x0F).astype(np.float32)
    offsets = -(_f16(b, 82) * (sub >> 4).astype(np.float32))
    levels = _two_bit_planes(np.ascontiguousarray(b[:, 16:80])).astype(np.int8)
    return levels, scales, offsets, SIXTEEN_GROUP_SHIFT


def _unpack_q3_k(b):
    n = b.shape[0]
    packed = b[:, 96:108]
    low_bytes = packed[:, 0:8]
    low = np.concatenate([low_bytes & 0x0F, low_bytes >> 4], axis=1)
    shifts = np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 4, 1)
    high = (packed[:, 8:12].reshape(n, 1, 4) >> shifts) & 3
    six_bit = (low | (high.reshape(n, 16) << 4)).astype(np.int8) - 32
    scales = _f16(b, 108) * six_bit.astype(np.float32)
    low_bits = _two_bit_planes(np.ascontiguousarray(b[:, 32:96])).astype(np.int8)
    # hmask bit p of byte l belongs to element 32p + l; a clear bit means "subtract 4".
    hmask = b[:, 0:32].reshape(n, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)
    clear = ((hmask & 1) ^ 1).reshape(n, 256).astype(np.int8)
    return low_bits - clear * 4, scales, None, SIXTEEN_GROUP_SHIFT


def _k4_scales_offsets(b):
    sub_scales, sub_mins = unpack_k4_scales(np.ascontiguousarray(b[:, 4:16]))
    scales = _f16(b, 0) * sub_scales.astype(np.float32)
    offsets = -(_f16(b, 2) * sub_mins.astype(np.float32))
    return scales, offsets


def _unpack_q4_k(b):
    levels = _k4_nibbles(np.ascontiguousarray(b[:, 16:144])).astype(np.int8)
    return (levels, *_q4_k_terms(b))


def _q4_k_terms(b):
    return (*_k4_scales_offsets(b), LEGACY_GROUP_SHIFT)


def _unpack_q5_k(b):
    n = b.shape[0]
    scales, offsets = _k4_scales_offsets(b)
    low = _k4_nibbles(np.ascontiguousarray(b[:, 48:176]))
    # Bit s of qh[l] is the 5th bit of element l of 32-element sub-block s.
    qh = b[:, 16:48].reshape(n, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)
    levels = low | ((qh & 1).reshape(n, 256) << 4)
    return levels.astype(np.int8), scales, offsets, LEGACY_GROUP_SHIFT


def _unpack_q6_k(b):
    n = b.shape[0]
    # In each 128-element half h, element 32j + l takes its low nibble from
    # ql[64h + l + 32 (j & 1)] at shift 4 (j >> 1) and its top 2 bits from qh[32h + l] at 2j.
    ql = b[:, 0:128].reshape(n, 2, 1, 2, 32) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1, 1)
    low = (ql & 0x0F).reshape(n, 2, 4, 32)
    qh = b[:, 128:192].reshape(n, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)
    levels = (low | ((qh & 3) << 4)).astype(np.int8) - 32
    return (levels.reshape(n, 256), *_q6_k_terms(b))


def _q6_k_terms(b):
    scales = _f16(b, 208) * np.ascontiguousarray(b[:, 192:208]).view(np.int8).astype(np.float32)
    return scales, None, SIXTEEN_GROUP_SHIFT


def _unpack_q8_k(b):
    d = np.ascontiguousarray(b[:, 0:4]).view("<f4").astype(np.float32)
    return np.ascontiguousarray(b[:, 4:260]).view(np.int8), d, None, Q8K_GROUP_SHIFT


_UNPACKERS = {
    GgmlDType.Q4_0: _unpack_q4_0,
    GgmlDType.Q4_1: _unpack_q4_1,
    GgmlDType.Q5_0: _unpack_q5_0,
    GgmlDType.Q5_1: _unpack_q5_1,
    GgmlDType.Q8_0: _unpack_q8_0,
    GgmlDType.Q8_1: _unpack_q8_1,
    GgmlDType.Q2_K: _unpack_q2_k,
    GgmlDType.Q3_K: _unpack_q3_k,
    GgmlDType.Q4_K: _unpack_q4_k,
    GgmlDType.Q5_K: _unpack_q5_k,
    GgmlDType.Q6_K: _unpack_q6_k,
    GgmlDType.Q8_K: _unpack_q8_k,
}

UNPACKABLE = frozenset(_UNPACKERS)

# Blocks unpacked per numpy pass: bounds the temporaries when a large table is unpacked.
_BLOCKS_PER_PASS = 1 << 15


def _numba_levels(name: str):
    """A writer of the levels by numba/kernels/unpack_levels.py's kernel `name` (the same
    levels as the numpy unpacker, without its temporaries); False without numba."""
    def write(blocks, levels) -> bool:
        try:
            from .numba.kernels import unpack_levels  # noqa: PLC0415 (numba is optional here)
        except ImportError:
            return False
        getattr(unpack_levels, name)(blocks, levels)
        return True
    return write


def _q8_0_levels(blocks, levels) -> bool:
    """Q8_0's levels are its bytes 2..33: one strided copy (the numpy unpacker makes two)."""
    levels[...] = blocks[:, 2:34].view(np.int8)
    return True


# Types whose levels are written in place, in one pass over the whole weight, with their
# scale and offset functions (the numpy unpackers' own).
_IN_PLACE = {GgmlDType.Q4_K: (_numba_levels("q4_k_levels"), _q4_k_terms),
             GgmlDType.Q5_0: (_numba_levels("q5_0_levels"), _q5_0_terms),
             GgmlDType.Q6_K: (_numba_levels("q6_k_levels"), _q6_k_terms),
             GgmlDType.Q8_0: (_q8_0_levels, _q8_0_terms)}


def _unpack_in_place(kind, blocks, levels):
    """(scales, offsets, shift) with `levels` written in place; None where `kind` has no
    in-place writer here (another type, no numba, an empty weight)."""
    if kind not in _IN_PLACE or not blocks.shape[0]:
        return None
    write_levels, terms = _IN_PLACE[kind]
    if not write_levels(blocks, levels):
        return None
    with np.errstate(invalid="ignore", over="ignore"):
        return terms(blocks)


def _unpack_in_passes(kind, blocks, levels):
    """(scales, offsets, shift) with `levels` written by the numpy unpacker, _BLOCKS_PER_PASS
    blocks at a time (bounding its temporaries)."""
    scales = offsets = None
    for start in range(0, blocks.shape[0], _BLOCKS_PER_PASS):
        stop = min(blocks.shape[0], start + _BLOCKS_PER_PASS)
        # inf/NaN scales (corrupt files) propagate as in the reference, without warnings.
        with np.errstate(invalid="ignore", over="ignore"):
            part_levels, part_scales, part_offsets, shift = _UNPACKERS[kind](blocks[start:stop])
        if scales is None:
            scales = np.empty((blocks.shape[0], part_scales.shape[1]), dtype=np.float32)
            if part_offsets is not None:
                offsets = np.empty_like(scales)
        levels[start:stop] = part_levels
        scales[start:stop] = part_scales
        if offsets is not None:
            offsets[start:stop] = part_offsets
    if scales is None:  # an empty weight
        empty_block = np.zeros((1, kind.type_size), np.uint8)
        _, part_scales, part_offsets, shift = _UNPACKERS[kind](empty_block)
        scales = np.zeros((0, part_scales.shape[1]), np.float32)
        offsets = None if part_offsets is None else scales.copy()
    return scales, offsets, shift


def unpack(qtensor) -> UnpackedWeight:
    """Unpack a 2-D QTensor [n, k] of a block-quantized type (no caching; see `unpacked`)."""
    kind = qtensor.dtype
    if kind not in _UNPACKERS:
        raise UnsupportedError(f"native qmatmul: GGML type {kind.name} has no unpacker; "
                               f"supported: {sorted(t.name for t in _UNPACKERS)}")
    if len(qtensor.shape) != 2:
        raise ShapeError(f"native qmatmul: the weight must be 2-D [n, k], got {qtensor.shape}")
    n, k = qtensor.shape
    blocks = qtensor.data.reshape(-1, kind.type_size)
    per_row = k // kind.block_size
    levels = np.empty((n * per_row, kind.block_size), dtype=np.int8)
    scales, offsets, shift = (_unpack_in_place(kind, blocks, levels)
                              or _unpack_in_passes(kind, blocks, levels))
    groups = k >> shift
    return UnpackedWeight(kind, levels.reshape(n, k), scales.reshape(n, groups),
                          None if offsets is None else offsets.reshape(n, groups), shift)


class PerWeightCache:
    """Values derived from a QTensor, computed once: keyed by the identity of its byte buffer
    (QTensor has __slots__ and no weakref slot, but numpy arrays take weak references) and
    dropped when that buffer is garbage collected."""

    def __init__(self):
        self._entries = {}

    def get(self, qtensor, build):
        key = id(qtensor.data)
        entry = self._entries.get(key)
        if entry is not None and entry[0] == (qtensor.dtype, qtensor.shape):
            return entry[1]
        value = build(qtensor)
        if entry is None:
            weakref.finalize(qtensor.data, self._entries.pop, key, None)
        self._entries[key] = ((qtensor.dtype, qtensor.shape), value)
        return value

    def __len__(self):
        return len(self._entries)


_UNPACKED = PerWeightCache()


def unpacked(qtensor) -> UnpackedWeight:
    """The cached unpacked form of `qtensor` (unpacked at the first call only)."""
    return _UNPACKED.get(qtensor, unpack)


class _KernelWeight:
    """The unpacked weight in the form the numba kernels want (scales per 32 or 16 elements):
    the fused decode steps and the backend's quantized matmul share it."""

    __slots__ = ("levels", "scales", "offsets", "use_offsets", "group")

    def __init__(self, qtensor):
        unpacked = unpack(qtensor)
        scales, shift = unpacked.scales, unpacked.group_shift
        offsets = unpacked.offsets
        if shift > LEGACY_GROUP_SHIFT:
            # Wider groups (Q8_K) repeat their scale per 32 elements: same products, one kernel.
            repeat = 1 << (shift - LEGACY_GROUP_SHIFT)
            scales = np.repeat(scales, repeat, axis=1)
            offsets = None if offsets is None else np.repeat(offsets, repeat, axis=1)
            shift = LEGACY_GROUP_SHIFT
        self.levels = unpacked.levels
        self.scales = np.ascontiguousarray(scales)
        self.use_offsets = offsets is not None
        # A 1x1 stand-in keeps one compiled signature for both cases.
        self.offsets = (np.ascontiguousarray(offsets) if self.use_offsets
                        else np.zeros((1, 1), np.float32))
        self.group = 1 << shift


_KERNEL_WEIGHTS = PerWeightCache()


def kernel_weight(qtensor) -> _KernelWeight:
    """The unpacked weight for `qtensor`, built at its first use and cached with it."""
    return _KERNEL_WEIGHTS.get(qtensor, _KernelWeight)
