"""Printing tensors the way Candle's `Display` does.

    [[0., 1., 2.],
     [3., 4., 5.]]
    Tensor[[2, 3], f32]

Candle follows PyTorch's printer: ", " between values, every value right-aligned to the widest
one, an "integer mode" (`42.`) when all finite non-zero floats are whole numbers, scientific
notation (`1.2340e-5`, Rust's exponent style) when magnitudes span more than 1000x or leave
[1e-4, 1e8], else four decimals. Above THRESHOLD elements only EDGE_ITEMS rows/values at each
end are shown, with "...".
"""

from __future__ import annotations

import math

import numpy as np

PRECISION = 4
THRESHOLD = 1000
EDGE_ITEMS = 3
LINE_WIDTH = 80
# Scientific mode triggers (Candle's FloatFormatter): ratio of extremes, largest, smallest.
SCI_RATIO = 1000.0
SCI_MAX = 1e8
SCI_MIN = 1e-4


def format_tensor(values: np.ndarray, dtype_name: str, is_float: bool) -> str:
    """`values` is the host array (bf16 already widened); returns Candle's Display text."""
    summarize = values.size > THRESHOLD
    shown = _shown_values(values, summarize)
    formatter = _FloatFormatter(shown) if is_float else _IntFormatter()
    width = max([1] + [len(formatter.format(v, 1)) for v in shown])
    body = _format_block(values, 1, width, summarize, formatter)
    return f"{body}\nTensor[{list(values.shape)}, {dtype_name}]"


def _shown_values(values: np.ndarray, summarize: bool) -> list:
    """The values that will be printed (edges only when summarizing), as a flat list."""
    if values.ndim == 0:
        return [values.item()]
    if summarize and values.shape[0] > 2 * EDGE_ITEMS:
        rows = list(range(EDGE_ITEMS)) + list(range(values.shape[0] - EDGE_ITEMS, values.shape[0]))
    else:
        rows = range(values.shape[0])
    if values.ndim == 1:
        return [values[i].item() for i in rows]
    shown = []
    for i in rows:
        shown.extend(_shown_values(values[i], summarize))
    return shown


def _format_block(values: np.ndarray, indent: int, width: int, summarize: bool, formatter) -> str:
    if values.ndim == 0:
        return "[" + formatter.format(values.item(), width) + "]"
    count = values.shape[0]
    truncated = summarize and count > 2 * EDGE_ITEMS
    if values.ndim == 1:
        if truncated:
            head = [formatter.format(v.item(), width) for v in values[:EDGE_ITEMS]]
            tail = [formatter.format(v.item(), width) for v in values[count - EDGE_ITEMS:]]
            return "[" + ", ".join(head + ["..."] + tail) + "]"
        per_line = max(1, LINE_WIDTH // (width + 2))
        parts = []
        for i, v in enumerate(values):
            if i > 0:
                parts.append(",\n" + " " * indent if i % per_line == 0 else ", ")
            parts.append(formatter.format(v.item(), width))
        return "[" + "".join(parts) + "]"
    separator = ",\n" + " " * indent
    if truncated:
        head = [_format_block(values[i], indent + 1, width, summarize, formatter)
                for i in range(EDGE_ITEMS)]
        tail = [_format_block(values[i], indent + 1, width, summarize, formatter)
                for i in range(count - EDGE_ITEMS, count)]
        # Candle writes "...", a newline and the indent, with no comma after the ellipsis.
        return ("[" + separator.join(head) + separator + "...\n" + " " * indent
                + separator.join(tail) + "]")
    rows = [_format_block(values[i], indent + 1, width, summarize, formatter) for i in range(count)]
    return "[" + separator.join(rows) + "]"


class _IntFormatter:
    def format(self, value, width: int) -> str:
        return str(int(value)).rjust(width)


class _FloatFormatter:
    def __init__(self, shown: list):
        magnitudes = [abs(v) for v in shown if math.isfinite(v) and v != 0]
        self.int_mode = all(math.ceil(v) == v for v in magnitudes)
        self.sci_mode = False
        if magnitudes:
            largest = max(magnitudes)
            smallest = min(magnitudes)
            self.sci_mode = largest / smallest > SCI_RATIO or largest > SCI_MAX or smallest < SCI_MIN

    def format(self, value: float, width: int) -> str:
        value = float(value)
        if not math.isfinite(value):
            return _rust_non_finite(value).rjust(width)
        if self.sci_mode:
            mantissa, exponent = f"{value:.{PRECISION}e}".split("e")
            return f"{mantissa}e{int(exponent)}".rjust(width)  # Rust: 1.2340e-5, not e-05
        if self.int_mode:
            return (f"{value:.0f}".rjust(width - 1)) + "."
        return f"{value:.{PRECISION}f}".rjust(width)


def _rust_non_finite(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    return "inf" if value > 0 else "-inf"
