"""The switches of the kernel layer, read from the environment once, in one table.

Every variable the backends and the accelerated parts honour is listed here (and in the
README's table); nothing else in the package or the native twin reads them. `settings()`
parses them on first use and keeps the result; after `reload_settings()` they are read again
(tests that change a variable call it). A program sets a switch for its own process with
`override_settings(field=value)` (the page's worker picks its backend so) instead of writing
the environment; the environment stays what the user set.

| variable | default | effect |
|---|---|---|
| CANDLE_WEB_BACKEND | (auto) | `numpy`, `numba` or `wasm` for `Device.cpu()`; auto: numba when it loads |
| CANDLE_WEB_FUSED_WHISPER | 1 | 0: Whisper decodes through the generic tensor path |
| CANDLE_WEB_FUSED_WHISPER_ENCODER | 1 | 0: Whisper encodes through the generic tensor path |
| CANDLE_WEB_FUSED_LLAMA | 1 | 0: LLaMA-family models decode through the generic tensor path |
| CANDLE_WEB_WHISPER_F16 | 1 | 0: the fused Whisper step keeps f16-valued weights as f32 |
| CANDLE_WEB_DECODE_THREADS | (all) | 1: the fused decode steps run on one thread |
| CANDLE_WEB_PROMPT_WEIGHTS_MB | 1024 | MiB of f32 copies of quantized weights kept for multi-row products (prompts without a fused part) |
| CANDLE_WEB_COMPUTE_TYPE | float32 | `int8`: quantized products of the fused parts multiply int8 activations by the int8 weight levels with integer dot products (quantized/int8_rows.py); `float32`: they widen the weights to f32 (the reference) |
| CANDLE_WEB_WASM_KERNELS | (checkout) | the kernels.wasm the wasm backend runs natively (wasmtime); default: web/vendor/ of the source checkout |
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields, replace

from ..core.errors import CandleError, UnsupportedError

BACKEND_VARIABLE = "CANDLE_WEB_BACKEND"
FUSED_WHISPER_VARIABLE = "CANDLE_WEB_FUSED_WHISPER"
FUSED_WHISPER_ENCODER_VARIABLE = "CANDLE_WEB_FUSED_WHISPER_ENCODER"
FUSED_LLAMA_VARIABLE = "CANDLE_WEB_FUSED_LLAMA"
WHISPER_F16_VARIABLE = "CANDLE_WEB_WHISPER_F16"
DECODE_THREADS_VARIABLE = "CANDLE_WEB_DECODE_THREADS"
PROMPT_WEIGHTS_MB_VARIABLE = "CANDLE_WEB_PROMPT_WEIGHTS_MB"
WASM_KERNELS_VARIABLE = "CANDLE_WEB_WASM_KERNELS"
COMPUTE_TYPE_VARIABLE = "CANDLE_WEB_COMPUTE_TYPE"

CPU_BACKENDS = ("numpy", "numba", "wasm")
# faster-whisper's / CTranslate2's option name and values.
COMPUTE_TYPES = ("float32", "int8")
DEFAULT_COMPUTE_TYPE = "float32"
DEFAULT_PROMPT_WEIGHTS_MB = 1024.0


@dataclass(frozen=True)
class Settings:
    cpu_backend: str | None  # None: numba when it loads, else numpy
    fused_whisper_decoder: bool
    fused_whisper_encoder: bool
    fused_llama_decoder: bool
    whisper_f16: bool
    decode_threads: int | None  # None: as many as numba has
    prompt_weights_bytes: int
    wasm_kernels: str | None  # None: the checkout's web/vendor/kernels.wasm, if any
    compute_type: str = DEFAULT_COMPUTE_TYPE  # one of COMPUTE_TYPES


def _switch(variable: str) -> bool:
    """On unless the variable is "0" (the documented way to turn a fused path off)."""
    return os.environ.get(variable, "1").strip() != "0"


def _cpu_backend() -> str | None:
    choice = os.environ.get(BACKEND_VARIABLE, "").strip().lower()
    if choice and choice not in CPU_BACKENDS:
        raise CandleError(f"{BACKEND_VARIABLE}={choice!r}: expected one of "
                          f"{', '.join(repr(name) for name in CPU_BACKENDS)}")
    return choice or None


def _decode_threads() -> int | None:
    raw = os.environ.get(DECODE_THREADS_VARIABLE, "").strip()
    if not raw:
        return None
    try:
        threads = int(raw)
    except ValueError:
        threads = 0
    if threads < 1:
        raise UnsupportedError(f"{DECODE_THREADS_VARIABLE}={raw!r}: expected a whole number "
                               "of threads >= 1")
    return threads


def _prompt_weights_bytes() -> int:
    raw = os.environ.get(PROMPT_WEIGHTS_MB_VARIABLE, "").strip()
    try:
        megabytes = float(raw) if raw else DEFAULT_PROMPT_WEIGHTS_MB
    except ValueError:
        megabytes = -1.0
    if not megabytes >= 0:  # also refuses nan
        raise UnsupportedError(f"{PROMPT_WEIGHTS_MB_VARIABLE}={raw!r}: expected a number of MiB "
                               ">= 0")
    return int(megabytes * (1 << 20))


def _compute_type() -> str:
    choice = os.environ.get(COMPUTE_TYPE_VARIABLE, "").strip().lower()
    return check_compute_type(choice, COMPUTE_TYPE_VARIABLE) if choice else DEFAULT_COMPUTE_TYPE


def check_compute_type(choice, where: str) -> str:
    """`choice` when it names a compute type, else an error naming `where` it came from."""
    if choice not in COMPUTE_TYPES:
        raise UnsupportedError(f"{where}={choice!r}: expected one of "
                               f"{', '.join(repr(name) for name in COMPUTE_TYPES)}")
    return choice


def _read() -> Settings:
    return Settings(cpu_backend=_cpu_backend(),
                    fused_whisper_decoder=_switch(FUSED_WHISPER_VARIABLE),
                    fused_whisper_encoder=_switch(FUSED_WHISPER_ENCODER_VARIABLE),
                    fused_llama_decoder=_switch(FUSED_LLAMA_VARIABLE),
                    whisper_f16=_switch(WHISPER_F16_VARIABLE),
                    decode_threads=_decode_threads(),
                    prompt_weights_bytes=_prompt_weights_bytes(),
                    wasm_kernels=os.environ.get(WASM_KERNELS_VARIABLE, "").strip() or None,
                    compute_type=_compute_type())


_current: Settings | None = None
_overrides: dict = {}  # field -> value set by override_settings, over the environment's


def settings() -> Settings:
    """The switches, parsed from the environment at the first call, with the overrides."""
    global _current
    if _current is None:
        _current = replace(_read(), **_overrides)
    return _current


def override_settings(**values) -> Settings:
    """Set switches for this process by their `Settings` field names, over the environment
    (e.g. `override_settings(cpu_backend="wasm")`); fields not named keep their values. Checked
    as the environment's values are; `reload_settings()` drops every override. Returns the
    settings now in force."""
    known = {field.name for field in fields(Settings)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise CandleError(f"override_settings: unknown switches {unknown}; known: {sorted(known)}")
    backend = values.get("cpu_backend")
    if backend is not None and backend not in CPU_BACKENDS:
        raise CandleError(f"override_settings: cpu_backend={backend!r}: expected one of "
                          f"{', '.join(repr(name) for name in CPU_BACKENDS)} or None")
    threads = values.get("decode_threads")
    if threads is not None and (not isinstance(threads, int) or threads < 1):
        raise UnsupportedError(f"override_settings: decode_threads={threads!r}: expected a "
                               "whole number of threads >= 1 or None")
    if "compute_type" in values:
        check_compute_type(values["compute_type"], "override_settings: compute_type")
    if "prompt_weights_bytes" in values and not values["prompt_weights_bytes"] >= 0:
        raise UnsupportedError(f"override_settings: prompt_weights_bytes="
                               f"{values['prompt_weights_bytes']!r}: expected bytes >= 0")
    global _current
    _overrides.update(values)
    _current = None
    return settings()


def reload_settings() -> None:
    """Forget the parsed switches and the overrides: the next `settings()` reads the
    environment again (after a test or a user changed a variable; a bad value is reported
    there, where it is used)."""
    global _current
    _current = None
    _overrides.clear()
