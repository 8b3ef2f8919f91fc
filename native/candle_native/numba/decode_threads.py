"""Whether the fused decode steps (LLaMA, Whisper) split their work over numba's threads."""

from __future__ import annotations

from candle_web.backend.settings import settings


def decode_in_parallel() -> bool:
    """CANDLE_WEB_DECODE_THREADS=1 forces one thread (better on an oversubscribed machine, where
    every join of a parallel region can wait a time slice for a descheduled worker); otherwise
    parallel whenever numba has more than one thread."""
    import numba

    requested = settings().decode_threads
    if requested is not None:
        return requested > 1 and numba.get_num_threads() > 1
    return numba.get_num_threads() > 1
