"""The wasm backend's accelerated parts: Whisper's encoder and decode step and LLaMA's decode
step on the kernels of `kernels.wasm` (backend/parts.py declares them and decides when they
run; this package's __init__ registers them).

Why a part and not the tensor path: in Pyodide every tensor op costs tens of microseconds of
interpreter work before any arithmetic, and a decode step is ~60 ops per block. Here a decode
step is one kernel call per block (web/kernels/steps.c: `llama_block_step`;
whisper_steps.c: `whisper_block_step`) plus one for the final norm and the vocabulary
projection, with every weight and KV buffer passed in place and the activations in a `work`
buffer allocated once.
The encoder, whose products are large, is a dozen calls per block.

The arithmetic is the tensor path's (layer/RMS norms, biased products, attention with the same
1/sqrt(dh) scale, exact-erf GELU, SiLU-and-multiply), in the kernels' summation order. Weight
matrices that hold only f16 values (Whisper's CTranslate2 files store f16) are multiplied from
their f16 bits, which is exact and halves the bytes a memory-bound step reads; otherwise from
the model's own f32 storage. LLaMA's quantized weights are multiplied straight from their GGML
blocks. A class raises `UnfitWeights` when the weights do not fit (a missing bias, another
dtype, a GGML type the module lacks); its factory then returns None and the model keeps its
tensor path. The two-thread versions (team_parts.py) wrap these classes and stand aside on the
same error.
"""

from __future__ import annotations

import math
import weakref

import numpy as np

from .. import parts
from ...core.errors import UnsupportedError
from ..settings import settings
from . import abi

_F32 = np.dtype(np.float32)
_UNARY_GELU_ERF = abi.UNARY_OPS["gelu_erf"]
_MATRIX_F32, _MATRIX_F16 = abi.MATRIX_TYPES["f32"], abi.MATRIX_TYPES["f16"]
_MATRIX_INT8 = abi.MATRIX_FLAGS["int8"]


class UnfitWeights(UnsupportedError):
    """The weights do not fit the kernels (the message says which); the part's factory returns
    None and the model's tensor path runs."""


def _f32(tensor) -> np.ndarray:
    if tensor is None:
        raise UnfitWeights("a weight the kernels need is absent")
    array = tensor.storage_numpy() if hasattr(tensor, "storage_numpy") else tensor
    if not isinstance(array, np.ndarray) or array.dtype != _F32:
        raise UnfitWeights(f"a weight is {getattr(array, 'dtype', type(array).__name__)}, the "
                           "kernels take float32")
    return np.ascontiguousarray(array)


def _exact_half(matrix: np.ndarray):
    """The f16 bits of a matrix whose every value is an f16 value, else None."""
    halves = matrix.astype(np.float16)
    if not np.array_equal(halves.astype(np.float32), matrix):
        return None
    return halves.view(np.uint16)


class _Linear:
    """y = x W^T + b with W [n, k] as f32 (gemm_f32 on the transposed view) or f16 bits."""

    def __init__(self, call, weight: np.ndarray, bias, use_half: bool):
        self.call = call
        self.n, self.k = weight.shape
        self.bias = None if bias is None else _f32(bias).reshape(-1)
        self.half = _exact_half(weight) if use_half else None
        self.weight = None if self.half is not None else weight

    @property
    def matrix(self) -> tuple:
        """(type, array) as the fused steps take a matrix: 1 f16 bits, 0 f32 rows."""
        return (_MATRIX_F16, self.half) if self.weight is None else (_MATRIX_F32, self.weight)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """x [m, k] C-ordered -> x W^T + b [m, n]."""
        out = np.empty((x.shape[0], self.n), _F32)
        if self.weight is None:
            self.call("linear_f16", x.shape[0], self.n, self.k, x, self.k, self.half, out, self.n)
            if self.bias is not None:
                out += self.bias
            return out
        if self.bias is None:
            self._gemm(x, out, 0.0)
        else:
            out[...] = self.bias
            self._gemm(x, out, 1.0)
        return out

    def add_to(self, acc: np.ndarray, x: np.ndarray) -> None:
        """acc [m, n] += x W^T + b, accumulated by the product itself where W is f32 (no
        temporary: the encoder's residual adds are [1500, d])."""
        if self.weight is None:
            acc += self(x)
            return
        if self.bias is not None:
            acc += self.bias
        self._gemm(x, acc, 1.0)

    def _gemm(self, x: np.ndarray, out: np.ndarray, beta: float) -> None:
        # B[k, n] = W[n, k]: row stride 1, column stride k (the weight is never copied).
        m = x.shape[0]
        self.call("gemm_f32", 1, m, self.n, self.k, x, 0, self.k, 1, self.weight, 0, 1, self.k,
                  out, 0, self.n, beta)


