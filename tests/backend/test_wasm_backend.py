"""The wasm backend (pkg/candle_web/backend/wasm/backend.py) natively, on web/vendor/kernels.wasm
under wasmtime, against the numpy reference backend.

What the core op suite (tests/core, which also runs on "wasm") does not reach: matmul on
strided and transposed views (passed as strides, not copied) and with batch broadcasting, the
fused row kernels, attention on a KV cache's capacity stride with masks, quantized matmul from
every GGML type the module multiplies, the cases that must fall through to numpy unchanged,
the two hosts' argument handling, and one real model decoding the same tokens as numpy.

Tolerances are derived per element (tests/tolerances_testlib.py): matmul and qmatmul as dot products
(any summation order), the row kernels and attention from their lengths and the softmax
weights, activations from the ulps of the functions they are made of. The kernels' own
accuracy on edge cases is tests/kernels' business; here one bound per op checks the wiring.
"""

from __future__ import annotations

import ctypes
import math

import numpy as np
import pytest

from candle_web import BackendUnavailable, Device
from candle_web.backend import get_backend
from candle_web.backend.base import ACTIVATIONS
from candle_web.backend.wasm import abi as wasm_abi
from candle_web.backend.numpy_backend import NumpyBackend
from candle_web.core.errors import CandleError
from candle_web.quantized import GgmlDType, QTensor

from tests.wasm_testlib import (QUANT_EXTRA_ROUNDINGS, f32, quant_term_magnitudes, random_qweight,
                                rope_bound)
from tests.tolerances_testlib import (assert_within, attention_bound, dot_bound, layer_norm_bound,
                                      log_softmax_bound, rms_norm_bound, silu_mul_bound,
                                      softmax_bound, sum_bound, unary_bound)


@pytest.fixture(scope="module")
def wasm():
    pytest.importorskip("wasmtime", reason="the wasm backend runs natively under wasmtime "
                        "(pip install 'candle-web[dev]')")
    try:
        return get_backend("wasm")
    except BackendUnavailable as e:
        pytest.skip(f"wasm backend unavailable: {e}")


@pytest.fixture(scope="module")
def ref():
    return NumpyBackend()


class Spy:
    """A host that records each call (name, args) before passing it on."""

    def __init__(self, host):
        self.host = host
        self.kind = "spy"
        self.log = []

    def call(self, name, *args):
        self.log.append((name, args))
        return self.host.call(name, *args)

    def kernel(self, name):
        return lambda *args: self.call(name, *args)

    def names(self):
        return [name for name, _ in self.log]

    def __getattr__(self, name):  # the host's other attributes (scratch_bytes)
        return getattr(self.host, name)


@pytest.fixture
def spy(wasm):
    """A WasmBackend on a recording host (the same module instance)."""
    from candle_web.backend.wasm.backend import WasmBackend

    return WasmBackend(Spy(wasm.host))


@pytest.fixture
def rng():
    return np.random.default_rng(20251202)


def _matmul_cases(rng):
    w = f32(rng, 37, 19)  # a Linear weight [out, in]
    wide = f32(rng, 5, 40)
    yield "contiguous", f32(rng, 6, 19), w.T
    yield "both transposed", f32(rng, 19, 6).T, f32(rng, 37, 19).T
    yield "strided rows and columns", wide[:, ::2], f32(rng, 60, 9)[::3]
    yield "one row (decode)", f32(rng, 1, 19), w.T
    yield "weight times a column", w, f32(rng, 1, 19).T
    yield "K not a multiple of 4", f32(rng, 3, 7), f32(rng, 7, 5)
    yield "batched", f32(rng, 2, 3, 4, 19), f32(rng, 2, 3, 19, 6)
    yield "batch broadcast", f32(rng, 1, 1, 4, 9), f32(rng, 2, 3, 9, 5)
    yield "2-D weight under a batch", f32(rng, 3, 4, 19), w.T
    yield "heads as a transposed view", f32(rng, 2, 4, 3, 8).transpose(0, 2, 1, 3), \
        f32(rng, 2, 3, 8, 4)
    yield "broadcast over different dims (loops over one)", f32(rng, 2, 1, 4, 6), \
        f32(rng, 1, 3, 6, 5)


