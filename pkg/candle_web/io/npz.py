"""npy and npz: numpy's array files, read and written without pickle.

An ``.npy`` file is the magic ``\\x93NUMPY``, a version byte pair (1.0, 2.0 or 3.0), the header
length (u16 for 1.0, u32 after), a header holding a Python dict literal
``{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }`` (latin-1; UTF-8 in 3.0) padded
so the data starts 64-byte aligned, then the raw data. An ``.npz`` file is a zip archive of
``NAME.npy`` members, stored (``np.savez``) or deflated (``np.savez_compressed``).

Only plain numbers are accepted: bool, (u)int8/16/32/64, float16/32/64, either byte order, C or
Fortran order. Object arrays are refused (reading them would mean unpickling), as are structured,
string, complex and datetime dtypes. The header is checked before anything is allocated: its
length against a cap (10 000 bytes, numpy's own default), its keys and types, the rank against
numpy's limit (64 dims), and the data size it implies against the bytes actually there.

Zip members are read lazily, one per request. Stored members are zero-copy views of the archive
buffer (checked against their CRC) when their data is aligned, as ``save`` arranges (np.savez
does not align, so its members are copied). Before a deflated member is inflated, its declared
size is checked against ``max_member_bytes``, against what deflate can possibly produce from
its compressed size and against ``max_deflate_ratio`` (past a 64 MiB allowance per archive),
and the npy header inside it must agree with that size: a zip bomb is refused before its output
is allocated (README, "Bounds").

Arrays come back in native byte order; Fortran-ordered data comes back as a Fortran-ordered view.
As Tensors, dtypes convert as in safetensors: bool -> u8, int8/16/32 -> i64, uint16 -> u32,
uint64 -> i64 when every value fits. A bf16 Tensor is written as float32 (exact: npy has no
bfloat16).
"""

from __future__ import annotations

import ast
import io
import os
import re
import struct
import zipfile
import zlib
from dataclasses import dataclass

import numpy as np

from ..core import dtype as cdt
from ..core.errors import (CandleError, DTypeMismatch, FormatError, ModelNotFound,
                      UnsupportedError)
from .bounds import (MAX_ARRAY_BYTES, MAX_NUMPY_DIMS, ZIP_LOCAL_HEADER, nonzero_bytes,
                     zip_member_data_start)
from .safetensors import _NUMPY_TO_STORED, _as_byte_view, _make_tensor, _read_file, to_candle_storage

NPY_MAGIC = b"\x93NUMPY"
NPY_ALIGNMENT = 64  # numpy pads the header so the data starts on a 64-byte boundary
MAX_NPY_HEADER_BYTES = 10_000  # numpy's default `max_header_size` guard against huge literals
_NPY_PREFIX_BYTES = {1: 10, 2: 12, 3: 12}  # magic + version + header-length field
_NPY_LENGTH_FORMAT = {1: "<H", 2: "<I", 3: "<I"}
_NPY_HEADER_ENCODING = {1: "latin1", 2: "latin1", 3: "utf8"}
_NPY_HEADER_KEYS = {"descr", "fortran_order", "shape"}
_V1_MAX_HEADER = 2**16 - 1

# The dtypes we read and write: kind letter -> allowed item sizes.
_SUPPORTED_SIZES = {"b": (1,), "i": (1, 2, 4, 8), "u": (1, 2, 4, 8), "f": (2, 4, 8)}
_DESCR_PATTERN = re.compile(r"^([<>|=])([a-zA-Z])(\d+)$")

