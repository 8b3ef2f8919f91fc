"""`Tensor`: an immutable handle on a backend array, a `DType` and a `Device`.

The API follows Candle's `Tensor`: same-shape operators (`a + b` with different shapes is an
error naming both shapes), explicit `broadcast_*` ops, `narrow`, `i(...)`, `_keepdim`
reductions, batched `matmul`. Views stay views: transpose/narrow/reshape of contiguous data
cost nothing, and `contiguous()` copies only when needed.

Shape ops live in `tensor_shape.py`, maths and indexing in `tensor_math.py`; this file holds
construction, conversion and printing.
"""

from __future__ import annotations

import numpy as np

from . import dtype as dt
from .autograd import backward as _backward
from .device import Device
from .dtype import DType
from .errors import CandleError, DeviceMismatch, DTypeMismatch, ShapeError, ShapeMismatch
from .shape import Shape
from .tensor_math import MathOps
from .tensor_shape import ShapeOps

_generators = {}
# Ops with a `broadcast_` twin, named in same-shape mismatch messages.
_BROADCASTABLE_OPS = frozenset(("add", "sub", "mul", "div", "maximum", "minimum", "eq", "ne",
                                "lt", "le", "gt", "ge"))


def manual_seed(seed: int, device=None) -> None:
    """Seed the generator behind `rand`/`randn` for a device (Candle's `Device::set_seed`)."""
    _generators[Device.parse(device)] = np.random.default_rng(seed)


def _generator(device):
    if device not in _generators:
        _generators[device] = np.random.default_rng()
    return _generators[device]


