"""candle-web: a minimalist ML framework in pure Python + numpy, modelled on Hugging Face Candle.

The same package runs in a Pyodide web worker and natively; at import time it needs only the
standard library and numpy.
"""

from .core import dtype
from .core._lazy import lazy_submodules
from .core.autograd import GradStore, no_grad
from .core.device import Device
from .core.dtype import DType, bf16, f16, f32, f64, i64, u8, u32
from .core.errors import (BackendUnavailable, Cancelled, CandleError, DeviceMismatch,
                          DTypeMismatch, FormatError, HashMismatch, IndexOutOfRange, ModelNotFound,
                          ShapeError, ShapeMismatch, UnsupportedError)
from .core.shape import Shape
from .core.tensor import Tensor, Var, custom_op, manual_seed

# The backend registry (backend/__init__.py: stdlib only at import) registers how devices find
# their kernels into the core, which never imports the layer above it.
from . import backend  # noqa: E402,F401  (after the core it registers into)

__version__ = "0.1.0"

# Subpackages reachable as attributes (`cw.nn`, `cw.io.safetensors`), imported on first use so
# that `import candle_web` still loads only the standard library and numpy.
# `cw.audio` is the name the audio decoding had before it moved into io/.
__getattr__, __dir__ = lazy_submodules(__name__, (
    "core", "nn", "io", "quantized", "tokenizers", "generation", "models", "hub", "pipelines",
    "worker", "batch", "backend", "cli", "serve"), globals(),
    aliases={"audio": "candle_web.io.audio"})

__all__ = [
    "Tensor", "Var", "custom_op", "Device", "DType", "Shape", "GradStore", "no_grad", "manual_seed", "cat",
    "stack", "dtype", "u8", "u32", "i64", "f16", "bf16", "f32", "f64", "CandleError",
    "ShapeMismatch", "ShapeError", "DTypeMismatch", "DeviceMismatch", "IndexOutOfRange",
    "FormatError", "HashMismatch", "ModelNotFound", "UnsupportedError", "BackendUnavailable",
    "Cancelled",
]
