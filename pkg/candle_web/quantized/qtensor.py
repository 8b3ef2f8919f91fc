"""QTensor: raw GGML blocks plus a shape, and the numpy reference (de)quantization entry points.

Shapes are in candle/numpy order: the last dim is the row (GGML's ``ne[0]``), and blocks never
straddle rows, so the last dim must be a multiple of the type's block size.
"""

from __future__ import annotations

import math

import numpy as np

from ..core.dtype import bf16_bits_to_f32, f32_to_bf16_bits
from ..core.errors import DTypeMismatch, FormatError, ShapeError, ShapeMismatch, UnsupportedError
from . import blocks_k, blocks_legacy
from .ggml_dtype import DEQUANTIZABLE, QUANTIZABLE, GgmlDType

# Plain (one element per block) types: the little-endian numpy dtype of their bytes.
_PLAIN_NUMPY = {
    GgmlDType.F32: np.dtype("<f4"),
    GgmlDType.F16: np.dtype("<f2"),
    GgmlDType.F64: np.dtype("<f8"),
    GgmlDType.I8: np.dtype("i1"),
    GgmlDType.I16: np.dtype("<i2"),
    GgmlDType.I32: np.dtype("<i4"),
    GgmlDType.I64: np.dtype("<i8"),
}

_BLOCK_DEQUANTIZERS = {
    GgmlDType.Q4_0: blocks_legacy.dequantize_q4_0,
    GgmlDType.Q4_1: blocks_legacy.dequantize_q4_1,
    GgmlDType.Q5_0: blocks_legacy.dequantize_q5_0,
    GgmlDType.Q5_1: blocks_legacy.dequantize_q5_1,
    GgmlDType.Q8_0: blocks_legacy.dequantize_q8_0,
    GgmlDType.Q8_1: blocks_legacy.dequantize_q8_1,
    GgmlDType.Q2_K: blocks_k.dequantize_q2_k,
    GgmlDType.Q3_K: blocks_k.dequantize_q3_k,
    GgmlDType.Q4_K: blocks_k.dequantize_q4_k,
    GgmlDType.Q5_K: blocks_k.dequantize_q5_k,
    GgmlDType.Q6_K: blocks_k.dequantize_q6_k,
    GgmlDType.Q8_K: blocks_k.dequantize_q8_k,
}

_BLOCK_QUANTIZERS = {
    GgmlDType.Q4_0: blocks_legacy.quantize_q4_0,
    GgmlDType.Q4_1: blocks_legacy.quantize_q4_1,
    GgmlDType.Q5_0: blocks_legacy.quantize_q5_0,
    GgmlDType.Q5_1: blocks_legacy.quantize_q5_1,
    GgmlDType.Q8_0: blocks_legacy.quantize_q8_0,
    GgmlDType.Q4_K: blocks_k.quantize_q4_k,
    GgmlDType.Q6_K: blocks_k.quantize_q6_k,
    GgmlDType.Q8_K: blocks_k.quantize_q8_k,
}

# Dequantize at most this many blocks per numpy pass: bounds the temporaries (a few times the
# f32 output of a chunk) when a whole embedding table is expanded.
_BLOCKS_PER_CHUNK = 1 << 16


def _as_byte_array(raw) -> np.ndarray:
    """bytes / bytearray / memoryview / mmap / uint8 array -> flat uint8 array, without copying."""
    if isinstance(raw, np.ndarray):
        if raw.dtype != np.uint8:
            raw = np.ascontiguousarray(raw).view(np.uint8)
        return raw.reshape(-1)
    return np.frombuffer(raw, dtype=np.uint8)


def dequantize(dtype, raw, n_elements: int) -> np.ndarray:
    """The first ``n_elements`` values encoded in ``raw`` (GGML blocks of ``dtype``) as a flat
    float32 array. ``raw`` must hold exactly the bytes of those elements."""
    dtype = GgmlDType.parse(dtype)
    data = _as_byte_array(raw)
    expected = dtype.n_bytes(n_elements, context=f"{dtype.name} dequantize")
    if data.size != expected:
        raise FormatError(f"{dtype.name}: {n_elements} elements take {expected} bytes, "
                          f"got {data.size}")
    if dtype not in DEQUANTIZABLE:
        raise UnsupportedError(f"dequantizing GGML type {dtype.name} is not implemented; "
                               f"supported: {sorted(t.name for t in DEQUANTIZABLE)}")
    if dtype is GgmlDType.BF16:
        return bf16_bits_to_f32(data.view("<u2"))
    if dtype in _PLAIN_NUMPY:
        return data.view(_PLAIN_NUMPY[dtype]).astype(np.float32)
    blocks = data.reshape(-1, dtype.type_size)
    decode = _BLOCK_DEQUANTIZERS[dtype]
    # inf/NaN scales (corrupt or adversarial files) propagate as in ggml, without warnings.
    with np.errstate(invalid="ignore", over="ignore"):
        if blocks.shape[0] <= _BLOCKS_PER_CHUNK:
            return decode(blocks).reshape(-1)
        out = np.empty((blocks.shape[0], dtype.block_size), dtype=np.float32)
        for start in range(0, blocks.shape[0], _BLOCKS_PER_CHUNK):
            stop = start + _BLOCKS_PER_CHUNK
            out[start:stop] = decode(blocks[start:stop])
    return out.reshape(-1)