class Tensor(ShapeOps, MathOps):
    __slots__ = ("_data", "dtype", "device", "_track", "_node", "__weakref__")

    def __init__(self, data, dtype=None, device=None):
        """Build from nested lists, scalars or numpy arrays (Candle's `Tensor::new`)."""
        if isinstance(data, Tensor):
            if dtype is None:
                dtype = data.dtype
                data = data.storage_numpy()
            else:
                data = data.to_numpy()
        try:
            arr = np.asarray(data)
        except ValueError as e:  # ragged nested lists
            raise ShapeError(f"Tensor.new: nested lists must be rectangular ({e})") from None
        from_python = not isinstance(data, (np.ndarray, np.generic))  # np.float64 is a float
        if dtype is None and from_python and arr.dtype == np.float64:
            dtype = dt.f32  # Python float literals default to f32, like Candle and PyTorch
        built = Tensor.from_numpy(arr, dtype, device)
        self._data = built._data
        self.dtype = built.dtype
        self.device = built.device
        self._track = False
        self._node = None

    # -- construction -------------------------------------------------------------------
    @staticmethod
    def _wrap(data, dtype: DType, device: Device) -> "Tensor":
        """Internal fast path: wrap a backend array already in `dtype`'s storage format."""
        t = object.__new__(Tensor)
        t._data = data
        t.dtype = dtype
        t.device = device
        t._track = False
        t._node = None
        return t

    @staticmethod
    def new(data, device=None, dtype=None) -> "Tensor":
        return Tensor(data, dtype=dtype, device=device)

    @staticmethod
    def from_numpy(arr, dtype=None, device=None) -> "Tensor":
        """Wrap a numpy array. Python floats default to f32 and ints to i64 like Candle's
        literals; pass dtype=bf16 with a uint16 array of raw bits."""
        arr = np.asarray(arr)
        device = Device.parse(device)
        if dtype is None:
            target = dt.from_numpy_dtype(arr.dtype)
        else:
            target = DType.parse(dtype)
        return Tensor._wrap(device.backend.from_numpy(_storage_for(arr, target)), target, device)

    @staticmethod
    def zeros(shape, dtype=dt.f32, device=None) -> "Tensor":
        device, dtype = Device.parse(device), DType.parse(dtype)
        return Tensor._wrap(device.backend.zeros(tuple(Shape(shape)), dtype.np_storage), dtype, device)

    @staticmethod
    def ones(shape, dtype=dt.f32, device=None) -> "Tensor":
        return Tensor.full(1, shape, dtype, device)

    @staticmethod
    def full(value, shape, dtype=dt.f32, device=None) -> "Tensor":
        device, dtype = Device.parse(device), DType.parse(dtype)
        if dtype is dt.bf16:
            value = int(dt.f32_to_bf16_bits(np.float32(value)))
        return Tensor._wrap(device.backend.full(tuple(Shape(shape)), value, dtype.np_storage), dtype, device)

    def zeros_like(self) -> "Tensor":
        return Tensor.zeros(self.shape, self.dtype, self.device)

    def ones_like(self) -> "Tensor":
        return Tensor.ones(self.shape, self.dtype, self.device)

    def full_like(self, value) -> "Tensor":
        return Tensor.full(value, self.shape, self.dtype, self.device)

    @staticmethod
    def arange(start, end, dtype=None, device=None) -> "Tensor":
        return Tensor.arange_step(start, end, 1, dtype, device)

    @staticmethod
    def arange_step(start, end, step, dtype=None, device=None) -> "Tensor":
        if step == 0:
            raise CandleError("arange_step: step must not be zero")
        if dtype is None:
            is_int = all(isinstance(v, (int, np.integer)) for v in (start, end, step))
            dtype = dt.i64 if is_int else dt.f32
        dtype = DType.parse(dtype)
        device = Device.parse(device)
        compute = np.float32 if dtype in (dt.f16, dt.bf16) else dtype.np_storage
        data = device.backend.arange(start, end, step, compute)
        return Tensor._wrap(data, compute_dtype(dtype), device).to_dtype(dtype)

    @staticmethod
    def eye(n: int, dtype=dt.f32, device=None) -> "Tensor":
        return Tensor.from_numpy(np.eye(n, dtype=np.float64), dtype, device)

    @staticmethod
    def tril2(n: int, dtype=dt.f32, device=None) -> "Tensor":
        """Lower-triangular n x n matrix of ones (Candle's `Tensor::tril2`)."""
        return Tensor.from_numpy(np.tril(np.ones((n, n))), dtype, device)

    @staticmethod
    def triu2(n: int, dtype=dt.f32, device=None) -> "Tensor":
        return Tensor.from_numpy(np.triu(np.ones((n, n))), dtype, device)

    @staticmethod
    def rand(lo, up, shape, dtype=dt.f32, device=None, generator=None) -> "Tensor":
        """Uniform in [lo, up); seeded through `manual_seed` or an explicit numpy Generator."""
        device = Device.parse(device)
        rng = generator if generator is not None else _generator(device)
        return Tensor.from_numpy(rng.uniform(lo, up, size=tuple(Shape(shape))), dtype, device)

    @staticmethod
    def randn(mean, std, shape, dtype=dt.f32, device=None, generator=None) -> "Tensor":
        device = Device.parse(device)
        rng = generator if generator is not None else _generator(device)
        return Tensor.from_numpy(rng.normal(mean, std, size=tuple(Shape(shape))), dtype, device)

    # -- properties ---------------------------------------------------------------------
    @property
    def shape(self) -> Shape:
        return Shape._trusted(self._data.shape)

    def dims(self) -> tuple:
        return tuple(self._data.shape)

    def dim(self, d: int) -> int:
        from .shape import resolve_dim

        return self._data.shape[resolve_dim(d, self._data.ndim, "dim")]

    @property
    def rank(self) -> int:
        return self._data.ndim

    def elem_count(self) -> int:
        return int(self._data.size)

    def dims0(self):
        return self.shape.dims0()

    def dims1(self):
        return self.shape.dims1()

    def dims2(self):
        return self.shape.dims2()

    def dims3(self):
        return self.shape.dims3()

    def dims4(self):
        return self.shape.dims4()

    def is_contiguous(self) -> bool:
        return self.device.backend.is_contiguous(self._data)

    @property
    def backend(self):
        return self.device.backend

    # -- autograd -----------------------------------------------------------------------
    def track_op(self) -> bool:
        return self._track

    def is_variable(self) -> bool:
        return self._track and self._node is None

    def backward(self):
        """Gradients of this (usually scalar) tensor w.r.t. every tracked tensor: a GradStore."""
        return _backward(self)

    def detach(self) -> "Tensor":
        return Tensor._wrap(self._data, self.dtype, self.device)

    # -- conversion -------------------------------------------------------------------------
    def to_dtype(self, dtype) -> "Tensor":
        from .autograd import record

        dtype = DType.parse(dtype)
        if dtype is self.dtype:
            return self
        backend = self.device.backend
        src = self.dtype
        data = self._data
        if src is dt.bf16:
            data = backend.xp.left_shift(data.astype(backend.xp.uint32), 16).view(backend.xp.float32)
            src = dt.f32
        if dtype is dt.bf16:
            host = dt.f32_to_bf16_bits(backend.to_numpy(backend.cast(data, np.float32)))
            out = Tensor._wrap(backend.from_numpy(host), dtype, self.device)
        else:
            out = Tensor._wrap(backend.cast(data, dtype.np_storage), dtype, self.device)
        source_dtype = self.dtype
        if dtype.is_float and source_dtype.is_float:
            return record(out, (self,), lambda g: (g.to_dtype(source_dtype),))
        return out

    def to_device(self, device) -> "Tensor":
        device = Device.parse(device)
        if device == self.device:
            if device is Device.cpu() or device.backend is self.device.backend:
                return self
            # A backend pinned on the same device (Device.cpu(backend=...)): the array is
            # shared, only the kernels later ops run through change. Returning self here kept
            # safetensors weights on the default backend under a pinned-numpy model.
            return Tensor._wrap(self._data, self.dtype, device)
        host = self.device.backend.to_numpy(self._data)
        return Tensor._wrap(device.backend.from_numpy(host), self.dtype, device)

    def storage_numpy(self) -> np.ndarray:
        """The values as stored, C-contiguous on the host (uint16 bits for bf16)."""
        host = self.device.backend.to_numpy(self._data)
        # Not np.ascontiguousarray: it turns a rank-0 array into shape (1,).
        return host if host.flags.c_contiguous else host.copy(order="C")

    def to_numpy(self) -> np.ndarray:
        """A host numpy array; bf16 is widened to float32 (numpy has no bfloat16)."""
        host = self.storage_numpy()
        if self.dtype is dt.bf16:
            return dt.bf16_bits_to_f32(host)
        return host

    def to_list(self):
        return self.to_numpy().tolist()

    to_vec = to_list

    def to_scalar(self):
        if self.rank != 0:
            raise ShapeError(f"to_scalar: expected a rank-0 tensor, got shape {list(self.shape)}")
        return self.to_numpy().item()

    def __array__(self, dtype=None, copy=None):
        arr = self.to_numpy()
        return arr if dtype is None else arr.astype(dtype)

    def __float__(self):
        return float(self.to_scalar())

    def __int__(self):
        return int(self.to_scalar())

    def __len__(self):
        if self.rank == 0:
            raise CandleError("len() of a rank-0 tensor")
        return self._data.shape[0]

    def __bool__(self):
        raise CandleError("the truth value of a Tensor is ambiguous; use to_scalar()")

    # -- printing like Candle -------------------------------------------------------------
    def __repr__(self) -> str:
        from .tensor_display import format_tensor

        return format_tensor(self.to_numpy(), self.dtype.name, self.dtype.is_float)

    __str__ = __repr__

    # -- raw storage, for kernels and caches outside the core -----------------------------
    def storage(self):
        """The backend array as stored, without a copy: numpy or cupy, f16 as float16, bf16 as
        uint16 bits. Writing into it changes the tensor (for in-place buffers like KV caches)."""
        return self._data

    @staticmethod
    def from_storage(array, dtype, device) -> "Tensor":
        """A tensor over a backend array already in `dtype`'s storage format (no copy, no
        check beyond the dtype's storage type): the inverse of `storage()`."""
        dtype = DType.parse(dtype)
        if array.dtype != dtype.np_storage:
            raise DTypeMismatch(f"Tensor.from_storage: a {dtype.name} tensor is stored as "
                                f"{np.dtype(dtype.np_storage).name}, got {array.dtype}")
        return Tensor._wrap(array, dtype, Device.parse(device))

    # -- internals shared by the op mixins ------------------------------------------------
    def _compute(self):
        """The backend array in a compute dtype: f16/bf16 widened to f32, others as stored."""
        if self.dtype is dt.f16:
            return self._data.astype(self.device.backend.xp.float32)
        if self.dtype is dt.bf16:
            xp = self.device.backend.xp
            return xp.left_shift(self._data.astype(xp.uint32), 16).view(xp.float32)
        return self._data

    def _from_compute(self, data, dtype=None) -> "Tensor":
        """Wrap a compute result, narrowing back to `dtype` (default: self's dtype)."""
        dtype = self.dtype if dtype is None else dtype
        if dtype is dt.f16:
            data = data.astype(self.device.backend.xp.float16)
        elif dtype is dt.bf16:
            backend = self.device.backend
            data = backend.from_numpy(dt.f32_to_bf16_bits(backend.to_numpy(data)))
        return Tensor._wrap(data, dtype, self.device)

    def _check_device(self, other: "Tensor", op: str) -> None:
        if not isinstance(other, Tensor):
            raise CandleError(f"{op}: expected a Tensor, got {type(other).__name__}")
        if self.device is not other.device and not self.device.same_device(other.device):
            raise DeviceMismatch(f"{op}: device mismatch, lhs {self.device} rhs {other.device}")

    def _check_same(self, other: "Tensor", op: str, same_shape: bool = True) -> None:
        if not isinstance(other, Tensor):
            raise CandleError(f"{op}: expected a Tensor, got {type(other).__name__}")
        if other.dtype is not self.dtype:
            raise DTypeMismatch(f"{op}: dtype mismatch, lhs {self.dtype.name} rhs {other.dtype.name}")
        if self.device is not other.device and not self.device.same_device(other.device):
            raise DeviceMismatch(f"{op}: device mismatch, lhs {self.device} rhs {other.device}")
        if same_shape and self._data.shape != other._data.shape:
            hint = f" (use broadcast_{op} to broadcast)" if op in _BROADCASTABLE_OPS else ""
            raise ShapeMismatch(f"{op}: shape mismatch, lhs {list(self.shape)} rhs {list(other.shape)}"
                                f"{hint}")


