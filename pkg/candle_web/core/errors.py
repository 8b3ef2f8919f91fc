"""The one error hierarchy of candle_web.

Every failure the library detects is raised as a subclass of :class:`CandleError`, with a
message that names the operation, the shapes/dtypes involved or the offending field, so a user
can fix the input without reading the source.
"""


class CandleError(Exception):
    """Base class of every error raised on purpose by candle_web."""


class ShapeMismatch(CandleError, ValueError):
    """Two shapes that must agree do not (message names the op and both shapes)."""


class ShapeError(CandleError, ValueError):
    """A shape argument is invalid on its own (bad dim, bad reshape, out-of-range narrow...)."""


class DTypeMismatch(CandleError, TypeError):
    """Two tensors that must share a dtype do not, or an op does not support a dtype."""


class DeviceMismatch(CandleError):
    """Tensors on different devices were combined."""


class IndexOutOfRange(CandleError, IndexError):
    """An index tensor or integer index points outside its dimension."""


class FormatError(CandleError, ValueError):
    """A file or byte buffer is malformed (truncated, lying header, unknown dtype...)."""


class InvalidOption(CandleError, ValueError):
    """A decoding or command-line option is outside its range (message names it and the range)."""


class HashMismatch(CandleError):
    """A downloaded or cached file does not have the expected sha256."""


class ModelNotFound(CandleError, LookupError):
    """A model name, file or source cannot be resolved."""


class UnsupportedError(CandleError, NotImplementedError):
    """A valid request that this implementation does not handle (architecture, op, dtype...)."""


class BackendUnavailable(CandleError, ImportError):
    """A backend's package is missing; the message names the package and the extra."""


class Cancelled(CandleError):
    """Work was cancelled through a callback or an interrupt."""
