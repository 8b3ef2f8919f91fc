"""Functional ops used by layers and models (Candle's `candle_nn::ops`).

The fused kernels (softmax, norms, rope, attention) run through the backend's single
primitive when no input tracks gradients (inference). When one does, the norms, rope and
attention are composed from differentiable tensor ops so autograd sees every step; the
last-dim softmax and log-softmax keep their fused forward and record their closed-form
gradient instead (one node rather than six, and no overflow-prone intermediate).
"""

from __future__ import annotations

import math

from ..autograd import is_tracking, record
from ..errors import CandleError, ShapeMismatch
from ..tensor import Tensor


def _fused(x: Tensor, data) -> Tensor:
    return x._from_compute(data)


def _untracked_alias(t: Tensor) -> Tensor:
    """The same data without graph links, for use inside a backward closure (capturing the
    output itself would make output -> node -> closure -> output a reference cycle)."""
    return Tensor._wrap(t._data, t.dtype, t.device)


def _is_last_dim(x: Tensor, dim: int) -> bool:
    return dim in (-1, x.rank - 1)


def softmax_last_dim(x: Tensor) -> Tensor:
    out = _fused(x, x.device.backend.softmax_last_dim(x._compute()))
    if not is_tracking(x):
        return out
    probs = _untracked_alias(out)

    def backward(grad):
        # d softmax: s * (g - sum(g * s)) along the softmax dim.
        weighted = grad.mul(probs).sum_keepdim(-1)
        return (probs.mul(grad.broadcast_sub(weighted)),)

    return record(out, (x,), backward)


def softmax(x: Tensor, dim: int) -> Tensor:
    if _is_last_dim(x, dim):
        return softmax_last_dim(x)
    shifted = x.broadcast_sub(x.max_keepdim(dim).detach())
    exp = shifted.exp()
    return exp.broadcast_div(exp.sum_keepdim(dim))


def log_softmax(x: Tensor, dim: int) -> Tensor:
    if _is_last_dim(x, dim):
        out = _fused(x, x.device.backend.log_softmax_last_dim(x._compute()))
        if not is_tracking(x):
            return out
        log_probs = _untracked_alias(out)

        def backward(grad):
            # d log_softmax: g - softmax * sum(g), with softmax = exp(log_softmax).
            return (grad.broadcast_sub(log_probs.exp().broadcast_mul(grad.sum_keepdim(-1))),)

        return record(out, (x,), backward)
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
    return _fused(gate, gate.device.backend.silu_mul(gate._compute(), up._compute()))


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
    data = x.device.backend.layer_norm(
        x._compute(), None if weight is None else weight._compute(),
        None if bias is None else bias._compute(), eps)
    return _fused(x, data)


def rms_norm(x: Tensor, weight, eps: float) -> Tensor:
    if is_tracking(x, weight):
        normed = x.broadcast_div(x.sqr().mean_keepdim(-1).affine(1.0, eps).sqrt())
        return normed if weight is None else normed.broadcast_mul(weight)
    _check_last_dim(x, weight, "rms_norm")
    data = x.device.backend.rms_norm(x._compute(), None if weight is None else weight._compute(), eps)
    return _fused(x, data)


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
    mask_data = None if mask is None else mask._compute()
    data = q.device.backend.attention(q._compute(), k._compute(), v._compute(), mask_data, scale)
    return _fused(q, data)


def causal_mask(seq_len: int, offset: int = 0, dtype=None, device=None) -> Tensor:
    """Additive mask [seq_len, offset + seq_len]: -inf above the diagonal shifted by offset."""
    import numpy as np

    rows = np.arange(seq_len)[:, None] + offset
    cols = np.arange(offset + seq_len)[None, :]
    mask = np.where(cols > rows, -np.inf, 0.0).astype(np.float32)
    t = Tensor.from_numpy(mask, device=device)
    return t if dtype is None else t.to_dtype(dtype)
