"""SGD and AdamW against torch.optim on a small two-layer regression problem: after several
steps from the same start, the parameters must agree."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

from candle_web import Tensor, Var, nn
from candle_web.nn import SGD, AdamW, ParamsAdamW
from tests.nn.nn_testlib import assert_close

torch = pytest.importorskip("torch")

STEPS = 15
# Each step's update is computed in f32 on both sides from gradients that already differ by a
# few ulps (different matmul/reduction order); AdamW's division by sqrt(v) amplifies that where
# v is small. Measured after 15 steps: max |difference| 9e-8 (SGD), 2.4e-7 (AdamW, lr 0.05);
# the bound leaves ~10x headroom for other BLAS builds and backends.
RTOL_PARAMS = 1e-6
ATOL_PARAMS = 2e-6


def _problem():
    rng = np.random.default_rng(5)
    return {
        "x": rng.standard_normal((32, 6)).astype(np.float32),
        "y": rng.standard_normal((32, 2)).astype(np.float32),
        "w1": (rng.standard_normal((8, 6)) * 0.5).astype(np.float32),
        "b1": (rng.standard_normal(8) * 0.1).astype(np.float32),
        "w2": (rng.standard_normal((2, 8)) * 0.5).astype(np.float32),
    }


def _ours_loss(params, data):
    hidden = nn.Linear(params[0], params[1])(Tensor.from_numpy(data["x"])).tanh()
    return nn.loss.mse(nn.Linear(params[2])(hidden), Tensor.from_numpy(data["y"]))


def _theirs_loss(params, data):
    hidden = torch.tanh(torch.nn.functional.linear(torch.from_numpy(data["x"]), params[0], params[1]))
    return torch.nn.functional.mse_loss(torch.nn.functional.linear(hidden, params[2]),
                                        torch.from_numpy(data["y"]))


def _run_both(make_ours, make_theirs):
    data = _problem()
    names = ("w1", "b1", "w2")
    ours_params = [Var(data[n].copy()) for n in names]
    theirs_params = [torch.tensor(data[n], requires_grad=True) for n in names]
    ours_opt, theirs_opt = make_ours(ours_params), make_theirs(theirs_params)
    first_loss = None
    for _ in range(STEPS):
        ours_loss = _ours_loss(ours_params, data)
        first_loss = first_loss if first_loss is not None else ours_loss.to_scalar()
        ours_opt.backward_step(ours_loss)
        theirs_opt.zero_grad()
        _theirs_loss(theirs_params, data).backward()
        theirs_opt.step()
    for name, ours, theirs in zip(names, ours_params, theirs_params):
        assert_close(ours, theirs, RTOL_PARAMS, ATOL_PARAMS, f"{name} after {STEPS} steps")
    # The problem is not degenerate: training moved the parameters and lowered the loss.
    assert not np.allclose(ours_params[0].to_numpy(), data["w1"])
    assert _ours_loss(ours_params, data).to_scalar() < first_loss
    return ours_params


def test_sgd_matches_torch():
    lr = 0.1
    _run_both(lambda params: SGD(params, lr), lambda params: torch.optim.SGD(params, lr=lr))


def test_adamw_defaults_match_candle_and_torch():
    """Candle's ParamsAdamW::default(): lr 1e-3, betas 0.9/0.999, eps 1e-8, weight decay 0.01;
    torch.optim.AdamW's defaults are the same values (its weight_decay default is 1e-2)."""
    defaults = ParamsAdamW()
    assert (defaults.lr, defaults.beta1, defaults.beta2, defaults.eps, defaults.weight_decay) == \
        (1e-3, 0.9, 0.999, 1e-8, 0.01)
    torch_defaults = {name: p.default for name, p in
                      inspect.signature(torch.optim.AdamW.__init__).parameters.items()}
    assert torch_defaults["lr"] == defaults.lr
    assert tuple(torch_defaults["betas"]) == (defaults.beta1, defaults.beta2)
    assert torch_defaults["eps"] == defaults.eps
    assert torch_defaults["weight_decay"] == defaults.weight_decay


def test_adamw_with_defaults_matches_torch():
    _run_both(lambda params: AdamW(params), lambda params: torch.optim.AdamW(params))


def test_adamw_with_custom_hyper_parameters_matches_torch():
    # A large learning rate and weight decay make every term of the update visible.
    hyper = ParamsAdamW(lr=0.05, beta1=0.8, beta2=0.95, eps=1e-6, weight_decay=0.3)
    _run_both(lambda params: AdamW(params, hyper),
              lambda params: torch.optim.AdamW(params, lr=0.05, betas=(0.8, 0.95), eps=1e-6,
                                               weight_decay=0.3))


def test_learning_rate_can_be_changed_between_steps():
    data = _problem()
    ours_params = [Var(data[n].copy()) for n in ("w1", "b1", "w2")]
    theirs_params = [torch.tensor(data[n], requires_grad=True) for n in ("w1", "b1", "w2")]
    ours_opt, theirs_opt = AdamW(ours_params), torch.optim.AdamW(theirs_params)
    for step, lr in enumerate([0.01, 0.01, 0.002, 0.002]):
        ours_opt.set_learning_rate(lr)
        for group in theirs_opt.param_groups:
            group["lr"] = lr
        ours_opt.backward_step(_ours_loss(ours_params, data))
        theirs_opt.zero_grad()
        _theirs_loss(theirs_params, data).backward()
        theirs_opt.step()
    assert ours_opt.learning_rate() == 0.002
    for ours, theirs in zip(ours_params, theirs_params):
        assert_close(ours, theirs, RTOL_PARAMS, ATOL_PARAMS)


def test_vars_without_gradient_are_left_alone():
    used, unused = Var(np.ones(3, np.float32)), Var(np.full(3, 7.0, np.float32))
    for optimizer in (SGD([used, unused], 0.1), AdamW([used, unused])):
        optimizer.backward_step(used.sqr().sum_all())
        np.testing.assert_array_equal(unused.to_numpy(), np.full(3, 7.0, np.float32))
        assert np.all(used.to_numpy() < 1.0)


@pytest.mark.parametrize("dtype_name", ["f16", "bf16"])
def test_half_precision_vars_stay_half_and_follow_the_f32_run(dtype_name):
    """Moments are kept in f32; only the stored parameter is rounded to the half type."""
    from candle_web import DType

    half = DType.parse(dtype_name)
    start = np.linspace(-1.0, 1.0, 16, dtype=np.float32)
    target = Tensor.from_numpy(np.full(16, 0.25, np.float32))
    results = {}
    for dtype in (half, DType.parse("f32")):
        var = Var.from_tensor(Tensor.from_numpy(start).to_dtype(dtype))
        optimizer = AdamW([var], ParamsAdamW(lr=0.05))
        for _ in range(10):
            optimizer.backward_step(nn.loss.mse(var.to_dtype("f32"), target))
        assert var.dtype is dtype
        results[dtype.name] = var.to_numpy()
    # Ten rounded steps of size <= lr: the error stays within a few half-precision ulps of 1.
    tolerance = 0.02 if dtype_name == "bf16" else 0.003
    np.testing.assert_allclose(results[dtype_name], results["f32"], atol=tolerance)
