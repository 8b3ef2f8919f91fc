"""Kernel backends: one interface (`base.Backend`), the numpy reference, and a registry.

`Device.cpu()` uses the numba backend when `candle_native` and numba import, else numpy;
`CANDLE_WEB_BACKEND=numpy|numba` overrides. `Device.cuda(i)` uses the cupy backend. Backends
load lazily, on the first op of a device, and fail with a message naming the missing package.
"""

from __future__ import annotations

import os

from ..errors import BackendUnavailable, CandleError
from .base import Backend

# name -> zero-argument factory returning a Backend (or raising BackendUnavailable)
_FACTORIES = {}
_INSTANCES = {}


def register_backend(name: str, factory) -> None:
    """Make a backend available by name (`candle_native` registers 'numba' and 'cupy')."""
    _FACTORIES[name] = factory
    _INSTANCES.pop(name, None)


def get_backend(name: str) -> Backend:
    if name not in _INSTANCES:
        if name not in _FACTORIES and name in ("numba", "cupy"):
            _import_native(name)
        if name not in _FACTORIES:
            raise BackendUnavailable(f"unknown backend {name!r}; known: {sorted(_FACTORIES)}")
        try:
            _INSTANCES[name] = _FACTORIES[name]()
        except ImportError as e:  # a package the backend needs is missing or broken
            raise BackendUnavailable(f"the {name} backend cannot load: {e}") from None
    return _INSTANCES[name]


def _import_native(name: str) -> None:
    extra = "native" if name == "numba" else "gpu"
    package = "numba" if name == "numba" else "cupy"
    try:
        import candle_native  # noqa: F401  (registers its backends on import)
    except ImportError as e:
        raise BackendUnavailable(
            f"the {name} backend needs the candle_native package and {package}: "
            f"pip install 'candle-web[{extra}]' ({e})") from None


def _default_cpu_backend_name() -> str:
    choice = os.environ.get("CANDLE_WEB_BACKEND", "").strip().lower()
    if choice in ("numpy", "numba"):
        return choice
    if choice:
        raise CandleError(f"CANDLE_WEB_BACKEND={choice!r}: expected 'numpy' or 'numba'")
    try:
        get_backend("numba")
        return "numba"
    except BackendUnavailable:
        return "numpy"


def backend_for(device) -> Backend:
    if device.kind == "cuda":
        return get_backend("cupy").for_device(device.index)
    return get_backend(_default_cpu_backend_name())


def _numpy_factory():
    from .numpy_backend import NumpyBackend

    return NumpyBackend()


register_backend("numpy", _numpy_factory)
