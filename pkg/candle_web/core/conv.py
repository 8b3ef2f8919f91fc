"""Convolutions on tensors with their gradients.

Weight gradients use the classic trick of convolving the input with the output gradient
(batch and channel axes swapped, stride and dilation exchanged), one group at a time, so the
backward pass reuses the same backend kernels as the forward pass.
"""

from __future__ import annotations

from .autograd import record
from .errors import ShapeError, ShapeMismatch


def _check(x, w, rank, op, groups, transposed=False):
    x._check_same(w, op, same_shape=False)
    if x.rank != rank or w.rank != rank:
        raise ShapeMismatch(f"{op}: expected rank-{rank} input and kernel, got {list(x.shape)} "
                            f"and {list(w.shape)}")
    if groups < 1 or x.dims()[1] % groups:
        raise ShapeError(f"{op}: {x.dims()[1]} input channels not divisible by groups={groups}")
    expected_in = x.dims()[1] if transposed else x.dims()[1] // groups
    got_in = w.dims()[0] if transposed else w.dims()[1]
    if expected_in != got_in:
        raise ShapeMismatch(f"{op}: input {list(x.shape)} has {x.dims()[1]} channels but kernel "
                            f"{list(w.shape)} expects {got_in * (1 if transposed else groups)}")


def _out_len(length, kernel, padding, stride, dilation, op):
    out = (length + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1
    if out <= 0:
        raise ShapeError(f"{op}: input length {length} too short for kernel {kernel} "
                         f"(padding {padding}, dilation {dilation})")
    return out


def _per_group(tensor, groups, dim):
    return tensor.chunk(groups, dim) if groups > 1 else [tensor]


def conv1d(x, w, padding=0, stride=1, dilation=1, groups=1):
    _check(x, w, 3, "conv1d", groups)
    length = x.dims()[2]
    kernel = w.dims()[2]
    out_len = _out_len(length, kernel, padding, stride, dilation, "conv1d")
    data = x.device.backend.conv1d(x._compute(), w._compute(), stride, padding, dilation, groups)
    out = x._from_compute(data)

    def backward(g):
        full = (out_len - 1) * stride - 2 * padding + dilation * (kernel - 1) + 1
        dx = g.conv_transpose1d(w, padding, length - full, stride, dilation, groups)
        x_padded = x.pad_with_zeros(2, padding, padding) if padding else x
        dws = []
        for xg, gg in zip(_per_group(x_padded, groups, 1), _per_group(g, groups, 1)):
            # dw[o, c, k] = sum_b,j g[b, o, j] x[b, c, k*dilation + j*stride]
            dw = xg.transpose(0, 1).conv1d(gg.transpose(0, 1), 0, dilation, stride)
            dws.append(dw.narrow(2, 0, kernel).transpose(0, 1))
        return dx, x.cat(dws, 0)

    return record(out, (x, w), backward)


def conv_transpose1d(x, w, padding=0, output_padding=0, stride=1, dilation=1, groups=1):
    _check(x, w, 3, "conv_transpose1d", groups, transposed=True)
    if output_padding >= max(stride, dilation) and output_padding:
        raise ShapeError(f"conv_transpose1d: output_padding {output_padding} must be smaller than "
                         f"stride or dilation")
    length = x.dims()[2]
    kernel = w.dims()[2]
    out_len = (length - 1) * stride - 2 * padding + dilation * (kernel - 1) + output_padding + 1
    if out_len <= 0:
        raise ShapeError(f"conv_transpose1d: output length {out_len} is not positive")
    data = x.device.backend.conv_transpose1d(x._compute(), w._compute(), stride, padding,
                                             output_padding, dilation, groups)
    out = x._from_compute(data)

    def backward(g):
        dx = g.conv1d(w, padding, stride, dilation, groups)
        if dx.dims()[2] != length:
            dx = dx.narrow(2, 0, length)
        g_full = g.pad_with_zeros(2, padding, padding) if padding else g
        dws = []
        for xg, gg in zip(_per_group(x, groups, 1), _per_group(g_full, groups, 1)):
            # dw[c, o, k] = sum_b,i x[b, c, i] g_full[b, o, k*dilation + i*stride]
            dw = gg.transpose(0, 1).conv1d(xg.transpose(0, 1), 0, dilation, stride)
            dws.append(dw.narrow(2, 0, kernel).transpose(0, 1))
        return dx, x.cat(dws, 0)

    return record(out, (x, w), backward)


def conv2d_output_size(x, w, padding=0, stride=1, dilation=1, groups=1) -> tuple:
    """(h_out, w_out) of conv2d(x, w, ...), after the checks conv2d makes (typed errors)."""
    _check(x, w, 4, "conv2d", groups)
    height, width = x.dims()[2:]
    k_h, k_w = w.dims()[2:]
    return (_out_len(height, k_h, padding, stride, dilation, "conv2d"),
            _out_len(width, k_w, padding, stride, dilation, "conv2d"))


def conv2d(x, w, padding=0, stride=1, dilation=1, groups=1):
    h_out, w_out = conv2d_output_size(x, w, padding, stride, dilation, groups)
    k_h, k_w = w.dims()[2:]
    data = x.device.backend.conv2d(x._compute(), w._compute(), stride, padding, dilation, groups)
    out = x._from_compute(data)

    def backward(g):
        # dx: scatter each output gradient back through the kernel taps (a transposed conv).
        dx = _conv2d_input_grad(g, w, x.dims(), padding, stride, dilation, groups, h_out, w_out)
        x_padded = x
        if padding:
            x_padded = x.pad_with_zeros(2, padding, padding).pad_with_zeros(3, padding, padding)
        dws = []
        for xg, gg in zip(_per_group(x_padded, groups, 1), _per_group(g, groups, 1)):
            dw = xg.transpose(0, 1).conv2d(gg.transpose(0, 1), 0, dilation, stride)
            dws.append(dw.narrow(2, 0, k_h).narrow(3, 0, k_w).transpose(0, 1))
        return dx, x.cat(dws, 0)

    return record(out, (x, w), backward)


def _conv2d_input_grad(g, w, x_dims, padding, stride, dilation, groups, h_out, w_out):
    xp = g.device.backend.xp
    batch, c_in, height, width = x_dims
    c_out, c_in_group, k_h, k_w = w.dims()
    gd = g._compute()
    padded = xp.zeros((batch, c_in, height + 2 * padding, width + 2 * padding), dtype=gd.dtype)
    wd = w._compute()
    c_out_group = c_out // groups
    for group in range(groups):
        g_slice = gd[:, group * c_out_group:(group + 1) * c_out_group]  # [b, og, ho, wo]
        w_slice = wd[group * c_out_group:(group + 1) * c_out_group]  # [og, cig, kh, kw]
        for i in range(k_h):
            for j in range(k_w):
                contribution = xp.einsum("bohw,oc->bchw", g_slice, w_slice[:, :, i, j])
                rows = slice(i * dilation, i * dilation + (h_out - 1) * stride + 1, stride)
                cols = slice(j * dilation, j * dilation + (w_out - 1) * stride + 1, stride)
                padded[:, group * c_in_group:(group + 1) * c_in_group, rows, cols] += contribution
    dx = padded[:, :, padding:padding + height, padding:padding + width]
    return g._from_compute(xp.ascontiguousarray(dx))
