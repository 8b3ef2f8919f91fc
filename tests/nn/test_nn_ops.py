"""candle_web.nn.ops against PyTorch: softmax family, sigmoid, dropout, swiglu, fused norms
against their composed (autograd) path, scaled dot-product attention and the causal mask."""

from __future__ import annotations

import numpy as np
import pytest

from candle_web import CandleError, ShapeMismatch, Tensor, Var, manual_seed
from candle_web.nn import ops
from tests.nn.nn_testlib import (ATOL_ELEMENTWISE, RTOL_ELEMENTWISE, assert_close,
                                 assert_grads_close, pair, randn)

torch = pytest.importorskip("torch")
F = torch.nn.functional


@pytest.fixture
def rng():
    return np.random.default_rng(1)


# -- softmax family ----------------------------------------------------------------------------

@pytest.mark.parametrize("dim", [0, 1, -1])
def test_softmax_matches_torch(rng, dim):
    x, tx = pair(randn(rng, 3, 4, 5, scale=4.0))
    ours = ops.softmax(x, dim)
    theirs = torch.softmax(tx, dim)
    assert_close(ours, theirs, what="softmax")
    assert_grads_close(ours, theirs, [(x, tx)])


def test_softmax_last_dim_fused_and_tracked_match_torch(rng):
    x_np = randn(rng, 2, 3, 7, scale=4.0)
    x, tx = pair(x_np)
    theirs = torch.softmax(tx, -1)
    assert_close(ops.softmax_last_dim(Tensor.from_numpy(x_np)), theirs, what="fused")
    tracked = ops.softmax_last_dim(x)
    assert_close(tracked, theirs, what="tracked")
    assert_grads_close(tracked, theirs, [(x, tx)])


def test_softmax_composed_path_equals_fused_last_dim(rng):
    """Non-last dims take the composed path; moving the dim last must give the same result."""
    x_np = randn(rng, 4, 6, 3, scale=3.0)
    for fn in (ops.softmax, ops.log_softmax):
        composed = fn(Tensor.from_numpy(x_np), 1).to_numpy()
        fused = fn(Tensor.from_numpy(np.ascontiguousarray(x_np.transpose(0, 2, 1))), -1).to_numpy()
        assert_close(composed, fused.transpose(0, 2, 1), what=fn.__name__)


def test_softmax_is_stable_for_large_logits():
    x_np = np.array([[1000.0, 999.0, -1000.0], [-1e4, -1e4 + 1.0, -1e4 + 2.0]], np.float32)
    expected = torch.softmax(torch.from_numpy(x_np), -1)
    for path in (Tensor.from_numpy(x_np), Var(x_np)):
        out = ops.softmax_last_dim(path)
        assert np.all(np.isfinite(out.to_numpy()))
        assert_close(out, expected, rtol=RTOL_ELEMENTWISE, atol=ATOL_ELEMENTWISE)


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_log_softmax_matches_torch(rng, dim):
    x_np = randn(rng, 4, 6, scale=30.0)  # large spread: log(softmax) would underflow to -inf
    x, tx = pair(x_np)
    theirs = torch.log_softmax(tx, dim)
    assert_close(ops.log_softmax(Tensor.from_numpy(x_np), dim), theirs, what="fused")
    tracked = ops.log_softmax(x, dim)
    assert_close(tracked, theirs, what="tracked")
    assert np.all(np.isfinite(tracked.to_numpy()))
    assert_grads_close(tracked, theirs, [(x, tx)])


def test_sigmoid_matches_torch(rng):
    x, tx = pair(np.concatenate([randn(rng, 50, scale=5.0),
                                 np.array([-100.0, -30.0, 30.0, 100.0], np.float32)]))
    ours = ops.sigmoid(x)
    theirs = torch.sigmoid(tx)
    assert np.all(np.isfinite(ours.to_numpy()))
    assert_close(ours, theirs, rtol=RTOL_ELEMENTWISE, atol=ATOL_ELEMENTWISE)
    assert_grads_close(ours, theirs, [(x, tx)], rtol=RTOL_ELEMENTWISE, atol=ATOL_ELEMENTWISE)


