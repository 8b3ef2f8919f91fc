"""Checked reads of tokenizer.json fields (and of GGUF vocabulary keys).

A tokenizer file is untrusted input. Every value is checked where it is read, against the type
HF `tokenizers` gives that field, so that a malformed file fails at load with a FormatError
naming the field path (`post_processor.single[0]`) and the rule it broke, instead of with a
TypeError deep inside the first encode. The limits on what a file may ask for are named here.
"""

from __future__ import annotations

import math
import reprlib

from ..core.errors import FormatError

# HF stores token ids and type ids as u32.
MAX_ID = 2**32 - 1
# HF stores counts (max_input_chars_per_word, Strip start/stop, stride...) as usize.
MAX_COUNT = 2**64 - 1
# Padding allocates this many entries per encoding: a file asking for a fixed length or a
# multiple above it is refused at load instead of exhausting memory at the first encode.
MAX_PADDED_LENGTH = 1 << 20
# Sequence normalizers / pre-tokenizers / post-processors / decoders nested inside each other
# (real files nest at most two); bounds the recursion of loading and of encoding.
MAX_SEQUENCE_NESTING = 16

SOURCE = "tokenizer.json"
REQUIRED = object()

_SHORT = reprlib.Repr()
_SHORT.maxlevel = 2
_SHORT.maxstring = 60
_SHORT.maxother = 60
_SHORT.maxlist = _SHORT.maxtuple = _SHORT.maxdict = 4


def describe(value) -> str:
    """A short repr for messages: bounded in length and depth whatever the input."""
    return _SHORT.repr(value)


def fail(where: str, expected: str, value, source: str = SOURCE) -> FormatError:
    return FormatError(f"{source} {where}: expected {expected}, got {describe(value)}")


def as_object(value, where: str, source: str = SOURCE) -> dict:
    if not isinstance(value, dict):
        raise fail(where, "an object", value, source)
    return value


def as_list(value, where: str, source: str = SOURCE) -> list:
    if not isinstance(value, list):
        raise fail(where, "a list", value, source)
    return value


def as_string(value, where: str, source: str = SOURCE) -> str:
    if not isinstance(value, str):
        raise fail(where, "a string", value, source)
    return value


def as_bool(value, where: str, source: str = SOURCE) -> bool:
    if not isinstance(value, bool):
        raise fail(where, "true or false", value, source)
    return value


def as_int(value, where: str, minimum: int = 0, maximum: int = MAX_ID,
           source: str = SOURCE) -> int:
    # bool is an int subclass in Python but not a number in JSON/HF.
    if isinstance(value, bool) or not isinstance(value, int):
        raise fail(where, f"an integer in [{minimum}, {maximum}]", value, source)
    if not minimum <= value <= maximum:
        raise FormatError(f"{source} {where}: {describe(value)} is outside the allowed range "
                          f"[{minimum}, {maximum}]")
    return value


def as_number(value, where: str, source: str = SOURCE) -> float:
    """A finite float (Python's json accepts NaN/Infinity and unbounded integers)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise fail(where, "a number", value, source)
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    if not math.isfinite(number):
        raise fail(where, "a finite number", value, source)
    return number


def as_choice(value, where: str, choices: tuple, source: str = SOURCE) -> str:
    if not isinstance(value, str) or value not in choices:
        raise fail(where, f"one of {choices}", value, source)
    return value


def check_nesting(depth: int, where: str) -> None:
    if depth > MAX_SEQUENCE_NESTING:
        raise FormatError(f"{SOURCE} {where}: Sequence nested more than "
                          f"{MAX_SEQUENCE_NESTING} levels deep")


class Fields:
    """Checked reads of one JSON object found at `where` in the file.

    A field given a default may be absent or null (both mean "use the default", as the
    optional fields of HF's format do); a field without a default is required."""

    def __init__(self, config, where: str):
        self.config = as_object(config, where)
        self.where = where

    def path(self, key: str) -> str:
        return f"{self.where}.{key}"

    def get(self, key: str, default=REQUIRED):
        value = self.config.get(key)
        if value is not None:
            return value
        if default is REQUIRED:
            if key in self.config:
                raise FormatError(f"{SOURCE} {self.where}: field {key!r} must not be null")
            raise FormatError(f"{SOURCE} {self.where}: missing field {key!r}")
        return default

    def _checked(self, key, default, check, *args):
        value = self.get(key, default)
        if value is None and default is None:
            return None
        return check(value, self.path(key), *args)

    def string(self, key: str, default=REQUIRED):
        return self._checked(key, default, as_string)

    def boolean(self, key: str, default=REQUIRED):
        return self._checked(key, default, as_bool)

    def integer(self, key: str, default=REQUIRED, minimum: int = 0, maximum: int = MAX_ID):
        return self._checked(key, default, as_int, minimum, maximum)

    def number(self, key: str, default=REQUIRED):
        return self._checked(key, default, as_number)

    def choice(self, key: str, choices: tuple, default=REQUIRED):
        return self._checked(key, default, as_choice, choices)

    def list(self, key: str, default=REQUIRED):
        return self._checked(key, default, as_list)

    def object(self, key: str, default=REQUIRED):
        return self._checked(key, default, as_object)


def sequence_steps(fields: "Fields", key: str, build, depth: int) -> list:
    """The steps of a Sequence component (normalizers, pre-tokenizers, decoders, post-
    processors): each item of the `key` list built by `build(config, where, depth + 1)`. A
    null step would be skipped by the loader but called by encode: it is refused."""
    steps = []
    for index, child in enumerate(as_list(fields.get(key), fields.path(key))):
        where = f"{fields.where}.{key}[{index}]"
        steps.append(build(as_object(child, where), where, depth + 1))
    return steps