DEFAULT_MAX_MEMBER_BYTES = 2**31  # one array in wasm32 must stay below 2 GiB
# Deflate emits at most 258 bytes per ~2 bits of input: about 1032:1. Anything claiming more
# is lying about its size.
DEFLATE_MAX_RATIO = 1032
_DEFLATE_SLACK_BYTES = 1024
# Real tensors deflate by 1.1-2x; only near-constant data (zeros, masks) deflates by more than
# 100x. An archive may inflate such members up to HIGHLY_COMPRESSED_ALLOWANCE bytes in all
# (GPT-2's twelve 4 MB causal masks: 48 MB); past that every member must keep within
# max_deflate_ratio. So reading an archive of S bytes inflates at most
# max_deflate_ratio * S + 64 MiB (time linear in it), not 1032 * S: a 1.94 MB file whose one
# member inflates to 1.9 GB of zeros is refused before inflating (it took 43 s and 1.98 GB).
DEFAULT_MAX_DEFLATE_RATIO = 100
HIGHLY_COMPRESSED_ALLOWANCE = 64 << 20
_ZIP_ENCRYPTED_FLAG = 0x1
_FIXED_ZIP_DATE = (1980, 1, 1, 0, 0, 0)  # reproducible archives
_READ_CHUNK_BYTES = 1 << 20
_EXTRA_FIELD_HEADER = struct.Struct("<HH")  # id, size
_PADDING_EXTRA_ID = 0xD935  # the id zipalign uses for padding; readers skip unknown ids
_ZIP64_LOCAL_EXTRA_BYTES = 20


@dataclass(frozen=True)
class NpyHeader:
    """A validated npy header. ``data_offset`` is where the data starts in the file."""

    version: tuple
    dtype: np.dtype  # as in the file, byte order included
    shape: tuple
    fortran_order: bool
    data_offset: int

    @property
    def nbytes(self) -> int:
        count = self.dtype.itemsize
        for dim in self.shape:
            count *= dim
        return count


# --------------------------------------------------------------------------------------------
# npy


def _fail(source: str, message: str) -> FormatError:
    return FormatError(f"npy {source}: {message}")


def _parse_descr(source: str, descr) -> np.dtype:
    if not isinstance(descr, str):
        raise UnsupportedError(f"npy {source}: structured dtype {descr!r} is not supported "
                               "(only plain bool/int/uint/float arrays)")
    match = _DESCR_PATTERN.match(descr)
    if match is None or match.group(2) not in _SUPPORTED_SIZES:
        if "O" in descr:
            raise UnsupportedError(f"npy {source}: object array (descr {descr!r}) refused: "
                                   "reading it would require unpickling")
        raise UnsupportedError(f"npy {source}: dtype descr {descr!r} is not supported "
                               "(only bool, int, uint and float)")
    order, kind, size = match.group(1), match.group(2), int(match.group(3))
    if size not in _SUPPORTED_SIZES[kind]:
        raise UnsupportedError(f"npy {source}: dtype descr {descr!r} is not supported "
                               f"({kind}{size})")
    if size == 1:
        order = "|"
    elif order == "|":
        raise _fail(source, f"field 'descr': {descr!r} needs a byte order ('<' or '>')")
    return np.dtype(order + kind + str(size))


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _checked_shape(source: str, shape, itemsize: int) -> tuple:
    if not isinstance(shape, tuple) or not all(_is_int(d) and d >= 0 for d in shape):
        raise _fail(source, f"field 'shape': expected a tuple of non-negative ints, got "
                            f"{_short(shape)}")
    # np.save cannot write more dims than numpy holds; checked here, before any dim is
    # multiplied, rather than left to numpy's bare ValueError when the array is built.
    if len(shape) > MAX_NUMPY_DIMS:
        raise _fail(source, f"field 'shape': {len(shape)} dims exceed the limit of "
                            f"{MAX_NUMPY_DIMS} (MAX_NUMPY_DIMS, numpy's own)")
    if nonzero_bytes(shape, itemsize, MAX_ARRAY_BYTES) is None:
        raise _fail(source, f"field 'shape': {_short(shape)} overflows (more than 2**63 bytes)")
    return shape