def test_matmul_on_views_and_batches_equals_numpy(wasm, spy, ref, rng):
    for what, a, b in _matmul_cases(rng):
        want = ref.matmul(a, b)
        got = wasm.matmul(a, b)
        assert_within(got, want, dot_bound(a, b), f"matmul {what}")
        spy.host.log.clear()
        spy.matmul(a, b)
        assert spy.host.names()[0] == "gemm_f32", what


def test_matmul_passes_transposed_and_strided_views_without_copying(spy, rng):
    w = f32(rng, 37, 19)
    x = f32(rng, 50, 40)[::2, 3:22]  # rows of stride 80, a column offset
    spy.matmul(x, w.T)
    (name, args), = spy.host.log
    a, b = args[4], args[8]
    assert name == "gemm_f32" and args[:4] == (1, 25, 37, 19)
    assert a.__array_interface__["data"][0] == x.__array_interface__["data"][0]
    assert a.strides == x.strides and np.shares_memory(a, x)
    assert np.shares_memory(b, w) and b.strides == w.T.strides
    assert args[5:8] == (0, 80, 1) and args[9:12] == (0, 1, 19)


def test_matmul_collapses_batch_dims_into_one_call(spy, rng):
    q = f32(rng, 2, 3, 5, 8)
    k_t = f32(rng, 2, 3, 8, 7)
    spy.matmul(q, k_t)
    assert spy.host.names() == ["gemm_f32"]
    assert spy.host.log[0][1][0] == 6  # batch 2 x 3 in one call
    spy.host.log.clear()
    spy.matmul(f32(rng, 2, 1, 4, 6), f32(rng, 1, 3, 6, 5))  # (0, s) strides: loops over b
    assert spy.host.names() == ["gemm_f32"] * 2


@pytest.mark.parametrize("dtype", [np.float64, np.int64, np.uint8])
def test_matmul_other_dtypes_fall_through_to_numpy(spy, ref, rng, dtype):
    a = (rng.standard_normal((3, 4)) * 3).astype(dtype)
    b = (rng.standard_normal((4, 2)) * 3).astype(dtype)
    np.testing.assert_array_equal(spy.matmul(a, b), ref.matmul(a, b))
    assert spy.host.log == []


def test_matmul_empty_dims_fall_through(spy, ref):
    for a, b in ((np.ones((0, 3), np.float32), np.ones((3, 2), np.float32)),
                 (np.ones((2, 0), np.float32), np.ones((0, 4), np.float32))):
        np.testing.assert_array_equal(spy.matmul(a, b), ref.matmul(a, b))
    assert spy.host.log == []


# -- row kernels and activations --------------------------------------------------------------

def test_softmax_and_log_softmax(wasm, ref, rng):
    x = f32(rng, 3, 5, 17, scale=4)
    x[0, 0, ::3] = -np.inf  # masked entries: weight 0
    assert_within(wasm.softmax_last_dim(x), ref.softmax_last_dim(x), softmax_bound(x),
                  "softmax")
    want = ref.log_softmax_last_dim(x)
    assert_within(wasm.log_softmax_last_dim(x), want, log_softmax_bound(x, want), "log_softmax")
    view = f32(rng, 33, 6).T  # not contiguous
    assert_within(wasm.softmax_last_dim(view), ref.softmax_last_dim(view), softmax_bound(view))


def test_softmax_of_an_all_masked_row_is_nan_like_numpy(wasm, ref):
    x = np.array([[-np.inf] * 4, [0.0, 1.0, -np.inf, 2.0]], np.float32)
    with np.errstate(invalid="ignore"):
        want = ref.softmax_last_dim(x)
    got = wasm.softmax_last_dim(x)
    assert np.isnan(got[0]).all() and np.isnan(want[0]).all()
    assert_within(got[1], want[1], softmax_bound(x[1:])[0])


