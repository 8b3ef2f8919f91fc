"""Comparison helper shared by the native-twin tests."""

from __future__ import annotations

import numpy as np


def assert_close(got, want, rel, what=""):
    """Max abs difference relative to the reference's largest magnitude (the scale at which f32
    rounding errors of reordered sums live); NaN/inf must sit at the same places."""
    got = np.asarray(got)
    want = np.asarray(want)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
    finite = np.isfinite(want)
    assert np.array_equal(finite, np.isfinite(got)), f"{what}: non-finite values differ"
    assert np.array_equal(got[~finite], want[~finite], equal_nan=True), f"{what}: inf/nan differ"
    if finite.any():
        scale = max(float(np.abs(want[finite]).max()), np.finfo(np.float32).tiny)
        err = float(np.abs(got[finite].astype(np.float64) - want[finite]).max()) / scale
        assert err <= rel, f"{what}: relative error {err:.3g} > {rel:.3g}"