# -- swiglu ------------------------------------------------------------------------------------

def test_swiglu_fused_and_tracked_match_torch(rng):
    gate_np, up_np = randn(rng, 3, 8, scale=3.0), randn(rng, 3, 8)
    gate, tgate = pair(gate_np)
    up, tup = pair(up_np)
    theirs = F.silu(tgate) * tup
    fused = ops.swiglu(Tensor.from_numpy(gate_np), Tensor.from_numpy(up_np))
    assert_close(fused, theirs, rtol=RTOL_ELEMENTWISE, atol=ATOL_ELEMENTWISE, what="fused")
    tracked = ops.swiglu(gate, up)
    assert_close(tracked, theirs, rtol=RTOL_ELEMENTWISE, atol=ATOL_ELEMENTWISE, what="tracked")
    assert_grads_close(tracked, theirs, [(gate, tgate), (up, tup)])


def test_swiglu_shape_mismatch_names_both_shapes():
    with pytest.raises(ShapeMismatch, match=r"\[2, 3\].*\[2, 4\]"):
        ops.swiglu(Tensor.zeros((2, 3)), Tensor.zeros((2, 4)))


# -- dropout -----------------------------------------------------------------------------------

def test_dropout_eval_and_p_zero_are_identity(rng):
    x = Tensor.from_numpy(randn(rng, 100))
    np.testing.assert_array_equal(ops.dropout(x, 0.5, train=False).to_numpy(), x.to_numpy())
    np.testing.assert_array_equal(ops.dropout(x, 0.0).to_numpy(), x.to_numpy())


def test_dropout_zeroes_a_fraction_p_and_scales_the_rest():
    drop_p = 0.3
    count = 20000
    x_np = np.random.default_rng(2).uniform(1.0, 2.0, count).astype(np.float32)  # no zeros
    out = ops.dropout(Tensor.from_numpy(x_np), drop_p,
                      generator=np.random.default_rng(3)).to_numpy()
    dropped = out == 0.0
    # Binomial(20000, 0.3): std of the fraction is 0.0032; 0.02 is > 6 sigma.
    assert abs(dropped.mean() - drop_p) < 0.02
    np.testing.assert_allclose(out[~dropped], x_np[~dropped] / (1.0 - drop_p), rtol=1e-6)


def test_dropout_is_reproducible_when_seeded():
    x = Tensor.ones((1000,))
    first = ops.dropout(x, 0.5, generator=np.random.default_rng(7)).to_numpy()
    second = ops.dropout(x, 0.5, generator=np.random.default_rng(7)).to_numpy()
    other = ops.dropout(x, 0.5, generator=np.random.default_rng(8)).to_numpy()
    np.testing.assert_array_equal(first, second)
    assert not np.array_equal(first, other)
    manual_seed(11)
    global_first = ops.dropout(x, 0.5).to_numpy()
    manual_seed(11)
    np.testing.assert_array_equal(ops.dropout(x, 0.5).to_numpy(), global_first)


def test_dropout_gradient_is_the_scaled_mask():
    drop_p = 0.25
    x = Var(np.full(500, 3.0, np.float32))
    out = ops.dropout(x, drop_p, generator=np.random.default_rng(5))
    grad = out.sum_all().backward()[x].to_numpy()
    kept = out.to_numpy() != 0.0
    np.testing.assert_allclose(grad[kept], 1.0 / (1.0 - drop_p), rtol=1e-6)
    np.testing.assert_array_equal(grad[~kept], 0.0)


@pytest.mark.parametrize("bad_p", [-0.1, 1.0, 1.5])
def test_dropout_rejects_bad_probability(bad_p):
    with pytest.raises(CandleError, match="dropout"):
        ops.dropout(Tensor.ones((4,)), bad_p)


