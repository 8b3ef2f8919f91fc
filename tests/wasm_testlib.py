"""Test inputs and bounds shared by the wasm kernels' suites (tests/backend natively under
wasmtime, tests/ui in the page): random GGML weights of every type the module implements, the
magnitudes a quantized product's error scales with, and RoPE's bound. Imported as
`tests.<module>` (see tests/__init__.py)."""

from __future__ import annotations

import numpy as np
from tests.tolerances_testlib import sum_bound

from candle_web.core.errors import CandleError
from candle_web.quantized import GgmlDType, QTensor

# Byte ranges of the quant fields per block (ggml-common.h); everything else is scales/mins.
QUANT_BYTES = {
    GgmlDType.Q4_0: ((2, 18),), GgmlDType.Q4_1: ((4, 20),),
    GgmlDType.Q5_0: ((2, 22),), GgmlDType.Q5_1: ((4, 24),), GgmlDType.Q8_0: ((2, 34),),
    GgmlDType.Q2_K: ((16, 80),), GgmlDType.Q3_K: ((0, 96),), GgmlDType.Q4_K: ((16, 144),),
    GgmlDType.Q5_K: ((16, 176),), GgmlDType.Q6_K: ((0, 192),),
}
# Byte offsets of the f16 scales of the types without a quantizer (ggml-common.h).
F16_SCALES = {GgmlDType.Q5_K: (0, 2), GgmlDType.Q2_K: (80, 82), GgmlDType.Q3_K: (108,),
              GgmlDType.Q8_1: (0, 2)}
# Per product term beyond the product and the sum: the reference rounds the dequantized value
# twice (scale * level, + offset); a kernel may instead scale a block's partial sum and add an
# offset times the block's sum of x (two more).
QUANT_EXTRA_ROUNDINGS = 4


def f32(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def random_qweight(kind: GgmlDType, n: int, k: int, rng) -> QTensor:
    """A [n, k] weight of `kind`: quantized from random values, or, for the types without a
    quantizer here (Q5_K, Q2_K, Q3_K, Q8_1), random blocks whose f16 scales are made finite."""
    try:
        return QTensor.from_float(f32(rng, n, k), kind)
    except CandleError:
        blocks = rng.integers(0, 256, (n * k // kind.block_size, kind.type_size), dtype=np.uint8)
        for start in F16_SCALES[kind]:
            scales = (rng.standard_normal(blocks.shape[0]) * 0.05).astype("<f2")
            blocks[:, start:start + 2] = scales.view(np.uint8).reshape(-1, 2)
        return QTensor(kind, (n, k), blocks.reshape(-1))


def quant_term_magnitudes(qweight: QTensor) -> np.ndarray:
    """|value - offset| + |offset| per weight, where `offset` is what the block decodes to
    with every quant zeroed (a min, or the -8 d of Q4_0): the magnitudes of the terms a kernel
    sums whether it multiplies dequantized values or folds offsets through sums of x."""
    blocks = qweight.data.reshape(-1, qweight.dtype.type_size).copy()
    for start, stop in QUANT_BYTES[qweight.dtype]:
        blocks[:, start:stop] = 0
    offsets = QTensor(qweight.dtype, qweight.shape, blocks.reshape(-1)).dequantize()
    values = qweight.dequantize()
    return np.abs(values.astype(np.float64) - offsets) + np.abs(offsets.astype(np.float64))


def rope_bound(x, cos, sin, interleaved):
    """Each rotated value is a * cos -/+ b * sin of its pair (a, b): a sum of two products,
    gamma(2) (|a| |cos| + |b| |sin|) per evaluation (an FMA only rounds less)."""
    x, c, s = (np.abs(np.asarray(a, np.float64)) for a in (x, cos, sin))
    magnitudes = np.empty_like(x)
    if interleaved:
        first, second = x[..., 0::2], x[..., 1::2]
        magnitudes[..., 0::2] = first * c + second * s
        magnitudes[..., 1::2] = first * s + second * c
    else:
        first, second = np.split(x, 2, axis=-1)
        half = x.shape[-1] // 2
        magnitudes[..., :half] = first * c + second * s
        magnitudes[..., half:] = second * c + first * s
    return sum_bound(magnitudes, 2)


def q5_k_gguf(folder, seed: int = 4):
    """The wide tiny LLaMA with Q5_K v/o/gate/up/down/head/embedding and Q8_0 q/k. The
    project's quantizer does not write Q5_K, so its blocks are random bytes with small f16
    super-block scales (every byte pattern is a valid block). Returns (path, config, prompt,
    the file's weights decoded, in HF layout)."""
    from tests.models import llama_testlib
    from candle_web.quantized import GgmlDType, QTensor

    config = llama_testlib.WIDE_CONFIG
    rng = np.random.default_rng(seed)
    state = llama_testlib.random_state(config, seed=seed)
    q5_k, q8_0 = GgmlDType.Q5_K, GgmlDType.Q8_0
    block_elements, block_bytes = q5_k.block_size, q5_k.type_size
    file_tensors, decoded = {}, dict(state)
    for name, values in state.items():
        if values.ndim != 2:
            continue
        heads = {"q_proj": "num_attention_heads", "k_proj": "num_key_value_heads"}
        head_key = next((key for part, key in heads.items() if part in name), None)
        if head_key is not None:  # Q8_0 (the converter's row order; quantizing commutes)
            q = QTensor.from_float(llama_testlib.permute_rows(values, config[head_key]), q8_0)
            decoded[name] = QTensor.from_float(values, q8_0).dequantize()
        else:
            blocks = rng.integers(0, 256, (values.size // block_elements, block_bytes), np.uint8)
            scales = rng.uniform(1e-4, 3e-4, (blocks.shape[0], 2)).astype(np.float16)
            blocks[:, :4] = scales.view(np.uint8)  # d, dmin
            q = QTensor(q5_k, values.shape, blocks.reshape(-1))
            decoded[name] = q.dequantize()
        file_tensors[llama_testlib.gguf_name(name)] = q
    path = llama_testlib.to_gguf(state, config, folder / "q5_k.gguf", extra_tensors=file_tensors)
    return path, config, [2, 7, 100], decoded
