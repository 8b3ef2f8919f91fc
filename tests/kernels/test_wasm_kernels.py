"""The WebAssembly SIMD kernels (web/kernels/ -> web/vendor/kernels*.wasm) against numpy, run
natively under wasmtime, both builds (relaxed SIMD with FMA, plain SIMD).

References: numpy f32 (`@`, the numpy backend's fused ops) and candle_web.quantized's
dequantization; float64 for the accuracy of the module's own exp/tanh/erf. Tolerances come
from tests/tolerances_testlib.py: dot-product bounds (gamma(K) sum |a b|) for GEMM, linear and
attention, the unary ulp table, the derived softmax/norm bounds. Edge cases: M or N = 1, K
not a multiple of 4 or of a block, strided and transposed operands, batch broadcast, NaN and
inf, the largest real shapes (Whisper tiny's encoder, its vocabulary projection).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from candle_web.backend.numpy_backend import NumpyBackend
from candle_web.quantized import GgmlDType, dequantize, quantize
from tests.tolerances_testlib import (assert_within, attention_bound, layer_norm_bound,
                                      log_softmax_bound, rms_norm_bound, silu_mul_bound,
                                      softmax_bound, sum_bound, unary_bound)

NP = NumpyBackend()


def placed(km, base: np.ndarray, view: np.ndarray):
    """Copy `base` into the module's memory; return (byte pointer of view[0...], element
    strides of view) for a view derived from base."""
    region = km.put(base)
    delta = view.__array_interface__["data"][0] - base.__array_interface__["data"][0]
    return region.offset + delta, tuple(s // view.itemsize for s in view.strides)


# ------------------------------------------------------------------------------------ GEMM

def gemm(km, a, b, c0=None, c_pad=0, a_base=None, b_base=None):
    """C = a @ b (+ c0) through gemm_f32; a (batch, M, K) and b (batch, K, N) views (any
    strides, stride 0 for broadcast) of a_base / b_base. Returns C and checks that the
    padding columns (row stride N + c_pad) are untouched."""
    batch, m, k = a.shape
    n = b.shape[2]
    a_ptr, (a_bs, a_rs, a_cs) = placed(km, a if a_base is None else a_base, a)
    b_ptr, (b_bs, b_rs, b_cs) = placed(km, b if b_base is None else b_base, b)
    ldc = n + c_pad
    if c0 is None:
        c = km.empty((batch, m, ldc))
        before = c.get()
    else:
        init = np.full((batch, m, ldc), -7.0, np.float32)
        init[:, :, :n] = c0
        c = km.put(init)
        before = init
    km.call("gemm_f32", batch, m, n, k, a_ptr, a_bs, a_rs, a_cs, b_ptr, b_bs, b_rs, b_cs,
            c, m * ldc, ldc, 0.0 if c0 is None else 1.0, km.scratch)
    out = c.get()
    assert np.array_equal(out[:, :, n:].view(np.uint32), before[:, :, n:].view(np.uint32)), \
        "gemm_f32 wrote outside C's columns"
    return out[:, :, :n]


def check_gemm(got, a, b, c0=None, what="gemm"):
    a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
    with np.errstate(invalid="ignore"):  # inf * 0, inf - inf: NaN, as in the kernel
        want = np.matmul(a, b)
        magnitude = np.matmul(np.abs(a64), np.abs(b64))
    if c0 is not None:
        want = want + c0
        magnitude = magnitude + np.abs(np.asarray(c0, np.float64))
    # K products and their sum, plus the addition of C: gamma(K + 1) per evaluation.
    return assert_within(got, want, sum_bound(magnitude, a.shape[-1] + 1), what)


def rand(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


@pytest.mark.parametrize("m,n,k", [
    (1, 1, 1), (1, 7, 5), (1, 64, 384), (4, 33, 17), (3, 1, 9), (5, 1, 300), (1, 1, 1000),
    (2, 45, 3), (5, 9, 13), (37, 45, 300), (130, 520, 257), (64, 8, 1024), (9, 2, 7)])
def test_gemm_row_major(km, rng, m, n, k):
    a, b = rand(rng, 1, m, k), rand(rng, 1, k, n)
    check_gemm(gemm(km, a, b, c_pad=3), a, b)


@pytest.mark.parametrize("m,n,k", [(1, 96, 384), (3, 50, 37), (4, 16, 8), (40, 70, 129),
                                   (300, 17, 64), (2, 1, 11)])
@pytest.mark.parametrize("layout", ["at", "bt", "both"])
def test_gemm_transposed(km, rng, m, n, k, layout):
    """Transposed operands are views of the other layout (a = at.T): weights stored [N, K]
    are the common case (b_rs == 1)."""
    at, bt = rand(rng, 1, k, m), rand(rng, 1, n, k)
    a = at.transpose(0, 2, 1) if layout in ("at", "both") else np.ascontiguousarray(at.transpose(0, 2, 1))
    b = bt.transpose(0, 2, 1) if layout in ("bt", "both") else np.ascontiguousarray(bt.transpose(0, 2, 1))
    got = gemm(km, a, b, a_base=at if layout in ("at", "both") else a,
               b_base=bt if layout in ("bt", "both") else b)
    check_gemm(got, a, b)


@pytest.mark.parametrize("m,n,k", [(1, 20, 30), (3, 9, 10), (17, 25, 33), (6, 1, 40)])
def test_gemm_general_strides(km, rng, m, n, k):
    """Neither stride is 1 (every other row, every third column of bigger arrays)."""
    a_base, b_base = rand(rng, 1, 2 * m, 3 * k), rand(rng, 1, 3 * k, 2 * n)
    a, b = a_base[:, ::2, ::3], b_base[:, ::3, ::2]
    check_gemm(gemm(km, a, b, a_base=a_base, b_base=b_base), a, b)


@pytest.mark.parametrize("m,n,k", [(1, 40, 64), (6, 10, 9), (50, 30, 20)])
def test_gemm_batched_broadcast_and_accumulate(km, rng, m, n, k):
    batch = 3
    a_one = rand(rng, 1, m, k)
    a = np.broadcast_to(a_one, (batch, m, k))  # a_bs = 0: one A for every batch
    b = rand(rng, batch, k, n)
    check_gemm(gemm(km, a, b, a_base=a_one), a, b, what="broadcast A")
    b_one = rand(rng, 1, k, n)
    b2 = np.broadcast_to(b_one, (batch, k, n))
    a2 = rand(rng, batch, m, k)
    c0 = rand(rng, batch, m, n)
    check_gemm(gemm(km, a2, b2, c0=c0, b_base=b_one, c_pad=2), a2, b2, c0, what="beta=1")


def test_gemm_k_zero(km):
    a, b = np.zeros((1, 3, 0), np.float32), np.zeros((1, 0, 5), np.float32)
    assert np.array_equal(gemm(km, a, b), np.zeros((1, 3, 5), np.float32))
    c0 = np.arange(15, dtype=np.float32).reshape(1, 3, 5)
    assert np.array_equal(gemm(km, a, b, c0=c0), c0)


@pytest.mark.parametrize("m,n,k", [(1, 12, 9), (3, 40, 33), (20, 30, 40), (9, 1, 17)])
def test_gemm_nan_and_inf_propagate(km, rng, m, n, k):
    a, b = rand(rng, 1, m, k), rand(rng, 1, k, n)
    a[0, 0, 1] = np.nan
    a[0, -1, 0] = np.inf
    b[0, 2 % k, -1] = -np.inf
    b[0, -1, 0] = np.inf
    check_gemm(gemm(km, a, b), a, b)


def test_gemm_whisper_encoder_shapes(km, rng):
    """The encoder's MLP: 1500 x 384 @ 384 x 1536, then 1500 x 1536 @ (384 x 1536)^T."""
    x, w1 = rand(rng, 1, 1500, 384), rand(rng, 1, 384, 1536, scale=0.05)
    h = gemm(km, x, w1)
    check_gemm(h, x, w1, what="1500x384 @ 384x1536")
    w2t = rand(rng, 1, 384, 1536, scale=0.05)
    w2 = w2t.transpose(0, 2, 1)
    check_gemm(gemm(km, h, w2, b_base=w2t), h, w2, what="1500x1536 @ (384x1536)^T")


