"""Functional ops used by layers and models (Candle's `candle_nn::ops`).

The fused kernels (softmax, norms, rope, attention) run through the backend's single
primitive when no input tracks gradients (inference). When one does, the norms, rope and
attention are composed from differentiable tensor ops so autograd sees every step; the
last-dim softmax and log-softmax keep their fused forward and record their closed-form
gradient instead (one node rather than six, and no overflow-prone intermediate).
"""

from __future__ import annotations

import math

from ..backend.base import ACTIVATIONS
from ..core.autograd import is_tracking
from ..core.conv import conv2d_output_size
from ..core.errors import CandleError, ShapeMismatch
from ..core.tensor import Tensor, custom_op


def _is_last_dim(x: Tensor, dim: int) -> bool:
    return dim in (-1, x.rank - 1)


def softmax_last_dim(x: Tensor) -> Tensor:
    def backward(grad, probs):
        # d softmax: s * (g - sum(g * s)) along the softmax dim.
        weighted = grad.mul(probs).sum_keepdim(-1)
        return (probs.mul(grad.broadcast_sub(weighted)),)

    return custom_op(lambda backend, a: backend.softmax_last_dim(a), x, backward=backward)


def softmax(x: Tensor, dim: int) -> Tensor:
    if _is_last_dim(x, dim):
        return softmax_last_dim(x)
    shifted = x.broadcast_sub(x.max_keepdim(dim).detach())
    exp = shifted.exp()
    return exp.broadcast_div(exp.sum_keepdim(dim))


def log_softmax(x: Tensor, dim: int) -> Tensor:
    if _is_last_dim(x, dim):
        def backward(grad, log_probs):
            # d log_softmax: g - softmax * sum(g), with softmax = exp(log_softmax).
            return (grad.broadcast_sub(log_probs.exp().broadcast_mul(grad.sum_keepdim(-1))),)

        return custom_op(lambda backend, a: backend.log_softmax_last_dim(a), x,
                         backward=backward)
    shifted = x.broadcast_sub(x.max_keepdim(dim).detach())
    return shifted.broadcast_sub(shifted.exp().sum_keepdim(dim).log())


def sigmoid(x: Tensor) -> Tensor:
    return x.sigmoid()


def silu(x: Tensor) -> Tensor:
    return x.silu()


def swiglu(gate: Tensor, up: Tensor) -> Tensor:
    """silu(gate) * up, fused for inference."""
    if is_tracking(gate, up):
        return gate.silu().mul(up)
    gate._check_same(up, "swiglu")
    return custom_op(lambda backend, g, u: backend.silu_mul(g, u), gate, up)


def dropout(x: Tensor, drop_p: float, train: bool = True, generator=None) -> Tensor:
    """Inverted dropout: zero with probability p, scale the rest by 1/(1-p)."""
    if not 0.0 <= drop_p < 1.0:
        raise CandleError(f"dropout: probability must be in [0, 1), got {drop_p}")
    if not train or drop_p == 0.0:
        return x
    keep = Tensor.rand(0.0, 1.0, x.shape, x.dtype, x.device, generator).ge(drop_p).to_dtype(x.dtype)
    return x.mul(keep).affine(1.0 / (1.0 - drop_p), 0.0)


def layer_norm(x: Tensor, weight, bias, eps: float) -> Tensor:
    if is_tracking(x, weight, bias):
        centered = x.broadcast_sub(x.mean_keepdim(-1))
        normed = centered.broadcast_div(centered.sqr().mean_keepdim(-1).affine(1.0, eps).sqrt())
        if weight is not None:
            normed = normed.broadcast_mul(weight)
        if bias is not None:
            normed = normed.broadcast_add(bias)
        return normed
    _check_last_dim(x, weight, "layer_norm")
    return custom_op(lambda backend, a, w, b: backend.layer_norm(a, w, b, eps), x, weight, bias)


def rms_norm(x: Tensor, weight, eps: float) -> Tensor:
    if is_tracking(x, weight):
        normed = x.broadcast_div(x.sqr().mean_keepdim(-1).affine(1.0, eps).sqrt())
        return normed if weight is None else normed.broadcast_mul(weight)
    _check_last_dim(x, weight, "rms_norm")
    return custom_op(lambda backend, a, w: backend.rms_norm(a, w, eps), x, weight)


def _check_last_dim(x, weight, op):
    if weight is not None and weight.dims() != (x.dims()[-1],):
        raise ShapeMismatch(f"{op}: weight {list(weight.shape)} does not match the last dim of "
                            f"{list(x.shape)}")


def scaled_dot_product_attention(q: Tensor, k: Tensor, v: Tensor, mask=None, scale=None) -> Tensor:
    """softmax(q k^T * scale + mask) v on [b, h, t, d]; `mask` is additive (0 / -inf) and
    broadcastable to [b, h, tq, tk]."""
    if scale is None:
        scale = 1.0 / math.sqrt(q.dims()[-1])
    if is_tracking(q, k, v, mask):
        scores = q.matmul(k.t()).affine(scale, 0.0)
        if mask is not None:
            scores = scores.broadcast_add(mask)
        return softmax_last_dim(scores).matmul(v)
    if q.dims()[-1] != k.dims()[-1] or k.dims()[:-1] != v.dims()[:-1]:
        raise ShapeMismatch(f"attention: q {list(q.shape)}, k {list(k.shape)}, v {list(v.shape)} disagree")
    return custom_op(lambda backend, qa, ka, va, m: backend.attention(qa, ka, va, m, scale),
                     q, k, v, mask)


