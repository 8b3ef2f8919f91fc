"""GGUF (versions 2 and 3): a zero-copy reader and a writer.

Layout (all little-endian):

    magic "GGUF" | u32 version | u64 tensor_count | u64 kv_count
    kv_count x  (string key, u32 value_type, value)
    tensor_count x  (string name, u32 n_dims, n_dims x u64 ne, u32 ggml_type, u64 offset)
    padding to ``general.alignment`` (default 32) | tensor data

A string is a u64 byte length then UTF-8 bytes; an array value is a u32 item type, a u64 count
and the items (arrays may nest). Version 1 used u32 for every count and length; versions 2 and 3
use u64 and differ only in that v3 allows big-endian files, which we refuse (no producer makes
them for the quantized types, and their block scales would be in the wrong byte order).

GGML dims ``ne`` list the fastest-varying dim first; ``GgufTensorInfo.shape`` is the reverse,
candle/numpy order, so ``shape[-1]`` is the row length.

Every count, length and offset is checked against the bytes that remain *before* anything is
allocated, so a lying header fails at once with a FormatError instead of a MemoryError or a hang:
the alignment is a power of two up to MAX_ALIGNMENT, the data section starts inside the file,
every tensor's bytes (computed in Python ints, so no overflow) lie inside it, no two tensors
share bytes, and an empty tensor's other dims are bounded by what the file could hold.
"""

from __future__ import annotations

import enum
import math
import os
import struct
from dataclasses import dataclass

import numpy as np

from ..core.errors import DTypeMismatch, FormatError, ModelNotFound, ShapeError, UnsupportedError
from ..quantized.ggml_dtype import GgmlDType
from ..quantized.qtensor import QTensor

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
WRITE_VERSION = 3
DEFAULT_ALIGNMENT = 32
ALIGNMENT_KEY = "general.alignment"
# llama.cpp reads the alignment as a u32 and only asks for a power of two; every writer we know
# uses 32 (the default) or 64. Past a 64 KiB memory page (the largest page size of common
# kernels: arm64, ppc64) an alignment buys nothing for mmap, so a larger one is corruption, not
# a reason to put the data section up to 2**63 bytes past the header.
MAX_ALIGNMENT = 1 << 16
GGML_MAX_DIMS = 4
# Arrays of arrays are legal; a depth limit keeps a crafted file from exhausting the stack.
MAX_ARRAY_NESTING = 8
# The smallest possible encodings, used to bound counts before reading what they count.
MIN_KV_BYTES = 8 + 4 + 1  # empty key, value type, a one-byte value
MIN_TENSOR_INFO_BYTES = 8 + 4 + 4 + 8  # empty name, n_dims = 0, ggml type, offset
STRING_LENGTH_BYTES = 8
_U64 = struct.Struct("<Q")
ARRAY_HEADER_BYTES = 4 + 8


class GgufValueType(enum.IntEnum):
    """Type ids of metadata values."""

    UINT8 = 0
    INT8 = 1
    UINT16 = 2
    INT16 = 3
    UINT32 = 4
    INT32 = 5
    FLOAT32 = 6
    BOOL = 7
    STRING = 8
    ARRAY = 9
    UINT64 = 10
    INT64 = 11
    FLOAT64 = 12


# Fixed-size value types and their little-endian numpy dtypes.
_SCALAR_NUMPY = {
    GgufValueType.UINT8: np.dtype("u1"),
    GgufValueType.INT8: np.dtype("i1"),
    GgufValueType.UINT16: np.dtype("<u2"),
    GgufValueType.INT16: np.dtype("<i2"),
    GgufValueType.UINT32: np.dtype("<u4"),
    GgufValueType.INT32: np.dtype("<i4"),
    GgufValueType.FLOAT32: np.dtype("<f4"),
    GgufValueType.BOOL: np.dtype("u1"),
    GgufValueType.UINT64: np.dtype("<u8"),
    GgufValueType.INT64: np.dtype("<i8"),
    GgufValueType.FLOAT64: np.dtype("<f8"),
}
_NUMPY_TO_VALUE_TYPE = {np.dtype(v).newbyteorder("="): k for k, v in _SCALAR_NUMPY.items()
                        if k is not GgufValueType.BOOL}
