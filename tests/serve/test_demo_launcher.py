"""scripts/demo.py (`make demo`): the page's URL comes first, the first-run work after it.

Run as `make demo` runs it, as a subprocess, over an empty model cache (the tests' own folder)
so that the demo T5 is missing: with a training run far too long to finish, the URL line must
arrive and the page answer while the trainer is still at work, its progress served to the
page; SIGTERM must then end the launcher cleanly, with the trainer's whole process group gone.
A step that fails must be reported without taking the server down."""
from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
LAUNCHER = REPO_ROOT / "scripts" / "demo.py"
URL_LINE = re.compile(r"^candle-web: serving .* at (http://127\.0\.0\.1:\d+/)$")
STARTED_LINE = re.compile(r"^\[demo t5\] started \(pid (\d+)\)")
PROGRESS_URL = "models/local/t5-spell-numbers.progress.json"
LONG_TRAINING_STEPS = 100_000  # hours: it must still be running when the test stops it
URL_TIMEOUT_S = 20  # imports only: the server starts before any first-run work
TRAINING_TIMEOUT_S = 60  # the trainer's imports, numba kernels from the cache, first steps
STOP_TIMEOUT_S = 20  # STOP_GRACE_S in scripts/demo.py is 5 s
HTTP_TIMEOUT_S = 5


class Launcher:
    """scripts/demo.py in a subprocess, its output lines collected by a thread."""

    def __init__(self, cache: Path, *args: str):
        environment = dict(os.environ, CANDLE_WEB_CACHE=str(cache), OPENBLAS_NUM_THREADS="1",
                           PYTHONUNBUFFERED="1")
        self.process = subprocess.Popen(
            [sys.executable, str(LAUNCHER), "--port", "0", "--quiet", *args],
            cwd=REPO_ROOT, env=environment, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        self._new = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self._new.put(line.rstrip("\n"))
        self._new.put(None)

    def wait_for(self, pattern: re.Pattern, timeout_s: float) -> re.Match:
        """The first output line from now on that matches, or a failure showing the output."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                line = self._new.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                line = None
            if line is None:
                pytest.fail(f"no line matching {pattern.pattern!r} within {timeout_s} s; "
                            "output:\n" + "\n".join(self.lines), pytrace=False)
            self.lines.append(line)
            match = pattern.search(line)
            if match:
                return match

    def stop(self) -> int:
        """SIGTERM, then the exit status (with all output read)."""
        self.process.send_signal(signal.SIGTERM)
        returncode = self.process.wait(STOP_TIMEOUT_S)
        while (line := self._new.get(timeout=STOP_TIMEOUT_S)) is not None:
            self.lines.append(line)
        return returncode

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


@pytest.fixture
def launch(tmp_path):
    started = []

    def start(*args: str) -> Launcher:
        started.append(Launcher(tmp_path / "cache", *args))
        return started[-1]

    yield start
    for launcher in started:  # a failed test must not leave a launcher running
        launcher.kill()


def get(url: str):
    try:
        with urllib.request.urlopen(url, timeout=HTTP_TIMEOUT_S) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, b""


def group_members(group: int) -> list[int]:
    """Ids of the live processes whose process group is `group` (from /proc)."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # exited while we looked
        if int(fields[2]) == group and fields[0] != "Z":
            members.append(int(stat.parent.name))
    return members


def test_url_first_then_training_in_the_background_and_a_clean_stop(launch, tmp_path):
    started = time.monotonic()
    launcher = launch("--first-run", "t5", "--t5-steps", str(LONG_TRAINING_STEPS))
    url = launcher.wait_for(URL_LINE, URL_TIMEOUT_S).group(1)
    url_after_s = time.monotonic() - started
    status, body = get(url)
    assert status == 200 and b"<html" in body.lower()

    trainer = int(launcher.wait_for(STARTED_LINE, URL_TIMEOUT_S).group(1))
    deadline = time.monotonic() + TRAINING_TIMEOUT_S
    progress = None
    while time.monotonic() < deadline:
        status, body = get(url + PROGRESS_URL)
        progress = json.loads(body) if status == 200 else None
        if progress and progress["phase"] == "training" and progress["step"] >= 1:
            break
        time.sleep(0.5)
    else:
        pytest.fail(f"no training progress served; last {progress}; output:\n"
                    + "\n".join(launcher.lines), pytrace=False)
    assert progress["steps"] == LONG_TRAINING_STEPS
    assert trainer in group_members(trainer)  # still at work, in its own process group
    demo_root = tmp_path / "cache" / "demo"
    assert not (demo_root / "t5-spell-numbers").exists()

    assert launcher.stop() == 0
    assert launcher.lines[-1] == "candle-web: stopped", launcher.lines[-5:]
    assert not any("first-run work finished" in line for line in launcher.lines)
    assert group_members(trainer) == []  # the trainer and anything it started are gone
    assert sorted(p.name for p in demo_root.iterdir()) == []  # no progress, no staging
    print(f"URL after {url_after_s:.1f} s; training at step {progress['step']} when stopped")


def test_a_failing_step_is_reported_and_the_page_keeps_being_served(launch):
    # The empty cache has no LibriVox clip (skipped), and 0 steps is refused (exit 2).
    launcher = launch("--first-run", "transcribe,t5", "--t5-steps", "0")
    url = launcher.wait_for(URL_LINE, URL_TIMEOUT_S).group(1)
    launcher.wait_for(re.compile(r"^\[demo transcribe\] skipped: .* is missing"), URL_TIMEOUT_S)
    launcher.wait_for(re.compile(r"^\[demo t5\] failed \(exit 2\)"), TRAINING_TIMEOUT_S)
    launcher.wait_for(re.compile(r"^\[demo\] first-run work finished"), URL_TIMEOUT_S)
    assert get(url)[0] == 200
    assert launcher.stop() == 0
