"""PyTorch checkpoints (`pytorch_model.bin`, `.pt`, `.pth`), read without running them.

Two layouts, told apart by their first bytes:

- **zip** (torch >= 1.6, the default since): a stored (uncompressed) zip whose members share
  one folder name (`archive/` usually): `data.pkl` (the pickled object), `data/<key>` (one raw
  storage per key), `byteorder` ("little" or "big"; absent means little), `version`, ...
  A persistent id in the pickle is ``('storage', StorageType, key, location, numel)``.
- **legacy** (`_use_new_zipfile_serialization=False`, and every file before torch 1.6): five
  things one after another: a pickled magic number (0x1950a86a20f9469cfc6c), a pickled
  protocol version (1001), a pickled dict of system information (`little_endian`), the data
  pickle, a pickled list of storage keys, then for each key in that order an int64 element
  count and the storage's raw bytes. Its persistent ids have a sixth field: None, or
  ``(view_key, offset, size)`` for a storage that is a slice of another (very old files).

The pickle is run by io/pickle_vm.py, which builds data and never imports or calls anything
outside this allowlist: `collections.OrderedDict`, `torch._utils._rebuild_tensor_v2`,
`_rebuild_parameter`, `_rebuild_parameter_with_state` (the tensor is kept, the rest dropped),
the storage classes `torch.{Double,Float,Half,BFloat16,Long,Int,Short,Char,Byte,Bool}Storage`,
`torch.Size`, the dtype names (`torch.float16`...), `torch.device` (a string) and
`_codecs.encode` (how protocol 2 writes bytes). Each of these functions checks its arguments'
types first (a FormatError names the function, the argument and the type found). Anything
else (a class, a function, an opcode that builds objects, a persistent id that is not a
storage) is refused with a FormatError naming it; nothing from the file is imported or
executed. This is the same contract as `torch.load(weights_only=True)`, a little narrower.
Values from the pickle appear in messages through `pickle_vm.describe` (cut at 80
characters: a few bytes of pickle can make a value whose repr never ends), and tensor names
stop at MAX_NAME_CHARS characters.

*Files that pickle more than tensors* (a Lightning checkpoint with its hyper-parameters, a
`training_args.bin` holding an `argparse.Namespace`): refused, with the name of every class
and function the pickle uses. We do not skip the unknown objects to pull the tensors out:
reading such a file means trusting the objects next to the tensors, which is the question the
user should answer (`torch.load(weights_only=True)` refuses them too). whisperx's
`assets/pytorch_model.bin` (a pyannote segmentation model: omegaconf and pyannote classes) is
refused this way. TorchScript archives (`torch.jit.save`: `code/`, `constants.pkl`) hold a
program, not a state dict, and are refused as TorchScript (UnsupportedError).

Every size is checked before any tensor is read or allocated: a storage's declared element
count against its bytes (the zip member's size; the legacy count prefix and the file's end),
zip members must be stored and must not overlap, a tensor's offset, sizes and strides must be
non-negative ints that keep every element inside its storage (ranks up to 64), a storage key
declared twice must agree. Storages are read lazily: the file is mmapped natively (Pyodide
has no mmap: bytes are read, or passed, whole) and nothing of a storage is touched until one of
its tensors is asked for; zip members' CRC-32 is checked then, once per storage. A tensor
comes back as stored (`get_numpy`: bf16 as uint16 bits, the project's bf16 convention in
core/dtype.py) or as a candle Tensor (`get`: int8/16/32 widened to i64, bool to u8, as the
safetensors reader does); a view with an offset and strides is materialised as a C-ordered
copy, a contiguous one stays a view of the mapping when it is aligned (torch aligns zip
members to 64 bytes; legacy storages start anywhere and are copied); a big-endian file is
converted. Tensors saved on a GPU (`location` "cuda:0") are read on the CPU like any other.

    checkpoint = TorchCheckpoint("pytorch_model.bin")
    checkpoint.keys()                    -> the tensors' names ("a.b" for nested dicts)
    checkpoint.info(name)                -> dtype, shape, stride, storage offset and key
    checkpoint.get(name)                 -> a candle Tensor
"""

