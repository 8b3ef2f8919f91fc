"""Numba quantized matmul against the numpy reference (qmatmul_ref), on synthetic and real
GGUF weights.

Tolerance: per output, qmatmul_bound (tests/native/native_testlib.py): the kernel multiplies
the same f32 weight values as the reference (the unpacked layout is bit-exact, see
test_quant_unpack) but sums them in a different order (vector lanes, per-group partial sums,
offsets folded through sums of x), so each side is within gamma(k + 4) of the exact dot of
|x| with the magnitudes of the terms summed (|scale * level| + |offset|). From
QMATMUL_BLAS_MIN_ROWS rows on, the backend decodes the weight (exactly) and calls BLAS like the
reference, which the same bound covers (observed identical)."""

from __future__ import annotations

import numpy as np
import pytest

from candle_web.core.errors import ShapeMismatch
from candle_web.quantized import GgmlDType, QTensor
from candle_native.numba.backend import QMATMUL_BLAS_MIN_ROWS, kernel_weight

from tests.native.native_testlib import qmatmul_bound
from tests.tolerances_testlib import assert_within

# The eight types named by the design (all with a quantizer or random blocks).
KERNEL_TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K"]
EXTRA_TYPES = ["Q2_K", "Q3_K", "Q8_K", "Q8_1"]


def make_weight(kind_name: str, n: int, k: int, rng) -> QTensor:
    kind = GgmlDType.parse(kind_name)
    values = rng.standard_normal((n, k)).astype(np.float32)
    try:
        return QTensor.from_float(values, kind)
    except Exception:
        # No quantizer for this type (Q5_K, Q2_K, Q3_K, Q8_1): random blocks whose f16 scales are
        # overwritten with finite values keep the outputs finite and comparable.
        raw = rng.integers(0, 256, (n * k // kind.block_size, kind.type_size), dtype=np.uint8)
        scale_bytes = np.float16(0.01).tobytes()
        for offset in _f16_scale_offsets(kind):
            raw[:, offset:offset + 2] = np.frombuffer(scale_bytes, np.uint8)
        return QTensor(kind, (n, k), raw.reshape(-1))


def _f16_scale_offsets(kind):
    return {"Q5_K": (0, 2), "Q2_K": (80, 82), "Q3_K": (108,), "Q8_1": (0, 2),
            "Q4_K": (0, 2), "Q6_K": (208,)}.get(kind.name, (0,))


def k_for(kind_name: str) -> int:
    # Odd block counts: 3 super-blocks for the k-quants, 7 blocks for the 32-element types.
    return 768 if kind_name.endswith("_K") else 224


@pytest.mark.parametrize("kind", KERNEL_TYPES + EXTRA_TYPES)
@pytest.mark.parametrize("m", [1, 3, QMATMUL_BLAS_MIN_ROWS + 5])
def test_qmatmul_matches_reference(numba_backend, ref, kind, m, rng):
    k = k_for(kind)
    weight = make_weight(kind, 67, k, rng)
    x = rng.standard_normal((m, k)).astype(np.float32)
    assert_within(numba_backend.qmatmul(x, weight), ref.qmatmul(x, weight),
                  qmatmul_bound(x, weight), kind)


def test_qmatmul_keeps_leading_dims_and_accepts_views(numba_backend, ref, rng):
    weight = make_weight("Q4_1", 33, 96, rng)
    x = rng.standard_normal((2, 96, 3)).astype(np.float32).transpose(0, 2, 1)  # [2, 3, 96] view
    got = numba_backend.qmatmul(x, weight)
    assert got.shape == (2, 3, 33)
    assert_within(got, ref.qmatmul(np.ascontiguousarray(x), weight), qmatmul_bound(x, weight))


def test_qmatmul_unpacks_each_weight_once(numba_backend, rng):
    weight = make_weight("Q8_0", 16, 64, rng)
    x = rng.standard_normal((1, 64)).astype(np.float32)
    numba_backend.qmatmul(x, weight)
    cached = kernel_weight(weight)
    numba_backend.qmatmul(x, weight)
    assert kernel_weight(weight) is cached


def test_qmatmul_falls_back_for_plain_types(numba_backend, ref, rng):
    weight = QTensor.from_float(rng.standard_normal((5, 32)).astype(np.float32), "f16")
    x = rng.standard_normal((2, 32)).astype(np.float32)
    assert np.array_equal(numba_backend.qmatmul(x, weight), ref.qmatmul(x, weight))


def test_qmatmul_shape_mismatch_names_both_shapes(numba_backend, rng):
    weight = make_weight("Q4_0", 4, 64, rng)
    with pytest.raises(ShapeMismatch, match=r"\(2, 32\).*\(4, 64\)"):
        numba_backend.qmatmul(np.zeros((2, 32), np.float32), weight)


REAL_TENSORS = [
    ("smollm2-135m-instruct", "SmolLM2-135M-Instruct.Q4_1.gguf", "blk.0.ffn_down.weight", "Q4_1"),
    ("smollm2-135m-instruct", "SmolLM2-135M-Instruct.Q4_1.gguf", "blk.3.attn_q.weight", None),
    ("gemma3-270m-q4km", "gemma-3-270m-Q4_K_M.gguf", "blk.0.attn_k.weight", "Q5_0"),
    ("gemma3-270m-q4km", "gemma-3-270m-Q4_K_M.gguf", "blk.0.attn_output.weight", "Q4_K"),
    ("gemma3-270m-q4km", "gemma-3-270m-Q4_K_M.gguf", "blk.0.ffn_down.weight", "Q6_K"),
]


@pytest.mark.parametrize("model,filename,tensor,kind", REAL_TENSORS,
                         ids=[f"{r[0]}:{r[2]}" for r in REAL_TENSORS])
def test_qmatmul_on_real_gguf_weights(numba_backend, ref, model_file, model, filename, tensor,
                                      kind, rng):
    from candle_web.io.gguf import GgufFile

    with GgufFile.open(model_file(model, filename)) as gguf:
        weight = gguf.qtensor(tensor)
        if kind is not None:
            assert weight.dtype.name == kind
        k = weight.shape[1]
        for m in (1, 2, QMATMUL_BLAS_MIN_ROWS):
            x = rng.standard_normal((m, k)).astype(np.float32)
            assert_within(numba_backend.qmatmul(x, weight), ref.qmatmul(x, weight),
                          qmatmul_bound(x, weight), f"{tensor} m={m}")
        del weight