_NUMPY_TO_VALUE_TYPE[np.dtype(np.bool_)] = GgufValueType.BOOL

# numpy arrays that write_gguf stores as plain GGML tensors.
_NUMPY_TO_GGML = {
    np.dtype(np.float32): GgmlDType.F32,
    np.dtype(np.float16): GgmlDType.F16,
    np.dtype(np.float64): GgmlDType.F64,
    np.dtype(np.int8): GgmlDType.I8,
    np.dtype(np.int16): GgmlDType.I16,
    np.dtype(np.int32): GgmlDType.I32,
    np.dtype(np.int64): GgmlDType.I64,
}


@dataclass(frozen=True)
class GgufTensorInfo:
    """Where one tensor lives: ``offset`` is relative to the start of the data section."""

    name: str
    shape: tuple  # candle order: reversed GGML dims
    dtype: GgmlDType
    offset: int
    nbytes: int

    @property
    def ggml_dims(self) -> tuple:
        """The dims as GGUF stores them (``ne[0]`` first)."""
        return tuple(reversed(self.shape))

    @property
    def n_elements(self) -> int:
        return math.prod(self.shape)


# ------------------------------------------------------------------------------------ reader

class _Cursor:
    """Reads little-endian fields from a buffer, checking every size against what remains."""

    def __init__(self, view: memoryview, source: str):
        self.view = view
        self.pos = 0
        self.source = source

    @property
    def remaining(self) -> int:
        return len(self.view) - self.pos

    def fail(self, message: str) -> FormatError:
        return FormatError(f"GGUF {self.source}: {message} (at byte {self.pos})")

    def need(self, n_bytes: int, what: str) -> None:
        if n_bytes > self.remaining:
            raise self.fail(f"{what} needs {n_bytes} bytes but only {self.remaining} remain "
                            "(truncated file or lying header)")

    def unpack(self, fmt: str, what: str):
        size = struct.calcsize(fmt)
        self.need(size, what)
        value = struct.unpack_from(fmt, self.view, self.pos)[0]
        self.pos += size
        return value

    def u32(self, what: str) -> int:
        return self.unpack("<I", what)

    def u64(self, what: str) -> int:
        return self.unpack("<Q", what)

    def string(self, what: str) -> str:
        length = self.u64(f"the length of {what}")
        self.need(length, f"{what} (a string of {length} bytes)")
        raw = self.view[self.pos:self.pos + length]
        self.pos += length
        # GGUF says UTF-8; vocabularies occasionally hold stray bytes. surrogateescape keeps
        # them losslessly (the writer encodes them back the same way) instead of failing.
        return bytes(raw).decode("utf-8", errors="surrogateescape")

    def strings(self, count: int, what: str) -> list:
        """``count`` strings in a row. The hot path of vocabularies (262k tokens in Gemma's
        GGUF): one tight loop with local names instead of a method call per string."""
        view, pos, end = self.view, self.pos, len(self.view)
        unpack_length = _U64.unpack_from
        items = []
        append = items.append
        for index in range(count):
            if end - pos < STRING_LENGTH_BYTES:
                self.pos = pos
                raise self.fail(f"item {index} of {what}: the string length is cut off")
            length = unpack_length(view, pos)[0]
            pos += STRING_LENGTH_BYTES
            if length > end - pos:
                self.pos = pos
                raise self.fail(f"item {index} of {what}: a string of {length} bytes but only "
                                f"{end - pos} remain (truncated file or lying header)")
            append(str(view[pos:pos + length], "utf-8", "surrogateescape"))
            pos += length
        self.pos = pos
        return items

    def numpy(self, dtype: np.dtype, count: int, what: str) -> np.ndarray:
        n_bytes = count * dtype.itemsize
        self.need(n_bytes, f"{what} ({count} x {dtype.name})")
        array = np.frombuffer(self.view, dtype=dtype, count=count, offset=self.pos).copy()
        self.pos += n_bytes
        return array


