"""The cupy backend against the numpy reference, op by op, on a real CUDA device.

Skips with "no CUDA device present" when cupy or a GPU is missing (run scripts/gpu_check.sh
on a GPU machine). Tolerances per element, derived from each computation as in the numba
suites (tests/tolerances_testlib.py): sums, matmuls and convolutions from their length and the
magnitudes of their terms (cuBLAS and the kernels sum in other orders; TF32 is not enabled, it
would fail these bounds), elementwise ops from the ulps of CUDA's and numpy's functions, the row
kernels from the row length; integer, indexing, max/min and exact float ops exactly."""

from __future__ import annotations

import numpy as np
import pytest

from candle_web.quantized import QTensor
from tests.native.native_testlib import qmatmul_bound, rope_bound
from tests.tolerances_testlib import (assert_within, attention_bound, dot_bound, elementwise_bound,
                                      layer_norm_bound, log_softmax_bound, rms_norm_bound,
                                      silu_mul_bound, softmax_bound, sum_bound, unary_bound)

# add, sub, mul, div, maximum, minimum: one IEEE rounding (half an ulp) on each side.
ONE_ROUNDING_ULPS = 0.5


@pytest.fixture
def gpu(cupy_backend):
    def put(a):
        return cupy_backend.from_numpy(np.asarray(a))

    def get(a):
        return cupy_backend.to_numpy(a)

    return cupy_backend, put, get


@pytest.mark.parametrize("op", ["exp", "log", "sin", "cos", "tanh", "abs", "sqr", "sqrt", "recip",
                                "neg", "gelu", "gelu_erf", "erf", "relu", "silu", "floor", "ceil",
                                "round", "sign", "sigmoid"])
def test_unary(gpu, ref, op, rng):
    backend, put, get = gpu
    x = (rng.standard_normal(1000) * 3).astype(np.float32)
    x[:4] = [0.5, -2.5, 0.0, 1e-3]
    if op in ("log", "sqrt"):
        x = np.abs(x) + np.float32(0.1)
    want = ref.unary(op, x)
    assert_within(get(backend.unary(op, put(x))), want, unary_bound(op, x, want), op)


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div", "maximum", "minimum"])
def test_binary_and_int_division(gpu, ref, op, rng):
    backend, put, get = gpu
    a = rng.standard_normal((4, 5)).astype(np.float32)
    b = rng.standard_normal((1, 5)).astype(np.float32) + 3
    want = ref.binary(op, a, b)
    assert_within(get(backend.binary(op, put(a), put(b))), want,
                  elementwise_bound(want, ONE_ROUNDING_ULPS), op)
    ia = np.array([-7, 7, -8, 9, 0], np.int64)
    ib = np.array([2, -2, 3, 0, 5], np.int64)
    assert np.array_equal(get(backend.binary("div", put(ia), put(ib))), ref.binary("div", ia, ib))


def test_compare_where_cast_clamp_affine(gpu, ref, rng):
    backend, put, get = gpu
    a = rng.standard_normal(50).astype(np.float32) * 300
    b = rng.standard_normal(50).astype(np.float32)
    for op in ("eq", "ne", "lt", "le", "gt", "ge"):
        assert np.array_equal(get(backend.compare(op, put(a), put(b))), ref.compare(op, a, b))
    cond = ref.compare("gt", a, b)
    assert np.array_equal(get(backend.where(put(cond), put(a), put(b))), ref.where(cond, a, b))
    for dtype in (np.uint8, np.uint32, np.int64):
        assert np.array_equal(get(backend.cast(put(a), dtype)), ref.cast(a, dtype))
    assert np.array_equal(get(backend.clamp(put(a), -1.0, 2.0)), ref.clamp(a, -1.0, 2.0))
    assert_within(get(backend.affine(put(a), 0.5, -1.0)), ref.affine(a, 0.5, -1.0),
                  sum_bound(np.abs(a) * 0.5 + 1.0, 2))  # a product and a sum (or one FMA)


