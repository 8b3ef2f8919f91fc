"""Fixtures shared by every test area."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
# Run from a checkout without installing: the package sources come first.
for source_folder in ("native", "pkg"):
    if str(REPO_ROOT / source_folder) not in sys.path:
        sys.path.insert(0, str(REPO_ROOT / source_folder))

FETCH_HINT = "run `make test` (or python models/fetch.py --default)"


@pytest.fixture(scope="session")
def model_file():
    """model_file(model_name, filename) -> Path of a verified file from the model cache.

    Never downloads (cache only): a missing file fails the test with the command to run."""
    # Imported here, not at the top, so that a broken package fails only the tests using it.
    from candle_web import hub
    from candle_web.core.errors import CandleError

    found: dict[tuple[str, str], Path] = {}

    def get(model_name: str, filename: str) -> Path:
        key = (model_name, filename)
        if key in found:
            return found[key]
        try:
            found[key] = hub.fetch(model_name, filename, cache_only=True)
            return found[key]
        except CandleError as exc:
            problem = str(exc)
        # Failing outside the except block keeps the report to the one useful message.
        pytest.fail(f"model file {model_name}/{filename} is not in the cache "
                    f"{hub.cache_dir()}: {FETCH_HINT}\n({problem})", pytrace=False)

    return get


@pytest.fixture(scope="module")
def numba_device():
    """A CPU device on the numba backend; the test skips, saying why, where numba is missing."""
    from candle_web import Device
    from candle_web.core.errors import BackendUnavailable
    from candle_web.backend import get_backend

    try:
        get_backend("numba")
    except BackendUnavailable as e:
        pytest.skip(f"numba backend unavailable: {e}")
    return Device.cpu(backend="numba")


@pytest.fixture(autouse=True)
def _kernel_settings_follow_the_environment():
    """The kernel switches (candle_web.backend.settings) are read once per process; a test
    that changes one reloads them, and after every test (monkeypatch restored first, as this
    fixture is set up before it) they are read again, so no change leaks into the next test."""
    yield
    from candle_web.backend.settings import reload_settings

    reload_settings()
