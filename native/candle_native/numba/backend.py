"""The numba CPU backend: the numpy reference with its hot primitives replaced by numba kernels.

Arrays stay numpy arrays (so tensors mix freely with the numpy backend's). Each override takes
its fast path only for what the kernels were written for (f32, the expected ranks); anything
else, f64 included, goes to the numpy reference, so results never depend on which backend ran.
Inputs that are views are copied to C order first (the kernels index contiguous rows).
"""

from __future__ import annotations

import weakref

import numpy as np

from candle_web.backend.numpy_backend import NumpyBackend
from candle_web.backend.settings import PROMPT_WEIGHTS_MB_VARIABLE, settings  # noqa: F401 (tests name it here)
from candle_web.core.errors import ShapeMismatch

from . import kernels as nk
from .kernels import vector_math
from ..quant_unpack import UNPACKABLE, PerWeightCache, kernel_weight, unpack

# Below this many elements a fused op runs its serial kernel: waking the thread pool costs more
# than the whole op on a decode step's small tensors.
PARALLEL_MIN_ELEMENTS = 1 << 15
# Softmax runs in numba up to this many elements (decode-step scores, where numpy's passes and
# call overhead dominate: 9x64 scores took 5 us against 34 us); above, numpy's SIMD exp wins.
SOFTMAX_NUMBA_MAX_ELEMENTS = 4096
# Query rows up to which the fused attention kernel beats scores-through-BLAS (decode steps and
# short prompts); longer prompts and encoders keep the two BLAS matmuls of the reference.
FUSED_ATTENTION_MAX_QUERIES = 16
# From this many activation rows on (prompt processing), qmatmul lets BLAS multiply an f32 copy
# of the weight (kept, see _DenseWeights, or decoded a band at a time beyond the budget); below
# it, the fused kernel reads the int8 levels directly.
QMATMUL_BLAS_MIN_ROWS = 8
# Weight rows decoded per band on the BLAS path (bounds the f32 scratch to band x k).
QMATMUL_BAND_ROWS = 1024
# The generic prompt path (models the fused LLaMA part declines, Whisper, T5, BERT; fused LLaMA
# prompts run through the part's step_prompt) keeps f32 copies of the weights it multiplies, up to
# CANDLE_WEB_PROMPT_WEIGHTS_MB MiB in all (backend/settings.py; 0 turns it off); beyond, weights
# are decoded a band at a time on every call. Decoding per call cost SmolLM2-135M ~0.2 s of CPU
# per prompt (its block weights are 90 M values) and put a numba thread-pool region before
# every BLAS call.


class _DenseWeights:
    """f32 copies of quantized weights for multi-row products (the numpy backend's layout, so
    prompts cost the same BLAS work on both backends), kept while they fit the byte budget.
    Decode steps never read them: the fused kernels read the int8 levels."""

    def __init__(self):
        self._cache = PerWeightCache()
        self.used_bytes = 0

    @staticmethod
    def budget_bytes() -> int:
        return settings().prompt_weights_bytes

    def get(self, qtensor, weight):
        """The f32 [n, k] matrix of `qtensor`; None when it did not fit the budget at its first
        use (it then stays on the band path)."""
        return self._cache.get(qtensor, lambda q: self._decode_within_budget(weight, *q.shape))

    def _decode_within_budget(self, weight, n, k):
        if self.used_bytes + 4 * n * k > self.budget_bytes():
            return None
        dense = np.empty((n, k), np.float32)
        nk.dequantize_rows_into(weight.levels, weight.scales, weight.offsets, weight.use_offsets,
                                weight.group, 0, dense)
        self.used_bytes += dense.nbytes
        weakref.finalize(dense, self._release, dense.nbytes)
        return dense

    def _release(self, nbytes):
        self.used_bytes -= nbytes


_DENSE_WEIGHTS = _DenseWeights()


def _f32_rows(x):
    """x as a C-contiguous f32 [rows, last] (a copy only when x is a view)."""
    x = np.ascontiguousarray(x)
    return x.reshape(-1, x.shape[-1]) if x.ndim else x.reshape(1, 1)


def _small_f32(x):
    return x.dtype == np.float32 and x.ndim > 0 and 0 < x.size <= SOFTMAX_NUMBA_MAX_ELEMENTS


def _is_f32(*arrays):
    return all(a is None or a.dtype == np.float32 for a in arrays)


