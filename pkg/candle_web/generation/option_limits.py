"""The ranges of the decoding options, in one place for the CLI and the options dataclasses.

`candle-web` uses each limit as an argparse `type=` (a bad value is a one-line usage error,
exit status 2, before any model loads); TranscribeOptions and GenerationOptions check the same
limits in `__post_init__`, so the browser worker, which builds those dataclasses from the
page's settings, refuses the same values with the same words (InvalidOption).

Standard library only: the CLI builds its parser from these without importing numpy.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from ..core.errors import InvalidOption

# Beam search (and best_of sampling) runs this many decoder rows per window, and each row keeps
# its own decoder state: a copy of the audio features, the cross-attention keys and values of
# every block (2 x 1500 positions x d_model) and a self-attention cache of up to 448 positions,
# all float32 -- about 26 MB per beam on whisper-tiny.en and 51 MB on whisper-base
# (whisper_decode.beam_state_bytes). 32 beams are then 0.8 and 1.6 GB; openai-whisper and
# faster-whisper use 5. A width of 2000 asked for ~52 GB and was killed by the kernel.
MAX_BEAM_SIZE = 32
# Where the machine's memory cannot be read (Pyodide): what a wasm32 heap can hold at best.
FALLBACK_MEMORY_BYTES = 2 << 30
# Decoder state may take at most this share of the machine's memory: the weights, the
# activations and everything else running need the rest.
MEMORY_SHARE = 0.5


@dataclass(frozen=True)
class Limit:
    """An integer or finite number within [minimum, maximum] (minimum excluded when
    `open_minimum`); None bounds are absent. `note` says what special values mean."""

    integer: bool
    minimum: float = None
    maximum: float = None
    open_minimum: bool = False
    note: str = ""

    def describe(self) -> str:
        """e.g. 'an integer from 1 to 32', 'a finite number in (0, 1]', 'a finite number >= 0
        (0: greedy)'."""
        kind = "an integer" if self.integer else "a finite number"
        if self.minimum is not None and self.maximum is not None:
            if self.open_minimum:
                text = f"{kind} in ({_show(self.minimum)}, {_show(self.maximum)}]"
            else:
                text = f"{kind} from {_show(self.minimum)} to {_show(self.maximum)}"
        elif self.minimum is not None:
            text = f"{kind} {'>' if self.open_minimum else '>='} {_show(self.minimum)}"
        elif self.maximum is not None:
            text = f"{kind} <= {_show(self.maximum)}"
        else:
            text = kind
        return f"{text} ({self.note})" if self.note else text

    def accepts(self, value) -> bool:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        if self.integer and not isinstance(value, int):
            return False
        # Python ints are exact at any size (math.isfinite would overflow on a huge one).
        if isinstance(value, float) and not math.isfinite(value):
            return False
        if self.minimum is not None and (value <= self.minimum if self.open_minimum
                                         else value < self.minimum):
            return False
        return self.maximum is None or value <= self.maximum

    def check(self, value, name: str, optional: bool = False):
        """`value` when it is within the limit (None too when `optional`), else InvalidOption
        naming `name` and the range. numpy scalars count as their Python values."""
        if value is None and optional:
            return None
        value = _python_number(value)
        if not self.accepts(value):
            raise InvalidOption(f"{name} must be {self.describe()}, got {value!r}")
        return value

    def argparse_type(self):
        """A `type=` for argparse: parses the text and range-checks it; argparse turns the
        ArgumentTypeError into `usage ... error: argument --x: must be ..., got '...'`."""
        import argparse

        def parse(text: str):
            try:
                value = int(text) if self.integer else float(text)
            except ValueError:
                value = None
            if value is None or not self.accepts(value):
                raise argparse.ArgumentTypeError(f"must be {self.describe()}, got {text!r}")
            return value

        parse.__name__ = "integer" if self.integer else "number"
        return parse


def _show(bound: float) -> str:
    return str(int(bound)) if float(bound).is_integer() else str(bound)


def _python_number(value):
    """numpy scalars (from a config or an array) as Python numbers; anything else as is."""
    item = getattr(value, "item", None)
    if item is not None and getattr(value, "shape", None) == ():
        return item()
    return value


BEAM_SIZE = Limit(integer=True, minimum=1, maximum=MAX_BEAM_SIZE)
BEST_OF = Limit(integer=True, minimum=1, maximum=MAX_BEAM_SIZE)
PATIENCE = Limit(integer=False, minimum=0, open_minimum=True)
TEMPERATURE = Limit(integer=False, minimum=0, note="0: greedy")
TOP_K = Limit(integer=True, minimum=1)
# p = 1 keeps every token (no mask); p <= 0 would keep none.
TOP_P = Limit(integer=False, minimum=0, maximum=1, open_minimum=True)
# numpy's generators take any non-negative integer seed; negative ones raise ValueError.
SEED = Limit(integer=True, minimum=0)
REPEAT_PENALTY = Limit(integer=False, minimum=0, open_minimum=True, note="1: off")
REPEAT_LAST_N = Limit(integer=True, minimum=0, note="0: no penalty window")
MAX_NEW_TOKENS = Limit(integer=True, minimum=0)
PORT = Limit(integer=True, minimum=0, maximum=65535, note="0: any free port")
THRESHOLD = Limit(integer=False)


def memory_budget_bytes() -> int:
    """The bytes decoder state may take: MEMORY_SHARE of the machine's physical memory, or
    FALLBACK_MEMORY_BYTES where the platform does not say (os.sysconf is POSIX only)."""
    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        total = 0
    if total <= 0:
        return FALLBACK_MEMORY_BYTES
    return int(total * MEMORY_SHARE)


__all__ = ["Limit", "MAX_BEAM_SIZE", "BEAM_SIZE", "BEST_OF", "PATIENCE", "TEMPERATURE", "TOP_K",
           "TOP_P", "SEED", "REPEAT_PENALTY", "REPEAT_LAST_N", "MAX_NEW_TOKENS", "PORT",
           "THRESHOLD", "memory_budget_bytes"]
