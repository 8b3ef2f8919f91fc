"""Kernel backends: one interface (`base.Backend`), the numpy reference, and a registry.

`Device.cpu()` uses the numba backend when the native twin (found through the
`candle_web.backends` entry points) and numba import, else numpy;
`CANDLE_WEB_BACKEND=numpy|numba|wasm` overrides. "wasm" (the wasm/ package) runs the WebAssembly
kernels of web/kernels: in the page on the module the worker registered, natively under
wasmtime. `Device.cuda(i)` uses the cupy backend. Backends load lazily, on the first op of a
device, and fail with a message naming the missing package.
"""

from __future__ import annotations

from ..core.device import register_backend_lookup
from ..core.errors import BackendUnavailable
from .base import Backend
from .settings import settings

# name -> zero-argument factory returning a Backend (or raising BackendUnavailable)
_FACTORIES = {}
_INSTANCES = {}  # name -> the backend built (or set): the one cache of backend instances


def register_backend(name: str, factory) -> None:
    """Make a backend available by name (the native twin registers 'numba' and
    'cupy' when its entry point is loaded)."""
    _FACTORIES[name] = factory
    _INSTANCES.pop(name, None)


def get_backend(name: str) -> Backend:
    if name not in _INSTANCES:
        if name not in _FACTORIES and name in _EXTRA_FOR:
            _register_optional_backend(name)
        if name not in _FACTORIES:
            raise BackendUnavailable(f"unknown backend {name!r}; known: {sorted(_FACTORIES)}")
        try:
            _INSTANCES[name] = _FACTORIES[name]()
        except ImportError as e:  # a package the backend needs is missing or broken
            raise BackendUnavailable(f"the {name} backend cannot load: {e}") from None
    return _INSTANCES[name]


def set_backend(name: str, backend: Backend) -> None:
    """Make `backend` what `get_backend(name)` returns from now on (the page's worker hands
    over the wasm backend built on the kernels it instantiated: wasm.install)."""
    if name not in _FACTORIES:
        raise BackendUnavailable(f"unknown backend {name!r}; known: {sorted(_FACTORIES)}")
    _INSTANCES[name] = backend


# Packages that provide more backends declare an entry point in this group (candle-web's own
# native twin does, in pyproject.toml); loading one imports it, and it registers its backends.
# The registry never names them, so the pure package works where none is installed (Pyodide).
ENTRY_POINT_GROUP = "candle_web.backends"
# Where each known optional backend comes from, for the message when it is missing.
_EXTRA_FOR = {"numba": ("native", "numba"), "cupy": ("gpu", "cupy")}
_discovery_problems: list[str] | None = None  # None until the entry points were loaded


def _discover_backends() -> list[str]:
    """Load every entry point of ENTRY_POINT_GROUP (once); what failed to import, if anything."""
    global _discovery_problems
    if _discovery_problems is None:
        from importlib.metadata import entry_points

        _discovery_problems = []
        for entry in entry_points(group=ENTRY_POINT_GROUP):
            try:
                entry.load()
            except ImportError as e:
                _discovery_problems.append(f"{entry.value}: {e}")
    return _discovery_problems


def _register_optional_backend(name: str) -> None:
    problems = _discover_backends()
    if name in _FACTORIES:
        return
    extra, package = _EXTRA_FOR[name]
    detail = f" ({'; '.join(problems)})" if problems else ""
    raise BackendUnavailable(
        f"the {name} backend needs candle-web's native twin and {package}: "
        f"pip install 'candle-web[{extra}]'{detail}")


def _default_cpu_backend_name() -> str:
    choice = settings().cpu_backend
    if choice is not None:
        return choice
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


def _wasm_factory():
    # Raises BackendUnavailable naming what is missing (the registered JS module in the page;
    # natively the kernels.wasm file or wasmtime).
    from .wasm.backend import create_backend

    return create_backend()


register_backend("numpy", _numpy_factory)
register_backend("wasm", _wasm_factory)
# Devices find their backends through this registry (core/device.py), which never imports it.
register_backend_lookup(get_backend, backend_for)
