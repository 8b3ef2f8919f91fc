"""QTensor, GgmlDType sizes and the reference quantized matmul."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from candle_web.core.errors import FormatError, ShapeError, ShapeMismatch
from candle_web.quantized import GgmlDType, QTensor, qmatmul_ref
from candle_web.quantized import qtensor as qtensor_module
from tests.tolerances_testlib import assert_within, dot_bound


def test_type_ids_and_sizes_agree_with_gguf_py():
    for qtype, (block_size, type_size) in gguf.constants.GGML_QUANT_SIZES.items():
        ours = GgmlDType(int(qtype))
        assert ours.name == qtype.name
        assert ours.block_size == block_size
        if ours is GgmlDType.Q8_1:
            # gguf-py keeps the pre-2024 f32 layout (40 bytes); ggml-common.h today has two
            # f16 (d, s) + 32 int8 = 36 (static_assert in ggml-common.h).
            assert (type_size, ours.type_size) == (40, 36)
        else:
            assert ours.type_size == type_size, ours.name


def test_block_sizes_named_in_the_design():
    expected = {"Q4_0": (32, 18), "Q4_1": (32, 20), "Q5_0": (32, 22), "Q5_1": (32, 24),
                "Q8_0": (32, 34), "Q2_K": (256, 84), "Q3_K": (256, 110), "Q4_K": (256, 144),
                "Q5_K": (256, 176), "Q6_K": (256, 210), "Q8_K": (256, 292)}
    for name, sizes in expected.items():
        assert (GgmlDType[name].block_size, GgmlDType[name].type_size) == sizes


def test_parse_accepts_names_ids_and_members():
    assert GgmlDType.parse("q4_k") is GgmlDType.Q4_K
    assert GgmlDType.parse(14) is GgmlDType.Q6_K
    assert GgmlDType.parse(GgmlDType.F16) is GgmlDType.F16
    with pytest.raises(FormatError, match="unknown GGML type id 4"):
        GgmlDType.parse(4)  # Q4_2, removed from ggml
    with pytest.raises(FormatError, match="unknown GGML type name"):
        GgmlDType.parse("q3_0")


@pytest.mark.parametrize("name", ["F32", "F16", "BF16", "Q4_0", "Q8_0", "Q4_K", "Q6_K", "Q8_K"])
def test_from_float_keeps_the_shape_and_size(name, rng):
    values = rng.standard_normal((3, 2, 512)).astype(np.float32)
    qt = QTensor.from_float(values, name)
    dtype = GgmlDType[name]
    assert qt.shape == (3, 2, 512)
    assert qt.nbytes == 6 * 512 // dtype.block_size * dtype.type_size
    restored = qt.dequantize()
    assert restored.shape == values.shape and restored.dtype == np.float32
    scale = np.abs(values).max()
    assert np.abs(restored - values).max() < 0.2 * scale  # coarse: the codecs have own tests


def test_f32_qtensor_is_lossless(rng):
    values = rng.standard_normal((4, 8)).astype(np.float32)
    np.testing.assert_array_equal(QTensor.from_float(values, "F32").dequantize(), values)


def test_qtensor_rejects_bad_sizes():
    with pytest.raises(FormatError, match="expected 36 bytes, got 35"):
        QTensor("Q4_0", (2, 32), bytes(35))
    with pytest.raises(ShapeError, match="multiple of 32"):
        QTensor("Q8_0", (4, 48), bytes(4 * 51))
    with pytest.raises(ShapeError, match="negative"):
        QTensor("F32", (-1, 4), b"")


def test_qtensor_views_its_buffer_without_copying():
    raw = bytearray(QTensor.from_float(np.ones((2, 32), np.float32), "Q8_0").data.tobytes())
    qt = QTensor("Q8_0", (2, 32), raw)
    raw[2:34] = bytes(32)  # zero the quants of row 0 in the caller's buffer
    np.testing.assert_array_equal(qt.dequantize()[0], 0.0)


def test_dequantize_rows_decodes_a_band(rng):
    values = rng.standard_normal((10, 256)).astype(np.float32)
    qt = QTensor.from_float(values, "Q6_K")
    np.testing.assert_array_equal(qt.dequantize_rows(3, 7), qt.dequantize()[3:7])


@pytest.mark.parametrize("name", ["Q4_0", "Q4_1", "Q5_1", "Q8_0", "Q4_K", "Q6_K", "F16"])
def test_qmatmul_ref_matches_a_dense_matmul(name, rng, monkeypatch):
    # Small bands so that the banding itself is exercised.
    monkeypatch.setattr(qtensor_module, "_QMATMUL_ROWS_PER_STEP", 7)
    weight = QTensor.from_float(rng.standard_normal((20, 512)).astype(np.float32), name)
    x = rng.standard_normal((2, 3, 512)).astype(np.float32)
    out = qmatmul_ref(x, weight)
    assert out.shape == (2, 3, 20) and out.dtype == np.float32
    dense = weight.dequantize().astype(np.float64)
    expected = x.astype(np.float64) @ dense.T
    # Same f32 weights; only the f32 rounding of the banded matmul differs from the f64
    # product: one f32 evaluation of a length-512 dot (tests/tolerances_testlib.py).
    assert_within(out, expected, dot_bound(x, dense.T, evaluations=1), name, dtype=np.float32)


def test_qmatmul_ref_checks_shapes(rng):
    weight = QTensor.from_float(rng.standard_normal((4, 64)).astype(np.float32), "Q8_0")
    with pytest.raises(ShapeMismatch, match=r"\(2, 32\).*\(4, 64\)"):
        qmatmul_ref(np.zeros((2, 32), np.float32), weight)
    with pytest.raises(ShapeError, match="2-D"):
        qmatmul_ref(np.zeros((2, 64), np.float32), QTensor("F32", (64,), bytes(256)))
