"""The fused LLaMA decode step's own kernels (numba_kernels/decoder_step.py) against float64
numpy references: the quantized matrix-vector product and the one-token attention.

The model tests (tests/models/test_llama_fused_decode.py) compare whole decode steps with the
generic path; these pin the two kernels that do the work on shapes the tiny models miss (odd
row counts, the SmolLM2 head size and cache lengths in the hundreds).
Tolerances, per element against the float64 references (one f32 evaluation):
- matvec: qmatmul_bound (tests/native/native_testlib.py): f32 products summed per 8 lanes and
  scaled once per 32-element group stay within gamma(k + 4) of the exact dot of |x| with the
  magnitudes of the terms summed;
- attention: attention_bound (tests/tolerances_testlib.py): the score dots, the softmax and the
  weighted sum of values in f32.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.native.native_testlib import qmatmul_bound
from tests.tolerances_testlib import assert_within, attention_bound

WIDTH = 576  # SmolLM2-135M's hidden size: 18 groups of 32
# Odd counts take the single-row tail; 130 rows span three ROW_CHUNKs when threaded.
ROW_COUNTS = [1, 7, 130]


@pytest.fixture
def rng():
    return np.random.default_rng(6)


def kernel_weight_tuple(qtensor):
    from candle_native.numba.backend import kernel_weight

    w = kernel_weight(qtensor)
    return (w.levels, w.scales, w.offsets, bool(w.use_offsets), int(w.group))


@pytest.mark.parametrize("parallel", [True, False], ids=["threads", "serial"])
@pytest.mark.parametrize("rows", ROW_COUNTS)
@pytest.mark.parametrize("quant", ["Q4_0", "Q4_1", "Q8_0"])
def test_matvec_matches_the_dequantized_product(numba_backend, quant, rows, parallel, rng):
    from candle_native.numba.kernels import decoder_step as nk
    from candle_web.quantized.qtensor import QTensor

    # An offset in the weights makes Q4_1's per-group minimum matter.
    values = rng.standard_normal((rows, WIDTH)).astype(np.float32) + np.float32(0.3)
    qtensor = QTensor.from_float(values, quant)
    x = rng.standard_normal(WIDTH).astype(np.float32)
    out = np.full(rows, np.nan, np.float32)
    nk.matvec(x, kernel_weight_tuple(qtensor), out, parallel)
    want = qtensor.dequantize().astype(np.float64) @ x.astype(np.float64)
    assert_within(out, want, qmatmul_bound(x, qtensor, evaluations=1), f"{quant} {rows} rows",
                  dtype=np.float32)


def attention_reference(q, keys, values, length, n_rep, scale):
    """Grouped-query attention of one token over `length` cached positions, float64."""
    n_heads, head_dim = q.shape
    out = np.empty((n_heads, head_dim))
    for h in range(n_heads):
        k = keys[h // n_rep, :length].astype(np.float64)
        v = values[h // n_rep, :length].astype(np.float64)
        scores = k @ q[h].astype(np.float64) * scale
        weights = np.exp(scores - scores.max())
        out[h] = (weights / weights.sum()) @ v
    return out.reshape(-1)


# (heads, kv heads, head size, cached length): SmolLM2's 9 over 3 heads of 64, a head size that
# is no multiple of 8, and a cache of one position (the first decode step after no prompt).
ATTENTION_CASES = [(9, 3, 64, 141), (4, 2, 20, 37), (2, 1, 64, 1)]


@pytest.mark.parametrize("parallel", [True, False], ids=["threads", "serial"])
@pytest.mark.parametrize("case", ATTENTION_CASES, ids=str)
def test_attention_matches_softmax_reference(numba_backend, case, parallel, rng):
    from candle_native.numba.kernels import decoder_step as nk

    n_heads, n_kv, head_dim, length = case
    capacity = length + 5  # positions past `length` must be ignored: fill them with garbage
    keys = rng.standard_normal((n_kv, capacity, head_dim)).astype(np.float32)
    values = rng.standard_normal((n_kv, capacity, head_dim)).astype(np.float32)
    keys[:, length:] = 1e6
    values[:, length:] = np.nan
    qkv = rng.standard_normal((n_heads + 2 * n_kv) * head_dim).astype(np.float32)
    scale = np.float32(1.0 / np.sqrt(head_dim))
    out = np.full(n_heads * head_dim, np.nan, np.float32)
    attend = nk._attend_parallel if parallel else nk._attend_serial
    attend(qkv, keys, values, length, n_heads, n_kv, head_dim, scale, out)
    q = qkv[:n_heads * head_dim].reshape(n_heads, head_dim)
    want = attention_reference(q, keys, values, length, n_heads // n_kv, scale)
    heads_kv = np.arange(n_heads) // (n_heads // n_kv)  # the cached head each query head reads
    bound = attention_bound(q[:, None], keys[heads_kv, :length], values[heads_kv, :length], None,
                            float(scale), evaluations=1)
    assert_within(out, want, bound.reshape(-1), f"attention {case}", dtype=np.float32)