def test_gemm_vocabulary_gemv(km, rng):
    """Whisper tiny's logits: 1 x 384 @ (51864 x 384)^T, the decode GEMV (b_rs == 1)."""
    x = rand(rng, 1, 1, 384)
    w = rand(rng, 1, 51864, 384, scale=0.05)
    got = gemm(km, x, w.transpose(0, 2, 1), b_base=w)
    check_gemm(got, x, w.transpose(0, 2, 1), what="vocabulary GEMV")


# ------------------------------------------------------------------------------- linear

def linear_f16(km, x, w_bits, y_pad=0, x_pad=0):
    m, k = x.shape
    n = w_bits.shape[0]
    xb = np.zeros((m, k + x_pad), np.float32)
    xb[:, :k] = x
    X, W = km.put(xb), km.put(w_bits)
    Y = km.empty((m, n + y_pad))
    km.call("linear_f16", m, n, k, X, k + x_pad, W, Y, n + y_pad, km.scratch)
    out = Y.get()
    if y_pad:
        assert np.all(out[:, n:].view(np.uint32) == np.uint32(0x7FA5A5A5)), "wrote past Y's rows"
    return out[:, :n]


def check_linear(got, x, w_f32, what):
    with np.errstate(invalid="ignore"):
        want = x @ w_f32.T
        bound = sum_bound(np.abs(x.astype(np.float64)) @ np.abs(w_f32.astype(np.float64)).T,
                          x.shape[1])
    return assert_within(got, want, bound, what)