@pytest.mark.parametrize("affine", ["weight+bias", "weight", "none"])
def test_layer_norm(wasm, ref, rng, affine):
    x = f32(rng, 4, 7, 33, scale=3) + 1
    weight = f32(rng, 33) if affine != "none" else None
    bias = f32(rng, 33) if affine == "weight+bias" else None
    want = ref.layer_norm(x, weight, bias, 1e-5)
    assert_within(wasm.layer_norm(x, weight, bias, 1e-5), want,
                  layer_norm_bound(x, weight, bias, 1e-5, want), affine)


@pytest.mark.parametrize("with_weight", [True, False])
def test_rms_norm(wasm, ref, rng, with_weight):
    x = f32(rng, 9, 6).T  # a view
    weight = f32(rng, 9) if with_weight else None
    want = ref.rms_norm(x, weight, 1e-6)
    assert_within(wasm.rms_norm(x, weight, 1e-6), want, rms_norm_bound(x, 1e-6, want))


@pytest.mark.parametrize("op", ["rope", "rope_i"])
def test_rope(wasm, ref, rng, op):
    x = f32(rng, 2, 3, 5, 14)
    angles = rng.uniform(-np.pi, np.pi, (5, 7))
    cos, sin = np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
    got = getattr(wasm, op)(x, cos, sin)
    want = getattr(ref, op)(x, cos, sin)
    assert_within(got, want, rope_bound(x, cos, sin, op == "rope_i"), op)


def test_silu_mul(wasm, ref, rng):
    gate, up = f32(rng, 3, 50, scale=3), f32(rng, 3, 50)
    want = ref.silu_mul(gate, up)
    assert_within(wasm.silu_mul(gate, up), want, silu_mul_bound(want))


@pytest.mark.parametrize("op", sorted(wasm_abi.UNARY_OPS))
def test_unary_ops_the_module_has(wasm, spy, ref, rng, op):
    x = f32(rng, 5, 41, scale=3)
    x[0, :4] = [np.nan, np.inf, -np.inf, 0.0]
    want = ref.unary(op, x)
    assert_within(wasm.unary(op, x), want, unary_bound(op, x, want), op)
    spy.unary(op, x)
    assert spy.host.names() == ["unary_f32"]


def test_unary_ops_without_a_kernel_fall_through(spy, ref, rng):
    x = f32(rng, 4, 9)
    for op in ("log", "sin", "relu", "round"):
        np.testing.assert_array_equal(spy.unary(op, np.abs(x)), ref.unary(op, np.abs(x)))
    np.testing.assert_array_equal(spy.unary("gelu", x.astype(np.float64)),
                                  ref.unary("gelu", x.astype(np.float64)))
    assert spy.host.log == []


# -- the vision nets' convolutions (conv2d_bias_act) ------------------------------------------

def test_conv_activation_codes_name_the_backends_activations():
    assert tuple(wasm_abi.ACTIVATIONS) == ACTIVATIONS


# (x shape, kernel shape, stride, padding, activation): face-api's layers and their edges.
DEPTHWISE_CASES = [
    ((1, 16, 23, 21), (16, 1, 3, 3), 1, 1, "none"),  # the tiny detector's, odd sizes
    ((2, 8, 11, 9), (8, 1, 3, 3), 1, 1, "leaky"),  # a batch of two
    ((1, 8, 12, 13), (8, 1, 3, 3), 2, 1, "relu6"),  # SSD's stride-2 layers
    ((1, 8, 12, 13), (8, 1, 3, 3), 2, 0, "relu"),
    ((1, 4, 6, 5), (4, 1, 5, 5), 1, 2, "leaky"),  # a 5x5 filter, padding wider than a tap
    ((1, 3, 2, 2), (3, 1, 3, 3), 1, 1, "relu"),  # a map smaller than the filter
]


