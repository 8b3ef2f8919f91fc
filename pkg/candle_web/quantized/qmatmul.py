"""QMatMul: a linear layer (no bias) whose weight comes from GGML blocks.

Two ways to multiply, chosen per backend when the layer is built:

* **dequantize at load** (the numpy backend, so also the browser): the blocks are expanded
  once into an f32 ``[n, k]`` matrix and every forward is one BLAS matmul. numpy has no fast
  way to multiply from packed 4-bit blocks -- decoding them on every token costs more than
  the matmul itself -- so this is the fast path there, at 4 bytes per weight of memory.
* **keep the blocks** (a backend whose ``supports_qmatmul`` says yes for the type, e.g. the
  native twin's numba/cupy kernels): the QTensor stays packed and each forward calls
  ``backend.qmatmul(x, qtensor)``, reading a fraction of the bytes per token.

``mode`` overrides the choice ("dequantize" or "quantized"); the result is the same numbers
either way up to the backend's summation order.

Fusing: ``QMatMul.fused([q, k, v])`` stacks several weights that multiply the same input
into one layer (one matmul per step instead of three). Quantized weights of one GGML type are
stacked row-wise without decoding (blocks never straddle rows, so the bytes just
concatenate); mixed types are dequantized, or kept as parts when the backend multiplies
quantized.
"""

from __future__ import annotations

import numpy as np

from ..core import dtype as dt
from ..core.device import Device
from ..core.errors import ShapeError, ShapeMismatch
from ..core.tensor import Tensor
from .ggml_dtype import GgmlDType
from .qtensor import QTensor

MODES = ("auto", "dequantize", "quantized")


def backend_multiplies_quantized(backend, ggml_dtype) -> bool:
    """True when `backend` has a kernel that multiplies straight from `ggml_dtype` blocks
    (its declared `supports_qmatmul`); plain float types never need one."""
    ggml_dtype = GgmlDType.parse(ggml_dtype)
    if not ggml_dtype.is_quantized:
        return False
    return backend.supports_qmatmul(ggml_dtype)


def _check_2d(qtensor: QTensor, what: str) -> None:
    if len(qtensor.shape) != 2:
        raise ShapeError(f"QMatMul {what}: the weight must be 2-D [out, in], got shape "
                         f"{qtensor.shape} ({qtensor.dtype.name})")


def _stack_rows(parts: list) -> QTensor:
    """Row-wise concatenation of same-type 2-D QTensors, without decoding a block."""
    in_features = parts[0].shape[1]
    data = np.concatenate([np.asarray(p.data).reshape(-1) for p in parts])
    return QTensor(parts[0].dtype, (sum(p.shape[0] for p in parts), in_features), data)


class QMatMul:
    """``y = x @ W^T`` for a GGML weight ``W [out, in]``; x is ``[..., in]`` f32."""

    def __init__(self, weight: Tensor = None, qweights: tuple = (), device=None):
        # Exactly one representation is set: `weight`, an f32 tensor (dequantized at load),
        # or `qweights`, QTensors whose outputs are concatenated (usually just one).
        self.weight = weight
        self.qweights = tuple(qweights)
        self.device = Device.parse(device) if weight is None else weight.device
        if weight is not None:
            self.out_features, self.in_features = weight.dims()
        else:
            self.out_features = sum(q.shape[0] for q in self.qweights)
            self.in_features = self.qweights[0].shape[1]

    # -- construction -------------------------------------------------------------------
    @staticmethod
    def from_qtensor(qtensor: QTensor, device=None, mode: str = "auto") -> "QMatMul":
        return QMatMul.fused([qtensor], device, mode)

    @staticmethod
    def from_tensor(weight: Tensor) -> "QMatMul":
        """A plain float weight (e.g. from safetensors), converted to f32 for compute."""
        if weight.rank != 2:
            raise ShapeError(f"QMatMul: the weight must be 2-D [out, in], got {list(weight.shape)}")
        return QMatMul(weight=weight.to_dtype(dt.f32))

    @staticmethod
    def fused(qtensors, device=None, mode: str = "auto") -> "QMatMul":
        """One layer computing the row-wise concatenation of several weights' outputs."""
        if mode not in MODES:
            raise ShapeError(f"QMatMul: mode must be one of {MODES}, got {mode!r}")
        parts = list(qtensors)
        if not parts:
            raise ShapeError("QMatMul.fused: no weights given")
        for index, part in enumerate(parts):
            _check_2d(part, f"part {index}")
        widths = {part.shape[1] for part in parts}
        if len(widths) != 1:
            raise ShapeMismatch(f"QMatMul.fused: the weights' input widths differ: "
                                f"{[part.shape for part in parts]}")
        device = Device.parse(device)
        if mode == "auto":
            keep = all(backend_multiplies_quantized(device.backend, p.dtype) for p in parts)
            mode = "quantized" if keep else "dequantize"
        if mode == "dequantize":
            dense = [part.dequantize() for part in parts]
            matrix = dense[0] if len(dense) == 1 else np.concatenate(dense, axis=0)
            return QMatMul(weight=Tensor.from_numpy(matrix, dt.f32, device))
        types = {part.dtype for part in parts}
        grouped = [_stack_rows(parts)] if len(types) == 1 and len(parts) > 1 else parts
        return QMatMul(qweights=grouped, device=device)

    @property
    def is_quantized(self) -> bool:
        return self.weight is None

    # -- forward ------------------------------------------------------------------------
    def forward(self, x: Tensor) -> Tensor:
        """Inference only (no autograd): called a few hundred times per generated token, so
        it goes straight to the backend instead of through five tensor ops."""
        if x.dims()[-1] != self.in_features:
            raise ShapeMismatch(f"QMatMul: input {list(x.shape)} does not match the weight "
                                f"[{self.out_features}, {self.in_features}]")
        backend = self.device.backend
        lead = x.dims()[:-1]
        flat = x.to_dtype(dt.f32).storage().reshape(-1, self.in_features)
        if self.weight is None:
            outputs = [backend.qmatmul(flat, q) for q in self.qweights]
            out = outputs[0] if len(outputs) == 1 else backend.xp.concatenate(outputs, axis=-1)
        elif flat.shape[0] == 1:
            # One row (a decode step): W @ x^T is a BLAS matrix-vector product over the
            # C-ordered weight. x @ W^T computes the same numbers but goes through gemm,
            # which under multithreaded OpenBLAS measured 10-100x slower for one row.
            out = backend.matmul(self.weight.storage(), flat.T).T
        else:
            out = backend.matmul(flat, self.weight.storage().T)
        return Tensor.from_storage(out.reshape(lead + (self.out_features,)), dt.f32, self.device)

    __call__ = forward

    def __repr__(self) -> str:
        kind = "f32" if self.weight is not None else "+".join(q.dtype.name for q in self.qweights)
        return f"QMatMul({kind}, out={self.out_features}, in={self.in_features})"