class NumbaBackend(NumpyBackend):
    name = "numba"

    def supports_qmatmul(self, ggml_dtype) -> bool:
        # QMatMul keeps these GGML types packed and multiplies from the blocks (measured on
        # SmolLM2 Q4_1 decode: 9.6 tok/s packed vs 6.9 tok/s dequantized to f32, same ids).
        return ggml_dtype in UNPACKABLE

    # -- elementwise activations ------------------------------------------------------------
    # (serial kernel, threaded kernel) per op; tanh-GELU stays on numpy (see numba_kernels).
    _ACTIVATIONS = {"gelu_erf": (nk.gelu_erf_serial, nk.gelu_erf_parallel),
                    "silu": (nk.silu_serial, nk.silu_parallel)}

    def unary(self, op, x):
        if op == "gelu_erf" and x.dtype == np.float32 and x.size:
            return _gelu_erf_vector(x)
        kernels = self._ACTIVATIONS.get(op)
        if kernels is None or x.dtype != np.float32 or x.size == 0:
            return super().unary(op, x)
        x = np.ascontiguousarray(x)
        out = np.empty_like(x)
        kernels[x.size >= PARALLEL_MIN_ELEMENTS](x.reshape(-1), out.reshape(-1))
        return out

    def silu_mul(self, gate, up):
        if not _is_f32(gate, up) or gate.shape != up.shape or gate.size == 0:
            return super().silu_mul(gate, up)
        gate = np.ascontiguousarray(gate)
        up = np.ascontiguousarray(up)
        out = np.empty_like(gate)
        kernel = nk.silu_mul_parallel if gate.size >= PARALLEL_MIN_ELEMENTS else nk.silu_mul_serial
        kernel(gate.reshape(-1), up.reshape(-1), out.reshape(-1))
        return out

    # -- row-wise fused ops -----------------------------------------------------------------
    def softmax_last_dim(self, x):
        if not _small_f32(x):
            return super().softmax_last_dim(x)
        rows = _f32_rows(x)
        out = np.empty_like(rows)
        nk.softmax_serial(rows, out)
        return out.reshape(x.shape)

    def log_softmax_last_dim(self, x):
        if not _small_f32(x):
            return super().log_softmax_last_dim(x)
        rows = _f32_rows(x)
        out = np.empty_like(rows)
        nk.log_softmax_serial(rows, out)
        return out.reshape(x.shape)

    def layer_norm(self, x, weight, bias, eps):
        if not _is_f32(x, weight, bias) or x.ndim == 0 or x.size == 0:
            return super().layer_norm(x, weight, bias, eps)
        rows = _f32_rows(x)
        width = rows.shape[1]
        weight = np.ones(width, np.float32) if weight is None else np.ascontiguousarray(weight)
        bias = np.zeros(width, np.float32) if bias is None else np.ascontiguousarray(bias)
        if weight.shape != (width,) or bias.shape != (width,):
            return super().layer_norm(x, weight, bias, eps)
        out = np.empty_like(rows)
        nk.layer_norm_rows(rows.size >= PARALLEL_MIN_ELEMENTS, rows, weight, bias,
                           np.float32(eps), out)
        return out.reshape(x.shape)

    def rms_norm(self, x, weight, eps):
        if not _is_f32(x, weight) or x.ndim == 0 or x.size == 0:
            return super().rms_norm(x, weight, eps)
        rows = _f32_rows(x)
        width = rows.shape[1]
        weight = np.ones(width, np.float32) if weight is None else np.ascontiguousarray(weight)
        if weight.shape != (width,):
            return super().rms_norm(x, weight, eps)
        out = np.empty_like(rows)
        nk.rms_norm_rows(rows.size >= PARALLEL_MIN_ELEMENTS, rows, weight, np.float32(eps), out)
        return out.reshape(x.shape)

    def rope(self, x, cos, sin):
        return self._rope(x, cos, sin, nk.rope_half_rows, super().rope)

    def rope_i(self, x, cos, sin):
        return self._rope(x, cos, sin, nk.rope_interleaved_rows, super().rope_i)

    @staticmethod
    def _rope(x, cos, sin, kernel, reference):
        # The kernel handles the documented layout: x [.., t, d], cos/sin exactly [t, d/2].
        if (not _is_f32(x, cos, sin) or x.ndim < 2 or x.size == 0 or x.shape[-1] % 2
                or cos.shape != (x.shape[-2], x.shape[-1] // 2) or sin.shape != cos.shape):
            return reference(x, cos, sin)
        rows = _f32_rows(x)
        out = np.empty_like(rows)
        kernel(rows, np.ascontiguousarray(cos), np.ascontiguousarray(sin), out)
        return out.reshape(x.shape)

    # -- attention -------------------------------------------------------------------------
    def attention(self, q, k, v, mask, scale):
        if (not _is_f32(q, k, v, mask) or q.ndim != 4 or k.ndim != 4 or v.ndim != 4
                or q.size == 0 or k.shape[2] == 0
                or not _broadcasts_to(k.shape[:2], q.shape[:2])
                or k.shape[:3] != v.shape[:3] or k.shape[3] != q.shape[3]):
            return super().attention(q, k, v, mask, scale)
        if q.shape[2] > FUSED_ATTENTION_MAX_QUERIES:
            return _long_attention(q, k, v, mask, scale)
        batch, heads, tq, _ = q.shape
        tk = k.shape[2]
        target = (batch, heads, tq, tk)
        if mask is None:
            mask = np.zeros((1, 1, 1, 1), np.float32)
        try:
            mask = np.broadcast_to(mask, target)
        except ValueError:
            raise ShapeMismatch(f"attention: mask {list(mask.shape)} does not broadcast to the "
                                f"scores {list(target)}") from None
        if mask.ndim != 4:
            return super().attention(q, k, v, mask, scale)
        out = np.empty((batch, heads, tq, v.shape[3]), np.float32)
        nk.attention_rows(np.ascontiguousarray(q), np.ascontiguousarray(k),
                          np.ascontiguousarray(v), mask, np.float32(scale), out)
        return out

    # -- quantized matmul ------------------------------------------------------------------
    def qmatmul(self, x, qweight):
        if qweight.dtype not in UNPACKABLE or len(qweight.shape) != 2:
            return super().qmatmul(x, qweight)
        n, k = qweight.shape
        x = np.asarray(x)
        if x.ndim == 0 or x.shape[-1] != k:
            raise ShapeMismatch(f"qmatmul: x of shape {x.shape} cannot multiply a weight of "
                                f"shape {qweight.shape} (last dims must both be {k})")
        if x.dtype != np.float32:
            x = x.astype(np.float32)
        rows = _f32_rows(x)
        weight = kernel_weight(qweight)
        if rows.shape[0] >= QMATMUL_BLAS_MIN_ROWS:
            dense = _DENSE_WEIGHTS.get(qweight, weight)
            out = rows @ dense.T if dense is not None else _qmatmul_through_blas(rows, weight, n)
        else:
            out = np.empty((rows.shape[0], n), np.float32)
            if weight.use_offsets:
                xsum = rows.reshape(rows.shape[0], -1, weight.group).sum(axis=2, dtype=np.float32)
            else:
                xsum = np.zeros((1, 1), np.float32)
            kernel = nk.qmatmul_g32 if weight.group == 32 else nk.qmatmul_g16
            kernel(rows, weight.levels, weight.scales, weight.offsets, xsum, weight.use_offsets,
                   out)
        return out.reshape(*x.shape[:-1], n)


def _gelu_erf_vector(x):
    """GELU through the vectorised erf (vector_math.py), serial: on this oversubscribed 2-core
    machine the threaded flavour measured 7x slower than the serial one on Whisper's encoder
    activations (2.3M elements: 9 ms serial, against 190 ms for the libm-erf kernel)."""
    x = np.ascontiguousarray(x)
    out = np.empty_like(x)
    vector_math.gelu_erf_vector_serial(x.reshape(-1), out.reshape(-1))
    return out


def _long_attention(q, k, v, mask, scale):
    from .blocked_attention import blocked_attention

    if mask is not None:
        target = q.shape[:3] + (k.shape[2],)
        try:
            mask = np.broadcast_to(mask, target)
        except ValueError:
            raise ShapeMismatch(f"attention: mask {list(mask.shape)} does not broadcast to the "
                                f"scores {list(target)}") from None
    return blocked_attention(q, k, v, mask, scale)


def _broadcasts_to(source, target) -> bool:
    return all(s in (1, t) for s, t in zip(source, target))


def _qmatmul_through_blas(rows, weight, n):
    """Decode a band of weight rows to f32 (exactly the reference values) and let BLAS multiply."""
    k = rows.shape[1]
    out = np.empty((rows.shape[0], n), np.float32)
    band = np.empty((min(n, QMATMUL_BAND_ROWS), k), np.float32)
    for start in range(0, n, QMATMUL_BAND_ROWS):
        stop = min(n, start + QMATMUL_BAND_ROWS)
        chunk = band[:stop - start]
        nk.dequantize_rows_into(weight.levels, weight.scales, weight.offsets, weight.use_offsets,
                                weight.group, start, chunk)
        np.matmul(rows, chunk.T, out=out[:, start:stop])
    return out