@pytest.mark.parametrize("shape,kernel,stride,padding,activation", DEPTHWISE_CASES)
@pytest.mark.parametrize("with_bias", [True, False])
def test_depthwise_conv_bias_act_is_numpys_bit_for_bit(spy, ref, rng, shape, kernel, stride,
                                                       padding, activation, with_bias):
    x, w = f32(rng, *shape, scale=3), f32(rng, *kernel)
    bias = f32(rng, kernel[0]) if with_bias else None
    want = ref.conv2d_bias_act(x, w, bias, stride, padding, kernel[0], activation, 0.1)
    got = spy.conv2d_bias_act(x, w, bias, stride, padding, kernel[0], activation, 0.1)
    # The taps summed in numpy's order without FMA, then the bias, then the activation: the
    # same roundings, so no tolerance.
    assert_within(got, want, 0, f"depthwise {shape} {kernel} stride {stride} pad {padding}")
    assert spy.host.names() == ["depthwise_conv_f32"] * shape[0]


# (x shape, kernel shape, stride, padding, activation): full convolutions (im2col + GEMM) and
# 1x1 stride-1 ones (the GEMM on the map as it lies).
CONV_CASES = [
    ((1, 3, 20, 23), (16, 3, 3, 3), 1, 0, "leaky"),  # the detector's first layer
    ((2, 16, 10, 10), (8, 16, 3, 3), 2, 1, "relu"),  # the descriptor's 3x3 layers, batched
    ((1, 3, 30, 31), (32, 3, 7, 7), 2, 0, "relu"),  # the descriptor's stem
    ((1, 16, 9, 9), (8, 16, 1, 1), 2, 0, "none"),  # 1x1 at stride 2 (age/gender's shortcut)
    ((1, 16, 9, 7), (32, 16, 1, 1), 1, 0, "relu6"),  # pointwise
    ((3, 16, 5, 4), (32, 16, 1, 1), 1, 0, "leaky"),  # pointwise on a batch of three
]


@pytest.mark.parametrize("shape,kernel,stride,padding,activation", CONV_CASES)
def test_conv_bias_act_through_im2col_and_the_gemm(spy, ref, rng, shape, kernel, stride, padding,
                                                   activation):
    x, w, bias = f32(rng, *shape), f32(rng, *kernel), f32(rng, kernel[0])
    want = ref.conv2d_bias_act(x, w, bias, stride, padding, 1, activation, 0.1)
    got = spy.conv2d_bias_act(x, w, bias, stride, padding, 1, activation, 0.1)
    # A dot product of K = c_in * k_h * k_w terms in any order, then the bias (one rounding);
    # the activations move no value further than its input moved.
    magnitudes = ref.conv2d(np.abs(x).astype(np.float64), np.abs(w).astype(np.float64), stride,
                            padding, 1, 1) + np.abs(bias).reshape(1, -1, 1, 1)
    assert_within(got, want, sum_bound(magnitudes, kernel[1] * kernel[2] * kernel[3] + 1),
                  f"conv {shape} {kernel}")
    # The images of a batch side by side in one GEMM's columns.
    pointwise = kernel[2:] == (1, 1) and stride == 1 and padding == 0
    assert spy.host.names() == ([] if pointwise else ["im2col_f32"] * shape[0]) + \
        ["gemm_f32", "bias_act_f32"]


def test_conv_bias_act_the_kernels_do_not_take_fall_through(spy, ref, rng):
    x = f32(rng, 1, 8, 7, 7)
    grouped = f32(rng, 8, 4, 3, 3)  # two groups of four channels: no kernel
    np.testing.assert_array_equal(spy.conv2d_bias_act(x, grouped, None, 1, 1, 2, "relu", 0.0),
                                  ref.conv2d_bias_act(x, grouped, None, 1, 1, 2, "relu", 0.0))
    wide = f32(rng, 8, 8, 3, 3).astype(np.float64)
    np.testing.assert_array_equal(
        spy.conv2d_bias_act(x.astype(np.float64), wide, None, 1, 1, 1, "none", 0.0),
        ref.conv2d_bias_act(x.astype(np.float64), wide, None, 1, 1, 1, "none", 0.0))
    assert "im2col_f32" not in spy.host.names() and "depthwise_conv_f32" not in spy.host.names()


