"""CTranslate2 ``model.bin`` (the faster-whisper format): a validating, zero-copy reader.

Layout (little-endian; "string" = u16 byte length, then that many UTF-8 bytes ending in NUL):

    u32 binary_version                      1..6 understood
    string spec_name, u32 spec_revision     binary_version >= 2 only
    u32 variable_count
    per variable:
        string name, u8 rank, u32 dims[rank]
        binary_version >= 4: u8 dtype_id, u32 byte_count
        binary_version <  4: u8 item_size, u32 element_count (dtype guessed from item_size)
        raw row-major data
    u32 alias_count, then (string alias, string target) pairs   binary_version >= 3 only

dtype ids follow CTranslate2's DataType enum: 0 float32, 1 int8, 2 int16, 3 int32, 4 float16,
5 bfloat16. Arrays are read-only views of the input bytes or of a read-only mmap of the file,
so opening a model costs no copy; float16 stays float16 and bfloat16 stays as uint16 bits
(see ``Ct2Model.dtypes``). Every count and size is checked against the bytes left before
anything is built, so a lying or truncated file raises FormatError naming the field, the
variable and the byte offset instead of allocating or reading out of bounds: the rank is at most
MAX_RANK, dims times the item size equal the byte count and fit in the file (the other dims of
an empty variable too), names and aliases lie inside the file, aliases resolve without cycles.
"""

from __future__ import annotations

import dataclasses
import os
import struct

import numpy as np

from ..core.errors import FormatError, ModelNotFound, UnsupportedError

NEWEST_BINARY_VERSION = 6
# name: (dtype id, numpy little-endian storage dtype)
CT2_DTYPES = {
    0: ("float32", np.dtype("<f4")),
    1: ("int8", np.dtype("i1")),
    2: ("int16", np.dtype("<i2")),
    3: ("int32", np.dtype("<i4")),
    4: ("float16", np.dtype("<f2")),
    5: ("bfloat16", np.dtype("<u2")),  # numpy has no bfloat16: keep the bits
}
# Before binary version 4 only the item width was stored; CTranslate2 guessed the type from it.
LEGACY_DTYPE_BY_ITEM_SIZE = {4: 0, 2: 2, 1: 1}
# Smallest possible encoding of one variable (name length, 1-byte name, rank, dtype, count) and
# of one alias (two such strings): used to refuse absurd counts before looping over them.
MIN_VARIABLE_BYTES = 2 + 1 + 1 + 1 + 4
MIN_ALIAS_BYTES = 2 * (2 + 1)
# Alias chains longer than this are treated as a cycle.
MAX_ALIAS_DEPTH = 32
# The rank byte allows 255, numpy at most 64. CTranslate2's specs write rank <= 3 (scalars,
# vectors, matrices, conv weights [out, in, kernel]); 8 leaves room for any future layout and
# refuses a corrupt rank byte before numpy does (with a bare ValueError).
MAX_RANK = 8


@dataclasses.dataclass
class Ct2Model:
    """The variables of a CTranslate2 model.bin, by name."""

    spec_name: str
    revision: int
    binary_version: int
    variables: dict[str, np.ndarray]
    dtypes: dict[str, str]  # CTranslate2 type name per variable: "float16", "bfloat16", ...
    aliases: dict[str, str]  # alias -> the variable name that holds the data

    def resolve(self, name: str) -> str:
        """The name of the variable holding the data for name (following aliases)."""
        seen = name
        for _ in range(MAX_ALIAS_DEPTH):
            if name in self.variables:
                return name
            if name not in self.aliases:
                break
            name = self.aliases[name]
        else:
            raise FormatError(f"CTranslate2 alias {seen!r}: chain longer than {MAX_ALIAS_DEPTH}")
        raise ModelNotFound(f"CTranslate2 model {self.spec_name!r} has no variable {seen!r}")

    def __getitem__(self, name: str) -> np.ndarray:
        return self.variables[self.resolve(name)]

    def get(self, name: str, default=None):
        """The variable's array (following aliases), or default when there is none."""
        return self[name] if name in self else default

    def get_f32(self, name: str) -> np.ndarray:
        """The variable widened to float32 (float16 and bfloat16 exactly; integers as values)."""
        array = self[name]
        if self.dtype_of(name) == "bfloat16":
            from ..core.dtype import bf16_bits_to_f32

            return bf16_bits_to_f32(array)
        return array.astype(np.float32)

    def __contains__(self, name: object) -> bool:
        try:
            self.resolve(name)  # type: ignore[arg-type]
        except (ModelNotFound, FormatError):
            return False
        return True

    def dtype_of(self, name: str) -> str:
        return self.dtypes[self.resolve(name)]

    def scalar(self, name: str) -> int | float:
        """A rank-0 variable as a Python number (e.g. decoder/num_heads)."""
        array = self[name]
        if array.size != 1:
            raise FormatError(f"CTranslate2 variable {name!r} has shape {array.shape}, "
                              f"not a scalar")
        if self.dtype_of(name) == "bfloat16":
            from ..core.dtype import bf16_bits_to_f32

            return bf16_bits_to_f32(array).reshape(()).item()
        return array.reshape(()).item()

    def tensor(self, name: str, device=None):
        """The variable as a candle_web Tensor (float32, float16 or bfloat16 only)."""
        from ..core.dtype import bf16
        from ..core.tensor import Tensor

        real_name = self.resolve(name)
        ct2_type = self.dtypes[real_name]
        array = self.variables[real_name]
        if ct2_type == "bfloat16":
            return Tensor.from_numpy(array, dtype=bf16, device=device)
        if ct2_type in ("float32", "float16"):
            return Tensor.from_numpy(array, device=device)
        raise UnsupportedError(f"CTranslate2 variable {real_name!r} is {ct2_type}: quantized "
                               f"CTranslate2 weights are not supported as tensors")