def _short(value, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def parse_npy_header(buffer, source: str = "<bytes>", total_bytes: int | None = None):
    """Validate the header at the start of ``buffer``. ``total_bytes`` is the full file size
    when ``buffer`` holds only its beginning (a member being inflated); the data size the
    header implies must equal what follows it."""
    buffer = memoryview(buffer)
    total = len(buffer) if total_bytes is None else total_bytes
    if len(buffer) < 8 or bytes(buffer[:6]) != NPY_MAGIC:
        raise _fail(source, f"not an npy file (expected the magic {NPY_MAGIC!r}, got "
                            f"{bytes(buffer[:6])!r})")
    major, minor = buffer[6], buffer[7]
    if major not in _NPY_PREFIX_BYTES or minor != 0:
        raise _fail(source, f"unsupported npy format version {major}.{minor} (1.0, 2.0, 3.0)")
    prefix = _NPY_PREFIX_BYTES[major]
    if len(buffer) < prefix:
        raise _fail(source, f"truncated: {len(buffer)} bytes, the header length field ends "
                            f"at {prefix}")
    (header_len,) = struct.unpack(_NPY_LENGTH_FORMAT[major], buffer[8:prefix])
    if header_len > MAX_NPY_HEADER_BYTES:
        raise _fail(source, f"header length {header_len} exceeds the "
                            f"{MAX_NPY_HEADER_BYTES}-byte cap")
    data_offset = prefix + header_len
    if data_offset > len(buffer) or data_offset > total:
        raise _fail(source, f"truncated: header of {header_len} bytes runs past the end "
                            f"({total} bytes)")
    try:
        text = str(buffer[prefix:data_offset], _NPY_HEADER_ENCODING[major])
    except UnicodeDecodeError as err:
        raise _fail(source, f"header is not valid {err.encoding}") from None
    try:
        # literal_eval builds only literals (no calls, no names): numpy's own approach.
        header = ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError) as err:
        raise _fail(source, f"header is not a Python literal: {_short(text)} "
                            f"({type(err).__name__})") from None
    if not isinstance(header, dict):
        raise _fail(source, f"header must be a dict, got {type(header).__name__}")
    keys = set(header) if all(isinstance(k, str) for k in header) else None
    if keys != _NPY_HEADER_KEYS:
        raise _fail(source, f"header keys must be {sorted(_NPY_HEADER_KEYS)}, got "
                            f"{_short(sorted(map(str, header)))}")
    if not isinstance(header["fortran_order"], bool):
        raise _fail(source, f"field 'fortran_order': expected True or False, got "
                            f"{_short(header['fortran_order'])}")
    dtype = _parse_descr(source, header["descr"])
    shape = _checked_shape(source, header["shape"], dtype.itemsize)
    parsed = NpyHeader((major, minor), dtype, shape, header["fortran_order"], data_offset)
    available = total - data_offset
    if available < parsed.nbytes:
        raise _fail(source, f"truncated data: {available} bytes after the header, shape "
                            f"{shape} of {dtype} needs {parsed.nbytes}")
    if available > parsed.nbytes:
        raise _fail(source, f"{available - parsed.nbytes} trailing bytes after the data of "
                            f"shape {shape} ({parsed.nbytes} bytes)")
    return parsed


def _array_from_data(data, header: NpyHeader) -> np.ndarray:
    """Interpret exactly ``header.nbytes`` bytes; a view when the layout allows."""
    native = header.dtype.newbyteorder("=")
    order = "F" if header.fortran_order else "C"
    if header.nbytes == 0:
        return np.zeros(header.shape, dtype=native, order=order)
    flat = np.frombuffer(data, dtype=header.dtype)
    if header.fortran_order:
        array = flat.reshape(header.shape[::-1]).T
    else:
        array = flat.reshape(header.shape)
    if not array.dtype.isnative:
        array = array.astype(native, order="K")  # big-endian files: swap into native order
    elif not array.flags.aligned:
        array = array.copy(order="K")
    return array


def _buffer_and_name(source, what: str):
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        view, mapped = _read_file(path, True, what)
        return view, path, mapped
    return _as_byte_view(source), "<bytes>", None


