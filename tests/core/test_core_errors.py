"""Typed errors with messages naming the op and the offending values; inference builds no
graph; `import candle_web` loads nothing beyond the standard library and numpy."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from candle_web import (CandleError, DTypeMismatch, IndexOutOfRange, ShapeError, ShapeMismatch, Tensor,
                        Var, bf16, f64, i64, no_grad)


def _t(shape, device, dtype=None):
    return Tensor.zeros(shape, dtype or "f32", device)


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div", "maximum", "minimum", "eq", "lt"])
def test_same_shape_ops_name_op_and_both_shapes(op, device):
    with pytest.raises(ShapeMismatch) as err:
        getattr(_t((2, 3), device), op)(_t((3, 2), device))
    message = str(err.value)
    assert op in message and "[2, 3]" in message and "[3, 2]" in message and f"broadcast_{op}" in message


def test_shape_mismatch_messages(device):
    cases = [
        (lambda: _t((2, 3), device) + _t((2, 4), device), ["add", "[2, 3]", "[2, 4]"]),
        (lambda: _t((2, 3), device).broadcast_add(_t((4,), device)), ["broadcast_add", "[2, 3]", "[4]"]),
        (lambda: _t((2, 3), device).matmul(_t((4, 5), device)), ["matmul", "[2, 3]", "[4, 5]"]),
        (lambda: _t((2, 2, 3), device).matmul(_t((3, 3, 4), device)), ["matmul", "[2, 2, 3]", "[3, 3, 4]"]),
        (lambda: _t((2, 1, 3), device).broadcast_matmul(_t((3, 3, 4), device)), ["broadcast_matmul"]),
        (lambda: Tensor.cat([_t((2, 3), device), _t((2, 4), device)], 0), ["cat", "[2, 3]", "[2, 4]"]),
        (lambda: Tensor.stack([_t((2, 3), device), _t((3, 2), device)], 0), ["stack", "[2, 3]", "[3, 2]"]),
        (lambda: _t((3, 1), device).broadcast_as((2, 4)), ["broadcast_as", "[3, 1]", "[2, 4]"]),
        (lambda: _t((1, 4, 9), device).conv1d(_t((2, 3, 3), device)), ["conv1d", "[1, 4, 9]", "[2, 3, 3]"]),
        (lambda: _t((1, 2, 5, 5), device).conv2d(_t((2, 2, 3), device)), ["conv2d", "rank-4"]),
        (lambda: _t((2, 3), device, "u8").where_cond(_t((2, 2), device), _t((2, 2), device)),
         ["where_cond", "[2, 3]", "[2, 2]"]),
        (lambda: _t((3, 4), device).gather(_t((2, 5), device, "i64"), 1), ["gather", "[2, 5]", "[3, 4]"]),
        (lambda: _t((3, 4), device).scatter_add(_t((4, 2), device, "i64"), _t((4, 2), device), 1),
         ["scatter_add", "[4, 2]", "[3, 4]"]),
        (lambda: _t((3, 4), device).index_add(_t((2,), device, "i64"), _t((3, 4), device), 0),
         ["index_add", "[3, 4]", "[2, 4]"]),
        (lambda: Var.zeros((2, 2)).set(_t((3,), device)), ["Var.set", "[2, 2]", "[3]"]),
    ]
    for action, fragments in cases:
        with pytest.raises(ShapeMismatch) as err:
            action()
        for fragment in fragments:
            assert fragment in str(err.value), (fragment, str(err.value))


def test_dtype_mismatch_messages(device):
    with pytest.raises(DTypeMismatch) as err:
        _t((2,), device).add(_t((2,), device, f64))
    assert "add" in str(err.value) and "f32" in str(err.value) and "f64" in str(err.value)
    with pytest.raises(DTypeMismatch, match=r"matmul.*f32.*bf16"):
        _t((2, 2), device).matmul(_t((2, 2), device, bf16))
    with pytest.raises(DTypeMismatch, match=r"exp: needs a float tensor, got i64"):
        _t((2,), device, i64).exp()
    with pytest.raises(DTypeMismatch, match=r"index_select: indexes must be u8/u32/i64, got f32"):
        _t((3, 2), device).index_select(_t((2,), device), 0)
    with pytest.raises(DTypeMismatch, match=r"where_cond: the mask must be u8/u32/i64, got f32"):
        _t((2,), device).where_cond(_t((2,), device), _t((2,), device))
    with pytest.raises(DTypeMismatch, match=r"unknown dtype 'f8'"):
        _t((2,), device).to_dtype("f8")
    with pytest.raises(DTypeMismatch, match=r"complex128"):
        Tensor.from_numpy(np.zeros(2, dtype=np.complex128), dtype="f32")
    with pytest.raises(DTypeMismatch, match=r"uint16"):
        Tensor.from_numpy(np.zeros(2, dtype=np.uint16))  # ambiguous: bits of bf16 or integers?


def test_index_out_of_range_messages(device):
    t = Tensor.from_numpy(np.arange(12.0).reshape(3, 4), device=device)
    with pytest.raises(IndexOutOfRange, match=r"i: index 3 out of range for dim 0 of size 3"):
        t.i(3)
    with pytest.raises(IndexOutOfRange, match=r"index -5 out of range for dim 1 of size 4"):
        t.i(0, -5)
    with pytest.raises(IndexOutOfRange, match=r"3 indices for a tensor of rank 2"):
        t.i(0, 0, 0)
    ids = Tensor.from_numpy(np.array([0, 7]), device=device)
    with pytest.raises(IndexOutOfRange, match=r"index_select: index 7 out of range for dim 0 of size 3"):
        t.index_select(ids, 0)
    with pytest.raises(IndexOutOfRange, match=r"gather: index 7 out of range"):
        t.gather(Tensor.from_numpy(np.array([[0, 7, 1, 1]] * 3), device=device), 1)
    with pytest.raises(IndexOutOfRange, match=r"embedding|index_select"):
        t.embedding(Tensor.from_numpy(np.array([[5]]), device=device))
    with pytest.raises(IndexOutOfRange):
        t.i(slice(None), [0, 9])
    assert isinstance(IndexOutOfRange("x"), IndexError)  # also a plain Python IndexError


def test_bad_reshape_and_bad_dims(device):
    t = _t((2, 3), device)
    with pytest.raises(ShapeError, match=r"reshape: cannot reshape \[2, 3\] \(6 elements\) into \[4, 2\]"):
        t.reshape(4, 2)
    with pytest.raises(ShapeError, match=r"at most one inferred"):
        t.reshape(-1, -1)
    with pytest.raises(ShapeError, match=r"cannot reshape \[2, 3\]"):
        t.reshape(4, -1)
    with pytest.raises(ShapeError, match=r"transpose: dim 2 out of range for rank 2"):
        t.transpose(0, 2)
    with pytest.raises(ShapeError, match=r"sum: dim -3 out of range for rank 2"):
        t.sum(-3)
    with pytest.raises(ShapeError, match=r"permute: repeated dims"):
        t.permute(0, 0)
    with pytest.raises(ShapeError, match=r"permute: 3 dims given for a rank-2 tensor"):
        t.permute(0, 1, 2)
    with pytest.raises(ShapeError, match=r"narrow: start 2 \+ length 2 out of range for dim 1 of size 3"):
        t.narrow(1, 2, 2)
    with pytest.raises(ShapeError, match=r"dim must be an int"):
        t.squeeze(1.5)
    with pytest.raises(ShapeError, match=r"negative dimension -1"):
        Tensor.zeros((-1, 3))
    with pytest.raises(ShapeError, match=r"not an integer"):
        Tensor.ones((2.5,))
    with pytest.raises(ShapeError, match=r"rectangular"):
        Tensor([[1, 2], [3]])
    with pytest.raises(ShapeError, match=r"to_scalar: expected a rank-0 tensor, got shape \[2, 3\]"):
        t.to_scalar()
    with pytest.raises(ShapeError, match=r"max: cannot reduce over dim 0 of size 0"):
        _t((0, 3), device).max(0)
    with pytest.raises(ShapeError, match=r"argmax: cannot reduce over dim 1 of size 0"):
        _t((2, 0), device).argmax(1)
    with pytest.raises(ShapeError, match=r"chunk: chunks must be positive"):
        t.chunk(0, 0)
    with pytest.raises(ShapeError, match=r"conv1d: input length 2 too short for kernel 3"):
        _t((1, 1, 2), device).conv1d(_t((1, 1, 3), device))
    with pytest.raises(ShapeError, match=r"groups=2"):
        _t((1, 3, 8), device).conv1d(_t((2, 1, 3), device), groups=2)
    with pytest.raises(CandleError, match=r"arange_step: step must not be zero"):
        Tensor.arange_step(0, 3, 0)
    # Every one of these is also the library's base error.
    assert issubclass(ShapeError, CandleError) and issubclass(ShapeMismatch, CandleError)


def test_backward_errors(device):
    with pytest.raises(CandleError, match=r"backward: the tensor does not depend on any Var"):
        _t((2,), device).sum_all().backward()
    grads = Var.ones((2,)).sum_all().backward()
    with pytest.raises(KeyError):
        grads[_t((2,), device)]


def test_inference_builds_no_graph(device):
    a = Tensor.from_numpy(np.ones((2, 3)), device=device)
    b = Tensor.from_numpy(np.ones((3, 2)), device=device)
    results = [a.matmul(b), a.exp(), a + a, a.broadcast_mul(a.i(0)), a.sum(1), a.t(), a.narrow(1, 0, 2),
               a.reshape(6), Tensor.cat([a, a], 0), a.index_select(Tensor([0, 0]), 0), a.max(0),
               a.unsqueeze(0).conv1d(Tensor.ones((1, 2, 1), f64)),
               a.log_sum_exp(1), a.var(0), a.to_dtype("f32"), a.powf(2.0), a.clamp(0.0, 1.0)]
    for out in results:
        assert out._node is None and not out.track_op()
    var = Var(np.ones((2, 3)), device=device)
    tracked = var.exp().sum_all()
    assert tracked._node is not None and tracked.track_op()
    with no_grad():
        untracked = var.exp().sum_all()
    assert untracked._node is None and not untracked.track_op()
    assert var.exp().detach()._node is None
    # no_grad restores the previous state, even after an exception.
    with pytest.raises(RuntimeError):
        with no_grad():
            raise RuntimeError("boom")
    assert var.exp()._node is not None


def test_import_pulls_in_only_stdlib_and_numpy():
    # A fresh interpreter: the test process already has torch etc. loaded.
    package_root = Path(__file__).resolve().parents[2] / "pkg"
    script = ("import sys, json; import candle_web; "
              "print(json.dumps(sorted(name.split('.')[0] for name in sys.modules)))")
    env = dict(os.environ)
    env["PYTHONPATH"] = str(package_root) + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True)
    top_level = set(json.loads(out.stdout))
    stdlib = set(sys.stdlib_module_names) | {"__main__", "_distutils_hack", "sitecustomize", "usercustomize"}
    third_party = {name for name in top_level if name not in stdlib and not name.startswith("_")}
    assert third_party <= {"numpy", "candle_web"}, sorted(third_party)
    for forbidden in ("scipy", "torch", "numba", "cupy", "tokenizers", "soundfile", "candle_native"):
        assert forbidden not in top_level
