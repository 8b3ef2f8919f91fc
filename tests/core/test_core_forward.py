"""Forward values of the maths ops against numpy and PyTorch, on every CPU backend.

Tolerances against numpy's closed forms: per element, derived from the computation
(tests/tolerances_testlib.py): unary ops from the ulps of the functions they are made of (f32: one
evaluation against the float64 closed form; f64: two evaluations in double precision), binary
ops one rounding per side, sums from their length and the magnitudes summed, max/min exactly,
matmul from its inner length (half precision: f32 accumulation, then one rounding of the
format).
Tolerances against PyTorch (numpy.testing style, absolute + relative):
- f64: rtol 1e-12 -- both sides evaluate the same closed forms in double precision.
- f32: rtol 1e-5, atol 1e-6 -- a few ulps (f32 ulp ~1.2e-7 near 1) for transcendental
  functions whose libm implementations differ; erf/gelu_erf use a pure-numpy f32 fit with
  error < 3e-7 (see backend.numpy_backend), covered by atol 1e-6.
- f16/bf16: results are computed in f32 and rounded once, so they must agree with torch's
  half-precision ops within one ulp of the format (rtol 2**-10 for f16, 2**-7 for bf16).
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from candle_web import Tensor, bf16, f16, f32, f64
from tests.core.core_testlib import away_from, away_from_integers
from tests.tolerances_testlib import assert_within, dot_bound, elementwise_bound, sum_bound, unary_bound

RTOL = {f64: 1e-12, f32: 1e-5}
ATOL = {f64: 1e-12, f32: 1e-6}
HALF_RTOL = {f16: 2.0 ** -10, bf16: 2.0 ** -7}
NP_DTYPE = {f64: np.float64, f32: np.float32}
# f32 results are one evaluation against a float64 closed form (exact to f32's eyes); f64
# results are two double-precision evaluations.
EVALUATIONS = {f64: 2, f32: 1}
# add, sub, mul, div, maximum, minimum: one IEEE rounding (half an ulp) on each side.
ONE_ROUNDING_ULPS = 0.5


def _erf_ref(x):
    return np.vectorize(math.erf, otypes=[np.float64])(x.astype(np.float64))


def _gelu_tanh_ref(x):
    x = x.astype(np.float64)
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


# name -> (numpy reference on f64, torch function name/lambda, input sampler)
def _uniform(lo, hi):
    return lambda rng, shape: rng.uniform(lo, hi, shape)


def _signed(lo, hi):
    return lambda rng, shape: rng.uniform(lo, hi, shape) * rng.choice([-1.0, 1.0], shape)


def _off_integers(rng, shape):
    # floor/ceil/round: stay away from integers and halves, where torch's round-half-to-even
    # and Candle's half-away-from-zero legitimately differ (tested separately below).
    values = away_from_integers(rng.uniform(-5, 5, shape), 0.05)
    fraction = values - np.floor(values)
    return np.where(np.abs(fraction - 0.5) < 0.05, values + 0.1, values)


UNARY = {
    "exp": (np.exp, lambda t, x: t.exp(x), _uniform(-3, 3)),
    "log": (np.log, lambda t, x: t.log(x), _uniform(0.1, 5)),
    "sin": (np.sin, lambda t, x: t.sin(x), _uniform(-4, 4)),
    "cos": (np.cos, lambda t, x: t.cos(x), _uniform(-4, 4)),
    "tanh": (np.tanh, lambda t, x: t.tanh(x), _uniform(-3, 3)),
    "abs": (np.abs, lambda t, x: t.abs(x), _signed(0.05, 3)),
    "sqr": (np.square, lambda t, x: t.square(x), _uniform(-3, 3)),
    "sqrt": (np.sqrt, lambda t, x: t.sqrt(x), _uniform(0.1, 5)),
    "recip": (np.reciprocal, lambda t, x: t.reciprocal(x), _signed(0.2, 5)),
    "neg": (np.negative, lambda t, x: t.neg(x), _uniform(-3, 3)),
    "gelu": (_gelu_tanh_ref, lambda t, x: t.nn.functional.gelu(x, approximate="tanh"), _uniform(-4, 4)),
    "gelu_erf": (lambda x: 0.5 * x * (1.0 + _erf_ref(x / math.sqrt(2.0))),
                 lambda t, x: t.nn.functional.gelu(x), _uniform(-4, 4)),
    "erf": (_erf_ref, lambda t, x: t.erf(x), _uniform(-3, 3)),
    "relu": (lambda x: np.maximum(x, 0.0), lambda t, x: t.relu(x), _signed(0.05, 3)),
    "silu": (lambda x: x / (1.0 + np.exp(-x)), lambda t, x: t.nn.functional.silu(x), _uniform(-6, 6)),
    "sigmoid": (lambda x: 1.0 / (1.0 + np.exp(-x)), lambda t, x: t.sigmoid(x), _uniform(-6, 6)),
    "floor": (np.floor, lambda t, x: t.floor(x), _off_integers),
    "ceil": (np.ceil, lambda t, x: t.ceil(x), _off_integers),
    "round": (np.round, lambda t, x: t.round(x), _off_integers),
    "sign": (np.sign, lambda t, x: t.sign(x), _signed(0.05, 3)),
}


@pytest.mark.parametrize("name", sorted(UNARY))
@pytest.mark.parametrize("dtype", [f32, f64], ids=str)
def test_unary_against_numpy_and_torch(name, dtype, device, rng, torch):
    reference, torch_fn, sample = UNARY[name]
    x = sample(rng, (4, 7)).astype(NP_DTYPE[dtype])
    got = getattr(Tensor.from_numpy(x, device=device), name)()
    assert got.dtype is dtype and got.shape == (4, 7)
    expected = reference(x.astype(np.float64))
    assert_within(got.to_numpy(), expected,
                  unary_bound(name, x, expected, EVALUATIONS[dtype], NP_DTYPE[dtype]), name,
                  dtype=NP_DTYPE[dtype])
    from_torch = torch_fn(torch, torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(got.to_numpy(), from_torch, rtol=RTOL[dtype], atol=ATOL[dtype])


@pytest.mark.parametrize("name", sorted(UNARY))
@pytest.mark.parametrize("dtype", [f16, bf16], ids=str)
def test_unary_half_precision_against_torch(name, dtype, device, rng, torch):
    reference, torch_fn, sample = UNARY[name]
    x = sample(rng, (64,)).astype(np.float32)
    t = Tensor.from_numpy(x, dtype=dtype, device=device)
    torch_dtype = torch.float16 if dtype is f16 else torch.bfloat16
    x_torch = torch.from_numpy(x).to(torch_dtype)
    np.testing.assert_array_equal(t.to_numpy(), x_torch.float().numpy())  # same rounded input
    got = getattr(t, name)()
    assert got.dtype is dtype
    expected = torch_fn(torch, x_torch).float().numpy()
    np.testing.assert_allclose(got.to_numpy(), expected, rtol=HALF_RTOL[dtype], atol=1e-3)


def test_round_halves_away_from_zero_like_candle(device, torch):
    # Candle uses Rust's f32::round (half away from zero); torch.round and numpy.round round
    # half to even. 0.49999997 is the largest f32 below 0.5 (floor(x + 0.5) gets it wrong),
    # 8388609 is above 2**23 where x + 0.5 is not representable.
    values = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 0.49999997, -0.49999997, 8388609.0,
                       -8388609.0, 1e30, -0.3, np.inf, -np.inf], dtype=np.float32)
    got = Tensor.from_numpy(values, device=device).round().to_numpy()
    expected = np.array([1, 2, 3, -1, -2, -3, 0, 0, 8388609, -8388609, 1e30, -0.0, np.inf, -np.inf],
                        dtype=np.float32)
    np.testing.assert_array_equal(got, expected)
    assert np.signbit(got[11]), "round(-0.3) keeps the sign of zero, as Rust does"
    assert np.isnan(Tensor([float("nan")]).round().to_numpy()[0])
    # The documented difference with PyTorch: exactly at the halves.
    torch_round = torch.round(torch.from_numpy(values[:6])).numpy()
    np.testing.assert_array_equal(torch_round, [0, 2, 2, -0, -2, -2])
    assert not np.array_equal(got[:6], torch_round)


def test_integer_unary_ops(device):
    x = Tensor.from_numpy(np.array([-3, 0, 5], dtype=np.int64), device=device)
    assert x.abs().to_list() == [3, 0, 5]
    assert x.neg().to_list() == [3, 0, -5]
    assert x.sqr().to_list() == [9, 0, 25]
    assert x.relu().to_list() == [0, 0, 5]
    assert x.sign().to_list() == [-1, 0, 1]
    assert x.abs().dtype.name == "i64"


BINARY = {
    "add": (np.add, "add"), "sub": (np.subtract, "sub"), "mul": (np.multiply, "mul"),
    "div": (np.divide, "div"), "maximum": (np.maximum, "maximum"),
    "minimum": (np.minimum, "minimum"),
}


@pytest.mark.parametrize("name", sorted(BINARY))
@pytest.mark.parametrize("dtype", [f32, f64], ids=str)
def test_binary_same_shape_and_broadcast(name, dtype, device, rng, torch):
    reference, torch_name = BINARY[name]
    a = rng.uniform(-3, 3, (2, 3, 4)).astype(NP_DTYPE[dtype])
    b = away_from(rng.uniform(-3, 3, (2, 3, 4)), [0.0], 0.3).astype(NP_DTYPE[dtype])
    ta, tb = Tensor.from_numpy(a, device=device), Tensor.from_numpy(b, device=device)
    got = getattr(ta, name)(tb)
    want = reference(a, b)  # numpy in the same dtype: correctly rounded
    one_rounding = elementwise_bound(want, ONE_ROUNDING_ULPS, 2, NP_DTYPE[dtype])
    assert_within(got.to_numpy(), want, one_rounding, name)
    torch_out = getattr(torch, torch_name)(torch.from_numpy(a), torch.from_numpy(b)).numpy()
    np.testing.assert_allclose(got.to_numpy(), torch_out, rtol=RTOL[dtype], atol=ATOL[dtype])
    # Explicit broadcast on both sides: [2, 1, 4] op [3, 1].
    left = a[:, :1, :]
    right = b[0, :, :1]
    got = getattr(Tensor.from_numpy(left, device=device), "broadcast_" + name)(
        Tensor.from_numpy(right, device=device))
    assert got.shape == (2, 3, 4)
    want = reference(left, right)
    one_rounding = elementwise_bound(want, ONE_ROUNDING_ULPS, 2, NP_DTYPE[dtype])
    assert_within(got.to_numpy(), want, one_rounding, "broadcast_" + name)


@pytest.mark.parametrize("op", ["eq", "ne", "lt", "le", "gt", "ge"])
def test_comparisons_same_shape_and_broadcast(op, device, rng, torch):
    a = rng.integers(0, 3, (3, 4)).astype(np.float32)
    b = rng.integers(0, 3, (3, 4)).astype(np.float32)
    got = getattr(Tensor.from_numpy(a, device=device), op)(Tensor.from_numpy(b, device=device))
    assert got.dtype.name == "u8"
    expected = getattr(torch, op)(torch.from_numpy(a), torch.from_numpy(b)).numpy().astype(np.uint8)
    np.testing.assert_array_equal(got.to_numpy(), expected)
    row = b[:1]
    got = getattr(Tensor.from_numpy(a, device=device), "broadcast_" + op)(Tensor.from_numpy(row, device=device))
    expected = getattr(torch, op)(torch.from_numpy(a), torch.from_numpy(row)).numpy().astype(np.uint8)
    np.testing.assert_array_equal(got.to_numpy(), expected)
    scalar = getattr(Tensor.from_numpy(a, device=device), op)(1.0)
    np.testing.assert_array_equal(scalar.to_numpy(), getattr(np, {"eq": "equal", "ne": "not_equal",
                                  "lt": "less", "le": "less_equal", "gt": "greater",
                                  "ge": "greater_equal"}[op])(a, 1.0).astype(np.uint8))


def test_integer_binary_ops_follow_candle(device):
    a = Tensor.from_numpy(np.array([-7, 7, -8, 9], dtype=np.int64), device=device)
    b = Tensor.from_numpy(np.array([2, -2, 2, 3], dtype=np.int64), device=device)
    # Rust integer division truncates toward zero (numpy's // floors).
    assert a.div(b).to_list() == [-3, -3, -4, 3]
    assert a.add(b).to_list() == [-5, 5, -6, 12]
    assert a.mul(b).to_list() == [-14, -14, -16, 27]
    assert a.maximum(b).to_list() == [2, 7, 2, 9]
    u = Tensor.from_numpy(np.array([7, 9], dtype=np.uint32), device=device)
    assert u.div(Tensor.from_numpy(np.array([2, 3], dtype=np.uint32), device=device)).to_list() == [3, 3]


def test_scalar_operators_affine_powf_clamp(device, rng, torch):
    x = rng.uniform(0.5, 3, (3, 5))
    t = Tensor.from_numpy(x, device=device)
    np.testing.assert_allclose((t + 2).to_numpy(), x + 2)
    np.testing.assert_allclose((2 - t).to_numpy(), 2 - x)
    np.testing.assert_allclose((t * 3).to_numpy(), x * 3)
    np.testing.assert_allclose((t / 4).to_numpy(), x / 4)
    np.testing.assert_allclose((4 / t).to_numpy(), 4 / x)
    np.testing.assert_allclose((-t).to_numpy(), -x)
    np.testing.assert_allclose(t.affine(1.5, -0.25).to_numpy(), x * 1.5 - 0.25)
    np.testing.assert_allclose(t.powf(2.7).to_numpy(), torch.from_numpy(x).pow(2.7).numpy(), rtol=1e-12)
    np.testing.assert_allclose((t ** 0.5).to_numpy(), np.sqrt(x), rtol=1e-12)
    other = Tensor.from_numpy(rng.uniform(0.5, 2, (3, 5)), device=device)
    np.testing.assert_allclose(t.pow(other).to_numpy(), x ** other.to_numpy(), rtol=1e-12)
    np.testing.assert_allclose(t.clamp(1.0, 2.0).to_numpy(), torch.from_numpy(x).clamp(1.0, 2.0).numpy())
    lo = Tensor.from_numpy(np.full((1, 5), 1.2), device=device)
    np.testing.assert_allclose(t.clamp(lo, 2.5).to_numpy(), np.clip(x, 1.2, 2.5))


REDUCTIONS = ["sum", "mean", "max", "min"]


@pytest.mark.parametrize("op", REDUCTIONS)
@pytest.mark.parametrize("dtype", [f32, f64], ids=str)
def test_reductions_keepdim_and_not(op, dtype, device, rng, torch):
    x = rng.normal(size=(3, 4, 5)).astype(NP_DTYPE[dtype])
    t = Tensor.from_numpy(x, device=device)
    np_fn = {"sum": np.sum, "mean": np.mean, "max": np.max, "min": np.min}[op]
    torch_fn = {"sum": torch.sum, "mean": torch.mean, "max": torch.amax, "min": torch.amin}[op]
    for dims in [1, -1, (0, 2)]:
        kept = getattr(t, op + "_keepdim")(dims)
        dropped = getattr(t, op)(dims)
        expected = np_fn(x, axis=dims, keepdims=True)
        assert kept.shape == expected.shape
        assert dropped.shape == np_fn(x, axis=dims).shape
        bound = 0.0 if op in ("max", "min") else _sum_bound(x, dims, mean=op == "mean")
        assert_within(kept.to_numpy(), expected, bound, f"{op} over {dims}")
        np.testing.assert_allclose(dropped.to_numpy(), torch_fn(torch.from_numpy(x), dim=dims).numpy(),
                                   rtol=RTOL[dtype], atol=ATOL[dtype])
    assert t.sum_all().shape == ()
    everything = tuple(range(x.ndim))
    assert_within(t.sum_all().to_numpy(), x.sum(), _sum_bound(x, everything).reshape(()), "sum_all")
    assert_within(t.mean_all().to_numpy(), x.mean(),
                  _sum_bound(x, everything, mean=True).reshape(()), "mean_all")
    assert t.max_all().to_scalar() == x.max() and t.min_all().to_scalar() == x.min()


def _sum_bound(x, dims, mean=False):
    """Two evaluations (numpy's and the backend's) of sums over `dims`, n terms each; the mean
    divides once more."""
    dims = (dims,) if isinstance(dims, int) else dims
    n = int(np.prod([x.shape[d] for d in dims]))
    magnitudes = np.sum(np.abs(x.astype(np.float64)), axis=dims, keepdims=True)
    if mean:
        return sum_bound(magnitudes / n, n + 1, dtype=x.dtype)
    return sum_bound(magnitudes, n, dtype=x.dtype)


def test_arg_reductions_var_log_sum_exp_cumsum(device, rng, torch):
    x = rng.normal(size=(4, 6))
    t = Tensor.from_numpy(x, device=device)
    tx = torch.from_numpy(x)
    for dim in (0, 1, -1):
        assert t.argmax(dim).dtype.name == "u32"
        np.testing.assert_array_equal(t.argmax(dim).to_numpy(), tx.argmax(dim).numpy())
        np.testing.assert_array_equal(t.argmin(dim).to_numpy(), tx.argmin(dim).numpy())
        np.testing.assert_array_equal(t.argmax_keepdim(dim).to_numpy(), tx.argmax(dim, keepdim=True).numpy())
        np.testing.assert_array_equal(t.argmin_keepdim(dim).to_numpy(), tx.argmin(dim, keepdim=True).numpy())
        np.testing.assert_allclose(t.var(dim).to_numpy(), tx.var(dim).numpy(), rtol=1e-12)
        np.testing.assert_allclose(t.var_keepdim(dim).to_numpy(), tx.var(dim, keepdim=True).numpy(), rtol=1e-12)
        np.testing.assert_allclose(t.log_sum_exp(dim).to_numpy(), tx.logsumexp(dim).numpy(), rtol=1e-12)
        np.testing.assert_allclose(t.cumsum(dim).to_numpy(), tx.cumsum(dim).numpy(), rtol=1e-12, atol=1e-12)
    # Stable for large inputs, where a naive exp overflows.
    big = Tensor.from_numpy(np.array([[1000.0, 1000.0], [-1000.0, -1001.0]], dtype=np.float32), device=device)
    np.testing.assert_allclose(big.log_sum_exp(1).to_numpy(),
                               torch.tensor([[1000.0, 1000.0], [-1000.0, -1001.0]]).logsumexp(1).numpy(),
                               rtol=1e-6)
    ints = Tensor.from_numpy(np.array([[1, 2, 3], [4, 5, 6]], dtype=np.int64), device=device)
    assert ints.cumsum(1).to_list() == [[1, 3, 6], [4, 9, 15]]
    assert ints.sum(0).to_list() == [5, 7, 9]


@pytest.mark.parametrize("dtype", [f32, f64, f16, bf16], ids=str)
def test_matmul_batched_and_broadcast(dtype, device, rng, torch):
    a = rng.normal(size=(2, 3, 4, 5)).astype(np.float32)
    b = rng.normal(size=(2, 3, 5, 6)).astype(np.float32)
    ta = Tensor.from_numpy(a, dtype=dtype, device=device)
    tb = Tensor.from_numpy(b, dtype=dtype, device=device)
    got = ta.matmul(tb)
    assert got.dtype is dtype and got.shape == (2, 3, 4, 6)
    expected = ta.to_numpy().astype(np.float64) @ tb.to_numpy().astype(np.float64)
    assert_within(got.to_numpy(), expected, _matmul_bound(ta, tb, expected, dtype), str(dtype),
                  dtype=got.to_numpy().dtype)
    np.testing.assert_allclose((ta @ tb).to_numpy(), got.to_numpy())
    # broadcast_matmul: [2, 1, 4, 5] x [3, 5, 6] -> [2, 3, 4, 6]
    lhs = Tensor.from_numpy(a[:, :1], dtype=dtype, device=device)
    rhs = Tensor.from_numpy(b[0], dtype=dtype, device=device)
    got = lhs.broadcast_matmul(rhs)
    assert got.shape == (2, 3, 4, 6)
    torch_dtype = {f64: torch.float64, f32: torch.float64, f16: torch.float64, bf16: torch.float64}[dtype]
    expected = torch.matmul(torch.from_numpy(lhs.to_numpy()).to(torch_dtype),
                            torch.from_numpy(rhs.to_numpy()).to(torch_dtype)).numpy()
    assert_within(got.to_numpy(), expected, _matmul_bound(lhs, rhs, expected, dtype),
                  f"broadcast {dtype}", dtype=got.to_numpy().dtype)


# Half precision accumulates in f32 and rounds the result once to the format.
HALF_UNIT_ROUNDOFF = {f16: 2.0 ** -11, bf16: 2.0 ** -8}


def _matmul_bound(ta, tb, exact, dtype):
    """One evaluation of the product against its float64 value `exact`."""
    a, b = ta.to_numpy(), tb.to_numpy()
    if dtype is f64:
        return dot_bound(a, b, evaluations=1, dtype=np.float64)
    bound = dot_bound(a, b, evaluations=1)
    if dtype in HALF_UNIT_ROUNDOFF:
        # Rounding the f32 result: u_half of |exact| plus of the f32 error itself.
        half = HALF_UNIT_ROUNDOFF[dtype]
        bound = bound * (1 + half) + half * np.abs(exact)
    return bound


def test_matmul_on_transposed_views(device, rng):
    a = rng.normal(size=(5, 4))
    t = Tensor.from_numpy(a, device=device)
    np.testing.assert_allclose(t.t().matmul(t).to_numpy(), a.T @ a, rtol=1e-12)
    assert Tensor.from_numpy(np.arange(6).reshape(2, 3), device=device).matmul(
        Tensor.from_numpy(np.arange(6).reshape(3, 2), device=device)).to_list() == [[10, 13], [28, 40]]


CONV1D_CASES = [  # (c_in, c_out, length, kernel, padding, stride, dilation, groups)
    (3, 4, 11, 3, 0, 1, 1, 1),
    (4, 6, 13, 3, 1, 2, 1, 2),
    (2, 4, 16, 4, 2, 1, 2, 1),
    (6, 6, 10, 3, 1, 3, 2, 3),
]


@pytest.mark.parametrize("case", CONV1D_CASES, ids=str)
def test_conv1d_against_torch(case, device, rng, torch):
    c_in, c_out, length, kernel, padding, stride, dilation, groups = case
    x = rng.normal(size=(2, c_in, length))
    w = rng.normal(size=(c_out, c_in // groups, kernel))
    got = Tensor.from_numpy(x, device=device).conv1d(Tensor.from_numpy(w, device=device),
                                                     padding, stride, dilation, groups)
    expected = torch.nn.functional.conv1d(torch.from_numpy(x), torch.from_numpy(w), None, stride,
                                          padding, dilation, groups).numpy()
    assert got.shape == expected.shape
    np.testing.assert_allclose(got.to_numpy(), expected, rtol=1e-12, atol=1e-12)


CONV_T1D_CASES = [  # (c_in, c_out, length, kernel, padding, output_padding, stride, dilation, groups)
    (3, 4, 7, 3, 0, 0, 1, 1, 1),
    (4, 6, 5, 3, 1, 1, 2, 1, 2),
    (2, 2, 6, 4, 2, 0, 3, 2, 1),
    (4, 2, 5, 5, 0, 1, 1, 2, 2),
]


@pytest.mark.parametrize("case", CONV_T1D_CASES, ids=str)
def test_conv_transpose1d_against_torch(case, device, rng, torch):
    c_in, c_out, length, kernel, padding, output_padding, stride, dilation, groups = case
    x = rng.normal(size=(2, c_in, length))
    w = rng.normal(size=(c_in, c_out // groups, kernel))
    got = Tensor.from_numpy(x, device=device).conv_transpose1d(
        Tensor.from_numpy(w, device=device), padding, output_padding, stride, dilation, groups)
    expected = torch.nn.functional.conv_transpose1d(torch.from_numpy(x), torch.from_numpy(w), None,
                                                    stride, padding, output_padding, groups,
                                                    dilation).numpy()
    assert got.shape == expected.shape
    np.testing.assert_allclose(got.to_numpy(), expected, rtol=1e-12, atol=1e-12)


CONV2D_CASES = [  # (c_in, c_out, h, w, kernel_h, kernel_w, padding, stride, dilation, groups)
    (3, 4, 7, 8, 3, 3, 0, 1, 1, 1),
    (4, 6, 9, 7, 3, 2, 1, 2, 1, 2),
    (2, 3, 10, 10, 3, 3, 2, 1, 2, 1),
    (4, 4, 8, 9, 2, 3, 1, 2, 2, 4),
    (5, 5, 7, 6, 3, 3, 1, 1, 1, 5),  # depthwise
    (5, 3, 6, 7, 1, 1, 0, 1, 1, 1),  # pointwise
    (5, 3, 6, 7, 1, 1, 0, 2, 1, 1),  # 1x1 at stride 2
]


@pytest.mark.parametrize("case", CONV2D_CASES, ids=str)
def test_conv2d_against_torch(case, device, rng, torch):
    c_in, c_out, h, w_, k_h, k_w, padding, stride, dilation, groups = case
    x = rng.normal(size=(2, c_in, h, w_))
    w = rng.normal(size=(c_out, c_in // groups, k_h, k_w))
    got = Tensor.from_numpy(x, device=device).conv2d(Tensor.from_numpy(w, device=device),
                                                     padding, stride, dilation, groups)
    expected = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(w), None, stride,
                                          padding, dilation, groups).numpy()
    assert got.shape == expected.shape
    np.testing.assert_allclose(got.to_numpy(), expected, rtol=1e-12, atol=1e-12)


def test_conv_half_precision_stays_half(device, rng, torch):
    x = rng.normal(size=(1, 2, 9)).astype(np.float32)
    w = rng.normal(size=(3, 2, 3)).astype(np.float32)
    got = Tensor.from_numpy(x, dtype=bf16, device=device).conv1d(Tensor.from_numpy(w, dtype=bf16, device=device))
    assert got.dtype is bf16
    expected = torch.nn.functional.conv1d(torch.from_numpy(x).bfloat16().double(),
                                          torch.from_numpy(w).bfloat16().double()).numpy()
    np.testing.assert_allclose(got.to_numpy(), expected, rtol=2.0 ** -7, atol=2.0 ** -6)
