"""Run a hostile input's reproducer in a child process with a memory cap (issue 28).

The child imports what the snippet needs first (that is "the interpreter"), then caps its
address space at what it uses so far plus `headroom` (RLIMIT_AS: an allocation beyond it fails
with MemoryError instead of swapping the machine) and runs the snippet. The result says how the
snippet ended (ok / the exception's type and message), how long it took, the peak of what it
allocated (tracemalloc, numpy included) and how much its resident memory grew. The parent kills a child that runs past `hang_seconds`: a hang guard, not
a timing threshold (the figures are measured and reported, not asserted).

Linux only (RLIMIT_AS, /proc); the tests that use it skip elsewhere.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
HEADROOM_BYTES = 200 << 20  # the bound: 200 MB over the interpreter
HANG_SECONDS = 60.0

CHILD = r'''
import json, resource, sys, time, tracemalloc, traceback
sys.path[:0] = [{pkg!r}, {tests!r}]
{setup}

def _address_space():
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[0]) * resource.getpagesize()

_cap = _address_space() + {headroom}
resource.setrlimit(resource.RLIMIT_AS, (_cap, _cap))
_rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
tracemalloc.start()  # numpy reports its buffers to tracemalloc too
_started = time.perf_counter()
_result = {{"outcome": "ok", "type": None, "message": None, "value": None}}
try:
{body}
except MemoryError as _error:
    _result = {{"outcome": "memory", "type": "MemoryError", "message": str(_error)}}
except BaseException as _error:
    _result = {{"outcome": "raised", "type": type(_error).__name__, "message": str(_error),
               "candle_error": _error.__class__.__module__.startswith("candle_web"),
               "traceback": traceback.format_exc()[-2000:]}}
_result["seconds"] = time.perf_counter() - _started
_result["traced_peak_bytes"] = tracemalloc.get_traced_memory()[1]
tracemalloc.stop()
_result["rss_growth_bytes"] = max(
    0, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - _rss_before)
print("\n@@RESULT@@" + json.dumps(_result, default=repr))
'''


def run_bounded(body: str, setup: str = "", headroom: int = HEADROOM_BYTES,
                hang_seconds: float = HANG_SECONDS) -> dict:
    """Run `body` (statements; may set `_result["value"]`) after `setup` (imports, inputs)."""
    if not sys.platform.startswith("linux"):
        import pytest

        pytest.skip("the memory cap needs Linux (RLIMIT_AS, /proc)")
    script = CHILD.format(pkg=str(REPO_ROOT / "pkg"), tests=str(REPO_ROOT),
                          setup=textwrap.dedent(setup), headroom=headroom,
                          body=textwrap.indent(textwrap.dedent(body), "    "))
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", CANDLE_WEB_OFFLINE="1")
    with tempfile.NamedTemporaryFile("w", suffix=".py", encoding="utf-8",
                                     errors="surrogatepass") as handle:
        handle.write(script)  # a file, not -c: inputs may be larger than an argument may be
        handle.flush()
        done = subprocess.run([sys.executable, handle.name], capture_output=True, text=True,
                              timeout=hang_seconds, env=env)
    marker = done.stdout.rfind("@@RESULT@@")
    if marker < 0:
        raise AssertionError(f"the child died (status {done.returncode}):\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout[marker + len("@@RESULT@@"):])
    print(f"bounded run: {result['outcome']} {result.get('type')} in {result['seconds']:.3f} s "
          f"(under tracemalloc), peak {result['traced_peak_bytes'] / 1e6:.1f} MB allocated, "
          f"resident memory +{result['rss_growth_bytes'] / 1e6:.1f} MB")
    return result


def assert_typed_error(result: dict, *fragments: str) -> str:
    """The snippet raised a candle_web error (not MemoryError, not an untyped one) whose
    message holds every fragment."""
    assert result["outcome"] == "raised" and result.get("candle_error"), result
    for fragment in fragments:
        assert fragment in result["message"], (fragment, result["message"])
    return result["message"]