class _Reader:
    """Bounds-checked little-endian reads over a buffer; errors name the field and offset."""

    def __init__(self, buffer, source: str = "<bytes>"):
        self.buffer = buffer
        self.source = source  # the path, or "<bytes>": every message names the file
        self.view = memoryview(buffer)
        self.length = len(self.view)
        self.offset = 0

    def fail(self, message: str) -> FormatError:
        return FormatError(f"CTranslate2 {self.source}: {message}")

    @property
    def remaining(self) -> int:
        return self.length - self.offset

    def need(self, count: int, what: str) -> None:
        if count > self.remaining:
            raise self.fail(f"{what} at offset {self.offset}: needs {count} bytes, "
                              f"only {self.remaining} left (truncated or lying header)")

    def unpack(self, fmt: str, what: str):
        size = struct.calcsize(fmt)
        self.need(size, what)
        values = struct.unpack_from(fmt, self.view, self.offset)
        self.offset += size
        return values[0] if len(values) == 1 else values

    def string(self, what: str) -> str:
        start = self.offset
        length = self.unpack("<H", f"{what} length")
        self.need(length, what)
        raw = bytes(self.view[self.offset:self.offset + length])
        self.offset += length
        if raw.endswith(b"\0"):
            raw = raw[:-1]
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail(f"{what} at offset {start} is not UTF-8: "
                              f"{raw[:40]!r}") from None
        if not text or "\0" in text:
            raise self.fail(f"{what} at offset {start} is empty or holds NUL: "
                              f"{raw[:40]!r}")
        return text


def read_ct2(source) -> Ct2Model:
    """Read a CTranslate2 model.bin from bytes-like data or a path (memory-mapped)."""
    name = "<bytes>"
    if isinstance(source, (str, os.PathLike)):
        buffer = _map_file(source)
        name = os.fspath(source)
    elif isinstance(source, (bytes, bytearray)):
        buffer = source
    elif isinstance(source, memoryview):
        if not source.c_contiguous:
            raise FormatError("read_ct2: the memoryview is not contiguous")
        buffer = source.cast("B")
    else:
        raise FormatError(f"read_ct2: expected bytes or a path, got {type(source).__name__}")
    return _parse(_Reader(buffer, name))


def _map_file(path):
    import mmap  # here, not at the top: the browser build passes bytes and may lack mmap

    with open(path, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        if size == 0:
            return b""  # mmap refuses empty files; the parser reports the truncation
        # The map keeps its own handle: closing the file here is fine.
        return mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)


def _parse(reader: _Reader) -> Ct2Model:
    version = reader.unpack("<I", "binary version")
    if not 1 <= version <= NEWEST_BINARY_VERSION:
        raise UnsupportedError(f"CTranslate2 {reader.source}: binary version {version} is not "
                               f"supported (1..{NEWEST_BINARY_VERSION})")
    spec_name, revision = "", 1
    if version >= 2:
        spec_name = reader.string("spec name")
        revision = reader.unpack("<I", "spec revision")
    variables, dtypes = _read_variables(reader, version)
    aliases = _read_aliases(reader, variables) if version >= 3 else {}
    if reader.remaining:
        raise reader.fail(f"file has {reader.remaining} unexpected bytes after the "
                          f"last record (offset {reader.offset})")
    model = Ct2Model(spec_name, revision, version, variables, dtypes, aliases)
    _check_aliases_resolve(reader, model)
    return model


