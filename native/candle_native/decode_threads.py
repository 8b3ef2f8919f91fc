"""Whether the fused decode steps (LLaMA, Whisper) split their work over numba's threads."""

from __future__ import annotations

import os

DECODE_THREADS_VARIABLE = "CANDLE_WEB_DECODE_THREADS"


def decode_in_parallel() -> bool:
    """CANDLE_WEB_DECODE_THREADS=1 forces one thread (better on an oversubscribed machine, where
    every join of a parallel region can wait a time slice for a descheduled worker); otherwise
    parallel whenever numba has more than one thread."""
    import numba

    requested = os.environ.get(DECODE_THREADS_VARIABLE, "").strip()
    if requested:
        return int(requested) > 1 and numba.get_num_threads() > 1
    return numba.get_num_threads() > 1
