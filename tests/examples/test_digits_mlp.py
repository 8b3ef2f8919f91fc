"""The digits example end to end, shortened: train an MLP with candle_web's autograd and AdamW
on scikit-learn's bundled digits, save it as safetensors, reload it (with candle_web and with
the safetensors library) and check >= 95% test accuracy."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "digits_mlp.py"
EPOCHS = 10  # the full example runs 40; 10 already reaches ~98% on this split
MIN_ACCURACY = 0.95
EXPECTED_SHAPES = {"fc1.weight": (128, 64), "fc1.bias": (128,),
                   "fc2.weight": (10, 128), "fc2.bias": (10,)}


def _load_example():
    spec = importlib.util.spec_from_file_location("digits_mlp_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _one_blas_thread():
    """Small matmuls gain nothing from BLAS threads, and on a shared 2-core machine OpenBLAS's
    spinning threads made each 64x128 matmul ~30x slower; limit them when threadpoolctl (a
    scikit-learn dependency) is there."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        import contextlib

        return contextlib.nullcontext()
    return threadpool_limits(limits=1, user_api="blas")


@pytest.fixture(scope="module")
def trained():
    pytest.importorskip("sklearn")
    example = _load_example()
    with _one_blas_thread():
        varmap, model, (x_test, y_test) = example.train(epochs=EPOCHS, log=None)
    return example, varmap, model, x_test, y_test


def test_training_reaches_the_target_accuracy(trained):
    example, _, model, x_test, y_test = trained
    assert len(x_test) == 359 and set(np.unique(y_test)) == set(range(10))
    assert example.accuracy(model, x_test, y_test) >= MIN_ACCURACY


def test_saved_weights_reload_with_candle_web_and_safetensors(trained, tmp_path):
    from safetensors.numpy import load_file

    example, varmap, model, x_test, y_test = trained
    path = tmp_path / "digits_mlp.safetensors"
    varmap.save(path)

    # The reference library sees exactly the four tensors, f32, with the trained values.
    weights = load_file(str(path))
    assert {name: array.shape for name, array in weights.items()} == EXPECTED_SHAPES
    for name, array in weights.items():
        assert array.dtype == np.float32
        np.testing.assert_array_equal(array, varmap.data()[name].to_numpy())

    # candle_web rebuilds the model from the file alone and scores the same.
    in_memory = example.accuracy(model, x_test, y_test)
    reloaded = example.evaluate_saved(path, x_test, y_test)
    assert reloaded == in_memory >= MIN_ACCURACY

    # An independent numpy forward pass over the library-loaded weights agrees.
    hidden = np.maximum(x_test @ weights["fc1.weight"].T + weights["fc1.bias"], 0.0)
    logits = hidden @ weights["fc2.weight"].T + weights["fc2.bias"]
    assert float(np.mean(logits.argmax(1) == y_test)) == pytest.approx(reloaded, abs=1.0 / len(y_test))