def read_npy(source) -> np.ndarray:
    """The array of an npy file (bytes-like or path), native byte order, never unpickled."""
    buffer, name, _ = _buffer_and_name(source, "npy")
    header = parse_npy_header(buffer, name)
    return _array_from_data(buffer[header.data_offset:], header)


def _candle_from_numpy(array: np.ndarray, name: str):
    stored = _NUMPY_TO_STORED[array.dtype.newbyteorder("=")]
    storage, candle_dtype = to_candle_storage(array, stored, name)
    return np.ascontiguousarray(storage) if storage.ndim else storage, candle_dtype


def load_npy(source, device=None):
    """The array of an npy file as a candle Tensor."""
    array = read_npy(source)
    storage, candle_dtype = _candle_from_numpy(array, "npy")
    return _make_tensor(storage, candle_dtype, device)


def _writable_array(name: str, value) -> np.ndarray:
    """A numpy array of a supported dtype; Tensors give their values (bf16 widened to f32)."""
    if hasattr(value, "storage_numpy") and hasattr(value, "dtype") and not isinstance(
            value, np.ndarray):
        candle_dtype = cdt.DType.parse(value.dtype)
        stored = np.asarray(value.storage_numpy()).reshape(tuple(value.shape))
        if candle_dtype is cdt.bf16:
            stored = cdt.bf16_bits_to_f32(stored)
        return stored
    array = np.asarray(value)
    if array.dtype.kind not in _SUPPORTED_SIZES or (
            array.dtype.itemsize not in _SUPPORTED_SIZES[array.dtype.kind]):
        raise DTypeMismatch(f"npy write {name!r}: dtype {array.dtype} is not supported "
                            "(only bool, int, uint and float)")
    return array


def encode_npy_header(dtype: np.dtype, shape: tuple, fortran_order: bool) -> bytes:
    """Magic, version, length and the padded header dict, as numpy writes them."""
    literal = (f"{{'descr': {dtype.str!r}, 'fortran_order': {fortran_order!r}, "
               f"'shape': {tuple(shape)!r}, }}")
    for major in (1, 2):
        prefix = _NPY_PREFIX_BYTES[major]
        padding = (-(prefix + len(literal) + 1)) % NPY_ALIGNMENT
        header = (literal + " " * padding + "\n").encode("latin1")
        if major == 2 or len(header) <= _V1_MAX_HEADER:
            break
    return (NPY_MAGIC + bytes([major, 0]) + struct.pack(_NPY_LENGTH_FORMAT[major], len(header))
            + header)


def _npy_parts(name: str, value):
    """(header bytes, data bytes view) of one array, little-endian, C or Fortran order."""
    array = _writable_array(name, value)
    little = array.dtype.newbyteorder("<") if array.dtype.itemsize > 1 else array.dtype
    array = array.astype(little, copy=False)
    # Keep Fortran-ordered input as it is (like np.save) rather than copying it to C order.
    fortran = bool(array.ndim > 1 and array.flags.f_contiguous and not array.flags.c_contiguous)
    if fortran:
        data = array.T.reshape(-1)
    else:
        data = (array if array.flags.c_contiguous else array.copy(order="C")).reshape(-1)
    header = encode_npy_header(array.dtype, array.shape, fortran)
    return header, memoryview(data.view(np.uint8))


def write_npy(value, path=None):
    """Write one array or Tensor as npy to ``path`` (returns None) or return the bytes."""
    header, data = _npy_parts("npy", value)
    if path is None:
        return header + data
    with open(os.fspath(path), "wb") as handle:
        handle.write(header)
        handle.write(data)
    return None


# --------------------------------------------------------------------------------------------
# npz


