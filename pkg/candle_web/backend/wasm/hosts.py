"""Hosts of the wasm kernel module: how Python reaches `kernels.wasm`'s exports.

Both hosts have one interface, `host.call(name, *args)` (and `host.kernel(name)`, the same as
a function to keep), taking the arguments of the export `name` in `abi.EXPORTS` order
WITHOUT the `scratch` argument (the host inserts its own buffer): numpy arrays (or None where
the ABI allows an absent pointer) for array arguments, Python ints for i32 arguments and Python
floats for f32 ones. Strides are the caller's business:
the backend passes them explicitly (in elements), and an array argument stands for the address
of its first element. The same backend code therefore runs on either host.

* `PyodideHost(js_module)`, in the browser: the module is instantiated on Pyodide's own
  `WebAssembly.Memory`, so arrays are passed in place as their data pointers. A Python -> JS ->
  wasm call costs ~3 us and a pointer lookup 4-7 us (DESIGN.md section 10): export functions are
  looked up once, and the pointers of large arrays (weights, KV caches) are remembered per array
  object, also through transposed views of them.
* `WasmtimeHost(path)`, natively (tests, benches; needs `wasmtime`, the dev extra): the module
  gets a memory of its own; each call copies its input arrays in and its output arrays out (the
  ABI kinds say which way) in per-call regions, so results are the module's own numbers.

Entry points for the page's worker (web/worker/kernels.js, candle_web.worker.boot):

1. Instantiate the chosen build (relaxed SIMD or plain SIMD) on Pyodide's memory, importing it
   as `env.memory`, and register the instance:
   `pyodide.registerJsModule("candle_kernels", {exports: instance.exports})` (the name is
   abi.KERNELS_JS_MODULE, which the worker imports from the generated web/vendor/abi.js).
   (Pyodide 0.27.7 does not expose its Memory: wrap `WebAssembly.instantiate` before
   `loadPyodide` and keep `imports.env.memory`; `memory.buffer === pyodide._module.HEAPU8.buffer`
   confirms it. Checked under Node 20 with Pyodide 0.27.7 and the real kernels.)
2. Before the first tensor op, in Python:
   `from candle_web.backend.wasm import install; install()`.
   `install()` builds a `PyodideHost` on `candle_kernels`, makes it the "wasm" backend the
   registry hands out and (unless `make_default=False`) overrides the settings' cpu_backend
   with "wasm" (`settings.override_settings`), so `Device.cpu()` uses it.
   It returns the backend; it raises `BackendUnavailable` naming what is missing (no registered
   module, an export absent, a different ABI version). Setting `CANDLE_WEB_BACKEND=wasm` alone
   also works: the backend's factory finds `candle_kernels` by itself inside Pyodide.
   `Device.cpu()` picks its backend on its first use, so `install()` must come before any op.
"""

from __future__ import annotations

import atexit
import ctypes
import threading
import weakref

import numpy as np

from ...core.errors import BackendUnavailable, CandleError
from . import abi

JS_MODULE_NAME = abi.KERNELS_JS_MODULE

# PyodideHost remembers the pointers of arrays at least this large: those are weights and KV
# caches that come back call after call; a small activation is looked up afresh (remembering it
# would cost more than the lookup).
POINTER_CACHE_MIN_BYTES = 1 << 16

SCRATCH_ALIGN = 16


class _CallSpec:
    """An export's layout as seen by callers (the ABI arguments minus scratch)."""

    __slots__ = ("name", "n_args", "arrays", "optional", "scratch_at", "kinds")

    def __init__(self, export: abi.Export):
        self.name = export.name
        user = [a for a in export.args if a.kind != abi.SCRATCH]
        self.n_args = len(user)
        self.arrays = tuple(i for i, a in enumerate(user) if a.kind in abi.ARRAY_KINDS)
        self.optional = frozenset(i for i, a in enumerate(user) if a.optional)
        self.kinds = tuple(a.kind for a in user)
        positions = [i for i, a in enumerate(export.args) if a.kind == abi.SCRATCH]
        self.scratch_at = positions[0] if positions else None

    def check(self, args) -> None:
        if len(args) != self.n_args:
            raise CandleError(f"wasm kernel {self.name}: expected {self.n_args} arguments "
                              f"(the ABI's, without scratch), got {len(args)}")


_SPECS = {e.name: _CallSpec(e) for e in abi.EXPORTS}


def _spec(name):
    try:
        return _SPECS[name]
    except KeyError:
        raise CandleError(f"wasm kernel {name!r} is not in the ABI; exports: "
                          f"{list(abi.EXPORT_NAMES)}") from None


