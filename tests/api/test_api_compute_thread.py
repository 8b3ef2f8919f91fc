"""Where a served text model computes: its scheduler thread builds the decode steps and runs
the warm-up (api/scheduler.py TextScheduler._set_up), so every numba kernel of the model runs on
that one thread. Why it matters: each thread that launches parallel kernels keeps its own
OpenMP team, and with more OpenMP threads than CPUs libgomp stops spinning between parallel
regions, so each of a decode step's ~150 regions paid a thread wake-up (a served SmolLM2
decoded at about half the speed of the same step run alone). No timings here: the test checks
the threads, and that a failing set-up reaches the caller."""

from __future__ import annotations

import threading

import pytest

from tests.api.api_testlib import LLM


def test_warm_up_and_steps_run_on_the_scheduler_thread(monkeypatch):
    from candle_web.api.model_pool import ModelPool

    seen = []
    warm_up = ModelPool._warm_up_text

    def recording(scheduler):
        seen.append(threading.current_thread())
        return warm_up(scheduler)

    monkeypatch.setattr(ModelPool, "_warm_up_text", staticmethod(recording))
    pool = ModelPool(parallel=2, queue_size=2)
    try:
        served = pool.add(LLM)
        scheduler = served.scheduler
        assert seen == [scheduler._thread], "the warm-up ran outside the scheduler thread"
        assert scheduler._thread is not threading.current_thread()
        assert scheduler.steps is not None and scheduler.batched is not None
    finally:
        pool.close()


def test_a_failing_set_up_is_raised_to_the_caller():
    from candle_web.api.fair_lock import FairLock
    from candle_web.api.scheduler import TextScheduler
    from candle_web.pipelines import load_llama

    loaded = load_llama(LLM)

    def broken(scheduler):
        raise RuntimeError("warm-up failed on purpose")

    with pytest.raises(RuntimeError, match="on purpose"):
        TextScheduler("broken", loaded, FairLock(), parallel=1, queue_size=1, warm_up=broken)
