"""Run web/vendor/kernels*.wasm natively under wasmtime, the way the browser runs it: the module
imports a memory we create, and the kernels read and write arrays in place in that memory.

    km = KernelModule.load("kernels.wasm")
    a = km.put(np_array)                 # copy in, get a Region (offset, shape, dtype)
    c = km.empty((m, n), np.float32)     # uninitialised (filled with a NaN pattern) output
    km.call("gemm_f32", ..., a, ..., c, ..., km.scratch)
    result = c.get()                     # a numpy copy

Regions are bump-allocated (64-byte aligned) from 1 MiB up, so offset 0 stays "absent" and
nothing sits where wasm-ld's __stack_pointer would point; `km.reset()` frees them all.
Not a test module: the tests in this folder use it (and bench/wasm_kernels.py).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[2]
VENDOR = REPO_ROOT / "web" / "vendor"
BUILDS = ("kernels.wasm", "kernels-simd128.wasm")
PAGE = 65536
HEAP_START = 1 << 20
MEMORY_BYTES = 768 << 20  # the largest test (vocabulary GEMV, f32 + f16 copies) fits
ALIGN = 64
# Fill for outputs before a call: a NaN pattern numpy never produces, so a kernel that leaves
# an element unwritten fails the comparison.
POISON = np.uint32(0x7FA5A5A5)


class KernelsUnavailable(RuntimeError):
    """wasmtime is missing or the module has not been built."""


@dataclass
class Region:
    module: "KernelModule"
    offset: int
    shape: tuple
    dtype: np.dtype

    def view(self) -> np.ndarray:
        count = int(np.prod(self.shape)) if self.shape else 1
        nbytes = count * self.dtype.itemsize
        raw = self.module.memory_view()[self.offset:self.offset + nbytes]
        return raw.view(self.dtype).reshape(self.shape)

    def get(self) -> np.ndarray:
        return self.view().copy()

    def __index__(self) -> int:  # pass a Region where the ABI wants a pointer
        return self.offset

    def at(self, element: int) -> int:
        """Byte offset of element `element` (flat index) of this region."""
        return self.offset + element * self.dtype.itemsize


class KernelModule:
    def __init__(self, path: Path, relaxed: bool):
        try:
            import wasmtime
        except ImportError as exc:
            raise KernelsUnavailable("wasmtime is not installed (pip install -e '.[dev]')") from exc
        if not path.exists():
            raise KernelsUnavailable(f"{path} is not built (run: python scripts/build_kernels.py)")
        config = wasmtime.Config()
        config.wasm_simd = True
        config.wasm_relaxed_simd = True
        config.cranelift_opt_level = "speed"
        self.engine = wasmtime.Engine(config)
        self.store = wasmtime.Store(self.engine)
        self.path = path
        self.relaxed = relaxed
        module = wasmtime.Module.from_file(self.engine, str(path))
        limits = wasmtime.Limits(MEMORY_BYTES // PAGE, None)
        self.memory = wasmtime.Memory(self.store, wasmtime.MemoryType(limits))
        linker = wasmtime.Linker(self.engine)
        linker.define(self.store, "env", "memory", self.memory)
        instance = linker.instantiate(self.store, module)
        exports = instance.exports(self.store)
        self.functions = {name: exports[name] for name in _export_names(module)}
        self._view = None
        self.top = HEAP_START
        self.scratch = self.alloc(self.call("scratch_bytes"), np.uint8, (self.call("scratch_bytes"),))
        self.base = self.top

    @classmethod
    def load(cls, name: str) -> "KernelModule":
        return cls(VENDOR / name, relaxed=name == "kernels.wasm")

    # -- memory --------------------------------------------------------------------------
    def memory_view(self) -> np.ndarray:
        if self._view is None:
            size = self.memory.data_len(self.store)
            ptr = ctypes.cast(self.memory.data_ptr(self.store), ctypes.POINTER(ctypes.c_uint8))
            self._view = np.ctypeslib.as_array(ptr, shape=(size,))
        return self._view

    def reset(self) -> None:
        self.top = self.base

    def alloc(self, nbytes: int, dtype, shape) -> Region:
        offset = -(-self.top // ALIGN) * ALIGN
        if offset + nbytes > MEMORY_BYTES:
            raise MemoryError(f"kernel test memory exhausted ({offset + nbytes} bytes)")
        self.top = offset + nbytes
        return Region(self, offset, tuple(shape), np.dtype(dtype))

    def put(self, array) -> Region:
        array = np.ascontiguousarray(array)
        region = self.alloc(array.nbytes, array.dtype, array.shape)
        region.view()[...] = array
        return region

    def empty(self, shape, dtype=np.float32) -> Region:
        dtype = np.dtype(dtype)
        region = self.alloc(int(np.prod(shape)) * dtype.itemsize, dtype, shape)
        raw = self.memory_view()[region.offset:region.offset + int(np.prod(shape)) * dtype.itemsize]
        raw[: raw.size // 4 * 4].view(np.uint32)[:] = POISON
        return region

    # -- calls ---------------------------------------------------------------------------
    def call(self, name: str, *args):
        converted = [int(a) if isinstance(a, (Region, np.integer)) else a for a in args]
        converted = [float(a) if isinstance(a, np.floating) else a for a in converted]
        return self.functions[name](self.store, *converted)


def _export_names(module) -> list[str]:
    return [e.name for e in module.exports]
