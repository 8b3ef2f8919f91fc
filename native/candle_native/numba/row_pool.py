"""Work items over a small pool of Python threads, each calling single-threaded BLAS.

Why not OpenBLAS's own threads: every BLAS call splits its product over the cores and waits for
all of them at its end. On this 2-core machine, shared with other jobs, a call then waits
whenever either core is taken: a 256x1500x64 product took 24 ms with two OpenBLAS threads
against 0.8 ms with one (load average 3.5). Here each thread takes the next item (a block of rows)
from a queue and runs it start to finish with one-threaded BLAS and GIL-free numba kernels, so a
busy core only means the other thread takes more items, and a block's intermediates stay in its
core's L2 cache.

BLAS's thread count is process-wide state, changed through threadpoolctl (a pure-Python
package). Without it `available()` is False and callers keep their unpooled path.
"""

from __future__ import annotations

import contextlib
import threading
from concurrent.futures import ThreadPoolExecutor

_LOCK = threading.Lock()
_POOLS: dict = {}
_CONTROLLER = []


def available() -> bool:
    """True when BLAS's thread count can be set (threadpoolctl is importable)."""
    return _controller() is not None


def _controller():
    with _LOCK:
        if not _CONTROLLER:
            try:
                from threadpoolctl import ThreadpoolController
            except ImportError:
                _CONTROLLER.append(None)
            else:
                _CONTROLLER.append(ThreadpoolController())
        return _CONTROLLER[0]


def worker_count() -> int:
    """As many threads as numba may use (NUMBA_NUM_THREADS, the bench's --threads)."""
    import numba

    return max(1, numba.get_num_threads())


@contextlib.contextmanager
def single_threaded_blas():
    """BLAS runs one thread per call inside this block (restored at its end)."""
    controller = _controller()
    if controller is None:
        yield
        return
    with controller.limit(limits=1, user_api="blas"):
        yield


def run_items(work, items) -> None:
    """work(item) for every item, spread over the pool's threads; the first exception raised
    by any item is re-raised here. Call inside `single_threaded_blas()`."""
    workers = worker_count()
    if workers == 1 or len(items) == 1:
        for item in items:
            work(item)
        return
    with _LOCK:
        pool = _POOLS.get(workers)
        if pool is None:
            pool = _POOLS[workers] = ThreadPoolExecutor(workers, thread_name_prefix="candle-rows")
    for _ in pool.map(work, items):
        pass


def row_blocks(n_rows: int, block: int):
    """(start, stop) pairs covering range(n_rows) in blocks of `block` rows."""
    return [(start, min(n_rows, start + block)) for start in range(0, n_rows, block)]