def test_reductions(gpu, ref, rng):
    backend, put, get = gpu
    x = rng.standard_normal((3, 7, 11)).astype(np.float32)
    sum_of_magnitudes = ref.reduce("sum", np.abs(x.astype(np.float64)), (1, 2), True)
    for op in ("sum", "max", "min"):
        bound = sum_bound(sum_of_magnitudes, 7 * 11) if op == "sum" else 0.0  # max/min: exact
        assert_within(get(backend.reduce(op, put(x), (1, 2), True)), ref.reduce(op, x, (1, 2), True),
                      bound, op)
    for op in ("argmax", "argmin"):
        for keep in (True, False):
            assert np.array_equal(get(backend.arg_reduce(op, put(x), 1, keep)),
                                  ref.arg_reduce(op, x, 1, keep))
    assert_within(get(backend.cumsum(put(x), 2)), ref.cumsum(x, 2),
                  sum_bound(np.cumsum(np.abs(x.astype(np.float64)), axis=2), x.shape[2]))


def test_matmul_and_convolutions(gpu, ref, rng):
    backend, put, get = gpu
    a = rng.standard_normal((2, 1, 5, 33)).astype(np.float32)
    b = rng.standard_normal((3, 33, 7)).astype(np.float32)
    assert_within(get(backend.matmul(put(a), put(b))), ref.matmul(a, b), dot_bound(a, b))

    # A convolution output is a dot over (input channels of its group) x (kernel taps): the
    # reference's convolution of the magnitudes, in float64, is that dot's sum of |terms|.
    def magnitudes(op, x, w, *args):
        return getattr(ref, op)(np.abs(x.astype(np.float64)), np.abs(w.astype(np.float64)), *args)

    x = rng.standard_normal((2, 4, 31)).astype(np.float32)
    w = rng.standard_normal((6, 2, 3)).astype(np.float32)
    assert_within(get(backend.conv1d(put(x), put(w), 2, 1, 1, 2)), ref.conv1d(x, w, 2, 1, 1, 2),
                  sum_bound(magnitudes("conv1d", x, w, 2, 1, 1, 2), w[0].size), "conv1d")
    wt = rng.standard_normal((4, 3, 3)).astype(np.float32)
    assert_within(get(backend.conv_transpose1d(put(x), put(wt), 2, 1, 1, 1, 1)),
                  ref.conv_transpose1d(x, wt, 2, 1, 1, 1, 1),
                  sum_bound(magnitudes("conv_transpose1d", x, wt, 2, 1, 1, 1, 1),
                            x.shape[1] * wt.shape[2]), "conv_transpose1d")
    x2 = rng.standard_normal((1, 3, 9, 8)).astype(np.float32)
    w2 = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    assert_within(get(backend.conv2d(put(x2), put(w2), 1, 1, 1, 1)), ref.conv2d(x2, w2, 1, 1, 1, 1),
                  sum_bound(magnitudes("conv2d", x2, w2, 1, 1, 1, 1), w2[0].size), "conv2d")


def test_indexing(gpu, ref, rng):
    backend, put, get = gpu
    x = rng.standard_normal((5, 6)).astype(np.float32)
    ids = np.array([4, 0, 4, 2], np.uint32)
    assert np.array_equal(get(backend.index_select(put(x), put(ids), 0)),
                          ref.index_select(x, ids, 0))
    gids = rng.integers(0, 6, (5, 3)).astype(np.uint32)
    assert np.array_equal(get(backend.gather(put(x), put(gids), 1)), ref.gather(x, gids, 1))
    src = rng.standard_normal((5, 3)).astype(np.float32)
    # Each output adds at most every source element of its row (or every listed row) to x.
    abs64 = np.abs(x.astype(np.float64))
    assert_within(get(backend.scatter_add(put(x), put(gids), put(src), 1)),
                  ref.scatter_add(x, gids, src, 1),
                  sum_bound(ref.scatter_add(abs64, gids, np.abs(src.astype(np.float64)), 1),
                            1 + src.shape[1]), "scatter_add")
    rows = rng.standard_normal((4, 6)).astype(np.float32)
    assert_within(get(backend.index_add(put(x), put(ids), put(rows), 0)),
                  ref.index_add(x, ids, rows, 0),
                  sum_bound(ref.index_add(abs64, ids, np.abs(rows.astype(np.float64)), 0),
                            1 + ids.size), "index_add")