@pytest.mark.parametrize("m,n,k", [(1, 64, 384), (1, 5, 7), (2, 33, 100), (4, 17, 64),
                                   (5, 9, 40), (8, 31, 96), (9, 40, 77), (37, 72, 576),
                                   (3, 3, 1)])
def test_linear_f16(km, rng, m, n, k):
    x = rand(rng, m, k)
    w = (rng.standard_normal((n, k)) * 0.1).astype(np.float16)
    got = linear_f16(km, x, w.view(np.uint16), y_pad=1, x_pad=3)
    check_linear(got, x, w.astype(np.float32), f"linear_f16 {m}x{n}x{k}")


@pytest.mark.parametrize("m", [1, 9])  # the register path and the dequantize-to-tile path
def test_linear_f16_converts_every_half_exactly(km, m):
    """All 65536 half bit patterns (subnormals, +-0, inf, NaN payloads): row n of W holds
    pattern n then zeros, x = e_0, so Y[:, n] must equal half(n) exactly."""
    k = 32
    w = np.zeros((65536, k), np.uint16)
    w[:, 0] = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    x = np.zeros((m, k), np.float32)
    x[:, 0] = 1.0
    got = linear_f16(km, x, w)
    want = np.broadcast_to(w[:, 0].view(np.float16).astype(np.float32), (m, 65536))
    with np.errstate(invalid="ignore"):
        want = want + np.float32(0)  # -0 + (+0 products) is +0 in any order
    assert_within(got, want, 0.0, "half -> f32")


def test_linear_f16_vocabulary(km, rng):
    x = rand(rng, 1, 384)
    w = (rng.standard_normal((51864, 384)) * 0.05).astype(np.float16)
    check_linear(linear_f16(km, x, w.view(np.uint16)), x, w.astype(np.float32), "f16 vocab")


def random_blocks(dtype: GgmlDType, n_blocks: int, rng) -> np.ndarray:
    """Random quants and packed scales, with finite random f16 super-scales (random bytes
    there would often be inf/NaN): (n_blocks, type_size) uint8."""
    scale_fields = {"Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,),
                    "Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2),
                    "Q6_K": (208,)}[dtype.name]
    blocks = rng.integers(0, 256, size=(n_blocks, dtype.type_size), dtype=np.uint8)
    for start in scale_fields:
        scales = (rng.standard_normal(n_blocks) * 0.05).astype("<f2")
        blocks[:, start:start + 2] = scales.view(np.uint8).reshape(n_blocks, 2)
    return blocks


