"""The decode steps' quantized products for 1..B activation rows (numba kernels/qrows.py).

Bitwise: a row's outputs are the same whether it runs alone (the one-row kernel, which the
single-token step uses) or in a tile of four beside other rows (the batched step and prompts),
for every batch size (tiles overlap when B is not a multiple of 4), both group sizes, with and
without offsets, serial and threaded. This is what lets a served request's greedy ids not
depend on its batch, so no tolerance is allowed.

Against float64: the dequantized matrix times x within qmatmul_bound (tests/native/
native_testlib.py): every term is an f32 product of a once-rounded weight, summed in some
order, inside gamma(k + 4) of the sum of the terms' magnitudes.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.native.native_testlib import qmatmul_bound
from tests.tolerances_testlib import assert_within

WIDTH = 768  # 24 blocks of 32, three K-quant super-blocks of 256
ROWS = 70  # weight rows: two full chunks of 32 and a partial one
# Q4_0 and Q8_0: 32-element groups without offsets; Q4_1 and Q4_K: with; Q6_K: 16-element groups.
QUANTS = ["Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q6_K"]


def weight_tuple(qtensor):
    from candle_native.numba.backend import kernel_weight

    w = kernel_weight(qtensor)
    return (w.levels, w.scales, w.offsets, bool(w.use_offsets), int(w.group))


def product(xs, weight, parallel):
    from candle_native.numba.kernels import qrows

    outs = np.full((xs.shape[0], weight[0].shape[0]), np.nan, np.float32)
    (qrows.rows_parallel if parallel else qrows.rows_serial)(xs, weight, outs)
    return outs


@pytest.fixture(scope="module", params=QUANTS)
def quantized(request):
    from candle_web.quantized.qtensor import QTensor

    rng = np.random.default_rng(21)
    # A shift makes the offsets (Q4_1's minimum, Q4_K's mins) matter.
    values = rng.standard_normal((ROWS, WIDTH)).astype(np.float32) + np.float32(0.3)
    qtensor = QTensor.from_float(values, request.param)
    return request.param, qtensor


@pytest.mark.parametrize("parallel", [True, False], ids=["threads", "serial"])
def test_each_row_alone_and_in_any_batch_gives_the_same_bits(numba_backend, quantized,
                                                             parallel):
    quant, qtensor = quantized
    weight = weight_tuple(qtensor)
    assert weight[4] == (16 if quant == "Q6_K" else 32)
    assert weight[3] == (quant in ("Q4_1", "Q4_K"))
    rng = np.random.default_rng(22)
    xs = rng.standard_normal((9, WIDTH)).astype(np.float32)
    alone = np.concatenate([product(xs[b:b + 1], weight, parallel) for b in range(9)])
    for batch in range(2, 10):
        together = product(xs[:batch], weight, parallel)
        differ = np.flatnonzero((together != alone[:batch]).any(axis=1))
        assert differ.size == 0, (f"{quant}: {batch} rows, rows {differ.tolist()} differ from "
                                  "the same rows alone")
    # and a row's bits do not depend on which rows run beside it
    shuffled = product(xs[[8, 3, 0, 5, 1]], weight, parallel)
    assert np.array_equal(shuffled, alone[[8, 3, 0, 5, 1]])


def test_rows_match_the_dequantized_product(numba_backend, quantized):
    quant, qtensor = quantized
    rng = np.random.default_rng(23)
    xs = rng.standard_normal((6, WIDTH)).astype(np.float32)
    got = product(xs, weight_tuple(qtensor), parallel=True)
    dequantized = qtensor.dequantize().astype(np.float64)
    for b in range(xs.shape[0]):
        want = dequantized @ xs[b].astype(np.float64)
        assert_within(got[b], want, qmatmul_bound(xs[b], qtensor, evaluations=1),
                      f"{quant} row {b}", dtype=np.float32)
