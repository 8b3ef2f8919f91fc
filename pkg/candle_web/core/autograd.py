"""Reverse-mode automatic differentiation.

An op records its inputs and a backward closure on its output only when one of the inputs
tracks gradients (a `Var` or a tensor computed from one), so inference builds no graph.
`loss.backward()` walks the recorded graph once in reverse topological order and returns a
`GradStore` mapping each tracked tensor to its gradient.
"""

from __future__ import annotations

import contextlib

from .errors import CandleError

_grad_enabled = [True]


@contextlib.contextmanager
def no_grad():
    """Run ops without recording anything (also used while computing gradients)."""
    previous = _grad_enabled[0]
    _grad_enabled[0] = False
    try:
        yield
    finally:
        _grad_enabled[0] = previous


def is_tracking(*tensors) -> bool:
    if not _grad_enabled[0]:
        return False
    for t in tensors:
        if t is not None and t._track:
            return True
    return False


def record(out, parents, backward):
    """Attach `backward(grad_out) -> tuple of grads (one per parent, or None)` to `out`."""
    if is_tracking(*parents):
        out._track = True
        out._node = (backward, tuple(parents))
    return out


class GradStore:
    """Gradients by tensor, as returned by `Tensor.backward()` (Candle's `GradStore`)."""

    def __init__(self):
        self._grads = {}

    def get(self, tensor):
        entry = self._grads.get(id(tensor))
        return None if entry is None else entry[1]

    def __getitem__(self, tensor):
        grad = self.get(tensor)
        if grad is None:
            raise KeyError("no gradient for this tensor (it does not influence the loss)")
        return grad

    def __contains__(self, tensor) -> bool:
        return id(tensor) in self._grads

    def insert(self, tensor, grad):
        self._grads[id(tensor)] = (tensor, grad)

    def remove(self, tensor):
        entry = self._grads.pop(id(tensor), None)
        return None if entry is None else entry[1]

    def __len__(self) -> int:
        return len(self._grads)

    def tensors(self):
        return [entry[0] for entry in self._grads.values()]


def _topological_order(root):
    order = []
    seen = set()
    stack = [(root, False)]
    while stack:
        node, expanded = stack.pop()
        if expanded:
            order.append(node)
            continue
        if id(node) in seen:
            continue
        seen.add(id(node))
        stack.append((node, True))
        if node._node is not None:
            for parent in node._node[1]:
                if parent is not None and parent._track and id(parent) not in seen:
                    stack.append((parent, False))
    return order


def backward(root) -> GradStore:
    if not root._track:
        raise CandleError("backward: the tensor does not depend on any Var (nothing tracks gradients)")
    store = GradStore()
    grads = {id(root): root.ones_like()}
    with no_grad():
        for node in reversed(_topological_order(root)):
            grad = grads.pop(id(node), None)
            if grad is None:
                continue
            store.insert(node, grad)
            if node._node is None:
                continue
            backward_fn, parents = node._node
            parent_grads = backward_fn(grad)
            for parent, parent_grad in zip(parents, parent_grads):
                if parent is None or parent_grad is None or not parent._track:
                    continue
                if parent_grad.shape != parent.shape:
                    raise CandleError(
                        f"internal: gradient shape {list(parent_grad.shape)} != tensor shape "
                        f"{list(parent.shape)}")
                previous = grads.get(id(parent))
                grads[id(parent)] = parent_grad if previous is None else previous.add(parent_grad)
    return store
