"""The numba backend's fused Whisper encoder: the same f32 arithmetic as the tensor path, laid
out so that little time is lost outside sgemm.

What the tensor path spends outside its matrix products (one 30 s window of tiny.en, profiled):
conv1d's im2col (a padded copy, a [3000, 240] / [1500, 1152] column matrix and a transposed
copy of the result), a bias add and a GELU pass over [384, 3000] per conv, the transpose to
[1500, 384], and per block eight full-size elementwise passes (bias adds, residual adds) over
DRAM-sized intermediates (the MLP's [1500, 1536] is 9 MB); attention runs one head at a time
with a serial softmax pass while the second core waits.

Here the activations are kept time-major ([frames, channels]) from the start and the work is
done in blocks of ROW_BLOCK rows on a small thread pool (row_pool.py) with one-threaded BLAS:
- conv (kernel 3, padding 1) as three accumulated products of shifted (and, for stride 2,
  strided) row views with the taps [c_in, c_out]: no column matrix, and the output is already
  time-major; bias, GELU and the positions are applied to the block while it is in cache;
- per block, everything that is row-local runs block by block: layer norm and the fused QKV
  product; then attention per (head, block of query rows): scores by BLAS, one numba pass for
  exp and row sums, BLAS for the weighted sum, written straight into the merged-heads layout;
  then out projection + bias + residual, layer norm, fc1 + bias, GELU, fc2 + bias + residual,
  with the [ROW_BLOCK, 4d] hidden block staying in L2.

Sums are the reference's in another order (BLAS blocking, the conv's three taps), so results
agree with the tensor path to f32 rounding (tests/native/test_numba_whisper_encoder.py).
Under the compute type int8 (CANDLE_WEB_COMPUTE_TYPE) the blocks' four linear layers multiply
int8 weights (per output row, quantized when the part is built) by int8 activations
(kernels/qint8.py); the convolutions and attention stay f32 (tests/native/
test_numba_whisper_int8.py).
`FusedWhisperEncoder.build` returns None when the weights do not fit (not f32, a missing bias,
not the kernel-3 convs) or BLAS threads cannot be controlled; the model then keeps its tensor
path.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from .. import row_pool
from ..kernels import qint8
from ..kernels.norms import layer_norm_serial
from ..kernels.vector_math import exp_shifted_rows, gelu_erf_vector_serial
from .int8_linear import GROUP, int8_compute, int8_weight

# Rows per work item of the row-local phases (convs, QKV, MLP): one-threaded sgemm loses
# efficiency on short products, and 1500 rows in blocks of 384 still give each of two threads
# two items (whole encoder, load 5-6: 1.27-1.32 s of CPU at 384 rows, 1.57-1.65 s at 128).
ROW_BLOCK = 384
# Query rows per attention work item: 128 x 1500 f32 scores (768 KB) stay in a core's 2 MB L2
# between the two products; 6 heads x 12 blocks balance well over two threads.
ATTENTION_ROW_BLOCK = 128
CONV_KERNEL = 3  # Whisper's two convolutions: kernel 3, padding 1, strides 1 and 2
CONV_STRIDES = (1, 2)


class _Unfit(Exception):
    """A weight the fused path does not take."""


def _f32(tensor, shape=None) -> np.ndarray:
    if tensor is None:
        raise _Unfit
    array = tensor.storage_numpy()
    if array.dtype != np.float32:
        raise _Unfit
    if shape is not None:
        if array.size != int(np.prod(shape)):
            raise _Unfit
        array = array.reshape(shape)
    return array


class _Linear:
    """y = x w^T + b, w kept [out, in] as loaded: BLAS reads w.T through its transpose flag.
    Under the compute type int8 w is quantized per output row when the part is built and the
    product runs in integer arithmetic (int8_linear.py, kernels/qint8.py), one thread per row
    block as BLAS is here; each output row's bits then depend on that row alone."""

    def __init__(self, linear, n_in):
        weight = _f32(linear.weight)
        if weight.ndim != 2 or weight.shape[1] != n_in:
            raise _Unfit
        self.n_out = weight.shape[0]
        self.bias = _f32(linear.bias, (self.n_out,))
        if int8_compute() and n_in % GROUP:
            raise _Unfit  # the int8 products take whole 32-element blocks
        self.weight_t = None if int8_compute() else weight.T
        self.int8 = int8_weight(weight) if self.weight_t is None else None

    def into(self, x, out):
        if self.int8 is not None:
            qint8.rows_serial(np.ascontiguousarray(x), self.int8, out)
        else:
            np.matmul(x, self.weight_t, out=out)
        out += self.bias
        return out