Q_TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"]


def linear_q(km, dtype, x, raw, n, x_pad=0, y_pad=0):
    """dtype: a GgmlDType or a raw type id."""
    m, k = x.shape
    xb = np.zeros((m, k + x_pad), np.float32)
    xb[:, :k] = x
    X, W = km.put(xb), km.put(np.ascontiguousarray(raw).reshape(-1))
    Y = km.empty((m, n + y_pad))
    km.call("linear_q", int(dtype), m, n, k, X, k + x_pad, W, Y, n + y_pad, km.scratch)
    out = Y.get()
    if y_pad:
        assert np.all(out[:, n:].view(np.uint32) == np.uint32(0x7FA5A5A5)), "wrote past Y's rows"
    return out[:, :n]


@pytest.mark.parametrize("name", Q_TYPES)
@pytest.mark.parametrize("m,n,blocks", [(1, 7, 1), (1, 64, 3), (2, 5, 2), (3, 9, 1),
                                        (4, 16, 2), (5, 8, 2), (9, 24, 2), (40, 33, 3)])
def test_linear_q_random_blocks(km, rng, name, m, n, blocks):
    """Every bit pattern the quants and the packed scales can hold, against the numpy
    dequantization + f32 dot; M from 1 to 40 covers the 1..4-row paths and the tile + GEMM."""
    dtype = GgmlDType[name]
    k = blocks * dtype.block_size
    raw = random_blocks(dtype, n * blocks, rng)
    x = rand(rng, m, k)
    w = dequantize(dtype, raw, n * k).reshape(n, k)
    got = linear_q(km, dtype, x, raw, n, x_pad=5, y_pad=2)
    check_linear(got, x, w, f"linear_q {name} {m}x{n}x{k}")


QUANTIZABLE = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q6_K"]


@pytest.mark.parametrize("name", QUANTIZABLE)
@pytest.mark.parametrize("m", [1, 3, 12])
def test_linear_q_quantized_weights(km, rng, name, m):
    """Weights through candle_web's own quantizer (the blocks a converted model holds)."""
    dtype = GgmlDType[name]
    n, k = 48, 2 * 256
    raw = quantize(dtype, rand(rng, n, k, scale=0.05))
    w = dequantize(dtype, raw, n * k).reshape(n, k)
    x = rand(rng, m, k)
    check_linear(linear_q(km, dtype, x, raw, n), x, w, f"quantized {name}")


def test_linear_q_nan_and_inf(km, rng):
    """A NaN in x poisons its row; an inf scale poisons its output column, as in numpy."""
    dtype = GgmlDType.Q8_0
    n, k = 6, 64
    raw = random_blocks(dtype, n * 2, rng)
    raw[3, 0:2] = np.array([np.inf], "<f2").view(np.uint8)  # block 1 of row 1
    x = rand(rng, 3, k)
    x[2, 5] = np.nan
    w = dequantize(dtype, raw, n * k).reshape(n, k)
    with np.errstate(invalid="ignore"):
        check_linear(linear_q(km, dtype, x, raw, n), x, w, "Q8_0 with inf/NaN")


@pytest.mark.parametrize("type_id,k", [(9, 32), (99, 32), (1, 32), (2, 48), (12, 128)])
def test_linear_q_bad_input_fills_nan(km, rng, type_id, k):
    """An unknown or unsupported type id, or K that is not a whole number of blocks: the
    kernel cannot raise, so it makes the output unmistakable instead."""
    x = rand(rng, 2, k)
    got = linear_q(km, type_id, x, np.zeros(4096, np.uint8), 3)
    assert np.isnan(got).all()


def _cached_gguf(model, filename):
    from candle_web import CandleError, hub

    try:
        return hub.fetch(model, filename, cache_only=True)
    except CandleError as exc:
        pytest.skip(f"{model}/{filename} is not in the model cache ({exc}); run make models")


