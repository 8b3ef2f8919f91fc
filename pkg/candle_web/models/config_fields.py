"""Checked reads of model configurations: config.json objects and GGUF metadata.

Every model's config is read through these getters, so a broken or hostile file fails at load
with a FormatError naming the file, the field and the limit, instead of loading and failing
later inside a forward pass (a ZeroDivisionError from 0 heads, an IndexError from a suppressed
token id outside the vocabulary, a TypeError from `null` where a list belongs).

    fields = ConfigFields(json_object, "t5 config.json /path/config.json")
    d_model = fields.positive_int("d_model")
    eos = fields.token_id("eos_token_id", vocab_size, default=1)

A JSON `null` counts as absent (Hugging Face configs write `"head_dim": null` for "derive
it"), so an optional field falls back to its default and a required one is reported missing.
"""

from __future__ import annotations

import math

from ..core.errors import FormatError
from ..io.checkpoint import read_json_config  # the JSON reading; the checked getters are here

REQUIRED = object()  # the default of a field that must be present


def _is_integer(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    """A finite int or float; an int too large for a float (1e400 written out) is not."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


class ConfigFields:
    """Checked getters over one config mapping.

    `source` starts every message (it names the file); `kind` is what a key is called there
    ("field" in config.json, "metadata key" in GGUF); `key_prefix` is prepended to every
    lookup (GGUF's "llama."), `label_prefix` only to the names in messages (a nested
    section's "rope_scaling.")."""

    def __init__(self, mapping, source: str, kind: str = "field", key_prefix: str = "",
                 label_prefix: str = ""):
        if not isinstance(mapping, dict):
            raise FormatError(f"{source}: expected a JSON object, got {type(mapping).__name__}")
        self.mapping, self.source, self.kind = mapping, source, kind
        self.key_prefix, self.label_prefix = key_prefix, label_prefix

    # -- the primitive read and the one error format ----------------------------------------
    def label(self, name: str) -> str:
        return self.label_prefix + self.key_prefix + name

    def has(self, name: str) -> bool:
        return self.mapping.get(self.key_prefix + name) is not None

    def raw(self, name: str, default=REQUIRED):
        """The stored value, or `default` when absent or null (FormatError if required)."""
        return self._lookup(name, default)[1]

    def _lookup(self, name: str, default) -> tuple:
        """(True, stored value) or (False, default): defaults are the caller's, not checked."""
        value = self.mapping.get(self.key_prefix + name)
        if value is not None:
            return True, value
        if default is REQUIRED:
            raise FormatError(f"{self.source}: missing {self.kind} {self.label(name)!r}")
        return False, default

    def fail(self, name: str, limit: str, value) -> FormatError:
        return FormatError(f"{self.source}: {self.kind} {self.label(name)!r} must be {limit}, "
                           f"got {value!r}")

    # -- scalars -----------------------------------------------------------------------------
    def integer(self, name: str, default=REQUIRED, minimum: int = None, maximum: int = None) -> int:
        found, value = self._lookup(name, default)
        if not found:
            return value
        if not _is_integer(value) or (minimum is not None and value < minimum) or \
                (maximum is not None and value > maximum):
            raise self.fail(name, _integer_range(minimum, maximum), value)
        return value

    def positive_int(self, name: str, default=REQUIRED, maximum: int = None) -> int:
        """A size: layers, heads, widths, vocabulary, positions."""
        return self.integer(name, default, minimum=1, maximum=maximum)

    def number(self, name: str, default=REQUIRED, positive: bool = False) -> float:
        """A finite float (an epsilon, a RoPE base, a scaling factor); > 0 when `positive`."""
        found, value = self._lookup(name, default)
        if not found:
            return value
        if not _is_number(value) or (positive and value <= 0):
            raise self.fail(name, "a positive finite number" if positive else "a finite number",
                            value)
        return float(value)

    def boolean(self, name: str, default=REQUIRED) -> bool:
        found, value = self._lookup(name, default)
        if found and not isinstance(value, bool):
            raise self.fail(name, "true or false", value)
        return value

    def string(self, name: str, default=REQUIRED, choices: tuple = None) -> str:
        found, value = self._lookup(name, default)
        if not found:
            return value
        if not isinstance(value, str) or (choices is not None and value not in choices):
            limit = f"one of {list(choices)}" if choices is not None else "a string"
            raise self.fail(name, limit, value)
        return value

    def section(self, name: str):
        """A nested object as ConfigFields (messages say `name.field`), or None when absent."""
        value = self.raw(name, None)
        if value is None:
            return None
        if not isinstance(value, dict):
            raise self.fail(name, "an object", value)
        return ConfigFields(value, self.source, self.kind,
                            label_prefix=self.label(name) + ".")

    # -- token ids and lists -----------------------------------------------------------------
    def token_id(self, name: str, vocab_size: int, default=REQUIRED):
        """One token id within [0, vocab_size); `default` (may be None) when absent."""
        return self.integer(name, default, minimum=0, maximum=vocab_size - 1)

    def token_ids(self, name: str, vocab_size: int, default=()) -> tuple:
        """Token ids given as one id or a list of ids (HF's eos_token_id is either)."""
        found, value = self._lookup(name, default)
        if not found:
            return tuple(default)
        items = value if isinstance(value, list) else [value]
        return self._integers(name, items, 0, vocab_size - 1,
                              f"a token id or a list of token ids in 0..{vocab_size - 1}", value)

    def int_list(self, name: str, default=(), minimum: int = None, maximum: int = None) -> tuple:
        """A JSON list of integers within [minimum, maximum]."""
        found, value = self._lookup(name, default)
        if not found:
            return tuple(default)
        limit = f"a list of integers in {_bounds(minimum, maximum)}"
        if not isinstance(value, list):
            raise self.fail(name, limit, value)
        return self._integers(name, value, minimum, maximum, limit, value)

    def int_pairs(self, name: str, first_limit: int, second_limit: int, default=(),
                  names: tuple = ("a", "b")) -> tuple:
        """A list of [a, b] pairs with 0 <= a < first_limit, 0 <= b < second_limit (Whisper's
        alignment_heads: names ("layer", "head"))."""
        found, value = self._lookup(name, default)
        if not found:
            return tuple(default)
        first, second = names
        limit = (f"a list of [{first}, {second}] pairs with {first} in 0..{first_limit - 1} and "
                 f"{second} in 0..{second_limit - 1}")
        if not isinstance(value, list):
            raise self.fail(name, limit, value)
        pairs = []
        for pair in value:
            if not (isinstance(pair, list) and len(pair) == 2
                    and all(_is_integer(x) for x in pair)
                    and 0 <= pair[0] < first_limit and 0 <= pair[1] < second_limit):
                raise self.fail(name, limit, pair)
            pairs.append(tuple(pair))
        return tuple(pairs)

    def _integers(self, name, items, minimum, maximum, limit, whole) -> tuple:
        for item in items:
            if not _is_integer(item) or (minimum is not None and item < minimum) or \
                    (maximum is not None and item > maximum):
                raise FormatError(f"{self.source}: {self.kind} {self.label(name)!r} must be "
                                  f"{limit}, got {_short(whole)} (bad entry {item!r})")
        return tuple(items)

    # -- relations between fields ------------------------------------------------------------
    def check_divides(self, divisor_name: str, divisor: int, name: str, value: int) -> None:
        """`value` (e.g. d_model) must be a multiple of `divisor` (e.g. the head count)."""
        if value % divisor:
            raise FormatError(f"{self.source}: {self.label(name)} {value} is not a multiple of "
                              f"{self.label(divisor_name)} {divisor}")


def _integer_range(minimum, maximum) -> str:
    if minimum == 1 and maximum is None:
        return "a positive integer"
    if minimum == 0 and maximum is None:
        return "a non-negative integer"
    return f"an integer in {_bounds(minimum, maximum)}"


def _bounds(minimum, maximum) -> str:
    if minimum is not None and maximum is not None:
        return f"{minimum}..{maximum}"
    if minimum is not None:
        return f">= {minimum}"
    return "any range" if maximum is None else f"<= {maximum}"


def _short(value, limit: int = 60) -> str:
    """A value's repr cut to `limit` characters: a 100-id list should not flood the message."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


__all__ = ["ConfigFields", "read_json_config", "REQUIRED"]
