"""safetensors: a lazy, zero-copy reader and a writer, interoperable with the `safetensors` library.

File layout: an 8-byte little-endian u64 ``N``, ``N`` bytes of UTF-8 JSON (the header), then the
data buffer. The header maps each tensor name to ``{"dtype", "shape", "data_offsets": [begin,
end]}`` (offsets relative to the data buffer) and may hold ``"__metadata__"``: a str -> str map.

Validation mirrors the reference (Rust) library and happens before any tensor is touched: the
header length is capped at 100 MB and must fit in the buffer, the JSON must be an object, and the
tensors' byte ranges, sorted by offset, must tile the data buffer exactly (no gap, no overlap, no
trailing bytes; zero-sized tensors may share an offset). We are stricter in two places: duplicate
JSON keys are refused (the reference silently keeps one), and a shape must be representable by
numpy (product of its non-zero dims times the item size below 2**63).

Reading gives numpy arrays *as stored* (``get_numpy``: BF16 and F8_* as their raw uint16/uint8
bits) or candle Tensors (``get``). Candle has u8, u32, i64, f16, bf16, f32, f64; other stored
dtypes are converted losslessly or refused:

    BOOL -> u8 (0/1)            I8, I16, I32 -> i64          U16 -> u32
    U64 -> i64 when every value is below 2**63, else UnsupportedError
    F8_E4M3, F8_E5M2, F8_E4M3FNUZ, F8_E5M2FNUZ -> f16 (every 8-bit float is exact in f16)
    F8_E8M0 -> f32 (powers of two from 2**-127 to 2**127 are exact in f32)
    C64, F4, F6_E2M3, F6_E3M2 -> UnsupportedError naming the tensor

Writing (``serialize`` / ``save``) produces the same bytes as the reference library: tensors
ordered by dtype (widest alignment first, the reference's dtype order) then by name, compact JSON
with ``__metadata__`` first, and the header padded with spaces to a multiple of 8 bytes so that
every tensor starts 8-byte aligned in the file.
"""

from __future__ import annotations

import json
import os
import struct
import sys
from dataclasses import dataclass

import numpy as np

from ..core import dtype as cdt
from ..core.errors import DTypeMismatch, FormatError, ModelNotFound, UnsupportedError
from .bounds import MAX_ARRAY_BYTES, MAX_NUMPY_DIMS, nonzero_bytes

HEADER_LENGTH_BYTES = 8
MAX_HEADER_BYTES = 100_000_000  # the reference library's cap on the JSON header
HEADER_ALIGNMENT = 8  # the reference pads the header so the data starts 8-byte aligned
METADATA_KEY = "__metadata__"
# numpy cannot describe an array whose nonzero dims times the item size exceed this.


@dataclass(frozen=True)
class _StoredDType:
    """One safetensors dtype: its name, bits per element and how numpy holds the raw values."""

    name: str
    bits: int
    storage: np.dtype | None  # None: no numpy representation (sub-byte floats)


def _stored(name: str, bits: int, storage) -> _StoredDType:
    return _StoredDType(name, bits, None if storage is None else np.dtype(storage))


# In the reference library's declaration order: the writer sorts by it (largest first).
_STORED_DTYPES = (
    _stored("BOOL", 8, np.bool_),
    _stored("F4", 4, None),
    _stored("F6_E2M3", 6, None),
    _stored("F6_E3M2", 6, None),
    _stored("U8", 8, np.uint8),
    _stored("I8", 8, np.int8),
    _stored("F8_E5M2", 8, np.uint8),
    _stored("F8_E4M3", 8, np.uint8),
    _stored("F8_E8M0", 8, np.uint8),
    _stored("F8_E4M3FNUZ", 8, np.uint8),
    _stored("F8_E5M2FNUZ", 8, np.uint8),
    _stored("I16", 16, "<i2"),
    _stored("U16", 16, "<u2"),
    _stored("F16", 16, "<f2"),
    _stored("BF16", 16, "<u2"),
    _stored("I32", 32, "<i4"),
    _stored("U32", 32, "<u4"),
    _stored("F32", 32, "<f4"),
    _stored("C64", 64, "<c8"),
    _stored("F64", 64, "<f8"),
    _stored("I64", 64, "<i8"),
    _stored("U64", 64, "<u8"),
)
STORED_DTYPES = {d.name: d for d in _STORED_DTYPES}
_WRITE_ORDER = {d.name: rank for rank, d in enumerate(_STORED_DTYPES)}

