"""Fixtures of the wasm kernel tests: one instance of each build, shared by the session."""

from __future__ import annotations

import numpy as np
import pytest

from tests.kernels.wasm_harness_testlib import BUILDS, KernelModule, KernelsUnavailable

_instances: dict[str, object] = {}


def _instance(name: str):
    if name not in _instances:
        try:
            _instances[name] = KernelModule.load(name)
        except KernelsUnavailable as exc:
            _instances[name] = exc
    found = _instances[name]
    if isinstance(found, KernelsUnavailable):
        pytest.skip(f"wasm kernels unavailable: {found}")
    return found


@pytest.fixture(params=BUILDS, ids=["relaxed", "simd128"])
def km(request):
    """The kernel module (each build in turn), its allocator reset."""
    module = _instance(request.param)
    module.reset()
    return module


@pytest.fixture
def rng():
    return np.random.default_rng(20260601)
