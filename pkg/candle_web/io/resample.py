"""Band-limited polyphase resampling with a Kaiser-windowed sinc, in pure numpy (load_audio
brings every input to Whisper's 16 kHz through it)."""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from fractions import Fraction
from functools import lru_cache

import numpy as np

from ..core.errors import DTypeMismatch, ShapeError, UnsupportedError

SAMPLE_RATE = 16000  # Whisper's rate: the default target (io/audio.py re-exports it)

# Resampler design (Kaiser-windowed sinc). Frequencies are fractions of the lower of the two
# Nyquist rates: flat (ripple 1e-4) up to 90 %, at least 80 dB down from 100 %, so nothing
# above the new Nyquist folds back into the band. The cost is ~50 low-rate samples of filter
# on each side.
RESAMPLER_PASSBAND_EDGE = 0.90
RESAMPLER_STOPBAND_EDGE = 1.00
RESAMPLER_ATTENUATION_DB = 80.0
# The blocked-matmul path builds a [window, block] matrix of taps; when that would exceed this
# many elements (rates whose reduced ratio has large terms, e.g. 44056 Hz) a gather-based path
# that walks the polyphase table is used instead: slower, same numbers. It also bounds the band
# of polyphase rows the gather path evaluates at once (8 MB of float32).
RESAMPLER_MAX_KERNEL_ELEMENTS = 1 << 21
# A filter longer than this (both reduced ratio terms large and the rate very high, e.g.
# 176401 Hz) is refused: its memory is bounded, but its gain is a sum over every tap.
RESAMPLER_MAX_FILTER_TAPS = 1 << 24
RESAMPLER_CHUNK_ELEMENTS = 1 << 22  # input window elements per matmul chunk
# Gathered input elements per step of the gather path: its int64 index arrays take 8 MB.
RESAMPLER_GATHER_ELEMENTS = 1 << 20
# Taps evaluated per step (float64, with a handful of temporaries: a few MB).
RESAMPLER_TAP_CHUNK = 1 << 18
# Total bytes of tap tables kept between calls: four of the largest (8 MB) or dozens of the
# common rates' (44.1 kHz: 0.5 MB).
RESAMPLER_CACHE_BYTES = 32 << 20


def resample(samples, orig_sr: int, target_sr: int = SAMPLE_RATE) -> np.ndarray:
    """Band-limited resampling of float samples ([n] or [n, channels]) from orig_sr to target_sr.

    Output length is ceil(n * target_sr / orig_sr); output sample j sits at input time
    j * orig_sr / target_sr, and the signal is taken as zero outside [0, n).

    Memory is bounded whatever the ratio: no table of the whole filter is built (for a rate
    like 167001 Hz it would be 16.8 M taps, 134 MB); the taps are evaluated in chunks, and only
    for the filter phases the outputs use, so a short input at an odd rate costs little.
    """
    for label, rate in (("orig_sr", orig_sr), ("target_sr", target_sr)):
        if not isinstance(rate, (int, np.integer)) or rate <= 0:
            raise ShapeError(f"resample: {label} must be a positive integer, got {rate!r}")
    array = np.asarray(samples)
    if array.dtype.kind != "f":
        raise DTypeMismatch(f"resample: samples must be floating point, got {array.dtype}")
    if array.ndim == 2:
        columns = [resample(array[:, c], orig_sr, target_sr) for c in range(array.shape[1])]
        return np.stack(columns, axis=1) if columns else np.zeros((0, 0), np.float32)
    if array.ndim != 1:
        raise ShapeError(f"resample: samples must be [n] or [n, channels], got {array.shape}")
    signal = array.astype(np.float32, copy=True)
    if orig_sr == target_sr or signal.size == 0:
        return signal
    up, down = resampling_ratio(int(orig_sr), int(target_sr))
    half = _checked_half_length(up, down)
    if uses_blocked_matmul(up, down):
        return _resample_blocked(signal, up, down, _block_plan(up, down, half))
    return _resample_gathered(signal, up, down, half)


def uses_blocked_matmul(up: int, down: int) -> bool:
    """Whether the fast blocked path applies (its tap matrix stays small) for this ratio."""
    plan = _block_plan(up, down, filter_half_length(up, down))
    return plan["window"] * plan["block"] <= RESAMPLER_MAX_KERNEL_ELEMENTS


def resampling_ratio(orig_sr: int, target_sr: int) -> tuple[int, int]:
    """(up, down) in lowest terms with target_sr / orig_sr = up / down."""
    ratio = Fraction(int(target_sr), int(orig_sr))
    return ratio.numerator, ratio.denominator


