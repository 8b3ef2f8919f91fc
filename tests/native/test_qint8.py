"""The int8 products (numba kernels/qint8.py, int_lanes.py) against their numpy reference
(candle_web.quantized.int8_rows), which defines every bit.

Bitwise, no tolerance: the activations' int8 bytes, scales and sums; every weight type the
kernels take (real quantizers where the project has one, arbitrary bytes otherwise, so odd
scales and extreme levels are covered); widths with a last half block (k = 64 m + 32); a row
alone, in every batch size 1..13 (tiles of 8, 4 and single rows) and shuffled; serial and threaded; and
the plain integer form that CPUs without VNNI compile, in a child process.

Against float64: x W^T with the dequantized W within int8_rows.activation_error_bound: the
only approximation is rounding each activation to its block's int8 grid (half a step, amax /
254), the rest is exact integers and a few f32 roundings; and the typical error well below it
(measured: 0.56% of the outputs' median magnitude on standard-normal activations).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from candle_web.quantized import GgmlDType
from candle_web.quantized.int8_rows import (activation_error_bound, int8_rows_product,
                                            quantize_activation_rows)
from candle_web.quantized.qtensor import QTensor

WIDTH = 800  # 12 blocks of 64 and a last half block of 32; not a multiple of 256
K_WIDTH = 768  # the K-quants need multiples of 256 (three super-blocks: 12 blocks of 64)
ROWS = 70  # weight rows: two full chunks of 32 and a partial one
QUANTIZED = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q6_K", "Q8_K"]
ARBITRARY = ["Q2_K", "Q3_K", "Q5_K", "Q8_1"]  # no quantizer here: random bytes, sane scales
# Byte offsets of each arbitrary type's f16 super-scales (set to small finite values).
F16_FIELDS = {"Q2_K": (80, 82), "Q3_K": (108,), "Q5_K": (0, 2), "Q8_1": (0, 2)}


def kernel_tuple(qtensor):
    from candle_native.numba.backend import kernel_weight

    w = kernel_weight(qtensor)
    return (w.levels, w.scales, w.offsets, bool(w.use_offsets), int(w.group))


def int8_tuple(qtensor):
    levels, *rest = kernel_tuple(qtensor)
    return (levels.view(np.uint8), *rest)


def product(xs, weight, parallel):
    from candle_native.numba.kernels import qint8

    outs = np.full((xs.shape[0], weight[0].shape[0]), np.nan, np.float32)
    (qint8.rows_parallel if parallel else qint8.rows_serial)(xs, weight, outs)
    return outs


def reference(xs, qtensor):
    levels, scales, offsets, use_offsets, group = kernel_tuple(qtensor)
    return int8_rows_product(quantize_activation_rows(xs), levels, scales,
                             offsets if use_offsets else None, group)


def same_bits(a, b) -> bool:
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def arbitrary_weight(name, rng, width=K_WIDTH) -> QTensor:
    kind = GgmlDType[name]
    blocks = ROWS * width // kind.block_size
    raw = rng.integers(0, 256, (blocks, kind.type_size), dtype=np.uint8)
    for at in F16_FIELDS[name]:
        scale = rng.uniform(0.001, 0.02, blocks).astype(np.float16)
        raw[:, at:at + 2] = scale.view(np.uint8).reshape(blocks, 2)
    return QTensor(kind, (ROWS, width), raw.reshape(-1))


@pytest.fixture(scope="module", params=QUANTIZED + ARBITRARY)
def quantized(request):
    rng = np.random.default_rng(31)
    name = request.param
    if name in ARBITRARY:
        return name, arbitrary_weight(name, rng)
    width = WIDTH if GgmlDType[name].block_size == 32 else K_WIDTH
    # A shift makes the offsets (Q4_1's minimum, Q4_K's mins) matter.
    values = rng.standard_normal((ROWS, width)).astype(np.float32) + np.float32(0.3)
    return name, QTensor.from_float(values, name)


def activations(rng, rows, width):
    xs = rng.standard_normal((rows, width)).astype(np.float32)
    xs[0, 32:64] = 0.0  # a block of zeros: scale 0
    xs[1 % rows, 64:96] *= np.float32(1e4)  # a loud block beside quiet ones
    return xs


def test_activation_bytes_equal_the_reference(numba_backend):
    from candle_native.numba.kernels import qint8

    rng = np.random.default_rng(32)
    xs = activations(rng, 7, 224)
    # Exact ties of the rounding rule: amax 127 makes 127 / amax = 1, so x.5 rounds to even.
    xs[2, :32] = np.linspace(-127, 127, 32).astype(np.float32)
    xs[2, 0:4] = [127.0, 0.5, 1.5, -2.5]
    xs[3, 96:128] = np.float32(3e-39)  # subnormal amax: 127 / amax would overflow: zeros
    xs[3, 100] = 0.0
    xs[3, 128:160] = np.float32(2.0 ** -120)  # the smallest amax quantized (127 / amax finite)
    xs[4, 128] = np.inf  # a non-finite block: scale NaN, levels 0
    xs[5, 160] = np.nan
    want = quantize_activation_rows(xs)
    got = qint8.quantized_rows(xs)
    names = ["q", "scales", "lane_starts", "offset_factors16", "offset_factors32"]
    for name, array in zip(names, got):
        expected = getattr(want, name)
        assert array.dtype == expected.dtype and array.shape == expected.shape, name
        assert np.array_equal(array.view(np.uint8), expected.view(np.uint8)), name
    assert same_bits(got[5], np.repeat(want.scales, 8, axis=1))  # the kernels' lane scales
    assert list(want.q[2, :4]) == [127, 0, 2, -2]  # round half to even
    assert np.isnan(want.scales[4, 4]) and not want.q[4, 128:160].any()
    assert want.scales[0, 1] == 0 and not want.q[0, 32:64].any()
    assert want.scales[3, 3] == 0 and not want.q[3, 96:128].any()
    assert (want.q[3, 128:160] == 127).all()


@pytest.mark.parametrize("parallel", [True, False], ids=["threads", "serial"])
def test_products_equal_the_reference_bit_for_bit(numba_backend, quantized, parallel):
    name, qtensor = quantized
    rng = np.random.default_rng(33)
    xs = activations(rng, 15, qtensor.shape[1])  # tiles of 8 and 4, then 3 single rows
    got = product(xs, int8_tuple(qtensor), parallel)
    want = reference(xs, qtensor)
    differ = np.argwhere(got.view(np.uint32) != want.view(np.uint32))
    assert differ.size == 0, f"{name}: outputs {differ[:5].tolist()} differ from the reference"


def test_each_row_alone_and_in_any_batch_gives_the_same_bits(numba_backend, quantized):
    name, qtensor = quantized
    weight = int8_tuple(qtensor)
    rng = np.random.default_rng(34)
    xs = activations(rng, 13, qtensor.shape[1])
    alone = np.concatenate([product(xs[b:b + 1], weight, True) for b in range(13)])
    for batch in range(2, 14):
        together = product(xs[:batch], weight, True)
        differ = np.flatnonzero((together.view(np.uint32) != alone[:batch].view(np.uint32))
                                .any(axis=1))
        assert differ.size == 0, f"{name}: {batch} rows, rows {differ.tolist()} differ alone"
    order = [8, 3, 0, 5, 1, 12, 7, 2, 9]
    assert same_bits(product(xs[order], weight, False), alone[order])


@pytest.mark.parametrize("name", ["Q4_0", "Q4_1", "Q8_0", "Q6_K"])
def test_products_are_near_the_float64_product(numba_backend, name):
    rng = np.random.default_rng(35)
    width = WIDTH if GgmlDType[name].block_size == 32 else K_WIDTH
    values = rng.standard_normal((ROWS, width)).astype(np.float32) + np.float32(0.3)
    qtensor = QTensor.from_float(values, name)
    xs = activations(rng, 5, width)
    got = product(xs, int8_tuple(qtensor), True).astype(np.float64)
    dequantized = qtensor.dequantize().astype(np.float64)
    want = xs.astype(np.float64) @ dequantized.T
    bound = activation_error_bound(xs, dequantized)
    excess = np.abs(got - want) - bound
    assert (excess <= 0).all(), (f"{name}: worst excess {excess.max():.3g} over the bound at "
                                 f"{np.unravel_index(excess.argmax(), excess.shape)}")
    # The bound adds every rounding's worst case (about a quarter of the outputs' scale here);
    # the errors add like a random walk: measured 0.56% of the outputs' median magnitude.
    typical = np.median(np.abs(got - want)) / np.median(np.abs(want))
    assert typical < 0.02, f"{name}: median error {typical:.2%} of the outputs' median"



def test_the_vnni_instruction_is_what_runs(numba_backend):
    """Where the CPU has AVX-512 VNNI, the four-row kernel's integer step is vpdpbusd (one per
    activation row of a 64-element block and of a last half block) and no widening multiply.
    The kernel is compiled afresh here (a cached one has no assembly to show)."""
    from numba import njit

    from candle_native.numba.kernels import int_lanes, qint8

    if int_lanes.INSTRUCTIONS != "avx512vnni":
        pytest.skip(f"this CPU compiles the {int_lanes.INSTRUCTIONS} integer step (no AVX-512 "
                    "VNNI): test_the_portable_integer_step_gives_the_same_bits covers it")
    rng = np.random.default_rng(36)
    qtensor = QTensor.from_float(rng.standard_normal((ROWS, WIDTH)).astype(np.float32), "Q4_0")
    xs = activations(rng, 4, WIDTH)
    weight = int8_tuple(qtensor)
    fresh = njit(nogil=True)(qint8._rows_x4.py_func)
    outs = np.zeros((4, ROWS), np.float32)
    fresh(qint8.quantized_rows(xs), 0, weight, outs, 0, ROWS)
    assert same_bits(outs, reference(xs, qtensor))
    asm = "".join(fresh.inspect_asm().values())
    assert asm.count("vpdpbusd") >= 8, "expected 4 rows x (64-element + half block) vpdpbusd"
    assert "vpmuldq" not in asm and "vpmulld" not in asm


# The product is called from a fast-math kernel, as decoder_step.project calls it: numba
# hands a callee that sets no fastmath its caller's flags, which once turned the scales'
# division into a multiply by a reciprocal (an ulp off): the exact kernels say fastmath=False.
PORTABLE_CHILD = """
import json, sys
import numpy as np
from numba import njit
from candle_native.numba.kernels import int_lanes, qint8
from candle_native.numba.kernels._jit import FAST_REDUCTIONS
xs = np.asarray(json.loads(sys.argv[1]), np.float32)
levels = np.asarray(json.loads(sys.argv[2]), np.int8)
scales = np.asarray(json.loads(sys.argv[3]), np.float32)
outs = np.zeros((xs.shape[0], levels.shape[0]), np.float32)

