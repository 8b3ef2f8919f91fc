"""TensorFlow.js weights: a `*-weights_manifest.json` and the `.bin` shards it names.

The manifest is a JSON list of weight groups, each ``{"paths": [shard, ...], "weights": [entry,
...]}``. A group's shards, concatenated in the order listed, hold its weights back to back in
the order of its entries, with no header and no padding. An entry is ``{"name", "shape",
"dtype"}`` and, when the weights were quantized on export, ``"quantization": {"dtype", "scale",
"min"}``:

    stored dtype   bytes/value   read as
    float32        4             float32 (little-endian)
    int32          4             int32
    uint8 / uint16 1 / 2         float32 ``q * scale + min``; int32 ``round(q * scale + min)``
    float16        2             float32 (exact)

(TensorFlow.js computes ``q * scale + min`` in double precision and stores it in a Float32Array;
so do we.) Other dtypes (bool, string, complex64) are refused with UnsupportedError naming the
weight.

Every number in the manifest is checked before a byte is read: the JSON is capped at
MAX_MANIFEST_BYTES and may not repeat a key, a shape's rank is capped at numpy's 64 dims and its
byte count at 2**63 (bounds.nonzero_bytes stops multiplying at the first overflow), scale and min
must be finite numbers, names must be unique, shard paths must stay inside the manifest's folder,
and the bytes a group's weights need must equal its shards' total size exactly (the file sizes are
compared before the shards are read). A failure is a FormatError naming the manifest, the weight
and the field.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass

import numpy as np

from ..core.errors import FormatError, ModelNotFound, UnsupportedError
from .bounds import MAX_ARRAY_BYTES, MAX_NUMPY_DIMS, nonzero_bytes
# The same JSON strictness as safetensors headers: no repeated key, no NaN/Infinity.
from .safetensors import _is_int, _refuse_duplicate_keys, _refuse_json_constant

MAX_MANIFEST_BYTES = 16 * 1024 * 1024  # the largest real manifest here is 28 KB
MANIFEST_SUFFIX = "-weights_manifest.json"

# stored dtype -> (bytes per value, the numpy dtype of the stored values)
_PLAIN = {"float32": (4, np.dtype("<f4")), "int32": (4, np.dtype("<i4"))}
_QUANTIZED = {"uint8": (1, np.dtype("u1")), "uint16": (2, np.dtype("<u2")),
              "float16": (2, np.dtype("<f2"))}
_REFUSED_DTYPES = ("bool", "string", "complex64")


@dataclass(frozen=True)
class Quantization:
    """How a weight was quantized on export; scale and min are None for float16."""

    dtype: str
    scale: float | None
    min: float | None


@dataclass(frozen=True)
class WeightInfo:
    """One weight: where it lives in its group's concatenated shards, and how to decode it."""

    name: str
    shape: tuple
    dtype: str  # what the weight is once decoded: float32 or int32
    quantization: Quantization | None
    group: int
    offset: int  # bytes from the start of the group's concatenated shards
    nbytes: int


def _fail(source: str, message: str) -> FormatError:
    return FormatError(f"tfjs manifest {source}: {message}")


def _is_finite_number(value) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))


def _checked_shard_path(source: str, group: int, path) -> str:
    """A shard path as the manifest names it, refused when it could leave the manifest's
    folder (absolute, drive letters, '..', backslashes) or is not a plain non-empty string."""
    where = f"group {group} field 'paths'"
    if not isinstance(path, str) or not path or len(path) > 1024:
        raise _fail(source, f"{where}: expected a non-empty file name, got {path!r:.80}")
    parts = path.split("/")
    if (path.startswith("/") or "\\" in path or ":" in path or "\x00" in path
            or any(part in ("", ".", "..") for part in parts)):
        raise _fail(source, f"{where}: {path!r:.80} is not a relative path inside the "
                            f"manifest's folder")
    return path


def _parse_quantization(source: str, name: str, raw) -> Quantization:
    where = f"weight {name!r} field 'quantization'"
    if not isinstance(raw, dict):
        raise _fail(source, f"{where}: expected an object, got {type(raw).__name__}")
    kind = raw.get("dtype")
    if not isinstance(kind, str) or kind not in _QUANTIZED:
        raise _fail(source, f"{where}.dtype: {kind!r:.40} is not one of "
                            f"{', '.join(_QUANTIZED)}")
    if kind == "float16":
        return Quantization(kind, None, None)
    for field in ("scale", "min"):
        if not _is_finite_number(raw.get(field)):
            raise _fail(source, f"{where}.{field}: expected a finite number, got "
                                f"{raw.get(field)!r:.40}")
    return Quantization(kind, float(raw["scale"]), float(raw["min"]))


