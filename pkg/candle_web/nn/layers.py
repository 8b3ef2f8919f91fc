"""Layers (Candle's `candle_nn`): Module, Linear, Embedding, LayerNorm, RmsNorm, Conv1d,
Conv2d, Activation. Each is built from a VarBuilder with Candle's constructor names and
default initialisations (used when the builder is backed by a VarMap for training)."""

from __future__ import annotations

import math

from ..core.errors import ShapeMismatch, UnsupportedError
from ..core.tensor import Tensor
from . import init as nn_init
from . import ops


class Module:
    """Anything with `forward`; calling the module calls forward."""

    def forward(self, *args, **kwargs):
        raise NotImplementedError

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)


class Linear(Module):
    """y = x @ w^T + b with w [out, in] (PyTorch/Candle layout)."""

    def __init__(self, weight: Tensor, bias=None):
        self.weight = weight
        self.bias = bias

    def forward(self, x: Tensor) -> Tensor:
        out_features, in_features = self.weight.dims()
        if x.rank == 0 or x.dims()[-1] != in_features:
            # Checked here: the flattening below would otherwise fail later as a confusing
            # reshape error.
            raise ShapeMismatch(f"linear: input {list(x.shape)} does not end in the weight's "
                                f"in_features {in_features} (weight {list(self.weight.shape)})")
        lead = x.dims()[:-1]
        flat = x.reshape(-1, in_features) if x.rank != 2 else x
        y = flat.matmul(self.weight.t())
        if self.bias is not None:
            y = y.broadcast_add(self.bias)
        return y.reshape(lead + (out_features,)) if x.rank != 2 else y


def linear(in_dim: int, out_dim: int, vb, bias: bool = True) -> Linear:
    weight = vb.get_with_init((out_dim, in_dim), "weight", nn_init.DEFAULT_KAIMING_NORMAL)
    b = None
    if bias:
        bound = 1.0 / math.sqrt(in_dim)
        b = vb.get_with_init((out_dim,), "bias", nn_init.Uniform(-bound, bound))
    return Linear(weight, b)


def linear_no_bias(in_dim: int, out_dim: int, vb) -> Linear:
    return linear(in_dim, out_dim, vb, bias=False)


class Embedding(Module):
    def __init__(self, embeddings: Tensor):
        self.embeddings = embeddings
        self.hidden_size = embeddings.dims()[-1]

    def forward(self, ids: Tensor) -> Tensor:
        return self.embeddings.embedding(ids)


def embedding(vocab: int, hidden: int, vb) -> Embedding:
    return Embedding(vb.get_with_init((vocab, hidden), "weight", nn_init.Randn(0.0, 1.0)))


class LayerNorm(Module):
    def __init__(self, weight, bias, eps: float = 1e-5):
        self.weight = weight
        self.bias = bias
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        return ops.layer_norm(x, self.weight, self.bias, self.eps)


def layer_norm(size: int, eps: float, vb, affine: bool = True) -> LayerNorm:
    if not affine:
        return LayerNorm(None, None, eps)
    weight = vb.get_with_init((size,), "weight", nn_init.Const(1.0))
    bias = vb.get_with_init((size,), "bias", nn_init.Const(0.0))
    return LayerNorm(weight, bias, eps)


class RmsNorm(Module):
    def __init__(self, weight, eps: float = 1e-6):
        self.weight = weight
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        return ops.rms_norm(x, self.weight, self.eps)


def rms_norm(size: int, eps: float, vb) -> RmsNorm:
    return RmsNorm(vb.get_with_init((size,), "weight", nn_init.Const(1.0)), eps)


class Conv1d(Module):
    def __init__(self, weight, bias=None, padding=0, stride=1, dilation=1, groups=1):
        self.weight = weight
        self.bias = bias
        self.padding, self.stride, self.dilation, self.groups = padding, stride, dilation, groups

    def forward(self, x: Tensor) -> Tensor:
        y = x.conv1d(self.weight, self.padding, self.stride, self.dilation, self.groups)
        if self.bias is not None:
            y = y.broadcast_add(self.bias.reshape(1, -1, 1))
        return y


def conv1d(in_channels, out_channels, kernel_size, vb, padding=0, stride=1, dilation=1,
           groups=1, bias=True) -> Conv1d:
    fan_in = in_channels // groups * kernel_size
    weight = vb.get_with_init((out_channels, in_channels // groups, kernel_size), "weight",
                              nn_init.DEFAULT_KAIMING_NORMAL)
    b = None
    if bias:
        bound = 1.0 / math.sqrt(fan_in)
        b = vb.get_with_init((out_channels,), "bias", nn_init.Uniform(-bound, bound))
    return Conv1d(weight, b, padding, stride, dilation, groups)


class Conv2d(Module):
    def __init__(self, weight, bias=None, padding=0, stride=1, dilation=1, groups=1):
        self.weight = weight
        self.bias = bias
        self.padding, self.stride, self.dilation, self.groups = padding, stride, dilation, groups

    def forward(self, x: Tensor) -> Tensor:
        y = x.conv2d(self.weight, self.padding, self.stride, self.dilation, self.groups)
        if self.bias is not None:
            y = y.broadcast_add(self.bias.reshape(1, -1, 1, 1))
        return y


def conv2d(in_channels, out_channels, kernel_size, vb, padding=0, stride=1, dilation=1,
           groups=1, bias=True) -> Conv2d:
    fan_in = in_channels // groups * kernel_size * kernel_size
    weight = vb.get_with_init((out_channels, in_channels // groups, kernel_size, kernel_size),
                              "weight", nn_init.DEFAULT_KAIMING_NORMAL)
    b = None
    if bias:
        bound = 1.0 / math.sqrt(fan_in)
        b = vb.get_with_init((out_channels,), "bias", nn_init.Uniform(-bound, bound))
    return Conv2d(weight, b, padding, stride, dilation, groups)


def _quick_gelu(x: Tensor) -> Tensor:
    return x.mul(x.affine(1.702, 0.0).sigmoid())


# HF config names (`hidden_act`, `activation_function`, `dense_act_fn`) -> function.
_ACTIVATIONS = {
    "gelu": Tensor.gelu_erf,  # HF "gelu" is the exact erf form
    "gelu_new": Tensor.gelu,  # tanh approximation
    "gelu_pytorch_tanh": Tensor.gelu,
    "gelu_fast": Tensor.gelu,
    "gelu_accurate": Tensor.gelu,
    "quick_gelu": _quick_gelu,
    "relu": Tensor.relu,
    "silu": Tensor.silu,
    "swish": Tensor.silu,
    "sigmoid": Tensor.sigmoid,
    "tanh": Tensor.tanh,
}


class Activation(Module):
    """An activation by its Hugging Face config name (unknown names raise, naming them)."""

    def __init__(self, name: str):
        key = name.lower() if isinstance(name, str) else name
        if key not in _ACTIVATIONS:
            raise UnsupportedError(f"unknown activation {name!r}; supported: {sorted(_ACTIVATIONS)}")
        self.name = key
        self._fn = _ACTIVATIONS[key]

    def forward(self, x: Tensor) -> Tensor:
        return self._fn(x)

    def __repr__(self) -> str:
        return f"Activation({self.name!r})"