@pytest.mark.parametrize("model,filename,tensor,expected,rows", [
    ("smollm2-135m-instruct", "SmolLM2-135M-Instruct.Q4_1.gguf", "blk.0.attn_q.weight", "Q4_1", None),
    ("smollm2-135m-instruct", "SmolLM2-135M-Instruct.Q4_1.gguf", "token_embd.weight", "Q8_0", None),
    ("gemma3-270m-q4km", "gemma-3-270m-Q4_K_M.gguf", "blk.0.attn_output.weight", "Q4_K", None),
    ("gemma3-270m-q4km", "gemma-3-270m-Q4_K_M.gguf", "blk.0.ffn_down.weight", "Q6_K", None),
    ("gemma3-270m-q4km", "gemma-3-270m-Q4_K_M.gguf", "blk.0.attn_k.weight", "Q5_0", None),
])
def test_linear_q_real_gguf_tensors(km, rng, model, filename, tensor, expected, rows):
    """Whole real tensors of the registry's models (SmolLM2's 49152 x 576 Q8_0 embedding as
    the tied LM head; Gemma 3's Q4_K / Q6_K / Q5_0), one decode row and a short prompt."""
    from candle_web.io.gguf import GgufFile

    gguf = GgufFile(_cached_gguf(model, filename))
    info = gguf.tensors[tensor]
    assert info.dtype.name == expected
    k = info.shape[-1]
    n = int(np.prod(info.shape[:-1]))
    raw = np.asarray(gguf.tensor_bytes(tensor))
    w = dequantize(info.dtype, raw, n * k).reshape(n, k)
    for m in (1, 11):
        x = rand(rng, m, k)
        check_linear(linear_q(km, info.dtype, x, raw, n), x, w, f"{tensor} M={m}")


# --------------------------------------------------------------------------- elementwise

UNARY_OPS = {"gelu": 0, "gelu_erf": 1, "silu": 2, "exp": 3, "tanh": 4, "sigmoid": 5, "erf": 6}

SPECIAL = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 1e-38, -1e-38, 1e-30,
                    1e-7, -1e-7, 0.5, -0.5, 0.8999, 0.9, 0.90001, -0.9, 1.0, -1.0, 0.99999,
                    1.00001, 3.9, 4.0, 9.0, 10.0, -10.0, 20.0, 44.0, 87.3, 88.37, 88.72,
                    88.73, 89.0, -87.3, -88.0, -100.0, -103.9, -104.0, -110.0, -1e10, 1e10,
                    3e38, -3e38, 5.0, -5.0, 0.25], np.float32)


def unary(km, op, x):
    X = km.put(x)
    Y = km.empty(x.shape)
    km.call("unary_f32", UNARY_OPS[op], x.size, X, Y)
    return Y.get()


@pytest.mark.parametrize("op", list(UNARY_OPS))
@pytest.mark.parametrize("n", [1, 3, 4, 7, 1001])
def test_unary_against_numpy(km, rng, op, n):
    x = np.concatenate([rand(rng, n), rand(rng, n, scale=8.0), SPECIAL])
    with np.errstate(all="ignore"):
        want = NP.unary(op, x)
        got = unary(km, op, x)
        assert_within(got, want, unary_bound(op, x, want), op)


def test_unary_in_place_and_unknown_op(km, rng):
    x = rand(rng, 37)
    X = km.put(x)
    km.call("unary_f32", UNARY_OPS["silu"], 37, X, X)
    want = NP.unary("silu", x)
    assert_within(X.get(), want, unary_bound("silu", x, want), "silu in place")
    Y = km.empty((5,))
    km.call("unary_f32", 17, 5, X, Y)
    assert np.isnan(Y.get()).all()


def _ulps(got, truth):
    """|got - truth| in ulps of the float32 truth (spacing at |truth|; for subnormal truths the
    subnormal spacing)."""
    truth32 = np.abs(truth).astype(np.float32)
    spacing = np.spacing(truth32).astype(np.float64)
    return np.abs(got.astype(np.float64) - truth) / spacing


# The accuracy web/kernels/README.md states, with a margin (measured over every f32 of each
# range by bench/wasm_kernels.py --accuracy: exp 1.01, tanh 1.12, erf 1.56 ulps at worst).
EXP_MAX_ULPS = 1.5
TANH_MAX_ULPS = 1.5
ERF_MAX_ULPS = 2.0