class _BufferReader(io.RawIOBase):
    """A seekable read-only file over a memoryview, for zipfile, without copying the buffer.
    ``read`` never allocates more than what is left, whatever size a lying header asks for."""

    def __init__(self, view: memoryview):
        super().__init__()
        self._view = view
        self._position = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._position, io.SEEK_END: len(self._view)}
        position = base[whence] + offset
        if position < 0:
            raise OSError(f"seek to negative position {position}")
        self._position = position
        return position

    def read(self, size: int = -1) -> bytes:
        end = len(self._view) if size is None or size < 0 else self._position + size
        chunk = bytes(self._view[self._position:end])
        self._position += len(chunk)
        return chunk

    def readinto(self, target) -> int:
        chunk = self.read(len(target))
        target[:len(chunk)] = chunk
        return len(chunk)


# zipfile's answer to versions, encryption and patch flags it does not implement.
_ZIP_FEATURE_ERRORS = (NotImplementedError, RuntimeError)
# What malformed archives make zipfile raise, besides BadZipFile.
_ZIP_ERRORS = (zipfile.BadZipFile, zipfile.LargeZipFile, zlib.error, EOFError, OSError,
               ValueError, struct.error, OverflowError, UnicodeDecodeError, KeyError,
               IndexError)


@dataclass(frozen=True)
class NpzMember:
    """One ``.npy`` member of an archive, as its central directory declares it."""

    name: str  # the key, without ".npy"
    zip_name: str
    compressed: bool
    file_size: int  # declared uncompressed size
    compress_size: int


