#!/usr/bin/env bash
# One-command GPU check of the native twin: the cupy op suite, the cupy micro-benchmarks, then
# the GPU benchmark (bench/gpu.py: Whisper and SmolLM2 shapes, candle-web cuda next to PyTorch
# CUDA, with its own correctness checks). Every step runs even when an earlier one fails (a GPU
# run is scarce: one failure should not hide the rest); the exit status is 1 if any failed.
# Run from the repository root on a machine with an NVIDIA GPU and cupy (pip install
# 'candle-web[gpu]'). Uses .venv/bin/python when present, else python3; PYTHON overrides.
# GPU_BENCH_JSON=path also writes the benchmark's results as JSON there; GPU_CHECK_MICROBENCH=0
# skips the micro-benchmark. Arguments go to pytest.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}"
export PYTHONPATH="pkg:native${PYTHONPATH:+:$PYTHONPATH}"
export CANDLE_WEB_OFFLINE=1
export PYTHONUNBUFFERED=1
failed=()

"$PYTHON" - <<'PY' || { echo "gpu_check: cupy cannot see a GPU" >&2; exit 1; }
import cupy
props = cupy.cuda.runtime.getDeviceProperties(0)
print(f"GPU: {props['name'].decode()}  cupy {cupy.__version__}  "
      f"CUDA runtime {cupy.cuda.runtime.runtimeGetVersion()}")
PY

# The suite fails instead of skipping here: on this machine a skip would hide a broken setup.
pytest_log="$(mktemp)"
if ! "$PYTHON" -m pytest tests/native/test_cupy_backend.py -q -p no:cacheprovider -rs \
        -W error::pytest.PytestUnhandledThreadExceptionWarning "$@" | tee "$pytest_log"; then
    failed+=("cupy op suite")
elif grep -q "skipped" "$pytest_log"; then
    echo "gpu_check: cupy tests were skipped (see the reasons above)" >&2
    failed+=("cupy op suite (skipped)")
fi
rm -f "$pytest_log"

# The micro-benchmark quantizes 4096- and 14336-row matrices to Q4_K/Q6_K on the CPU first
# (minutes of numpy); GPU_CHECK_MICROBENCH=0 leaves it out when device time is short.
if [ "${GPU_CHECK_MICROBENCH:-1}" != "0" ]; then
    "$PYTHON" -m candle_native.microbench --gpu-only || failed+=("microbench")
fi

bench_args=()
[ -n "${GPU_BENCH_JSON:-}" ] && bench_args+=(--json "$GPU_BENCH_JSON")
"$PYTHON" bench/gpu.py ${bench_args[@]+"${bench_args[@]}"} || failed+=("bench/gpu.py")

if [ ${#failed[@]} -gt 0 ]; then
    echo "gpu_check: FAILED: ${failed[*]}" >&2
    exit 1
fi
echo "gpu_check: all passed"
