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


class InvalidText(CandleError, ValueError):
    """A text argument is not valid Unicode text: it holds a lone surrogate, which is what
    Python makes of bytes that are not UTF-8 (command-line arguments and file names are decoded
    with `surrogateescape`; JSON and JavaScript strings may carry lone UTF-16 halves). Refused
    with the argument's name, as HF `tokenizers` refuses such a str ("TextInputSequence must
    be str"); nothing is replaced, so the same text gives the same ids everywhere."""


def check_text(text: str, argument: str) -> str:
    """`text` itself when it encodes to UTF-8; InvalidText naming `argument` and the first bad
    character otherwise. One C-speed pass (`str.encode`), only run on text that is not ASCII."""
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise InvalidText(describe_bad_text(text, argument, error.start)) from None
    return text


def describe_bad_text(text: str, argument: str, position: int) -> str:
    code_point = ord(text[position])
    if 0xDC80 <= code_point <= 0xDCFF:  # surrogateescape's stand-in for one undecodable byte
        what = f"byte 0x{code_point - 0xDC00:02X} that is not UTF-8 (U+{code_point:04X})"
    else:
        what = f"a lone surrogate U+{code_point:04X}"
    return (f"{argument}: not valid text: {what} at character {position}; pass UTF-8 text "
            f"(invalid bytes and lone surrogates are refused, not replaced)")
