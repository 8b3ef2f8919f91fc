"""Variable initialisations for VarMap-backed builders (Candle's `candle_nn::init`)."""

from __future__ import annotations

import math

from ..core.tensor import Tensor


class Init:
    def make(self, shape, dtype, device) -> Tensor:
        raise NotImplementedError


class Const(Init):
    def __init__(self, value: float):
        self.value = value

    def make(self, shape, dtype, device):
        return Tensor.full(self.value, shape, dtype, device)


class Randn(Init):
    def __init__(self, mean: float, stdev: float):
        self.mean, self.stdev = mean, stdev

    def make(self, shape, dtype, device):
        return Tensor.randn(self.mean, self.stdev, shape, dtype, device)


class Uniform(Init):
    def __init__(self, lo: float, up: float):
        self.lo, self.up = lo, up

    def make(self, shape, dtype, device):
        return Tensor.rand(self.lo, self.up, shape, dtype, device)


class Kaiming(Init):
    """He initialisation from the fan-in (dims after the first), normal or uniform, with the
    ReLU gain sqrt(2) like Candle's DEFAULT_KAIMING_NORMAL."""

    def __init__(self, normal: bool = True, gain: float = math.sqrt(2.0)):
        self.normal, self.gain = normal, gain

    def make(self, shape, dtype, device):
        fan_in = 1
        for d in tuple(shape)[1:]:
            fan_in *= d
        std = self.gain / math.sqrt(max(fan_in, 1))
        if self.normal:
            return Tensor.randn(0.0, std, shape, dtype, device)
        bound = math.sqrt(3.0) * std
        return Tensor.rand(-bound, bound, shape, dtype, device)


DEFAULT_KAIMING_NORMAL = Kaiming(normal=True)
DEFAULT_KAIMING_UNIFORM = Kaiming(normal=False)
ZERO = Const(0.0)
ONE = Const(1.0)
