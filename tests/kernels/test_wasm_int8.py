"""The wasm int8 products (web/kernels/linear_int8.c: linear_q8, quantize_q8_rows) against
their numpy reference, candle_web.quantized.int8_rows, which defines every bit; both builds
(relaxed SIMD: i32x4.relaxed_dot_i8x16_i7x16_add_s on levels + bias in 0..127; plain SIMD:
i32x4.dot_i16x8_s after widening), so the two builds give the same bits too.

Bitwise, no tolerance: the activations' int8 bytes and scales (ties rounded half to even,
zero, tiny, inf and NaN blocks); every GGML type the page multiplies, from candle_web's
quantizers where it has one and arbitrary bytes otherwise (every level, odd sub-scales and
mins); widths with a last half block (k = 64 m + 32); 1 to 9 rows of X (the 1..4-row passes);
and the pieces of a projection numba joins (offsets grouped by 16 next to a Q6_K piece, zero
offsets added next to a piece that has some).
"""

from __future__ import annotations

import numpy as np
import pytest

from candle_web.backend.wasm import abi
from candle_web.quantized import GgmlDType, quantize
from candle_web.quantized.int8_rows import int8_rows_product, quantize_activation_rows
from candle_web.quantized.qtensor import QTensor
from tests.kernels.test_wasm_kernels import random_blocks

FLAGS = abi.MATRIX_FLAGS
QUANTIZABLE = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q6_K"]
ARBITRARY = ["Q2_K", "Q3_K", "Q5_K"]  # no quantizer here: random bytes, finite super-scales
WIDTHS = {32: 96 + 64, 256: 512}  # block size -> k: 5 blocks of 32 (a last half block), 2 of 256


def kernel_weight(qtensor):
    """(levels, scales, offsets or None, group): the flat layout int8_rows multiplies."""
    from candle_native.quant_unpack import kernel_weight as unpacked

    w = unpacked(qtensor)
    return w.levels, w.scales, (w.offsets if w.use_offsets else None), int(w.group)


