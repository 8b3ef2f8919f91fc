"""The "wasm" backend: the WebAssembly SIMD kernels of `web/kernels/` as a candle_web backend,
in the page (Pyodide) and natively (wasmtime, for the tests and benches).

- `abi.py`: the kernel module's ABI as data (exports, argument kinds, the threads build's jobs
  and argument blocks); scripts/build_kernels.py generates the C header and the worker's JS
  constants from it;
- `hosts.py`: how Python reaches the module's exports (`PyodideHost`, `WasmtimeHost`);
- `backend.py`: `WasmBackend` (the numpy reference with the hot ops on the kernels), the
  factory the registry calls, and `install()`, the page worker's entry point;
- `parts.py`: the accelerated parts (backend/parts.py) on the kernels, one thread;
- `team.py`, `team_parts.py`: the threads build's hosts and the parts on two threads.

Importing the package registers the parts on "wasm", here and nowhere else (as candle_native's
__init__ registers the numba ones); backend/__init__ registers the backend's factory.
"""

from __future__ import annotations

from .. import parts as _declared
from . import parts as _parts
from .backend import WasmBackend, create_backend, install
from .parts import UnfitWeights

_declared.register_part(_declared.WHISPER_ENCODER, "wasm", _parts.whisper_encoder)
_declared.register_part(_declared.WHISPER_DECODER_STEP, "wasm", _parts.whisper_decoder_step)
_declared.register_part(_declared.LLAMA_DECODER_STEP, "wasm", _parts.llama_decoder_step)

__all__ = ["WasmBackend", "UnfitWeights", "create_backend", "install"]
