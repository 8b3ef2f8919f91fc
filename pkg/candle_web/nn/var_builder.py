"""VarBuilder and VarMap: weights by dotted name.

`VarBuilder` resolves `vb.pp("encoder").pp("layers.0").get((d, d), "weight")` against a
weights source (io/weights.py: safetensors files, GGUF, a CTranslate2 model.bin, an npz file,
a dict of tensors, a model's name table over any of them, or a VarMap for training), checks the
shape, and converts dtype and device at load time. `vb.matrix((out, in), "weight")` gives a
linear layer that keeps GGML blocks packed or decodes them at load, as the builder's `mode`
says (quantized/qmatmul.py). Sources are read lazily per tensor.
`VarMap` owns trainable `Var`s and saves/loads them as safetensors.
"""

from __future__ import annotations

from ..core import dtype as dt
from ..core.device import Device
from ..core.dtype import DType
from ..core.errors import ModelNotFound, ShapeMismatch
from ..core.tensor import Tensor, Var
from ..io.weights import DictWeights, NpzWeights, SafetensorsWeights, Weights


class VarMap(Weights):
    """Named trainable variables, created on first `get_with_init` through a VarBuilder. As a
    weights source it hands out the Vars themselves (no dtype or device conversion)."""

    label = "the VarMap"

    def __init__(self):
        self._vars = {}

    def names(self) -> list:
        return list(self._vars)

    def has(self, name: str) -> bool:
        return name in self._vars

    def shape(self, name: str) -> tuple:
        return self._vars[name].dims()

    def tensor(self, name: str, shape=None, dtype=None, device=None) -> Var:
        self._check(name, shape)
        return self._vars[name]

    def all_vars(self) -> list:
        return list(self._vars.values())

    def data(self) -> dict:
        return self._vars

    def get_or_create(self, name, shape, init, dtype, device) -> Var:
        existing = self._vars.get(name)
        if existing is not None:
            if existing.dims() != tuple(shape):
                raise ShapeMismatch(f"VarMap: {name!r} exists with shape {list(existing.shape)}, "
                                    f"requested {list(shape)}")
            return existing
        var = Var.from_tensor(init.make(tuple(shape), dtype, device))
        self._vars[name] = var
        return var

    def save(self, path) -> None:
        from ..io.safetensors import save

        save({name: var.detach() for name, var in self._vars.items()}, path)

    def load(self, path) -> None:
        """Set every existing var from a safetensors file (shapes must match)."""
        from ..io.safetensors import SafeTensors

        # Read into memory rather than mmap: the vars would otherwise view the mapping, and a
        # later `save` to the same path truncates the file under them (SIGBUS on access).
        st = SafeTensors(path, use_mmap=False)
        for name, var in self._vars.items():
            if name not in st:
                raise ModelNotFound(f"VarMap.load: {name!r} missing from {path}")
            value = st.get(name)
            if value.dims() != var.dims():
                raise ShapeMismatch(f"VarMap.load: {name!r} is {list(value.shape)} in {path}, "
                                    f"the var is {list(var.shape)}")
            var.set(value.to_dtype(var.dtype).to_device(var.device))


class VarBuilder:
    def __init__(self, source: Weights, dtype=dt.f32, device=None, prefix: str = "",
                 mode: str = "auto"):
        self._source = source
        self.dtype = DType.parse(dtype)
        self.device = Device.parse(device)
        self.prefix = prefix
        self.mode = mode  # how `matrix` treats GGML blocks: auto, dequantize or quantized

    # -- constructors ---------------------------------------------------------------------
    @staticmethod
    def from_tensors(tensors: dict, dtype=dt.f32, device=None) -> "VarBuilder":
        return VarBuilder(DictWeights(tensors), dtype, device)

    @staticmethod
    def from_safetensors(paths, dtype=dt.f32, device=None) -> "VarBuilder":
        """One or several safetensors files (paths or bytes), read lazily."""
        return VarBuilder(SafetensorsWeights(paths), dtype, device)

    @staticmethod
    def from_npz(path, dtype=dt.f32, device=None) -> "VarBuilder":
        return VarBuilder(NpzWeights(path), dtype, device)

    @staticmethod
    def from_varmap(varmap: VarMap, dtype=dt.f32, device=None) -> "VarBuilder":
        return VarBuilder(varmap, dtype, device)

    # -- prefixes -------------------------------------------------------------------------
    def pp(self, name) -> "VarBuilder":
        """A builder whose names are prefixed with `name.`."""
        return VarBuilder(self._source, self.dtype, self.device, self._path(str(name)), self.mode)

    push_prefix = pp

    def _path(self, name: str) -> str:
        return f"{self.prefix}.{name}" if self.prefix else name

    def set_dtype(self, dtype) -> "VarBuilder":
        return VarBuilder(self._source, dtype, self.device, self.prefix, self.mode)

    def set_mode(self, mode: str) -> "VarBuilder":
        return VarBuilder(self._source, self.dtype, self.device, self.prefix, mode)

    # -- access ---------------------------------------------------------------------------
    def contains(self, name: str) -> bool:
        return self._source.has(self._path(name))

    has = contains

    def keys(self) -> list:
        return self._source.names()

    def shape(self, name: str) -> tuple:
        """The stored shape of `prefix.name`, without reading it."""
        path = self._path(name)
        if not self._source.has(path):
            raise ModelNotFound(f"cannot find tensor {path!r} in {self._source.label}")
        return tuple(self._source.shape(path))

    def get_unchecked(self, name: str) -> Tensor:
        return self._source.tensor(self._path(name), None, self.dtype, self.device)

    def get(self, shape, name: str) -> Tensor:
        """The tensor `prefix.name`, checked against `shape` and converted to the builder's
        dtype and device."""
        return self._source.tensor(self._path(name), tuple(shape), self.dtype, self.device)

    def get_with_init(self, shape, name: str, init) -> Tensor:
        if isinstance(self._source, VarMap):
            return self._source.get_or_create(self._path(name), shape, init, self.dtype, self.device)
        return self.get(shape, name)

    def matrix(self, shape, name: str):
        """The linear weight `prefix.name` [out, in] as a layer (QMatMul for inference)."""
        return self.fused_matrix([(shape, name)])

    def fused_matrix(self, parts):
        """Several weights [(shape, name), ...] that multiply the same input, stacked row-wise
        into one layer: one matmul instead of several."""
        return self._source.matrix([(self._path(name), tuple(shape)) for shape, name in parts],
                                   self.device, self.mode)

    def tied_matrix(self, tensor: Tensor):
        """The layer over an already-loaded [out, in] tensor (a head tied to an embedding)."""
        return self._source.tied_matrix(tensor)