class NpzFile:
    """A validated npz archive whose members are read one at a time on request.

    ``source``: bytes-like or a path. ``max_member_bytes`` caps the declared uncompressed size
    of any member; ``max_deflate_ratio`` caps how much a deflated member may expand once the
    archive's HIGHLY_COMPRESSED_ALLOWANCE is spent (raise it for a file known to hold large
    near-constant arrays); ``verify_crc`` checks stored members' CRC-32 (deflated ones always
    are).
    """

    def __init__(self, source, *, max_member_bytes: int = DEFAULT_MAX_MEMBER_BYTES,
                 max_deflate_ratio: float = DEFAULT_MAX_DEFLATE_RATIO, verify_crc: bool = True):
        self._buffer, self.source_name, self._mapped = _buffer_and_name(source, "npz")
        self.max_member_bytes = max_member_bytes
        self.max_deflate_ratio = max_deflate_ratio
        self.verify_crc = verify_crc
        # Bytes inflated so far from members above max_deflate_ratio (each member counted once).
        self._highly_compressed = {}
        try:
            self._zip = zipfile.ZipFile(_BufferReader(self._buffer))
            infos = self._zip.infolist()
        except _ZIP_FEATURE_ERRORS as err:
            raise UnsupportedError(f"npz {self.source_name}: zip feature not supported: "
                                   f"{err}") from None
        except _ZIP_ERRORS as err:
            raise FormatError(f"npz {self.source_name}: not a valid zip archive: "
                              f"{err}") from None
        self._members = {}
        self._infos = {}
        for info in infos:
            if not info.filename.endswith(".npy"):
                continue  # np.load exposes other members as raw bytes; we have no use for them
            key = info.filename[:-len(".npy")]
            if key in self._members:
                raise FormatError(f"npz {self.source_name}: member {info.filename!r} appears "
                                  "twice")
            self._infos[key] = info
            self._members[key] = NpzMember(key, info.filename,
                                           info.compress_type != zipfile.ZIP_STORED,
                                           info.file_size, info.compress_size)

    def keys(self) -> list:
        return sorted(self._members)

    def __iter__(self):
        return iter(self.keys())

    def __len__(self) -> int:
        return len(self._members)

    def __contains__(self, name) -> bool:
        return name in self._members

    def info(self, name: str) -> NpzMember:
        if name not in self._members:
            raise ModelNotFound(f"npz {self.source_name}: no array named {name!r} "
                                f"({len(self._members)} arrays)")
        return self._members[name]

    def _where(self, name: str) -> str:
        return f"{self.source_name} member {name + '.npy'!r}"

    def _check_declared_size(self, name: str, info: zipfile.ZipInfo) -> None:
        where = self._where(name)
        if info.flag_bits & _ZIP_ENCRYPTED_FLAG:
            raise UnsupportedError(f"npz {where}: encrypted members are not supported")
        if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            raise UnsupportedError(f"npz {where}: compression method {info.compress_type} is "
                                   "not supported (stored or deflate)")
        if info.file_size > self.max_member_bytes:
            raise FormatError(f"npz {where}: declares {info.file_size} bytes, above the cap of "
                              f"{self.max_member_bytes} (max_member_bytes)")
        if info.compress_size > len(self._buffer):
            raise FormatError(f"npz {where}: declares {info.compress_size} compressed bytes, "
                              f"more than the {len(self._buffer)}-byte archive")
        if info.compress_type == zipfile.ZIP_STORED and info.compress_size != info.file_size:
            raise FormatError(f"npz {where}: stored member declares {info.file_size} bytes but "
                              f"occupies {info.compress_size}")
        if info.file_size > info.compress_size * DEFLATE_MAX_RATIO + _DEFLATE_SLACK_BYTES:
            raise FormatError(f"npz {where}: declares {info.file_size} bytes from "
                              f"{info.compress_size} compressed, more than deflate can produce")
        if info.compress_type == zipfile.ZIP_DEFLATED \
                and info.file_size > info.compress_size * self.max_deflate_ratio:
            spent = sum(size for key, size in self._highly_compressed.items() if key != name)
            if spent + info.file_size > HIGHLY_COMPRESSED_ALLOWANCE:
                ratio = info.file_size / max(info.compress_size, 1)
                raise FormatError(
                    f"npz {where}: inflates {info.compress_size} bytes to {info.file_size} "
                    f"({ratio:.0f}x); members above {self.max_deflate_ratio:g}x may inflate "
                    f"{HIGHLY_COMPRESSED_ALLOWANCE >> 20} MiB in all per archive "
                    f"({spent} bytes already): a deflate bomb, or near-constant data; pass "
                    f"NpzFile(..., max_deflate_ratio=...) to read it")
            self._highly_compressed[name] = info.file_size

    def _stored_view(self, name: str, info: zipfile.ZipInfo) -> memoryview:
        """The bytes of a stored member, located through its local header, without copying."""
        where = self._where(name)
        data_start = zip_member_data_start(self._buffer, info)
        if data_start is None:
            raise FormatError(f"npz {where}: bad local file header at offset {info.header_offset}")
        data_end = data_start + info.file_size
        if data_end > len(self._buffer):
            raise FormatError(f"npz {where}: data [{data_start}, {data_end}) runs past the end "
                              f"of the {len(self._buffer)}-byte archive")
        view = self._buffer[data_start:data_end]
        if self.verify_crc and zlib.crc32(view) != info.CRC:
            raise FormatError(f"npz {where}: CRC-32 mismatch (corrupted data)")
        return view

    def _inflate(self, name: str, info: zipfile.ZipInfo):
        """(header, data) of a deflated member; the header is validated against the declared
        size before the data is allocated."""
        where = self._where(name)
        try:
            with self._zip.open(info) as member:
                probe_size = min(info.file_size, _NPY_PREFIX_BYTES[3] + MAX_NPY_HEADER_BYTES)
                probe = _read_exactly(member, probe_size, where)
                header = parse_npy_header(probe, where, total_bytes=info.file_size)
                data = np.empty(header.nbytes, dtype=np.uint8)
                already = probe[header.data_offset:]
                data[:len(already)] = np.frombuffer(already, dtype=np.uint8)
                _read_into(member, memoryview(data)[len(already):], where)
                if member.read(1):
                    raise FormatError(f"npz {where}: more data than declared")
        except CandleError:
            raise  # our own findings (FormatError is a ValueError) pass through unchanged
        except _ZIP_FEATURE_ERRORS as err:
            raise UnsupportedError(f"npz {where}: zip feature not supported: {err}") from None
        except _ZIP_ERRORS as err:
            raise FormatError(f"npz {where}: cannot inflate: {err}") from None
        return header, data

    def get_numpy(self, name: str) -> np.ndarray:
        info = self._infos[self.info(name).name]
        self._check_declared_size(name, info)
        if info.compress_type == zipfile.ZIP_STORED:
            view = self._stored_view(name, info)
            header = parse_npy_header(view, self._where(name))
            return _array_from_data(view[header.data_offset:], header)
        header, data = self._inflate(name, info)
        return _array_from_data(data, header)

    def get_candle_numpy(self, name: str):
        """(storage array, candle DType); see the module doc for dtype conversions."""
        return _candle_from_numpy(self.get_numpy(name), name)

    def get(self, name: str, device=None):
        storage, candle_dtype = self.get_candle_numpy(name)
        return _make_tensor(storage, candle_dtype, device)

    def close(self) -> None:
        self._zip.close()
        self._buffer.release()
        if self._mapped is not None:
            try:
                self._mapped.close()
            except BufferError:
                pass  # arrays returned earlier still view the mapping
            self._mapped = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _read_exactly(stream, size: int, where: str) -> bytes:
    chunks = []
    remaining = size
    while remaining:
        chunk = stream.read(min(remaining, _READ_CHUNK_BYTES))
        if not chunk:
            raise FormatError(f"npz {where}: member ends {remaining} bytes early")
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def _read_into(stream, target: memoryview, where: str) -> None:
    filled = 0
    while filled < len(target):
        count = stream.readinto(target[filled:filled + _READ_CHUNK_BYTES])
        if not count:
            raise FormatError(f"npz {where}: member ends {len(target) - filled} bytes early")
        filled += count