# -- fused norms == composed norms -------------------------------------------------------------

@pytest.mark.parametrize("affine", [True, False])
def test_layer_norm_fused_equals_composed(rng, affine):
    x_np, w_np, b_np = randn(rng, 2, 4, 24, scale=2.0) + 3.0, randn(rng, 24), randn(rng, 24)
    weight = Tensor.from_numpy(w_np) if affine else None
    bias = Tensor.from_numpy(b_np) if affine else None
    fused = ops.layer_norm(Tensor.from_numpy(x_np), weight, bias, 1e-5)
    composed = ops.layer_norm(Var(x_np), weight, bias, 1e-5)  # a Var takes the autograd path
    assert_close(fused, composed, what="layer_norm fused vs composed")
    theirs = F.layer_norm(torch.from_numpy(x_np), (24,),
                          torch.from_numpy(w_np) if affine else None,
                          torch.from_numpy(b_np) if affine else None, 1e-5)
    assert_close(fused, theirs, what="layer_norm fused vs torch")


def test_rms_norm_fused_equals_composed(rng):
    x_np, w_np = randn(rng, 3, 5, 16, scale=2.0), randn(rng, 16)
    fused = ops.rms_norm(Tensor.from_numpy(x_np), Tensor.from_numpy(w_np), 1e-6)
    composed = ops.rms_norm(Var(x_np), Tensor.from_numpy(w_np), 1e-6)
    assert_close(fused, composed, what="rms_norm fused vs composed")
    no_weight = ops.rms_norm(Tensor.from_numpy(x_np), None, 1e-6)
    assert_close(no_weight, F.rms_norm(torch.from_numpy(x_np), (16,), None, 1e-6))


def test_fused_norms_reject_a_wrong_weight_shape():
    x = Tensor.zeros((2, 8))
    with pytest.raises(ShapeMismatch, match=r"layer_norm.*\[7\].*\[2, 8\]"):
        ops.layer_norm(x, Tensor.ones((7,)), None, 1e-5)
    with pytest.raises(ShapeMismatch, match=r"rms_norm.*\[7\].*\[2, 8\]"):
        ops.rms_norm(x, Tensor.ones((7,)), 1e-6)


# -- attention ---------------------------------------------------------------------------------

def _qkv(rng, tq=5, tk=5):
    return randn(rng, 2, 3, tq, 8), randn(rng, 2, 3, tk, 8), randn(rng, 2, 3, tk, 8)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_attention_matches_torch_sdpa(rng, causal):
    q_np, k_np, v_np = _qkv(rng)
    mask = ops.causal_mask(5) if causal else None
    theirs_args = [torch.from_numpy(a) for a in (q_np, k_np, v_np)]
    theirs = F.scaled_dot_product_attention(*theirs_args, is_causal=causal)
    fused = ops.scaled_dot_product_attention(*[Tensor.from_numpy(a) for a in (q_np, k_np, v_np)],
                                             mask=mask)
    assert_close(fused, theirs, what="attention fused")
    pairs = [pair(a) for a in (q_np, k_np, v_np)]
    tq, tk, tv = [p[1] for p in pairs]
    tracked = ops.scaled_dot_product_attention(*[p[0] for p in pairs], mask=mask)
    theirs_tracked = F.scaled_dot_product_attention(tq, tk, tv, is_causal=causal)
    assert_close(tracked, theirs_tracked, what="attention tracked")
    assert_grads_close(tracked, theirs_tracked, pairs)


def test_attention_with_offset_mask_and_scale_matches_torch(rng):
    """Decoding two new queries against seven cached keys: the causal mask is shifted by the
    offset (query i sees keys 0..offset+i)."""
    q_np, k_np, v_np = _qkv(rng, tq=2, tk=7)
    offset, scale = 5, 0.3
    mask = ops.causal_mask(2, offset)
    allowed = torch.ones(2, 7, dtype=torch.bool).tril(diagonal=offset)
    theirs = F.scaled_dot_product_attention(*[torch.from_numpy(a) for a in (q_np, k_np, v_np)],
                                            attn_mask=allowed, scale=scale)
    ours = ops.scaled_dot_product_attention(*[Tensor.from_numpy(a) for a in (q_np, k_np, v_np)],
                                            mask=mask, scale=scale)
    assert_close(ours, theirs, what="attention with offset")


