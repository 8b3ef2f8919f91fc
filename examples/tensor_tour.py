"""A short tour of the candle_web tensor API (what `make demo` runs natively until the
browser page is ready). Every line prints a Candle-style tensor."""

from __future__ import annotations

import candle_web as cw
from candle_web import nn


def main() -> None:
    a = cw.Tensor([[1.0, 2.0], [3.0, 4.0]])
    b = cw.Tensor.arange(0, 6, dtype=cw.f32).reshape(2, 3)
    print("a =", a, sep="\n")
    print("a.matmul(b) =", a.matmul(b), sep="\n")
    print("broadcast_add of a row:", b.broadcast_add(cw.Tensor([10.0, 20.0, 30.0])), sep="\n")
    print("narrow (a view):", b.narrow(1, 1, 2), sep="\n")
    print("i(.., 0):", b.i(slice(None), 0), sep="\n")
    print("sum_keepdim(1):", b.sum_keepdim(1), sep="\n")
    print("softmax_last_dim:", nn.ops.softmax_last_dim(b), sep="\n")
    print("to bf16 and back:", b.affine(0.1, 0.0).to_dtype(cw.bf16).to_dtype(cw.f32), sep="\n")
    try:
        a.add(b)
    except cw.ShapeMismatch as error:
        print("a + b with different shapes ->", error)
    w = cw.Var([[0.5, -0.5], [1.0, 2.0]])
    loss = w.matmul(a).sqr().sum_all()
    print("d loss / d w:", loss.backward()[w], sep="\n")


if __name__ == "__main__":
    main()
