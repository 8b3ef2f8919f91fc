"""Helpers shared by the UI tests of the text views (test_similarity.py, test_generate.py,
test_text2text.py): the native twin subprocess and page helpers."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

NATIVE_SCRIPT = Path(__file__).with_name("native_text_models.py")
NATIVE_TIMEOUT_S = 600


class NativeTextJobs:
    """tests/ui/native_text_models.py on a list of jobs, in a subprocess with the numpy
    backend (or the settings `variables` name, e.g. numba and CANDLE_WEB_COMPUTE_TYPE=int8)
    and one BLAS thread, started at once so it runs while the browser works."""

    def __init__(self, jobs: list[dict], variables: dict | None = None):
        environment = dict(os.environ, CANDLE_WEB_BACKEND="numpy", OPENBLAS_NUM_THREADS="1",
                           OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
        environment.update(variables or {})
        handle, path = tempfile.mkstemp(prefix="candle-web-twin-", suffix=".json")
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            json.dump(jobs, out)
        self.jobs_path = Path(path)
        self.process = subprocess.Popen([sys.executable, str(NATIVE_SCRIPT), path],
                                        env=environment, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, text=True)
        self._result = None

    def result(self) -> dict:
        if self._result is None:
            stdout, stderr = self.process.communicate(timeout=NATIVE_TIMEOUT_S)
            if self.process.returncode != 0:
                raise AssertionError(f"native twin failed ({self.process.returncode}):\n"
                                     f"{stderr[-4000:]}")
            self._result = json.loads(stdout)
        return self._result

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.communicate()
        self.jobs_path.unlink(missing_ok=True)


FIRST_TAB = "#tab-transcribe"


def leave_page_as_found(page):
    """Generator for a module fixture: the shared ready_page goes back to its first tab
    afterwards, since the other modules' tests expect the page as it opens."""
    yield
    if not page.is_closed():
        page.click(FIRST_TAB)


def view_state(page, view: str, expression: str):
    """Evaluate `expression` with `s` bound to window.candleWeb[view]."""
    return page.evaluate(f"() => {{ const s = window.candleWeb.{view}; return {expression}; }}")


def open_view(page, view: str) -> None:
    page.click(f"#tab-{view}")
    page.wait_for_function(f"() => window.candleWeb.{view}.runtimeReady")


def run_and_wait(page, view: str, button: str, timeout_ms: int) -> dict:
    """Click the view's run button and wait for the run to end (result or error); returns
    {result, error, load, events, streamed}."""
    runs_before = view_state(page, view, "s.runs")
    page.click(button)
    page.wait_for_function(
        f"(before) => {{ const s = window.candleWeb.{view};"
        " return !s.busy && (s.runs > before || s.lastError !== null); }",
        arg=runs_before, timeout=timeout_ms)
    return view_state(page, view, "({result: s.lastResult, error: s.lastError, load: s.lastLoad,"
                                  " events: s.events, streamed: s.streamed})")
