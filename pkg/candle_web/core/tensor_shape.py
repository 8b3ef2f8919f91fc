"""Shape ops of `Tensor` (a mixin): reshape, transpose, narrow, indexing views, cat/stack...

All of these return views when the layout allows it (numpy/cupy strides), and record a
backward closure only when an input tracks gradients.
"""

from __future__ import annotations

import numpy as np

from .autograd import is_tracking, record
from .errors import CandleError, IndexOutOfRange, ShapeError, ShapeMismatch
from .shape import Shape, infer_reshape, resolve_dim, resolve_dims


class ShapeOps:
    __slots__ = ()

    def _view(self, data):
        return self._wrap(data, self.dtype, self.device)

    def reshape(self, *shape) -> "Tensor":
        if len(shape) == 1 and not isinstance(shape[0], int):
            shape = tuple(shape[0])
        target = infer_reshape(shape, self.elem_count(), self.shape)
        out = self._view(self._data.reshape(tuple(target)))
        source_shape = self.shape
        return record(out, (self,), lambda g: (g.reshape(source_shape),))

    def flatten(self, start_dim: int = 0, end_dim: int = -1) -> "Tensor":
        if self.rank == 0:
            return self.reshape(1)
        start = resolve_dim(start_dim, self.rank, "flatten")
        end = resolve_dim(end_dim, self.rank, "flatten")
        if start > end:
            raise ShapeError(f"flatten: start_dim {start_dim} after end_dim {end_dim}")
        dims = self.dims()
        merged = 1
        for d in dims[start:end + 1]:
            merged *= d
        return self.reshape(dims[:start] + (merged,) + dims[end + 1:])

    def flatten_all(self) -> "Tensor":
        return self.reshape(-1)

    def flatten_to(self, end_dim: int) -> "Tensor":
        return self.flatten(0, end_dim)

    def flatten_from(self, start_dim: int) -> "Tensor":
        return self.flatten(start_dim, -1)

    def squeeze(self, dim: int) -> "Tensor":
        """Remove `dim` if it has size 1 (Candle leaves other sizes unchanged)."""
        d = resolve_dim(dim, self.rank, "squeeze")
        if self.dims()[d] != 1:
            return self
        dims = self.dims()
        return self.reshape(dims[:d] + dims[d + 1:])

    def unsqueeze(self, dim: int) -> "Tensor":
        d = resolve_dim(dim, self.rank + 1, "unsqueeze")
        dims = self.dims()
        return self.reshape(dims[:d] + (1,) + dims[d:])

    def permute(self, *dims) -> "Tensor":
        if len(dims) == 1 and not isinstance(dims[0], int):
            dims = tuple(dims[0])
        if len(dims) != self.rank:
            raise ShapeError(f"permute: {len(dims)} dims given for a rank-{self.rank} tensor")
        order = resolve_dims(dims, self.rank, "permute")
        out = self._view(self._data.transpose(order))
        inverse = [0] * len(order)
        for i, axis in enumerate(order):
            inverse[axis] = i
        return record(out, (self,), lambda g: (g.permute(inverse),))

    def transpose(self, dim1: int, dim2: int) -> "Tensor":
        d1 = resolve_dim(dim1, self.rank, "transpose")
        d2 = resolve_dim(dim2, self.rank, "transpose")
        order = list(range(self.rank))
        order[d1], order[d2] = order[d2], order[d1]
        return self.permute(order)

    def t(self) -> "Tensor":
        """Transpose the last two dims (Candle's `t`)."""
        if self.rank < 2:
            raise ShapeError(f"t: needs rank >= 2, got shape {list(self.shape)}")
        return self.transpose(-2, -1)

    def narrow(self, dim: int, start: int, length: int) -> "Tensor":
        d = resolve_dim(dim, self.rank, "narrow")
        size = self.dims()[d]
        if start < 0 or length < 0 or start + length > size:
            raise ShapeError(f"narrow: start {start} + length {length} out of range for dim {dim} "
                             f"of size {size} (shape {list(self.shape)})")
        key = (slice(None),) * d + (slice(start, start + length),)
        return self._basic_index(key)

    def chunk(self, chunks: int, dim: int) -> list:
        """Split into `chunks` pieces along `dim` as Candle does: sizes differ by at most one,
        the first `size % chunks` pieces being the larger ones (size 6 in 4 chunks gives
        2, 2, 1, 1 where PyTorch gives 2, 2, 2); fewer pieces only when size < chunks."""
        d = resolve_dim(dim, self.rank, "chunk")
        size = self.dims()[d]
        if chunks <= 0:
            raise ShapeError(f"chunk: chunks must be positive, got {chunks}")
        if size < chunks:
            return [self.narrow(d, i, 1) for i in range(size)]
        base, larger = divmod(size, chunks)
        pieces = []
        start = 0
        for i in range(chunks):
            length = base + 1 if i < larger else base
            pieces.append(self.narrow(d, start, length))
            start += length
        return pieces

    def contiguous(self) -> "Tensor":
        if self.is_contiguous():
            return self
        out = self._view(self.device.backend.contiguous(self._data))
        return record(out, (self,), lambda g: (g,))

    def copy(self) -> "Tensor":
        out = self._view(self._data.copy())
        return record(out, (self,), lambda g: (g,))

    def broadcast_as(self, *shape) -> "Tensor":
        if len(shape) == 1 and not isinstance(shape[0], int):
            shape = tuple(shape[0])
        target = Shape(shape)
        src = self.dims()
        if len(target) < len(src) or any(
                s != 1 and s != t for s, t in zip(src[::-1], tuple(target)[::-1])):
            raise ShapeMismatch(f"broadcast_as: cannot broadcast {list(src)} to {list(target)}")
        if tuple(target) == src:
            return self
        out = self._view(self.device.backend.xp.broadcast_to(self._data, tuple(target)))
        return record(out, (self,), lambda g: (_sum_to_shape(g, src),))

    def broadcast_left(self, *left) -> "Tensor":
        if len(left) == 1 and not isinstance(left[0], int):
            left = tuple(left[0])
        return self.broadcast_as(tuple(left) + self.dims())

    def expand(self, *shape) -> "Tensor":
        return self.broadcast_as(*shape)

    def pad_with_zeros(self, dim: int, left: int, right: int) -> "Tensor":
        return self._pad(dim, left, right, mode="zeros")

    def pad_with_same(self, dim: int, left: int, right: int) -> "Tensor":
        return self._pad(dim, left, right, mode="same")

    def _pad(self, dim, left, right, mode):
        d = resolve_dim(dim, self.rank, "pad")
        if left < 0 or right < 0:
            raise ShapeError(f"pad: negative padding ({left}, {right})")
        pieces = []
        if left:
            shape = list(self.dims())
            shape[d] = left
            pieces.append(self.zeros(shape, self.dtype, self.device) if mode == "zeros"
                          else self.narrow(d, 0, 1).broadcast_as(shape))
        pieces.append(self)
        if right:
            shape = list(self.dims())
            shape[d] = right
            pieces.append(self.zeros(shape, self.dtype, self.device) if mode == "zeros"
                          else self.narrow(d, self.dims()[d] - 1, 1).broadcast_as(shape))
        return self.cat(pieces, d) if len(pieces) > 1 else self

    # -- indexing -----------------------------------------------------------------------
    def i(self, *index) -> "Tensor":
        """Candle's `i`: ints drop a dim, slices narrow (views), `...` fills, None adds a dim,
        a list or an integer Tensor selects along its dim (index_select)."""
        if len(index) == 1 and isinstance(index[0], tuple):
            index = index[0]
        return self._index(index)

    def __getitem__(self, index):
        if not isinstance(index, tuple):
            index = (index,)
        return self._index(index)

    def _index(self, index):
        n_real = sum(1 for k in index if k is not Ellipsis and k is not None)
        if n_real > self.rank:
            raise IndexOutOfRange(f"i: {n_real} indices for a tensor of rank {self.rank}")
        if sum(1 for k in index if k is Ellipsis) > 1:
            raise CandleError("i: at most one Ellipsis")
        expanded = []
        for k in index:
            if k is Ellipsis:
                expanded.extend([slice(None)] * (self.rank - n_real))
            else:
                expanded.append(k)
        basic = []
        selections = []  # (position in the result, ids) applied after the basic view
        out_dim = 0
        src_dim = 0
        for k in expanded:
            if k is None:
                basic.append(None)
                out_dim += 1
                continue
            size = self.dims()[src_dim]
            if isinstance(k, slice):
                if k.step is not None and k.step <= 0:
                    raise ShapeError(f"i: slice step must be positive, got {k.step}")
                basic.append(k)
                out_dim += 1
            elif isinstance(k, (list, ShapeOps)):  # ShapeOps: any Tensor
                basic.append(slice(None))
                selections.append((out_dim, k))
                out_dim += 1
            else:
                try:
                    position = int(k)
                except TypeError:
                    raise CandleError(f"i: unsupported index {k!r}") from None
                if not -size <= position < size:
                    raise IndexOutOfRange(f"i: index {position} out of range for dim {src_dim} of size {size}")
                basic.append(position)
            src_dim += 1
        out = self._basic_index(tuple(basic))
        for dim, ids in selections:
            if isinstance(ids, list):
                ids = self.from_numpy(np.asarray(ids, dtype=np.int64), device=self.device)
            out = out.index_select(ids, dim)
        return out

    def _basic_index(self, key):
        """A strided view (ints, slices, None): backward scatters into zeros."""
        out = self._view(self._data[key])
        if not is_tracking(self):
            return out
        source = self

        def backward(g):
            xp = source.device.backend.xp
            full = xp.zeros(source._data.shape, dtype=g._data.dtype)
            full[key] = g._data
            return (g._wrap(full, g.dtype, g.device),)

        return record(out, (self,), backward)

    # -- joining ------------------------------------------------------------------------
    @staticmethod
    def cat(tensors, dim: int) -> "Tensor":
        tensors = list(tensors)
        if not tensors:
            raise ShapeError("cat: empty list of tensors")
        first = tensors[0]
        d = resolve_dim(dim, first.rank, "cat")
        for t in tensors[1:]:
            first._check_same(t, "cat", same_shape=False)
            if t.rank != first.rank or any(
                    a != b for i, (a, b) in enumerate(zip(t.dims(), first.dims())) if i != d):
                raise ShapeMismatch(f"cat: shape mismatch along dims other than {dim}: "
                                    f"{list(first.shape)} vs {list(t.shape)}")
        if len(tensors) == 1:
            return first
        xp = first.device.backend.xp
        out = first._wrap(xp.concatenate([t._data for t in tensors], axis=d), first.dtype, first.device)
        sizes = [t.dims()[d] for t in tensors]

        def backward(g):
            grads = []
            offset = 0
            for size in sizes:
                grads.append(g.narrow(d, offset, size))
                offset += size
            return tuple(grads)

        return record(out, tensors, backward)

    @staticmethod
    def stack(tensors, dim: int) -> "Tensor":
        tensors = list(tensors)
        if not tensors:
            raise ShapeError("stack: empty list of tensors")
        d = resolve_dim(dim, tensors[0].rank + 1, "stack")
        for t in tensors[1:]:
            if t.shape != tensors[0].shape:
                raise ShapeMismatch(f"stack: shape mismatch {list(tensors[0].shape)} vs {list(t.shape)}")
        return ShapeOps.cat([t.unsqueeze(d) for t in tensors], d)


def _sum_to_shape(g, shape):
    """Reduce a broadcast gradient back to `shape` (the backward of broadcast_as)."""
    shape = tuple(shape)
    lead = g.rank - len(shape)
    if lead:
        g = g.sum(tuple(range(lead)))
    axes = tuple(i for i, s in enumerate(shape) if s == 1 and g.dims()[i] != 1)
    if axes:
        g = g.sum_keepdim(axes)
    return g
