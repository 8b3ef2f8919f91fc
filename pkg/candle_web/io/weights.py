"""Weights by name, whatever the file: the one protocol every model loads through.

    weights = open_weights("model.safetensors")   # a path, a list of shards, bytes, a dict...
    weights.has(name)                             -> bool
    weights.shape(name)                           -> the stored shape, no data read
    weights.tensor(name, shape=None, dtype=f32, device=None)
        -> a float Tensor, checked against `shape` before any data is read; GGML blocks are
           decoded, CTranslate2 integers widened (dtype=None: as stored)
    weights.matrix([(name, shape), ...], device=None, mode="auto")
        -> a QMatMul over the weights stacked row-wise (one matmul for a fused projection);
           GGML blocks stay packed or are decoded at load as `mode` says (quantized/qmatmul.py)
    weights.tied_matrix(tensor)                   -> the layer over an already-loaded tensor
                                                     (a head tied to the embedding)
    weights.names()                               -> every name it has

Sources: SafetensorsWeights (one file or several shards), GgufWeights, Ct2Weights (a
CTranslate2 model.bin), PytorchWeights (torch.save checkpoints, read without unpickling:
io/pytorch.py), NpzWeights and DictWeights (numpy arrays, Tensors or QTensors, e.g. for
tests and benchmarks). A missing name raises ModelNotFound (FormatError for a model.bin, where
a missing variable means a broken file) and a wrong shape ShapeMismatch, both naming the tensor
as the file calls it.

A model asks by its own names (its modules' attribute paths, e.g. `blocks.3.attn.q.weight`)
through `WeightNames`: a table kept next to the model with, per checkpoint naming ("hf" for
Hugging Face, "gguf" for llama.cpp, "ct2" for CTranslate2), what that naming calls each weight.
`names.view(weights)` picks the naming the file uses and is itself a source. A table entry is a
name (with `{i}` for the layer number), `FirstOf(a, b)` (the first name the file has),
`RowSlice(name, index, count)` (row slice `index` of `count` equal ones: a fused tensor split) or
None (the naming has no such weight; the model decides, e.g. a zero bias).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..core import dtype as dt
from ..core.device import Device
from ..core.errors import FormatError, ModelNotFound, ShapeMismatch
from ..core.tensor import Tensor
from ..quantized.qmatmul import QMatMul
from ..quantized.qtensor import QTensor
from .files import check_regular_file

GGUF_MAGIC = b"GGUF"


class Weights:
    """The protocol and what all sources share. A source implements `names`, `has`, `shape`
    and `_read(name)` (a Tensor or a float32 numpy array); a source whose weights may be GGML
    blocks also `_blocks(name)` (the QTensor, or None)."""

    label = "the weights"  # how messages name the source, e.g. "safetensors model.safetensors"

    def names(self) -> list:
        raise NotImplementedError

    def has(self, name: str) -> bool:
        raise NotImplementedError

    def shape(self, name: str) -> tuple:
        raise NotImplementedError

    def _read(self, name: str):
        raise NotImplementedError

    def _blocks(self, name: str):
        return None

    # -- errors, in each format's words ---------------------------------------------------
    def _missing(self, name: str) -> Exception:
        return ModelNotFound(f"cannot find tensor {name!r} in {self.label}")

    def _wrong_shape(self, name: str, expected: tuple, got: tuple) -> Exception:
        return ShapeMismatch(f"shape mismatch for {name!r}: expected {list(expected)}, got "
                             f"{list(got)} in {self.label}")

    def _check(self, name: str, shape) -> None:
        if not self.has(name):
            raise self._missing(name)
        if shape is not None and tuple(self.shape(name)) != tuple(shape):
            raise self._wrong_shape(name, tuple(shape), tuple(self.shape(name)))

    # -- the protocol -----------------------------------------------------------------------
    def tensor(self, name: str, shape=None, dtype=dt.f32, device=None) -> Tensor:
        self._check(name, shape)
        device = Device.parse(device)
        blocks = self._blocks(name)
        if blocks is not None:
            values = np.ascontiguousarray(blocks.dequantize().reshape(blocks.shape), np.float32)
            value = Tensor.from_numpy(values, dt.f32, device)
        else:
            value = self._read(name)
            if isinstance(value, np.ndarray):
                value = Tensor.from_numpy(value, device=device)
        if dtype is not None:
            value = value.to_dtype(dtype)
        return value.to_device(device)

    def matrix(self, parts, device=None, mode: str = "auto") -> QMatMul:
        """parts: [(name, (rows, cols)), ...], stacked row-wise into one layer."""
        parts = list(parts)
        for name, shape in parts:
            self._check(name, shape)
        device = Device.parse(device)
        blocks = [self._blocks(name) for name, _ in parts]
        if all(block is not None for block in blocks):
            return QMatMul.fused(blocks, device, mode)
        tensors = [self.tensor(name, shape, dt.f32, device) for name, shape in parts]
        return QMatMul.from_tensor(tensors[0] if len(tensors) == 1 else Tensor.cat(tensors, 0))

    def tied_matrix(self, tensor: Tensor):
        return QMatMul.from_tensor(tensor)


# -- sources --------------------------------------------------------------------------------
class _FilesWeights(Weights):
    """Several files of one format (shards) as one namespace; each tensor is read on request.
    A subclass names the format (`kind`) and how a file opens (`_open`: a path or bytes ->
    an object with keys(), source_name and get(name))."""

    kind = "?"

    def __init__(self, sources):
        if not isinstance(sources, (list, tuple)):
            sources = [sources]
        self.files = [self._open(source) for source in sources]
        self.index = {}
        for file in self.files:
            for key in file.keys():
                self.index[key] = file
        names = [file.source_name for file in self.files]
        self.label = (f"{self.kind} {names[0]}" if len(names) == 1
                      else f"{len(names)} {self.kind} files")

    @staticmethod
    def _open(source):
        raise NotImplementedError

    def names(self) -> list:
        return list(self.index)

    def has(self, name: str) -> bool:
        return name in self.index

    def shape(self, name: str) -> tuple:
        return tuple(self.index[name].info(name).shape)

    def _read(self, name: str) -> Tensor:
        return self.index[name].get(name)


class SafetensorsWeights(_FilesWeights):
    """One or several safetensors files (paths, bytes or SafeTensors) as one namespace; each
    tensor is read on request (a view of the file's mapping until converted)."""

    kind = "safetensors"

    @staticmethod
    def _open(source):
        from .safetensors import SafeTensors

        return source if isinstance(source, SafeTensors) else SafeTensors(source)


class NpzWeights(Weights):
    """An npz archive (path or bytes); members are read one at a time on request."""

    def __init__(self, source):
        from .npz import NpzFile

        self.archive = source if isinstance(source, NpzFile) else NpzFile(source)
        self.label = f"npz {self.archive.source_name}"
        self._last = (None, None)  # a member's shape is in its data: read once for both

    def names(self) -> list:
        return self.archive.keys()

    def has(self, name: str) -> bool:
        return name in self.archive

    def shape(self, name: str) -> tuple:
        return self._read(name).dims()

    def _read(self, name: str) -> Tensor:
        if self._last[0] != name:
            self._last = (name, self.archive.get(name))
        return self._last[1]


class DictWeights(Weights):
    """Tensors, numpy arrays (wrapped as they are) or QTensors (GGML blocks) by name."""

    label = "the weights"

    def __init__(self, tensors: dict):
        self.tensors = {}
        for name, value in tensors.items():
            kept = isinstance(value, (Tensor, QTensor))
            self.tensors[name] = value if kept else Tensor.from_numpy(value)

    def names(self) -> list:
        return list(self.tensors)

    def has(self, name: str) -> bool:
        return name in self.tensors

    def shape(self, name: str) -> tuple:
        value = self.tensors[name]
        return tuple(value.shape) if isinstance(value, QTensor) else value.dims()

    def _read(self, name: str) -> Tensor:
        return self.tensors[name]

    def _blocks(self, name: str):
        value = self.tensors.get(name)
        return value if isinstance(value, QTensor) else None


class GgufWeights(Weights):
    """A GGUF file (path, bytes or GgufFile): matrices may stay GGML blocks, everything else
    is decoded to f32. `gguf` (the parsed file, its metadata) is there for configs."""

    def __init__(self, source):
        from .gguf import GgufFile

        self.gguf = source if isinstance(source, GgufFile) else GgufFile(source)
        self.label = f"GGUF {self.gguf.source}"

    def names(self) -> list:
        return list(self.gguf.tensors)

    def has(self, name: str) -> bool:
        return name in self.gguf.tensors

    def shape(self, name: str) -> tuple:
        return tuple(self.gguf.tensors[name].shape)

    def _blocks(self, name: str) -> QTensor:
        return self.gguf.qtensor(name)

    def _missing(self, name: str) -> Exception:
        return ModelNotFound(f"{self.label}: missing tensor {name!r}")

    def _wrong_shape(self, name: str, expected: tuple, got: tuple) -> Exception:
        return ShapeMismatch(f"{self.label}: tensor {name!r} has shape {list(got)}, the config "
                             f"implies {list(expected)}")


class Ct2Weights(Weights):
    """A CTranslate2 model.bin (path, bytes or Ct2Model); variables widened to float32 (f16
    and bf16 exactly). `ct2` (the parsed file, its scalars) is there for configs."""

    def __init__(self, source, label: str = None):
        from .ct2 import Ct2Model, read_ct2

        self.ct2 = source if isinstance(source, Ct2Model) else read_ct2(source)
        self.path = source if isinstance(source, (str, Path)) else None  # None: bytes, a Ct2Model
        self.label = label or (f"CTranslate2 model {source}" if self.path else "CTranslate2 model")

    def names(self) -> list:
        return list(self.ct2.variables) + list(self.ct2.aliases)

    def has(self, name: str) -> bool:
        return name in self.ct2

    def shape(self, name: str) -> tuple:
        return tuple(self.ct2[name].shape)

    def _read(self, name: str) -> np.ndarray:
        return np.ascontiguousarray(self.ct2.get_f32(name), dtype=np.float32)

    def _missing(self, name: str) -> Exception:
        return FormatError(f"{self.label}: missing variable {name!r}")

    def _wrong_shape(self, name: str, expected: tuple, got: tuple) -> Exception:
        return ShapeMismatch(f"{self.label}: variable {name!r} has shape {list(got)}, the "
                             f"model's config implies {list(expected)}")


class PytorchWeights(_FilesWeights):
    """One or several PyTorch checkpoints (`pytorch_model.bin`, `.pt`, `.pth`: paths, bytes or
    TorchCheckpoint) as one namespace, read without running their pickles (io/pytorch.py);
    each tensor is read on request."""

    kind = "PyTorch checkpoint"

    @staticmethod
    def _open(source):
        from .pytorch import TorchCheckpoint

        return source if isinstance(source, TorchCheckpoint) else TorchCheckpoint(source)


PYTORCH_SUFFIXES = (".bin", ".pt", ".pth")


def _is_pytorch_file(path) -> bool:
    from .pytorch import is_pytorch_checkpoint

    try:
        with open(path, "rb") as handle:
            return is_pytorch_checkpoint(handle.read(16))
    except OSError:
        return False  # the reader that is picked names the missing file


CT2_FILE = "model.bin"


def _is_pytorch(name: str) -> bool:
    lower = name.lower()
    return ((lower.startswith("pytorch_model") and lower.endswith(".bin"))
            or lower.endswith((".pt", ".pth")))


def weights_files(names, label: str) -> tuple:
    """(format, [file names]): which of a model's files (`names`) hold its weights, in order of
    preference: *.safetensors (all shards), the one .gguf, a CTranslate2 model.bin, PyTorch
    checkpoints (pytorch_model*.bin, or one .pt/.pth). ModelNotFound, naming `label`, when
    none (or several .gguf) are there. io/checkpoint.py opens what this picks."""
    names = sorted(names)
    shards = [name for name in names if name.endswith(".safetensors")]
    if shards:
        return "safetensors", shards
    ggufs = [name for name in names if name.endswith(".gguf")]
    if len(ggufs) > 1:
        raise ModelNotFound(f"{label}: expected exactly one .gguf file, found {len(ggufs)}: "
                            f"{', '.join(ggufs)}")
    if ggufs:
        return "gguf", ggufs
    if CT2_FILE in names:
        return "ct2", [CT2_FILE]
    pytorch = [name for name in names if _is_pytorch(name)]
    if pytorch and (len(pytorch) == 1 or all(name.startswith("pytorch_model") for name in pytorch)):
        return "pytorch", pytorch
    found = ", ".join(names[:20]) or "no files"
    raise ModelNotFound(f"{label}: no weights: expected *.safetensors, one .gguf, a CTranslate2 "
                        f"{CT2_FILE} or a PyTorch checkpoint (found {found})")


def folder_weights(folder):
    """The weights of an HF model folder, as `open_weights` takes them, chosen by
    weights_files: its *.safetensors (preferred when both exist), else its PyTorch
    checkpoint(s) (pytorch_model*.bin, or one .pt/.pth); None when it has neither."""
    folder = Path(folder)
    names = [path.name for path in folder.iterdir() if path.is_file()] if folder.is_dir() else []
    try:
        kind, files = weights_files(names, str(folder))
    except ModelNotFound:
        return None
    paths = [str(folder / name) for name in files]
    if kind == "safetensors":
        return paths
    return PytorchWeights(paths) if kind == "pytorch" else None


def open_weights(source) -> Weights:
    """A Weights source for `source`: one already; a dict (DictWeights); a list of paths
    (safetensors shards); a path by its suffix (.safetensors, .gguf, .npz, .bin for a
    CTranslate2 model.bin); bytes by their first bytes (GGUF or safetensors); or a parsed
    SafeTensors, GgufFile, NpzFile or Ct2Model. A PyTorch checkpoint (.pt, .pth, or a .bin
    whose first bytes are torch.save's: zip or legacy pickle) gives PytorchWeights; a list of
    them too."""
    from .ct2 import Ct2Model
    from .gguf import GgufFile
    from .npz import NpzFile
    from .safetensors import SafeTensors

    if isinstance(source, Weights):
        return source
    if isinstance(source, dict):
        return DictWeights(source)
    # Before anything opens a path (the PyTorch sniff reads its first bytes): /dev/zero, a
    # FIFO or a folder are refused here, naming the path, instead of hanging a reader.
    for path in (source if isinstance(source, (list, tuple)) else (source,)):
        if isinstance(path, (str, os.PathLike)) and os.path.exists(path):
            check_regular_file(path, "a weights file")
    if isinstance(source, (list, tuple)) and source and all(
            isinstance(s, (str, os.PathLike)) and Path(s).suffix.lower() in PYTORCH_SUFFIXES
            for s in source):
        return PytorchWeights(list(source))
    if isinstance(source, (list, tuple, SafeTensors)):
        return SafetensorsWeights(source)
    if isinstance(source, GgufFile):
        return GgufWeights(source)
    if isinstance(source, Ct2Model):
        return Ct2Weights(source)
    if isinstance(source, NpzFile):
        return NpzWeights(source)
    if isinstance(source, (str, os.PathLike)):
        suffix = Path(source).suffix.lower()
        if suffix in PYTORCH_SUFFIXES and (suffix != ".bin" or _is_pytorch_file(source)):
            return PytorchWeights(source)
        kinds = {".safetensors": SafetensorsWeights, ".gguf": GgufWeights, ".npz": NpzWeights,
                 ".bin": Ct2Weights}
        if suffix not in kinds:
            raise FormatError(f"{source}: cannot tell the weights format from the suffix "
                              f"{suffix!r}; expected one of {sorted(kinds)}")
        return kinds[suffix](source)
    try:
        head = bytes(memoryview(source)[:9])
    except TypeError:
        raise FormatError(f"weights: cannot read a {type(source).__name__}; pass a path, bytes, "
                          "a dict of tensors or a Weights source") from None
    if head[:4] == GGUF_MAGIC:
        return GgufWeights(source)
    if head[8:9] == b"{":  # safetensors: an 8-byte header length, then the JSON header
        return SafetensorsWeights(source)
    from .pytorch import is_pytorch_checkpoint

    if is_pytorch_checkpoint(bytes(memoryview(source)[:16])):
        return PytorchWeights(source)
    raise FormatError("weights: these bytes are neither GGUF nor safetensors, nor a PyTorch "
                      "checkpoint; pass a CTranslate2 model.bin as io.weights.Ct2Weights(data)")


# -- a model's own names --------------------------------------------------------------------
@dataclass(frozen=True)
class RowSlice:
    """Row slice `index` of `count` equal slices of a stored tensor (a fused tensor split)."""
    name: str
    index: int
    count: int


class FirstOf:
    """The first of several names that the file has (exports that differ in one name)."""

    def __init__(self, *names: str):
        self.names = names

    def format(self, **fields) -> "FirstOf":
        return FirstOf(*(name.format(**fields) for name in self.names))


LAYER_FIELD = "{i}"


def _pattern(name: str) -> re.Pattern:
    """`name` with its `{i}` (at most one) matching a layer number."""
    before, field, after = name.partition(LAYER_FIELD)
    if not field:
        return re.compile(re.escape(name) + r"\Z")
    return re.compile(re.escape(before) + r"(?P<i>\d+)" + re.escape(after) + r"\Z")


def _plain_names(entry) -> tuple:
    """The names an entry may store a weight under as one plain tensor."""
    if isinstance(entry, FirstOf):
        return entry.names
    return (entry,) if isinstance(entry, str) else ()


class WeightNames:
    """A model's weight names and, per checkpoint naming, what that naming calls each one.

    namings: e.g. ("hf", "gguf"); rows: model name -> one entry per naming (see the module
    doc); marker: the model name whose presence tells which naming a file uses."""

    def __init__(self, namings: tuple, rows: dict, marker: str):
        self.namings = tuple(namings)
        for model_name, entries in rows.items():
            if len(entries) != len(self.namings):
                raise ValueError(f"WeightNames: {model_name!r} has {len(entries)} entries for "
                                 f"{len(self.namings)} namings")
        self.rows = dict(rows)
        self.marker = marker
        self._patterns = [(_pattern(model_name), entries)
                          for model_name, entries in self.rows.items()]
        # Per naming: (pattern of a stored name, the model name it is) for the way back.
        self._reverse = [[(_pattern(name), model_name) for model_name, entries in self.rows.items()
                          for name in _plain_names(entries[column])]
                         for column in range(len(self.namings))]

    def entry(self, model_name: str, naming: str):
        """What `naming` calls `model_name`: a name, FirstOf, RowSlice or None."""
        column = self.namings.index(naming)
        for pattern, entries in self._patterns:
            match = pattern.match(model_name)
            if match is not None:
                entry = entries[column]
                fields = match.groupdict()
                if entry is None or not fields:
                    return entry
                if isinstance(entry, RowSlice):
                    return RowSlice(entry.name.format(**fields), entry.index, entry.count)
                return entry.format(**fields)
        raise ModelNotFound(f"{model_name!r} is not one of the model's weight names")

    def model_name(self, name: str, naming: str):
        """The model's name for a tensor that `naming` stores as `name`, or None."""
        for pattern, model_name in self._reverse[self.namings.index(naming)]:
            match = pattern.match(name)
            if match is not None:
                return model_name.replace(LAYER_FIELD, match.groupdict().get("i") or "")
        return None

    def translate(self, name: str, source: str, target: str) -> str:
        """A checkpoint name in naming `source` -> the same weight's name in `target` (for
        weights both namings store as one plain tensor)."""
        model_name = self.model_name(name, source)
        if model_name is None:
            raise ModelNotFound(f"{name!r} is not a {source} weight name of this model")
        names = _plain_names(self.entry(model_name, target))
        if not names:
            raise ModelNotFound(f"{name!r} has no single-tensor counterpart in {target} naming")
        return names[0]

    def naming_of(self, weights: Weights):
        """The naming `weights` uses (declared by the source, or found from the marker), or None."""
        declared = getattr(weights, "naming", None)
        if declared is not None:
            return declared
        for naming in self.namings:
            if any(weights.has(name) for name in _plain_names(self.entry(self.marker, naming))):
                return naming
        return None

    def view(self, weights: Weights, naming: str, prefix: str = "") -> "NamedWeights":
        return NamedWeights(weights, self, naming, prefix)


class NamedWeights(Weights):
    """A source seen through a WeightNames table: asked by the model's names, it reads the
    file's (with `prefix` before each, e.g. "bert." for BertForMaskedLM exports)."""

    def __init__(self, inner: Weights, names: WeightNames, naming: str, prefix: str = ""):
        if naming not in names.namings:
            raise ValueError(f"unknown naming {naming!r}; the table has {names.namings}")
        self.inner, self.table, self.naming, self.prefix = inner, names, naming, prefix
        self.label = inner.label
        self._last_fused = (None, None)

    def _stored(self, model_name: str):
        entry = self.table.entry(model_name, self.naming)
        if isinstance(entry, FirstOf):
            present = [name for name in entry.names if self.inner.has(self.prefix + name)]
            entry = present[0] if present else entry.names[0]
        if isinstance(entry, RowSlice):
            return RowSlice(self.prefix + entry.name, entry.index, entry.count)
        return None if entry is None else self.prefix + entry

    def _absent(self, model_name: str) -> Exception:
        return ModelNotFound(f"{self.label}: {self.naming} checkpoints have no {model_name!r}")

    def names(self) -> list:
        """The model names of the file's plain tensors (fused or split ones are left out)."""
        found = []
        for stored in self.inner.names():
            if stored.startswith(self.prefix):
                name = self.table.model_name(stored[len(self.prefix):], self.naming)
                if name is not None:
                    found.append(name)
        return found

    def has(self, name: str) -> bool:
        stored = self._stored(name)
        if isinstance(stored, RowSlice):
            return self.inner.has(stored.name)
        return stored is not None and self.inner.has(stored)

    def shape(self, name: str) -> tuple:
        stored = self._stored(name)
        if isinstance(stored, RowSlice):
            full = self.inner.shape(stored.name)
            return (full[0] // stored.count,) + tuple(full[1:])
        return self.inner.shape(stored)

    def tensor(self, name: str, shape=None, dtype=dt.f32, device=None) -> Tensor:
        stored = self._stored(name)
        if stored is None:
            raise self._absent(name)
        if not isinstance(stored, RowSlice):
            return self.inner.tensor(stored, shape, dtype, device)
        full_shape = None
        if shape is not None:
            full_shape = (shape[0] * stored.count,) + tuple(shape[1:])
        # The parts of one fused tensor are asked for one after another: read it once for all.
        key = (stored.name, full_shape, dtype, Device.parse(device))
        if self._last_fused[0] != key:
            self._last_fused = (key, self.inner.tensor(stored.name, full_shape, dtype, device))
        full = self._last_fused[1]
        rows = full.dims()[0] // stored.count
        return full.narrow(0, stored.index * rows, rows)

    def matrix(self, parts, device=None, mode: str = "auto") -> QMatMul:
        stored = [(self._stored(name), shape) for name, shape in parts]
        for (name, _), (entry, _) in zip(parts, stored):
            if entry is None:
                raise self._absent(name)
        if any(isinstance(entry, RowSlice) for entry, _ in stored):
            tensors = [self.tensor(name, shape, dt.f32, device) for name, shape in parts]
            return QMatMul.from_tensor(tensors[0] if len(tensors) == 1 else Tensor.cat(tensors, 0))
        return self.inner.matrix(stored, device, mode)

    def tied_matrix(self, tensor: Tensor):
        return self.inner.tied_matrix(tensor)


__all__ = ["Weights", "SafetensorsWeights", "GgufWeights", "Ct2Weights", "NpzWeights",
           "DictWeights", "PytorchWeights", "folder_weights", "weights_files", "NamedWeights",
           "WeightNames", "FirstOf", "RowSlice", "open_weights"]
