"""Optimizers (Candle's `candle_nn::optim`): SGD and AdamW with Candle's defaults."""

from __future__ import annotations

from dataclasses import dataclass

from ..autograd import no_grad


class Optimizer:
    def step(self, grads) -> None:
        raise NotImplementedError

    def backward_step(self, loss) -> None:
        self.step(loss.backward())


class SGD(Optimizer):
    def __init__(self, variables, learning_rate: float):
        self.vars = list(variables)
        self.learning_rate = learning_rate

    def step(self, grads) -> None:
        with no_grad():
            for var in self.vars:
                grad = grads.get(var)
                if grad is not None:
                    var.set(var.sub(grad.affine(self.learning_rate, 0.0)))


@dataclass(frozen=True)
class ParamsAdamW:
    lr: float = 0.001
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.01


class AdamW(Optimizer):
    """Decoupled weight decay Adam (Loshchilov & Hutter), the same update as torch.optim.AdamW."""

    def __init__(self, variables, params: ParamsAdamW = ParamsAdamW()):
        self.vars = list(variables)
        self.params = params
        self.step_t = 0
        self._m = [var.zeros_like() for var in self.vars]
        self._v = [var.zeros_like() for var in self.vars]

    def learning_rate(self) -> float:
        return self.params.lr

    def set_learning_rate(self, lr: float) -> None:
        self.params = ParamsAdamW(lr, self.params.beta1, self.params.beta2, self.params.eps,
                                  self.params.weight_decay)

    def step(self, grads) -> None:
        p = self.params
        self.step_t += 1
        bias1 = 1.0 - p.beta1 ** self.step_t
        bias2 = 1.0 - p.beta2 ** self.step_t
        with no_grad():
            for i, var in enumerate(self.vars):
                grad = grads.get(var)
                if grad is None:
                    continue
                m = self._m[i].affine(p.beta1, 0.0).add(grad.affine(1.0 - p.beta1, 0.0))
                v = self._v[i].affine(p.beta2, 0.0).add(grad.sqr().affine(1.0 - p.beta2, 0.0))
                self._m[i], self._v[i] = m, v
                denom = v.affine(1.0 / bias2, 0.0).sqrt().affine(1.0, p.eps)
                update = m.affine(1.0 / bias1, 0.0).div(denom)
                decayed = var.affine(1.0 - p.lr * p.weight_decay, 0.0)
                var.set(decayed.sub(update.affine(p.lr, 0.0)))


