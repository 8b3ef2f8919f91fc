"""`candle-web generate` as a user runs it (a subprocess), including bad input."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.models.llama_testlib import TINY_CONFIG, random_state, to_gguf

REPO = Path(__file__).resolve().parents[2]


def _run(*args, timeout=600):
    env = dict(os.environ, PYTHONPATH=f"{REPO / 'pkg'}:{REPO / 'native'}", CANDLE_WEB_OFFLINE="1",
               OPENBLAS_NUM_THREADS="1")  # see llama_testlib.one_blas_thread
    return subprocess.run([sys.executable, "-m", "candle_web.cli", *args], capture_output=True,
                          text=True, timeout=timeout, env=env)


def test_generate_chat_streams_the_answer(model_file):
    path = model_file("smollm2-135m-instruct", "SmolLM2-135M-Instruct.Q4_1.gguf")
    out = _run("generate", "What is the capital of France?", "--chat", "--max-tokens", "8",
               "--model", str(path))
    assert out.returncode == 0, out.stderr
    assert "Paris" in out.stdout
    assert "tok/s" in out.stderr and "prompt tokens" in out.stderr


def test_generate_refuses_an_unsupported_architecture(tmp_path):
    path = to_gguf(random_state(TINY_CONFIG), TINY_CONFIG, tmp_path / "mamba.gguf", arch="mamba")
    out = _run("generate", "hello", "--model", str(path))
    assert out.returncode == 2
    assert "mamba" in out.stderr and "not supported" in out.stderr
    assert "Traceback" not in out.stderr
