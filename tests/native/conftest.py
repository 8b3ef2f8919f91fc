"""Fixtures of the native-twin suite: the numpy reference and the numba / cupy backends.

The numba backend is part of the native install (`candle-web[native]`); when numba is missing
its tests skip with the BackendUnavailable message. The cupy tests skip with "no CUDA device
present" when cupy or a GPU is missing.
"""

from __future__ import annotations

import numpy as np
import pytest

from candle_web.core.errors import BackendUnavailable

NO_CUDA_MESSAGE = "no CUDA device present"


@pytest.fixture(scope="session")
def ref():
    from candle_web.backend import get_backend

    return get_backend("numpy")


@pytest.fixture(scope="session")
def numba_backend():
    from candle_web.backend import get_backend

    try:
        return get_backend("numba")
    except BackendUnavailable as e:
        pytest.skip(f"numba backend unavailable: {e}")


@pytest.fixture(scope="session")
def cupy_backend():
    from candle_web.backend import get_backend

    try:
        return get_backend("cupy")
    except BackendUnavailable as e:
        pytest.skip(f"{NO_CUDA_MESSAGE} ({e})")


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(20240611)
