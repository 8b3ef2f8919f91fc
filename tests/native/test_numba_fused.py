"""Numba fused kernels against the numpy reference backend.

Tolerances are per element and derived from each computation (tests/tolerances_testlib.py, which says
where every term comes from): softmax and the norms from the row length and the rounded shift,
mean and variance; attention from the head size, the cached length and the softmax weights;
activations from the ulps of the library functions they are made of; RoPE as sums of two
products. Shapes cover odd widths and both the serial (small) and threaded (large) code paths;
inputs that the kernels do not take (f64) must give the reference's exact result."""

from __future__ import annotations

import numpy as np
import pytest

from candle_native.numba.backend import (FUSED_ATTENTION_MAX_QUERIES, PARALLEL_MIN_ELEMENTS,
                                         SOFTMAX_NUMBA_MAX_ELEMENTS)

from tests.native.native_testlib import rope_bound
from tests.tolerances_testlib import (assert_within, attention_bound, layer_norm_bound,
                                      log_softmax_bound, rms_norm_bound, silu_mul_bound,
                                      softmax_bound, unary_bound)

# (rows..., width): small odd shapes take the serial kernels, the last one the threaded kernels.
ROW_SHAPES = [(1, 1), (3, 5, 17), (7, 1000), (PARALLEL_MIN_ELEMENTS // 1031 + 3, 1031)]
# Softmax runs in numba only on small inputs (the largest one here is just at the limit).
SOFTMAX_SHAPES = [(1, 1), (3, 5, 17), (SOFTMAX_NUMBA_MAX_ELEMENTS // 64, 64), (9, 1000)]


@pytest.mark.parametrize("shape", SOFTMAX_SHAPES, ids=str)
@pytest.mark.parametrize("op", ["softmax_last_dim", "log_softmax_last_dim"])
def test_softmax(numba_backend, ref, op, shape, rng):
    x = (rng.standard_normal(shape) * 4).astype(np.float32)
    want = getattr(ref, op)(x)
    bound = softmax_bound(x) if op == "softmax_last_dim" else log_softmax_bound(x, want)
    assert_within(getattr(numba_backend, op)(x), want, bound, op)


def test_softmax_with_masked_entries(numba_backend, ref, rng):
    x = rng.standard_normal((4, 9)).astype(np.float32)
    x[:, ::3] = -np.inf
    assert_within(numba_backend.softmax_last_dim(x), ref.softmax_last_dim(x), softmax_bound(x))


@pytest.mark.parametrize("shape", ROW_SHAPES[1:], ids=str)
@pytest.mark.parametrize("affine", ["weight+bias", "weight", "none"])
def test_layer_norm(numba_backend, ref, shape, affine, rng):
    x = (rng.standard_normal(shape) * 3 + 1).astype(np.float32)
    width = shape[-1]
    weight = rng.standard_normal(width).astype(np.float32) if affine != "none" else None
    bias = rng.standard_normal(width).astype(np.float32) if affine == "weight+bias" else None
    want = ref.layer_norm(x, weight, bias, 1e-5)
    assert_within(numba_backend.layer_norm(x, weight, bias, 1e-5), want,
                  layer_norm_bound(x, weight, bias, 1e-5, want))


@pytest.mark.parametrize("shape", ROW_SHAPES[1:], ids=str)
@pytest.mark.parametrize("with_weight", [True, False])
def test_rms_norm(numba_backend, ref, shape, with_weight, rng):
    x = rng.standard_normal(shape).astype(np.float32)
    weight = rng.standard_normal(shape[-1]).astype(np.float32) if with_weight else None
    want = ref.rms_norm(x, weight, 1e-6)
    assert_within(numba_backend.rms_norm(x, weight, 1e-6), want, rms_norm_bound(x, 1e-6, want))


def test_norms_accept_views(numba_backend, ref, rng):
    x = rng.standard_normal((33, 6)).astype(np.float32).T  # [6, 33], not contiguous
    weight = rng.standard_normal(33).astype(np.float32)
    want = ref.rms_norm(x, weight, 1e-5)
    assert_within(numba_backend.rms_norm(x, weight, 1e-5), want, rms_norm_bound(x, 1e-5, want))
    assert_within(numba_backend.softmax_last_dim(x), ref.softmax_last_dim(x), softmax_bound(x))


@pytest.mark.parametrize("op", ["rope", "rope_i"])
@pytest.mark.parametrize("shape", [(1, 1, 1, 2), (2, 3, 5, 14), (1, 9, 7, 64), (7, 64)], ids=str)
def test_rope(numba_backend, ref, op, shape, rng):
    x = rng.standard_normal(shape).astype(np.float32)
    angles = rng.uniform(-np.pi, np.pi, (shape[-2], shape[-1] // 2))
    cos, sin = np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
    assert_within(getattr(numba_backend, op)(x, cos, sin), getattr(ref, op)(x, cos, sin),
                  rope_bound(x, cos, sin, interleaved=op == "rope_i"), op)


def test_rope_on_a_transposed_view(numba_backend, ref, rng):
    x = rng.standard_normal((2, 5, 3, 8)).astype(np.float32).transpose(0, 2, 1, 3)
    cos = rng.standard_normal((5, 4)).astype(np.float32)
    sin = rng.standard_normal((5, 4)).astype(np.float32)
    assert_within(numba_backend.rope_i(x, cos, sin), ref.rope_i(x, cos, sin),
                  rope_bound(x, cos, sin, interleaved=True))


@pytest.mark.parametrize("op", ["gelu", "gelu_erf", "silu"])
@pytest.mark.parametrize("size", [5, 1537, PARALLEL_MIN_ELEMENTS + 3],
                         ids=["tiny", "small", "large"])
def test_activations(numba_backend, ref, op, size, rng):
    x = (rng.standard_normal(size) * 5).astype(np.float32)
    x[:3] = [0.0, -30.0, 30.0]
    want = ref.unary(op, x)
    assert_within(numba_backend.unary(op, x), want, unary_bound(op, x, want), op)


@pytest.mark.parametrize("width", [1536 + 7, PARALLEL_MIN_ELEMENTS // 3 + 7])
def test_silu_mul(numba_backend, ref, width, rng):
    gate = (rng.standard_normal((3, width)) * 4).astype(np.float32)
    up = rng.standard_normal(gate.shape).astype(np.float32)
    want = ref.silu_mul(gate, up)
    assert_within(numba_backend.silu_mul(gate, up), want, silu_mul_bound(want))


def _causal_mask(tq, tk):
    rows = np.arange(tq)[:, None] + (tk - tq)
    return np.where(np.arange(tk)[None, :] > rows, -np.inf, 0.0).astype(np.float32)


ATTENTION_CASES = {
    # name: (q shape, k/v heads, tk, mask kind)
    "decode": ((1, 9, 1, 64), 9, 37, None),
    "decode-causal-4": ((2, 4, 4, 32), 4, 11, "causal"),
    "shared-kv-head": ((1, 6, 1, 16), 1, 20, None),
    "padding-mask": ((3, 2, 1, 8), 2, 5, "padding"),
    "max-queries": ((1, 2, FUSED_ATTENTION_MAX_QUERIES, 16), 2, 40, "causal"),
    "reference-path": ((1, 2, FUSED_ATTENTION_MAX_QUERIES + 1, 16), 2, 40, "causal"),
}


@pytest.mark.parametrize("case", list(ATTENTION_CASES))
def test_attention(numba_backend, ref, case, rng):
    q_shape, kv_heads, tk, mask_kind = ATTENTION_CASES[case]
    batch, _, tq, d = q_shape
    q = rng.standard_normal(q_shape).astype(np.float32)
    k = rng.standard_normal((batch, kv_heads, tk, d)).astype(np.float32)
    v = rng.standard_normal((batch, kv_heads, tk, d)).astype(np.float32)
    mask = None
    if mask_kind == "causal":
        mask = _causal_mask(tq, tk)
    elif mask_kind == "padding":
        mask = np.zeros((batch, 1, 1, tk), np.float32)
        mask[1, ..., 3:] = -np.inf
    scale = 1.0 / np.sqrt(d)
    assert_within(numba_backend.attention(q, k, v, mask, scale), ref.attention(q, k, v, mask, scale),
                  attention_bound(q, k, v, mask, scale), case)


def test_f64_goes_to_the_reference_unchanged(numba_backend, ref, rng):
    x = rng.standard_normal((4, 33))
    w = rng.standard_normal(33)
    assert np.array_equal(numba_backend.softmax_last_dim(x), ref.softmax_last_dim(x))
    assert np.array_equal(numba_backend.layer_norm(x, w, w, 1e-5), ref.layer_norm(x, w, w, 1e-5))
    big = rng.standard_normal(PARALLEL_MIN_ELEMENTS + 1)
    assert np.array_equal(numba_backend.unary("gelu_erf", big), ref.unary("gelu_erf", big))


def test_tensor_ops_through_a_numba_device(rng):
    from candle_web import Device, Tensor
    from candle_web.core.errors import BackendUnavailable
    from candle_web.nn import ops

    try:
        fast = Device.cpu(backend="numba")
    except BackendUnavailable as e:
        pytest.skip(str(e))
    slow = Device.cpu(backend="numpy")
    x = rng.standard_normal((2, 3, 40)).astype(np.float32)
    w = rng.standard_normal(40).astype(np.float32)
    softmax = [ops.softmax_last_dim(Tensor.from_numpy(x, device=d)).to_numpy() for d in (fast, slow)]
    assert_within(*softmax, softmax_bound(x), "softmax")
    norms = [ops.rms_norm(Tensor.from_numpy(x, device=d), Tensor.from_numpy(w, device=d),
                          1e-5).to_numpy() for d in (fast, slow)]
    assert_within(*norms, rms_norm_bound(x, 1e-5, norms[1]), "rms_norm")
