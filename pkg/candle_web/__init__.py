"""candle-web: a minimalist ML framework in pure Python + numpy, modelled on Hugging Face Candle.

The same package runs in a Pyodide web worker and natively; at import time it needs only the
standard library and numpy.
"""

from . import dtype
from ._lazy import lazy_submodules
from .autograd import GradStore, no_grad
from .device import Device
from .dtype import DType, bf16, f16, f32, f64, i64, u8, u32
from .errors import (BackendUnavailable, Cancelled, CandleError, DeviceMismatch, DTypeMismatch,
                     FormatError, HashMismatch, IndexOutOfRange, ModelNotFound, ShapeError,
                     ShapeMismatch, UnsupportedError)
from .shape import Shape
from .tensor import Tensor, Var, custom_op, manual_seed

__version__ = "0.1.0"

# Subpackages reachable as attributes (`cw.nn`, `cw.io.safetensors`), imported on first use so
# that `import candle_web` still loads only the standard library and numpy.
__getattr__, __dir__ = lazy_submodules(__name__, (
    "nn", "io", "quantized", "tokenizers", "generation", "models", "hub", "pipelines", "audio",
    "backend", "cli", "serve"), globals())

__all__ = [
    "Tensor", "Var", "custom_op", "Device", "DType", "Shape", "GradStore", "no_grad", "manual_seed", "cat",
    "stack", "dtype", "u8", "u32", "i64", "f16", "bf16", "f32", "f64", "CandleError",
    "ShapeMismatch", "ShapeError", "DTypeMismatch", "DeviceMismatch", "IndexOutOfRange",
    "FormatError", "HashMismatch", "ModelNotFound", "UnsupportedError", "BackendUnavailable",
    "Cancelled",
]
