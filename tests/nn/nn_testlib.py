"""Helpers shared by the candle_web.nn tests: move values between candle_web and PyTorch,
and compare forward values and gradients with stated tolerances.

Tolerances: both sides compute in float32 from identical inputs, so differences come only
from the order of floating-point operations (reductions, matmul blocking, fused vs composed
formulas). Elementwise ops agree to a few ulps (RTOL_ELEMENTWISE); anything that sums over
a dimension can differ by ~n ulps of the largest partial sum (RTOL_REDUCE / ATOL_REDUCE).
"""

from __future__ import annotations

import numpy as np

from candle_web import Tensor, Var

RTOL_ELEMENTWISE = 1e-5
ATOL_ELEMENTWISE = 1e-6
RTOL_REDUCE = 1e-4
ATOL_REDUCE = 1e-5


def randn(rng: np.random.Generator, *shape, scale: float = 1.0) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def pair(array: np.ndarray):
    """(candle Var, torch leaf with requires_grad) holding the same f32 values."""
    import torch

    return Var(array.copy()), torch.tensor(array, requires_grad=True)


def as_numpy(value) -> np.ndarray:
    """A candle Tensor, a torch tensor or a numpy array as a numpy array."""
    if isinstance(value, Tensor):
        return value.to_numpy()
    if isinstance(value, np.ndarray):
        return value
    return value.detach().cpu().numpy()


def assert_close(ours, theirs, rtol: float = RTOL_REDUCE, atol: float = ATOL_REDUCE,
                 what: str = "") -> None:
    ours_np, theirs_np = as_numpy(ours), as_numpy(theirs)
    assert ours_np.shape == theirs_np.shape, f"{what}: shape {ours_np.shape} != {theirs_np.shape}"
    np.testing.assert_allclose(ours_np, theirs_np, rtol=rtol, atol=atol, err_msg=what)


def assert_grads_close(ours_out, theirs_out, pairs, rtol: float = RTOL_REDUCE,
                       atol: float = ATOL_REDUCE, weights: np.ndarray | None = None) -> None:
    """Back-propagate sum(out * weights) on both sides (random weights so that every output
    element gets a distinct upstream gradient) and compare the gradient of every pair."""
    import torch

    if weights is None:
        weights = np.random.default_rng(1234).standard_normal(as_numpy(theirs_out).shape)
    weights = weights.astype(np.float32)
    ours_loss = ours_out.mul(Tensor.from_numpy(weights)).sum_all()
    grads = ours_loss.backward()
    (theirs_out * torch.from_numpy(weights)).sum().backward()
    for index, (ours_leaf, theirs_leaf) in enumerate(pairs):
        assert theirs_leaf.grad is not None, f"torch produced no gradient for input {index}"
        assert_close(grads[ours_leaf], theirs_leaf.grad, rtol, atol, f"gradient of input {index}")
