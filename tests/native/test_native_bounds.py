"""The native suites' own bounds (native_testlib.py) can fail: each accepts another correct f32
evaluation and rejects a realistic kernel mistake (numpy only, no numba needed)."""

from __future__ import annotations

import numpy as np
import pytest

from candle_web.backend import get_backend
from candle_web.quantized import QTensor
from candle_native.quant_unpack import unpack
from tests.native.native_testlib import qmatmul_bound, rope_bound
from tests.tolerances_testlib import assert_within

REF = get_backend("numpy")


def _fails(got, want, bound):
    with pytest.raises(AssertionError, match="ratio"):
        assert_within(got, want, bound)


def _offset_folded(x, unpacked, use_offsets=True, scale_shift=0):
    """The native kernels' form in f32: per group scale * sum(level * x) + offset * sum(x).
    scale_shift reads each group's scale from another group (an indexing mistake)."""
    n, k = unpacked.shape
    group = 1 << unpacked.group_shift
    levels = unpacked.levels.reshape(n, k // group, group).astype(np.float32)
    xs = x.reshape(x.shape[0], k // group, group)
    sums = np.einsum("ngj,mgj->mng", levels, xs)  # f32 [m, n, groups]
    out = (np.roll(unpacked.scales, scale_shift, axis=1)[None] * sums).sum(-1, dtype=np.float32)
    if use_offsets and unpacked.offsets is not None:
        out += (unpacked.offsets[None] * xs.sum(-1)[:, None]).sum(-1, dtype=np.float32)
    return out


@pytest.mark.parametrize("kind", ["Q4_1", "Q4_K"])
def test_qmatmul_bound_takes_the_folded_offsets_and_rejects_their_loss(kind, rng):
    weight = QTensor.from_float((rng.standard_normal((33, 512)) + 0.3).astype(np.float32), kind)
    x = rng.standard_normal((3, 512)).astype(np.float32)
    want = REF.qmatmul(x, weight)
    bound = qmatmul_bound(x, weight)
    unpacked = unpack(weight)
    assert_within(_offset_folded(x, unpacked), want, bound)
    _fails(_offset_folded(x, unpacked, use_offsets=False), want, bound)
    _fails(_offset_folded(x, unpacked, scale_shift=1), want, bound)


@pytest.mark.parametrize("interleaved", [False, True])
def test_rope_bound_rejects_half_precision_tables(interleaved, rng):
    x = rng.standard_normal((2, 3, 5, 64)).astype(np.float32)
    angles = rng.uniform(-np.pi, np.pi, (5, 32))
    cos, sin = np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
    rotate = REF.rope_i if interleaved else REF.rope
    want = rotate(x, cos, sin)
    bound = rope_bound(x, cos, sin, interleaved)
    exact = rotate(x.astype(np.float64), cos.astype(np.float64), sin.astype(np.float64))
    assert_within(exact.astype(np.float32), want, bound)
    cos16, sin16 = (t.astype(np.float16).astype(np.float32) for t in (cos, sin))
    _fails(rotate(x, cos16, sin16), want, bound)