def _aligned_bytes(n: int, align: int = SCRATCH_ALIGN):
    """(owner, view): a uint8 numpy view of n bytes whose address is a multiple of `align`."""
    owner = np.empty(n + align, dtype=np.uint8)
    address = owner.__array_interface__["data"][0]
    start = (-address) % align
    return owner, owner[start:start + n]


def _check_version(version: int, where: str) -> None:
    if version != abi.ABI_VERSION:
        raise BackendUnavailable(f"the wasm kernels at {where} implement ABI version {version}, "
                                 f"this candle-web expects {abi.ABI_VERSION}: rebuild them "
                                 "(scripts/build_kernels.py)")


def _same_start(view: np.ndarray, base: np.ndarray) -> bool:
    """Whether `view` starts at `base`'s first byte, known without asking for its pointer: it
    is a permutation of base's axes (transpose, swapaxes), which covers all of base, and both
    have non-negative strides, so both start at their lowest address."""
    if view.size != base.size or view.ndim != base.ndim or view.dtype != base.dtype:
        return False
    if min(view.strides, default=0) < 0 or min(base.strides, default=0) < 0:
        return False
    return sorted(zip(view.shape, view.strides)) == sorted(zip(base.shape, base.strides))


class PyodideHost:
    """The kernels instantiated on Pyodide's memory; arrays are passed in place."""

    kind = "pyodide"

    def __init__(self, js_module):
        exports = getattr(js_module, "exports", None)
        if exports is None:
            raise BackendUnavailable(f"the JS module {JS_MODULE_NAME!r} has no `exports` "
                                     "attribute (register {exports: instance.exports})")
        fns = {}
        missing = []
        for export in abi.EXPORTS:
            try:
                fns[export.name] = getattr(exports, export.name)
            except AttributeError:
                missing.append(export.name)
        if missing:
            raise BackendUnavailable(f"the wasm kernels lack exports {missing}: rebuild them "
                                     "(scripts/build_kernels.py)")
        self._fns = fns
        _check_version(int(fns["abi_version"]()), f"JS module {JS_MODULE_NAME!r}")
        self.scratch_bytes = int(fns["scratch_bytes"]())
        self._scratch_owner, self._scratch = _aligned_bytes(max(self.scratch_bytes, 1))
        self._scratch_ptr = self._scratch.__array_interface__["data"][0]
        self._pointers = {}  # id(array) -> (weakref to it, data pointer)
        self._kernels = {name: self._build(spec, fns[name]) for name, spec in _SPECS.items()}

    def kernel(self, name):
        """The export `name` as a Python function of the ABI's arguments minus scratch (what
        `call(name, ...)` runs): cache it and call it directly where every microsecond counts."""
        _spec(name)
        return self._kernels[name]

    def call(self, name, *args):
        kernel = self._kernels.get(name)
        if kernel is None:
            _spec(name)  # raises, naming the ABI's exports
        spec = _SPECS[name]
        if len(args) != spec.n_args:
            spec.check(args)
        return kernel(*args)

    def _build(self, spec, fn):
        """A function passing its arguments straight to the JS export, arrays as pointers
        (small ones looked up inline, large ones through the remembered pointers) and the
        scratch buffer inserted: generated per export, so a call does no loops or list work."""
        params = [f"a{i}" for i in range(spec.n_args)]
        values = []
        for i, p in enumerate(params):
            if i in spec.arrays:
                lookup = (f"({p}.__array_interface__['data'][0] if {p}.nbytes < small "
                          f"else remembered({p}))")
                values.append(f"(0 if {p} is None else {lookup})" if i in spec.optional
                              else lookup)
            else:
                values.append(p)
        if spec.scratch_at is not None:
            values.insert(spec.scratch_at, "scratch")
        source = (f"def {spec.name}({', '.join(params)}):\n"
                  f"    return fn({', '.join(values)})\n")
        namespace = {"fn": fn, "small": POINTER_CACHE_MIN_BYTES, "remembered": self._pointer,
                     "scratch": self._scratch_ptr}
        exec(source, namespace)  # noqa: S102  (source built above from the ABI table only)
        return namespace[spec.name]

    def _pointer(self, a: np.ndarray) -> int:
        if a.nbytes < POINTER_CACHE_MIN_BYTES:
            return a.__array_interface__["data"][0]
        key = id(a)
        hit = self._pointers.get(key)
        if hit is not None and hit[0]() is a:
            return hit[1]
        base = a.base
        if isinstance(base, np.ndarray) and _same_start(a, base):
            pointer = self._pointer(base)
        else:
            pointer = a.__array_interface__["data"][0]
        pointers = self._pointers

        def forget(ref, key=key):
            if pointers.get(key, (None,))[0] is ref:
                del pointers[key]

        pointers[key] = (weakref.ref(a, forget), pointer)
        return pointer


