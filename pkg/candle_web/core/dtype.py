"""Data types.

numpy has no bfloat16, so bf16 tensors keep their raw bits in a ``uint16`` array and are
widened to f32 by a 16-bit shift (exact). Half-precision weights are stored as such and
computed in f32 by the layers that use them.
"""

from __future__ import annotations

import numpy as np

from .errors import DTypeMismatch


class DType:
    """One of candle's dtypes: ``u8 u32 i64 f16 bf16 f32 f64``."""

    __slots__ = ("name", "np_storage", "size_in_bytes", "is_float", "is_int")

    def __init__(self, name: str, np_storage, is_float: bool):
        self.name = name
        self.np_storage = np.dtype(np_storage)  # how the elements are held in numpy
        self.size_in_bytes = self.np_storage.itemsize
        self.is_float = is_float
        self.is_int = not is_float

    def __repr__(self) -> str:
        return self.name

    def __reduce__(self):
        return (DType.parse, (self.name,))

    @staticmethod
    def parse(name) -> "DType":
        """Accept a DType, a candle name ('f32'), a numpy dtype or a torch-style name ('float32')."""
        if isinstance(name, DType):
            return name
        if isinstance(name, str):
            key = name.lower()
            if key in _BY_NAME:
                return _BY_NAME[key]
            if key in _ALIASES:
                return _BY_NAME[_ALIASES[key]]
            raise DTypeMismatch(f"unknown dtype {name!r}; expected one of {sorted(_BY_NAME)}")
        try:
            npd = np.dtype(name)
        except TypeError:
            raise DTypeMismatch(f"cannot interpret {name!r} as a dtype") from None
        return from_numpy_dtype(npd)


u8 = DType("u8", np.uint8, False)
u32 = DType("u32", np.uint32, False)
i64 = DType("i64", np.int64, False)
f16 = DType("f16", np.float16, True)
bf16 = DType("bf16", np.uint16, True)  # raw bits, see module docstring
f32 = DType("f32", np.float32, True)
f64 = DType("f64", np.float64, True)

ALL = (u8, u32, i64, f16, bf16, f32, f64)
_BY_NAME = {d.name: d for d in ALL}
_ALIASES = {
    "uint8": "u8", "uint32": "u32", "int64": "i64", "float16": "f16", "half": "f16",
    "bfloat16": "bf16", "float32": "f32", "float": "f32", "float64": "f64", "double": "f64",
}
_FROM_NUMPY = {np.dtype(np.uint8): u8, np.dtype(np.uint32): u32, np.dtype(np.int64): i64,
               np.dtype(np.float16): f16, np.dtype(np.float32): f32, np.dtype(np.float64): f64}


def from_numpy_dtype(npd) -> DType:
    """The DType a numpy array naturally maps to (uint16 is *not* taken as bf16 implicitly)."""
    npd = np.dtype(npd)
    if npd in _FROM_NUMPY:
        return _FROM_NUMPY[npd]
    if npd == np.bool_:
        return u8
    raise DTypeMismatch(
        f"numpy dtype {npd} has no candle dtype; convert to one of u8, u32, i64, f16, f32, f64 "
        "(or pass uint16 bits with dtype=bf16)")


def bf16_bits_to_f32(bits: np.ndarray) -> np.ndarray:
    """Widen bf16 bits (uint16) to float32 exactly."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """Round float32 to bf16 bits with round-to-nearest-even (as PyTorch does); NaN stays NaN."""
    # np.asarray, not np.ascontiguousarray (which makes rank 0 into shape (1,)); a view to a
    # dtype of the same size works on any strides.
    x = np.asarray(x, dtype=np.float32)
    u = x.view(np.uint32)
    rounding_bias = ((u >> 16) & 1) + np.uint32(0x7FFF)
    rounded = ((u + rounding_bias) >> 16).astype(np.uint16)
    nan = np.isnan(x)
    if nan.any():
        rounded = np.where(nan, ((u >> 16) | 0x40).astype(np.uint16), rounded)
    return rounded


def float_to_int_saturating(xp, arr, np_dtype):
    """Float -> integer cast with Candle's (Rust `as`) semantics: truncate toward zero,
    saturate at the integer range, NaN -> 0.

    A plain numpy `astype` leaves out-of-range values undefined (C behaviour: x86 wraps -1.0
    to 255 for u8, other targets such as wasm may differ), which would break the promise of
    identical results in the browser and natively. `xp` is numpy or cupy.
    """
    info = xp.iinfo(np_dtype)
    with np.errstate(invalid="ignore", over="ignore"):
        out = arr.astype(np_dtype)
        # Both bounds are compared in floating point: info.min is 0 or -2**(bits-1) and
        # info.max + 1 is 2**bits or 2**(bits-1), all exactly representable.
        below = arr <= float(info.min)
        above = arr >= float(info.max) + 1.0
        nan = arr != arr
    out = xp.where(below, xp.asarray(info.min, dtype=np_dtype), out)
    out = xp.where(above, xp.asarray(info.max, dtype=np_dtype), out)
    return xp.where(nan, xp.asarray(0, dtype=np_dtype), out)