def design_resampling_filter(up: int, down: int) -> tuple[np.ndarray, int]:
    """Kaiser-windowed sinc low-pass for the upsampled-by-``up`` rate: (taps float64, half).

    The taps are centred on index ``half`` (length 2*half+1) and sum to ``up``, which restores
    the gain lost by zero-stuffing, so each output has unit DC gain. :func:`resample` never
    builds this array (it evaluates the same taps in chunks); it is here for inspection and
    for checking against other implementations.
    """
    half = _checked_half_length(up, down)
    taps = np.empty(2 * half + 1)
    for start in range(0, taps.size, RESAMPLER_TAP_CHUNK):
        index = np.arange(start, min(taps.size, start + RESAMPLER_TAP_CHUNK), dtype=np.int64)
        taps[start:start + index.size] = _scaled_taps(index, up, down)
    taps.flags.writeable = False
    return taps, half


def _checked_half_length(up: int, down: int) -> int:
    # The filter's gain is a sum over all its taps, so the work of a ratio grows with the
    # filter's length even when its memory does not: refuse absurd lengths.
    half = filter_half_length(up, down)
    if 2 * half + 1 > RESAMPLER_MAX_FILTER_TAPS:
        raise UnsupportedError(
            f"resample: the ratio {up}/{down} needs a {2 * half + 1}-tap filter (more than "
            f"{RESAMPLER_MAX_FILTER_TAPS}, RESAMPLER_MAX_FILTER_TAPS); resample to a common "
            f"rate with another tool first")
    return half


def _filter_shape(up: int, down: int) -> tuple[float, float, int]:
    """(cutoff in cycles per upsampled sample, Kaiser beta, half length) of the design."""
    # In cycles per sample of the upsampled signal, the lower Nyquist is 0.5 / max(up, down).
    lower_nyquist = 0.5 / max(up, down)
    cutoff = 0.5 * (RESAMPLER_PASSBAND_EDGE + RESAMPLER_STOPBAND_EDGE) * lower_nyquist
    # Kaiser's design formulas: beta from the attenuation, length from attenuation and width.
    beta = 0.1102 * (RESAMPLER_ATTENUATION_DB - 8.7)
    return cutoff, beta, filter_half_length(up, down)


def _unscaled_taps(offsets: np.ndarray, up: int, down: int) -> np.ndarray:
    """The windowed sinc at integer ``offsets`` from the centre (|offset| <= half), float64."""
    cutoff, beta, half = _filter_shape(up, down)
    t = offsets.astype(np.float64)
    position = t / half if half else np.zeros_like(t)
    window = _kaiser_at(position, beta)
    return 2.0 * cutoff * np.sinc(2.0 * cutoff * t) * window


@lru_cache(maxsize=64)  # floats: a few bytes per ratio
def _filter_gain(up: int, down: int) -> float:
    """The factor that makes the taps sum to ``up``: up / (sum of the unscaled taps).

    Summed in chunks over one half of the symmetric filter, so its memory stays bounded."""
    half = filter_half_length(up, down)
    total = float(_unscaled_taps(np.zeros(1, np.int64), up, down)[0])
    for start in range(1, half + 1, RESAMPLER_TAP_CHUNK):
        offsets = np.arange(start, min(half + 1, start + RESAMPLER_TAP_CHUNK), dtype=np.int64)
        total += 2.0 * float(_unscaled_taps(offsets, up, down).sum())
    return up / total


def _scaled_taps(index: np.ndarray, up: int, down: int) -> np.ndarray:
    """taps[index] of :func:`design_resampling_filter` (zero outside 0..2*half), float64."""
    half = filter_half_length(up, down)
    inside = (index >= 0) & (index <= 2 * half)
    taps = _unscaled_taps(np.where(inside, index - half, 0), up, down)
    taps *= _filter_gain(up, down)
    taps[~inside] = 0.0
    return taps