def test_attention_rejects_disagreeing_shapes():
    q, k = Tensor.zeros((1, 2, 3, 8)), Tensor.zeros((1, 2, 4, 8))
    with pytest.raises(ShapeMismatch, match="attention"):
        ops.scaled_dot_product_attention(q, k, Tensor.zeros((1, 2, 5, 8)))
    with pytest.raises(ShapeMismatch, match="attention"):
        ops.scaled_dot_product_attention(q, Tensor.zeros((1, 2, 4, 6)), Tensor.zeros((1, 2, 4, 8)))


@pytest.mark.parametrize("seq_len,offset", [(1, 0), (4, 0), (3, 2), (1, 6)])
def test_causal_mask_matches_triangular_reference(seq_len, offset):
    mask = ops.causal_mask(seq_len, offset)
    assert mask.dims() == (seq_len, offset + seq_len)
    allowed = torch.ones(seq_len, offset + seq_len, dtype=torch.bool).tril(diagonal=offset)
    expected = np.where(allowed.numpy(), 0.0, -np.inf).astype(np.float32)
    np.testing.assert_array_equal(mask.to_numpy(), expected)


def test_causal_mask_dtype_conversion():
    from candle_web import f16

    mask = ops.causal_mask(3, dtype=f16)
    assert mask.dtype is f16
    assert np.isneginf(mask.to_numpy()[0, 2]) and mask.to_numpy()[2, 0] == 0.0


# -- pooling (the face models) -----------------------------------------------------------------

@pytest.mark.parametrize("size", [(72, 73), (56, 56), (35, 17), (7, 8)])
def test_max_pool2d_matches_torch(rng, size):
    x = randn(rng, 2, 3, *size)
    # Exact: a max picks one of the inputs.
    np.testing.assert_array_equal(ops.max_pool2d(Tensor.from_numpy(x), 3, 2).to_numpy(),
                                  F.max_pool2d(torch.from_numpy(x), 3, 2).numpy())
    # TensorFlow's "same" pooling: the padding after the image never wins a max (as -inf).
    padded = F.pad(torch.from_numpy(x), (0, 1, 0, 1), value=-float("inf"))
    np.testing.assert_array_equal(ops.max_pool2d(Tensor.from_numpy(x), 3, 2, 1).to_numpy(),
                                  F.max_pool2d(padded, 3, 2).numpy())
    np.testing.assert_array_equal(ops.max_pool2d(Tensor.from_numpy(x), 2, 1).to_numpy(),
                                  F.max_pool2d(torch.from_numpy(x), 2, 1).numpy())


def test_max_pool2d_one_backend_call_equals_the_tracked_steps(rng):
    x_np = randn(rng, 1, 2, 9, 8)
    for kernel, stride, pad_end in ((3, 2, 1), (2, 1, 1), (2, 2, 0)):
        tracked, _ = pair(x_np)
        np.testing.assert_array_equal(
            ops.max_pool2d(Tensor.from_numpy(x_np), kernel, stride, pad_end).to_numpy(),
            ops.max_pool2d(tracked, kernel, stride, pad_end).to_numpy())


@pytest.mark.parametrize("size", [(8, 8), (35, 17), (3, 4)])
def test_avg_pool2d_matches_torch(rng, size):
    x, tx = pair(randn(rng, 2, 3, *size))
    assert_close(ops.avg_pool2d(x, 2), F.avg_pool2d(tx, 2), what="avg_pool2d")