def _parse_weight(source: str, group: int, offset: int, raw) -> WeightInfo:
    if not isinstance(raw, dict):
        raise _fail(source, f"group {group} field 'weights': expected objects, got "
                            f"{type(raw).__name__}")
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise _fail(source, f"group {group}: weight field 'name': expected a non-empty string, "
                            f"got {name!r:.80}")
    dtype = raw.get("dtype")
    if dtype in _REFUSED_DTYPES:
        raise UnsupportedError(f"tfjs manifest {source}: weight {name!r} has dtype {dtype}; "
                               f"only float32 and int32 weights are read")
    if not isinstance(dtype, str) or dtype not in _PLAIN:
        raise _fail(source, f"weight {name!r} field 'dtype': {dtype!r:.40} is not a "
                            f"TensorFlow.js dtype")
    shape = raw.get("shape")
    if (not isinstance(shape, list) or len(shape) > MAX_NUMPY_DIMS
            or not all(_is_int(dim) and dim >= 0 for dim in shape)):
        raise _fail(source, f"weight {name!r} field 'shape': expected at most {MAX_NUMPY_DIMS} "
                            f"non-negative integers, got {str(shape)[:80]}")
    quantization = None
    if raw.get("quantization") is not None:
        quantization = _parse_quantization(source, name, raw["quantization"])
        if quantization.dtype == "float16" and dtype != "float32":
            raise _fail(source, f"weight {name!r} field 'quantization.dtype': float16 only "
                                f"quantizes float32 weights, not {dtype}")
    item_bytes = (_QUANTIZED[quantization.dtype] if quantization else _PLAIN[dtype])[0]
    nbytes = nonzero_bytes(shape, item_bytes, MAX_ARRAY_BYTES)
    if nbytes is None:
        raise _fail(source, f"weight {name!r} field 'shape': {str(shape)[:80]} overflows "
                            f"(more than 2**63 bytes)")
    if 0 in shape:
        nbytes = 0
    return WeightInfo(name, tuple(shape), dtype, quantization, group, offset, nbytes)


