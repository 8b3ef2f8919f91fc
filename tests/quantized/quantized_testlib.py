"""Helpers shared by the quantized tests: random but valid GGML blocks."""

from __future__ import annotations

import numpy as np

from candle_web.quantized import GgmlDType

# Byte offsets of the f16 scale fields in each block type (ggml-common.h). Random bytes there
# would often be inf/NaN; the tests overwrite them with finite f16 values so that bit-exact
# comparisons are meaningful.
F16_FIELDS = {
    GgmlDType.Q4_0: (0,),
    GgmlDType.Q4_1: (0, 2),
    GgmlDType.Q5_0: (0,),
    GgmlDType.Q5_1: (0, 2),
    GgmlDType.Q8_0: (0,),
    GgmlDType.Q8_1: (0, 2),
    GgmlDType.Q2_K: (80, 82),
    GgmlDType.Q3_K: (108,),
    GgmlDType.Q4_K: (0, 2),
    GgmlDType.Q5_K: (0, 2),
    GgmlDType.Q6_K: (208,),
}
F32_FIELDS = {GgmlDType.Q8_K: (0,)}


def random_blocks(dtype: GgmlDType, n_blocks: int, rng: np.random.Generator) -> np.ndarray:
    """(n_blocks, type_size) uint8: random quants and packed scales, finite random scales."""
    blocks = rng.integers(0, 256, size=(n_blocks, dtype.type_size), dtype=np.uint8)
    for start in F16_FIELDS.get(dtype, ()):
        scales = (rng.standard_normal(n_blocks) * 0.05).astype("<f2")
        blocks[:, start:start + 2] = scales.view(np.uint8).reshape(n_blocks, 2)
    for start in F32_FIELDS.get(dtype, ()):
        scales = (rng.standard_normal(n_blocks) * 0.01).astype("<f4")
        blocks[:, start:start + 4] = scales.view(np.uint8).reshape(n_blocks, 4)
    return blocks