class WasmtimeHost:
    """The kernels under wasmtime with a memory of their own; arrays are copied in and out."""

    kind = "wasmtime"
    # Below this address nothing is placed: 0 is the null pointer, and wasm-ld puts its (unused)
    # stack there.
    RESERVED_BYTES = 1 << 16
    PAGE = 1 << 16

    def __init__(self, path):
        import wasmtime  # the dev extra; imported only here

        self._wasmtime = wasmtime
        self.path = str(path)
        config = wasmtime.Config()
        config.wasm_simd = True
        config.wasm_relaxed_simd = True
        engine = wasmtime.Engine(config)
        try:
            module = wasmtime.Module.from_file(engine, self.path)
        except FileNotFoundError:
            raise BackendUnavailable(f"no wasm kernels at {self.path}: build them with "
                                     "scripts/build_kernels.py (make kernels)") from None
        imports = [(i.module, i.name) for i in module.imports]
        if imports != [("env", "memory")]:
            raise BackendUnavailable(f"the wasm kernels at {self.path} import {imports}; the ABI "
                                     "allows only env.memory")
        self._store = wasmtime.Store(engine)
        memory_type = module.imports[0].type
        minimum = max(memory_type.limits.min, 16 * (1 << 20) // self.PAGE)
        self._memory = wasmtime.Memory(self._store, wasmtime.MemoryType(
            wasmtime.Limits(minimum, memory_type.limits.max)))
        instance = wasmtime.Instance(self._store, module, [self._memory])
        exports = instance.exports(self._store)
        missing = [e.name for e in abi.EXPORTS if e.name not in exports]
        if missing:
            raise BackendUnavailable(f"the wasm kernels at {self.path} lack exports {missing}: "
                                     "rebuild them (scripts/build_kernels.py)")
        self._fns = {e.name: exports[e.name] for e in abi.EXPORTS}
        self._view = None
        _check_version(self._fns["abi_version"](self._store), self.path)
        self.scratch_bytes = int(self._fns["scratch_bytes"](self._store))
        self._scratch_ptr = self.RESERVED_BYTES
        self._heap_start = _align(self._scratch_ptr + self.scratch_bytes, SCRATCH_ALIGN)
        self._ensure(self._heap_start)
        # Scratch starts as garbage: a kernel must not rely on what it holds.
        self._bytes()[self._scratch_ptr:self._heap_start] = 0xFF
        self._engine = engine
        self._module = module
        self._lock = threading.Lock()
        close_at_exit(self)

    def close(self) -> None:
        """Free the wasmtime objects (done for every open host at exit, while wasmtime's own
        module globals still exist: freeing them later prints errors)."""
        self._view = None
        for name in ("_store", "_module", "_engine"):
            obj = getattr(self, name, None)
            if obj is not None:
                obj.close()
        closed(self)

    # -- memory ---------------------------------------------------------------------------
    def _bytes(self) -> np.ndarray:
        length = self._memory.data_len(self._store)
        if self._view is None or self._view.size != length:
            pointer = self._memory.data_ptr(self._store)
            address = ctypes.cast(pointer, ctypes.c_void_p).value
            buffer = (ctypes.c_ubyte * length).from_address(address)
            self._view = np.frombuffer(buffer, dtype=np.uint8)
        return self._view

    def _ensure(self, end: int) -> None:
        length = self._memory.data_len(self._store)
        if end > length:
            pages = -(-(end - length) // self.PAGE)
            if end > (1 << 31):
                raise CandleError(f"wasm kernels under wasmtime: a call needs {end} bytes of "
                                  "memory, more than the 2 GiB this host maps")
            self._memory.grow(self._store, pages)
            self._view = None

    def read(self, address: int, n: int) -> bytes:
        """Raw bytes of the module's memory (for tests of the host itself)."""
        return bytes(self._bytes()[address:address + n])

    # -- calls ----------------------------------------------------------------------------
    def kernel(self, name):
        """The export `name` as a function of the ABI's arguments minus scratch."""
        _spec(name)
        return lambda *args: self.call(name, *args)

    def call(self, name, *args):
        with self._lock:  # the per-call regions are shared
            return self._call(name, args)

    def _call(self, name, args):
        spec = _spec(name)
        spec.check(args)
        values = list(args)
        regions = self._place(spec, args)
        for i, kind in enumerate(spec.kinds):
            if kind == abi.INT:
                values[i] = _i32(args[i], name, i)
            elif kind == abi.FLOAT:
                values[i] = float(args[i])
            elif args[i] is None:
                if i not in spec.optional:
                    raise CandleError(f"wasm kernel {name}: argument {i} "
                                      f"({_arg_name(name, i)}) may not be absent")
                values[i] = 0
            else:
                values[i] = _i32(regions[i][0], name, i)
        if spec.scratch_at is not None:
            values.insert(spec.scratch_at, self._scratch_ptr)
        result = self._fns[name](self._store, *values)
        for i in spec.arrays:
            if args[i] is not None and spec.kinds[i] != abi.IN:
                args[i][...] = regions[i][1]
        return result

    def _place(self, spec, args) -> dict:
        """Give each array argument a place in the module's memory, copying inputs in.
        Arguments whose host memory overlaps (Y = X) share one region, so aliasing behaves as
        in place. Returns index -> (wasm address of the first element, view there)."""
        spans = []
        for i in spec.arrays:
            a = args[i]
            if a is None:
                continue
            if not isinstance(a, np.ndarray):
                raise CandleError(f"wasm kernel {spec.name}: argument {i} "
                                  f"({_arg_name(spec.name, i)}) must be a numpy array, got "
                                  f"{type(a).__name__}")
            lo, hi = _extent(a)
            start = a.__array_interface__["data"][0]
            spans.append((start + lo, start + hi, i, start))
        spans.sort()
        groups = []  # [lo, hi, members]
        for lo, hi, i, start in spans:
            if groups and lo < groups[-1][1]:
                groups[-1][1] = max(groups[-1][1], hi)
                groups[-1][2].append((i, start))
            else:
                groups.append([lo, hi, [(i, start)]])
        cursor = self._heap_start
        placed = []
        for lo, hi, members in groups:
            # Keep the host address's offset within 16 bytes, so alignment is as in the page.
            base = _align(cursor, SCRATCH_ALIGN) + lo % SCRATCH_ALIGN
            placed.append((base, lo, hi, members))
            cursor = base + (hi - lo)
        self._ensure(cursor)
        memory = self._bytes()
        regions = {}
        for base, lo, hi, members in placed:
            region = memory[base:base + (hi - lo)]
            region[...] = 0xFF  # gaps and outputs start as NaN: a kernel that skips one shows
            for i, start in members:
                a = args[i]
                offset = start - lo
                view = np.ndarray(a.shape, a.dtype, buffer=region, offset=offset,
                                  strides=a.strides)
                regions[i] = (base + offset, view)
            for i, _ in members:
                if spec.kinds[i] != abi.OUT:
                    regions[i][1][...] = args[i]
        return regions


_OPEN_HOSTS = weakref.WeakSet()


def close_at_exit(host) -> None:
    """Have `host.close()` run at exit, while wasmtime's own module globals still exist (a
    wasmtime object freed later prints errors); `closed(host)` takes it off that list."""
    _OPEN_HOSTS.add(host)


def closed(host) -> None:
    _OPEN_HOSTS.discard(host)


@atexit.register
def _close_open_hosts():
    for host in list(_OPEN_HOSTS):
        host.close()


def _extent(a: np.ndarray):
    """(lo, hi): the byte range of a's elements relative to its first element."""
    lo = hi = 0
    for n, s in zip(a.shape, a.strides):
        if n == 0:
            return 0, 0
        if s < 0:
            lo += s * (n - 1)
        else:
            hi += s * (n - 1)
    return lo, hi + a.itemsize


def _align(n: int, align: int) -> int:
    return (n + align - 1) // align * align


def _arg_name(name: str, index: int) -> str:
    user = [a for a in abi.EXPORTS_BY_NAME[name].args if a.kind != abi.SCRATCH]
    return user[index].name


def _i32(value, name, index) -> int:
    v = int(value)
    if not -(1 << 31) <= v < (1 << 32):
        raise CandleError(f"wasm kernel {name}: argument {index} ({_arg_name(name, index)}) = "
                          f"{v} does not fit in i32")
    return v - (1 << 32) if v >= (1 << 31) else v


def pyodide_js_module():
    """The `candle_kernels` JS module the worker registered, or None outside Pyodide / when it
    was not registered."""
    import sys

    if sys.platform != "emscripten":
        return None
    try:
        import candle_kernels  # web/worker/kernels.js registers it (registerJsModule)
    except ImportError:
        return None
    return candle_kernels