def _value_type(type_id: int, cursor: _Cursor, key: str) -> GgufValueType:
    try:
        return GgufValueType(type_id)
    except ValueError:
        raise cursor.fail(f"unknown metadata value type id {type_id} for key {key!r}; known ids "
                          f"are 0..{max(GgufValueType)}") from None


def _check_bools(values: np.ndarray, cursor: _Cursor, key: str) -> np.ndarray:
    if values.size and values.max() > 1:
        raise cursor.fail(f"key {key!r}: a bool must be 0 or 1, got {int(values.max())}")
    return values.astype(np.bool_)


def _read_value(cursor: _Cursor, value_type: GgufValueType, key: str, depth: int = 0):
    """One metadata value; returns (python value, type description for metadata_types)."""
    if value_type is GgufValueType.STRING:
        return cursor.string(f"the string value of {key!r}"), value_type
    if value_type is GgufValueType.ARRAY:
        return _read_array(cursor, key, depth)
    raw = cursor.numpy(_SCALAR_NUMPY[value_type], 1, f"the value of {key!r}")
    if value_type is GgufValueType.BOOL:
        return bool(_check_bools(raw, cursor, key)[0]), value_type
    return raw[0].item(), value_type


def _read_array(cursor: _Cursor, key: str, depth: int):
    if depth >= MAX_ARRAY_NESTING:
        raise cursor.fail(f"key {key!r}: arrays nested deeper than {MAX_ARRAY_NESTING}")
    item_type = _value_type(cursor.u32(f"the item type of array {key!r}"), cursor, key)
    count = cursor.u64(f"the length of array {key!r}")
    if item_type in _SCALAR_NUMPY:
        values = cursor.numpy(_SCALAR_NUMPY[item_type], count, f"array {key!r}")
        if item_type is GgufValueType.BOOL:
            values = _check_bools(values, cursor, key)
        return values, (GgufValueType.ARRAY, item_type)
    # Variable-size items: each takes at least its length/header field.
    min_item = STRING_LENGTH_BYTES if item_type is GgufValueType.STRING else ARRAY_HEADER_BYTES
    cursor.need(count * min_item, f"array {key!r} of {count} {item_type.name} items")
    if item_type is GgufValueType.STRING:
        return cursor.strings(count, f"array {key!r}"), (GgufValueType.ARRAY, item_type)
    items = [_read_array(cursor, key, depth + 1)[0] for _ in range(count)]
    return items, (GgufValueType.ARRAY, GgufValueType.ARRAY)


def _parse_header(cursor: _Cursor):
    cursor.need(len(GGUF_MAGIC), "the magic")
    magic = bytes(cursor.view[:len(GGUF_MAGIC)])
    if magic != GGUF_MAGIC:
        raise cursor.fail(f"not a GGUF file: magic {magic!r}, expected {GGUF_MAGIC!r}")
    cursor.pos = len(GGUF_MAGIC)
    version = cursor.u32("the version")
    if version not in SUPPORTED_VERSIONS:
        swapped = int.from_bytes(version.to_bytes(4, "little"), "big")
        if swapped in SUPPORTED_VERSIONS:
            raise UnsupportedError(f"GGUF {cursor.source}: big-endian GGUF (version {swapped}) "
                                   "is not supported")
        if version == 1:
            raise UnsupportedError(f"GGUF {cursor.source}: version 1 (u32 counts, 2023 "
                                   "pre-release format) is not supported; convert it to v3")
        raise cursor.fail(f"unsupported GGUF version {version}; expected one of "
                          f"{SUPPORTED_VERSIONS}")
    n_tensors = cursor.u64("the tensor count")
    n_kv = cursor.u64("the metadata count")
    cursor.need(n_kv * MIN_KV_BYTES, f"{n_kv} metadata entries")
    cursor.need(n_tensors * MIN_TENSOR_INFO_BYTES, f"{n_tensors} tensor infos")
    return version, n_tensors, n_kv


