"""Gradients of every differentiable op: against torch autograd and against central finite
differences, all in f64.

Each case maps a list of input arrays to an output; the scalar loss is sum(output * W) with a
fixed random W, so every output element gets a distinct upstream gradient (a plain sum would
hide transposition or indexing mistakes in the backward rules).

Tolerances:
- against torch: rtol 1e-9, atol 1e-10 -- the same formulas in double precision; only the
  order of summation differs.
- finite differences: step 1e-6, central, so truncation error ~ step**2 * f''' ~ 1e-12 and
  rounding error ~ 1e-16 * |loss| / step ~ 1e-9; checked at atol 1e-6 + rtol 1e-5. Inputs keep
  away from kinks (abs, relu, max ties, clamp bounds) so the derivative exists there.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from candle_web import Tensor, Var, f32, f64
from tests.core.core_testlib import away_from

FD_STEP = 1e-6
FD_ATOL = 1e-6
FD_RTOL = 1e-5
TORCH_RTOL = 1e-9
TORCH_ATOL = 1e-10


class Case:
    def __init__(self, name, shapes, candle_fn, torch_fn, sample=None, finite_differences=True):
        self.name = name
        # False where a step of FD_STEP is meaningless (values pass through f32 on purpose).
        self.finite_differences = finite_differences
        self.shapes = shapes
        self.candle_fn = candle_fn
        self.torch_fn = torch_fn
        self.sample = sample or (lambda rng, shape: rng.uniform(-2, 2, shape))

    def __repr__(self):
        return self.name


def _positive(rng, shape):
    return rng.uniform(0.3, 3, shape)


def _off_zero(rng, shape):
    return away_from(rng.uniform(-2, 2, shape), [0.0], 0.1)


def _distinct(rng, shape):
    # No ties and gaps >= 0.05 between values, so max/min/argmax are unambiguous.
    count = int(np.prod(shape))
    return rng.permutation(np.linspace(-2, 2, count)).reshape(shape)


IDS = np.array([2, 0, 2, 1])
GATHER_IDS = np.array([[0, 2, 1], [2, 2, 0]])
MASK = np.array([[1, 0, 1], [0, 0, 1]], dtype=np.uint8)


def _ids(device, values):
    return Tensor.from_numpy(values.astype(np.int64), device=device)


def unary(name, torch_fn, sample=None):
    return Case(name, [(3, 4)], lambda d, x: getattr(x, name)(), lambda t, x: torch_fn(t, x), sample)


CASES = [
    unary("exp", lambda t, x: x.exp()),
    unary("log", lambda t, x: x.log(), _positive),
    unary("sin", lambda t, x: x.sin()),
    unary("cos", lambda t, x: x.cos()),
    unary("tanh", lambda t, x: x.tanh()),
    unary("abs", lambda t, x: x.abs(), _off_zero),
    unary("sqr", lambda t, x: x.square()),
    unary("sqrt", lambda t, x: x.sqrt(), _positive),
    unary("recip", lambda t, x: x.reciprocal(), _off_zero),
    unary("neg", lambda t, x: x.neg()),
    unary("gelu", lambda t, x: t.nn.functional.gelu(x, approximate="tanh")),
    unary("gelu_erf", lambda t, x: t.nn.functional.gelu(x)),
    unary("erf", lambda t, x: x.erf()),
    unary("relu", lambda t, x: x.relu(), _off_zero),
    unary("silu", lambda t, x: t.nn.functional.silu(x)),
    unary("sigmoid", lambda t, x: x.sigmoid()),
    Case("affine", [(3, 4)], lambda d, x: x.affine(-1.5, 0.25), lambda t, x: x * -1.5 + 0.25),
    Case("powf", [(3, 4)], lambda d, x: x.powf(2.5), lambda t, x: x.pow(2.5), _positive),
    Case("clamp", [(3, 4)], lambda d, x: x.clamp(-0.5, 0.7), lambda t, x: x.clamp(-0.5, 0.7),
         lambda rng, s: away_from(rng.uniform(-2, 2, s), [-0.5, 0.7], 0.05)),
    Case("add", [(3, 4), (3, 4)], lambda d, a, b: a + b, lambda t, a, b: a + b),
    Case("sub", [(3, 4), (3, 4)], lambda d, a, b: a - b, lambda t, a, b: a - b),
    Case("mul", [(3, 4), (3, 4)], lambda d, a, b: a * b, lambda t, a, b: a * b),
    Case("div", [(3, 4), (3, 4)], lambda d, a, b: a / b, lambda t, a, b: a / b, _off_zero),
    Case("maximum", [(12,), (12,)], lambda d, a, b: a.maximum(b), lambda t, a, b: t.maximum(a, b), _distinct),
    Case("minimum", [(12,), (12,)], lambda d, a, b: a.minimum(b), lambda t, a, b: t.minimum(a, b), _distinct),
    Case("pow", [(3, 4), (3, 4)], lambda d, a, b: a.pow(b), lambda t, a, b: a.pow(b), _positive),
    Case("broadcast_add", [(2, 1, 4), (3, 1)], lambda d, a, b: a.broadcast_add(b), lambda t, a, b: a + b),
    Case("broadcast_sub", [(2, 3, 4), (4,)], lambda d, a, b: a.broadcast_sub(b), lambda t, a, b: a - b),
    Case("broadcast_mul", [(2, 1, 4), (3, 1)], lambda d, a, b: a.broadcast_mul(b), lambda t, a, b: a * b),
    Case("broadcast_div", [(3, 1), (2, 1, 4)], lambda d, a, b: a.broadcast_div(b), lambda t, a, b: a / b,
         _off_zero),
    Case("broadcast_maximum", [(3, 4), (4,)], lambda d, a, b: a.broadcast_maximum(b),
         lambda t, a, b: t.maximum(a, b), _distinct),
    Case("broadcast_minimum", [(3, 4), (3, 1)], lambda d, a, b: a.broadcast_minimum(b),
         lambda t, a, b: t.minimum(a, b), _distinct),
    Case("sum", [(3, 4, 2)], lambda d, x: x.sum((0, 2)), lambda t, x: x.sum((0, 2))),
    Case("sum_keepdim", [(3, 4)], lambda d, x: x.sum_keepdim(1), lambda t, x: x.sum(1, keepdim=True)),
    Case("sum_all", [(3, 4)], lambda d, x: x.sum_all(), lambda t, x: x.sum()),
    Case("mean", [(3, 4)], lambda d, x: x.mean(0), lambda t, x: x.mean(0)),
    Case("max", [(3, 4)], lambda d, x: x.max(1), lambda t, x: x.amax(1), _distinct),
    Case("min_keepdim", [(3, 4)], lambda d, x: x.min_keepdim(0), lambda t, x: x.amin(0, keepdim=True),
         _distinct),
    Case("var", [(3, 5)], lambda d, x: x.var(1), lambda t, x: x.var(1)),
    Case("log_sum_exp", [(3, 4)], lambda d, x: x.log_sum_exp(1), lambda t, x: x.logsumexp(1)),
    Case("cumsum", [(3, 4)], lambda d, x: x.cumsum(1), lambda t, x: x.cumsum(1)),
    Case("matmul", [(2, 3, 4), (2, 4, 5)], lambda d, a, b: a.matmul(b), lambda t, a, b: a @ b),
    Case("broadcast_matmul", [(2, 1, 3, 4), (3, 4, 2)], lambda d, a, b: a.broadcast_matmul(b),
         lambda t, a, b: a @ b),
    Case("reshape", [(3, 4)], lambda d, x: x.reshape(2, -1), lambda t, x: x.reshape(2, -1)),
    Case("transpose", [(2, 3, 4)], lambda d, x: x.transpose(0, 2), lambda t, x: x.transpose(0, 2)),
    Case("permute", [(2, 3, 4)], lambda d, x: x.permute(1, 2, 0), lambda t, x: x.permute(1, 2, 0)),
    Case("t", [(3, 4)], lambda d, x: x.t(), lambda t, x: x.t()),
    Case("narrow", [(3, 5)], lambda d, x: x.narrow(1, 1, 3), lambda t, x: x.narrow(1, 1, 3)),
    Case("i", [(3, 5)], lambda d, x: x.i(1, slice(0, 4, 2)), lambda t, x: x[1, 0:4:2]),
    Case("squeeze_unsqueeze", [(3, 1, 4)], lambda d, x: x.squeeze(1).unsqueeze(0),
         lambda t, x: x.squeeze(1).unsqueeze(0)),
    Case("flatten", [(2, 3, 4)], lambda d, x: x.flatten(1, 2), lambda t, x: x.flatten(1, 2)),
    Case("contiguous", [(3, 4)], lambda d, x: x.t().contiguous(), lambda t, x: x.t().contiguous()),
    Case("broadcast_as", [(3, 1)], lambda d, x: x.broadcast_as((2, 3, 4)), lambda t, x: x.expand(2, 3, 4)),
    Case("broadcast_left", [(3, 4)], lambda d, x: x.broadcast_left(2), lambda t, x: x.expand(2, 3, 4)),
    Case("pad_with_zeros", [(3, 4)], lambda d, x: x.pad_with_zeros(1, 2, 1),
         lambda t, x: t.nn.functional.pad(x, (2, 1))),
    Case("chunk", [(7, 3)], lambda d, x: x.chunk(3, 0)[1].mul(x.chunk(3, 0)[2]),
         lambda t, x: x[3:5] * x[5:7]),
    Case("cat", [(2, 3), (4, 3)], lambda d, a, b: Tensor.cat([a, b, a], 0), lambda t, a, b: t.cat([a, b, a], 0)),
    Case("stack", [(2, 3), (2, 3)], lambda d, a, b: Tensor.stack([a, b], 1), lambda t, a, b: t.stack([a, b], 1)),
    Case("index_select", [(3, 4)], lambda d, x: x.index_select(_ids(d, IDS), 0),
         lambda t, x: x.index_select(0, t.from_numpy(IDS))),
    Case("i_with_index_list", [(3, 4)], lambda d, x: x.i(slice(None), [3, 0, 3]),
         lambda t, x: x[:, [3, 0, 3]]),
    Case("embedding", [(3, 4)], lambda d, x: x.embedding(_ids(d, GATHER_IDS)),
         lambda t, x: t.nn.functional.embedding(t.from_numpy(GATHER_IDS), x)),
    Case("gather", [(2, 4)], lambda d, x: x.gather(_ids(d, GATHER_IDS), 1),
         lambda t, x: x.gather(1, t.from_numpy(GATHER_IDS))),
    Case("scatter_add", [(2, 3), (2, 3)], lambda d, base, src: base.scatter_add(_ids(d, GATHER_IDS), src, 1),
         lambda t, base, src: base.scatter_add(1, t.from_numpy(GATHER_IDS), src)),
    Case("index_add", [(3, 2), (4, 2)], lambda d, base, src: base.index_add(_ids(d, IDS), src, 0),
         lambda t, base, src: base.index_add(0, t.from_numpy(IDS), src)),
    Case("where_cond", [(2, 3), (2, 3)],
         lambda d, a, b: Tensor.from_numpy(MASK, device=d).where_cond(a, b),
         lambda t, a, b: t.where(t.from_numpy(MASK).bool(), a, b)),
    Case("conv1d", [(2, 4, 9), (6, 2, 3)], lambda d, x, w: x.conv1d(w, 1, 2, 1, 2),
         lambda t, x, w: t.nn.functional.conv1d(x, w, None, 2, 1, 1, 2)),
    Case("conv1d_dilated", [(1, 2, 10), (3, 2, 3)], lambda d, x, w: x.conv1d(w, 2, 1, 2, 1),
         lambda t, x, w: t.nn.functional.conv1d(x, w, None, 1, 2, 2, 1)),
    Case("conv_transpose1d", [(2, 4, 5), (4, 3, 3)], lambda d, x, w: x.conv_transpose1d(w, 1, 1, 2, 1, 2),
         lambda t, x, w: t.nn.functional.conv_transpose1d(x, w, None, 2, 1, 1, 2, 1)),
    Case("conv_transpose1d_dilated", [(1, 2, 4), (2, 2, 3)], lambda d, x, w: x.conv_transpose1d(w, 0, 0, 1, 2),
         lambda t, x, w: t.nn.functional.conv_transpose1d(x, w, None, 1, 0, 0, 1, 2)),
    Case("conv2d", [(1, 4, 6, 5), (4, 2, 3, 2)], lambda d, x, w: x.conv2d(w, 1, 2, 1, 2),
         lambda t, x, w: t.nn.functional.conv2d(x, w, None, 2, 1, 1, 2)),
    Case("conv2d_dilated", [(1, 2, 7, 7), (2, 2, 2, 2)], lambda d, x, w: x.conv2d(w, 1, 1, 2, 1),
         lambda t, x, w: t.nn.functional.conv2d(x, w, None, 1, 1, 2, 1)),
    Case("to_dtype_round_trip", [(3, 4)], lambda d, x: x.to_dtype(f32).to_dtype(f64).sqr(),
         lambda t, x: x.float().double().square(), lambda rng, s: rng.integers(-8, 8, s) / 4.0,
         finite_differences=False),
]


def _loss(case, device, arrays, weight, as_var):
    inputs = [Var(a, device=device) if as_var else Tensor.from_numpy(a, device=device) for a in arrays]
    out = case.candle_fn(device, *inputs)
    loss = out.mul(Tensor.from_numpy(weight, device=device)).sum_all()
    return inputs, out, loss


def _inputs(case, rng):
    return [case.sample(rng, shape).astype(np.float64) for shape in case.shapes]


@pytest.mark.parametrize("case", CASES, ids=repr)
def test_gradient_against_torch(case, device, rng, torch):
    arrays = _inputs(case, rng)
    torch_inputs = [torch.from_numpy(a.copy()).requires_grad_(True) for a in arrays]
    torch_out = case.torch_fn(torch, *torch_inputs)
    weight = rng.normal(size=tuple(torch_out.shape))
    (torch_out * torch.from_numpy(weight)).sum().backward()

    inputs, out, loss = _loss(case, device, arrays, weight, as_var=True)
    assert out.shape == tuple(torch_out.shape)
    np.testing.assert_allclose(out.to_numpy(), torch_out.detach().numpy(), rtol=TORCH_RTOL, atol=TORCH_ATOL)
    grads = loss.backward()
    for var, torch_input in zip(inputs, torch_inputs):
        np.testing.assert_allclose(grads[var].to_numpy(), torch_input.grad.numpy(),
                                   rtol=TORCH_RTOL, atol=TORCH_ATOL, err_msg=case.name)


@pytest.mark.parametrize("case", [c for c in CASES if c.finite_differences], ids=repr)
def test_gradient_against_finite_differences(case, device, rng):
    arrays = _inputs(case, rng)
    probe = case.candle_fn(device, *[Tensor.from_numpy(a, device=device) for a in arrays])
    weight = rng.normal(size=tuple(probe.shape))
    inputs, _, loss = _loss(case, device, arrays, weight, as_var=True)
    grads = loss.backward()
    for position, var in enumerate(inputs):
        numeric = np.zeros_like(arrays[position])
        for index in np.ndindex(arrays[position].shape):
            values = []
            for step in (FD_STEP, -FD_STEP):
                shifted = [a.copy() for a in arrays]
                shifted[position][index] += step
                values.append(_loss(case, device, shifted, weight, as_var=False)[2].to_scalar())
            numeric[index] = (values[0] - values[1]) / (2 * FD_STEP)
        np.testing.assert_allclose(grads[var].to_numpy(), numeric, atol=FD_ATOL, rtol=FD_RTOL,
                                   err_msg=f"{case.name} input {position}")


@pytest.mark.parametrize("name", ["floor", "ceil", "round", "sign"])
def test_piecewise_constant_ops_have_zero_gradient(name, device, torch):
    x = Var(np.array([-1.3, 0.4, 2.7]), device=device)
    grads = getattr(x, name)().sum_all().backward()
    np.testing.assert_array_equal(grads[x].to_numpy(), [0.0, 0.0, 0.0])
    torch_x = torch.tensor([-1.3, 0.4, 2.7], dtype=torch.float64, requires_grad=True)
    getattr(torch, name)(torch_x).sum().backward()
    np.testing.assert_array_equal(torch_x.grad.numpy(), [0.0, 0.0, 0.0])


def test_gradient_accumulates_over_reuse_and_flows_through_f32(device):
    x = Var(np.array([1.0, 2.0, 3.0]), dtype=f32, device=device)
    y = x.mul(x).add(x.affine(3.0, 0.0)).sum_all()  # sum(x^2 + 3x): grad 2x + 3
    grads = y.backward()
    np.testing.assert_allclose(grads[x].to_numpy(), [5.0, 7.0, 9.0])
    assert grads[x].dtype is f32
    assert math.isclose(y.to_scalar(), 1 + 4 + 9 + 18)
