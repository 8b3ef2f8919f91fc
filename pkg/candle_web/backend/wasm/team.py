"""Hosts of the threads build (`kernels-threads.wasm`, web/kernels/team.h): two threads on one
decode step.

Pyodide's memory cannot be shared, so this module runs on a shared `WebAssembly.Memory` of its
own. The decode parts keep their weights resident there (copied once, when the part is built),
and per step copy in only the activations and copy out the logits and the step's new keys and
values; a helper thread sits in `team_worker` and the caller's `team_run` returns when both
threads are done. Every pointer the module sees is an offset into that shared memory, handed
out by `Arena`.

Both hosts have one interface: `alloc(nbytes)` / `release(offset)` (the arena), `write(offset,
array)`, `read(offset, out)`, `put(array)` (alloc + write), `run(job, args_offset)` (the number
of threads that ran it) and `threads` (2 when the helper is in its loop).

* `PyodideTeamHost(js_module)`, in the page: web/worker/team.js instantiates the module on the
  shared memory, starts the helper worker (web/team_helper.js) and registers `candle_team`:
  {exports, layout: {ctrl, helperScratch, heapStart}, copyIn(srcPointer, dstOffset, n),
  copyOut(srcOffset, dstPointer, n), ensure(end)}; copies go between Pyodide's heap
  (numpy's buffers, by pointer) and the shared memory.
* `WasmtimeTeamHost(path)`, natively (tests, benches; needs `wasmtime`): a wasmtime shared
  memory, one store and instance per thread, the helper on a Python thread (wasmtime's calls
  release the GIL, so the two threads really run together).
"""

from __future__ import annotations

import ctypes
import threading

import numpy as np

from ...core.errors import BackendUnavailable, CandleError
from . import abi
from .hosts import close_at_exit, closed

JS_MODULE_NAME = abi.TEAM_JS_MODULE
ALIGN = 16
PAGE = abi.WASM_PAGE_BYTES
# The fixed places below the arena (abi.py's; the page's worker imports the same numbers from
# the generated web/vendor/abi.js and tells Python them in `layout`).
CTRL_OFFSET = abi.TEAM_CTRL_OFFSET
HELPER_SCRATCH_OFFSET = abi.TEAM_HELPER_SCRATCH_OFFSET
MAX_BYTES = abi.TEAM_MAX_BYTES  # the threads build's declared maximum memory (2 GiB)


class TeamMemoryFull(CandleError):
    """The shared memory cannot grow to what a part needs (its 2 GiB maximum, or the browser
    refused); the part is then built for one thread instead."""


def _align(n: int, align: int = ALIGN) -> int:
    return (n + align - 1) // align * align


class Arena:
    """First-fit allocation of 16-byte-aligned blocks in the shared memory above `start`;
    freed blocks are merged with their free neighbours and reused. `ensure(end)` is the
    host's: it grows the memory to cover `end`."""

    def __init__(self, start: int, ensure):
        self.top = _align(start)
        self._ensure = ensure
        self._free: list[list[int]] = []  # [offset, size], sorted by offset
        self._sizes: dict[int, int] = {}

    def alloc(self, nbytes: int) -> int:
        size = _align(max(int(nbytes), 1))
        for i, (offset, free) in enumerate(self._free):
            if free >= size:
                if free == size:
                    del self._free[i]
                else:
                    self._free[i] = [offset + size, free - size]
                self._sizes[offset] = size
                return offset
        offset = self.top
        self._ensure(offset + size)
        self.top = offset + size
        self._sizes[offset] = size
        return offset

    def release(self, offset: int) -> None:
        size = self._sizes.pop(offset, None)
        if size is None:
            raise CandleError(f"team arena: {offset} is not an allocated block")
        free = self._free
        i = 0
        while i < len(free) and free[i][0] < offset:
            i += 1
        free.insert(i, [offset, size])
        if i + 1 < len(free) and free[i][0] + free[i][1] == free[i + 1][0]:
            free[i][1] += free.pop(i + 1)[1]
        if i > 0 and free[i - 1][0] + free[i - 1][1] == free[i][0]:
            free[i - 1][1] += free.pop(i)[1]
            i -= 1
        if free[i][0] + free[i][1] == self.top:  # the last block: give it back to the top
            self.top = free.pop(i)[0]

    @property
    def allocated_bytes(self) -> int:
        return sum(self._sizes.values())