def _parse_metadata(cursor: _Cursor, n_kv: int):
    metadata, types = {}, {}
    for index in range(n_kv):
        key = cursor.string(f"metadata key {index}")
        if key in metadata:
            raise cursor.fail(f"duplicate metadata key {key!r}")
        value_type = _value_type(cursor.u32(f"the value type of {key!r}"), cursor, key)
        metadata[key], types[key] = _read_value(cursor, value_type, key)
    return metadata, types


def _alignment(metadata: dict, types: dict, cursor: _Cursor) -> int:
    if ALIGNMENT_KEY not in metadata:
        return DEFAULT_ALIGNMENT
    value = metadata[ALIGNMENT_KEY]
    is_integer = types[ALIGNMENT_KEY] in _SCALAR_NUMPY and isinstance(value, int) \
        and not isinstance(value, bool)
    if not is_integer or value <= 0 or value & (value - 1):
        raise cursor.fail(f"{ALIGNMENT_KEY} must be a positive power of two, got {value!r}")
    if value > MAX_ALIGNMENT:
        raise cursor.fail(f"{ALIGNMENT_KEY} {value} exceeds the limit of {MAX_ALIGNMENT} "
                          "(MAX_ALIGNMENT, a 64 KiB page; writers use 32)")
    return value


def _parse_tensor_infos(cursor: _Cursor, n_tensors: int):
    """(name, ggml dims, dtype, offset) per tensor, in file order, before the data is located."""
    infos = []
    seen = set()
    for index in range(n_tensors):
        name = cursor.string(f"the name of tensor {index}")
        if name in seen:
            raise cursor.fail(f"duplicate tensor name {name!r}")
        seen.add(name)
        n_dims = cursor.u32(f"n_dims of tensor {name!r}")
        if n_dims > GGML_MAX_DIMS:
            raise cursor.fail(f"tensor {name!r} has {n_dims} dims; GGML allows at most "
                              f"{GGML_MAX_DIMS}")
        dims = tuple(cursor.u64(f"dim {d} of tensor {name!r}") for d in range(n_dims))
        type_id = cursor.u32(f"the GGML type of tensor {name!r}")
        dtype = GgmlDType.from_id(type_id, context=f"tensor {name!r} in {cursor.source}")
        offset = cursor.u64(f"the data offset of tensor {name!r}")
        infos.append((name, dims, dtype, offset))
    return infos


def _check_data_offset(data_offset: int, alignment: int, cursor: _Cursor,
                       may_end_at_header: bool) -> None:
    # Writers pad the header to the alignment, so a data section that starts past the end
    # means a lying alignment or a cut-off file; except that a file with no tensors and the
    # default alignment may end right after its header (llama.cpp's vocabulary-only
    # ggml-vocab-*.gguf files do).
    if may_end_at_header and cursor.pos == len(cursor.view):
        return
    if data_offset > len(cursor.view):
        raise cursor.fail(f"the data section would start at byte {data_offset} (tensor infos "
                          f"end at {cursor.pos}, padded to {ALIGNMENT_KEY} {alignment}), past "
                          f"the end of the {len(cursor.view)}-byte file")


def _tensor_nbytes(name: str, dims: tuple, dtype: GgmlDType, cursor: _Cursor) -> int:
    """Bytes of one tensor (a Python int: no overflow, however large the dims)."""
    row = dims[0] if dims else 1
    if row % dtype.block_size:
        raise cursor.fail(f"tensor {name!r}: first GGML dim {row} is not a multiple of the "
                          f"{dtype.name} block size {dtype.block_size}")
    return math.prod(dims) // dtype.block_size * dtype.type_size


def _check_empty_tensor_dims(name: str, dims: tuple, dtype: GgmlDType, cursor: _Cursor) -> None:
    """A zero dim makes a tensor empty, so the range check cannot bound its other dims. Hold
    them to the input's size: with its zero dims taken as 1, the tensor must fit in the file.
    The shape then stays one numpy can describe ([2**63-1, 0] would otherwise fail later, in
    numpy, with "array is too big"); real files with empty tensors are far larger than them."""
    file_size = len(cursor.view)
    capacity = file_size // dtype.type_size * dtype.block_size
    nonzero = math.prod(d for d in dims if d)
    if nonzero > capacity:
        raise cursor.fail(f"tensor {name!r} ({dtype.name}, dims {list(dims)}) describes "
                          f"{nonzero} elements once its zero dims are taken as 1, more than the "
                          f"{capacity} that the whole {file_size}-byte file could hold")