@pytest.mark.parametrize("shape,kernel,stride,pad_end", [
    ((1, 16, 414, 414), 2, 2, 0),  # the tiny detector's first pool
    ((1, 4, 13, 13), 2, 1, 1),  # its stride-1 pools: a column and row of edge after the map
    ((2, 3, 35, 17), 3, 2, 1),  # age/gender's, odd sizes
    ((1, 2, 3, 3), 2, 2, 3),  # windows wholly in the repeated edge
])
def test_max_pool_equals_numpy(spy, ref, rng, shape, kernel, stride, pad_end):
    x = f32(rng, *shape)
    x[0, 0, 0, 0] = np.nan  # kept, as numpy's maximum keeps it
    assert_within(spy.max_pool2d(x, kernel, stride, pad_end),
                  ref.max_pool2d(x, kernel, stride, pad_end), 0, f"max pool {shape}")
    assert spy.host.names() == ["max_pool_f32"]


# -- the images' resampling (io/image.resize) ------------------------------------------------

@pytest.mark.parametrize("present,in_size,out_size,inner", [
    (1280, 1920, 416, 1920 * 3),  # a landscape photo's rows into the detector's square
    (1920, 1920, 416, 3),  # then its columns, three channels apart
    (300, 300, 112, 500 * 3),  # a face crop shrunk
    (37, 37, 150, 41 * 3),  # a small crop enlarged
    (5, 9, 2, 7),  # more padding than picture
])
def test_resample_lines_is_numpys_bit_for_bit(spy, ref, rng, present, in_size, out_size, inner):
    from candle_web.io.image import _resample_taps

    first, band = _resample_taps(in_size, out_size)
    band = band.astype(np.float32)
    pixels = rng.integers(0, 256, (2, present, inner), dtype=np.uint8)
    floats = (pixels * np.float32(0.37)).astype(np.float32)
    for x in (pixels, floats):
        # Products and sums in tap order without FMA, the padding's taps skipped where numpy
        # adds exact zeros: the same roundings, so no tolerance.
        assert_within(spy.resample_lines(x, first, band), ref.resample_lines(x, first, band), 0,
                      f"resample {x.dtype} {present} -> {out_size}")
    assert spy.host.names() == ["resample_lines_f32"] * 2


# -- attention -------------------------------------------------------------------------------

def test_attention_on_a_kv_cache_with_a_causal_mask(wasm, spy, ref, rng):
    b, h, tq, tk, d, capacity = 1, 3, 4, 9, 16, 32
    keys, values = f32(rng, b, h, capacity, d), f32(rng, b, h, capacity, d)
    k, v = keys[:, :, :tk], values[:, :, :tk]  # what a KV cache hands out
    q = f32(rng, b, h, tq, d)
    rows = np.arange(tq)[:, None] + tk - tq
    mask = np.where(np.arange(tk)[None, :] > rows, -np.inf, 0.0).astype(np.float32)
    scale = 1 / math.sqrt(d)
    want = ref.attention(q, k, v, mask, scale)
    assert_within(wasm.attention(q, k, v, mask, scale), want,
                  attention_bound(q, k, v, mask, scale), "attention")
    spy.attention(q, k, v, mask, scale)
    (name, args), = spy.host.log
    assert name == "attention_f32" and args[:4] == (h, tq, tk, d)
    assert np.shares_memory(args[6], keys) and args[7] == capacity * d  # no copy: a stride
    assert args[11] == 0  # one mask for every head


def test_attention_with_a_padding_mask_per_batch_and_shared_kv_heads(wasm, spy, ref, rng):
    b, h, tq, tk, d = 2, 4, 3, 6, 8
    q = f32(rng, b, h, tq, d)
    k, v = f32(rng, b, 1, tk, d), f32(rng, b, 1, tk, d)  # one KV head for all query heads
    pad = np.zeros((b, 1, 1, tk), np.float32)
    pad[1, ..., 4:] = -np.inf
    want = ref.attention(q, k, v, pad, 0.3)
    assert_within(wasm.attention(q, k, v, pad, 0.3), want, attention_bound(q, k, v, pad, 0.3))
    spy.attention(q, k, v, pad, 0.3)
    assert spy.host.names() == ["attention_f32"] * b  # heads share k: one call per batch


