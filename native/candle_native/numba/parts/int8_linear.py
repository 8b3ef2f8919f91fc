"""Linear weights of the fused Whisper parts under the compute type int8 (CANDLE_WEB_COMPUTE_TYPE,
settings().compute_type): each matrix quantized once, when the part is built, per output row
and symmetric (candle_web.quantized.int8_weights, CTranslate2's int8 rule), into the weight
tuple kernels/qint8.py multiplies in integer arithmetic (activations quantized per 32-element
block inside it). Its levels are viewed as uint8: that dtype is what the kernels dispatch on.
"""

from __future__ import annotations

import numpy as np
from candle_web.backend.settings import settings
from candle_web.quantized.int8_weights import GROUP, quantize_weight_rows

NO_OFFSETS = np.zeros((1, 1), np.float32)  # qint8's stand-in where a weight has no offsets


def int8_compute() -> bool:
    """Whether the parts built now quantize their linear weights."""
    return settings().compute_type == "int8"


def int8_weight(matrix: np.ndarray) -> tuple:
    """qint8's weight tuple (levels as uint8, scales [n, k/32], offsets stand-in, no offsets,
    group 32) for an f32 or f16 matrix [n, k]."""
    rows = quantize_weight_rows(matrix)
    return (rows.levels.view(np.uint8), rows.scales, NO_OFFSETS, False, GROUP)