def _contiguous(array: np.ndarray) -> np.ndarray:
    if not isinstance(array, np.ndarray):
        raise CandleError(f"team host: expected a numpy array, got {type(array).__name__}")
    return array if array.flags.c_contiguous else np.ascontiguousarray(array)


class _TeamHost:
    """What both hosts share: the arena, the argument block, put/run."""

    def _start(self, heap_start: int):
        self.arena = Arena(heap_start, self.ensure)
        self.scratch_bytes = int(self._scratch_bytes())
        self.scratch = self.arena.alloc(self.scratch_bytes)  # the calling thread's
        self._jobs = abi.TEAM_JOBS

    def alloc(self, nbytes: int) -> int:
        return self.arena.alloc(nbytes)

    def release(self, offset: int) -> None:
        self.arena.release(offset)

    def put(self, array: np.ndarray) -> int:
        """A copy of `array` (C order) in the shared memory; its offset."""
        array = _contiguous(array)
        offset = self.arena.alloc(array.nbytes)
        self.write(offset, array)
        return offset

    def run(self, job: str, args: int) -> int:
        """Runs team job `job` on the argument block at `args`; the number of threads that
        ran it (1 when the helper is not there)."""
        return int(self._team_run(self.ctrl, self._jobs[job], args, self.scratch))

    def _ctrl_field(self, name: str) -> int:
        fields = self.read(self.ctrl, np.empty(len(abi.TEAM_CTRL_FIELDS), np.int32))
        return int(fields[abi.TEAM_CTRL_FIELDS.index(name)])

    @property
    def threads(self) -> int:
        """2 while the helper is in its loop, else 1."""
        return 2 if self._ctrl_field("alive") else 1

    @property
    def helper_jobs(self) -> int:
        """Jobs the helper took part in (a step that ran alone does not count)."""
        return self._ctrl_field("jobs_done")


class PyodideTeamHost(_TeamHost):
    """The threads build in the page, on the shared memory web/worker/team.js made."""

    kind = "pyodide"

    def __init__(self, js_module):
        exports = getattr(js_module, "exports", None)
        layout = getattr(js_module, "layout", None)
        if exports is None or layout is None:
            raise BackendUnavailable(f"the JS module {JS_MODULE_NAME!r} lacks `exports` or "
                                     "`layout` (web/worker/team.js registers both)")
        missing = [name for name in abi.TEAM_EXPORT_NAMES if not hasattr(exports, name)]
        if missing:
            raise BackendUnavailable(f"the threads kernels lack exports {missing}: rebuild them "
                                     "(scripts/build_kernels.py)")
        if int(exports.abi_version()) != abi.ABI_VERSION:
            raise BackendUnavailable("the threads kernels implement another ABI version: "
                                     "rebuild them (scripts/build_kernels.py)")
        self._js = js_module
        self._team_run = exports.team_run
        self._scratch_bytes = exports.scratch_bytes
        self._copy_in = js_module.copyIn
        self._copy_out = js_module.copyOut
        self.ctrl = int(layout.ctrl)
        self._start(int(layout.heapStart))

    def ensure(self, end: int) -> None:
        if end > MAX_BYTES:
            raise TeamMemoryFull(f"{end} bytes exceed the shared memory's {MAX_BYTES}")
        try:
            self._js.ensure(end)
        except Exception as error:  # a JS RangeError: the browser would not grow it
            raise TeamMemoryFull(f"the browser did not grow the shared memory to {end} bytes: "
                                 f"{error}") from None

    def write(self, offset: int, array: np.ndarray) -> None:
        array = _contiguous(array)
        self._copy_in(array.__array_interface__["data"][0], offset, array.nbytes)

    def read(self, offset: int, out: np.ndarray) -> np.ndarray:
        if not out.flags.c_contiguous:
            raise CandleError("team host: read needs a C-contiguous output array")
        self._copy_out(offset, out.__array_interface__["data"][0], out.nbytes)
        return out