_CANDLE_TO_STORED = {"u8": "U8", "u32": "U32", "i64": "I64", "f16": "F16", "bf16": "BF16",
                     "f32": "F32", "f64": "F64"}
_NUMPY_TO_STORED = {
    np.dtype(np.bool_): "BOOL", np.dtype(np.uint8): "U8", np.dtype(np.int8): "I8",
    np.dtype(np.int16): "I16", np.dtype(np.uint16): "U16", np.dtype(np.int32): "I32",
    np.dtype(np.uint32): "U32", np.dtype(np.int64): "I64", np.dtype(np.uint64): "U64",
    np.dtype(np.float16): "F16", np.dtype(np.float32): "F32", np.dtype(np.float64): "F64",
    np.dtype(np.complex64): "C64",
}
# Extension dtypes from the `ml_dtypes` package, recognised by name (never imported here).
_EXTENSION_NAME_TO_STORED = {
    "bfloat16": "BF16", "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2",
    "float8_e4m3fnuz": "F8_E4M3FNUZ", "float8_e5m2fnuz": "F8_E5M2FNUZ",
    "float8_e8m0fnu": "F8_E8M0",
}


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor lives: ``data_offsets`` are relative to the start of the data buffer."""

    name: str
    dtype: str  # the safetensors name, e.g. "BF16"
    shape: tuple
    data_offsets: tuple  # (begin, end)

    @property
    def nbytes(self) -> int:
        return self.data_offsets[1] - self.data_offsets[0]

    @property
    def numel(self) -> int:
        count = 1
        for dim in self.shape:
            count *= dim
        return count


@dataclass(frozen=True)
class RawTensor:
    """Stored bits with an explicit safetensors dtype, for writing dtypes numpy lacks:
    ``RawTensor(bits_uint16, "BF16")`` or ``RawTensor(bits_uint8, "F8_E4M3")``."""

    array: np.ndarray
    dtype: str


# --------------------------------------------------------------------------------------------
# Header parsing and validation


def _fail(source: str, message: str) -> FormatError:
    return FormatError(f"safetensors {source}: {message}")


def _refuse_duplicate_keys(pairs):
    obj = {}
    for key, value in pairs:
        if key in obj:
            raise ValueError(f"duplicate key {key!r} in a JSON object")
        obj[key] = value
    return obj


def _refuse_json_constant(name):
    raise ValueError(f"{name} is not valid JSON")


def _is_int(value) -> bool:
    # bool is an int subclass in Python, but `true` is not a valid size in the format.
    return isinstance(value, int) and not isinstance(value, bool)


def _element_bits(info_dtype: str) -> int:
    return STORED_DTYPES[info_dtype].bits


def _checked_byte_count(source: str, name: str, dtype_name: str, shape: list) -> int:
    """Bytes the shape needs; refuses shapes numpy cannot describe, stopping at the first
    overflow so a header full of huge dims cannot make us multiply giant integers."""
    bits = _element_bits(dtype_name)
    item_bytes = max(bits // 8, 1)
    nonzero = nonzero_bytes(shape, item_bytes, MAX_ARRAY_BYTES)
    if nonzero is None:
        raise _fail(source, f"tensor {name!r} field 'shape': {_short(shape)} overflows "
                            f"(more than 2**63 bytes of {dtype_name})")
    if 0 in shape:
        return 0
    total_bits = nonzero // item_bytes * bits
    if total_bits % 8:
        raise _fail(source, f"tensor {name!r} field 'shape': {_short(shape)} of {dtype_name} "
                            f"({bits} bits each) does not end on a byte boundary")
    return total_bits // 8


def _short(value, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "...]"


def _parse_tensor_entry(source: str, name: str, entry) -> TensorInfo:
    if not isinstance(entry, dict):
        raise _fail(source, f"tensor {name!r}: expected an object with dtype, shape and "
                            f"data_offsets, got {type(entry).__name__}")
    for field in ("dtype", "shape", "data_offsets"):
        if field not in entry:
            raise _fail(source, f"tensor {name!r}: missing field {field!r}")
    dtype_name = entry["dtype"]
    if not isinstance(dtype_name, str) or dtype_name not in STORED_DTYPES:
        raise _fail(source, f"tensor {name!r} field 'dtype': unknown dtype {_short(dtype_name)}; "
                            f"expected one of {sorted(STORED_DTYPES)}")
    shape = entry["shape"]
    if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
        raise _fail(source, f"tensor {name!r} field 'shape': expected a list of non-negative "
                            f"integers, got {_short(shape)}")
    offsets = entry["data_offsets"]
    if (not isinstance(offsets, list) or len(offsets) != 2
            or not all(_is_int(o) and o >= 0 for o in offsets)):
        raise _fail(source, f"tensor {name!r} field 'data_offsets': expected [begin, end] "
                            f"non-negative integers, got {_short(offsets)}")
    begin, end = offsets
    if begin > end:
        raise _fail(source, f"tensor {name!r} field 'data_offsets': begin {begin} > end {end}")
    expected = _checked_byte_count(source, name, dtype_name, shape)
    if end - begin != expected:
        raise _fail(source, f"tensor {name!r} field 'data_offsets': [{begin}, {end}] holds "
                            f"{end - begin} bytes but shape {_short(shape)} of {dtype_name} "
                            f"needs {expected}")
    return TensorInfo(name, dtype_name, tuple(shape), (begin, end))


def _parse_metadata(source: str, value) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _fail(source, f"field {METADATA_KEY!r}: expected an object of strings, got "
                            f"{type(value).__name__}")
    for key, item in value.items():
        if not isinstance(item, str):
            raise _fail(source, f"field {METADATA_KEY!r}: value of {key!r} must be a string, "
                                f"got {type(item).__name__}")
    return dict(value)


def _check_tiling(source: str, infos: dict, data_bytes: int) -> None:
    """The reference requires the byte ranges, in offset order, to cover the data exactly."""
    covered = 0
    previous = None
    for info in sorted(infos.values(), key=lambda i: i.data_offsets):
        begin, end = info.data_offsets
        if end > data_bytes:
            raise _fail(source, f"tensor {info.name!r} field 'data_offsets': end {end} is beyond "
                                f"the {data_bytes} bytes of data")
        if begin < covered:
            raise _fail(source, f"tensor {info.name!r} field 'data_offsets': [{begin}, {end}] "
                                f"overlaps tensor {previous!r} (which ends at {covered})")
        if begin > covered:
            raise _fail(source, f"tensor {info.name!r} field 'data_offsets': gap of "
                                f"{begin - covered} bytes before it (previous data ends at "
                                f"{covered}); tensors must cover the data contiguously")
        covered = end
        previous = info.name
    if covered != data_bytes:
        raise _fail(source, f"{data_bytes - covered} trailing bytes after the last tensor "
                            f"(data is {data_bytes} bytes, tensors cover {covered})")


def parse_header(buffer: memoryview, source: str = "<bytes>"):
    """Validate a whole safetensors buffer. Returns (data_start, {name: TensorInfo}, metadata)."""
    total = len(buffer)
    if total < HEADER_LENGTH_BYTES:
        raise _fail(source, f"{total} bytes is too short for the 8-byte header length")
    (header_bytes,) = struct.unpack("<Q", buffer[:HEADER_LENGTH_BYTES])
    if header_bytes > MAX_HEADER_BYTES:
        raise _fail(source, f"header length {header_bytes} exceeds the {MAX_HEADER_BYTES}-byte "
                            "cap")
    data_start = HEADER_LENGTH_BYTES + header_bytes
    if data_start > total:
        raise _fail(source, f"header length {header_bytes} runs past the end of the "
                            f"{total}-byte buffer")
    try:
        text = str(buffer[HEADER_LENGTH_BYTES:data_start], "utf-8")
    except UnicodeDecodeError as err:
        raise _fail(source, f"header is not valid UTF-8 ({err.reason} at byte "
                            f"{err.start})") from None
    try:
        header = json.loads(text, object_pairs_hook=_refuse_duplicate_keys,
                            parse_constant=_refuse_json_constant)
    except (ValueError, RecursionError) as err:
        # ValueError covers JSONDecodeError, duplicate keys and over-long integer literals.
        raise _fail(source, f"header is not valid JSON: {err}") from None
    if not isinstance(header, dict):
        raise _fail(source, f"header must be a JSON object, got {type(header).__name__}")

    metadata = _parse_metadata(source, header.get(METADATA_KEY))
    infos = {}
    for name, entry in header.items():
        if name == METADATA_KEY:
            continue
        infos[name] = _parse_tensor_entry(source, name, entry)
    _check_tiling(source, infos, total - data_start)
    return data_start, infos, metadata


# --------------------------------------------------------------------------------------------
# Conversions from stored dtypes to candle dtypes


def _minifloat_values(exponent_bits: int, mantissa_bits: int, bias: int, variant: str):
    """float64 value of each of the 256 codes of an 8-bit float.

    variant: "ieee" (all-ones exponent = inf/NaN, e.g. E5M2), "fn" (only all-ones = NaN,
    e.g. E4M3), "fnuz" (0x80 = NaN, no negative zero, no inf).
    """
    codes = np.arange(256, dtype=np.int64)
    sign = np.where(codes >> 7, -1.0, 1.0)
    exponent = (codes >> mantissa_bits) & ((1 << exponent_bits) - 1)
    mantissa = (codes & ((1 << mantissa_bits) - 1)).astype(np.float64)
    fraction = mantissa / (1 << mantissa_bits)
    normal = (1.0 + fraction) * np.exp2(exponent.astype(np.float64) - bias)
    subnormal = fraction * np.exp2(1.0 - bias)
    values = sign * np.where(exponent == 0, subnormal, normal)
    top_exponent = exponent == (1 << exponent_bits) - 1
    if variant == "ieee":
        values = np.where(top_exponent & (mantissa == 0), sign * np.inf, values)
        values = np.where(top_exponent & (mantissa != 0), np.nan, values)
    elif variant == "fn":
        values = np.where((codes & 0x7F) == 0x7F, np.nan, values)
    elif variant == "fnuz":
        values = np.where(codes == 0x80, np.nan, values)
    return values


def _e8m0_values():
    """E8M0 holds only an exponent: 2**(e - 127); 0xFF is NaN."""
    codes = np.arange(256, dtype=np.float64)
    return np.where(codes == 255, np.nan, np.exp2(codes - 127))


_FLOAT8_TABLES = {}  # built on first use: name -> (lookup array, candle DType)


def _float8_table(name: str):
    if name not in _FLOAT8_TABLES:
        if name == "F8_E8M0":
            table = (_e8m0_values().astype(np.float32), cdt.f32)
        else:
            layout = {"F8_E4M3": (4, 3, 7, "fn"), "F8_E5M2": (5, 2, 15, "ieee"),
                      "F8_E4M3FNUZ": (4, 3, 8, "fnuz"), "F8_E5M2FNUZ": (5, 2, 16, "fnuz")}[name]
            table = (_minifloat_values(*layout).astype(np.float16), cdt.f16)
        _FLOAT8_TABLES[name] = table
    return _FLOAT8_TABLES[name]


_IDENTITY = {"U8": cdt.u8, "U32": cdt.u32, "I64": cdt.i64, "F16": cdt.f16, "BF16": cdt.bf16,
             "F32": cdt.f32, "F64": cdt.f64}
_WIDEN = {"I8": (np.int64, cdt.i64), "I16": (np.int64, cdt.i64), "I32": (np.int64, cdt.i64),
          "U16": (np.uint32, cdt.u32)}


def to_candle_storage(array: np.ndarray, stored_dtype: str, name: str = "?"):
    """Convert an array holding ``stored_dtype`` values (as ``get_numpy`` returns them) to a
    candle storage array. Returns (array, candle DType); lossless or UnsupportedError."""
    if stored_dtype in _IDENTITY:
        return array, _IDENTITY[stored_dtype]
    if stored_dtype in _WIDEN:
        target, candle_dtype = _WIDEN[stored_dtype]
        return array.astype(target), candle_dtype
    if stored_dtype == "BOOL":
        # Compare the raw bytes: a stored byte other than 0/1 still means true.
        return (array.view(np.uint8) != 0).astype(np.uint8), cdt.u8
    if stored_dtype == "U64":
        if array.size and int(array.max()) > np.iinfo(np.int64).max:
            raise UnsupportedError(f"safetensors tensor {name!r}: U64 values up to "
                                   f"{int(array.max())} do not fit candle's i64")
        return array.astype(np.int64), cdt.i64
    if stored_dtype in ("F8_E4M3", "F8_E5M2", "F8_E4M3FNUZ", "F8_E5M2FNUZ", "F8_E8M0"):
        table, candle_dtype = _float8_table(stored_dtype)
        return table[array], candle_dtype
    raise UnsupportedError(f"safetensors tensor {name!r}: dtype {stored_dtype} has no candle "
                           "equivalent (candle has u8, u32, i64, f16, bf16, f32, f64)")


def _make_tensor(array: np.ndarray, candle_dtype, device):
    # Imported here: the Tensor module may import io modules, and the numpy layer must work
    # without it.
    from .. import Tensor

    return Tensor.from_numpy(array, dtype=candle_dtype, device=device)


# --------------------------------------------------------------------------------------------
# Reading


def _as_byte_view(source) -> memoryview:
    """A flat unsigned-byte view of any contiguous buffer (bytes, bytearray, numpy...)."""
    try:
        view = memoryview(source)
    except TypeError:
        raise FormatError(f"expected bytes, a buffer or a path, got "
                          f"{type(source).__name__}") from None
    if view.format != "B" or view.ndim != 1:
        if not view.c_contiguous:
            raise FormatError("the byte buffer must be contiguous")
        view = view.cast("B")
    return view


def _read_file(path: str, use_mmap: bool, what: str):
    """(byte view, mmap or None) of a file: mmapped when asked and the platform allows,
    otherwise read into memory (Pyodide, empty or special files)."""
    try:
        handle = open(path, "rb")
    except FileNotFoundError:
        raise ModelNotFound(f"{what} file {path!r} does not exist") from None
    with handle:
        size = os.fstat(handle.fileno()).st_size
        if use_mmap and size > 0:
            try:
                import mmap

                mapped = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
                return memoryview(mapped), mapped
            except (ImportError, OSError, ValueError, AttributeError):
                pass  # fall back to reading
        return memoryview(handle.read()), None


class SafeTensors:
    """A validated safetensors buffer; tensors are materialised one at a time on request.

    ``source``: bytes, bytearray, memoryview (or any buffer) or a file path (str/PathLike).
    Arrays from ``get_numpy`` are views of that buffer (read-only for bytes and mmaps).
    """

    def __init__(self, source, *, use_mmap: bool = True):
        self._mapped = None
        if isinstance(source, (str, os.PathLike)):
            self.source_name = os.fspath(source)
            self._buffer, self._mapped = _read_file(self.source_name, use_mmap, "safetensors")
        else:
            self.source_name = "<bytes>"
            self._buffer = _as_byte_view(source)
        data_start, self._infos, self._metadata = parse_header(self._buffer, self.source_name)
        self._payload = self._buffer[data_start:]

    # -- inspection ----------------------------------------------------------------------
    def keys(self) -> list:
        return sorted(self._infos)

    def __iter__(self):
        return iter(self.keys())

    def __len__(self) -> int:
        return len(self._infos)

    def __contains__(self, name) -> bool:
        return name in self._infos

    @property
    def metadata(self) -> dict:
        """The ``__metadata__`` map (empty when the file has none)."""
        return dict(self._metadata)

    def info(self, name: str) -> TensorInfo:
        if name not in self._infos:
            raise ModelNotFound(f"safetensors {self.source_name}: no tensor named {name!r} "
                                f"({len(self._infos)} tensors)")
        return self._infos[name]

    # -- data ----------------------------------------------------------------------------
    def get_bytes(self, name: str) -> memoryview:
        """The tensor's raw little-endian bytes (a view, no copy)."""
        begin, end = self.info(name).data_offsets
        return self._payload[begin:end]

    def get_numpy(self, name: str) -> np.ndarray:
        """The tensor as stored: a zero-copy view when the data is aligned; BF16 as uint16
        bits, F8_* as uint8 bits, BOOL as numpy bool."""
        info = self.info(name)
        stored = STORED_DTYPES[info.dtype]
        if stored.storage is None:
            raise UnsupportedError(f"safetensors {self.source_name}: tensor {name!r} has "
                                   f"sub-byte dtype {info.dtype}, which numpy cannot hold")
        if len(info.shape) > MAX_NUMPY_DIMS:
            raise UnsupportedError(f"safetensors {self.source_name}: tensor {name!r} has "
                                   f"{len(info.shape)} dims; numpy allows {MAX_NUMPY_DIMS}")
        if info.nbytes == 0:
            return np.zeros(info.shape, dtype=stored.storage.newbyteorder("="))
        array = np.frombuffer(self.get_bytes(name), dtype=stored.storage).reshape(info.shape)
        if not array.flags.aligned:
            array = array.copy()  # files from other writers may leave tensors unaligned
        if sys.byteorder != "little" and stored.storage.byteorder == "<":
            array = array.astype(stored.storage.newbyteorder("="))
        return array

    def get_candle_numpy(self, name: str):
        """(storage array, candle DType) after the lossless conversion in the module doc."""
        info = self.info(name)
        return to_candle_storage(self.get_numpy(name), info.dtype, name)

    def get(self, name: str, device=None):
        """The tensor as a candle Tensor (see the module doc for dtype conversions)."""
        array, candle_dtype = self.get_candle_numpy(name)
        return _make_tensor(array, candle_dtype, device)

    # -- lifetime ------------------------------------------------------------------------
    def close(self) -> None:
        """Release the mapping when no array still views it (otherwise the GC will)."""
        self._payload.release()
        self._buffer.release()
        if self._mapped is not None:
            try:
                self._mapped.close()
            except BufferError:
                pass  # arrays returned earlier still view the mapping; they keep it alive
            self._mapped = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def load(source, device=None) -> dict:
    """Every tensor of a safetensors buffer or file as candle Tensors."""
    tensors = SafeTensors(source)
    return {name: tensors.get(name, device=device) for name in tensors.keys()}


