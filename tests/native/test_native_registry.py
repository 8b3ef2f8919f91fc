"""Backend choice, error messages and the numba cache folder, each checked in a fresh process
(the choice is made once per process, and numba reads its cache setting at import)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


def run_python(code: str, **env_overrides) -> str:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT / "pkg"), str(REPO_ROOT / "native")])
    for key, value in env_overrides.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


PRINT_CPU_BACKEND = "from candle_web import Device; print(Device.cpu().backend.name)"


def test_cpu_uses_numba_when_importable():
    pytest.importorskip("numba")
    assert run_python(PRINT_CPU_BACKEND, CANDLE_WEB_BACKEND=None) == "numba"


def test_environment_forces_the_numpy_reference():
    assert run_python(PRINT_CPU_BACKEND, CANDLE_WEB_BACKEND="numpy") == "numpy"


BLOCK_NUMBA = "import sys; sys.modules['numba'] = None\n"


def test_missing_numba_falls_back_and_names_the_extra():
    code = BLOCK_NUMBA + (
        "from candle_web import Device, BackendUnavailable\n"
        "print(Device.cpu().backend.name)\n"
        "try:\n"
        "    Device.cpu(backend='numba')\n"
        "except BackendUnavailable as e:\n"
        "    print(e)\n")
    chosen, message = run_python(code, CANDLE_WEB_BACKEND=None).splitlines()
    assert chosen == "numpy"
    assert "numba" in message and "pip install 'candle-web[native]'" in message


def test_missing_cupy_names_the_package_and_the_extra():
    code = (
        "import sys; sys.modules['cupy'] = None\n"
        "from candle_web import Device, Tensor, BackendUnavailable\n"
        "try:\n"
        "    Device.cuda(0).backend\n"
        "except BackendUnavailable as e:\n"
        "    print(e)\n")
    message = run_python(code)
    assert "cupy" in message and "pip install 'candle-web[gpu]'" in message


def test_numba_cache_goes_to_the_project_folder():
    pytest.importorskip("numba")
    code = ("from candle_web.backend import get_backend; get_backend('numba')\n"
            "from numba.core import config; print(config.CACHE_DIR)")
    folder = Path(run_python(code, NUMBA_CACHE_DIR=None))
    # one folder per digest of the native sources (a kernel's cache is checked against its own
    # file only, so an edit elsewhere must start a fresh cache)
    assert folder.parent == REPO_ROOT / ".numba_cache"
    assert len(folder.name) == 16 and int(folder.name, 16) >= 0