class WasmtimeTeamHost(_TeamHost):
    """The threads build under wasmtime: a shared memory, the helper on a Python thread."""

    kind = "wasmtime"
    MAX_PAGES = MAX_BYTES // PAGE

    def __init__(self, path, helper: bool = True):
        import wasmtime  # the dev extra; imported only here

        config = wasmtime.Config()
        config.wasm_simd = True
        config.wasm_relaxed_simd = True
        config.wasm_threads = True
        config.shared_memory = True
        self._engine = engine = wasmtime.Engine(config)
        try:
            self._module = module = wasmtime.Module.from_file(engine, str(path))
        except FileNotFoundError:
            raise BackendUnavailable(f"no threads kernels at {path}: build them with "
                                     "scripts/build_kernels.py") from None
        minimum = (HELPER_SCRATCH_OFFSET + 8 * (1 << 20)) // PAGE
        self._memory = _shared_memory_class(wasmtime)(engine, wasmtime.MemoryType(
            wasmtime.Limits(minimum, self.MAX_PAGES), shared=True))
        self._store = wasmtime.Store(engine)
        exports = wasmtime.Instance(self._store, module, [self._memory]).exports(self._store)
        store = self._store
        run, size = exports["team_run"], exports["scratch_bytes"]
        self._team_run = lambda *args: run(store, *args)
        self._scratch_bytes = lambda: size(store)
        self._lock = threading.Lock()
        self.ctrl = CTRL_OFFSET
        scratch_bytes = int(self._scratch_bytes())
        self._start(HELPER_SCRATCH_OFFSET + scratch_bytes)
        self.helper_scratch = HELPER_SCRATCH_OFFSET
        self._bytes()[self.ctrl:self.ctrl + abi.TEAM_CTRL_BYTES] = 0
        self._helper = None
        if helper:
            self.start_helper()
        close_at_exit(self)

    def start_helper(self) -> None:
        """The helper thread, in team_worker until close(); waits (up to 10 s) until it is in."""
        import wasmtime

        def loop():
            store = wasmtime.Store(self._engine)
            instance = wasmtime.Instance(store, self._module, [self._memory])
            instance.exports(store)["team_worker"](store, self.ctrl, self.helper_scratch)

        self._helper = threading.Thread(target=loop, name="candle-team-helper", daemon=True)
        self._helper.start()
        for _ in range(10000):
            if self.threads == 2:
                return
            threading.Event().wait(0.001)
        raise BackendUnavailable("the team's helper thread did not enter team_worker in 10 s")

    def close(self) -> None:
        if self._helper is not None and self._helper.is_alive():
            self.run("stop", 0)
            self._helper.join(timeout=10)
        self._helper = None
        closed(self)

    def _bytes(self) -> np.ndarray:
        length = self._memory.data_len()
        address = ctypes.cast(self._memory.data_ptr(), ctypes.c_void_p).value
        return np.frombuffer((ctypes.c_ubyte * length).from_address(address), np.uint8)

    def ensure(self, end: int) -> None:
        if end > MAX_BYTES:
            raise TeamMemoryFull(f"{end} bytes exceed the shared memory's {MAX_BYTES}")
        length = self._memory.data_len()
        if end > length:
            self._memory.grow(-(-(end - length) // PAGE))

    def write(self, offset: int, array: np.ndarray) -> None:
        array = _contiguous(array)
        self._bytes()[offset:offset + array.nbytes] = array.reshape(-1).view(np.uint8)

    def read(self, offset: int, out: np.ndarray) -> np.ndarray:
        if not out.flags.c_contiguous:
            raise CandleError("team host: read needs a C-contiguous output array")
        out.reshape(-1).view(np.uint8)[...] = self._bytes()[offset:offset + out.nbytes]
        return out


def _shared_memory_class(wasmtime):
    """wasmtime.SharedMemory, as an import that links: wasmtime-py 50.0.1 (pinned) passes a
    pointer to its pointer when it hands a shared memory to an instance (a TypeError from
    ctypes); this subclass passes the pointer itself, as wasmtime's C API expects."""
    from wasmtime import _ffi as ffi

    class SharedMemory(wasmtime.SharedMemory):
        def _as_extern(self):
            union = ffi.wasmtime_extern_union(sharedmemory=self.ptr())
            return ffi.wasmtime_extern_t(ffi.WASMTIME_EXTERN_SHAREDMEMORY, union)

    return SharedMemory


def pyodide_team_module():
    """The `candle_team` JS module the worker registered (?threads=2), or None."""
    import sys

    if sys.platform != "emscripten":
        return None
    try:
        import candle_team  # registered by web/worker/team.js through pyodide.registerJsModule
    except ImportError:
        return None
    return candle_team