from __future__ import annotations

import collections
import struct
import zipfile
import zlib
from dataclasses import dataclass

import numpy as np

from ..core.errors import CandleError, FormatError, ModelNotFound, UnsupportedError
from .bounds import MAX_NUMPY_DIMS, nonzero_bytes, zip_member_data_start
from .npz import _ZIP_ERRORS, _ZIP_FEATURE_ERRORS, _BufferReader, _buffer_and_name
from .pickle_vm import Refused, describe, key_problem, run_pickle
from .safetensors import _make_tensor, to_candle_storage

LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
LEGACY_PROTOCOL = 1001
ZIP_MAGIC = b"PK\x03\x04"
# A legacy file's first pickle is the magic number: PROTO (protocol 2 and above, torch's
# default) or LONG as text (protocols 0 and 1).
LEGACY_FIRST_BYTES = (b"\x80", b"L")
MAX_ELEMENTS = 1 << 62  # a size, stride, offset or element count above this is a lie
MAX_NESTING = 32  # how deep tensors are looked for in nested dicts and lists
# A tensor's name (its keys joined with "."): names are copied per tensor, and a pickle can
# repeat one long key string at every level for 2 bytes a level.
MAX_NAME_CHARS = 1024


@dataclass(frozen=True)
class StorageType:
    """A torch storage class: its torch dtype name, numpy code and safetensors dtype name."""

    torch_name: str  # e.g. "FloatStorage"
    dtype: str  # the torch dtype, e.g. "float32"
    code: str  # numpy kind and size, without the byte order, e.g. "f4"
    stored: str  # the safetensors name, for to_candle_storage

    @property
    def itemsize(self) -> int:
        return int(self.code[1:])


STORAGE_TYPES = {t.torch_name: t for t in (
    StorageType("DoubleStorage", "float64", "f8", "F64"),
    StorageType("FloatStorage", "float32", "f4", "F32"),
    StorageType("HalfStorage", "float16", "f2", "F16"),
    StorageType("BFloat16Storage", "bfloat16", "u2", "BF16"),  # raw bits, see core/dtype.py
    StorageType("LongStorage", "int64", "i8", "I64"),
    StorageType("IntStorage", "int32", "i4", "I32"),
    StorageType("ShortStorage", "int16", "i2", "I16"),
    StorageType("CharStorage", "int8", "i1", "I8"),
    StorageType("ByteStorage", "uint8", "u1", "U8"),
    StorageType("BoolStorage", "bool", "b1", "BOOL"),
)}
TORCH_DTYPE_NAMES = ("float64", "double", "float32", "float", "float16", "half", "bfloat16",
                     "int64", "long", "int32", "int", "int16", "short", "int8", "uint8", "bool")


@dataclass(frozen=True)
class TorchDType:
    """A `torch.<dtype>` the pickle names (e.g. a config stored next to the weights)."""

    name: str


@dataclass
class Storage:
    """One storage as the pickle declares it; `start` (its first byte in the file buffer)
    and `checked` are filled in once its bytes are located."""

    key: str
    type: StorageType
    numel: int
    location: str
    start: int = -1
    crc: int = None  # zip members: the expected CRC-32, checked on first read
    checked: bool = False


@dataclass(frozen=True)
class StorageView:
    """A legacy storage that is `size` elements of `root` from element `offset`."""

    root: Storage
    offset: int
    size: int


@dataclass(frozen=True)
class TorchTensor:
    """A tensor as the checkpoint describes it; no data is read until it is asked for."""

    storage: Storage
    storage_offset: int  # in elements, from the start of the root storage
    shape: tuple
    stride: tuple  # in elements

    @property
    def dtype(self) -> str:
        return self.storage.type.dtype

    @property
    def numel(self) -> int:
        count = 1
        for dim in self.shape:
            count *= dim
        return count


