"""The one-at-a-time worker of Whisper and BERT (api/serial_worker.py) on plain functions: a job
whose client went away while it waited leaves the queue at once (never runs, holds no place
toward the 429 limit, keeps no reference to its upload); the running one is told to stop
through `should_continue`. Every wait is bounded."""

from __future__ import annotations

import threading
import weakref

import pytest

from candle_web.api.errors import ApiError
from candle_web.api.serial_worker import SerialWorker
from tests.api.api_testlib import wait_until

BOUNDED_WAIT_S = 30


class Upload:
    """An upload's bytes, in an object a weak reference can follow (bytes cannot be)."""

    def __init__(self, data: bytes):
        self.data = data


def blocking_job(started: threading.Event, release: threading.Event):
    def job(should_continue):
        started.set()
        assert release.wait(BOUNDED_WAIT_S)
        return "ran to its end" if should_continue() else "stopped"
    return job


@pytest.fixture
def worker():
    worker = SerialWorker("test", queue_size=1)
    yield worker
    worker.stop()


def test_a_cancelled_waiting_job_leaves_the_queue_and_its_place(worker):
    started, release = threading.Event(), threading.Event()
    running = worker.submit(blocking_job(started, release))
    assert started.wait(BOUNDED_WAIT_S)
    ran = []
    upload = Upload(b"\0" * 1024)
    gone = worker.submit(lambda should_continue, upload: ran.append(len(upload.data)), upload)
    with pytest.raises(ApiError) as refused:  # one running, one waiting: the queue is full
        worker.submit(lambda should_continue: None)
    assert refused.value.status == 429
    upload_ref = weakref.ref(upload)
    del upload
    gone.cancel()  # its client went away while it waited
    assert upload_ref() is None, "the cancelled job still holds its upload"
    after = worker.submit(lambda should_continue: "next")  # its place is free
    release.set()
    assert running.future.result(BOUNDED_WAIT_S) == "ran to its end"
    assert after.future.result(BOUNDED_WAIT_S) == "next"
    assert gone.future.cancelled() and ran == []
    assert worker.load() == {"running": False, "waiting": 0, "finished": 2, "cancelled": 1}


def test_a_cancelled_running_job_is_told_to_stop(worker):
    started, release = threading.Event(), threading.Event()
    job = worker.submit(blocking_job(started, release))
    assert started.wait(BOUNDED_WAIT_S)
    job.cancel()
    release.set()
    assert job.future.result(BOUNDED_WAIT_S) == "stopped"
    wait_until(BOUNDED_WAIT_S, lambda: not worker.load()["running"], "the job to end")
    assert worker.load()["cancelled"] == 1


def test_a_failing_job_fails_its_caller_only(worker):
    def broken(should_continue):
        raise MemoryError("out of memory on purpose")

    with pytest.raises(MemoryError, match="on purpose"):
        worker.submit(broken).future.result(BOUNDED_WAIT_S)
    assert worker.submit(lambda should_continue: "still serving").future.result(
        BOUNDED_WAIT_S) == "still serving"


def test_waiting_jobs_get_503_when_the_worker_stops():
    worker = SerialWorker("test", queue_size=2)
    started, release = threading.Event(), threading.Event()
    running = worker.submit(blocking_job(started, release))
    assert started.wait(BOUNDED_WAIT_S)
    waiting = worker.submit(lambda should_continue: "never")
    worker.stop()
    with pytest.raises(ApiError) as stopped:
        waiting.future.result(BOUNDED_WAIT_S)
    assert stopped.value.status == 503
    with pytest.raises(ApiError):
        worker.submit(lambda should_continue: None)
    release.set()
    assert running.future.result(BOUNDED_WAIT_S) == "ran to its end"