def _locate_tensors(infos, data_offset: int, alignment: int, cursor: _Cursor) -> dict:
    data_size = len(cursor.view) - data_offset
    tensors = {}
    for name, dims, dtype, offset in infos:
        nbytes = _tensor_nbytes(name, dims, dtype, cursor)
        if offset % alignment:
            raise cursor.fail(f"tensor {name!r}: data offset {offset} is not a multiple of the "
                              f"alignment {alignment}")
        if offset + nbytes > data_size:
            raise cursor.fail(f"tensor {name!r} ({dtype.name}, dims {list(dims)}) needs bytes "
                              f"{offset}..{offset + nbytes} of the data section, which has "
                              f"{data_size} (truncated file or lying header)")
        if nbytes == 0:
            _check_empty_tensor_dims(name, dims, dtype, cursor)
        tensors[name] = GgufTensorInfo(name, tuple(reversed(dims)), dtype, offset, nbytes)
    _check_no_overlap(tensors.values(), cursor)
    return tensors


def _check_no_overlap(infos, cursor: _Cursor) -> None:
    """Two tensors must not share bytes: a file that aliases them is corrupt (llama.cpp goes
    further and requires each offset to be the previous one's padded end)."""
    # Empty tensors hold no bytes, and llama.cpp's own layout puts the tensor after an empty
    # one at the same offset, so only tensors with data take part.
    previous = None
    for info in sorted((i for i in infos if i.nbytes), key=lambda i: i.offset):
        if previous is not None and info.offset < previous.offset + previous.nbytes:
            raise cursor.fail(f"tensor {info.name!r} at data offset {info.offset} overlaps "
                              f"tensor {previous.name!r} (bytes {previous.offset}.."
                              f"{previous.offset + previous.nbytes})")
        previous = info


