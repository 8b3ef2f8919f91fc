"""The lock all model computation in the API server takes (`ModelPool.compute`).

The numba kernels and BLAS's thread count are process-wide, so two models never compute at
once; the lock is fair (handed over in arrival order) so that a thread which releases and
re-acquires in a loop -- a text model's scheduler between rounds, a transcription between
windows -- cannot starve the others. `threading.Lock` makes no such promise.

It cannot jam: each waiter waits on a lock of its own, queued in arrival order, and a waiter
that is interrupted (KeyboardInterrupt, a signal handler's exception, a SIGTERM drain) takes
itself out of the queue, or passes the lock on if it had just been handed over; releasing a
lock the calling thread does not hold raises instead of letting two threads in.
"""

from __future__ import annotations

import collections
import threading


class LockMisuse(RuntimeError):
    """Acquiring the lock a thread already holds, or releasing one it does not (as
    `threading.RLock` raises RuntimeError)."""


class FairLock:
    """A mutex handed over in arrival order; not re-entrant. `yield_turn()` lets every thread
    already waiting go first."""

    def __init__(self):
        self._mutex = threading.Lock()  # guards _owner and _waiters; held only briefly
        self._owner = None  # the holding thread's ident
        self._waiters: collections.deque = collections.deque()  # (ident, turn), oldest first

    def acquire(self) -> None:
        me = threading.get_ident()
        # This thread's turn, should it have to wait: a lock taken now, released by the thread
        # that hands over. Everything from queueing on sits in the try, so that an interrupt
        # arriving at any point leaves no turn behind that nobody would take.
        turn = threading.Lock()
        turn.acquire()
        try:
            with self._mutex:
                if self._owner == me:
                    raise LockMisuse("FairLock.acquire: this thread already holds the lock "
                                     "(it is not re-entrant)")
                if self._owner is None and not self._waiters:
                    self._owner = me
                    return
                self._waiters.append((me, turn))
            turn.acquire()
        except LockMisuse:
            raise
        except BaseException:
            self._abandon(me, turn)
            raise

    def release(self) -> None:
        with self._mutex:
            if self._owner != threading.get_ident():
                holder = "no thread" if self._owner is None else f"thread {self._owner}"
                raise LockMisuse(f"FairLock.release: the calling thread does not hold the lock "
                                 f"({holder} does)")
            self._hand_over()

    def yield_turn(self) -> None:
        self.release()
        self.acquire()

    def __enter__(self):
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def _hand_over(self) -> None:
        """To the oldest waiter, else free (with _mutex held)."""
        if self._waiters:
            self._owner, turn = self._waiters.popleft()
            turn.release()
        else:
            self._owner = None

    def _abandon(self, me: int, turn) -> None:
        """A thread interrupted in `acquire`: out of the queue, or, when the lock had just
        become its own (handed over, or free), on to the next waiter."""
        with self._mutex:
            if self._owner == me:
                self._hand_over()
            elif (me, turn) in self._waiters:
                self._waiters.remove((me, turn))