def load_numpy(source) -> dict:
    """Every tensor as a numpy array, as stored (BF16 as uint16 bits)."""
    tensors = SafeTensors(source)
    return {name: tensors.get_numpy(name) for name in tensors.keys()}


# --------------------------------------------------------------------------------------------
# Writing


def _stored_dtype_of(name: str, value):
    """(safetensors dtype name, C-contiguous little-endian array of the stored values)."""
    if isinstance(value, RawTensor):
        dtype_name = value.dtype
        if dtype_name not in STORED_DTYPES or STORED_DTYPES[dtype_name].storage is None:
            raise DTypeMismatch(f"safetensors write {name!r}: cannot write dtype {dtype_name!r}")
        array = np.asarray(value.array)
        storage = STORED_DTYPES[dtype_name].storage
        if array.dtype.itemsize != storage.itemsize or array.dtype.kind not in "biufc":
            raise DTypeMismatch(f"safetensors write {name!r}: {dtype_name} needs "
                                f"{storage.itemsize}-byte numbers holding the bits, got "
                                f"{array.dtype}")
        # Put the bits in little-endian order first, then reinterpret them as the storage type.
        little = array.astype(array.dtype.newbyteorder("<"), copy=False)
        return dtype_name, _c_contiguous(little).view(storage)
    if isinstance(value, np.ndarray) or np.isscalar(value):
        array = np.asarray(value)
        dtype_name = _NUMPY_TO_STORED.get(array.dtype.newbyteorder("="))
        if dtype_name is None:
            dtype_name = _EXTENSION_NAME_TO_STORED.get(array.dtype.name)
            if dtype_name is None:
                raise DTypeMismatch(f"safetensors write {name!r}: numpy dtype {array.dtype} "
                                    "has no safetensors dtype")
            array = array.view(STORED_DTYPES[dtype_name].storage)
        return dtype_name, _little_endian(array, STORED_DTYPES[dtype_name].storage)
    if hasattr(value, "storage_numpy") and hasattr(value, "dtype"):
        candle_name = cdt.DType.parse(value.dtype).name
        dtype_name = _CANDLE_TO_STORED[candle_name]
        # Reshape by the tensor's own shape: a 0-d storage array may come back as shape (1,).
        stored = np.asarray(value.storage_numpy()).reshape(tuple(value.shape))
        return dtype_name, _little_endian(stored, STORED_DTYPES[dtype_name].storage)
    raise DTypeMismatch(f"safetensors write {name!r}: expected a Tensor, numpy array or "
                        f"RawTensor, got {type(value).__name__}")


