#!/usr/bin/env bash
# One-command GPU check of the native twin: the cupy op suite, then a small GPU benchmark.
# Run from the repository root on a machine with an NVIDIA GPU and cupy (pip install
# 'candle-web[gpu]'). Uses .venv/bin/python when present, else python3; PYTHON overrides.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}"
export PYTHONPATH="pkg:native${PYTHONPATH:+:$PYTHONPATH}"
export CANDLE_WEB_OFFLINE=1

"$PYTHON" - <<'PY'
import cupy
props = cupy.cuda.runtime.getDeviceProperties(0)
print(f"GPU: {props['name'].decode()}  cupy {cupy.__version__}  "
      f"CUDA runtime {cupy.cuda.runtime.runtimeGetVersion()}")
PY

# The suite fails instead of skipping here: on this machine a skip would hide a broken setup.
"$PYTHON" -m pytest tests/native/test_cupy_backend.py -q -p no:cacheprovider -rs \
    -W error::pytest.PytestUnhandledThreadExceptionWarning "$@" | tee /tmp/gpu_check_pytest.log
if grep -q "skipped" /tmp/gpu_check_pytest.log; then
    echo "gpu_check: cupy tests were skipped (see the reasons above)" >&2
    exit 1
fi

"$PYTHON" -m candle_native.microbench --gpu-only