def quantize(dtype, values) -> np.ndarray:
    """Encode float values (any shape; the last dim a multiple of the block size) as GGML blocks
    of ``dtype``; returns the flat uint8 bytes."""
    dtype = GgmlDType.parse(dtype)
    if dtype not in QUANTIZABLE:
        raise UnsupportedError(f"quantizing to GGML type {dtype.name} is not implemented; "
                               f"supported: {sorted(t.name for t in QUANTIZABLE)}")
    values = np.asarray(values)
    if values.dtype.kind != "f":
        raise DTypeMismatch(f"quantize to {dtype.name} expects floats, got {values.dtype}")
    values = np.ascontiguousarray(values, dtype=np.float32)
    row = values.shape[-1] if values.ndim else 1
    dtype.row_bytes(row, context=f"the array of shape {values.shape}")
    if dtype is GgmlDType.F32:
        return values.astype("<f4").reshape(-1).view(np.uint8)
    if dtype is GgmlDType.F16:
        return values.astype("<f2").reshape(-1).view(np.uint8)
    if dtype is GgmlDType.BF16:
        return f32_to_bf16_bits(values).astype("<u2").reshape(-1).view(np.uint8)
    if not np.isfinite(values).all():
        raise UnsupportedError(f"quantize to {dtype.name}: the input holds NaN or inf, which "
                               "GGML block scales cannot represent")
    blocks = values.reshape(-1, dtype.block_size)
    return _BLOCK_QUANTIZERS[dtype](blocks).astype(np.uint8, copy=False).reshape(-1)


class QTensor:
    """A tensor stored as GGML blocks: ``dtype`` (GgmlDType), ``shape`` (candle order) and the raw
    bytes (a uint8 numpy array; a zero-copy view when built from an mmap or a buffer)."""

    __slots__ = ("dtype", "shape", "data")

    def __init__(self, dtype, shape, data):
        self.dtype = GgmlDType.parse(dtype)
        self.shape = tuple(int(d) for d in shape)
        if any(d < 0 for d in self.shape):
            raise ShapeError(f"QTensor: negative dim in shape {self.shape}")
        row = self.shape[-1] if self.shape else 1
        n_rows = math.prod(self.shape[:-1]) if self.shape else 1
        expected = n_rows * self.dtype.row_bytes(row, context=f"QTensor of shape {self.shape}")
        self.data = _as_byte_array(data)
        if self.data.size != expected:
            raise FormatError(f"QTensor {self.dtype.name} {self.shape}: expected {expected} bytes, "
                              f"got {self.data.size}")

    @classmethod
    def from_float(cls, values, dtype) -> "QTensor":
        """Quantize a float array to ``dtype`` (shape kept)."""
        values = np.asarray(values)
        return cls(dtype, values.shape, quantize(dtype, values))

    @property
    def nbytes(self) -> int:
        return int(self.data.size)

    @property
    def n_elements(self) -> int:
        return math.prod(self.shape)

    def dequantize(self) -> np.ndarray:
        """The values as a float32 array of ``shape``."""
        return dequantize(self.dtype, self.data, self.n_elements).reshape(self.shape)

    def dequantize_rows(self, start: int, stop: int) -> np.ndarray:
        """Rows ``start:stop`` of the tensor seen as a matrix ``[prod(shape[:-1]), shape[-1]]``,
        as float32 (only those rows are decoded)."""
        row = self.shape[-1]
        row_bytes = self.dtype.row_bytes(row)
        chunk = self.data[start * row_bytes:stop * row_bytes]
        return dequantize(self.dtype, chunk, (stop - start) * row).reshape(stop - start, row)

    def __repr__(self) -> str:
        return f"QTensor({self.dtype.name}, shape={self.shape}, nbytes={self.nbytes})"


# Rows of the weight decoded per step of qmatmul_ref: keeps the f32 copy of a big matrix
# (e.g. a 49152 x 576 embedding used as the LM head) from being materialised all at once.
_QMATMUL_ROWS_PER_STEP = 4096


def qmatmul_ref(x: np.ndarray, weight: QTensor) -> np.ndarray:
    """Reference quantized matmul: ``x [..., k] @ weight[n, k].T -> [..., n]`` in float32.

    Decodes the weight a band of rows at a time and multiplies with numpy; the result equals
    ``x @ weight.dequantize().T`` (same f32 products) and is what the fast kernels are checked
    against."""
    if len(weight.shape) != 2:
        raise ShapeError(f"qmatmul_ref: the weight must be 2-D [n, k], got shape {weight.shape}")
    n, k = weight.shape
    x = np.asarray(x, dtype=np.float32)
    if x.ndim == 0 or x.shape[-1] != k:
        raise ShapeMismatch(f"qmatmul_ref: x of shape {x.shape} cannot multiply a weight of shape "
                            f"{weight.shape} (last dims must both be {k})")
    flat = x.reshape(-1, k)
    out = np.empty((flat.shape[0], n), dtype=np.float32)
    for start in range(0, n, _QMATMUL_ROWS_PER_STEP):
        stop = min(n, start + _QMATMUL_ROWS_PER_STEP)
        out[:, start:stop] = flat @ weight.dequantize_rows(start, stop).T
    return out.reshape(*x.shape[:-1], n)
