"""f32/f16 weight matrices quantized to int8 at load, per output row and symmetric: what
CTranslate2's int8 compute type does to Whisper's linear layers, in the layout the int8 products
take (int8_rows.py: levels, per-group scales, no offsets).

Per row i of W [n, k], with amax = max_j |W_ij| (f32):

    scale_i = amax / 127                 (f32 division)
    level_ij = rint(W_ij / scale_i)      (f32 division, round half to even; |level| <= 127)

so |W_ij - scale_i level_ij| <= scale_i / 2 (plus an ulp of the quotient: the division is
rounded before rint). A row of zeros (amax below int8_rows.TINY_AMAX) has scale 0 and levels 0;
a row holding inf or NaN has scale NaN and levels 0, so its products are NaN as on the float
path. The row's scale is repeated for every 32-element group (int8_rows' group of 32): the
products' epilogue takes a scale per group, and one group size for every weight keeps one
compiled kernel.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..core.errors import ShapeError
from .int8_rows import BLOCK, Q_MAX, TINY_AMAX

GROUP = BLOCK  # the scale is stored per 32 elements, all equal within a row


@dataclass(frozen=True)
class Int8Rows:
    """A weight matrix as int8 levels and one f32 scale per row (repeated per group)."""

    levels: np.ndarray  # int8 [n, k]
    scales: np.ndarray  # f32 [n, k / GROUP]: the row's scale in every group

    @property
    def row_scales(self) -> np.ndarray:
        return self.scales[:, 0]

    def dequantize(self) -> np.ndarray:
        return self.levels.astype(np.float32) * np.repeat(self.scales, GROUP, axis=1)


def quantize_weight_rows(weight: np.ndarray) -> Int8Rows:
    """The int8 rows of a weight matrix [n, k] (f32 or f16; k a multiple of 32), by the rule in
    the module doc."""
    weight = np.asarray(weight)
    if weight.ndim != 2 or weight.dtype not in (np.float32, np.float16) or weight.shape[1] % GROUP:
        raise ShapeError(f"quantize_weight_rows: expected an f32 or f16 matrix [rows, k] with k a "
                         f"multiple of {GROUP}, got {weight.dtype} {weight.shape}")
    w = weight.astype(np.float32, copy=False)
    finite = np.isfinite(w).all(axis=1)
    amax = np.where(finite, np.abs(np.where(np.isfinite(w), w, 0)).max(axis=1, initial=0),
                    0).astype(np.float32)
    usable = finite & (amax >= TINY_AMAX)
    scale = np.where(usable, amax / Q_MAX, np.where(finite, 0, np.nan)).astype(np.float32)
    levels = np.zeros(w.shape, np.int8)
    rows = np.flatnonzero(usable)
    for start in range(0, rows.size, 256):  # bounded temporaries on large vocabularies
        chosen = rows[start:start + 256]
        quotient = w[chosen] / scale[chosen, None]
        levels[chosen] = np.clip(np.rint(quotient), -Q_MAX, Q_MAX).astype(np.int8)
    scales = np.repeat(scale[:, None], w.shape[1] // GROUP, axis=1)
    return Int8Rows(levels, np.ascontiguousarray(scales))
