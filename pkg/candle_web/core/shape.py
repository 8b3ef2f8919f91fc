"""Shapes and dimension arguments.

`Shape` is a tuple subclass, so it compares equal to plain tuples and unpacks like one, with
Candle's helpers (`dims`, `rank`, `elem_count`, `dims4()`...). Dimension arguments accept
negative indices like Python (Candle's `D::Minus1`).
"""

from __future__ import annotations

import operator

from .errors import ShapeError, ShapeMismatch


def _show(dims) -> str:
    try:
        return str(list(dims))
    except TypeError:
        return repr(dims)


class Shape(tuple):
    """An immutable tuple of non-negative dimension sizes."""

    def __new__(cls, dims=()):
        if isinstance(dims, int):
            dims = (dims,)
        checked = []
        for d in dims:
            # operator.index accepts ints and numpy integers but rejects 2.5 or "3".
            try:
                size = operator.index(d)
            except TypeError:
                raise ShapeError(f"shape {_show(dims)}: dimension {d!r} is not an integer") from None
            if size < 0:
                raise ShapeError(f"shape {_show(dims)}: negative dimension {size}")
            checked.append(size)
        return super().__new__(cls, checked)

    @classmethod
    def _trusted(cls, dims: tuple) -> "Shape":
        """Wrap dims already known to be valid (a backend array's shape): the hot path behind
        `Tensor.shape`, skipping the per-dim checks of the public constructor."""
        return tuple.__new__(cls, dims)

    @property
    def dims(self) -> tuple:
        return tuple(self)

    @property
    def rank(self) -> int:
        return len(self)

    def elem_count(self) -> int:
        count = 1
        for d in self:
            count *= d
        return count

    def dims0(self):
        return self._dims_n(0)

    def dims1(self):
        return self._dims_n(1)[0]

    def dims2(self):
        return self._dims_n(2)

    def dims3(self):
        return self._dims_n(3)

    def dims4(self):
        return self._dims_n(4)

    def dims5(self):
        return self._dims_n(5)

    def _dims_n(self, n: int):
        if len(self) != n:
            raise ShapeError(f"expected a rank-{n} shape, got {list(self)} (rank {len(self)})")
        return tuple(self)

    def __repr__(self) -> str:
        return f"[{', '.join(str(d) for d in self)}]"


def resolve_dim(dim: int, rank: int, op: str = "op") -> int:
    """Map a possibly negative dim to 0..rank-1, naming the op on failure."""
    if not isinstance(dim, int):
        try:
            dim = operator.index(dim)  # numpy integers are fine, floats and strings are not
        except TypeError:
            raise ShapeError(f"{op}: dim must be an int, got {dim!r}") from None
    resolved = dim + rank if dim < 0 else dim
    if resolved < 0 or resolved >= rank:
        raise ShapeError(f"{op}: dim {dim} out of range for rank {rank}")
    return resolved


def resolve_dims(dims, rank: int, op: str = "op") -> tuple:
    if isinstance(dims, int):
        dims = (dims,)
    resolved = tuple(resolve_dim(d, rank, op) for d in dims)
    if len(set(resolved)) != len(resolved):
        raise ShapeError(f"{op}: repeated dims {list(dims)}")
    return resolved


def infer_reshape(target, elem_count: int, src_shape, op: str = "reshape") -> Shape:
    """Resolve a reshape target that may contain one -1 (Candle's `()` hole)."""
    if isinstance(target, int):
        target = (target,)
    target = [int(d) for d in target]
    holes = [i for i, d in enumerate(target) if d == -1]
    if len(holes) > 1:
        raise ShapeError(f"{op}: at most one inferred (-1) dim, got {target}")
    if any(d < -1 for d in target):
        raise ShapeError(f"{op}: negative dim in {target}")
    known = 1
    for d in target:
        if d != -1:
            known *= d
    if holes:
        if known == 0 or elem_count % known != 0:
            raise ShapeError(f"{op}: cannot reshape {list(src_shape)} ({elem_count} elements) into {target}")
        target[holes[0]] = elem_count // known
    elif known != elem_count:
        raise ShapeError(f"{op}: cannot reshape {list(src_shape)} ({elem_count} elements) "
                         f"into {target} ({known} elements)")
    return Shape(target)


def broadcast_shape(lhs, rhs, op: str = "broadcast"):
    """The numpy/Candle broadcast of two shapes, or ShapeMismatch naming both."""
    if tuple(lhs) == tuple(rhs):
        return Shape._trusted(tuple(lhs))
    rank = max(len(lhs), len(rhs))
    lhs_padded = (1,) * (rank - len(lhs)) + tuple(lhs)
    rhs_padded = (1,) * (rank - len(rhs)) + tuple(rhs)
    out = []
    for left, right in zip(lhs_padded, rhs_padded):
        if left == right or right == 1:
            out.append(left)
        elif left == 1:
            out.append(right)
        else:
            raise ShapeMismatch(f"{op}: shapes {list(lhs)} and {list(rhs)} cannot be broadcast")
    return Shape._trusted(tuple(out))