def _layer_norm(call, norm, x: np.ndarray, out: np.ndarray = None) -> np.ndarray:
    weight, bias, eps = norm
    if out is None:
        out = np.empty_like(x)
    call("layer_norm_rows", x.shape[0], x.shape[1], x, weight, bias, eps, out)
    return out


def _norm(ln) -> tuple:
    return (_f32(ln.weight).reshape(-1), None if ln.bias is None else _f32(ln.bias).reshape(-1),
            float(ln.eps))


# -- Whisper -------------------------------------------------------------------------------------
class _WhisperBlock:
    def __init__(self, call, block, use_half: bool):
        for affine in (block.qkv, block.attn_out, block.fc1, block.fc2):
            if affine.bias is None:
                raise UnfitWeights("a Whisper block's linear layer has no bias")
        self.n_head = block.n_head
        linear = lambda affine: _Linear(call, _f32(affine.weight), affine.bias, use_half)  # noqa: E731
        self.attn_ln = _norm(block.attn_ln)
        self.qkv = linear(block.qkv)
        self.attn_out = linear(block.attn_out)
        self.mlp_ln = _norm(block.mlp_ln)
        self.fc1 = linear(block.fc1)
        self.fc2 = linear(block.fc2)
        if block.cross_q is not None:
            self.cross_ln = _norm(block.cross_ln)
            self.cross_q = linear(block.cross_q)
            self.cross_kv = linear(block.cross_kv)
            self.cross_out = linear(block.cross_out)


def _attend(call, q, q_bs, keys, k_bs, values, v_bs, bh, tq, tk, dh, mask, out):
    """softmax(q k^T / sqrt(dh) + mask) v for `bh` (batch x head) rows of `tq` queries."""
    call("attention_f32", bh, tq, tk, dh, q, q_bs, keys, k_bs, values, v_bs, mask,
         0, 1.0 / math.sqrt(dh), out, tq * dh)


