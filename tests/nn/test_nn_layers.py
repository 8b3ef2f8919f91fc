"""candle_web.nn layers against PyTorch: Linear, Embedding, LayerNorm, RmsNorm, Conv1d, Conv2d
and Activation (HF config names against transformers' ACT2FN), forward and gradients."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from candle_web import CandleError, ShapeMismatch, Tensor, UnsupportedError, Var, nn
from tests.nn.nn_testlib import (ATOL_ELEMENTWISE, RTOL_ELEMENTWISE, assert_close,
                                 assert_grads_close, pair, randn)

torch = pytest.importorskip("torch")
F = torch.nn.functional


@pytest.fixture
def rng():
    return np.random.default_rng(0)


# -- Linear ------------------------------------------------------------------------------------

@pytest.mark.parametrize("input_shape", [(5, 7), (2, 3, 7)], ids=["2d", "3d"])
@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "no_bias"])
def test_linear_matches_torch(rng, input_shape, with_bias):
    x, tx = pair(randn(rng, *input_shape))
    w, tw = pair(randn(rng, 4, 7))
    b, tb = pair(randn(rng, 4)) if with_bias else (None, None)
    ours = nn.Linear(w, b)(x)
    theirs = F.linear(tx, tw, tb)
    assert_close(ours, theirs, what="linear forward")
    leaves = [(x, tx), (w, tw)] + ([(b, tb)] if with_bias else [])
    assert_grads_close(ours, theirs, leaves)


def test_linear_rejects_a_wrong_input_width():
    layer = nn.Linear(Tensor.zeros((4, 7)))
    for bad_shape in [(2, 3, 6), (5, 4), (2, 7, 3)]:
        with pytest.raises(ShapeMismatch, match=r"linear.*%s.*\[4, 7\]" % re.escape(str(list(bad_shape)))):
            layer(Tensor.zeros(bad_shape))


def test_linear_builder_shapes_and_default_init():
    varmap = nn.VarMap()
    layer = nn.linear(64, 32, nn.VarBuilder.from_varmap(varmap))
    assert set(varmap.data()) == {"weight", "bias"}
    assert layer.weight.dims() == (32, 64) and layer.bias.dims() == (32,)
    # Kaiming normal with ReLU gain: std sqrt(2 / fan_in); 2048 samples pin it within ~10%.
    std = float(np.std(layer.weight.to_numpy()))
    assert abs(std - math.sqrt(2.0 / 64)) < 0.1 * math.sqrt(2.0 / 64)
    bound = 1.0 / math.sqrt(64)
    assert np.all(np.abs(layer.bias.to_numpy()) <= bound)
    assert nn.linear_no_bias(64, 8, nn.VarBuilder.from_varmap(nn.VarMap())).bias is None


# -- Embedding ---------------------------------------------------------------------------------

def test_embedding_matches_torch(rng):
    table, ttable = pair(randn(rng, 11, 6))
    ids = np.array([[3, 0, 10], [3, 3, 7]], dtype=np.int64)
    ours = nn.Embedding(table)(Tensor.from_numpy(ids.astype(np.uint32)))
    theirs = F.embedding(torch.from_numpy(ids), ttable)
    assert_close(ours, theirs, rtol=0, atol=0, what="embedding forward")
    # Repeated ids (3 appears three times) must accumulate their gradients.
    assert_grads_close(ours, theirs, [(table, ttable)], rtol=RTOL_ELEMENTWISE, atol=ATOL_ELEMENTWISE)


def test_embedding_out_of_range_id_is_a_candle_error():
    table = nn.Embedding(Tensor.zeros((5, 2)))
    with pytest.raises(CandleError):
        table(Tensor.from_numpy(np.array([0, 5], np.uint32)))


# -- LayerNorm / RmsNorm -------------------------------------------------------------------------

@pytest.mark.parametrize("affine", [True, False])
def test_layer_norm_matches_torch(rng, affine):
    x, tx = pair(randn(rng, 2, 3, 16, scale=3.0) + 5.0)  # an offset exercises the centring
    w, tw = pair(randn(rng, 16)) if affine else (None, None)
    b, tb = pair(randn(rng, 16)) if affine else (None, None)
    eps = 1e-5
    ours = nn.LayerNorm(w, b, eps)(x)
    theirs = F.layer_norm(tx, (16,), tw, tb, eps)
    assert_close(ours, theirs, what="layer_norm forward")
    leaves = [(x, tx)] + ([(w, tw), (b, tb)] if affine else [])
    assert_grads_close(ours, theirs, leaves)


def _rms_norm_reference(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """x / sqrt(mean(x^2) + eps) * w, in float64."""
    x64 = x.astype(np.float64)
    return x64 / np.sqrt(np.mean(x64 * x64, axis=-1, keepdims=True) + eps) * weight


def test_rms_norm_matches_formula_and_torch(rng):
    x_np, w_np = randn(rng, 2, 5, 12, scale=2.0), randn(rng, 12)
    eps = 1e-6
    x, tx = pair(x_np)
    w, tw = pair(w_np)
    ours = nn.RmsNorm(w, eps)(x)
    theirs = F.rms_norm(tx, (12,), tw, eps)
    assert_close(ours, _rms_norm_reference(x_np, w_np, eps), what="rms_norm vs formula")
    assert_close(ours, theirs, what="rms_norm vs torch")
    torch_module = torch.nn.RMSNorm(12, eps=eps)
    with torch.no_grad():
        torch_module.weight.copy_(torch.from_numpy(w_np))
    assert_close(ours, torch_module(torch.from_numpy(x_np)), what="rms_norm vs torch.nn.RMSNorm")
    assert_grads_close(ours, theirs, [(x, tx), (w, tw)])
    # Inference (fused kernel) gives the same values as the tracked (composed) path.
    inference = nn.RmsNorm(Tensor.from_numpy(w_np), eps)(Tensor.from_numpy(x_np))
    assert_close(inference, theirs, what="rms_norm fused")


def test_norm_builders_default_to_identity_affine():
    vb = nn.VarBuilder.from_varmap(nn.VarMap())
    ln = nn.layer_norm(8, 1e-5, vb.pp("ln"))
    rms = nn.rms_norm(8, 1e-6, vb.pp("rms"))
    np.testing.assert_array_equal(ln.weight.to_numpy(), np.ones(8, np.float32))
    np.testing.assert_array_equal(ln.bias.to_numpy(), np.zeros(8, np.float32))
    np.testing.assert_array_equal(rms.weight.to_numpy(), np.ones(8, np.float32))


# -- Conv1d / Conv2d ---------------------------------------------------------------------------

@pytest.mark.parametrize("padding,stride,dilation,groups",
                         [(0, 1, 1, 1), (2, 2, 1, 1), (1, 1, 2, 2)])
def test_conv1d_layer_matches_torch(rng, padding, stride, dilation, groups):
    x, tx = pair(randn(rng, 2, 4, 13))
    w, tw = pair(randn(rng, 6, 4 // groups, 3))
    b, tb = pair(randn(rng, 6))
    ours = nn.Conv1d(w, b, padding, stride, dilation, groups)(x)
    theirs = F.conv1d(tx, tw, tb, stride, padding, dilation, groups)
    assert_close(ours, theirs, what="conv1d forward")
    assert_grads_close(ours, theirs, [(x, tx), (w, tw), (b, tb)])


@pytest.mark.parametrize("padding,stride,dilation,groups", [(0, 1, 1, 1), (1, 2, 1, 2)])
def test_conv2d_layer_matches_torch(rng, padding, stride, dilation, groups):
    x, tx = pair(randn(rng, 2, 4, 7, 6))
    w, tw = pair(randn(rng, 6, 4 // groups, 3, 3))
    b, tb = pair(randn(rng, 6))
    ours = nn.Conv2d(w, b, padding, stride, dilation, groups)(x)
    theirs = F.conv2d(tx, tw, tb, stride, padding, dilation, groups)
    assert_close(ours, theirs, what="conv2d forward")
    assert_grads_close(ours, theirs, [(x, tx), (w, tw), (b, tb)])


def test_conv_builders_create_weight_and_bias_shapes():
    vb = nn.VarBuilder.from_varmap(nn.VarMap())
    c1 = nn.conv1d(4, 6, 3, vb.pp("c1"), padding=1, groups=2)
    c2 = nn.conv2d(3, 5, 3, vb.pp("c2"), stride=2)
    assert c1.weight.dims() == (6, 2, 3) and c1.bias.dims() == (6,)
    assert c2.weight.dims() == (5, 3, 3, 3) and c2.bias.dims() == (5,)
    out = c2(Tensor.from_numpy(np.zeros((1, 3, 9, 9), np.float32)))
    assert out.dims() == (1, 5, 4, 4)


# -- Activation --------------------------------------------------------------------------------

# The names candle_web accepts and their meaning. HF's "gelu" is the exact erf form; gelu_new,
# gelu_pytorch_tanh, gelu_fast and gelu_accurate are the tanh approximation.
ACTIVATION_NAMES = ["gelu", "gelu_new", "gelu_pytorch_tanh", "gelu_fast", "gelu_accurate",
                    "quick_gelu", "relu", "silu", "swish", "sigmoid", "tanh"]


@pytest.mark.parametrize("name", ACTIVATION_NAMES)
def test_activation_matches_transformers_act2fn(name):
    activations = pytest.importorskip("transformers.activations")
    x_np = np.linspace(-8.0, 8.0, 401, dtype=np.float32)
    x, tx = pair(x_np)
    ours = nn.Activation(name)(x)
    theirs = activations.ACT2FN[name](tx)
    # erf/tanh/exp are evaluated by different libm/kernels: a few ulps, plus an absolute floor
    # near the zeros of the functions.
    assert_close(ours, theirs, rtol=1e-5, atol=2e-6, what=f"{name} forward")
    assert_grads_close(ours, theirs, [(x, tx)], rtol=1e-4, atol=1e-5)


def _gelu_erf(x: float) -> float:
    return 0.5 * x * (1.0 + math.erf(x / math.sqrt(2.0)))


def _gelu_tanh(x: float) -> float:
    return 0.5 * x * (1.0 + math.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def test_activation_gelu_flavours_are_the_right_formulas():
    """Guard against swapping the erf and tanh forms: at x = 2.5 they differ by 4.4e-4,
    far above f32 rounding (~2.4e-7 there), so each must match its own formula."""
    x_value = 2.5
    x = Tensor.from_numpy(np.array([x_value], np.float32))
    erf_form = float(nn.Activation("gelu")(x).to_numpy()[0])
    tanh_form = float(nn.Activation("gelu_new")(x).to_numpy()[0])
    assert erf_form == pytest.approx(_gelu_erf(x_value), abs=1e-6)
    assert tanh_form == pytest.approx(_gelu_tanh(x_value), abs=1e-6)
    assert abs(erf_form - tanh_form) > 4e-4


def test_every_accepted_activation_name_is_tested_above():
    from candle_web.nn.layers import _ACTIVATIONS

    assert sorted(_ACTIVATIONS) == sorted(ACTIVATION_NAMES)


def test_activation_unknown_name_raises_naming_it():
    with pytest.raises(UnsupportedError, match="no_such_act"):
        nn.Activation("no_such_act")


def test_activation_is_case_insensitive_like_configs():
    x = Var(np.array([-1.0, 0.5], np.float32))
    assert_close(nn.Activation("SiLU")(x), nn.Activation("silu")(x), rtol=0, atol=0)