def load(source, device=None) -> dict:
    """Every array of an npz archive as candle Tensors."""
    archive = NpzFile(source)
    return {name: archive.get(name, device=device) for name in archive.keys()}


def load_numpy(source) -> dict:
    """Every array of an npz archive as numpy arrays."""
    archive = NpzFile(source)
    return {name: archive.get_numpy(name) for name in archive.keys()}


def _alignment_padding(header_offset: int, member: zipfile.ZipInfo) -> bytes:
    """An extra field that puts a stored member's array data on a 64-byte boundary of the
    archive (the npy header is itself a multiple of 64), so reading it can be zero-copy.
    np.savez does not align, so its arrays are copied on reading."""
    name_bytes = len(member.filename.encode("utf-8"))
    before_extra = header_offset + ZIP_LOCAL_HEADER.size + name_bytes
    if member.file_size * 1.05 > zipfile.ZIP64_LIMIT:
        before_extra += _ZIP64_LOCAL_EXTRA_BYTES  # zipfile appends it after our extra
    padding = (-(before_extra + _EXTRA_FIELD_HEADER.size)) % NPY_ALIGNMENT
    return _EXTRA_FIELD_HEADER.pack(_PADDING_EXTRA_ID, padding) + bytes(padding)


def save(arrays: dict, path=None, *, compressed: bool = False):
    """Write ``{name: array | Tensor}`` as npz (deflated when ``compressed``) to ``path``
    (returns None) or return the bytes. Loadable with ``np.load``."""
    target = io.BytesIO() if path is None else open(os.fspath(path), "wb")
    method = zipfile.ZIP_DEFLATED if compressed else zipfile.ZIP_STORED
    try:
        with zipfile.ZipFile(target, "w", compression=method, allowZip64=True) as archive:
            for name, value in arrays.items():
                if not isinstance(name, str):
                    raise FormatError(f"npz write: array names must be str, got {name!r}")
                header, data = _npy_parts(name, value)
                member = zipfile.ZipInfo(name + ".npy", date_time=_FIXED_ZIP_DATE)
                member.compress_type = method
                member.file_size = len(header) + len(data)  # lets zipfile pick zip64 upfront
                if not compressed:
                    member.extra = _alignment_padding(target.tell(), member)
                with archive.open(member, "w") as stream:
                    stream.write(header)
                    stream.write(data)
        return target.getvalue() if path is None else None
    finally:
        if path is not None:
            target.close()
