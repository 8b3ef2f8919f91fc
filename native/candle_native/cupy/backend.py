"""The cupy GPU backend (`Device.cuda(i)`): cupy arrays, cuBLAS matmul, RawKernels for the
quantized matmul and the fused row ops.

Every primitive runs on the GPU and returns a cupy array: no host round trip per op. Data moves
only through `from_numpy` / `to_numpy` (what `Tensor.to_device` uses, both ways). Quantized
weights are unpacked once (candle_native.quant_unpack) and uploaded once per device; the upload
is cached with the QTensor. f32 takes the RawKernels; f64 (rare: tests, reference runs) takes
composed cupy ops that mirror the numpy reference.
"""

from __future__ import annotations

import math

import numpy as np

from candle_web.backend.base import Backend
from candle_web.core.dtype import float_to_int_saturating
from candle_web.core.errors import BackendUnavailable, ShapeMismatch

from .. import CUPY_EXTRA_HINT
from . import kernels as ck
from ..quant_unpack import LEGACY_GROUP_SHIFT, UNPACKABLE, PerWeightCache, unpack

NO_DEVICE_MESSAGE = "no CUDA device present"
# Activation rows from which qmatmul decodes the weight a band at a time for cuBLAS.
QMATMUL_BLAS_MIN_ROWS = 8
QMATMUL_BAND_ROWS = 4096
# Queries per head up to which attention uses the fused kernel (decode); more go through cuBLAS.
FUSED_ATTENTION_MAX_QUERIES = 16
# Keys that fit the fused kernel's dynamic shared memory (48 KiB of f32 scores, minus scratch).
FUSED_ATTENTION_MAX_KEYS = 12 * 1024 - 64
# Threads per block of the warp-per-row quantized matvec (8 rows per block).
QMATVEC_THREADS = 256

# A null device pointer for optional kernel arguments (no weight, no bias, no mask).
NULL = np.uint64(0)

SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
INV_SQRT_2 = 1.0 / math.sqrt(2.0)
GELU_TANH_CUBIC = 0.044715


def _import_cupy():
    try:
        import cupy
    except ImportError as e:
        raise BackendUnavailable(f"the cupy backend needs the cupy package: {CUPY_EXTRA_HINT} "
                                 f"({e})") from None
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # cupy raises CUDARuntimeError without a driver or a device
        raise BackendUnavailable(f"cupy backend: {NO_DEVICE_MESSAGE} ({e})") from None
    if count == 0:
        raise BackendUnavailable(f"cupy backend: {NO_DEVICE_MESSAGE}")
    return cupy


def make_cupy_backend() -> "CupyBackend":
    """The registry's factory: the backend of device 0 (`for_device(i)` gives the others)."""
    cupy = _import_cupy()
    return CupyBackend(cupy, 0)


_ELEMENTWISE_KERNEL_OPS = ("gelu", "gelu_erf", "erf", "sigmoid", "silu", "round")


class _Elementwise:
    """cupy ElementwiseKernels for the activations numpy composes from several ufuncs."""

    def __init__(self, cp):
        def kernel(body, name):
            return cp.ElementwiseKernel("T x", "T y", body, f"candle_{name}")

        self.gelu = kernel(f"y = (T)0.5 * x * ((T)1 + tanh((T){SQRT_2_OVER_PI!r} * "
                           f"(x + (T){GELU_TANH_CUBIC!r} * x * x * x)))", "gelu")
        self.gelu_erf = kernel(f"y = (T)0.5 * x * ((T)1 + erf(x * (T){INV_SQRT_2!r}))", "gelu_erf")
        self.erf = kernel("y = erf(x)", "erf")
        self.sigmoid = kernel("y = x >= (T)0 ? (T)1 / ((T)1 + exp(-x)) : exp(x) / ((T)1 + exp(x))",
                              "sigmoid")
        self.silu = kernel("y = x >= (T)0 ? x / ((T)1 + exp(-x)) : x * exp(x) / ((T)1 + exp(x))",
                           "silu")
        # Halves away from zero (Rust's round), not numpy's half to even.
        self.round = kernel("T w = trunc(x); y = fabs(x - w) >= (T)0.5 ? w + copysign((T)1, x) : w",
                            "round")