def _sweep(rng, lo, hi, count):
    """Dense random points plus a grid over [lo, hi]."""
    return np.concatenate([rng.uniform(lo, hi, count), np.linspace(lo, hi, count)]).astype(np.float32)


def test_exp_accuracy_in_ulps(km, rng):
    x = np.concatenate([_sweep(rng, -103.0, 88.72, 200_000), _sweep(rng, -1.0, 1.0, 50_000)])
    truth = np.exp(x.astype(np.float64))
    got = unary(km, "exp", x)
    worst = float(_ulps(got, truth).max())
    assert worst <= EXP_MAX_ULPS, f"exp: {worst:.3f} ulps"


def test_tanh_accuracy_in_ulps(km, rng):
    x = np.concatenate([_sweep(rng, -10.0, 10.0, 200_000), _sweep(rng, -1.0, 1.0, 100_000),
                        _sweep(rng, 1e-6, 1e-2, 20_000)])
    truth = np.tanh(x.astype(np.float64))
    got = unary(km, "tanh", x)
    worst = float(_ulps(got, truth).max())
    assert worst <= TANH_MAX_ULPS, f"tanh: {worst:.3f} ulps"


def test_erf_accuracy(km, rng):
    special = pytest.importorskip("scipy.special", reason="scipy gives the float64 erf truth")
    x = np.concatenate([_sweep(rng, -5.0, 5.0, 200_000), _sweep(rng, -1.2, 1.2, 100_000)])
    truth = special.erf(x.astype(np.float64))
    got = unary(km, "erf", x)
    worst = float(_ulps(got, truth).max())
    assert worst <= ERF_MAX_ULPS, f"erf: {worst:.3f} ulps"


def test_silu_mul(km, rng):
    for n in (1, 6, 1536):
        g, u = rand(rng, n, scale=4.0), rand(rng, n)
        g[: min(n, 2)] = [np.inf, -30.0][: min(n, 2)]
        G, U, Y = km.put(g), km.put(u), km.empty((n,))
        km.call("silu_mul", n, G, U, Y)
        with np.errstate(all="ignore"):
            want = NP.silu_mul(g, u)
        assert_within(Y.get(), want, silu_mul_bound(want), f"silu_mul n={n}")


# ------------------------------------------------------------------------------ row kernels

def rows_call(km, name, x, *extra, in_place=False):
    X = km.put(x)
    Y = X if in_place else km.empty(x.shape)
    km.call(name, x.shape[0], x.shape[1], X, *extra, Y)
    return Y.get()


def row_cases(rng):
    cases = [rand(rng, 3, n, scale=s) for n, s in [(1, 1), (3, 2), (4, 1), (7, 5), (64, 3),
                                                   (1001, 10)]]
    x = rand(rng, 6, 9, scale=3)
    x[0, [1, 4]] = -np.inf        # masked entries weigh 0
    x[1, :] = -np.inf             # a fully masked row: NaN, like numpy
    x[2, 3] = np.inf              # +inf: NaN row
    x[3, 0] = np.nan
    x[4, :] = 80.0                # large equal scores
    x[5, :] = -1e30
    cases.append(x)
    return cases


def test_softmax_rows(km, rng):
    for x in row_cases(rng) + [rand(rng, 2, 51864, scale=5)]:
        with np.errstate(all="ignore"):
            want = NP.softmax_last_dim(x)
            for in_place in (False, True):
                got = rows_call(km, "softmax_rows", x, in_place=in_place)
                assert_within(got, want, softmax_bound(x), f"softmax {x.shape} in_place={in_place}")


def test_log_softmax_rows(km, rng):
    for x in row_cases(rng) + [rand(rng, 2, 51864, scale=5)]:
        with np.errstate(all="ignore"):
            want = NP.log_softmax_last_dim(x)
            got = rows_call(km, "log_softmax_rows", x, in_place=True)
            assert_within(got, want, log_softmax_bound(x, want), f"log_softmax {x.shape}")