class GgufFile:
    """A parsed GGUF file. The tensor data is not copied: ``tensor_bytes`` returns views into
    the caller's buffer or into a read-only memory map of the file.

    - ``metadata``: key -> value (int, float, bool, str; arrays of numbers/bools as 1-D numpy
      arrays, arrays of strings as lists, nested arrays as lists)
    - ``metadata_types``: key -> GgufValueType, or (ARRAY, item type) for arrays
    - ``tensors``: name -> GgufTensorInfo (file order)
    - ``version``, ``alignment``, ``data_offset`` (absolute byte offset of the data section)
    """

    def __init__(self, source):
        self._mmap = None
        self._closed = False
        if isinstance(source, (str, os.PathLike)):
            self.source = os.fspath(source)
            buffer = self._map_file(self.source)
        elif hasattr(source, "read"):
            self.source = getattr(source, "name", "<file object>")
            buffer = source.read()
        else:
            self.source = "<buffer>"
            buffer = source
        try:
            view = memoryview(buffer)
        except TypeError:
            raise FormatError(f"GGUF: cannot read from a {type(source).__name__}; pass a path, "
                              "bytes, a memoryview or a binary file") from None
        if not view.c_contiguous:
            raise FormatError("GGUF: the buffer must be contiguous")
        if view.ndim != 1 or view.itemsize != 1:
            view = view.cast("B")
        self._buffer = view
        self._parse(_Cursor(view, self.source))

    @staticmethod
    def open(path) -> "GgufFile":
        return GgufFile(os.fspath(path))

    def _map_file(self, path: str):
        try:
            handle = open(path, "rb")
        except OSError as exc:
            raise ModelNotFound(f"GGUF {path}: cannot open: {exc}") from None
        with handle:
            try:
                # Imported here: Pyodide's Python may lack mmap; reading the bytes still works.
                import mmap
                self._mmap = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
                return self._mmap
            except (ImportError, OSError, ValueError):  # ValueError: empty file
                return handle.read()

    def _parse(self, cursor: _Cursor) -> None:
        self.version, n_tensors, n_kv = _parse_header(cursor)
        self.metadata, self.metadata_types = _parse_metadata(cursor, n_kv)
        self.alignment = _alignment(self.metadata, self.metadata_types, cursor)
        infos = _parse_tensor_infos(cursor, n_tensors)
        self.data_offset = _align(cursor.pos, self.alignment)
        _check_data_offset(self.data_offset, self.alignment, cursor,
                           n_tensors == 0 and ALIGNMENT_KEY not in self.metadata)
        self.tensors = _locate_tensors(infos, self.data_offset, self.alignment, cursor)

    def _info(self, name: str) -> GgufTensorInfo:
        if self._closed:
            raise FormatError(f"GGUF {self.source}: the file was closed")
        try:
            return self.tensors[name]
        except KeyError:
            raise ModelNotFound(f"GGUF {self.source}: no tensor named {name!r} (it has "
                                f"{len(self.tensors)} tensors)") from None

    def tensor_bytes(self, name: str) -> np.ndarray:
        """The raw bytes of one tensor as a read-only uint8 view (no copy)."""
        info = self._info(name)
        return np.frombuffer(self._buffer, dtype=np.uint8, count=info.nbytes,
                             offset=self.data_offset + info.offset)

    def qtensor(self, name: str) -> QTensor:
        """One tensor as a QTensor (shape in candle order) over the file's bytes."""
        info = self._info(name)
        return QTensor(info.dtype, info.shape, self.tensor_bytes(name))

    def get(self, key: str, default=None):
        return self.metadata.get(key, default)

    def close(self) -> None:
        """Release the memory map. Arrays still viewing it keep it alive until they go."""
        self._closed = True
        try:
            self._buffer.release()
        except BufferError:
            pass  # tensor views exist; the buffer is freed with the last of them
        if self._mmap is not None:
            try:
                self._mmap.close()
            except BufferError:
                pass  # tensor views exist; the map is freed with the last of them
            self._mmap = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self) -> str:
        return (f"GgufFile({self.source!r}, v{self.version}, {len(self.metadata)} keys, "
                f"{len(self.tensors)} tensors)")


def read_gguf(source) -> GgufFile:
    """Parse a GGUF file from a path (memory-mapped), bytes, a memoryview or a binary file."""
    return GgufFile(source)


def _align(offset: int, alignment: int) -> int:
    return (offset + alignment - 1) // alignment * alignment


# ------------------------------------------------------------------------------------ writer

def _int_value_type(value: int) -> GgufValueType:
    """Python ints are written as INT32 (what gguf-py does), widening when they do not fit."""
    if -2**31 <= value < 2**31:
        return GgufValueType.INT32
    if -2**63 <= value < 2**63:
        return GgufValueType.INT64
    if 0 <= value < 2**64:
        return GgufValueType.UINT64
    raise FormatError(f"GGUF writer: integer {value} does not fit in 64 bits")


def _infer_value_type(value, key: str) -> GgufValueType:
    if isinstance(value, (bool, np.bool_)):
        return GgufValueType.BOOL
    if isinstance(value, (str, bytes)):  # before np.generic: np.str_ is both
        return GgufValueType.STRING
    if isinstance(value, np.generic):
        dtype = np.dtype(type(value))
        if dtype in _NUMPY_TO_VALUE_TYPE:
            return _NUMPY_TO_VALUE_TYPE[dtype]
        raise FormatError(f"GGUF writer: key {key!r}: numpy {dtype} has no GGUF value type")
    if isinstance(value, int):
        return _int_value_type(value)
    if isinstance(value, float):
        return GgufValueType.FLOAT32  # gguf-py's choice; pass np.float64 for a FLOAT64
    if isinstance(value, (list, tuple, np.ndarray)):
        return GgufValueType.ARRAY
    raise FormatError(f"GGUF writer: key {key!r}: cannot store a {type(value).__name__}")


