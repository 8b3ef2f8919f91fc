"""candle_web.worker.boot, the worker's Python entry point at start-up (web/worker/boot.js calls
it), run natively: the backend it selects is the one Device.cpu() then uses, a page backend it
does not know is refused by name, wasm without the page's registered kernels is refused naming
the missing module (the worker then falls back to numpy and says why), and the versions are the
interpreter's own."""
from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from candle_web import Device
from candle_web.backend import backend_for
from candle_web.backend.settings import reload_settings, settings
from candle_web.core.errors import BackendUnavailable, UnsupportedError
from candle_web.worker import boot


@pytest.fixture(autouse=True)
def settings_restored():
    """select_backend overrides the process's settings: each test starts and ends clean."""
    reload_settings()
    yield
    reload_settings()


def test_numpy_is_selected_and_used():
    assert boot.select_backend("numpy") == "numpy"
    assert settings().cpu_backend == "numpy"
    assert backend_for(Device.cpu()).name == "numpy"


def test_an_unknown_page_backend_is_refused_by_name():
    with pytest.raises(UnsupportedError, match="'numba' is not a page backend"):
        boot.select_backend("numba")


def test_wasm_without_the_pages_kernels_names_the_missing_module():
    with pytest.raises(BackendUnavailable, match="candle_kernels"):
        boot.select_backend("wasm")
    assert settings().cpu_backend != "wasm"  # nothing half-selected


def test_versions_are_this_interpreters():
    versions = json.loads(boot.versions_json())
    assert versions["python"] == sys.version.split()[0]
    assert versions["numpy"] == np.__version__
    import candle_web

    assert versions["candle_web"] == candle_web.__version__


def test_the_pages_compute_type_is_selected_and_checked():
    """?compute=int8 / float32 (web/worker/boot.js passes it on): the settings' compute type,
    which the wasm parts and qmatmul read; anything else is refused naming ?compute."""
    assert boot.select_compute_type("int8") == "int8"
    assert settings().compute_type == "int8"
    assert boot.select_compute_type("float32") == "float32"
    with pytest.raises(UnsupportedError, match=r"\?compute='int4'"):
        boot.select_compute_type("int4")
    assert settings().compute_type == "float32"
