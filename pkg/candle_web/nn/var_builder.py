"""VarBuilder and VarMap: weights by dotted name.

`VarBuilder` resolves `vb.pp("encoder").pp("layers.0").get((d, d), "weight")` against a
source (safetensors files, an npz file, a dict of tensors, or a VarMap for training), checks
the shape, and converts dtype and device at load time. Sources are read lazily per tensor.
`VarMap` owns trainable `Var`s and saves/loads them as safetensors.
"""

from __future__ import annotations

from ..core import dtype as dt
from ..core.device import Device
from ..core.dtype import DType
from ..core.errors import ModelNotFound, ShapeMismatch
from ..core.tensor import Tensor, Var


class _DictSource:
    """Tensors (or numpy arrays, wrapped as they are) by full name."""

    def __init__(self, tensors: dict):
        self.tensors = {name: value if isinstance(value, Tensor) else Tensor.from_numpy(value)
                        for name, value in tensors.items()}

    def contains(self, name):
        return name in self.tensors

    def get(self, name):
        return self.tensors[name]

    def keys(self):
        return list(self.tensors)


class _SafeTensorsSource:
    def __init__(self, sources):
        from ..io.safetensors import SafeTensors

        if not isinstance(sources, (list, tuple)):
            sources = [sources]
        self.files = [s if isinstance(s, SafeTensors) else SafeTensors(s) for s in sources]
        self.index = {}
        for f in self.files:
            for key in f.keys():
                self.index[key] = f

    def contains(self, name):
        return name in self.index

    def get(self, name):
        return self.index[name].get(name)

    def keys(self):
        return list(self.index)


class _NpzSource:
    """An npz archive (path or bytes); members are read one at a time on request."""

    def __init__(self, source):
        from ..io.npz import NpzFile

        self.archive = source if isinstance(source, NpzFile) else NpzFile(source)

    def contains(self, name):
        return name in self.archive

    def get(self, name):
        return self.archive.get(name)

    def keys(self):
        return self.archive.keys()


class VarMap:
    """Named trainable variables, created on first `get` through a VarBuilder."""

    def __init__(self):
        self._vars = {}

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
    def __init__(self, source, dtype=dt.f32, device=None, prefix: str = ""):
        self._source = source
        self.dtype = DType.parse(dtype)
        self.device = Device.parse(device)
        self.prefix = prefix

    # -- constructors ---------------------------------------------------------------------
    @staticmethod
    def from_tensors(tensors: dict, dtype=dt.f32, device=None) -> "VarBuilder":
        return VarBuilder(_DictSource(tensors), dtype, device)

    @staticmethod
    def from_safetensors(paths, dtype=dt.f32, device=None) -> "VarBuilder":
        """One or several safetensors files (paths or bytes), read lazily."""
        return VarBuilder(_SafeTensorsSource(paths), dtype, device)

    @staticmethod
    def from_npz(path, dtype=dt.f32, device=None) -> "VarBuilder":
        return VarBuilder(_NpzSource(path), dtype, device)

    @staticmethod
    def from_varmap(varmap: VarMap, dtype=dt.f32, device=None) -> "VarBuilder":
        return VarBuilder(varmap, dtype, device)

    # -- prefixes -------------------------------------------------------------------------
    def pp(self, name) -> "VarBuilder":
        """A builder whose names are prefixed with `name.`."""
        return VarBuilder(self._source, self.dtype, self.device, self._path(str(name)))

    push_prefix = pp

    def _path(self, name: str) -> str:
        return f"{self.prefix}.{name}" if self.prefix else name

    def set_dtype(self, dtype) -> "VarBuilder":
        return VarBuilder(self._source, dtype, self.device, self.prefix)

    # -- access ---------------------------------------------------------------------------
    def contains(self, name: str) -> bool:
        if isinstance(self._source, VarMap):
            return self._path(name) in self._source.data()
        return self._source.contains(self._path(name))

    def keys(self) -> list:
        if isinstance(self._source, VarMap):
            return list(self._source.data())
        return self._source.keys()

    def get_unchecked(self, name: str) -> Tensor:
        path = self._path(name)
        if isinstance(self._source, VarMap):
            if path not in self._source.data():
                raise ModelNotFound(f"cannot find tensor {path!r}")
            return self._source.data()[path]
        if not self._source.contains(path):
            raise ModelNotFound(f"cannot find tensor {path!r} in the weights")
        return self._source.get(path).to_dtype(self.dtype).to_device(self.device)

    def get(self, shape, name: str) -> Tensor:
        """The tensor `prefix.name`, checked against `shape` and converted to the builder's
        dtype and device."""
        tensor = self.get_unchecked(name)
        if tensor.dims() != tuple(shape):
            raise ShapeMismatch(f"shape mismatch for {self._path(name)!r}: expected {list(shape)}, "
                                f"got {list(tensor.shape)} in the weights")
        return tensor

    def get_with_init(self, shape, name: str, init) -> Tensor:
        if isinstance(self._source, VarMap):
            return self._source.get_or_create(self._path(name), shape, init, self.dtype, self.device)
        return self.get(shape, name)
