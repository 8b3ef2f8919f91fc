"""Train a small MLP on scikit-learn's bundled digits (8x8 images, 10 classes) with
candle_web's own autograd and AdamW, save it as safetensors, reload it and evaluate.

    python examples/digits_mlp.py [--epochs 40] [--out digits_mlp.safetensors]

The data set ships inside scikit-learn (no download). Only the data loading uses sklearn;
everything else is candle_web.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import candle_web as cw
from candle_web import nn

HIDDEN = 128
N_CLASSES = 10
TEST_FRACTION = 0.2


class Mlp(nn.Module):
    def __init__(self, vb: nn.VarBuilder, in_dim: int = 64, hidden: int = HIDDEN):
        self.fc1 = nn.linear(in_dim, hidden, vb.pp("fc1"))
        self.fc2 = nn.linear(hidden, N_CLASSES, vb.pp("fc2"))

    def forward(self, x: cw.Tensor) -> cw.Tensor:
        return self.fc2(self.fc1(x).relu())


def load_digits_split(seed: int = 0):
    """(x_train, y_train, x_test, y_test) as float32 pixels scaled to [0, 1] and u32 labels."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.uint32)
    order = np.random.default_rng(seed).permutation(len(x))
    n_test = int(len(x) * TEST_FRACTION)
    test, train = order[:n_test], order[n_test:]
    return x[train], y[train], x[test], y[test]


def accuracy(model: Mlp, x: np.ndarray, y: np.ndarray) -> float:
    with cw.no_grad():
        predicted = model(cw.Tensor.from_numpy(x)).argmax(1).to_numpy()
    return float(np.mean(predicted == y))


def train(epochs: int = 40, batch_size: int = 64, lr: float = 3e-3, seed: int = 0, log=print):
    cw.manual_seed(seed)
    x_train, y_train, x_test, y_test = load_digits_split(seed)
    varmap = nn.VarMap()
    model = Mlp(nn.VarBuilder.from_varmap(varmap))
    optimizer = nn.AdamW(varmap.all_vars(), nn.ParamsAdamW(lr=lr))
    rng = np.random.default_rng(seed)
    for epoch in range(epochs):
        order = rng.permutation(len(x_train))
        total = 0.0
        for start in range(0, len(order), batch_size):
            batch = order[start:start + batch_size]
            logits = model(cw.Tensor.from_numpy(x_train[batch]))
            loss = nn.loss.cross_entropy(logits, cw.Tensor.from_numpy(y_train[batch]))
            optimizer.backward_step(loss)
            total += loss.to_scalar() * len(batch)
        if log and (epoch % 10 == 9 or epoch == epochs - 1):
            log(f"epoch {epoch + 1:3d}  loss {total / len(order):.4f}  "
                f"test accuracy {accuracy(model, x_test, y_test):.4f}")
    return varmap, model, (x_test, y_test)


def evaluate_saved(path: Path, x_test: np.ndarray, y_test: np.ndarray) -> float:
    """Rebuild the model from the safetensors file alone and measure test accuracy."""
    vb = nn.VarBuilder.from_safetensors(str(path))
    return accuracy(Mlp(vb), x_test, y_test)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--out", type=Path, default=None, help="where to save the weights")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    varmap, _, (x_test, y_test) = train(args.epochs)
    out = args.out or Path(tempfile.mkdtemp()) / "digits_mlp.safetensors"
    varmap.save(out)
    reloaded = evaluate_saved(out, x_test, y_test)
    print(f"saved {out} ({out.stat().st_size} bytes); reloaded test accuracy {reloaded:.4f}; "
          f"{time.perf_counter() - started:.1f} s")
    return 0 if reloaded >= 0.95 else 1


if __name__ == "__main__":
    sys.exit(main())
