"""Repeat penalty (Keskar et al. 2019, CTRL), as Candle's `apply_repeat_penalty` and
transformers' `RepetitionPenaltyLogitsProcessor` apply it.

Every distinct token of the context window has its logit made less likely: divided by the
penalty when positive, multiplied when negative (so the penalty always pushes it down).
The window is the last `last_n` tokens of prompt + generated text (Candle's
--repeat-last-n, default 64).
"""

from __future__ import annotations

import numpy as np

from ..core.errors import CandleError

DEFAULT_REPEAT_LAST_N = 64


def apply_repeat_penalty(logits, penalty: float, context) -> np.ndarray:
    """A penalised float32 copy of `logits` [vocab]; tokens outside the vocabulary are ignored."""
    if not penalty > 0:
        raise CandleError(f"repeat penalty must be > 0, got {penalty}")
    out = np.array(logits, dtype=np.float32, copy=True)
    if penalty == 1.0 or len(context) == 0:
        return out
    ids = np.unique(np.asarray(context, dtype=np.int64))
    ids = ids[(ids >= 0) & (ids < out.shape[-1])]
    seen = out[..., ids]
    out[..., ids] = np.where(seen < 0, seen * np.float32(penalty), seen / np.float32(penalty))
    return out


def penalty_window(tokens, last_n: int = DEFAULT_REPEAT_LAST_N):
    """The last `last_n` tokens; last_n <= 0 gives an empty window (no penalty)."""
    if last_n <= 0:
        return tokens[:0]
    return tokens[-last_n:]