def causal_mask(seq_len: int, offset: int = 0, dtype=None, device=None) -> Tensor:
    """Additive mask [seq_len, offset + seq_len]: -inf above the diagonal shifted by offset."""
    import numpy as np

    rows = np.arange(seq_len)[:, None] + offset
    cols = np.arange(offset + seq_len)[None, :]
    mask = np.where(cols > rows, -np.inf, 0.0).astype(np.float32)
    t = Tensor.from_numpy(mask, device=device)
    return t if dtype is None else t.to_dtype(dtype)


def conv2d_bias_act(x: Tensor, kernel: Tensor, bias: Tensor | None = None, *, stride: int = 1,
                    padding: int = 0, groups: int = 1, activation: str = "none",
                    slope: float = 0.0) -> Tensor:
    """act(conv2d(x, kernel) + bias) in one backend call, the vision nets' layer: activation
    "none", "relu", "leaky" (max(x, slope * x)) or "relu6" (clamp to 0..6); bias [c_out] or
    None. The same values as the separate tensor ops (Backend.conv2d_bias_act composes them;
    the wasm backend fuses them into its conv kernels), and the separate ops themselves when an
    input tracks gradients."""
    if activation not in ACTIVATIONS:
        raise CandleError(f"conv2d_bias_act: activation {activation!r} is not one of "
                          f"{', '.join(ACTIVATIONS)}")
    c_out = kernel.dims()[0] if kernel.rank == 4 else None
    if bias is not None and bias.elem_count() != c_out:
        raise ShapeMismatch(f"conv2d_bias_act: bias {list(bias.shape)} for a kernel of "
                            f"{c_out} output channels")
    if is_tracking(x, kernel, bias) or x.rank != 4 or kernel.rank != 4:
        out = x.conv2d(kernel, padding=padding, stride=stride, groups=groups)
        if bias is not None:
            out = out.broadcast_add(bias.reshape((1, c_out, 1, 1)))
        if activation == "relu":
            return out.relu()
        if activation == "leaky":
            return out.maximum(out.affine(slope, 0.0))
        return out.clamp(0.0, 6.0) if activation == "relu6" else out
    conv2d_output_size(x, kernel, padding, stride, 1, groups)  # conv2d's checks and errors
    flat_bias = None if bias is None else bias.reshape((c_out,))
    return custom_op(lambda backend, a, w, b: backend.conv2d_bias_act(
        a, w, b, stride, padding, groups, activation, slope), x, kernel, flat_bias)


def _every_stride(x: Tensor, dim: int, count: int, stride: int) -> Tensor:
    """Positions 0, stride, ..., (count - 1) * stride of `dim`."""
    if stride == 1:
        return x.narrow(dim, 0, count)
    size = x.dims()[dim]
    wanted = count * stride
    # Whole strides only: cut the tail, or repeat the edge where the last one runs short
    # (those rows are dropped with the rest of the stride).
    x = x.narrow(dim, 0, wanted) if size >= wanted else x.pad_with_same(dim, 0, wanted - size)
    dims = x.dims()
    strided = x.reshape(dims[:dim] + (count, stride) + dims[dim + 1:])
    return strided.narrow(dim + 1, 0, 1).squeeze(dim + 1)


def max_pool2d(x: Tensor, kernel: int, stride: int, pad_end: int = 0) -> Tensor:
    """The max over kernel x kernel windows of [b, c, h, w], one every `stride` pixels.
    `pad_end` rows and columns added at the bottom/right repeat the edge, so they never win a
    max: TensorFlow's "same" pooling where its padding falls after the image only."""
    if kernel < 1 or stride < 1:
        raise CandleError(f"max_pool2d: kernel {kernel} and stride {stride} must be >= 1")
    if x.rank != 4:
        raise ShapeMismatch(f"max_pool2d: expected [b, c, h, w], got {list(x.shape)}")
    if not is_tracking(x):
        for dim in (2, 3):
            if x.dims()[dim] + pad_end < kernel:
                raise ShapeMismatch(f"max_pool2d: a {kernel}-wide window does not fit dim "
                                    f"{dim} of {list(x.shape)} (+{pad_end})")
        # One backend call (a max picks one of its inputs: the same values as the steps below).
        return custom_op(lambda backend, a: backend.max_pool2d(a, kernel, stride, pad_end), x)
    for dim in (2, 3):
        x = x.pad_with_same(dim, 0, pad_end) if pad_end else x
        span = x.dims()[dim] - kernel + 1
        if span < 1:
            raise ShapeMismatch(f"max_pool2d: a {kernel}-wide window does not fit dim {dim} of "
                                f"{list(x.shape)}")
        window_max = x.narrow(dim, 0, span)
        for offset in range(1, kernel):
            window_max = window_max.maximum(x.narrow(dim, offset, span))
        x = _every_stride(window_max, dim, (span - 1) // stride + 1, stride)
    return x


def avg_pool2d(x: Tensor, kernel: int) -> Tensor:
    """The mean of each kernel x kernel tile of [b, c, h, w] (stride = kernel); a partial tile
    at the bottom/right is dropped, as TensorFlow's "valid" pooling does."""
    batch, channels, height, width = x.dims()
    rows, cols = height // kernel, width // kernel
    if rows < 1 or cols < 1:
        raise ShapeMismatch(f"avg_pool2d: a {kernel}x{kernel} tile does not fit {list(x.shape)}")
    x = x.narrow(2, 0, rows * kernel).narrow(3, 0, cols * kernel)
    return x.reshape((batch, channels, rows, kernel, cols, kernel)).mean((3, 5))