def test_attention_single_query_and_no_mask(wasm, ref, rng):
    q, k, v = f32(rng, 1, 6, 1, 64), f32(rng, 1, 6, 40, 64), f32(rng, 1, 6, 40, 64)
    want = ref.attention(q, k, v, None, 0.125)
    assert_within(wasm.attention(q, k, v, None, 0.125), want,
                  attention_bound(q, k, v, None, 0.125))


def test_attention_the_abi_cannot_express_falls_through(spy, ref, rng):
    q, k = f32(rng, 1, 2, 3, 8), f32(rng, 1, 2, 5, 8)
    v = f32(rng, 1, 2, 5, 6)  # value width != head size: numpy's composition (whose matmul
    # and softmax still run in the module)
    assert_within(spy.attention(q, k, v, None, 0.5), ref.attention(q, k, v, None, 0.5),
                  attention_bound(q, k, v, None, 0.5))
    q64 = q.astype(np.float64)
    np.testing.assert_array_equal(spy.attention(q64, k.astype(np.float64), v.astype(np.float64),
                                                None, 0.5),
                                  ref.attention(q64, k.astype(np.float64), v.astype(np.float64),
                                                None, 0.5))
    assert "attention_f32" not in spy.host.names()


# -- quantized matmul -------------------------------------------------------------------------

def _k_for(kind: GgmlDType) -> int:
    return kind.block_size * (3 if kind.block_size == 256 else 7)  # odd block counts


@pytest.mark.parametrize("kind", [GgmlDType(t).name for t in wasm_abi.LINEAR_Q_TYPES])
@pytest.mark.parametrize("m", [1, 5])
def test_qmatmul_each_ggml_type_equals_dequantize_then_dot(wasm, spy, ref, rng, kind, m):
    kind = GgmlDType.parse(kind)
    weight = random_qweight(kind, 21, _k_for(kind), rng)
    x = f32(rng, m, weight.shape[1])
    want = x @ weight.dequantize().T
    bound = dot_bound(x, quant_term_magnitudes(weight).T, extra_roundings=QUANT_EXTRA_ROUNDINGS)
    assert_within(wasm.qmatmul(x, weight), want, bound, kind.name)
    assert_within(ref.qmatmul(x, weight), want, bound, f"{kind.name} reference")
    assert wasm.supports_qmatmul(kind)
    spy.qmatmul(x, weight)
    assert spy.host.names() == ["linear_q"] and spy.host.log[0][1][0] == int(kind)


def test_qmatmul_f16_weights_and_leading_dims(wasm, spy, rng):
    weight = QTensor.from_float(f32(rng, 13, 40), GgmlDType.F16)
    x = f32(rng, 2, 3, 40)
    want = x @ weight.dequantize().T
    assert_within(wasm.qmatmul(x, weight), want, dot_bound(x, np.abs(weight.dequantize()).T))
    spy.qmatmul(x, weight)
    assert spy.host.names() == ["linear_f16"]
    assert not wasm.supports_qmatmul(GgmlDType.F16)  # QMatMul widens plain types at load


def test_qmatmul_types_without_a_kernel_fall_through(spy, ref, rng):
    weight = random_qweight(GgmlDType.Q8_1, 5, 64, rng)
    x = f32(rng, 2, 64)
    np.testing.assert_array_equal(spy.qmatmul(x, weight), ref.qmatmul(x, weight))
    assert spy.host.log == [] and not spy.supports_qmatmul(GgmlDType.Q8_1)