def _split_heads(x: np.ndarray, n_head: int) -> np.ndarray:
    """[t, h*dh] -> [h, t, dh], C-ordered (the attention kernel's row layout)."""
    t, d = x.shape
    return np.ascontiguousarray(x.reshape(t, n_head, d // n_head).transpose(1, 0, 2))


def _merge_heads(x: np.ndarray) -> np.ndarray:
    """[h, t, dh] -> [t, h*dh]."""
    h, t, dh = x.shape
    return np.ascontiguousarray(x.transpose(1, 0, 2)).reshape(t, h * dh)


class WhisperEncoder:
    """`whisper.encoder` on the wasm kernels: convolutions as three shifted products each
    (no column matrix), then per block norm, fused QKV, blocked attention per head, output
    projection, MLP; the activations stay time-major [frames, d] throughout."""

    def __init__(self, backend, weights: parts.WhisperEncoderWeights):
        self.call = call = backend.host.call
        # Convolution taps as [kernel, c_out, c_in] so that tap j is a linear layer.
        self.convs = []
        for conv in (weights.conv1, weights.conv2):
            w = _f32(conv.weight)  # [c_out, c_in, 3]
            if w.ndim != 3 or w.shape[2] != 3 or conv.bias is None:
                raise UnfitWeights(f"a Whisper convolution of shape {list(w.shape)} (bias "
                                   f"{'absent' if conv.bias is None else 'present'}): the "
                                   "kernels take kernel 3 with a bias")
            taps = [np.ascontiguousarray(w[:, :, j]) for j in range(3)]
            self.convs.append(([_Linear(call, tap, None, False) for tap in taps],
                               _f32(conv.bias).reshape(-1)))
        self.positions = _f32(weights.positions)
        self.blocks = [_WhisperBlock(call, block, False) for block in weights.blocks]
        self.ln_post = _norm(weights.ln_post)

    @staticmethod
    def build(backend, weights):
        try:
            return WhisperEncoder(backend, weights)
        except UnfitWeights:
            return None

    def _conv_gelu(self, index: int, x: np.ndarray, stride: int) -> np.ndarray:
        """x [frames, c_in] time-major -> gelu(conv(x) + b) [frames // stride, c_out]; kernel 3,
        padding 1: output t reads input rows stride*t - 1, stride*t, stride*t + 1."""
        taps, bias = self.convs[index]
        frames = x.shape[0]
        padded = np.zeros((frames + 2, x.shape[1]), _F32)
        padded[1:-1] = x
        out_frames = (frames - 1) // stride + 1
        out = np.empty((out_frames, taps[0].n), _F32)
        out[...] = bias
        for j, tap in enumerate(taps):
            rows = padded[j:j + stride * (out_frames - 1) + 1:stride]
            tap.add_to(out, np.ascontiguousarray(rows))
        self.call("unary_f32", _UNARY_GELU_ERF, out.size, out, out)
        return out

    def __call__(self, mel: np.ndarray) -> np.ndarray:
        """mel [b, n_mels, frames] -> features [b, frames // 2, d] (after ln_post)."""
        return np.stack([self._one(np.ascontiguousarray(m.T, dtype=_F32)) for m in mel])

    def _one(self, mel_t: np.ndarray) -> np.ndarray:
        call = self.call
        x = self._conv_gelu(0, mel_t, 1)
        x = self._conv_gelu(1, x, 2)
        x += self.positions[:x.shape[0]]
        frames = x.shape[0]
        for block in self.blocks:
            h = _layer_norm(call, block.attn_ln, x)
            qkv = block.qkv(h)
            d = x.shape[1]
            dh = d // block.n_head
            q, k, v = (_split_heads(qkv[:, i * d:(i + 1) * d], block.n_head) for i in range(3))
            attended = np.empty_like(q)
            _attend(call, q, frames * dh, k, frames * dh, v, frames * dh, block.n_head, frames,
                    frames, dh, None, attended)
            block.attn_out.add_to(x, _merge_heads(attended))
            h = _layer_norm(call, block.mlp_ln, x)
            hidden = block.fc1(h)
            call("unary_f32", _UNARY_GELU_ERF, hidden.size, hidden, hidden)
            block.fc2.add_to(x, hidden)
        return _layer_norm(call, self.ln_post, x)


class WhisperDecoderStep:
    """`whisper.decoder_step` on the wasm kernels. Cross-attention keys and values are
    projected once per audio (the features array of a decoding) and kept head-major."""

    def __init__(self, backend, weights: parts.WhisperDecoderWeights):
        self.call = call = backend.host.call
        self.embedding = _f32(weights.token_embedding)  # [vocab, d]
        self.positions = _f32(weights.positions)
        self.ln = _norm(weights.ln)
        if any(block.cross_q is None for block in weights.blocks):
            raise UnfitWeights("a Whisper decoder block without cross-attention")
        # f16 bits for matrices that hold only f16 values, unless CANDLE_WEB_WHISPER_F16=0.
        use_half = settings().whisper_f16
        self.blocks = [_WhisperBlock(call, block, use_half) for block in weights.blocks]
        self.projection = _Linear(call, self.embedding, None, use_half)  # tied: [vocab, d]
        self._features = None  # weakref to the features the cross K/V below belong to
        self._cross = None
        self._work_buffer = None
        eps = {block.attn_ln[2] for block in self.blocks} | {b.cross_ln[2] for b in self.blocks}
        if len(eps | {block.mlp_ln[2] for block in self.blocks}) != 1 or any(
                value is None for b in self.blocks
                for value in (b.attn_ln[1], b.cross_ln[1], b.mlp_ln[1], b.cross_q.bias,
                              b.cross_out.bias)):
            raise UnfitWeights("the fused Whisper block takes one eps and biased norms and "
                               "linear layers")

    @staticmethod
    def build(backend, weights):
        try:
            return WhisperDecoderStep(backend, weights)
        except UnfitWeights:
            return None

    def _cross_kv(self, features: np.ndarray) -> list:
        """Per block: (keys, values) [audio rows, h, n_audio, dh], C-ordered."""
        if self._features is not None and self._features() is features:
            return self._cross
        cross = []
        d = features.shape[2]
        for block in self.blocks:
            keys, values = [], []
            for audio in features:
                kv = block.cross_kv(np.ascontiguousarray(audio, dtype=_F32))  # [n_audio, 2d]
                keys.append(_split_heads(kv[:, :d], block.n_head))
                values.append(_split_heads(kv[:, d:], block.n_head))
            cross.append((np.stack(keys), np.stack(values)))
        self._features = weakref.ref(features)
        self._cross = cross
        return cross

    def step(self, token_ids, position: int, caches, features, with_logits: bool = True):
        """token_ids [R] -> logits [R, vocab] (None without `with_logits`), writing each
        block's key and value at `position` of its (keys, values) [R, h, capacity, dh]."""
        call = self.call
        ids = np.asarray(token_ids, dtype=np.intp).reshape(-1)
        rows = ids.shape[0]
        x = self.embedding[ids] + self.positions[position]  # [R, d]
        d = x.shape[1]
        cross = self._cross_kv(features)
        for block, (keys, values), (cross_k, cross_v) in zip(self.blocks, caches, cross):
            ffn = block.fc1.n
            work = self._work(rows * (6 * d + ffn))
            n_audio = cross_k.shape[2]
            cross_bs = cross_k[0].size if cross_k.shape[0] > 1 else 0
            if cross_k.shape[0] not in (1, rows):
                raise ValueError(f"whisper decoder step: {cross_k.shape[0]} audio rows for "
                                 f"{rows} token rows")
            ln1, ln2, ln3 = block.attn_ln, block.cross_ln, block.mlp_ln
            call("whisper_block_step", rows, d, block.n_head, ffn, position, keys.shape[2],
                 n_audio, ln1[2], 1.0 / math.sqrt(d // block.n_head), x, work,
                 ln1[0], ln1[1], *block.qkv.matrix, block.qkv.bias,
                 *block.attn_out.matrix, block.attn_out.bias,
                 ln2[0], ln2[1], *block.cross_q.matrix, block.cross_q.bias,
                 cross_k, cross_v, cross_bs, *block.cross_out.matrix, block.cross_out.bias,
                 ln3[0], ln3[1], *block.fc1.matrix, block.fc1.bias,
                 *block.fc2.matrix, block.fc2.bias, keys, values)
        if not with_logits:
            return None
        logits = np.empty((rows, self.projection.n), _F32)
        ln_w, ln_b, eps = self.ln
        call("ln_logits_step", rows, d, self.projection.n, x, ln_w, ln_b, eps,
             *self.projection.matrix, self._work(rows * d), logits)
        return logits

    def _work(self, floats: int) -> np.ndarray:
        """The activations buffer of the fused steps (grown, never shrunk)."""
        if self._work_buffer is None or self._work_buffer.size < floats:
            self._work_buffer = np.empty(floats, _F32)
        return self._work_buffer[:floats]


# -- LLaMA ----------------------------------------------------------------------------------------
class _QLinear:
    """A QMatMul as the fused steps take it: its stored pieces (a fused QKV may hold three GGML
    tensors) as (type, rows, array), type 0 f32 rows, 1 f16 bits, else a GGML type id."""

    def __init__(self, qmatmul, types: frozenset, max_pieces: int):
        self.pieces = []
        if qmatmul.is_quantized:
            int8 = settings().compute_type == "int8"
            for qtensor in qmatmul.qweights:
                kind = int(qtensor.dtype)
                n, k = qtensor.shape
                data = np.asarray(qtensor.data)
                if kind == _MATRIX_F16:  # GGML's F16 id is the matrix type's
                    data = data.view(np.uint16)
                elif kind not in types:
                    raise UnfitWeights(f"GGML type {kind} is not one the kernels multiply "
                                       f"({sorted(types)})")
                elif int8:  # the compute type int8: linear_int8.c's products
                    kind |= _MATRIX_INT8
                self.pieces.append((kind, n, data))
        else:
            weight = _f32(qmatmul.weight)
            self.pieces.append((_MATRIX_F32, weight.shape[0], weight))
        if len(self.pieces) > max_pieces:
            raise UnfitWeights(f"a projection stored as {len(self.pieces)} tensors (the fused "
                               f"step takes at most {max_pieces})")
        self.n = sum(rows for _, rows, _ in self.pieces)

    def slots(self, count: int) -> tuple:
        """(type, rows, array) x count, absent pieces as (0, 0, None)."""
        padded = self.pieces + [(0, 0, None)] * (count - len(self.pieces))
        return tuple(value for piece in padded for value in piece)

    @property
    def single(self) -> tuple:
        """(type, array) of a one-piece matrix."""
        kind, _, array = self.pieces[0]
        return kind, array




# The LlamaDecoderWeights family fields (backend/parts.py) the block step implements; a model
# using any other (q/k norms, post norms, windows, soft-capping...) keeps the reference path.
IMPLEMENTED_FAMILY_FIELDS = frozenset({"qkv_bias"})


def _bias(layer, rows: int):
    """The layer's q|k|v bias as f32 [rows], None when it has none (plain LLaMA)."""
    if layer.qkv_bias is None:
        return None
    bias = _f32(layer.qkv_bias).reshape(-1)
    if bias.shape[0] != rows:
        raise UnfitWeights(f"a q|k|v bias of {bias.shape[0]} values for {rows} rows")
    return bias


class LlamaDecoderStep:
    """`llama.decoder_step` on the wasm kernels: one token of batch 1, one call per block."""

    def __init__(self, backend, weights: parts.LlamaDecoderWeights):
        extras = weights.family_fields() - IMPLEMENTED_FAMILY_FIELDS
        if extras:
            raise UnfitWeights(f"llama.decoder_step: the kernels do not implement {sorted(extras)}")
        self.call = backend.host.call
        types = frozenset(abi.LINEAR_Q_TYPES)
        self.w = weights
        self.layers = []
        for layer in weights.layers:
            qkv = _QLinear(layer.qkv, types, 3)
            self.layers.append((
                _f32(layer.attn_norm).reshape(-1), _f32(layer.mlp_norm).reshape(-1),
                float(layer.eps), qkv, _bias(layer, qkv.n), _QLinear(layer.out, types, 1),
                _QLinear(layer.gate_up, types, 2), _QLinear(layer.down, types, 1)))
        self.norm = _f32(weights.norm).reshape(-1)
        self.head = _QLinear(weights.lm_head, types, 1)
        self.scale = 1.0 / math.sqrt(weights.head_dim)
        hd, nh, nkv = weights.head_dim, weights.num_heads, weights.num_kv_heads
        d = self.norm.shape[0]
        ffn = self.layers[0][6].n // 2
        self.ffn = ffn
        self.work = np.empty(d + (nh + 2 * nkv) * hd + nh * hd + 3 * ffn, _F32)

    @staticmethod
    def build(backend, weights):
        try:
            return LlamaDecoderStep(backend, weights)
        except UnfitWeights:
            return None

    def __call__(self, x: np.ndarray, pos: int, caches, cos: np.ndarray, sin: np.ndarray):
        call = self.call
        w = self.w
        x = np.array(x, dtype=_F32).reshape(-1)
        d = x.shape[0]
        interleaved = 1 if w.rope_interleaved else 0
        for (attn_norm, mlp_norm, eps, qkv, bias, out, gate_up, down), (keys, values) in zip(
                self.layers, caches):
            call("llama_block_step", d, w.num_heads, w.num_kv_heads, w.head_dim, self.ffn,
                 interleaved, pos, keys.shape[1], self.scale, x, self.work, attn_norm,
                 mlp_norm, eps, *qkv.slots(3), bias, *out.single, *gate_up.slots(2),
                 *down.single, keys, values, cos, sin)
        logits = np.empty(self.head.n, _F32)
        call("rms_logits_step", d, self.head.n, x, self.norm, w.norm_eps, *self.head.single,
             self.work[:d], logits)
        return logits


def _build(cls, weights, backend):
    """The part on the weights' wasm backend: its two-thread version when the backend has a
    team (team_parts.py, ?threads=2 in the page) and the weights fit it, else this module's."""
    team_part = backend.team_part(cls, weights)
    return team_part if team_part is not None else cls.build(backend, weights)


# The factories the package's __init__ registers (backend/parts.py calls them with the model's
# exported weights).
def whisper_encoder(weights: parts.WhisperEncoderWeights, backend):
    return _build(WhisperEncoder, weights, backend)


def whisper_decoder_step(weights: parts.WhisperDecoderWeights, backend):
    return _build(WhisperDecoderStep, weights, backend)


def llama_decoder_step(weights: parts.LlamaDecoderWeights, backend):
    return _build(LlamaDecoderStep, weights, backend)