def _checked_int(value, what: str, where: str, lowest: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise FormatError(f"{where}: {what} is a {type(value).__name__}, expected an int")
    if not lowest <= value < MAX_ELEMENTS:
        shown = value if value.bit_length() <= 128 else f"of {value.bit_length()} bits"
        raise FormatError(f"{where}: {what} {shown} is outside [{lowest}, 2**62)")
    return value


def _checked_ints(values, what: str, where: str) -> tuple:
    if not isinstance(values, (tuple, list)):
        raise FormatError(f"{where}: {what} is a {type(values).__name__}, expected a tuple")
    if len(values) > MAX_NUMPY_DIMS:
        raise FormatError(f"{where}: {what} has {len(values)} dims, more than {MAX_NUMPY_DIMS}")
    return tuple(_checked_int(v, f"{what}[{i}]", where) for i, v in enumerate(values))


class TorchCheckpoint:
    """A validated PyTorch checkpoint (path or bytes-like); tensors are read on request."""

    def __init__(self, source, *, verify_crc: bool = True):
        self._buffer, self.source_name, self._mapped = _buffer_and_name(source, "PyTorch")
        self.verify_crc = verify_crc
        self.what = f"PyTorch {self.source_name}"
        self._storages = {}  # key -> Storage
        self.little_endian = True
        try:
            head = bytes(self._buffer[:8])
            if head[:4] == ZIP_MAGIC:
                self.format = "zip"
                self._read_zip()
            elif head[:1] in LEGACY_FIRST_BYTES:
                self.format = "legacy"
                self._read_legacy()
            else:
                raise FormatError(f"{self.what}: neither a zip checkpoint (PK\\x03\\x04) nor a "
                                  f"legacy one (a pickle); starts with {head[:8]!r}")
        except CandleError:
            self.close()
            raise
        self._tensors = {}
        self._collect(self.object, "", 0, set())

    # -- the two layouts ------------------------------------------------------------------------
    def _pickle(self, data, start: int, what: str, with_globals: bool):
        return run_pickle(data, start, what=f"{self.what}: {what}",
                          globals=self._globals() if with_globals else None,
                          persistent_load=self._persistent_load if with_globals else None)

    def _read_zip(self) -> None:
        try:
            archive = zipfile.ZipFile(_BufferReader(self._buffer))
            infos = archive.infolist()
        except _ZIP_FEATURE_ERRORS as error:
            raise UnsupportedError(f"{self.what}: zip feature not supported: {error}") from None
        except _ZIP_ERRORS as error:
            raise FormatError(f"{self.what}: not a valid zip archive: {error}") from None
        members = {}
        for info in infos:
            if info.filename in members:
                raise FormatError(f"{self.what}: member {info.filename!r} appears twice")
            members[info.filename] = info
        pickles = [name for name in members if name.endswith("/data.pkl")
                   and name.count("/") == 1]
        inside = [name.split("/", 1)[1] for name in members if "/" in name]
        if any(rest.startswith("code/") or rest == "constants.pkl" for rest in inside):
            raise UnsupportedError(
                f"{self.what}: a TorchScript archive (torch.jit.save: code/ and constants.pkl "
                "hold a compiled program). candle-web reads state dicts only: save the model's "
                "state_dict() with torch.save, or export safetensors")
        if len(pickles) != 1:
            raise FormatError(f"{self.what}: expected one <folder>/data.pkl in the zip, found "
                              f"{len(pickles)} ({sorted(members)[:5]}...)")
        prefix = pickles[0][:-len("data.pkl")]
        self._members, self._prefix = members, prefix
        order = members.get(prefix + "byteorder")
        if order is not None:
            text = bytes(self._member_view(order, "byteorder", 16))
            if text not in (b"little", b"big"):
                raise FormatError(f"{self.what}: byteorder is {text[:16]!r}, expected 'little' "
                                  "or 'big'")
            self.little_endian = text == b"little"
        data = self._member_view(members[pickles[0]], "data.pkl", len(self._buffer))
        self.object, end = self._pickle(data, 0, "data.pkl", True)
        if end != len(data):
            raise FormatError(f"{self.what}: data.pkl has {len(data) - end} bytes after STOP")
        ranges = []
        for storage in self._storages.values():
            name = f"{prefix}data/{storage.key}"
            if name not in members:
                raise FormatError(f"{self.what}: storage {storage.key!r} has no member {name!r}")
            info = members[name]
            nbytes = storage.numel * storage.type.itemsize
            if info.file_size != nbytes:
                raise FormatError(f"{self.what}: storage {storage.key!r} declares "
                                  f"{storage.numel} {storage.type.dtype} elements ({nbytes} "
                                  f"bytes), its member {name!r} holds {info.file_size}")
            storage.start = self._member_start(info, name)
            storage.crc = info.CRC
            ranges.append((storage.start, storage.start + nbytes, storage.key))
        ranges.sort()
        for (_, end_a, key_a), (start_b, _, key_b) in zip(ranges, ranges[1:]):
            if start_b < end_a:
                raise FormatError(f"{self.what}: storages {key_a!r} and {key_b!r} overlap in "
                                  "the file")

    def _member_start(self, info: zipfile.ZipInfo, name: str) -> int:
        """Where a stored member's bytes start in the buffer (through its local header)."""
        if info.compress_type != zipfile.ZIP_STORED:
            raise UnsupportedError(f"{self.what}: member {name!r} is compressed (method "
                                   f"{info.compress_type}); torch writes stored members")
        if info.flag_bits & 0x1:
            raise UnsupportedError(f"{self.what}: member {name!r} is encrypted")
        data_start = zip_member_data_start(self._buffer, info)
        if data_start is None:
            raise FormatError(f"{self.what}: member {name!r}: bad local header at "
                              f"{info.header_offset}")
        if info.compress_size != info.file_size or data_start + info.file_size > len(self._buffer):
            raise FormatError(f"{self.what}: member {name!r}: {info.file_size} bytes from "
                              f"offset {data_start} run past the {len(self._buffer)}-byte file")
        return data_start

    def _member_view(self, info: zipfile.ZipInfo, what: str, limit: int) -> memoryview:
        start = self._member_start(info, what)
        view = self._buffer[start:start + min(info.file_size, limit)]
        if self.verify_crc and info.file_size <= limit and zlib.crc32(view) != info.CRC:
            raise FormatError(f"{self.what}: {what}: CRC-32 mismatch (corrupted data)")
        return view

    def _read_legacy(self) -> None:
        magic, end = self._pickle(self._buffer, 0, "magic number", False)
        if magic != LEGACY_MAGIC:
            raise FormatError(f"{self.what}: a pickle that is not a PyTorch checkpoint (its "
                              f"first value is not torch's magic number)")
        protocol, end = self._pickle(self._buffer, end, "protocol version", False)
        if protocol != LEGACY_PROTOCOL:
            raise UnsupportedError(f"{self.what}: legacy protocol version {describe(protocol)}, "
                                   f"expected {LEGACY_PROTOCOL}")
        info, end = self._pickle(self._buffer, end, "system info", False)
        if not isinstance(info, dict) or not isinstance(info.get("little_endian", True), bool):
            raise FormatError(f"{self.what}: system info is not a dict with a bool "
                              "'little_endian'")
        self.little_endian = info.get("little_endian", True)
        self.object, end = self._pickle(self._buffer, end, "data pickle", True)
        keys, end = self._pickle(self._buffer, end, "storage keys", False)
        if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
            raise FormatError(f"{self.what}: the storage keys are not a list of strings")
        if len(set(keys)) != len(keys):
            raise FormatError(f"{self.what}: a storage key is listed twice")
        missing = set(self._storages) - set(keys)
        if missing:
            raise FormatError(f"{self.what}: storages {sorted(missing)[:5]} have no data")
        count_format = "<q" if self.little_endian else ">q"
        for key in keys:
            storage = self._storages.get(key)
            if storage is None:
                raise FormatError(f"{self.what}: storage key {key!r} is listed but no tensor "
                                  "declares it")
            head = bytes(self._buffer[end:end + 8])
            if len(head) != 8:
                raise FormatError(f"{self.what}: storage {key!r}: the file ends at byte {end}")
            (count,) = struct.unpack(count_format, head)
            if count != storage.numel:
                raise FormatError(f"{self.what}: storage {key!r} declares {storage.numel} "
                                  f"elements, its data holds {count}")
            storage.start = end + 8
            end = storage.start + count * storage.type.itemsize
            if end > len(self._buffer):
                raise FormatError(f"{self.what}: storage {key!r} ({count} "
                                  f"{storage.type.dtype}) runs past the end of the "
                                  f"{len(self._buffer)}-byte file")

    # -- what the pickle may use -------------------------------------------------------------
    def _globals(self) -> dict:
        allowed = {
            "collections.OrderedDict": _ordered_dict,
            "torch._utils._rebuild_tensor_v2": self._rebuild_tensor,
            "torch._utils._rebuild_parameter":
                _parameter_rebuilder("torch._utils._rebuild_parameter"),
            "torch._utils._rebuild_parameter_with_state":
                _parameter_rebuilder("torch._utils._rebuild_parameter_with_state"),
            "torch.Size": _size,
            "torch.device": _device,
            "_codecs.encode": _encode,
        }
        for name, storage_type in STORAGE_TYPES.items():
            allowed[f"torch.{name}"] = storage_type
        for name in TORCH_DTYPE_NAMES:
            allowed[f"torch.{name}"] = TorchDType(name)
        return allowed

    def _persistent_load(self, pid):
        where = f"{self.what}: persistent id"
        if not isinstance(pid, tuple) or not pid or pid[0] != "storage":
            head = pid[0] if isinstance(pid, tuple) and pid else type(pid).__name__
            raise FormatError(f"{where} {describe(head)} is refused: only ('storage', ...) ids "
                              "are read")
        if len(pid) > 1 and isinstance(pid[1], Refused):
            return Refused(pid[1].name)  # named with the other refused globals at the end
        expected = 6 if self.format == "legacy" else 5
        if len(pid) != expected:
            raise FormatError(f"{where}: a storage id has {len(pid)} fields, the {self.format} "
                              f"format has {expected}")
        storage_type, key, location, numel = pid[1:5]
        if not isinstance(storage_type, StorageType):
            raise FormatError(f"{where}: {describe(storage_type)} is not a storage type")
        if not isinstance(key, str) or not isinstance(location, str):
            raise FormatError(f"{where}: key and location must be strings")
        named = describe(key)  # a key may be a long string, referred to by many ids
        numel = _checked_int(numel, f"storage {named} size", where)
        if numel * storage_type.itemsize >= MAX_ELEMENTS:
            raise FormatError(f"{where}: storage {named} claims {numel} elements")
        storage = self._storages.get(key)
        if storage is None:
            storage = self._storages[key] = Storage(key, storage_type, numel, location)
        elif (storage.type, storage.numel) != (storage_type, numel):
            raise FormatError(f"{where}: storage {named} is declared twice, as {storage.numel} "
                              f"{storage.type.dtype} and as {numel} {storage_type.dtype}")
        view = pid[5] if expected == 6 else None
        if view is None:
            return storage
        if not isinstance(view, tuple) or len(view) != 3:
            raise FormatError(f"{where}: storage {named} has a view field that is not "
                              "(key, offset, size)")
        offset = _checked_int(view[1], "view offset", where)
        size = _checked_int(view[2], "view size", where)
        if offset + size > numel:
            raise FormatError(f"{where}: a view of {size} elements from {offset} does not fit "
                              f"storage {named} of {numel}")
        return StorageView(storage, offset, size)

    def _rebuild_tensor(self, storage, storage_offset, size, stride, requires_grad=False,
                        backward_hooks=None, metadata=None):
        where = f"{self.what}: tensor"
        function = "torch._utils._rebuild_tensor_v2"
        _argument(function, 5, "requires_grad", requires_grad, (bool,), "a bool")
        _argument(function, 6, "backward_hooks", backward_hooks, OPTIONAL_DICT, "a dict")
        _argument(function, 7, "metadata", metadata, OPTIONAL_DICT, "a dict")
        if isinstance(storage, Refused):
            return Refused(storage.name)
        base, limit = 0, None
        if isinstance(storage, StorageView):
            base, limit, storage = storage.offset, storage.size, storage.root
        if not isinstance(storage, Storage):
            raise FormatError(f"{where}: its storage is a {type(storage).__name__}")
        limit = storage.numel if limit is None else limit
        offset = _checked_int(storage_offset, "storage offset", where)
        shape = _checked_ints(size, "size", where)
        strides = _checked_ints(stride, "stride", where)
        if len(shape) != len(strides):
            raise FormatError(f"{where}: size {list(shape)} and stride {list(strides)} differ "
                              "in rank")
        if nonzero_bytes(shape, storage.type.itemsize, MAX_ELEMENTS - 1) is None:
            raise FormatError(f"{where}: size {list(shape)} is too large")
        if 0 in shape:
            last = offset  # an empty tensor only needs its offset inside the storage
        else:
            last = offset + sum((dim - 1) * step for dim, step in zip(shape, strides)) + 1
        if last > limit:
            raise FormatError(f"{where}: size {list(shape)}, stride {list(strides)} at offset "
                              f"{offset} reaches element {last}, past the {limit} elements of "
                              f"storage {describe(storage.key)}")
        return TorchTensor(storage, base + offset, shape, strides)

    # -- the tensors ---------------------------------------------------------------------------
    def _collect(self, value, name: str, depth: int, seen: set) -> None:
        """Every tensor in nested dicts, lists and tuples, named by its keys joined with '.'."""
        if isinstance(value, TorchTensor):
            self._tensors.setdefault(name, value)
            return
        if not isinstance(value, (dict, list, tuple)) or id(value) in seen:
            return
        if depth >= MAX_NESTING:
            raise FormatError(f"{self.what}: containers nested more than {MAX_NESTING} deep")
        seen.add(id(value))
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for key, item in items:
            if isinstance(key, (str, int)) and not isinstance(key, bool):
                inner = f"{name}.{key}" if name else str(key)
                if len(inner) > MAX_NAME_CHARS:
                    raise FormatError(f"{self.what}: a tensor name of more than "
                                      f"{MAX_NAME_CHARS} characters: {describe(inner)}")
                self._collect(item, inner, depth + 1, seen)

    def keys(self) -> list:
        return list(self._tensors)

    def __contains__(self, name) -> bool:
        return name in self._tensors

    def __len__(self) -> int:
        return len(self._tensors)

    def info(self, name: str) -> TorchTensor:
        if name not in self._tensors:
            raise ModelNotFound(f"{self.what}: no tensor named {name!r} ({len(self._tensors)} "
                                "tensors)")
        return self._tensors[name]

    def _storage_array(self, storage: Storage) -> np.ndarray:
        order = "|" if storage.type.itemsize == 1 else ("<" if self.little_endian else ">")
        nbytes = storage.numel * storage.type.itemsize
        view = self._buffer[storage.start:storage.start + nbytes]
        if self.verify_crc and storage.crc is not None and not storage.checked:
            if zlib.crc32(view) != storage.crc:
                raise FormatError(f"{self.what}: storage {storage.key!r}: CRC-32 mismatch "
                                  "(corrupted data)")
        storage.checked = True
        return np.frombuffer(view, dtype=np.dtype(order + storage.type.code))

    def get_numpy(self, name: str) -> np.ndarray:
        """The tensor's values as stored (bf16: uint16 bits), native byte order; a view of the
        file when the tensor is contiguous and aligned (zip storages are), else a C-ordered
        copy."""
        tensor = self.info(name)
        stored = self._storage_array(tensor.storage)
        native = stored.dtype.newbyteorder("=")
        if tensor.numel == 0:
            return np.zeros(tensor.shape, dtype=native)
        item = stored.dtype.itemsize
        array = np.lib.stride_tricks.as_strided(
            stored[tensor.storage_offset:], shape=tensor.shape,
            strides=tuple(step * item for step in tensor.stride), writeable=False)
        if not array.flags.c_contiguous or not array.flags.aligned:
            # A legacy file's storages start wherever the pickles end: an unaligned view would
            # take numpy's (and the kernels') slow and differently-rounding paths.
            array = np.array(array, order="C")
        return array.astype(native, copy=False)

    def get(self, name: str, device=None):
        """The tensor as a candle Tensor (dtypes as the module doc says)."""
        storage, candle_dtype = to_candle_storage(self.get_numpy(name),
                                                  self.info(name).storage.type.stored, name)
        return _make_tensor(storage, candle_dtype, device)

    def close(self) -> None:
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


def _argument(function: str, position: int, label: str, value, types: tuple, expected: str):
    """`value` if it is one of `types` (a bool only where `types` names bool), else a
    FormatError naming the function, the argument and the type found. The allowlisted
    functions check their arguments before using them: a pickle can pass any value it built."""
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
        raise FormatError(f"{function}: argument {position} ({label}) is a "
                          f"{type(value).__name__}, expected {expected}")
    return value


OPTIONAL_DICT = (dict, type(None))


def _ordered_dict(items=()):
    """`collections.OrderedDict(pairs)` for the keys the pickle interpreter allows."""
    _argument("collections.OrderedDict", 1, "items", items, (dict, list, tuple),
              "a dict or a list of (key, value) pairs")
    if isinstance(items, dict):
        items = list(items.items())
    for pair in items:
        if not isinstance(pair, tuple) or len(pair) != 2:
            raise FormatError("collections.OrderedDict: argument 1 (items) holds something "
                              "other than (key, value) pairs")
        problem = key_problem(pair[0])
        if problem:
            raise FormatError(f"OrderedDict: {problem}")
    return collections.OrderedDict(items)


def _parameter_rebuilder(function: str):
    """`torch._utils._rebuild_parameter(_with_state)`: a Parameter's tensor; its gradient
    flag, hooks and attributes mean nothing here and are dropped (once their types are
    checked)."""
    def rebuild(data, requires_grad=False, backward_hooks=None, state=None):
        _argument(function, 1, "data", data, (TorchTensor, Refused), "a tensor")
        _argument(function, 2, "requires_grad", requires_grad, (bool,), "a bool")
        _argument(function, 3, "backward_hooks", backward_hooks, OPTIONAL_DICT, "a dict")
        _argument(function, 4, "state", state, (dict, tuple, type(None)), "a dict or a tuple")
        return data
    return rebuild


def _size(dims=()):
    _argument("torch.Size", 1, "sizes", dims, (tuple, list), "a tuple of ints")
    for dim in dims:
        if not isinstance(dim, int) or isinstance(dim, bool):
            raise FormatError(f"torch.Size: argument 1 (sizes) holds a {type(dim).__name__}, "
                              "expected ints")
    return tuple(dims)


def _device(kind, index=None):
    """`torch.device("cuda:0")` or `torch.device("cuda", 0)`: the device's name."""
    _argument("torch.device", 1, "type", kind, (str,), "a str")
    _argument("torch.device", 2, "index", index, (int, type(None)), "an int")
    return kind if index is None else f"{kind}:{index}"


def _encode(text, encoding="utf-8"):
    """`_codecs.encode`, which protocol 2 uses to write bytes: only text to latin-1 bytes."""
    _argument("_codecs.encode", 1, "obj", text, (str,), "a str")
    _argument("_codecs.encode", 2, "encoding", encoding, (str,), "a str")
    if encoding not in ("latin1", "latin-1"):
        raise FormatError(f"_codecs.encode is read only as (str, 'latin1'), not with encoding "
                          f"{describe(encoding)}")
    return text.encode("latin-1")


def is_pytorch_checkpoint(head: bytes) -> bool:
    """Whether the first bytes look like a torch.save file: a zip, or the start of the legacy
    layout's first pickle (whose magic number the reader then checks). A CTranslate2
    model.bin starts with a small version number instead."""
    return head[:4] == ZIP_MAGIC or head[:1] in LEGACY_FIRST_BYTES


def load(source, device=None) -> dict:
    """Every tensor of a checkpoint as candle Tensors, by name."""
    checkpoint = TorchCheckpoint(source)
    return {name: checkpoint.get(name, device=device) for name in checkpoint.keys()}


def load_numpy(source) -> dict:
    """Every tensor of a checkpoint as numpy arrays (as stored), by name."""
    checkpoint = TorchCheckpoint(source)
    return {name: checkpoint.get_numpy(name) for name in checkpoint.keys()}


__all__ = ["TorchCheckpoint", "TorchTensor", "StorageType", "STORAGE_TYPES",
           "is_pytorch_checkpoint", "load", "load_numpy"]
