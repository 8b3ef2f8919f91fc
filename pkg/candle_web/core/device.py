"""Devices. `Device.cpu()` and `Device.cuda(i)`; each resolves lazily to a kernel backend.

`Device.cpu()` picks its backend once, on first use (numba when available, else numpy;
`CANDLE_WEB_BACKEND` overrides). `Device.cpu(backend="numpy")` pins a backend explicitly: it is
the same device (equal, same hash, tensors mix freely since every CPU backend holds numpy
arrays) but its ops run through the named backend's kernels. Tests use it to run the same op
suite on every backend; `Device.cpu(backend=...)` raises BackendUnavailable at once when the
backend's package is missing.

The backends live in the layer above (backend/), which registers how a device finds them
(`register_backend_lookup`, called when backend/ is imported; the package's face imports it):
the core never imports that layer, so core -> backend -> ... -> core is no circle.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

from .errors import BackendUnavailable, DeviceMismatch


class Device:
    __slots__ = ("kind", "index", "_backend")

    def __init__(self, kind: str, index: int = 0):
        if kind not in ("cpu", "cuda"):
            raise DeviceMismatch(f"unknown device kind {kind!r}; expected 'cpu' or 'cuda'")
        self.kind = kind
        self.index = int(index)
        self._backend = None

    @staticmethod
    def cpu(backend: str | None = None) -> "Device":
        """The CPU; `backend` ('numpy', 'numba'...) pins the kernel backend (see module doc)."""
        if backend is None:
            return CPU
        if backend not in _CPU_BY_BACKEND:
            device = Device("cpu")
            device._backend = _lookup().by_name(backend)
            _CPU_BY_BACKEND[backend] = device
        return _CPU_BY_BACKEND[backend]

    @staticmethod
    def cuda(index: int = 0) -> "Device":
        return Device("cuda", index)

    @staticmethod
    def parse(spec) -> "Device":
        """Accept a Device, None (cpu), 'cpu', 'cuda', 'cuda:1'."""
        if spec is None:
            return CPU
        if isinstance(spec, Device):
            return spec
        if isinstance(spec, str):
            name, _, index = spec.partition(":")
            if name == "cpu":
                return CPU
            return Device(name, int(index or 0))
        raise DeviceMismatch(f"cannot interpret {spec!r} as a device")

    @property
    def backend(self):
        """The kernel backend for this device (resolved once, on first use)."""
        if self._backend is None:
            self._backend = _lookup().for_device(self)
        return self._backend

    def is_cpu(self) -> bool:
        return self.kind == "cpu"

    def is_cuda(self) -> bool:
        return self.kind == "cuda"

    def same_device(self, other: "Device") -> bool:
        return self.kind == other.kind and self.index == other.index

    def __eq__(self, other) -> bool:
        return isinstance(other, Device) and self.same_device(other)

    def __hash__(self) -> int:
        return hash((self.kind, self.index))

    def __repr__(self) -> str:
        return "Cpu" if self.kind == "cpu" else f"Cuda({self.index})"


CPU = Device("cpu")
# Pinned-backend CPU devices, one per backend name, so identity checks stay cheap.
_CPU_BY_BACKEND = {}


class BackendLookup(NamedTuple):
    """How devices find their kernel backends: `by_name(name)` and `for_device(device)`, each
    returning a backend or raising BackendUnavailable (backend/__init__.py's get_backend and
    backend_for)."""

    by_name: Callable[[str], object]
    for_device: Callable[["Device"], object]


_LOOKUP: BackendLookup | None = None


def register_backend_lookup(by_name, for_device) -> None:
    """Called by the backend layer when it is imported (see the module doc)."""
    global _LOOKUP
    _LOOKUP = BackendLookup(by_name, for_device)


def _lookup() -> BackendLookup:
    if _LOOKUP is None:  # only if candle_web.backend failed to import with the package
        raise BackendUnavailable("no kernel backends are registered: candle_web.backend was not "
                                 "imported")
    return _LOOKUP