@pytest.mark.parametrize("shape", [(1, 1), (3, 5, 17), (64, 1031)], ids=str)
def test_row_kernels(gpu, ref, shape, rng):
    backend, put, get = gpu
    x = (rng.standard_normal(shape) * 3).astype(np.float32)
    w = rng.standard_normal(shape[-1]).astype(np.float32)
    bias = rng.standard_normal(shape[-1]).astype(np.float32)
    gx, gw, gb = put(x), put(w), put(bias)
    assert_within(get(backend.softmax_last_dim(gx)), ref.softmax_last_dim(x), softmax_bound(x))
    want = ref.log_softmax_last_dim(x)
    assert_within(get(backend.log_softmax_last_dim(gx)), want, log_softmax_bound(x, want))
    for weight, b in ((w, bias), (None, None)):
        want = ref.layer_norm(x, weight, b, 1e-5)
        assert_within(get(backend.layer_norm(gx, None if weight is None else gw,
                                             None if b is None else gb, 1e-5)),
                      want, layer_norm_bound(x, weight, b, 1e-5, want))
    want = ref.rms_norm(x, w, 1e-6)
    assert_within(get(backend.rms_norm(gx, gw, 1e-6)), want, rms_norm_bound(x, 1e-6, want))
    x64 = x.astype(np.float64)
    assert_within(get(backend.softmax_last_dim(put(x64))), ref.softmax_last_dim(x64),
                  softmax_bound(x64, dtype=np.float64))


@pytest.mark.parametrize("op", ["rope", "rope_i"])
def test_rope_and_silu_mul(gpu, ref, op, rng):
    backend, put, get = gpu
    x = rng.standard_normal((2, 3, 5, 14)).astype(np.float32)
    angles = rng.uniform(-np.pi, np.pi, (5, 7))
    cos, sin = np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
    assert_within(get(getattr(backend, op)(put(x), put(cos), put(sin))),
                  getattr(ref, op)(x, cos, sin), rope_bound(x, cos, sin, op == "rope_i"), op)
    up = rng.standard_normal(x.shape).astype(np.float32)
    want = ref.silu_mul(x, up)
    assert_within(get(backend.silu_mul(put(x), put(up))), want, silu_mul_bound(want))


@pytest.mark.parametrize("tq,kv_heads,mask_kind", [(1, 4, None), (3, 1, "causal"),
                                                    (20, 4, "causal"), (1, 4, "padding")])
def test_attention(gpu, ref, tq, kv_heads, mask_kind, rng):
    backend, put, get = gpu
    batch, heads, tk, d = 2, 4, 37, 32
    q = rng.standard_normal((batch, heads, tq, d)).astype(np.float32)
    k = rng.standard_normal((batch, kv_heads, tk, d)).astype(np.float32)
    v = rng.standard_normal((batch, kv_heads, tk, d)).astype(np.float32)
    mask = None
    if mask_kind == "causal":
        rows = np.arange(tq)[:, None] + (tk - tq)
        mask = np.where(np.arange(tk)[None, :] > rows, -np.inf, 0.0).astype(np.float32)
    elif mask_kind == "padding":
        mask = np.zeros((batch, 1, 1, tk), np.float32)
        mask[1, ..., 30:] = -np.inf
    got = backend.attention(put(q), put(k), put(v), None if mask is None else put(mask), 0.17)
    assert_within(get(got), ref.attention(q, k, v, mask, 0.17), attention_bound(q, k, v, mask, 0.17))


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q6_K"])
@pytest.mark.parametrize("m", [1, 3, 12])
def test_qmatmul(gpu, ref, kind, m, rng):
    backend, put, get = gpu
    k = 768 if kind.endswith("_K") else 224
    weight = QTensor.from_float(rng.standard_normal((67, k)).astype(np.float32), kind)
    x = rng.standard_normal((m, k)).astype(np.float32)
    assert_within(get(backend.qmatmul(put(x), weight)), ref.qmatmul(x, weight),
                  qmatmul_bound(x, weight), kind)
    # The weight is uploaded once and reused.
    first = backend._device_weight(weight)
    backend.qmatmul(put(x), weight)
    assert backend._device_weight(weight) is first


def test_tensor_to_device_both_ways(cupy_backend, rng):
    from candle_web import Device, Tensor
    from candle_web.nn import ops

    x = rng.standard_normal((3, 40)).astype(np.float32)
    on_gpu = Tensor.from_numpy(x).to_device(Device.cuda(0))
    assert on_gpu.device == Device.cuda(0)
    assert not isinstance(on_gpu._data, np.ndarray)  # a cupy array stays on the device
    probs = ops.softmax_last_dim(on_gpu)
    back = probs.to_device(Device.cpu())
    assert_within(back.to_numpy(), ops.softmax_last_dim(Tensor.from_numpy(x)).to_numpy(),
                  softmax_bound(x))
