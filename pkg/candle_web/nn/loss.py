"""Losses (Candle's `candle_nn::loss`), all reduced by the mean."""

from __future__ import annotations

from ..core.errors import ShapeMismatch
from ..core.tensor import Tensor
from . import ops


def mse(inp: Tensor, target: Tensor) -> Tensor:
    inp._check_same(target, "mse")
    return inp.sub(target).sqr().mean_all()


def nll(log_probs: Tensor, target: Tensor) -> Tensor:
    """Negative log likelihood: log_probs [b, classes], target class ids [b]."""
    if log_probs.rank != 2 or target.rank != 1 or target.dims()[0] != log_probs.dims()[0]:
        raise ShapeMismatch(f"nll: expected log_probs [b, c] and target [b], got "
                            f"{list(log_probs.shape)} and {list(target.shape)}")
    picked = log_probs.gather(target.unsqueeze(1), 1)
    return picked.sum_all().affine(-1.0 / target.dims()[0], 0.0)


def cross_entropy(logits: Tensor, target: Tensor) -> Tensor:
    return nll(ops.log_softmax(logits, 1), target)


def binary_cross_entropy_with_logit(logits: Tensor, target: Tensor) -> Tensor:
    """Mean BCE on logits, in the stable form max(x, 0) - x t + log(1 + exp(-|x|))."""
    logits._check_same(target, "binary_cross_entropy_with_logit")
    softplus = logits.abs().neg().exp().affine(1.0, 1.0).log()
    return logits.relu().sub(logits.mul(target)).add(softplus).mean_all()
