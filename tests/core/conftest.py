"""Fixtures of the tensor-core suite (tests/core).

Every op test takes `device`: a CPU device pinned to one kernel backend through
`Device.cpu(backend=name)`, so the same suite runs on each backend. Add a backend by adding its
name to BACKEND_NAMES; one that is not installed is skipped, not failed.
"""
from __future__ import annotations

import numpy as np
import pytest

from candle_web import BackendUnavailable, Device

# The numpy reference, the native CPU twin and the browser's wasm kernels (natively under
# wasmtime: skipped without it or without web/vendor/kernels.wasm); the CuPy backend has its
# own primitive-by-primitive suite against numpy in tests/native (a GPU device is not a
# `Device.cpu`).
BACKEND_NAMES = ["numpy", "numba", "wasm"]


@pytest.fixture(params=BACKEND_NAMES)
def backend_name(request) -> str:
    return request.param


@pytest.fixture
def device(backend_name) -> Device:
    try:
        return Device.cpu(backend=backend_name)
    except BackendUnavailable as e:
        pytest.skip(f"backend {backend_name} unavailable: {e}")


@pytest.fixture
def rng() -> np.random.Generator:
    # Fixed seed: a failure reproduces exactly.
    return np.random.default_rng(1234)


@pytest.fixture(scope="session")
def torch():
    return pytest.importorskip("torch")