def test_qmatmul_layer_keeps_blocks_packed_on_the_wasm_device(wasm, rng):
    from candle_web import Tensor
    from candle_web.quantized.qmatmul import QMatMul

    device = Device.cpu(backend="wasm")
    weight = QTensor.from_float(f32(rng, 8, 64), GgmlDType.Q4_1)
    layer = QMatMul.from_qtensor(weight, device)
    assert layer.is_quantized
    x = f32(rng, 3, 64)
    got = layer(Tensor.from_numpy(x, device=device)).to_numpy()
    bound = dot_bound(x, quant_term_magnitudes(weight).T, extra_roundings=QUANT_EXTRA_ROUNDINGS)
    assert_within(got, x @ weight.dequantize().T, bound)


# -- the hosts -------------------------------------------------------------------------------

def test_wasmtime_host_runs_outputs_in_place_of_inputs(wasm, ref, rng):
    x = f32(rng, 4, 10, scale=3)
    want = ref.softmax_last_dim(x)
    wasm.host.call("softmax_rows", 4, 10, x, x)  # Y = X, allowed by the ABI
    assert_within(x, want, softmax_bound(want))


def test_hosts_name_the_argument_that_is_wrong(wasm):
    host = wasm.host
    with pytest.raises(CandleError, match="softmax_rows: expected 4 arguments"):
        host.call("softmax_rows", 1, 2)
    with pytest.raises(CandleError, match="not in the ABI"):
        host.call("no_such_kernel")
    x = np.ones((1, 2), np.float32)
    with pytest.raises(CandleError, match=r"argument 2 \(x\) may not be absent"):
        host.call("softmax_rows", 1, 2, None, x)


def test_the_factory_names_a_missing_kernel_file(monkeypatch, tmp_path):
    from candle_web.backend.settings import reload_settings
    from candle_web.backend.wasm.backend import create_backend

    missing = tmp_path / "kernels.wasm"
    monkeypatch.setenv("CANDLE_WEB_WASM_KERNELS", str(missing))
    reload_settings()
    with pytest.raises(BackendUnavailable, match=str(missing).replace("\\", "\\\\")):
        create_backend()


def test_the_backend_variable_selects_wasm(monkeypatch):
    from candle_web.backend import _default_cpu_backend_name
    from candle_web.backend.settings import reload_settings

    monkeypatch.setenv("CANDLE_WEB_BACKEND", "wasm")
    reload_settings()
    assert _default_cpu_backend_name() == "wasm"


class _FakeExports:
    """Stands in for the wasm instance's exports in the page: functions that take byte
    addresses of this process's memory, as the real ones take Pyodide's."""

    def __init__(self):
        self.seen = []

    def abi_version(self):
        return wasm_abi.ABI_VERSION

    def scratch_bytes(self):
        return 256

    @staticmethod
    def _array(address, shape):
        buffer = (ctypes.c_float * int(np.prod(shape))).from_address(address)
        return np.frombuffer(buffer, np.float32).reshape(shape)

    def rms_norm_rows(self, rows, n, x, w, eps, y):
        self.seen.append(("rms_norm_rows", rows, n, x, w, eps, y))
        xs = self._array(x, (rows, n))
        self._array(y, (rows, n))[...] = xs / np.sqrt((xs * xs).mean(-1, keepdims=True) + eps)

    def gemm_f32(self, *args):
        self.seen.append(("gemm_f32",) + args)

    def __getattr__(self, name):
        if name in wasm_abi.EXPORT_NAMES:
            return lambda *args: None
        raise AttributeError(name)


class _FakeJsModule:
    def __init__(self):
        self.exports = _FakeExports()