def _infer_item_type(items, key: str) -> GgufValueType:
    if isinstance(items, np.ndarray):
        dtype = items.dtype.newbyteorder("=") if items.dtype.byteorder != "|" else items.dtype
        if dtype in _NUMPY_TO_VALUE_TYPE:
            return _NUMPY_TO_VALUE_TYPE[dtype]
        if items.dtype.kind in "US":
            return GgufValueType.STRING
        raise FormatError(f"GGUF writer: key {key!r}: numpy {items.dtype} arrays have no GGUF "
                          "item type")
    if len(items) == 0:
        raise FormatError(f"GGUF writer: key {key!r}: give the item type of an empty array in "
                          "metadata_types, e.g. (GgufValueType.ARRAY, GgufValueType.INT32)")
    kinds = {_infer_value_type(item, key) for item in items}
    if kinds <= {GgufValueType.INT32, GgufValueType.INT64, GgufValueType.UINT64}:
        return max(kinds, key=lambda k: [GgufValueType.INT32, GgufValueType.INT64,
                                         GgufValueType.UINT64].index(k))
    if len(kinds) != 1:
        raise FormatError(f"GGUF writer: key {key!r}: array items must share one type, got "
                          f"{sorted(k.name for k in kinds)}")
    return kinds.pop()


def _encode_string(value, key: str) -> bytes:
    raw = value if isinstance(value, bytes) else str(value).encode("utf-8", "surrogateescape")
    return struct.pack("<Q", len(raw)) + raw


def _encode_scalar(value, value_type: GgufValueType, key: str) -> bytes:
    if value_type is GgufValueType.STRING:
        return _encode_string(value, key)
    dtype = _SCALAR_NUMPY[value_type]
    if value_type is GgufValueType.BOOL:
        return bytes([1 if value else 0])
    try:
        if dtype.kind in "iu" and not (np.iinfo(dtype).min <= int(value) <= np.iinfo(dtype).max):
            raise OverflowError
        return np.array(value, dtype=dtype).tobytes()
    except (OverflowError, TypeError, ValueError):
        raise FormatError(f"GGUF writer: key {key!r}: {value!r} is not a valid "
                          f"{value_type.name}") from None


def _encode_array(items, item_type, key: str, depth: int = 0) -> bytes:
    if depth >= MAX_ARRAY_NESTING:
        raise FormatError(f"GGUF writer: key {key!r}: arrays nested deeper than "
                          f"{MAX_ARRAY_NESTING}")
    if item_type is None:
        item_type = _infer_item_type(items, key)
    header = struct.pack("<IQ", item_type, len(items))
    if item_type in _SCALAR_NUMPY:
        dtype = _SCALAR_NUMPY[item_type]
        values = np.asarray(items)
        if item_type is GgufValueType.BOOL:
            return header + values.astype(bool).astype(np.uint8).tobytes()
        if dtype.kind in "iu" and values.size and values.dtype.kind in "iub":
            info = np.iinfo(dtype)
            if values.min() < info.min or values.max() > info.max:
                raise FormatError(f"GGUF writer: key {key!r}: values outside {item_type.name}")
        return header + values.astype(dtype).tobytes()
    if item_type is GgufValueType.STRING:
        return header + b"".join(_encode_string(item, key) for item in items)
    if item_type is GgufValueType.ARRAY:
        return header + b"".join(_encode_array(item, None, key, depth + 1) for item in items)
    raise FormatError(f"GGUF writer: key {key!r}: bad item type {item_type!r}")


def _encode_kv(key: str, value, declared) -> bytes:
    if isinstance(declared, tuple):
        value_type, item_type = GgufValueType(declared[0]), GgufValueType(declared[1])
    elif declared is not None:
        value_type, item_type = GgufValueType(declared), None
    else:
        value_type, item_type = _infer_value_type(value, key), None
    if item_type is GgufValueType.ARRAY:
        item_type = None  # nested: each inner array is typed from its own items
    head = _encode_string(key, key) + struct.pack("<I", value_type)
    if value_type is GgufValueType.ARRAY:
        if not isinstance(value, (list, tuple, np.ndarray)):
            raise FormatError(f"GGUF writer: key {key!r}: ARRAY needs a list or numpy array")
        return head + _encode_array(value, item_type, key)
    return head + _encode_scalar(value, value_type, key)