def test_pooling_refuses_a_window_larger_than_the_map():
    x = Tensor.from_numpy(np.zeros((1, 1, 2, 2), dtype=np.float32))
    with pytest.raises(ShapeMismatch, match="max_pool2d"):
        ops.max_pool2d(x, 3, 2)
    with pytest.raises(ShapeMismatch, match="avg_pool2d"):
        ops.avg_pool2d(x, 3)
    with pytest.raises(CandleError, match="kernel 0"):
        ops.max_pool2d(x, 0, 1)


# -- conv2d_bias_act (the face models' layer) --------------------------------------------------

TORCH_ACTIVATIONS = {"none": lambda t: t, "relu": F.relu,
                     "leaky": lambda t: F.leaky_relu(t, 0.1), "relu6": F.relu6}


@pytest.mark.parametrize("activation", sorted(TORCH_ACTIVATIONS))
@pytest.mark.parametrize("kernel,stride,padding,groups", [((8, 4, 3, 3), 1, 1, 1),
                                                          ((4, 1, 3, 3), 2, 1, 4),
                                                          ((6, 4, 1, 1), 1, 0, 1)])
def test_conv2d_bias_act_matches_torch_and_the_separate_ops(rng, activation, kernel, stride,
                                                            padding, groups):
    x_np, w_np, b_np = randn(rng, 2, 4, 9, 8, scale=2.0), randn(rng, *kernel), randn(rng, kernel[0])
    x, w, b = Tensor.from_numpy(x_np), Tensor.from_numpy(w_np), Tensor.from_numpy(b_np)
    ours = ops.conv2d_bias_act(x, w, b, stride=stride, padding=padding, groups=groups,
                               activation=activation, slope=0.1)
    theirs = TORCH_ACTIVATIONS[activation](F.conv2d(
        torch.from_numpy(x_np), torch.from_numpy(w_np), torch.from_numpy(b_np), stride=stride,
        padding=padding, groups=groups))
    assert_close(ours, theirs, what=f"conv2d_bias_act {activation}")
    # One backend call, the separate tensor ops' values bit for bit (the model files changed
    # to it without changing an answer).
    separate = x.conv2d(w, padding=padding, stride=stride, groups=groups).broadcast_add(
        b.reshape((1, kernel[0], 1, 1)))
    separate = {"none": separate, "relu": separate.relu(), "relu6": separate.clamp(0.0, 6.0),
                "leaky": separate.maximum(separate.affine(0.1, 0.0))}[activation]
    np.testing.assert_array_equal(ours.to_numpy(), separate.to_numpy())


def test_conv2d_bias_act_tracks_gradients_through_the_separate_ops(rng):
    x_np, w_np, b_np = randn(rng, 1, 3, 6, 6), randn(rng, 5, 3, 3, 3), randn(rng, 5)
    (x, tx), (w, tw), (b, tb) = pair(x_np), pair(w_np), pair(b_np)
    ours = ops.conv2d_bias_act(x, w, b, padding=1, activation="relu")
    theirs = F.relu(F.conv2d(tx, tw, tb, padding=1))
    assert_grads_close(ours, theirs, [(x, tx), (w, tw), (b, tb)])


def test_conv2d_bias_act_refuses_a_bad_activation_or_bias():
    x = Tensor.from_numpy(np.zeros((1, 2, 4, 4), dtype=np.float32))
    w = Tensor.from_numpy(np.zeros((3, 2, 3, 3), dtype=np.float32))
    with pytest.raises(CandleError, match="activation 'gelu'"):
        ops.conv2d_bias_act(x, w, activation="gelu")
    with pytest.raises(ShapeMismatch, match="bias \\[4\\] for a kernel of 3 output channels"):
        ops.conv2d_bias_act(x, w, Tensor.from_numpy(np.zeros(4, dtype=np.float32)))
    with pytest.raises(ShapeMismatch, match="conv2d"):
        ops.conv2d_bias_act(x, Tensor.from_numpy(np.zeros((3, 5, 3, 3), dtype=np.float32)))
