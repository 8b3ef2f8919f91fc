"""The unpacked int8 layout reproduces the reference dequantizers bit for bit (integer paths are
exact), and is cached once per QTensor."""

from __future__ import annotations

import gc

import numpy as np
import pytest

from candle_web.core.errors import ShapeError, UnsupportedError
from candle_web.quantized import GgmlDType, QTensor
from candle_native.quant_unpack import UNPACKABLE, PerWeightCache, unpack, unpacked

ALL_UNPACKABLE = sorted(UNPACKABLE, key=lambda t: t.value)


def random_blocks(kind: GgmlDType, n: int, k: int, rng) -> QTensor:
    """Arbitrary block bytes (every bit pattern, NaN/inf f16 scales included) of an [n, k]
    weight: the unpacker must agree with the reference on all of them."""
    n_bytes = n * kind.row_bytes(k)
    return QTensor(kind, (n, k), rng.integers(0, 256, n_bytes, dtype=np.uint8))


@pytest.mark.parametrize("kind", ALL_UNPACKABLE, ids=lambda t: t.name)
def test_unpacked_values_equal_reference_bits(kind, rng):
    n, k = 5, 2 * kind.block_size if kind.block_size == 256 else 7 * 32
    qt = random_blocks(kind, n, k, rng)
    want = qt.dequantize()
    got = unpack(qt).dequantize()
    same = (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))
    assert same.all(), f"{kind.name}: {int((~same).sum())} values differ"


@pytest.mark.parametrize("kind", ALL_UNPACKABLE, ids=lambda t: t.name)
def test_levels_stay_in_the_type_range(kind, rng):
    ranges = {"Q4_0": (-8, 7), "Q4_1": (0, 15), "Q5_0": (-16, 15), "Q5_1": (0, 31),
              "Q2_K": (0, 3), "Q3_K": (-4, 3), "Q4_K": (0, 15), "Q5_K": (0, 31), "Q6_K": (-32, 31)}
    levels = unpack(random_blocks(kind, 3, 256, rng)).levels
    low, high = ranges.get(kind.name, (-128, 127))
    assert levels.dtype == np.int8
    assert low <= levels.min() and levels.max() <= high


def test_unpacked_is_cached_per_qtensor_and_dropped_with_it(rng):
    qt = QTensor.from_float(rng.standard_normal((4, 64)).astype(np.float32), "q8_0")
    cache = PerWeightCache()
    calls = []

    def build(q):
        calls.append(q.shape)
        return object()

    first = cache.get(qt, build)
    assert cache.get(qt, build) is first and len(calls) == 1
    del qt
    gc.collect()
    assert len(cache) == 0
    assert unpacked(QTensor.from_float(np.ones((1, 32), np.float32), "q4_0")) is not None


def test_unpack_rejects_what_it_cannot_handle(rng):
    with pytest.raises(UnsupportedError, match="F16"):
        unpack(QTensor.from_float(np.ones((2, 32), np.float32), "f16"))
    with pytest.raises(ShapeError, match="2-D"):
        unpack(QTensor.from_float(np.ones((2, 2, 32), np.float32), "q8_0"))


@pytest.mark.parametrize("kind", [GgmlDType.Q4_K, GgmlDType.Q5_0, GgmlDType.Q6_K, GgmlDType.Q8_0],
                         ids=lambda t: t.name)
def test_levels_written_in_place_equal_the_numpy_unpackers(kind, rng, monkeypatch):
    """The types whose levels are written in place (numba/kernels/unpack_levels.py, Q8_0's
    byte copy) give the numpy unpacker's levels, scales and offsets exactly, on arbitrary
    bytes."""
    pytest.importorskip("numba")
    from candle_native import quant_unpack

    qt = random_blocks(kind, 9, 512, rng)
    fast = unpack(qt)
    monkeypatch.setattr(quant_unpack, "_IN_PLACE", {})
    slow = unpack(qt)
    assert np.array_equal(fast.levels, slow.levels), f"{kind.name}: levels differ"
    assert fast.group_shift == slow.group_shift
    for got, want in ((fast.scales, slow.scales), (fast.offsets, slow.offsets)):
        assert (got is None) == (want is None)
        if got is not None:
            assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