def _taps_table(index_rows, n_rows: int, n_columns: int, up: int, down: int) -> np.ndarray:
    """A float32 [n_rows, n_columns] table of taps, ``index_rows(start, stop)`` giving the tap
    indices of rows start..stop; filled a few rows at a time so the float64 work arrays stay
    within RESAMPLER_TAP_CHUNK elements."""
    table = np.empty((n_rows, n_columns), dtype=np.float32)
    rows_per_chunk = max(1, RESAMPLER_TAP_CHUNK // max(1, n_columns))
    for start in range(0, n_rows, rows_per_chunk):
        stop = min(n_rows, start + rows_per_chunk)
        table[start:stop] = _scaled_taps(index_rows(start, stop), up, down)
    table.flags.writeable = False
    return table


def kaiser_window(length: int, beta: float) -> np.ndarray:
    """Kaiser window (same values as np.kaiser), float64.

    np.kaiser evaluates I0 with a slow general routine (~2 s for the million-tap filters of
    unusual rate ratios); the power series sum_k (x^2/4)^k / (k!)^2, summed by Horner's rule
    over the first half of the symmetric window, is a few dozen vector operations.
    """
    if length == 1:
        return np.ones(1)
    first_half = (length + 1) // 2
    position = 2.0 * np.arange(first_half) / (length - 1) - 1.0
    window = np.empty(length)
    window[:first_half] = _kaiser_at(position, beta)
    window[first_half:] = window[:length - first_half][::-1]
    return window


def _kaiser_at(position: np.ndarray, beta: float) -> np.ndarray:
    """The Kaiser window at positions in [-1, 1] (its ends), float64."""
    argument = beta * np.sqrt(np.clip(1.0 - position * position, 0.0, 1.0))
    return _bessel_i0(argument, beta) / _bessel_i0(np.array([beta]), beta)[0]


def _bessel_i0(x: np.ndarray, x_max: float) -> np.ndarray:
    """I0(x) for 0 <= x <= x_max by its power series, with as many terms as x_max needs."""
    quarter_square_max = 0.25 * x_max * x_max
    coefficients = [1.0]
    term, total, k = 1.0, 1.0, 1
    # Terms grow until k ~ x/2, then fall factorially; stop once they are below 1 ulp.
    while term > total * np.finfo(np.float64).eps:
        term *= quarter_square_max / (k * k)
        total += term
        coefficients.append(coefficients[-1] / (k * k))
        k += 1
    quarter_square = 0.25 * x * x
    result = np.full_like(x, coefficients[-1])
    for coefficient in reversed(coefficients[:-1]):
        result *= quarter_square
        result += coefficient
    return result


def filter_half_length(up: int, down: int) -> int:
    """Half the length of :func:`design_resampling_filter`'s taps, from Kaiser's formula."""
    transition = (RESAMPLER_STOPBAND_EDGE - RESAMPLER_PASSBAND_EDGE) * 0.5 / max(up, down)
    length = math.ceil((RESAMPLER_ATTENUATION_DB - 7.95) / (2.285 * 2.0 * math.pi * transition))
    return (length + 1) // 2


class _ByteBoundedCache:
    """A least-recently-used map of read-only arrays whose total size stays within a budget
    (an lru_cache bounds the count, not the bytes: 16 odd rates once held 2 GB of taps)."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self._items: OrderedDict = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()  # the server resamples from worker threads

    def get(self, key, build):
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key]
        value = build()
        if value.nbytes <= self.max_bytes:
            with self._lock:
                self._store(key, value)
        return value

    def _store(self, key, value) -> None:
        if key in self._items:
            return
        self._items[key] = value
        self._bytes += value.nbytes
        while self._bytes > self.max_bytes:
            _, evicted = self._items.popitem(last=False)
            self._bytes -= evicted.nbytes

    @property
    def nbytes(self) -> int:
        return self._bytes

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._bytes = 0


_TAP_TABLES = _ByteBoundedCache(RESAMPLER_CACHE_BYTES)


def _block_plan(up: int, down: int, half: int) -> dict:
    """Geometry of the blocked matmul (see :func:`_resample_blocked`)."""
    taps_per_output = max(1, (2 * half + 1) // up)
    # Group enough periods per row that the window is mostly useful taps, not zeros.
    periods_per_row = max(1, round(taps_per_output / down))
    block = periods_per_row * up
    first_input = -(half // up)  # ceil(-half / up): the first input the first output sees
    window = ((block - 1) * down + half) // up - first_input + 1
    return {"block": block, "row_stride": periods_per_row * down,
            "first_input": first_input, "window": window}


def _block_kernel(up: int, down: int) -> np.ndarray:
    """kernel[w, b]: weight of input (row start + w) in output b of a row; float32."""
    return _TAP_TABLES.get(("block", up, down), lambda: _build_block_kernel(up, down))


def _build_block_kernel(up: int, down: int) -> np.ndarray:
    half = filter_half_length(up, down)
    plan = _block_plan(up, down, half)
    b_index = np.arange(plan["block"], dtype=np.int64)[None, :]

    def index_rows(start: int, stop: int) -> np.ndarray:
        w_index = np.arange(start, stop, dtype=np.int64)[:, None]
        return half + b_index * down - (plan["first_input"] + w_index) * up

    return _taps_table(index_rows, plan["window"], plan["block"], up, down)


def _resample_blocked(signal: np.ndarray, up: int, down: int, plan: dict) -> np.ndarray:
    """y[j] = sum_i x[i] * taps[half + j*down - i*up], as one matmul over a strided view.

    Consecutive outputs are grouped into rows of ``block = k*up``: every row then starts
    ``k*down`` inputs after the previous one and meets the same filter phases, so one dense
    [window, block] matrix of taps serves all rows.
    """
    kernel = _block_kernel(up, down)
    block, window, row_stride = plan["block"], plan["window"], plan["row_stride"]
    n_in = signal.size
    n_out = -(-n_in * up // down)
    rows = -(-n_out // block)
    front = -plan["first_input"]
    padded = np.zeros(max((rows - 1) * row_stride + window, front + n_in), dtype=np.float32)
    padded[front:front + n_in] = signal
    itemsize = padded.itemsize
    windows = np.lib.stride_tricks.as_strided(
        padded, shape=(rows, window), strides=(row_stride * itemsize, itemsize), writeable=False)
    out = np.empty((rows, block), dtype=np.float32)
    chunk_rows = max(1, RESAMPLER_CHUNK_ELEMENTS // window)
    for start in range(0, rows, chunk_rows):
        stop = min(rows, start + chunk_rows)
        np.matmul(np.ascontiguousarray(windows[start:stop]), kernel, out=out[start:stop])
    return out.reshape(-1)[:n_out].copy()


def _resample_gathered(signal: np.ndarray, up: int, down: int, half: int) -> np.ndarray:
    """The same sum as :func:`_resample_blocked`, gathering each output's inputs and phase.

    Output j starts at input i0 = ceil((j*down - half) / up); with q = (half - j*down) mod up,
    its weights for inputs i0, i0+1, ... are taps[2*half - q - m*up] for m = 0, 1, ... (zero
    past the filter's start). q depends only on the residue r = j mod up, so the outputs are
    taken residue by residue: a band of residues' phase rows is evaluated (at most
    RESAMPLER_MAX_KERNEL_ELEMENTS taps), applied to every output with those residues, and
    dropped. Only the residues that occur (< n_out) are evaluated.
    """
    n_in = signal.size
    n_out = -(-n_in * up // down)
    taps_per_output = -(-(2 * half + 1) // up)
    front = half // up + 1
    padded = np.zeros(front + n_in + taps_per_output + 1, dtype=np.float32)
    padded[front:front + n_in] = signal
    out = np.empty(n_out, dtype=np.float32)
    n_residues = min(up, n_out)
    band = max(1, RESAMPLER_MAX_KERNEL_ELEMENTS // taps_per_output)
    for first_residue in range(0, n_residues, band):
        residues = np.arange(first_residue, min(n_residues, first_residue + band), dtype=np.int64)
        phases = _phase_rows(residues, up, down, half, taps_per_output)
        _apply_phases(out, padded, front, residues, phases, up, down, half)
    return out


def _phase_rows(residues: np.ndarray, up: int, down: int, half: int,
                taps_per_output: int) -> np.ndarray:
    """phases[r, m] = taps[2*half - q_r - m*up] for the given residues, float32."""
    m_index = np.arange(taps_per_output, dtype=np.int64)[None, :]

    def index_rows(start: int, stop: int) -> np.ndarray:
        q = (half - residues[start:stop] * down) % up
        return 2 * half - q[:, None] - m_index * up

    def build() -> np.ndarray:
        return _taps_table(index_rows, residues.size, taps_per_output, up, down)

    if residues.size == up:  # the whole table: worth keeping for the next call
        return _TAP_TABLES.get(("phases", up, down), build)
    return build()


def _apply_phases(out: np.ndarray, padded: np.ndarray, front: int, residues: np.ndarray,
                  phases: np.ndarray, up: int, down: int, half: int) -> None:
    """out[j] for every j = residue + k*up < out.size, in chunks of bounded size."""
    n_out = out.size
    taps_per_output = phases.shape[1]
    m_index = np.arange(taps_per_output, dtype=np.int64)
    n_periods = -(-(n_out - int(residues[0])) // up)
    periods_per_chunk = max(1, RESAMPLER_GATHER_ELEMENTS // (residues.size * taps_per_output))
    last_input = padded.size - taps_per_output  # where a window that starts in bounds ends
    for start in range(0, n_periods, periods_per_chunk):
        periods = np.arange(start, min(n_periods, start + periods_per_chunk), dtype=np.int64)
        j = periods[:, None] * up + residues[None, :]  # [periods, residues]
        first = -((half - j * down) // up)  # ceil((j*down - half) / up)
        # Outputs past the end (j >= n_out) fill out the grid; their windows are clamped into
        # the buffer and their results dropped.
        begin = np.minimum(first + front, last_input)
        inputs = padded[begin[..., None] + m_index]  # [periods, residues, taps]
        values = np.einsum("prm,rm->pr", inputs, phases)
        keep = j < n_out
        out[j[keep]] = values[keep]
