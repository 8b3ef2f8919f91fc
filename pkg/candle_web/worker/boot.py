"""The Python half of the browser worker's start (web/worker/boot.js): the one entry point the
worker calls while it starts, in this order:

  after_snapshot()       only when Python was restored from the vendored memory snapshot
  select_backend(name)   "wasm" (on the kernels the worker registered as `candle_kernels`) or
                         "numpy" (with scipy's BLAS); returns the backend Device.cpu() then uses
  select_compute_type(name)  the page's ?compute=: "float32" (the default) or "int8"
  attach_team()          only with two threads: the wasm parts run on the registered
                         `candle_team` from then on
  versions_json()        the versions the ready answer reports

Imports are inside the functions: this module is imported before the backend is chosen, and
the `js` module and the registered kernel modules exist only in the page.
"""
from __future__ import annotations

import json
import sys


def after_snapshot() -> None:
    """Renew the state every interpreter restored from one snapshot would share: the `random`
    module's seed (from this browser's randomness: os.urandom is crypto.getRandomValues),
    tempfile's name sequence, and the runtime sys._emscripten_info names (this browser, not
    the Node that made the snapshot)."""
    import random
    import tempfile

    import js  # Pyodide's handle on the worker's JS globals

    random.seed()
    tempfile._name_sequence = None
    info = sys._emscripten_info
    sys._emscripten_info = type(info)((info.emscripten_version, js.navigator.userAgent,
                                       info.pthreads, info.shared_memory))


def select_backend(name: str) -> str:
    """Make `name` ("wasm" or "numpy") the backend of Device.cpu() (a settings override); the
    backend it then uses (so a choice that did not take is seen by the worker). For wasm,
    install() builds the backend on the registered kernels and raises naming what fails."""
    from candle_web import Device
    from candle_web.backend import backend_for
    from candle_web.backend.settings import override_settings
    from candle_web.core.errors import UnsupportedError

    if name == "wasm":
        from candle_web.backend.wasm import install

        install()
    elif name == "numpy":
        try:
            import scipy.linalg.blas  # noqa: F401  the numpy backend's matmul uses its sgemm
        except ImportError:
            pass  # natively without scipy: numpy's own matmul
        override_settings(cpu_backend="numpy")
    else:
        raise UnsupportedError(f"select_backend: {name!r} is not a page backend (wasm, numpy)")
    return backend_for(Device.cpu()).name


def select_compute_type(name: str) -> str:
    """The page's ?compute= as the compute type (settings().compute_type: "int8" multiplies
    the wasm backend's GGML weights in int8 arithmetic, "float32" widens them); returns the
    one in force."""
    from candle_web.backend.settings import check_compute_type, override_settings

    check_compute_type(name, "?compute")
    return override_settings(compute_type=name).compute_type


def attach_team() -> None:
    """The wasm backend's parts run on the team the worker registered as `candle_team`."""
    from candle_web.backend.wasm import install
    from candle_web.backend.wasm.team import PyodideTeamHost, pyodide_team_module

    install().attach_team(PyodideTeamHost(pyodide_team_module()))


def versions_json() -> str:
    """{python, numpy, scipy (None when not loaded), candle_web} as JSON."""
    import numpy

    import candle_web

    scipy = sys.modules.get("scipy")
    return json.dumps({"python": sys.version.split()[0], "numpy": numpy.__version__,
                       "scipy": scipy.__version__ if scipy is not None else None,
                       "candle_web": getattr(candle_web, "__version__", "unknown")})