@pytest.mark.parametrize("n", [1, 5, 384, 576, 1537])
def test_layer_norm_rows(km, rng, n):
    x = rand(rng, 4, n, scale=3)
    x[1] += 100.0  # a large mean: the centred values cancel
    w, b = rand(rng, n), rand(rng, n)
    for eps in (1e-5, 1e-6):
        for use_w, use_b in ((True, True), (True, False), (False, True), (False, False)):
            W = km.put(w) if use_w else 0
            B = km.put(b) if use_b else 0
            got = rows_call(km, "layer_norm_rows", x, W, B, eps)
            want = NP.layer_norm(x, w if use_w else None, b if use_b else None, eps)
            assert_within(got, want, layer_norm_bound(x, w if use_w else None,
                                                      b if use_b else None, eps, want),
                          f"layer_norm n={n} w={use_w} b={use_b}")


@pytest.mark.parametrize("n", [1, 6, 64, 576, 2049])
def test_rms_norm_rows(km, rng, n):
    x = rand(rng, 3, n, scale=2)
    x[2] *= 1e-3
    w = rand(rng, n)
    for use_w in (True, False):
        W = km.put(w) if use_w else 0
        got = rows_call(km, "rms_norm_rows", x, W, 1e-6)
        want = NP.rms_norm(x, w if use_w else None, 1e-6)
        assert_within(got, want, rms_norm_bound(x, 1e-6, want), f"rms_norm n={n} w={use_w}")


def test_norms_propagate_nan_and_inf(km, rng):
    x = rand(rng, 3, 10)
    x[0, 2] = np.nan
    x[1, 7] = np.inf
    with np.errstate(all="ignore"):
        got = rows_call(km, "layer_norm_rows", x, 0, 0, 1e-5)
        want = NP.layer_norm(x, None, None, 1e-5)
        assert_within(got, want, layer_norm_bound(x, None, None, 1e-5, want), "layer_norm nan")
        got = rows_call(km, "rms_norm_rows", x, 0, 1e-5)
        want = NP.rms_norm(x, None, 1e-5)
        # the inf row's finite results are x / inf = +-0 exactly (the bound is inf / inf there)
        bound = np.nan_to_num(rms_norm_bound(x, 1e-5, want), nan=0.0)
        assert_within(got, want, bound, "rms_norm nan")


