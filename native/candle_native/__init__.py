"""The native twin of candle_web: a Numba CPU backend and a CuPy GPU backend.

Importing this package registers the backends 'numba' and 'cupy' with candle_web's backend
registry, and the numba implementations of the accelerated parts (numba/parts/: Whisper encoder
and decode step, LLaMA decode step) with candle_web.backend.parts; neither numba nor cupy is imported until a backend is first used. A missing package
raises BackendUnavailable naming it and the extra that installs it.

Numba compiles its kernels with ``cache=True`` into ``NUMBA_CACHE_DIR``. When that variable is
not set, the cache goes to ``<checkout>/.numba_cache/<sources>`` (git-ignored) in a source
checkout, or to ``~/.cache/candle-web/numba/<sources>`` for an installed package, so a second
process loads the machine code instead of compiling it again. ``<sources>`` is a digest of this
package's Python files: numba checks a cached function against its own file only, so a kernel
cached before a function it calls changed (in another file) would run the callee's old machine
code -- after an edit to qrows.py the cached decoder_step.matvec crashed the process. A new
digest starts a fresh cache; in a checkout the older digests' folders are removed.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
from pathlib import Path

from candle_web.backend import parts, register_backend
from candle_web.backend.parts import register_part
from candle_web.core.errors import BackendUnavailable

NUMBA_EXTRA_HINT = "pip install 'candle-web[native]'"
CUPY_EXTRA_HINT = "pip install 'candle-web[gpu]'"

_CHECKOUT_ROOT = Path(__file__).resolve().parent.parent.parent


def _sources_digest() -> str:
    """sha256 (16 hex digits) of the names and contents of this package's .py files."""
    package = Path(__file__).resolve().parent
    digest = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        digest.update(path.relative_to(package).as_posix().encode() + b"\0")
        digest.update(path.read_bytes())
    # The integer kernels' forced instruction form changes their machine code, not their source.
    digest.update(os.environ.get("CANDLE_NATIVE_INT_LANES", "").encode())
    return digest.hexdigest()[:16]


def numba_cache_dir() -> Path:
    """Where compiled kernels are cached (NUMBA_CACHE_DIR wins when set)."""
    configured = os.environ.get("NUMBA_CACHE_DIR")
    if configured:
        return Path(configured)
    if (_CHECKOUT_ROOT / "pyproject.toml").is_file() and os.access(_CHECKOUT_ROOT, os.W_OK):
        return _CHECKOUT_ROOT / ".numba_cache" / _sources_digest()
    return Path.home() / ".cache" / "candle-web" / "numba" / _sources_digest()


def _drop_stale_checkout_caches(current: Path) -> None:
    """In a checkout, the folders of earlier digests (this checkout's own, never shared)."""
    base = _CHECKOUT_ROOT / ".numba_cache"
    if current.parent != base or not base.is_dir():
        return
    for entry in base.iterdir():
        if entry != current:
            shutil.rmtree(entry, ignore_errors=True)


def _configure_numba_cache() -> None:
    # numba reads NUMBA_CACHE_DIR when it is imported; if something imported it earlier, make it
    # read its configuration again so our kernels still land in the project's cache.
    if not os.environ.get("NUMBA_CACHE_DIR"):
        folder = numba_cache_dir()
        _drop_stale_checkout_caches(folder)
        os.environ["NUMBA_CACHE_DIR"] = str(folder)
        if "numba" in sys.modules:
            from numba.core import config

            config.reload_config()


# GNU OpenMP (numba's threading layer here) spins 300k iterations at every barrier by default.
# On a busy 2-core machine the spinning thread holds a core that a descheduled worker needs:
# measured 8-16 ms per parallel kernel call instead of 0.2 ms. A short spin keeps wake-ups quick
# on an idle machine and bounds the damage on a busy one. Only applied when the user set neither
# variable, and only effective if libgomp was not loaded earlier in the process.
GOMP_SHORT_SPIN = "1000"


def _configure_openmp_spin() -> None:
    if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
        os.environ["GOMP_SPINCOUNT"] = GOMP_SHORT_SPIN


def _numba_factory():
    _configure_numba_cache()
    _configure_openmp_spin()
    try:
        import numba  # noqa: F401
    except ImportError as e:
        raise BackendUnavailable(
            f"the numba backend needs the numba package: {NUMBA_EXTRA_HINT} ({e})") from None
    from .numba.backend import NumbaBackend

    return NumbaBackend()


def _cupy_factory():
    from .cupy.backend import make_cupy_backend

    return make_cupy_backend()


# -- accelerated parts (candle_web.backend.parts): whole model steps on the numba backend ----
def _whisper_encoder_part(weights, backend):
    from .numba.parts.whisper_encoder import FusedWhisperEncoder

    return FusedWhisperEncoder.build(weights)


def _whisper_decoder_step_part(weights, backend):
    from .numba.parts.whisper_decoder import FusedWhisperDecoder

    return FusedWhisperDecoder.build(weights)


def _llama_decoder_step_part(weights, backend):
    from .numba.parts.llama_decoder import FusedLlamaDecoder

    return FusedLlamaDecoder.build(weights)


register_backend("numba", _numba_factory)
register_backend("cupy", _cupy_factory)
register_part(parts.WHISPER_ENCODER, "numba", _whisper_encoder_part)
register_part(parts.WHISPER_DECODER_STEP, "numba", _whisper_decoder_step_part)
register_part(parts.LLAMA_DECODER_STEP, "numba", _llama_decoder_step_part)

__all__ = ["numba_cache_dir", "NUMBA_EXTRA_HINT", "CUPY_EXTRA_HINT"]