class _LayerNorm:
    def __init__(self, norm, width):
        self.weight = _f32(norm.weight, (width,))
        self.bias = _f32(norm.bias, (width,))
        self.eps = np.float32(norm.eps)

    def __call__(self, x):
        out = np.empty_like(x)
        layer_norm_serial(x, self.weight, self.bias, self.eps, out)
        return out


class _Block:
    def __init__(self, block, d):
        """`block`: a WhisperBlockWeights (candle_web.backend.parts)."""
        if block.qkv is None or d % block.n_head:
            raise _Unfit
        self.n_head = block.n_head
        self.attn_ln = _LayerNorm(block.attn_ln, d)
        self.qkv = _Linear(block.qkv, d)
        self.out = _Linear(block.attn_out, d)
        self.mlp_ln = _LayerNorm(block.mlp_ln, d)
        self.fc1 = _Linear(block.fc1, d)
        self.fc2 = _Linear(block.fc2, self.fc1.n_out)
        if self.qkv.n_out != 3 * d or self.out.n_out != d or self.fc2.n_out != d:
            raise _Unfit


def _gelu(x, out):
    """out = gelu(x); never in place: when x and out may alias, LLVM does not vectorise the
    loop (measured 21 ns per element in place against 3 ns out of place)."""
    gelu_erf_vector_serial(x.reshape(-1), out.reshape(-1))
    return out


@dataclass
class _BlockBuffers:
    """A window's block intermediates: qkv [n, 3d]; keys transposed [d, n] and values
    head-major (flat, viewed [h, n, dh]) for attention; the heads merged back [n, d]."""
    qkv: np.ndarray
    keys_t: np.ndarray
    values: np.ndarray
    merged: np.ndarray