class CupyBackend(Backend):
    name = "cupy"

    def supports_qmatmul(self, ggml_dtype) -> bool:
        # Quantized weights stay packed on the GPU (1 byte per value) and go through RawKernels.
        return ggml_dtype in UNPACKABLE

    def __init__(self, cupy, device_index: int):
        self.cp = cupy
        self.xp = cupy
        self.device_index = device_index
        self._device = cupy.cuda.Device(device_index)
        self._siblings = {device_index: self}
        self._modules = None
        self._elementwise = None
        self._uploaded = PerWeightCache()

    def for_device(self, index: int) -> "CupyBackend":
        if index not in self._siblings:
            count = self.cp.cuda.runtime.getDeviceCount()
            if not 0 <= index < count:
                raise BackendUnavailable(f"cuda:{index}: only {count} CUDA device(s) present")
            sibling = CupyBackend(self.cp, index)
            sibling._siblings = self._siblings
            self._siblings[index] = sibling
        return self._siblings[index]

    # -- compiled kernels (lazily, per device) --------------------------------------------------
    def _kernels(self):
        if self._modules is None:
            cp = self.cp
            with self._device:
                rows = cp.RawModule(code=ck.ROW_KERNELS, options=("-std=c++14",))
                q32 = cp.RawModule(code=ck.QMATMUL_KERNELS, options=("-DGROUP=32",))
                q16 = cp.RawModule(code=ck.QMATMUL_KERNELS, options=("-DGROUP=16",))
                self._modules = {
                    "softmax": rows.get_function("softmax_rows"),
                    "norm": rows.get_function("norm_rows"),
                    "rope": rows.get_function("rope_rows"),
                    "attention": rows.get_function("attention_rows"),
                    "silu_mul": rows.get_function("silu_mul"),
                    ("qmatvec", 32): q32.get_function("qmatvec"),
                    ("qmatvec", 16): q16.get_function("qmatvec"),
                    ("dequantize", 32): q32.get_function("dequantize_rows"),
                    ("dequantize", 16): q16.get_function("dequantize_rows"),
                }
        return self._modules

    def _ew(self):
        if self._elementwise is None:
            self._elementwise = _Elementwise(self.cp)
        return self._elementwise

    # -- host transfer ------------------------------------------------------------------------
    def from_numpy(self, arr):
        with self._device:
            return self.cp.asarray(arr)

    def to_numpy(self, arr):
        if isinstance(arr, np.ndarray):
            return arr
        return self.cp.asnumpy(arr)

    # -- elementwise --------------------------------------------------------------------------
    def unary(self, op, x):
        cp = self.cp
        with self._device:
            if op in _ELEMENTWISE_KERNEL_OPS and x.dtype.kind == "f":
                return getattr(self._ew(), op)(x)
            if op == "relu":
                return cp.maximum(x, x.dtype.type(0))
            if op == "sqr":
                return x * x
            if op == "recip":
                return cp.reciprocal(x) if x.dtype.kind == "f" else (1 // x).astype(x.dtype)
            fn = {"exp": cp.exp, "log": cp.log, "sin": cp.sin, "cos": cp.cos, "tanh": cp.tanh,
                  "abs": cp.abs, "sqrt": cp.sqrt, "neg": cp.negative, "floor": cp.floor,
                  "ceil": cp.ceil, "sign": cp.sign}[op]
            out = fn(x)
            return out if out.dtype == x.dtype else out.astype(x.dtype)

    def binary(self, op, a, b):
        cp = self.cp
        with self._device:
            if op == "div" and a.dtype.kind in "iu":
                return self._int_div_toward_zero(a, b)
            fn = {"add": cp.add, "sub": cp.subtract, "mul": cp.multiply, "div": cp.divide,
                  "maximum": cp.maximum, "minimum": cp.minimum, "pow": cp.power}[op]
            return fn(a, b)

    def _int_div_toward_zero(self, a, b):
        cp = self.cp
        safe = cp.where(b == 0, cp.ones_like(b), b)
        quotient = cp.floor_divide(a, safe)
        if a.dtype.kind == "i":
            inexact = (quotient * safe != a) & ((a < 0) != (safe < 0))
            quotient = quotient + inexact.astype(quotient.dtype)
        return cp.where(b == 0, cp.zeros_like(quotient), quotient)

    def compare(self, op, a, b):
        cp = self.cp
        with self._device:
            fn = {"eq": cp.equal, "ne": cp.not_equal, "lt": cp.less, "le": cp.less_equal,
                  "gt": cp.greater, "ge": cp.greater_equal}[op]
            return fn(a, b).astype(cp.uint8)

    def affine(self, x, mul, add):
        with self._device:
            out = x * x.dtype.type(mul)
            out += x.dtype.type(add)
            return out

    def powf(self, x, exponent):
        with self._device:
            return self.cp.power(x, x.dtype.type(exponent))

    def clamp(self, x, lo, hi):
        with self._device:
            return self.cp.clip(x, lo, hi).astype(x.dtype, copy=False)

    def where(self, cond, on_true, on_false):
        with self._device:
            return self.cp.where(cond != 0, on_true, on_false)

    def cast(self, x, np_dtype):
        np_dtype = np.dtype(np_dtype)
        with self._device:
            if x.dtype.kind == "f" and np_dtype.kind in "iu":
                return float_to_int_saturating(self.cp, x, np_dtype)
            return x.astype(np_dtype)

    # -- reductions ---------------------------------------------------------------------------
    def reduce(self, op, x, axes, keepdims):
        cp = self.cp
        with self._device:
            if op == "sum":
                return cp.sum(x, axis=axes, keepdims=keepdims, dtype=x.dtype)
            fn = cp.max if op == "max" else cp.min
            return fn(x, axis=axes, keepdims=keepdims)

    def arg_reduce(self, op, x, axis, keepdims):
        cp = self.cp
        with self._device:
            out = (cp.argmax if op == "argmax" else cp.argmin)(x, axis=axis)
            if keepdims:
                out = cp.expand_dims(out, axis)
            return out.astype(cp.uint32)

    def cumsum(self, x, axis):
        with self._device:
            return self.cp.cumsum(x, axis=axis, dtype=x.dtype)

    # -- matmul and convolutions (im2col views + cuBLAS, as the numpy reference) --------------
    def matmul(self, a, b):
        with self._device:
            return self.cp.matmul(a, b)

    def conv1d(self, x, w, stride, padding, dilation, groups):
        cp = self.cp
        with self._device:
            batch, c_in, _ = x.shape
            c_out, c_in_group, kernel = w.shape
            if padding:
                x = cp.pad(x, ((0, 0), (0, 0), (padding, padding)))
            x = cp.ascontiguousarray(x)
            length = x.shape[2]
            l_out = (length - dilation * (kernel - 1) - 1) // stride + 1
            s_b, s_c, s_l = x.strides
            cols = cp.lib.stride_tricks.as_strided(
                x, shape=(batch, c_in, l_out, kernel),
                strides=(s_b, s_c, s_l * stride, s_l * dilation))
            cols = cols.reshape(batch, groups, c_in_group, l_out, kernel)
            cols = cols.transpose(0, 1, 3, 2, 4).reshape(batch, groups, l_out, c_in_group * kernel)
            w_groups = w.reshape(groups, c_out // groups, c_in_group * kernel)
            out = cp.matmul(cols, w_groups.transpose(0, 2, 1)[None])
            return cp.ascontiguousarray(out.transpose(0, 1, 3, 2).reshape(batch, c_out, l_out))

    def conv_transpose1d(self, x, w, stride, padding, output_padding, dilation, groups):
        cp = self.cp
        with self._device:
            batch, c_in, length = x.shape
            _, c_out_group, kernel = w.shape
            full_len = (length - 1) * stride + dilation * (kernel - 1) + 1 + output_padding
            out = cp.zeros((batch, groups * c_out_group, full_len), dtype=x.dtype)
            c_in_group = c_in // groups
            for g in range(groups):
                xg = x[:, g * c_in_group:(g + 1) * c_in_group]
                wg = w[g * c_in_group:(g + 1) * c_in_group]
                contributions = cp.einsum("bcl,cok->bokl", xg, wg)
                for k in range(kernel):
                    start = k * dilation
                    stop = start + (length - 1) * stride + 1
                    out[:, g * c_out_group:(g + 1) * c_out_group, start:stop:stride] += \
                        contributions[:, :, k]
            out_len = full_len - 2 * padding
            return cp.ascontiguousarray(out[:, :, padding:padding + out_len])

    def conv2d(self, x, w, stride, padding, dilation, groups):
        cp = self.cp
        with self._device:
            batch, c_in, _, _ = x.shape
            c_out, c_in_group, k_h, k_w = w.shape
            if padding:
                x = cp.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
            x = cp.ascontiguousarray(x)
            height, width = x.shape[2:]
            h_out = (height - dilation * (k_h - 1) - 1) // stride + 1
            w_out = (width - dilation * (k_w - 1) - 1) // stride + 1
            s_b, s_c, s_h, s_w = x.strides
            cols = cp.lib.stride_tricks.as_strided(
                x, shape=(batch, c_in, h_out, w_out, k_h, k_w),
                strides=(s_b, s_c, s_h * stride, s_w * stride, s_h * dilation, s_w * dilation))
            cols = cols.reshape(batch, groups, c_in_group, h_out * w_out, k_h * k_w)
            cols = cols.transpose(0, 1, 3, 2, 4).reshape(batch, groups, h_out * w_out,
                                                         c_in_group * k_h * k_w)
            w_groups = w.reshape(groups, c_out // groups, c_in_group * k_h * k_w)
            out = cp.matmul(cols, w_groups.transpose(0, 2, 1)[None])
            out = out.transpose(0, 1, 3, 2).reshape(batch, c_out, h_out, w_out)
            return cp.ascontiguousarray(out)

    # -- indexing -----------------------------------------------------------------------------
    def index_select(self, x, ids, axis):
        with self._device:
            return self.cp.take(x, ids.astype(self.cp.intp), axis=axis)

    def gather(self, x, ids, axis):
        with self._device:
            return self.cp.take_along_axis(x, ids.astype(self.cp.intp), axis=axis)

    def _add_at(self, out, index, src):
        # cupy >= 13 has ufunc.at; older releases only cupyx.scatter_add (same semantics).
        if hasattr(self.cp.add, "at"):
            self.cp.add.at(out, index, src)
        else:
            import cupyx

            cupyx.scatter_add(out, index, src)

    def scatter_add(self, x, ids, src, axis):
        cp = self.cp
        with self._device:
            out = x.copy()
            # Open-grid coordinates of every element of ids (cupy.indices has no sparse=True).
            index = [cp.arange(size).reshape((1,) * dim + (size,) + (1,) * (ids.ndim - dim - 1))
                     for dim, size in enumerate(ids.shape)]
            index[axis] = ids.astype(cp.intp)
            self._add_at(out, tuple(index), src)
            return out

    def index_add(self, x, ids, src, axis):
        with self._device:
            out = x.copy()
            self._add_at(out, (slice(None),) * axis + (ids.astype(self.cp.intp),), src)
            return out

    # -- fused kernels ------------------------------------------------------------------------
    def _rows(self, x):
        x = self.cp.ascontiguousarray(x)
        return x.reshape(-1, x.shape[-1])

    def _launch_rows(self, name, x, *extra):
        rows = self._rows(x)
        out = self.cp.empty_like(rows)
        if rows.size:
            self._kernels()[name]((rows.shape[0],), (ck.BLOCK_THREADS,),
                                  (rows, *extra[:-1], out, np.int32(rows.shape[1]), extra[-1]))
        return out.reshape(x.shape)

    def softmax_last_dim(self, x):
        with self._device:
            if x.dtype != np.float32 or x.ndim == 0:
                return self._softmax_composed(x, log=False)
            return self._launch_rows("softmax", x, np.int32(0))

    def log_softmax_last_dim(self, x):
        with self._device:
            if x.dtype != np.float32 or x.ndim == 0:
                return self._softmax_composed(x, log=True)
            return self._launch_rows("softmax", x, np.int32(1))

    def _softmax_composed(self, x, log):
        cp = self.cp
        shifted = x - cp.max(x, axis=-1, keepdims=True)
        if log:
            return shifted - cp.log(cp.sum(cp.exp(shifted), axis=-1, keepdims=True))
        e = cp.exp(shifted)
        return e / cp.sum(e, axis=-1, keepdims=True)

    def _norm(self, x, weight, bias, eps, rms):
        cp = self.cp
        if any(a is not None and a.dtype != np.float32 for a in (x, weight, bias)) or x.ndim == 0:
            mean = 0 if rms else cp.mean(x, axis=-1, keepdims=True)
            centered = x - mean
            out = centered / cp.sqrt(cp.mean(centered * centered, axis=-1, keepdims=True)
                                     + x.dtype.type(eps))
            if weight is not None:
                out = out * weight
            if bias is not None:
                out = out + bias
            return out
        weight = NULL if weight is None else cp.ascontiguousarray(weight)
        bias = NULL if bias is None else cp.ascontiguousarray(bias)
        return self._launch_rows("norm", x, weight, bias, np.float32(eps), np.int32(rms))

    def layer_norm(self, x, weight, bias, eps):
        with self._device:
            return self._norm(x, weight, bias, eps, rms=False)

    def rms_norm(self, x, weight, eps):
        with self._device:
            return self._norm(x, weight, None, eps, rms=True)

    def _rope(self, x, cos, sin, interleaved):
        cp = self.cp
        d = x.shape[-1]
        if (any(a.dtype != np.float32 for a in (x, cos, sin)) or x.ndim < 2 or d % 2
                or cos.shape != (x.shape[-2], d // 2) or sin.shape != cos.shape):
            return self._rope_composed(x, cos, sin, interleaved)
        rows = self._rows(x)
        out = cp.empty_like(rows)
        pairs = rows.shape[0] * (d // 2)
        if pairs:
            blocks = (pairs + ck.BLOCK_THREADS - 1) // ck.BLOCK_THREADS
            self._kernels()["rope"]((blocks,), (ck.BLOCK_THREADS,),
                                    (rows, cp.ascontiguousarray(cos), cp.ascontiguousarray(sin),
                                     out, np.int64(rows.shape[0]), np.int32(d),
                                     np.int32(cos.shape[0]), np.int32(interleaved)))
        return out.reshape(x.shape)

    def _rope_composed(self, x, cos, sin, interleaved):
        out = self.cp.empty_like(x)
        if interleaved:
            first, second = x[..., 0::2], x[..., 1::2]
            out[..., 0::2] = first * cos - second * sin
            out[..., 1::2] = first * sin + second * cos
        else:
            half = x.shape[-1] // 2
            first, second = x[..., :half], x[..., half:]
            out[..., :half] = first * cos - second * sin
            out[..., half:] = second * cos + first * sin
        return out

    def rope(self, x, cos, sin):
        with self._device:
            return self._rope(x, cos, sin, interleaved=0)

    def rope_i(self, x, cos, sin):
        with self._device:
            return self._rope(x, cos, sin, interleaved=1)

    def silu_mul(self, gate, up):
        cp = self.cp
        with self._device:
            if gate.dtype != np.float32 or up.dtype != np.float32 or gate.shape != up.shape:
                return self.unary("silu", gate) * up
            gate = cp.ascontiguousarray(gate)
            up = cp.ascontiguousarray(up)
            out = cp.empty_like(gate)
            n = gate.size
            if n:
                blocks = (n + ck.BLOCK_THREADS - 1) // ck.BLOCK_THREADS
                self._kernels()["silu_mul"]((blocks,), (ck.BLOCK_THREADS,),
                                            (gate, up, out, np.int64(n)))
            return out

    def attention(self, q, k, v, mask, scale):
        cp = self.cp
        with self._device:
            fused = (all(a.dtype == np.float32 for a in (q, k, v))
                     and (mask is None or mask.dtype == np.float32)
                     and q.ndim == 4 and k.ndim == 4 and v.ndim == 4
                     and q.shape[2] <= FUSED_ATTENTION_MAX_QUERIES
                     and 0 < k.shape[2] <= FUSED_ATTENTION_MAX_KEYS
                     and all(s in (1, t) for s, t in zip(k.shape[:2], q.shape[:2]))
                     and k.shape[:3] == v.shape[:3] and k.shape[3] == q.shape[3])
            if not fused:
                scores = cp.matmul(q, cp.swapaxes(k, -1, -2))
                scores *= scores.dtype.type(scale)
                if mask is not None:
                    scores += mask
                return cp.matmul(self.softmax_last_dim(scores), v)
            batch, heads, tq, d = q.shape
            tk, dv = k.shape[2], v.shape[3]
            target = (batch, heads, tq, tk)
            mask_strides = (0, 0, 0, 0)
            if mask is not None:
                try:
                    mask = cp.broadcast_to(mask, target)
                except ValueError:
                    raise ShapeMismatch(f"attention: mask {list(mask.shape)} does not broadcast "
                                        f"to the scores {list(target)}") from None
                mask_strides = tuple(s // mask.itemsize for s in mask.strides)
            out = cp.empty((batch, heads, tq, dv), np.float32)
            if out.size:
                self._kernels()["attention"](
                    (batch * heads * tq,), (ck.BLOCK_THREADS,),
                    (cp.ascontiguousarray(q), cp.ascontiguousarray(k), cp.ascontiguousarray(v),
                     NULL if mask is None else mask, *(np.int64(s) for s in mask_strides),
                     np.float32(scale), out, np.int32(heads), np.int32(tq), np.int32(tk),
                     np.int32(d), np.int32(dv), np.int32(k.shape[0] > 1),
                     np.int32(k.shape[1] > 1)),
                    shared_mem=tk * 4)
            return out

    # -- quantized matmul -------------------------------------------------------------------
    def _device_weight(self, qweight):
        return self._uploaded.get(qweight, self._upload)

    def _upload(self, qweight):
        cp = self.cp
        unpacked = unpack(qweight)
        scales, offsets, shift = unpacked.scales, unpacked.offsets, unpacked.group_shift
        if shift > LEGACY_GROUP_SHIFT:
            repeat = 1 << (shift - LEGACY_GROUP_SHIFT)
            scales = np.repeat(scales, repeat, axis=1)
            offsets = None if offsets is None else np.repeat(offsets, repeat, axis=1)
            shift = LEGACY_GROUP_SHIFT
        with self._device:
            return {
                "levels": cp.asarray(unpacked.levels),
                "scales": cp.asarray(np.ascontiguousarray(scales)),
                "offsets": None if offsets is None else cp.asarray(np.ascontiguousarray(offsets)),
                "group": 1 << shift,
            }

    def qmatmul(self, x, qweight):
        cp = self.cp
        with self._device:
            n, k = qweight.shape if len(qweight.shape) == 2 else (None, None)
            if qweight.dtype not in UNPACKABLE or n is None:
                from candle_web.quantized import qmatmul_ref

                host = qmatmul_ref(self.to_numpy(x), qweight)
                return cp.asarray(host)
            if x.ndim == 0 or x.shape[-1] != k:
                raise ShapeMismatch(f"qmatmul: x of shape {x.shape} cannot multiply a weight of "
                                    f"shape {qweight.shape} (last dims must both be {k})")
            weight = self._device_weight(qweight)
            rows = cp.ascontiguousarray(x, dtype=cp.float32).reshape(-1, k)
            m = rows.shape[0]
            out = cp.empty((m, n), cp.float32)
            group = weight["group"]
            use_offsets = weight["offsets"] is not None
            offsets = weight["offsets"] if use_offsets else NULL
            kernels = self._kernels()
            if m >= QMATMUL_BLAS_MIN_ROWS:
                band_rows = min(n, QMATMUL_BAND_ROWS)
                band = cp.empty((band_rows, k), cp.float32)
                for start in range(0, n, QMATMUL_BAND_ROWS):
                    stop = min(n, start + QMATMUL_BAND_ROWS)
                    count = (stop - start) * k
                    blocks = (count + ck.BLOCK_THREADS - 1) // ck.BLOCK_THREADS
                    kernels[("dequantize", group)](
                        (blocks,), (ck.BLOCK_THREADS,),
                        (weight["levels"], weight["scales"], offsets, np.int32(use_offsets),
                         band, np.int64(start), np.int64(stop - start), np.int32(k)))
                    cp.matmul(rows, band[:stop - start].T, out=out[:, start:stop])
            elif m and n:
                xsum = (rows.reshape(m, -1, group).sum(axis=2, dtype=cp.float32)
                        if use_offsets else NULL)
                warps_per_block = QMATVEC_THREADS // ck.WARP
                blocks = (n + warps_per_block - 1) // warps_per_block
                kernels[("qmatvec", group)](
                    (blocks,), (QMATVEC_THREADS,),
                    (rows, weight["levels"], weight["scales"], offsets, xsum,
                     np.int32(use_offsets), out, np.int32(m), np.int32(n), np.int32(k)))
            return out.reshape(*x.shape[:-1], n)

    # -- creation / memory ------------------------------------------------------------------
    def zeros(self, shape, np_dtype):
        with self._device:
            return self.cp.zeros(shape, dtype=np_dtype)

    def full(self, shape, value, np_dtype):
        with self._device:
            return self.cp.full(shape, value, dtype=np_dtype)

    def arange(self, start, end, step, np_dtype):
        with self._device:
            return self.cp.arange(start, end, step, dtype=np_dtype)

    def contiguous(self, x):
        with self._device:
            return x if x.flags.c_contiguous else x.copy(order="C")

    def is_contiguous(self, x):
        return x.flags.c_contiguous
