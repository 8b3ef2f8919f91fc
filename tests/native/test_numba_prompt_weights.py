"""The numba backend's prompt path (QMATMUL_BLAS_MIN_ROWS activation rows or more): quantized
weights decoded once to f32 and kept within a byte budget (CANDLE_WEB_PROMPT_WEIGHTS_MB),
against the band-at-a-time path used beyond the budget and the numpy reference.

The cached matrix is the exact dequantization (dequantize_rows_into is bit-identical to the
reference dequantizers, tests/native/test_quant_unpack.py) and is multiplied by the same BLAS
call as the numpy backend's dequantized QMatMul, so the results differ by BLAS blocking at most:
dot_bound on the dequantized weight (tests/tolerances_testlib.py; observed identical)."""

from __future__ import annotations

import gc

import numpy as np
import pytest
from candle_web.backend.settings import reload_settings

from candle_web.core.errors import UnsupportedError
from candle_web.quantized import GgmlDType, QTensor
from candle_native.numba import backend as nb

from tests.tolerances_testlib import assert_within, dot_bound

ROWS = nb.QMATMUL_BLAS_MIN_ROWS + 3


def quantized(kind: str, n: int, k: int, rng) -> QTensor:
    return QTensor.from_float(rng.standard_normal((n, k)).astype(np.float32),
                              GgmlDType.parse(kind))


@pytest.mark.parametrize("kind", ["Q4_1", "Q8_0", "Q6_K"])
def test_cached_and_band_paths_equal_the_reference(numba_backend, ref, rng, monkeypatch, kind):
    k = 512
    x = rng.standard_normal((ROWS, k)).astype(np.float32)
    cached = quantized(kind, 70, k, rng)
    expected = ref.qmatmul(x, cached)
    bound = dot_bound(x, cached.dequantize().T)  # both sides multiply these f32 values
    before = nb._DENSE_WEIGHTS.used_bytes
    assert_within(numba_backend.qmatmul(x, cached), expected, bound, kind)
    assert nb._DENSE_WEIGHTS.used_bytes == before + 4 * 70 * k  # kept for the next prompt
    # The second call reads the kept matrix: same numbers, nothing added.
    np.testing.assert_array_equal(numba_backend.qmatmul(x, cached),
                                  numba_backend.qmatmul(x, cached))
    assert nb._DENSE_WEIGHTS.used_bytes == before + 4 * 70 * k

    monkeypatch.setenv(nb.PROMPT_WEIGHTS_MB_VARIABLE, "0")
    reload_settings()  # the switches are read once
    banded = QTensor(cached.dtype, cached.shape, np.array(cached.data))  # a new weight
    assert_within(numba_backend.qmatmul(x, banded), expected, bound, kind)
    assert nb._DENSE_WEIGHTS.used_bytes == before + 4 * 70 * k  # over budget: not kept


def test_budget_is_released_when_the_weight_goes(numba_backend, rng):
    weight = quantized("Q8_0", 40, 256, rng)
    before = nb._DENSE_WEIGHTS.used_bytes
    numba_backend.qmatmul(rng.standard_normal((ROWS, 256)).astype(np.float32), weight)
    assert nb._DENSE_WEIGHTS.used_bytes == before + 4 * 40 * 256
    del weight
    gc.collect()
    assert nb._DENSE_WEIGHTS.used_bytes == before


def test_bad_budget_names_the_variable(numba_backend, rng, monkeypatch):
    monkeypatch.setenv(nb.PROMPT_WEIGHTS_MB_VARIABLE, "lots")
    reload_settings()  # the switches are read once
    weight = quantized("Q8_0", 8, 64, rng)
    with pytest.raises(UnsupportedError, match="CANDLE_WEB_PROMPT_WEIGHTS_MB='lots'"):
        numba_backend.qmatmul(np.ones((ROWS, 64), np.float32), weight)