def _storage_for(arr: np.ndarray, target: DType) -> np.ndarray:
    """`arr` converted to `target`'s storage format. With an explicit target any real numeric
    numpy dtype is accepted (int32, int8, float16...), not only the seven candle dtypes."""
    if arr.dtype == target.np_storage:
        return arr  # already in storage format (uint16 bits for bf16): no copy
    if arr.dtype.kind not in "biuf":
        raise DTypeMismatch(f"Tensor.from_numpy: cannot convert numpy dtype {arr.dtype} to {target.name}")
    if target is dt.bf16:
        return dt.f32_to_bf16_bits(arr.astype(np.float32))
    if arr.dtype.kind == "f" and target.is_int:
        return dt.float_to_int_saturating(np, arr, target.np_storage)
    with np.errstate(invalid="ignore", over="ignore"):
        return arr.astype(target.np_storage)


def compute_dtype(dtype: DType) -> DType:
    return dt.f32 if dtype in (dt.f16, dt.bf16) else dtype


def custom_op(forward, *inputs, backward=None, dtype=None) -> "Tensor":
    """Candle's CustomOp: apply a backend kernel to tensors and get a tensor back.

    forward(backend, *arrays) gets the inputs' arrays in their compute dtype (f16/bf16
    widened to f32; a None input passes as None) and returns one backend array; the result is
    a tensor of `dtype` (default: the first input's) on the first input's device. With
    backward(grad, out) -> one gradient tensor (or None) per input, where `out` is the result
    without graph links, the result joins the autograd graph when an input tracks gradients;
    without it, such an input is an error."""
    from .autograd import is_tracking, record

    tensors = [t for t in inputs if t is not None]
    if not tensors:
        raise CandleError("custom_op: needs at least one tensor input")
    first = tensors[0]
    for other in tensors[1:]:  # dtypes and shapes are the kernel's to check
        first._check_device(other, "custom_op")
    arrays = [None if t is None else t._compute() for t in inputs]
    out = first._from_compute(forward(first.device.backend, *arrays), dtype)
    if not is_tracking(*tensors):
        return out
    if backward is None:
        raise CandleError("custom_op: an input tracks gradients but the op has no backward")
    # The closure holds an untracked alias: holding `out` itself would make a reference cycle
    # out -> node -> closure -> out.
    alias = out.detach()
    return record(out, tuple(inputs), lambda grad: backward(grad, alias))