def weight(name, rng, n, k) -> QTensor:
    kind = GgmlDType[name]
    if name in QUANTIZABLE:
        raw = quantize(kind, (rng.standard_normal((n, k)) * 0.05).astype(np.float32))
    else:
        raw = random_blocks(kind, n * k // kind.block_size, rng)
    return QTensor(kind, (n, k), np.ascontiguousarray(raw).reshape(-1))


def activations(rng, m, k) -> np.ndarray:
    x = rng.standard_normal((m, k)).astype(np.float32)
    x[:, 40:48] *= 1000.0  # blocks of very different scales
    return x


def linear_q8(km, type_word, x, qtensor):
    m, k = x.shape
    n = qtensor.shape[0]
    X, W = km.put(x), km.put(np.asarray(qtensor.data).reshape(-1))
    Y = km.empty((m, n))
    km.call("linear_q8", type_word, m, n, k, X, k, W, Y, n, km.scratch)
    return Y.get()


def same_bits(a, b) -> bool:
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.mark.filterwarnings("ignore:overflow encountered")
def test_activation_bytes_equal_the_reference(km, rng):
    k = 256
    x = activations(rng, 6, k)
    x[1, 0:32] = 0.0  # a zero block: d = 0
    x[1, 32:64] = np.float32(2.0 ** -125)  # below 2^-120: counted as zeros
    x[2, 64:96] = np.arange(32, dtype=np.float32) - 15.5  # ties: x * 127/amax lands on .5
    x[2, 96:128] = (np.arange(32, dtype=np.float32) - 16) * np.float32(127 / 16) / 127 * 0.5
    x[3, 5] = np.inf
    x[3, 70] = np.nan
    x[4, 128:160] = -np.float32(3.0e38)  # amax near FLT_MAX
    X, Q, D = km.put(x), km.empty((6, k), np.uint8), km.empty((6, k // 32))
    km.call("quantize_q8_rows", 6, k, X, Q, D, km.scratch)
    expected = quantize_activation_rows(x)
    assert np.array_equal(Q.get().view(np.int8), expected.q)
    assert same_bits(D.get(), expected.scales)


@pytest.mark.parametrize("name", QUANTIZABLE + ARBITRARY)
@pytest.mark.parametrize("m", [1, 3, 9])
def test_products_equal_the_reference_bit_for_bit(km, rng, name, m):
    kind = GgmlDType[name]
    n, k = 37, WIDTHS[kind.block_size]
    w = weight(name, rng, n, k)
    x = activations(rng, m, k)
    expected = int8_rows_product(quantize_activation_rows(x), *kernel_weight(w))
    got = linear_q8(km, int(kind) | FLAGS["int8"], x, w)
    assert same_bits(got, expected), (
        f"{name} m={m}: {np.count_nonzero(got != expected)} of {got.size} differ, "
        f"largest {np.nanmax(np.abs(got - expected))}")


def test_a_nan_activation_poisons_its_row_only(km, rng):
    w = weight("Q4_K", rng, 8, 256)
    x = activations(rng, 3, 256)
    x[1, 100] = np.nan
    got = linear_q8(km, int(GgmlDType.Q4_K), x, w)
    expected = int8_rows_product(quantize_activation_rows(x), *kernel_weight(w))
    assert np.isnan(got[1]).all() and not np.isnan(got[[0, 2]]).any()
    assert same_bits(got, expected)


def joined_reference(x, pieces):
    """numba's joined weight of several pieces (parts/llama_decoder._joined): groups of the
    smallest size, offsets repeated to it, zeros for the pieces without."""
    parts = [kernel_weight(p) for p in pieces]
    group = min(g for *_, g in parts)
    with_offsets = any(o is not None for _, _, o, _ in parts)
    levels = np.concatenate([lv for lv, *_ in parts])
    scales = np.concatenate([np.repeat(s, g // group, axis=1) for _, s, _, g in parts])
    offsets = None
    if with_offsets:
        offsets = np.concatenate([np.repeat(o, g // group, axis=1) if o is not None
                                  else np.zeros((lv.shape[0], lv.shape[1] // group), np.float32)
                                  for lv, _, o, g in parts])
    return int8_rows_product(quantize_activation_rows(x), levels, scales, offsets, group)


@pytest.mark.parametrize("names", [("Q4_K", "Q6_K"), ("Q8_0", "Q4_1"), ("Q5_0", "Q5_0")])
def test_pieces_of_a_joined_projection(km, rng, names):
    """The fused steps pass q|k|v and gate|up piece by piece; with the join bits the steps
    set (steps.c: int8_join), each piece gives the rows of numba's joined weight."""
    k = 256
    pieces = [weight(name, rng, 19, k) for name in names]
    x = activations(rng, 2, k)
    kinds = [GgmlDType[name] for name in names]
    by16 = any(kind.name in ("Q2_K", "Q3_K", "Q6_K") for kind in kinds)
    offsets = any(kind.name in ("Q4_1", "Q5_1", "Q2_K", "Q4_K", "Q5_K") for kind in kinds)
    join = ((FLAGS["int8_offsets_joined"] if offsets else 0)
            | (FLAGS["int8_offsets_16"] if offsets and by16 else 0))
    got = np.concatenate([linear_q8(km, int(kind) | FLAGS["int8"] | join, x, piece)
                          for kind, piece in zip(kinds, pieces)], axis=1)
    assert same_bits(got, joined_reference(x, pieces))


@pytest.mark.parametrize("type_id,k", [(9, 32), (1, 32), (2, 48), (12, 128)])
def test_bad_input_fills_nan(km, rng, type_id, k):
    x = activations(rng, 2, k)
    X, W, Y = km.put(x), km.put(np.zeros(4096, np.uint8)), km.empty((2, 3))
    km.call("linear_q8", type_id, 2, 3, k, X, k, W, Y, 3, km.scratch)
    assert np.isnan(Y.get()).all()