class FusedWhisperEncoder:
    def __init__(self, encoder):
        """`encoder`: the model's WhisperEncoderWeights (candle_web.backend.parts)."""
        d = encoder.positions.dims()[1]
        self.d = d
        self.conv_taps, self.conv_bias = [], []
        for conv in (encoder.conv1, encoder.conv2):
            weight, bias = conv.weight, conv.bias
            w = _f32(weight)
            if w.ndim != 3 or w.shape[0] != d or w.shape[2] != CONV_KERNEL:
                raise _Unfit
            self.conv_taps.append(np.ascontiguousarray(w.transpose(2, 1, 0)))  # [k, c_in, d]
            self.conv_bias.append(_f32(bias, (d,)))
        if self.conv_taps[1].shape[1] != d:
            raise _Unfit
        self.n_mels = self.conv_taps[0].shape[1]
        self.positions = _f32(encoder.positions)
        self.blocks = [_Block(block, d) for block in encoder.blocks]
        self.ln_post = _LayerNorm(encoder.ln_post, d)
        self._scratch = threading.local()

    @staticmethod
    def build(encoder):
        """A FusedWhisperEncoder for a Whisper encoder's exported weights, or None when they do
        not fit or BLAS's thread count cannot be set (see row_pool.py)."""
        if not row_pool.available():
            return None
        try:
            return FusedWhisperEncoder(encoder)
        except _Unfit:
            return None

    # -- forward ----------------------------------------------------------------------------
    def __call__(self, mel: np.ndarray) -> np.ndarray:
        """mel f32 [b, n_mels, frames] -> audio features f32 [b, ceil(frames / 2), d].
        The caller has checked the mel bins and that the frames fit the positions."""
        with row_pool.single_threaded_blas():
            return np.stack([self._encode_one(np.asarray(m, np.float32)) for m in mel])

    def _encode_one(self, mel):
        frames = mel.shape[1]
        # Time-major input with one zero row either side (the convolutions' padding 1).
        padded_mel = np.zeros((frames + 2, self.n_mels), np.float32)
        padded_mel[1:-1] = mel.T
        hidden = np.zeros((frames + 2, self.d), np.float32)
        self._conv(padded_mel, 0, hidden[1:-1], None)
        n_ctx = (frames - 1) // CONV_STRIDES[1] + 1
        x = np.empty((n_ctx, self.d), np.float32)
        self._conv(hidden, 1, x, self.positions[:n_ctx])
        # One set of intermediates for all blocks: fresh multi-MB arrays per block would fault
        # their pages in again every time.
        buffers = _BlockBuffers(qkv=np.empty((n_ctx, 3 * self.d), np.float32),
                                keys_t=np.empty((self.d, n_ctx), np.float32),
                                values=np.empty(n_ctx * self.d, np.float32),
                                merged=np.empty((n_ctx, self.d), np.float32))
        for block in self.blocks:
            self._block(block, x, buffers)
        out = np.empty_like(x)

        def final_norm(rows):
            out[rows[0]:rows[1]] = self.ln_post(x[rows[0]:rows[1]])

        row_pool.run_items(final_norm, row_pool.row_blocks(n_ctx, ROW_BLOCK))
        return out

    def _conv(self, padded, which, out, positions):
        """out[t] = gelu(sum_k padded[stride t + k] @ taps[k] + bias) (+ positions[t])."""
        taps, bias, stride = self.conv_taps[which], self.conv_bias[which], CONV_STRIDES[which]

        def rows(span):
            start, stop = span
            summed = np.empty((stop - start, out.shape[1]), np.float32)
            tap = np.empty_like(summed)
            for k in range(CONV_KERNEL):
                first = stride * start + k
                shifted = padded[first:first + stride * (stop - start):stride]
                np.matmul(shifted, taps[k], out=tap if k else summed)
                if k:
                    summed += tap
            summed += bias
            block = _gelu(summed, out[start:stop])
            if positions is not None:
                block += positions[start:stop]

        row_pool.run_items(rows, row_pool.row_blocks(out.shape[0], ROW_BLOCK))

    def _block(self, block, x, buffers):
        n, d = x.shape
        qkv, keys_t, merged = buffers.qkv, buffers.keys_t, buffers.merged
        spans = row_pool.row_blocks(n, ROW_BLOCK)

        head_dim = d // block.n_head
        # Keys transposed ([d, n]: head h's K^T is rows h*dh..) and values head-major ([h, n, dh]),
        # written by each row block as it is projected: attention's products then read
        # contiguous operands (single-thread sgemm on these shapes: q K^T 29 -> 35 GFLOP/s,
        # P V 36 -> 39, against column slices of qkv).
        values = buffers.values.reshape(block.n_head, n, head_dim)

        def project_qkv(span):
            start, stop = span
            rows = qkv[start:stop]
            block.qkv.into(block.attn_ln(x[start:stop]), rows)
            keys_t[:, start:stop] = rows[:, d:2 * d].T
            heads = rows[:, 2 * d:].reshape(stop - start, block.n_head, head_dim)
            values[:, start:stop] = heads.transpose(1, 0, 2)

        row_pool.run_items(project_qkv, spans)
        scale = np.float32(head_dim ** -0.5)

        def attend(item):
            head, (start, stop) = item
            cols = slice(head * head_dim, (head + 1) * head_dim)
            scores, sums, weighted = self._attention_scratch(ATTENTION_ROW_BLOCK, n, head_dim)
            rows = stop - start
            scores, sums, weighted = scores[:rows], sums[:rows], weighted[:rows]
            # The reference scales the scores; scaling q is the same for power-of-two scales
            # (1/8 at head size 64), f32 rounding otherwise.
            np.matmul(qkv[start:stop, cols] * scale, keys_t[cols], out=scores)
            exp_shifted_rows(scores, sums)
            np.matmul(scores, values[head], out=weighted)
            np.divide(weighted, sums[:, None], out=merged[start:stop, cols])

        query_spans = row_pool.row_blocks(n, ATTENTION_ROW_BLOCK)
        row_pool.run_items(attend, [(h, span) for h in range(block.n_head) for span in query_spans])

        def mlp(span):
            start, stop = span
            rows = x[start:stop]
            projected = np.empty((stop - start, d), np.float32)
            rows += block.out.into(merged[start:stop], projected)
            hidden = np.empty((stop - start, block.fc1.n_out), np.float32)
            block.fc1.into(block.mlp_ln(rows), hidden)
            rows += block.fc2.into(_gelu(hidden, np.empty_like(hidden)), projected)

        row_pool.run_items(mlp, spans)

    def _attention_scratch(self, rows, width, head_dim):
        """Per-thread buffers, reused across items: fresh 768 KB arrays would be new pages
        (page faults) on every item."""
        held = getattr(self._scratch, "buffers", None)
        if held is None or held[0].shape != (rows, width) or held[2].shape[1] != head_dim:
            held = (np.empty((rows, width), np.float32), np.empty(rows, np.float32),
                    np.empty((rows, head_dim), np.float32))
            self._scratch.buffers = held
        return held