def parse_manifest(data: bytes, source: str = "<bytes>") -> tuple[list, list]:
    """(shard paths per group, WeightInfo list) from a manifest's bytes, every field checked.
    Sizes against the shards are checked by the reader (TfjsWeights)."""
    if len(data) > MAX_MANIFEST_BYTES:
        raise _fail(source, f"{len(data)} bytes is more than the {MAX_MANIFEST_BYTES} a "
                            f"manifest may have")
    try:
        groups = json.loads(bytes(data).decode("utf-8"), object_pairs_hook=_refuse_duplicate_keys,
                            parse_constant=_refuse_json_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as error:
        raise _fail(source, f"not valid JSON: {error}") from None
    if not isinstance(groups, list) or not groups:
        raise _fail(source, "expected a non-empty JSON list of weight groups")
    paths, weights, names = [], [], set()
    for index, group in enumerate(groups):
        if not isinstance(group, dict):
            raise _fail(source, f"group {index}: expected an object, got {type(group).__name__}")
        group_paths = group.get("paths")
        if not isinstance(group_paths, list) or not group_paths:
            raise _fail(source, f"group {index} field 'paths': expected a non-empty list")
        paths.append([_checked_shard_path(source, index, path) for path in group_paths])
        entries = group.get("weights")
        if not isinstance(entries, list):
            raise _fail(source, f"group {index} field 'weights': expected a list")
        offset = 0
        for raw in entries:
            info = _parse_weight(source, index, offset, raw)
            if info.name in names:
                raise _fail(source, f"weight {info.name!r} is named twice")
            names.add(info.name)
            weights.append(info)
            offset += info.nbytes
            if offset > MAX_ARRAY_BYTES:
                raise _fail(source, f"group {index}: weights up to {info.name!r} need more "
                                    f"than 2**63 bytes")
    return paths, weights


def _decode(info: WeightInfo, raw: memoryview) -> np.ndarray:
    if info.quantization is None:
        stored = _PLAIN[info.dtype][1]
        return np.frombuffer(raw, dtype=stored).astype(stored.newbyteorder("="), copy=True) \
            .reshape(info.shape)
    stored = _QUANTIZED[info.quantization.dtype][1]
    values = np.frombuffer(raw, dtype=stored)
    if info.quantization.dtype == "float16":
        return values.astype(np.float32).reshape(info.shape)
    # In double precision, then one rounding, as TensorFlow.js fills its typed array.
    real = values.astype(np.float64) * info.quantization.scale + info.quantization.min
    if info.dtype == "int32":
        # JavaScript's Math.round: halves go up (np.round would go to even).
        real = np.floor(real + 0.5)
        if real.size and (real.min() < -2**31 or real.max() >= 2**31):
            raise FormatError(f"tfjs weight {info.name!r}: dequantized values leave int32 "
                              f"(scale {info.quantization.scale}, min {info.quantization.min})")
        return real.astype(np.int32).reshape(info.shape)
    return real.astype(np.float32).reshape(info.shape)


def _check_group_size(source, index, paths, sizes, weights) -> None:
    """A group's shards must hold exactly the bytes its weights need: fewer would be read past,
    more means the manifest does not describe the file."""
    needed = sum(info.nbytes for info in weights if info.group == index)
    if sum(sizes) != needed:
        raise _fail(source, f"group {index}: the weights need {needed} bytes but the shards "
                            f"{', '.join(paths)} hold {sum(sizes)}")


class TfjsWeights:
    """The weights of one TensorFlow.js model, decoded on request: ``names``, ``info(name)``,
    ``get_numpy(name)`` (float32 or int32 array) and ``get(name)`` (a Tensor)."""

    def __init__(self, manifest: bytes, shards, source: str = "<bytes>"):
        """`shards`: the group's shard bytes by the path the manifest names (a mapping)."""
        self.source = source
        paths, weights = parse_manifest(manifest, source)
        self._weights = {info.name: info for info in weights}
        self._buffers = []
        for index, group_paths in enumerate(paths):
            missing = [path for path in group_paths if path not in shards]
            if missing:
                raise ModelNotFound(f"tfjs manifest {source}: group {index} names shard "
                                    f"{missing[0]!r}, which is not given")
            sizes = [len(shards[path]) for path in group_paths]
            _check_group_size(source, index, group_paths, sizes, weights)
            self._buffers.append(memoryview(b"".join(bytes(shards[path]) for path in group_paths)))

    @classmethod
    def load(cls, manifest_path: str | os.PathLike) -> "TfjsWeights":
        """Read a manifest and its shards from disk; the shards' sizes are checked against what
        the manifest needs before any of them is read."""
        manifest_path = os.fspath(manifest_path)
        try:
            size = os.path.getsize(manifest_path)
        except OSError as error:
            raise ModelNotFound(f"tfjs manifest {manifest_path}: {error.strerror}") from None
        if size > MAX_MANIFEST_BYTES:
            raise _fail(manifest_path, f"{size} bytes is more than the {MAX_MANIFEST_BYTES} a "
                                       f"manifest may have")
        with open(manifest_path, "rb") as file:
            manifest = file.read()
        paths, weights = parse_manifest(manifest, manifest_path)
        folder = os.path.dirname(manifest_path)
        shards = {}
        for index, group_paths in enumerate(paths):
            files = [os.path.join(folder, *path.split("/")) for path in group_paths]
            try:
                sizes = [os.path.getsize(file) for file in files]
            except OSError as error:
                raise ModelNotFound(f"tfjs manifest {manifest_path}: group {index} shard "
                                    f"{error.filename}: {error.strerror}") from None
            _check_group_size(manifest_path, index, group_paths, sizes, weights)
            for path, file in zip(group_paths, files):
                with open(file, "rb") as handle:
                    shards[path] = handle.read()
        return cls(manifest, shards, manifest_path)

    @property
    def names(self) -> list:
        return list(self._weights)

    def __contains__(self, name) -> bool:
        return name in self._weights

    def info(self, name: str) -> WeightInfo:
        try:
            return self._weights[name]
        except KeyError:
            raise ModelNotFound(f"tfjs manifest {self.source}: no weight named {name!r}") from None

    def get_numpy(self, name: str) -> np.ndarray:
        info = self.info(name)
        raw = self._buffers[info.group][info.offset:info.offset + info.nbytes]
        return _decode(info, raw)

    def get(self, name: str, device=None):
        from ..core.tensor import Tensor

        return Tensor.from_numpy(self.get_numpy(name), device=device)

    def get_shaped(self, name: str, shape: tuple, model: str) -> np.ndarray:
        """The weight as get_numpy gives it, refused with a FormatError naming `model` and the
        weight unless it is there with `shape`."""
        if name not in self._weights:
            raise FormatError(f"{model}: weight {name!r} is missing from {self.source}")
        value = self.get_numpy(name)
        if value.shape != tuple(shape):
            raise FormatError(f"{model}: weight {name!r} has shape {list(value.shape)}, "
                              f"expected {list(shape)}")
        return value

    def conv_kernel(self, name: str, shape: tuple, model: str) -> np.ndarray:
        """A TensorFlow [kh, kw, in, out] convolution kernel of `shape` as [out, in, kh, kw]
        (conv2d's layout; a depthwise [kh, kw, channels, 1] kernel becomes [1, channels, kh,
        kw]: swap its first two axes for a grouped conv2d)."""
        return np.ascontiguousarray(self.get_shaped(name, shape, model).transpose(3, 2, 0, 1))

    def channel_bias(self, name: str, channels: int, model: str) -> np.ndarray:
        """A per-channel bias as [1, channels, 1, 1], to add to [batch, channels, h, w]."""
        return self.get_shaped(name, (channels,), model).reshape(1, -1, 1, 1)
