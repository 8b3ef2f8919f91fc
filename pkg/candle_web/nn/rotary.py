"""Rotary position embeddings.

`rope` rotates the two halves of the head dim (HF / GPT-NeoX layout); `rope_i` rotates
interleaved pairs (2i, 2i+1), the layout of the original LLaMA code and of GGUF files, whose
Q/K rows llama.cpp's converter permutes. cos/sin are [t, d/2].
"""

from __future__ import annotations

import numpy as np

from ..core.autograd import is_tracking
from ..core.errors import ShapeMismatch
from ..core.tensor import Tensor, custom_op


def rope_frequencies(head_dim: int, max_positions: int, theta: float = 10000.0,
                     scaling=None, device=None):
    """(cos, sin), each [max_positions, head_dim/2] in f32. `scaling` is an optional callable
    that rescales the inverse frequencies (e.g. llama3 rope scaling)."""
    inv_freq = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    if scaling is not None:
        inv_freq = scaling(inv_freq)
    angles = np.outer(np.arange(max_positions, dtype=np.float64), inv_freq).astype(np.float32)
    return (Tensor.from_numpy(np.cos(angles), device=device),
            Tensor.from_numpy(np.sin(angles), device=device))


def _check(x, cos, sin, op):
    if x.rank != 4:
        raise ShapeMismatch(f"{op}: expected x [b, h, t, d], got {list(x.shape)}")
    t, d = x.dims()[2], x.dims()[3]
    if d % 2 or cos.dims() != (t, d // 2) or sin.dims() != (t, d // 2):
        raise ShapeMismatch(f"{op}: cos {list(cos.shape)} / sin {list(sin.shape)} must be "
                            f"[{t}, {d // 2}] for x {list(x.shape)}")


def rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    _check(x, cos, sin, "rope")
    if is_tracking(x, cos, sin):
        half = x.dims()[-1] // 2
        x1 = x.narrow(-1, 0, half)
        x2 = x.narrow(-1, half, half)
        return Tensor.cat([x1.broadcast_mul(cos).sub(x2.broadcast_mul(sin)),
                           x2.broadcast_mul(cos).add(x1.broadcast_mul(sin))], -1)
    return custom_op(lambda backend, a, c, s: backend.rope(a, c, s), x, cos, sin)


def rope_i(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    _check(x, cos, sin, "rope_i")
    if is_tracking(x, cos, sin):
        b, h, t, d = x.dims()
        pairs = x.reshape(b, h, t, d // 2, 2)
        x_even = pairs.narrow(-1, 0, 1).squeeze(-1)
        x_odd = pairs.narrow(-1, 1, 1).squeeze(-1)
        even = x_even.broadcast_mul(cos).sub(x_odd.broadcast_mul(sin))
        odd = x_even.broadcast_mul(sin).add(x_odd.broadcast_mul(cos))
        return Tensor.stack([even, odd], -1).reshape(b, h, t, d)
    return custom_op(lambda backend, a, c, s: backend.rope_i(a, c, s), x, cos, sin)