@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("bh,t,d", [(1, 1, 2), (3, 5, 8), (2, 7, 6), (2, 4, 64), (1, 3, 26)])
def test_rope(km, rng, interleaved, bh, t, d):
    x = rand(rng, bh, t, d)
    angles = rng.uniform(-10, 10, (t, d // 2))
    cos, sin = np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
    want = (NP.rope_i if interleaved else NP.rope)(x, cos, sin)
    for in_place in (False, True):
        X, C, S = km.put(x), km.put(cos), km.put(sin)
        Y = X if in_place else km.empty(x.shape)
        km.call("rope_f32", interleaved, bh, t, d, X, C, S, Y)
        # y = a c -+ b s: two products and a sum, gamma(2) of |a c| + |b s|
        if interleaved:
            a, b = x[..., 0::2], x[..., 1::2]
        else:
            a, b = x[..., : d // 2], x[..., d // 2:]
        mag = np.abs(a.astype(np.float64) * cos) + np.abs(b.astype(np.float64) * sin)
        mag = np.concatenate([mag, mag], axis=-1) if not interleaved else np.repeat(mag, 2, axis=-1)
        assert_within(Y.get(), want, sum_bound(mag, 2), f"rope in_place={in_place}")


# ------------------------------------------------------------------------------- attention

def attention(km, q, k, v, mask, scale, capacity=None, shared_mask=True):
    """O = softmax(q k^T scale + mask) v through attention_f32; q (bh, tq, d), k/v (bh, tk, d)
    stored in a cache of `capacity` rows per head (k_bs = capacity * d)."""
    bh, tq, d = q.shape
    tk = k.shape[1]
    cap = capacity or tk
    kc = np.full((bh, cap, d), np.nan, np.float32)  # rows past tk must never be read
    vc = np.full((bh, cap, d), np.nan, np.float32)
    kc[:, :tk], vc[:, :tk] = k, v
    Q, K, V = km.put(q), km.put(kc), km.put(vc)
    if mask is None:
        M, mask_bs = 0, 0
    else:
        M = km.put(mask)
        mask_bs = 0 if shared_mask else tq * tk
    O = km.empty((bh, tq, d))
    km.call("attention_f32", bh, tq, tk, d, Q, tq * d, K, cap * d, V, cap * d, M, mask_bs,
            scale, O, tq * d, km.scratch)
    return O.get()


def check_attention(got, q, k, v, mask, scale, what):
    with np.errstate(all="ignore"):
        want = NP.attention(q, k, v, mask, np.float32(scale))
        # one head at a time: the bound's float64 temporaries are (tq, tk) each
        bound = np.concatenate([
            attention_bound(q[i:i + 1], k[i:i + 1], v[i:i + 1],
                            None if mask is None else (mask if mask.ndim == 2 else mask[i:i + 1]),
                            scale)
            for i in range(q.shape[0])])
        return assert_within(got, want, bound, what)


@pytest.mark.parametrize("bh,tq,tk,d", [(1, 1, 1, 4), (2, 3, 5, 8), (2, 5, 9, 6), (3, 1, 448, 64),
                                        (2, 37, 300, 64), (1, 1, 2048, 64), (2, 40, 1030, 16),
                                        (1, 6, 33, 130), (1, 3, 7, 1)])
def test_attention_unmasked(km, rng, bh, tq, tk, d):
    q, k, v = rand(rng, bh, tq, d), rand(rng, bh, tk, d), rand(rng, bh, tk, d)
    scale = 1.0 / math.sqrt(d)
    check_attention(attention(km, q, k, v, None, scale), q, k, v, None, scale, f"{bh},{tq},{tk},{d}")


def test_attention_causal_mask_and_cache_capacity(km, rng):
    """A prompt over a KV cache with spare capacity (k_bs = capacity * d), causal mask shared
    by the heads, then per-head masks (mask_bs = tq * tk)."""
    bh, tq, tk, d = 3, 37, 37, 64
    q, k, v = rand(rng, bh, tq, d), rand(rng, bh, tk, d), rand(rng, bh, tk, d)
    causal = np.triu(np.full((tq, tk), -np.inf, np.float32), 1)
    got = attention(km, q, k, v, causal, 0.125, capacity=100)
    check_attention(got, q, k, v, causal, 0.125, "causal")
    per_head = rand(rng, bh, tq, tk)
    per_head[:, :, 5] = -np.inf
    got = attention(km, q, k, v, per_head, 0.125, capacity=64, shared_mask=False)
    check_attention(got, q, k, v, per_head, 0.125, "per-head mask")


def test_attention_nan_and_inf(km, rng):
    bh, tq, tk, d = 1, 5, 300, 8
    q, k, v = rand(rng, bh, tq, d), rand(rng, bh, tk, d), rand(rng, bh, tk, d)
    mask = np.zeros((tq, tk), np.float32)
    mask[0, :] = -np.inf            # fully masked row: NaN
    mask[1, :290] = -np.inf         # only the last key block is live
    mask[2, 3] = np.inf             # +inf score: NaN
    q[0, 3, 0] = np.nan             # NaN query: NaN row
    v[0, 7, 2] = np.inf             # inf value: weight * inf in every live row
    check_attention(attention(km, q, k, v, mask, 0.3), q, k, v, mask, 0.3, "nan/inf")


def test_attention_whisper_encoder_shape(km, rng):
    """Whisper tiny's encoder self-attention: 6 heads of 1500 x 1500, d = 64."""
    bh, t, d = 6, 1500, 64
    q, k, v = rand(rng, bh, t, d), rand(rng, bh, t, d), rand(rng, bh, t, d)
    check_attention(attention(km, q, k, v, None, 0.125), q, k, v, None, 0.125, "encoder")


def test_abi_version_and_scratch(km):
    from candle_web.backend.wasm import abi

    assert km.call("abi_version") == abi.ABI_VERSION
    size = km.call("scratch_bytes")
    assert size > 0 and size % 16 == 0
    assert km.scratch.offset % 16 == 0