class Var(Tensor):
    """A tensor that tracks gradients (Candle's `Var`); `set` replaces its value in place
    for optimizers."""

    __slots__ = ()

    def __init__(self, data, dtype=None, device=None):
        super().__init__(data, dtype, device)
        self._track = True

    @staticmethod
    def from_tensor(tensor: Tensor) -> "Var":
        var = object.__new__(Var)
        var._data = tensor.device.backend.contiguous(tensor._data).copy()
        var.dtype = tensor.dtype
        var.device = tensor.device
        var._track = True
        var._node = None
        return var

    @staticmethod
    def zeros(shape, dtype=dt.f32, device=None) -> "Var":
        return Var.from_tensor(Tensor.zeros(shape, dtype, device))

    @staticmethod
    def ones(shape, dtype=dt.f32, device=None) -> "Var":
        return Var.from_tensor(Tensor.ones(shape, dtype, device))

    @staticmethod
    def randn(mean, std, shape, dtype=dt.f32, device=None, generator=None) -> "Var":
        return Var.from_tensor(Tensor.randn(mean, std, shape, dtype, device, generator))

    @staticmethod
    def rand(lo, up, shape, dtype=dt.f32, device=None, generator=None) -> "Var":
        return Var.from_tensor(Tensor.rand(lo, up, shape, dtype, device, generator))

    def as_tensor(self) -> Tensor:
        return self

    def as_detached_tensor(self) -> Tensor:
        return self.detach()

    def set(self, value: Tensor) -> None:
        """Replace the value (same shape and dtype), keeping identity for optimizers."""
        if value.shape != self.shape:
            raise ShapeMismatch(f"Var.set: shape mismatch, var {list(self.shape)} value {list(value.shape)}")
        if value.dtype is not self.dtype:
            raise DTypeMismatch(f"Var.set: dtype mismatch, var {self.dtype.name} value {value.dtype.name}")
        self._data = value.device.backend.contiguous(value._data)
