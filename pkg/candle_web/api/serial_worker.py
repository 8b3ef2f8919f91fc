"""One request at a time for a model that has no slots (Whisper, BERT): a thread of its own
running the jobs in order, with at most `queue_size` waiting behind the one running (beyond:
429 with Retry-After).

A job whose client went away is cancelled (`SerialJob.cancel`): one still waiting leaves the
queue at once, dropping its arguments (an upload of up to 25 MiB) and its place; the running
one sees `should_continue()` turn False and stops at its next check (a transcription checks
before each window and after each decoded token). So a client that uploads and hangs up
leaves no work behind, and cancelled jobs never count toward the 429 limit.
"""

from __future__ import annotations

import collections
import concurrent.futures
import threading

from .errors import rate_limited, server_stopping


class SerialJob:
    """`function(should_continue, *args)` on the worker's thread; `future` holds its result."""

    def __init__(self, worker: "SerialWorker", function, args: tuple):
        self._worker, self.function, self.args = worker, function, args
        self.future: concurrent.futures.Future = concurrent.futures.Future()
        self.cancelled = False

    def should_continue(self) -> bool:
        return not self.cancelled

    def cancel(self) -> None:
        """The client went away: drop the job if it waits, stop it at its next check if it
        runs; nothing once it ended."""
        self._worker._cancel(self)


class SerialWorker:
    def __init__(self, name: str, queue_size: int):
        self.name, self.queue_size = name, queue_size
        self._condition = threading.Condition()
        self._waiting: collections.deque = collections.deque()
        self._running = None
        self._stopped = False
        # What tests read: jobs run to their end, jobs cancelled (waiting or running).
        self.finished = self.cancelled = 0
        self._thread = threading.Thread(target=self._serve, name=f"candle-web-{name}",
                                        daemon=True)
        self._thread.start()

    def submit(self, function, *args) -> SerialJob:
        """Queue `function(should_continue, *args)`; 429 when the queue is full, 503 once
        stopped."""
        job = SerialJob(self, function, args)
        with self._condition:
            if self._stopped:
                raise server_stopping(self.name)
            running = self._running is not None and not self._running.cancelled
            if running + len(self._waiting) >= self.queue_size + 1:
                raise rate_limited(self.name)
            self._waiting.append(job)
            self._condition.notify()
        return job

    def load(self) -> dict:
        with self._condition:
            return {"running": self._running is not None, "waiting": len(self._waiting),
                    "finished": self.finished, "cancelled": self.cancelled}

    def stop(self) -> None:
        """Refuse new jobs and fail the waiting ones with 503; the running one ends as it
        would, then the thread exits."""
        with self._condition:
            self._stopped = True
            for job in self._waiting:
                job.args = ()
                job.future.set_exception(server_stopping(self.name))
            self._waiting.clear()
            self._condition.notify()

    def _cancel(self, job: SerialJob) -> None:
        with self._condition:
            if job.cancelled or job.future.done():
                return
            job.cancelled = True
            self.cancelled += 1
            if job in self._waiting:
                self._waiting.remove(job)
                job.args = ()
                job.future.cancel()

    def _serve(self) -> None:
        while True:
            with self._condition:
                while not self._waiting and not self._stopped:
                    self._condition.wait()
                if not self._waiting:
                    return
                job = self._running = self._waiting.popleft()
            try:
                if job.future.set_running_or_notify_cancel():
                    try:
                        result = job.function(job.should_continue, *job.args)
                    except Exception as error:  # noqa: BLE001  (the job's caller gets it)
                        job.future.set_exception(error)
                    else:
                        job.future.set_result(result)
                        self.finished += 1
            finally:
                with self._condition:
                    self._running = None
                    job.args = ()