def test_pyodide_host_passes_pointers_in_place_and_inserts_scratch():
    from candle_web.backend.wasm.hosts import PyodideHost

    module = _FakeJsModule()
    host = PyodideHost(module)
    x = np.arange(1.0, 13.0, dtype=np.float32).reshape(3, 4)
    y = np.empty_like(x)
    host.call("rms_norm_rows", 3, 4, x, None, 1e-6, y)
    want = x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6)
    np.testing.assert_allclose(y, want, rtol=4 * np.finfo(np.float32).eps)
    _, _, _, x_ptr, w_ptr, _, _ = module.exports.seen[-1]
    assert x_ptr == x.__array_interface__["data"][0] and w_ptr == 0

    weight = np.zeros((300, 200), np.float32)  # large: its pointer is remembered
    a = np.zeros((5, 200), np.float32)[1:]  # a view: its own first element
    c = np.empty((4, 300), np.float32)
    for _ in range(2):
        host.call("gemm_f32", 1, 4, 300, 200, a, 0, 200, 1, weight.T, 0, 1, 200, c, 0, 300, 0.0)
    args = module.exports.seen[-1][1:]
    assert args[4] == a.__array_interface__["data"][0]
    assert args[8] == weight.__array_interface__["data"][0]  # through the transposed view
    assert args[16] % 16 == 0 and len(args) == 17  # scratch: aligned, last
    assert id(weight) in host._pointers


def test_pyodide_host_refuses_a_module_without_the_abi():
    from candle_web.backend.wasm.hosts import PyodideHost

    class Old(_FakeExports):
        def abi_version(self):
            return 0

    module = _FakeJsModule()
    module.exports = Old()
    with pytest.raises(BackendUnavailable, match="ABI version 0"):
        PyodideHost(module)


def test_install_makes_the_page_kernels_the_cpu_backend(monkeypatch):
    """What the worker calls after registering `candle_kernels` (here a fake one)."""
    from candle_web import backend as registry
    from candle_web.backend import _default_cpu_backend_name
    from candle_web.backend.wasm import backend as wasm_backend

    monkeypatch.setattr(registry, "_INSTANCES", {})  # the one cache, restored after the test
    monkeypatch.setenv("CANDLE_WEB_BACKEND", "numpy")  # restored after the test
    backend = wasm_backend.install(_FakeJsModule())
    assert backend.host.kind == "pyodide" and _default_cpu_backend_name() == "wasm"
    assert get_backend("wasm") is backend  # the registry hands out the installed one
    with pytest.raises(BackendUnavailable, match="candle_kernels"):
        monkeypatch.setattr(registry, "_INSTANCES", {})
        wasm_backend.install()  # natively there is no registered JS module


# -- a real model ------------------------------------------------------------------------------

SMOLLM2 = ("smollm2-135m-instruct", "SmolLM2-135M-Instruct.Q4_1.gguf")


@pytest.mark.slow
def test_smollm2_decodes_the_same_tokens_on_wasm_as_on_numpy(wasm, model_file):
    """SmolLM2 Q4_1 (QMatMul keeps its blocks packed on wasm: linear_q; numpy dequantizes at
    load): a prompt and a few greedy steps through the backend's ops (the fused decode part,
    tested in test_wasm_parts, is turned off); the ids must be numpy's. A flipped id prints the
    logit margin between numpy's choice and the runner-up."""
    from candle_web.pipelines import load_llama

    path = model_file(*SMOLLM2)
    steps = 4
    chosen = {}
    for backend in ("numpy", "wasm"):
        loaded = load_llama(path, device=Device.cpu(backend=backend))
        model, tokenizer = loaded.model, loaded.tokenizer
        prompt = tokenizer.encode("The capital of France is").ids
        if backend == "wasm":
            assert model.lm_head.is_quantized or model.blocks[0].attn.qkv.is_quantized
        model.clear_kv_cache(capacity=16)
        ids, logits_seen = [], []
        logits = model.forward([prompt]).to_numpy()[0]
        for _ in range(steps):
            token = int(np.argmax(logits))
            ids.append(token)
            logits_seen.append(logits)
            logits = model.forward([[token]]).to_numpy()[0]
        chosen[backend] = (ids, logits_seen)
    want, want_logits = chosen["numpy"]
    got, _ = chosen["wasm"]
    for step, (a, b) in enumerate(zip(got, want)):
        if a != b:
            top = np.sort(want_logits[step])[-2:]
            pytest.fail(f"step {step}: wasm chose {a}, numpy {b}; numpy's logit margin there is "
                        f"{top[1] - top[0]:.3g}")
    assert got == want
