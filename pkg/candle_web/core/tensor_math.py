"""Maths and indexing ops of `Tensor` (a mixin): elementwise, reductions, matmul,
convolutions, index ops. Each op computes through the device's backend and, when an input
tracks gradients, records its backward rule right next to the forward code.
"""

from __future__ import annotations

import math

from . import dtype as dt
from .autograd import record
from .errors import DTypeMismatch, IndexOutOfRange, ShapeError, ShapeMismatch
from .shape import broadcast_shape, resolve_dim, resolve_dims

FLOAT_ONLY_UNARY = {"exp", "log", "sin", "cos", "tanh", "sqrt", "recip", "gelu", "gelu_erf",
                    "erf", "silu", "sigmoid", "floor", "ceil", "round"}
INDEX_DTYPES = (dt.u8, dt.u32, dt.i64)


def _is_scalar(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class MathOps:
    __slots__ = ()

    # -- unary ----------------------------------------------------------------------------
    def _unary(self, op: str):
        if op in FLOAT_ONLY_UNARY and not self.dtype.is_float:
            raise DTypeMismatch(f"{op}: needs a float tensor, got {self.dtype.name}")
        out = self._from_compute(self.device.backend.unary(op, self._compute()))
        if not self.dtype.is_float:
            return out
        return record(out, (self,), lambda g: (_UNARY_GRADS[op](self, out, g),))

    def exp(self): return self._unary("exp")
    def log(self): return self._unary("log")
    def sin(self): return self._unary("sin")
    def cos(self): return self._unary("cos")
    def tanh(self): return self._unary("tanh")
    def abs(self): return self._unary("abs")
    def sqr(self): return self._unary("sqr")
    def sqrt(self): return self._unary("sqrt")
    def recip(self): return self._unary("recip")
    def neg(self): return self._unary("neg")
    def gelu(self): return self._unary("gelu")
    def gelu_erf(self): return self._unary("gelu_erf")
    def erf(self): return self._unary("erf")
    def relu(self): return self._unary("relu")
    def silu(self): return self._unary("silu")
    def sigmoid(self): return self._unary("sigmoid")
    def floor(self): return self._unary("floor")
    def ceil(self): return self._unary("ceil")
    def round(self): return self._unary("round")
    def sign(self): return self._unary("sign")

    def affine(self, mul: float, add: float):
        """x * mul + add."""
        out = self._from_compute(self.device.backend.affine(self._compute(), mul, add))
        return record(out, (self,), lambda g: (g.affine(mul, 0.0),))

    def powf(self, exponent: float):
        out = self._from_compute(self.device.backend.powf(self._compute(), exponent))
        return record(out, (self,), lambda g: (g.mul(self.powf(exponent - 1.0).affine(exponent, 0.0)),))

    def clamp(self, lo, hi):
        """Clamp to [lo, hi]; scalar bounds use the fused kernel, tensor bounds broadcast."""
        if not (_is_scalar(lo) and _is_scalar(hi)):
            return self.broadcast_maximum(lo).broadcast_minimum(hi)
        out = self._from_compute(self.device.backend.clamp(self._compute(), lo, hi))

        def backward(g):
            inside = self.ge(lo).mul(self.le(hi)).to_dtype(g.dtype)
            return (g.mul(inside),)

        return record(out, (self,), backward)

    # -- binary ----------------------------------------------------------------------------
    def _binary(self, op: str, other, broadcast: bool = False):
        if _is_scalar(other):
            other = self.full_like(other)
        if broadcast:
            # Validate here, then let the backend broadcast: no intermediate view tensors on
            # the inference path; the backward broadcasts lazily (see _broadcast_binary_grads).
            name = "broadcast_" + op
            self._check_same(other, name, same_shape=False)
            broadcast_shape(self._data.shape, other._data.shape, name)
        else:
            self._check_same(other, op)
        out = self._from_compute(self.device.backend.binary(op, self._compute(), other._compute()))
        if not self.dtype.is_float:
            return out
        return record(out, (self, other), lambda g: _broadcast_binary_grads(op, self, other, out, g))

    def add(self, other): return self._binary("add", other)
    def sub(self, other): return self._binary("sub", other)
    def mul(self, other): return self._binary("mul", other)
    def div(self, other): return self._binary("div", other)
    def maximum(self, other): return self._binary("maximum", other)
    def minimum(self, other): return self._binary("minimum", other)
    def broadcast_add(self, other): return self._binary("add", other, True)
    def broadcast_sub(self, other): return self._binary("sub", other, True)
    def broadcast_mul(self, other): return self._binary("mul", other, True)
    def broadcast_div(self, other): return self._binary("div", other, True)
    def broadcast_maximum(self, other): return self._binary("maximum", other, True)
    def broadcast_minimum(self, other): return self._binary("minimum", other, True)

    def pow(self, other):
        """Elementwise self ** other for tensors (Candle: exp(other * ln(self)))."""
        return other.mul(self.log()).exp()

    def broadcast_pow(self, other):
        shape = broadcast_shape(self.dims(), other.dims(), "broadcast_pow")
        return self.broadcast_as(shape).pow(other.broadcast_as(shape))

    def _compare(self, op: str, other, broadcast: bool = False):
        if _is_scalar(other):
            other = self.full_like(other)
        name = f"broadcast_{op}" if broadcast else op
        self._check_same(other, name, same_shape=not broadcast)
        if broadcast:
            broadcast_shape(self._data.shape, other._data.shape, name)  # the backend broadcasts
        data = self.device.backend.compare(op, self._compute(), other._compute())
        return self._wrap(data, dt.u8, self.device)

    def eq(self, other): return self._compare("eq", other)
    def ne(self, other): return self._compare("ne", other)
    def lt(self, other): return self._compare("lt", other)
    def le(self, other): return self._compare("le", other)
    def gt(self, other): return self._compare("gt", other)
    def ge(self, other): return self._compare("ge", other)
    def broadcast_eq(self, other): return self._compare("eq", other, True)
    def broadcast_ne(self, other): return self._compare("ne", other, True)
    def broadcast_lt(self, other): return self._compare("lt", other, True)
    def broadcast_le(self, other): return self._compare("le", other, True)
    def broadcast_gt(self, other): return self._compare("gt", other, True)
    def broadcast_ge(self, other): return self._compare("ge", other, True)

    # Python operators: same-shape tensors or scalars, like Candle's `&a + &b` / `(&a + 1.0)`.
    def __add__(self, other):
        return self.affine(1.0, other) if _is_scalar(other) else self.add(other)

    def __radd__(self, other):
        return self.__add__(other)

    def __sub__(self, other):
        return self.affine(1.0, -other) if _is_scalar(other) else self.sub(other)

    def __rsub__(self, other):
        return self.affine(-1.0, other)

    def __mul__(self, other):
        return self.affine(other, 0.0) if _is_scalar(other) else self.mul(other)

    def __rmul__(self, other):
        return self.__mul__(other)

    def __truediv__(self, other):
        return self.affine(1.0 / other, 0.0) if _is_scalar(other) else self.div(other)

    def __rtruediv__(self, other):
        return self.recip().affine(other, 0.0)

    def __neg__(self):
        return self.neg()

    def __pow__(self, other):
        return self.powf(other) if _is_scalar(other) else self.pow(other)

    def __matmul__(self, other):
        return self.matmul(other)

    # -- where / cast helpers ----------------------------------------------------------------
    def where_cond(self, on_true, on_false):
        """Select `on_true` where self (a mask) is non-zero, else `on_false`; same shapes."""
        if self.dtype not in INDEX_DTYPES:
            raise DTypeMismatch(f"where_cond: the mask must be u8/u32/i64, got {self.dtype.name}")
        on_true._check_same(on_false, "where_cond")
        if self.shape != on_true.shape:
            raise ShapeMismatch(f"where_cond: mask shape {list(self.shape)} vs values {list(on_true.shape)}")
        data = self.device.backend.where(self._data, on_true._data, on_false._data)
        out = self._wrap(data, on_true.dtype, on_true.device)

        def backward(g):
            zeros = g.zeros_like()
            return (None, self.where_cond(g, zeros), self.where_cond(zeros, g))

        return record(out, (None, on_true, on_false), backward)

    # -- reductions --------------------------------------------------------------------------
    def _reduce(self, op: str, dims, keepdim: bool):
        axes = resolve_dims(dims, self.rank, op)
        if op != "sum":
            self._check_not_empty(axes, op)
        data = self.device.backend.reduce(op, self._compute(), axes, True)
        kept = self._from_compute(data)
        if self.dtype.is_float:
            if op == "sum":
                kept = record(kept, (self,), lambda g: (g.broadcast_as(self.shape),))
            else:
                def backward(g):
                    hits = self.broadcast_eq(kept.detach()).to_dtype(g.dtype)
                    return (g.broadcast_as(self.shape).mul(hits),)

                kept = record(kept, (self,), backward)
        if keepdim:
            return kept
        remaining = tuple(d for i, d in enumerate(self.dims()) if i not in axes)
        return kept.reshape(remaining)

    def sum_keepdim(self, dims): return self._reduce("sum", dims, True)
    def sum(self, dims): return self._reduce("sum", dims, False)
    def max_keepdim(self, dims): return self._reduce("max", dims, True)
    def max(self, dims): return self._reduce("max", dims, False)
    def min_keepdim(self, dims): return self._reduce("min", dims, True)
    def min(self, dims): return self._reduce("min", dims, False)

    def sum_all(self):
        return self.sum(tuple(range(self.rank))) if self.rank else self

    def max_all(self):
        return self.max(tuple(range(self.rank))) if self.rank else self

    def min_all(self):
        return self.min(tuple(range(self.rank))) if self.rank else self

    def mean_keepdim(self, dims):
        axes = resolve_dims(dims, self.rank, "mean")
        count = math.prod(self.dims()[a] for a in axes)
        return self.sum_keepdim(axes).affine(1.0 / count, 0.0)

    def mean(self, dims):
        axes = resolve_dims(dims, self.rank, "mean")
        count = math.prod(self.dims()[a] for a in axes)
        return self.sum(axes).affine(1.0 / count, 0.0)

    def mean_all(self):
        return self.mean(tuple(range(self.rank))) if self.rank else self

    def var_keepdim(self, dim: int):
        """Unbiased variance (divides by n - 1), like Candle and PyTorch."""
        d = resolve_dim(dim, self.rank, "var")
        n = self.dims()[d]
        centered = self.broadcast_sub(self.mean_keepdim(d))
        return centered.sqr().sum_keepdim(d).affine(1.0 / max(n - 1, 1), 0.0)

    def var(self, dim: int):
        return self.var_keepdim(dim).squeeze(dim)

    def log_sum_exp(self, dims):
        """log(sum(exp(x))) over dims, computed stably."""
        axes = resolve_dims(dims, self.rank, "log_sum_exp")
        peak = self.max_keepdim(axes).detach()
        summed = self.broadcast_sub(peak).exp().sum_keepdim(axes).log().add(peak)
        remaining = tuple(d for i, d in enumerate(self.dims()) if i not in axes)
        return summed.reshape(remaining)

    def _check_not_empty(self, axes, op):
        # max/min/argmax over nothing has no value (numpy would raise a bare ValueError).
        for axis in axes:
            if self._data.shape[axis] == 0:
                raise ShapeError(f"{op}: cannot reduce over dim {axis} of size 0 "
                                 f"(shape {list(self.shape)})")

    def _arg_reduce(self, op, dim, keepdim):
        d = resolve_dim(dim, self.rank, op)
        self._check_not_empty((d,), op)
        data = self.device.backend.arg_reduce(op, self._compute(), d, keepdim)
        return self._wrap(data, dt.u32, self.device)

    def argmax_keepdim(self, dim): return self._arg_reduce("argmax", dim, True)
    def argmax(self, dim): return self._arg_reduce("argmax", dim, False)
    def argmin_keepdim(self, dim): return self._arg_reduce("argmin", dim, True)
    def argmin(self, dim): return self._arg_reduce("argmin", dim, False)

    def cumsum(self, dim: int):
        d = resolve_dim(dim, self.rank, "cumsum")
        out = self._from_compute(self.device.backend.cumsum(self._compute(), d))

        def backward(g):
            xp = g.device.backend.xp
            flipped = xp.flip(g._compute(), axis=d)
            return (g._from_compute(xp.ascontiguousarray(xp.flip(xp.cumsum(flipped, axis=d), axis=d))),)

        return record(out, (self,), backward) if self.dtype.is_float else self._wrap(
            out._data, out.dtype, out.device)

    # -- matmul --------------------------------------------------------------------------------
    def matmul(self, other):
        """Batched matmul: [..., m, k] x [..., k, n]; batch dims must be equal (see
        broadcast_matmul)."""
        self._check_same(other, "matmul", same_shape=False)
        if self.rank < 2 or other.rank < 2 or self.dims()[-1] != other.dims()[-2] or \
                self.dims()[:-2] != other.dims()[:-2]:
            raise ShapeMismatch(f"matmul: shape mismatch, lhs {list(self.shape)} rhs {list(other.shape)}")
        out = self._from_compute(self.device.backend.matmul(self._compute(), other._compute()))
        if not self.dtype.is_float:
            return out

        def backward(g):
            return (g.matmul(other.t()), self.t().matmul(g))

        return record(out, (self, other), backward)

    def broadcast_matmul(self, other):
        if self.rank < 2 or other.rank < 2:
            raise ShapeMismatch(f"broadcast_matmul: needs rank >= 2, lhs {list(self.shape)} "
                                f"rhs {list(other.shape)}")
        batch = broadcast_shape(self.dims()[:-2], other.dims()[:-2], "broadcast_matmul")
        lhs = self.broadcast_as(tuple(batch) + self.dims()[-2:])
        rhs = other.broadcast_as(tuple(batch) + other.dims()[-2:])
        return lhs.matmul(rhs)

    # -- convolutions ----------------------------------------------------------------------
    def conv1d(self, kernel, padding: int = 0, stride: int = 1, dilation: int = 1, groups: int = 1):
        """x [b, c_in, l] * w [c_out, c_in/groups, k] -> [b, c_out, l_out]."""
        from . import conv

        return conv.conv1d(self, kernel, padding, stride, dilation, groups)

    def conv_transpose1d(self, kernel, padding: int = 0, output_padding: int = 0, stride: int = 1,
                         dilation: int = 1, groups: int = 1):
        """x [b, c_in, l] * w [c_in, c_out/groups, k] -> [b, c_out, l_out]."""
        from . import conv

        return conv.conv_transpose1d(self, kernel, padding, output_padding, stride, dilation, groups)

    def conv2d(self, kernel, padding: int = 0, stride: int = 1, dilation: int = 1, groups: int = 1):
        """x [b, c_in, h, w] * w [c_out, c_in/groups, kh, kw] -> [b, c_out, h_out, w_out]."""
        from . import conv

        return conv.conv2d(self, kernel, padding, stride, dilation, groups)

    # -- index ops ------------------------------------------------------------------------
    def _check_ids(self, ids, dim: int, op: str, size: int):
        if ids.dtype not in INDEX_DTYPES:
            raise DTypeMismatch(f"{op}: indexes must be u8/u32/i64, got {ids.dtype.name}")
        if ids.elem_count():
            xp = ids.device.backend.xp
            low = int(xp.min(ids._data))
            high = int(xp.max(ids._data))
            if low < 0 or high >= size:
                raise IndexOutOfRange(f"{op}: index {high if high >= size else low} out of range "
                                      f"for dim {dim} of size {size}")

    def index_select(self, ids, dim: int):
        d = resolve_dim(dim, self.rank, "index_select")
        if ids.rank != 1:
            raise ShapeError(f"index_select: ids must be rank 1, got shape {list(ids.shape)}")
        self._check_ids(ids, d, "index_select", self.dims()[d])
        data = self.device.backend.index_select(self._data, ids._data, d)
        out = self._wrap(data, self.dtype, self.device)
        return record(out, (self,), lambda g: (self.zeros_like().index_add(ids, g, d),))

    def embedding(self, ids):
        """Rows of this [vocab, hidden] table for integer ids of any shape."""
        hidden = self.dims()[-1]
        rows = self.index_select(ids.flatten_all(), 0)
        return rows.reshape(ids.dims() + (hidden,))

    def gather(self, ids, dim: int):
        d = resolve_dim(dim, self.rank, "gather")
        if ids.rank != self.rank or any(a != b for i, (a, b) in enumerate(zip(ids.dims(), self.dims()))
                                        if i != d):
            raise ShapeMismatch(f"gather: ids shape {list(ids.shape)} incompatible with "
                                f"{list(self.shape)} along dim {dim}")
        self._check_ids(ids, d, "gather", self.dims()[d])
        out = self._wrap(self.device.backend.gather(self._data, ids._data, d), self.dtype, self.device)
        return record(out, (self,), lambda g: (self.zeros_like().scatter_add(ids, g, d),))

    def scatter_add(self, ids, src, dim: int):
        d = resolve_dim(dim, self.rank, "scatter_add")
        self._check_same(src, "scatter_add", same_shape=False)
        # Like Candle: ids and src share a shape, which equals self's except along dim.
        if ids.shape != src.shape or ids.rank != self.rank or any(
                a != b for i, (a, b) in enumerate(zip(ids.dims(), self.dims())) if i != d):
            raise ShapeMismatch(f"scatter_add: ids {list(ids.shape)}, src {list(src.shape)} and "
                                f"self {list(self.shape)} disagree (dims other than {dim} must match)")
        self._check_ids(ids, d, "scatter_add", self.dims()[d])
        data = self.device.backend.scatter_add(self._compute(), ids._data, src._compute(), d)
        out = self._from_compute(data)
        return record(out, (self, src), lambda g: (g, g.gather(ids, d)))

    def index_add(self, ids, src, dim: int):
        d = resolve_dim(dim, self.rank, "index_add")
        self._check_same(src, "index_add", same_shape=False)
        expected = self.dims()[:d] + (ids.elem_count(),) + self.dims()[d + 1:]
        if ids.rank != 1 or src.dims() != expected:
            raise ShapeMismatch(f"index_add: src {list(src.shape)} must be {list(expected)} for "
                                f"ids {list(ids.shape)} on {list(self.shape)}")
        self._check_ids(ids, d, "index_add", self.dims()[d])
        data = self.device.backend.index_add(self._compute(), ids._data, src._compute(), d)
        out = self._from_compute(data)
        return record(out, (self, src), lambda g: (g, g.index_select(ids, d)))


# -- backward rules (x: input, y: output, g: incoming gradient) -------------------------------
def _zero_grad(x, y, g):
    return g.zeros_like()


def _gelu_tanh_grad(x, y, g):
    inner = x.add(x.powf(3.0).affine(0.044715, 0.0)).affine(math.sqrt(2.0 / math.pi), 0.0)
    t = inner.tanh()
    d_inner = x.sqr().affine(3.0 * 0.044715, 1.0).affine(math.sqrt(2.0 / math.pi), 0.0)
    derivative = t.affine(0.5, 0.5).add(x.mul(t.sqr().affine(-1.0, 1.0)).mul(d_inner).affine(0.5, 0.0))
    return g.mul(derivative)


def _gelu_erf_grad(x, y, g):
    cdf = x.affine(1.0 / math.sqrt(2.0), 0.0).erf().affine(0.5, 0.5)
    pdf = x.sqr().affine(-0.5, 0.0).exp().affine(1.0 / math.sqrt(2.0 * math.pi), 0.0)
    return g.mul(cdf.add(x.mul(pdf)))


def _silu_grad(x, y, g):
    s = x.sigmoid()
    return g.mul(s.add(x.mul(s).mul(s.affine(-1.0, 1.0))))


_UNARY_GRADS = {
    "exp": lambda x, y, g: g.mul(y),
    "log": lambda x, y, g: g.div(x),
    "sin": lambda x, y, g: g.mul(x.cos()),
    "cos": lambda x, y, g: g.mul(x.sin()).neg(),
    "tanh": lambda x, y, g: g.mul(y.sqr().affine(-1.0, 1.0)),
    "abs": lambda x, y, g: g.mul(x.sign()),
    "sqr": lambda x, y, g: g.mul(x).affine(2.0, 0.0),
    "sqrt": lambda x, y, g: g.div(y).affine(0.5, 0.0),
    "recip": lambda x, y, g: g.mul(y.sqr()).neg(),
    "neg": lambda x, y, g: g.neg(),
    "gelu": _gelu_tanh_grad,
    "gelu_erf": _gelu_erf_grad,
    "erf": lambda x, y, g: g.mul(x.sqr().neg().exp().affine(2.0 / math.sqrt(math.pi), 0.0)),
    "relu": lambda x, y, g: g.mul(x.gt(0.0).to_dtype(g.dtype)),
    "silu": _silu_grad,
    "sigmoid": lambda x, y, g: g.mul(y.mul(y.affine(-1.0, 1.0))),
    "floor": _zero_grad,
    "ceil": _zero_grad,
    "round": _zero_grad,
    "sign": _zero_grad,
}


def _broadcast_binary_grads(op, a, b, y, g):
    """Gradients of a (possibly broadcast) binary op: the same-shape rule applied to the
    inputs broadcast to the output shape, then summed back to each input's shape."""
    if a.shape == b.shape:
        return _BINARY_GRADS[op](a, b, y, g)
    from .tensor_shape import _sum_to_shape

    out_shape = y.shape
    grad_a, grad_b = _BINARY_GRADS[op](a.broadcast_as(out_shape), b.broadcast_as(out_shape), y, g)
    return _sum_to_shape(grad_a, a.dims()), _sum_to_shape(grad_b, b.dims())


def _max_min_grad(a, b, y, g, a_wins):
    # Ties split the gradient equally, as PyTorch does.
    tie = a.eq(b).to_dtype(g.dtype).affine(0.5, 0.0)
    win = a_wins.to_dtype(g.dtype)
    share_a = win.add(tie)
    return g.mul(share_a), g.mul(share_a.affine(-1.0, 1.0))


_BINARY_GRADS = {
    "add": lambda a, b, y, g: (g, g),
    "sub": lambda a, b, y, g: (g, g.neg()),
    "mul": lambda a, b, y, g: (g.mul(b), g.mul(a)),
    "div": lambda a, b, y, g: (g.div(b), g.mul(a).div(b.sqr()).neg()),
    "maximum": lambda a, b, y, g: _max_min_grad(a, b, y, g, a.gt(b)),
    "minimum": lambda a, b, y, g: _max_min_grad(a, b, y, g, a.lt(b)),
}