def _as_qtensor(name: str, tensor) -> QTensor:
    if isinstance(tensor, QTensor):
        return tensor
    array = np.asarray(tensor)
    if array.dtype not in _NUMPY_TO_GGML:
        raise DTypeMismatch(f"GGUF writer: tensor {name!r} has numpy dtype {array.dtype}; use "
                            f"one of {sorted(str(d) for d in _NUMPY_TO_GGML)} or a QTensor "
                            "(e.g. QTensor(GgmlDType.BF16, shape, bits))")
    dtype = _NUMPY_TO_GGML[array.dtype]
    raw = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).reshape(-1)
    return QTensor(dtype, array.shape, raw.view(np.uint8))


def write_gguf(dest, metadata: dict, tensors: dict, *, alignment: int | None = None,
               metadata_types: dict | None = None, version: int = WRITE_VERSION) -> None:
    """Write a GGUF file to ``dest`` (a path or a binary file object).

    ``metadata`` values are typed by ``metadata_types[key]`` when given (what
    ``GgufFile.metadata_types`` returns, so a read file round-trips exactly), else inferred:
    bool -> BOOL, int -> INT32 (INT64/UINT64 when too big), float -> FLOAT32, numpy scalars ->
    their own type, str -> STRING, lists/tuples/numpy arrays -> ARRAY (nested lists nest).
    ``tensors`` maps names to QTensors or numpy arrays (f32, f16, f64, i8, i16, i32, i64).
    The alignment is ``alignment``, else ``metadata['general.alignment']``, else 32."""
    if version not in SUPPORTED_VERSIONS:
        raise UnsupportedError(f"GGUF writer: version {version} is not supported; "
                               f"use one of {SUPPORTED_VERSIONS}")
    metadata = dict(metadata)
    types = dict(metadata_types or {})
    if alignment is None:
        alignment = int(metadata.get(ALIGNMENT_KEY, DEFAULT_ALIGNMENT))
    if alignment <= 0 or alignment & (alignment - 1) or alignment > MAX_ALIGNMENT:
        raise ShapeError(f"GGUF writer: alignment must be a power of two up to "
                         f"{MAX_ALIGNMENT} (MAX_ALIGNMENT), got {alignment}")
    if alignment != DEFAULT_ALIGNMENT or ALIGNMENT_KEY in metadata:
        metadata[ALIGNMENT_KEY] = alignment
        types[ALIGNMENT_KEY] = GgufValueType.UINT32  # the type the spec requires

    qtensors = {str(name): _as_qtensor(str(name), t) for name, t in tensors.items()}
    header = bytearray(GGUF_MAGIC)
    header += struct.pack("<IQQ", version, len(qtensors), len(metadata))
    for key, value in metadata.items():
        header += _encode_kv(str(key), value, types.get(key))
    offset = 0
    offsets = []
    for name, qt in qtensors.items():
        if len(qt.shape) > GGML_MAX_DIMS:
            raise ShapeError(f"GGUF writer: tensor {name!r} has {len(qt.shape)} dims; GGML "
                             f"allows at most {GGML_MAX_DIMS}")
        dims = tuple(reversed(qt.shape))
        header += _encode_string(name, name)
        header += struct.pack(f"<I{len(dims)}QIQ", len(dims), *dims, qt.dtype, offset)
        offsets.append(offset)
        offset = _align(offset + qt.nbytes, alignment)
    header += bytes(_align(len(header), alignment) - len(header))

    def write_all(out) -> None:
        out.write(header)
        for qt in qtensors.values():
            out.write(memoryview(np.ascontiguousarray(qt.data)))
            out.write(bytes(_align(qt.nbytes, alignment) - qt.nbytes))

    if hasattr(dest, "write"):
        write_all(dest)
    else:
        with open(os.fspath(dest), "wb") as out:
            write_all(out)
