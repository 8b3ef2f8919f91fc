"""Losses against torch.nn.functional (mean reduction): values and gradients, including
logits large enough to overflow a naive exp."""

from __future__ import annotations

import numpy as np
import pytest

from candle_web import ShapeMismatch, Tensor, Var
from candle_web.nn import loss, ops
from tests.nn.nn_testlib import assert_close, pair, randn

torch = pytest.importorskip("torch")
F = torch.nn.functional

# Scalar losses are means over <= 60 terms computed in f32: a few ulps of the sum.
RTOL_LOSS = 1e-5
ATOL_LOSS = 1e-6


@pytest.fixture
def rng():
    return np.random.default_rng(4)


def _check_loss(ours, theirs, pairs):
    assert ours.dims() == ()
    assert_close(ours, theirs, RTOL_LOSS, ATOL_LOSS, "loss value")
    grads = ours.backward()
    theirs.backward()
    for index, (ours_leaf, theirs_leaf) in enumerate(pairs):
        assert_close(grads[ours_leaf], theirs_leaf.grad, RTOL_LOSS, ATOL_LOSS,
                     f"gradient of input {index}")


def test_mse_matches_torch(rng):
    x, tx = pair(randn(rng, 4, 5))
    y, ty = pair(randn(rng, 4, 5))
    _check_loss(loss.mse(x, y), F.mse_loss(tx, ty), [(x, tx), (y, ty)])


@pytest.mark.parametrize("target_dtype", [np.uint32, np.int64])
def test_nll_matches_torch(rng, target_dtype):
    log_probs_np = np.log(rng.dirichlet(np.ones(6), size=8)).astype(np.float32)
    target_np = rng.integers(0, 6, size=8)
    log_probs, tlog_probs = pair(log_probs_np)
    ours = loss.nll(log_probs, Tensor.from_numpy(target_np.astype(target_dtype)))
    _check_loss(ours, F.nll_loss(tlog_probs, torch.from_numpy(target_np)), [(log_probs, tlog_probs)])


@pytest.mark.parametrize("scale", [1.0, 1e3, 1e5], ids=["unit", "1e3", "1e5"])
def test_cross_entropy_matches_torch(rng, scale):
    # 1e5-sized logits overflow exp() in f32 unless the max is subtracted first.
    logits, tlogits = pair(randn(rng, 10, 7, scale=scale))
    target_np = rng.integers(0, 7, size=10)
    ours = loss.cross_entropy(logits, Tensor.from_numpy(target_np.astype(np.uint32)))
    assert np.isfinite(ours.to_scalar())
    theirs = F.cross_entropy(tlogits, torch.from_numpy(target_np))
    # Large logits: the loss is a difference of numbers ~scale; relative to the loss value the
    # f32 cancellation error grows with scale, so the tolerance is relative to scale.
    value_atol = ATOL_LOSS * scale
    assert_close(ours, theirs, RTOL_LOSS, value_atol, "cross entropy value")
    grads = ours.backward()
    theirs.backward()
    assert_close(grads[logits], tlogits.grad, RTOL_LOSS, ATOL_LOSS, "cross entropy gradient")


def test_cross_entropy_is_log_softmax_then_nll(rng):
    logits_np = randn(rng, 5, 4)
    target = Tensor.from_numpy(np.array([0, 3, 1, 1, 2], np.uint32))
    direct = loss.cross_entropy(Tensor.from_numpy(logits_np), target).to_scalar()
    composed = loss.nll(ops.log_softmax(Tensor.from_numpy(logits_np), 1), target).to_scalar()
    assert direct == pytest.approx(composed, rel=1e-6)


@pytest.mark.parametrize("scale", [1.0, 50.0, 1e4], ids=["unit", "50", "1e4"])
def test_binary_cross_entropy_with_logit_matches_torch(rng, scale):
    logits, tlogits = pair(randn(rng, 6, 5, scale=scale))
    # Soft targets in [0, 1] exercise the x * t term beyond hard labels.
    target, ttarget = pair(rng.uniform(0.0, 1.0, (6, 5)).astype(np.float32))
    ours = loss.binary_cross_entropy_with_logit(logits, target)
    assert np.isfinite(ours.to_scalar())
    theirs = F.binary_cross_entropy_with_logits(tlogits, ttarget)
    assert_close(ours, theirs, RTOL_LOSS, ATOL_LOSS * scale, "bce value")
    grads = ours.backward()
    theirs.backward()
    assert_close(grads[logits], tlogits.grad, RTOL_LOSS, ATOL_LOSS, "bce gradient (logits)")
    assert_close(grads[target], ttarget.grad, RTOL_LOSS, ATOL_LOSS * scale, "bce gradient (target)")


def test_loss_shape_errors_name_the_shapes():
    with pytest.raises(ShapeMismatch, match=r"\[3, 4\].*\[2\]"):
        loss.nll(Tensor.zeros((3, 4)), Tensor.from_numpy(np.zeros(2, np.uint32)))
    with pytest.raises(ShapeMismatch, match=r"mse.*\[2, 3\].*\[3, 2\]"):
        loss.mse(Var(np.zeros((2, 3), np.float32)), Tensor.zeros((3, 2)))
    with pytest.raises(ShapeMismatch, match="binary_cross_entropy_with_logit"):
        loss.binary_cross_entropy_with_logit(Tensor.zeros((2, 3)), Tensor.zeros((2, 2)))


def test_nll_target_out_of_range_is_a_candle_error():
    from candle_web import CandleError

    with pytest.raises(CandleError):
        loss.nll(Tensor.zeros((2, 3)), Tensor.from_numpy(np.array([0, 3], np.uint32)))