def _read_variables(reader: _Reader, version: int) -> tuple[dict, dict]:
    count = reader.unpack("<I", "variable count")
    if count * MIN_VARIABLE_BYTES > reader.remaining:
        raise reader.fail(f"variable count {count} at offset {reader.offset - 4} "
                          f"cannot fit in the {reader.remaining} bytes left")
    variables: dict[str, np.ndarray] = {}
    dtypes: dict[str, str] = {}
    for index in range(count):
        name, array, type_name = _read_variable(reader, version, index)
        if name in variables:
            raise reader.fail(f"variable {name!r} appears twice")
        variables[name] = array
        dtypes[name] = type_name
    return variables, dtypes


def _read_aliases(reader: _Reader, variables: dict) -> dict[str, str]:
    alias_count = reader.unpack("<I", "alias count")
    if alias_count * MIN_ALIAS_BYTES > reader.remaining:
        raise reader.fail(f"alias count {alias_count} at offset {reader.offset - 4} cannot "
                          f"fit in the {reader.remaining} bytes left")
    aliases: dict[str, str] = {}
    for index in range(alias_count):
        alias = reader.string(f"alias #{index} name")
        target = reader.string(f"alias {alias!r} target")
        if alias in variables or alias in aliases:
            raise reader.fail(f"alias {alias!r} duplicates an existing name")
        aliases[alias] = target
    return aliases


def _check_aliases_resolve(reader: _Reader, model: Ct2Model) -> None:
    """Every alias must lead to a variable within MAX_ALIAS_DEPTH steps (no cycle, no dangling
    target), so that lookups later cannot fail on a file that loaded."""
    for alias, target in model.aliases.items():
        try:
            model.resolve(alias)
        except ModelNotFound:
            raise reader.fail(f"alias {alias!r} points to the missing variable "
                              f"{target!r}") from None
        except FormatError:
            raise reader.fail(f"alias {alias!r}: chain longer than {MAX_ALIAS_DEPTH} "
                              "(MAX_ALIAS_DEPTH), a cycle") from None


def _read_dims(reader: _Reader, where: str) -> tuple:
    rank = reader.unpack("<B", f"{where} rank")
    if rank > MAX_RANK:
        raise reader.fail(f"{where} at offset {reader.offset - 1}: rank {rank} "
                          f"exceeds the limit of {MAX_RANK} (MAX_RANK)")
    reader.need(4 * rank, f"{where} dims")
    dims = struct.unpack_from(f"<{rank}I", reader.view, reader.offset)
    reader.offset += 4 * rank
    return dims


def _check_empty_dims(reader: _Reader, where: str, dims: tuple, itemsize: int) -> None:
    """A zero dim makes the byte count 0 whatever the other dims are; hold those to what the
    file could hold, so the shape stays one numpy can build ("array is too big" otherwise)."""
    nonzero_bytes = itemsize
    for dim in dims:
        nonzero_bytes *= dim or 1  # Python int: no overflow
    if nonzero_bytes > reader.length:
        raise reader.fail(f"{where}: dims {list(dims)} describe {nonzero_bytes} "
                          f"bytes once the zero dims are taken as 1, more than the "
                          f"{reader.length}-byte file")


def _read_variable(reader: _Reader, version: int, index: int):
    name = reader.string(f"variable #{index} name")
    where = f"variable {name!r}"
    dims = _read_dims(reader, where)
    element_count = 1
    for dim in dims:
        element_count *= dim  # Python int: no overflow
    if version >= 4:
        dtype_id = reader.unpack("<B", f"{where} dtype")
        if dtype_id not in CT2_DTYPES:
            raise reader.fail(f"{where} at offset {reader.offset - 1}: unknown "
                              f"dtype id {dtype_id} (known: 0..{len(CT2_DTYPES) - 1})")
        byte_count = reader.unpack("<I", f"{where} byte count")
    else:
        item_size = reader.unpack("<B", f"{where} item size")
        if item_size not in LEGACY_DTYPE_BY_ITEM_SIZE:
            raise reader.fail(f"{where} at offset {reader.offset - 1}: item size "
                              f"{item_size} is not 1, 2 or 4")
        dtype_id = LEGACY_DTYPE_BY_ITEM_SIZE[item_size]
        byte_count = reader.unpack("<I", f"{where} element count") * item_size
    type_name, np_dtype = CT2_DTYPES[dtype_id]
    if byte_count != element_count * np_dtype.itemsize:
        raise reader.fail(f"{where} at offset {reader.offset - 4}: {byte_count} "
                          f"bytes do not hold shape {list(dims)} of {type_name} "
                          f"({element_count * np_dtype.itemsize} bytes)")
    reader.need(byte_count, f"{where} data")
    if byte_count == 0:
        _check_empty_dims(reader, where, dims, np_dtype.itemsize)
    array = np.frombuffer(reader.buffer, dtype=np_dtype, count=element_count,
                          offset=reader.offset).reshape(dims)
    reader.offset += byte_count
    return name, array, type_name
