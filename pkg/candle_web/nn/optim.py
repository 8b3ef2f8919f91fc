"""Optimizers (Candle's `candle_nn::optim`): SGD and AdamW with Candle's defaults."""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial

from ..core.autograd import no_grad
from ..core.tensor import custom_op


class Optimizer:
    def step(self, grads) -> None:
        raise NotImplementedError

    def backward_step(self, loss) -> None:
        self.step(loss.backward())


class SGD(Optimizer):
    """Plain gradient descent: var <- var - lr * grad."""

    def __init__(self, variables, learning_rate: float):
        self.vars = list(variables)
        self.learning_rate = learning_rate

    def step(self, grads) -> None:
        for var in self.vars:
            grad = grads.get(var)
            if grad is not None:
                with no_grad():  # the update itself is not part of any graph
                    var.set(custom_op(lambda backend, value, g: value - g * self.learning_rate,
                                      var, grad))


@dataclass(frozen=True)
class ParamsAdamW:
    lr: float = 0.001
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.01


class AdamW(Optimizer):
    """Decoupled weight decay Adam (Loshchilov & Hutter), Candle's update:
    m <- b1 m + (1 - b1) g;  v <- b2 v + (1 - b2) g^2
    var <- var (1 - lr wd) - lr (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps),
    the same as torch.optim.AdamW up to rounding.

    The update works on the backend arrays directly (numpy or cupy, in place for the moment
    estimates) instead of composing Tensor ops: it is pure elementwise state keeping that
    autograd must not see, and a dozen Tensor dispatches per parameter were half of the ops
    of a small training step. Half-precision vars keep their moments in f32.
    """

    def __init__(self, variables, params: ParamsAdamW = ParamsAdamW()):
        self.vars = list(variables)
        self.params = params
        self.step_t = 0
        self._m = [None] * len(self.vars)  # first moments, created on a var's first gradient
        self._v = [None] * len(self.vars)  # second moments

    def learning_rate(self) -> float:
        return self.params.lr

    def set_learning_rate(self, lr: float) -> None:
        self.params = replace(self.params, lr=lr)

    def step(self, grads) -> None:
        p = self.params
        self.step_t += 1
        scale_m = 1.0 / (1.0 - p.beta1 ** self.step_t)
        scale_v = 1.0 / (1.0 - p.beta2 ** self.step_t)
        for i, var in enumerate(self.vars):
            grad = grads.get(var)
            if grad is None:
                continue
            with no_grad():  # the update itself is not part of any graph
                var.set(custom_op(partial(self._update, i, scale_m, scale_v), var, grad))

    def _update(self, i, scale_m, scale_v, backend, value, g):
        """The new value of var i from its compute array and gradient; keeps the moments."""
        p = self.params
        xp = backend.xp
        if self._m[i] is None:
            self._m[i] = xp.zeros_like(g)
            self._v[i] = xp.zeros_like(g)
        m, v = self._m[i], self._v[i]
        m *= p.beta1
        m += g * (1.0 - p.beta1)
        v *= p.beta2
        v += (g * g) * (1.0 - p.beta2)
        denom = xp.sqrt(v * scale_v)
        denom += p.eps
        adjusted = (m * scale_m) / denom
        updated = value * (1.0 - p.lr * p.weight_decay)
        updated -= adjusted * p.lr
        return updated
