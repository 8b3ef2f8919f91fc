"""The compute lock of the API server (api/fair_lock.py) cannot jam: a thread interrupted
while it waits (here a signal handler's exception, as Ctrl-C or a SIGTERM handler raises) gives
up its turn, so the threads after it still get the lock; a thread that does not hold it cannot
release it. Turns go in arrival order, and `yield_turn` lets every waiting thread go first.
Every wait is bounded; nothing measures time."""

from __future__ import annotations

import signal
import sys
import threading

import pytest

from candle_web.api.fair_lock import FairLock, LockMisuse
from tests.api.api_testlib import wait_until

BOUNDED_WAIT_S = 30


class Interrupted(Exception):
    pass


def waiting_in_acquire(thread_id: int, lock) -> bool:
    """Whether that thread is inside `lock.acquire` (whatever the lock does inside)."""
    frame = sys._current_frames().get(thread_id)
    while frame is not None:
        if frame.f_code.co_name == "acquire" and frame.f_locals.get("self") is lock:
            return True
        frame = frame.f_back
    return False


class Holder:
    """A thread holding the lock until `let_go()`."""

    def __init__(self, lock):
        self._release, held = threading.Event(), threading.Event()

        def hold():
            with lock:
                held.set()
                self._release.wait(BOUNDED_WAIT_S)

        self.thread = threading.Thread(target=hold, daemon=True)
        self.thread.start()
        assert held.wait(BOUNDED_WAIT_S)

    def let_go(self) -> None:
        self._release.set()
        self.thread.join(BOUNDED_WAIT_S)


def start_waiter(lock, log: list, name: str) -> threading.Thread:
    """A thread that takes the lock, notes its name, and lets go; returned once it waits."""
    def take():
        with lock:
            log.append(name)

    thread = threading.Thread(target=take, daemon=True)
    thread.start()
    wait_until(BOUNDED_WAIT_S, lambda: waiting_in_acquire(thread.ident, lock),
               f"{name} waiting for the lock")
    return thread


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(),
                    reason="signal handlers run on the main thread")
def test_a_waiter_interrupted_while_waiting_gives_up_its_turn():
    lock = FairLock()
    holder = Holder(lock)
    main = threading.main_thread().ident

    def interrupt_the_main_thread_once_it_waits():
        wait_until(BOUNDED_WAIT_S, lambda: waiting_in_acquire(main, lock),
                   "the main thread waiting for the lock")
        signal.pthread_kill(main, signal.SIGUSR1)

    def on_signal(signum, frame):
        raise Interrupted()

    previous = signal.signal(signal.SIGUSR1, on_signal)
    try:
        interrupter = threading.Thread(target=interrupt_the_main_thread_once_it_waits,
                                       daemon=True)
        interrupter.start()
        with pytest.raises(Interrupted):
            lock.acquire()
        interrupter.join(BOUNDED_WAIT_S)
    finally:
        signal.signal(signal.SIGUSR1, previous)
    log = []
    later = start_waiter(lock, log, "later")
    holder.let_go()
    later.join(BOUNDED_WAIT_S)
    assert log == ["later"], "the thread after the interrupted one never got the lock"
    with lock:  # and the lock is free again
        pass


def test_only_the_holder_releases_the_lock():
    lock = FairLock()
    with pytest.raises(LockMisuse, match="does not hold"):
        lock.release()  # held by nobody
    holder = Holder(lock)
    with pytest.raises(LockMisuse, match="does not hold"):
        lock.release()  # held by the holder, not by this thread
    log = []
    waiter = start_waiter(lock, log, "waiter")
    assert log == [], "a release by another thread let a waiter in beside the holder"
    holder.let_go()
    waiter.join(BOUNDED_WAIT_S)
    assert log == ["waiter"]


def test_the_lock_is_not_reentrant_and_says_so():
    lock = FairLock()
    with lock:
        with pytest.raises(LockMisuse, match="already holds"):
            lock.acquire()
    with lock:  # the refused re-entry left it as it was
        pass


def test_turns_go_in_arrival_order_and_yield_turn_lets_the_waiting_go_first():
    lock = FairLock()
    log = []
    lock.acquire()
    waiters = [start_waiter(lock, log, name) for name in ("first", "second", "third")]
    lock.yield_turn()  # returns once all three have had their turn
    log.append("yielded")
    lock.release()
    for waiter in waiters:
        waiter.join(BOUNDED_WAIT_S)
    assert log == ["first", "second", "third", "yielded"]