def _little_endian(array: np.ndarray, storage: np.dtype) -> np.ndarray:
    # Both steps return the input unchanged when it is already little-endian and contiguous.
    return _c_contiguous(array.astype(storage, copy=False))


def _c_contiguous(array: np.ndarray) -> np.ndarray:
    # Not np.ascontiguousarray: it turns 0-d arrays into shape (1,).
    return array if array.flags.c_contiguous else array.copy(order="C")


def _raw_bytes(array: np.ndarray) -> memoryview:
    """The bytes of a C-contiguous array without copying (works for 0-d and empty arrays)."""
    return memoryview(array.reshape(-1).view(np.uint8))


def _encode_header(entries: list, metadata) -> bytes:
    header = {}
    if metadata is not None:
        if not isinstance(metadata, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
            raise FormatError("safetensors write: metadata must be a dict of str to str")
        header[METADATA_KEY] = {key: metadata[key] for key in sorted(metadata)}
    for name, dtype_name, shape, offsets in entries:
        header[name] = {"dtype": dtype_name, "shape": list(shape), "data_offsets": list(offsets)}
    try:
        # Compact and non-ASCII kept as UTF-8: byte-identical to serde_json's output.
        encoded = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as err:
        raise FormatError(f"safetensors write: a name or metadata string is not valid "
                          f"unicode ({err.reason})") from None
    padding = (HEADER_ALIGNMENT - len(encoded) % HEADER_ALIGNMENT) % HEADER_ALIGNMENT
    return encoded + b" " * padding


def _prepare(tensors: dict, metadata):
    """Header bytes (with length prefix) and the arrays in file order."""
    prepared = []
    for name, value in tensors.items():
        if not isinstance(name, str):
            raise FormatError(f"safetensors write: tensor names must be str, got {name!r}")
        if name == METADATA_KEY:
            raise FormatError(f"safetensors write: {METADATA_KEY!r} is reserved for metadata")
        dtype_name, array = _stored_dtype_of(name, value)
        prepared.append((name, dtype_name, array))
    # The reference's order: dtype descending (widest alignment first), then name.
    prepared.sort(key=lambda item: item[0])
    prepared.sort(key=lambda item: _WRITE_ORDER[item[1]], reverse=True)
    entries = []
    offset = 0
    for name, dtype_name, array in prepared:
        entries.append((name, dtype_name, array.shape, (offset, offset + array.nbytes)))
        offset += array.nbytes
    header = _encode_header(entries, metadata)
    prefix = struct.pack("<Q", len(header)) + header
    return prefix, [array for _, _, array in prepared]


def serialize(tensors: dict, metadata: dict | None = None) -> bytes:
    """The safetensors bytes of ``{name: Tensor | numpy array | RawTensor}``."""
    prefix, arrays = _prepare(tensors, metadata)
    return b"".join([prefix] + [_raw_bytes(array) for array in arrays])


def save(tensors: dict, path=None, metadata: dict | None = None):
    """Write to ``path`` (streaming, no whole-file buffer) and return None, or return the bytes
    when ``path`` is None."""
    if path is None:
        return serialize(tensors, metadata)
    prefix, arrays = _prepare(tensors, metadata)
    # Write beside the target and rename: a reader may still have the old file mmapped
    # (VarBuilder), and overwriting it in place would change its tensors under it.
    target = os.fspath(path)
    partial = f"{target}.partial-{os.getpid()}"
    try:
        with open(partial, "wb") as handle:
            handle.write(prefix)
            for array in arrays:
                handle.write(_raw_bytes(array))
        os.replace(partial, target)
    finally:
        if os.path.exists(partial):
            os.remove(partial)
    return None
