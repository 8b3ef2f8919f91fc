"""Helpers shared by the tests/core modules (not a test module itself)."""
from __future__ import annotations

import numpy as np

from candle_web import Tensor


def away_from(values: np.ndarray, points, margin: float) -> np.ndarray:
    """Push values at least `margin` away from each of `points` (kinks of abs, relu, floor...),
    so that finite differences and the reference agree on which side of the kink we are."""
    values = values.copy()
    for p in points:
        close = np.abs(values - p) < margin
        values[close] = p + np.where(values[close] >= p, margin, -margin)
    return values


def away_from_integers(values: np.ndarray, margin: float) -> np.ndarray:
    fraction = values - np.floor(values)
    fraction = np.clip(fraction, margin, 1.0 - margin)
    return np.floor(values) + fraction


def as_np(t: Tensor) -> np.ndarray:
    return t.to_numpy()