@njit(fastmath=FAST_REDUCTIONS)
def fast_caller(xs, weight, outs):
    qint8.rows(xs, weight, outs, False)

fast_caller(xs, (levels.view(np.uint8), scales, np.zeros((1, 1), np.float32), False, 16), outs)
print(int_lanes.INSTRUCTIONS, json.dumps(outs.view(np.uint32).tolist()))
"""


FORMS = ("portable", "avxvnni", "")


@pytest.fixture(scope="module")
def forms_children(numba_backend, tmp_path_factory):
    """Each form's child process, all started at once (each compiles every kernel, ~20 s of
    one core: run one after another they took a minute of the suite on 2 cores), and the
    inputs they were given: {form: (process, xs, levels, scales)}."""
    from candle_native.numba.kernels import int_lanes

    rng = np.random.default_rng(37)
    xs = activations(rng, 9, 224)  # 63 blocks: a reciprocal's ulp would show in some scale
    levels = rng.integers(-128, 128, (9, 224)).astype(np.int8)
    scales = rng.uniform(0.001, 0.01, (9, 14)).astype(np.float32)
    children = {}
    for form in FORMS:
        if form == "avxvnni" and "+avxvnni" not in int_lanes._target_features():
            continue
        env = dict(os.environ, CANDLE_NATIVE_INT_LANES=form,
                   NUMBA_CACHE_DIR=str(tmp_path_factory.mktemp(f"numba-{form or 'host'}")))
        children[form] = subprocess.Popen(
            [sys.executable, "-c", PORTABLE_CHILD, json.dumps(xs.tolist()),
             json.dumps(levels.tolist()), json.dumps(scales.tolist())],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    yield {form: (child, xs, levels, scales) for form, child in children.items()}
    for child in children.values():
        if child.returncode is None:  # not awaited by its test (deselected, or failed early)
            child.kill()
            child.communicate()


@pytest.mark.parametrize("form", FORMS)
def test_the_other_integer_steps_give_the_same_bits(forms_children, form):
    """CANDLE_NATIVE_INT_LANES compiles the plain widening form (what a CPU without VNNI runs)
    or AVX-VNNI's 256-bit vpdpbusd (CPUs with AVX2 VNNI only), or nothing forced, in a child
    process with its own kernel cache, first called from a fast-math kernel: same bits as the
    reference."""
    from candle_native.numba.kernels import int_lanes

    if form not in forms_children:
        pytest.skip(f"this CPU has no {form}")
    child, xs, levels, scales = forms_children[form]
    stdout, stderr = child.communicate(timeout=300)
    assert child.returncode == 0, stderr[-2000:]
    instructions, bits = stdout.split(" ", 1)
    assert instructions == (form or int_lanes.INSTRUCTIONS)
    want = int8_rows_product(quantize_activation_rows(xs), levels, scales, None, 16)
    assert np.array_equal(np.asarray(json.loads(bits), np.uint32), want.view(np.uint32))
