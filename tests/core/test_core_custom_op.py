"""The core's public kernel entry (`custom_op`, `storage`, `from_storage`): what nn/, quantized/
and the caches use instead of the Tensor's private fields."""

from __future__ import annotations

import numpy as np
import pytest

import candle_web as cw
from candle_web import Tensor, Var, custom_op


def cube(backend, a):
    return a * a * a


def test_forward_runs_the_kernel_on_compute_arrays_and_keeps_the_dtype():
    x = Tensor([[1.0, -2.0], [0.5, 3.0]]).to_dtype(cw.f16)
    seen = []

    def kernel(backend, a):
        seen.append(a.dtype)
        return cube(backend, a)

    out = custom_op(kernel, x)
    assert seen == [np.float32]  # f16 widened for the kernel
    assert out.dtype is cw.f16 and out.dims() == (2, 2)
    np.testing.assert_array_equal(out.to_dtype(cw.f32).to_numpy(),
                                  np.array([[1.0, -8.0], [0.125, 27.0]], np.float32))


def test_none_inputs_pass_through_and_dtype_can_change():
    x = Tensor([1.0, 2.0])
    out = custom_op(lambda backend, a, missing: (a > 1.5).astype(np.uint8), x, None, dtype=cw.u8)
    assert out.dtype is cw.u8 and out.to_list() == [0, 1]


def test_backward_joins_the_graph_with_the_results_alias():
    w = Var(Tensor([1.0, 2.0, 3.0]))
    received = []

    def backward(grad, out):
        received.append(out)
        return (grad.mul(w.detach().sqr()).affine(3.0, 0.0),)  # d(w^3) = 3 w^2

    loss = custom_op(cube, w, backward=backward).sum_all()
    grads = loss.backward()
    np.testing.assert_allclose(grads[w].to_numpy(), [3.0, 12.0, 27.0])
    assert received[0].to_list() == [1.0, 8.0, 27.0]
    assert received[0]._node is None  # an alias without graph links: no reference cycle


def test_a_tracked_input_without_backward_is_an_error():
    with pytest.raises(cw.CandleError, match="no backward"):
        custom_op(cube, Var(Tensor([1.0])))
    with cw.no_grad():  # what optimizers do: no graph, so no backward needed
        assert custom_op(cube, Var(Tensor([2.0]))).to_list() == [8.0]


def test_storage_round_trip_shares_memory_and_checks_the_dtype():
    t = Tensor([1.0, 2.0]).to_dtype(cw.bf16)
    raw = t.storage()
    assert raw.dtype == np.uint16  # bf16 is stored as its bits
    again = Tensor.from_storage(raw, cw.bf16, t.device)
    assert again.to_dtype(cw.f32).to_list() == [1.0, 2.0]
    raw[0] = raw[1]  # writes through: the in-place buffers of KV caches rely on it
    assert again.to_dtype(cw.f32).to_list() == [2.0, 2.0]
    with pytest.raises(cw.DTypeMismatch, match="stored as uint16"):
        Tensor.from_storage(np.zeros(2, np.float32), cw.bf16, t.device)
