"""The wasm backend's accelerated parts: Whisper's encoder and decode step and LLaMA's decode
step as a short, fixed sequence of kernel calls on numpy buffers (backend/parts.py declares
them; models/whisper.py and llama.py look them up).

Why a part and not the tensor path: in Pyodide every tensor op costs tens of microseconds of
interpreter work before any arithmetic, and a decode step is ~60 ops per block. Here a block
is a dozen kernel calls (~3 us each through the JS FFI) plus a few small numpy writes, with
every weight passed in place; nothing is allocated per token except tiny activations.

The arithmetic is the tensor path's (layer/RMS norms, biased products, attention with the same
1/sqrt(dh) scale, exact-erf GELU, SiLU-and-multiply), in the kernels' summation order. Weight
matrices that hold only f16 values (Whisper's CTranslate2 files store f16) are multiplied from
their f16 bits, which is exact and halves the bytes a memory-bound step reads; otherwise from
the model's own f32 storage. LLaMA's quantized weights are multiplied straight from their GGML
blocks. A factory returns None when the weights do not fit (a missing bias, another dtype, a
GGML type the module lacks), and the model keeps its tensor path.
"""

from __future__ import annotations

import math
import weakref

import numpy as np

from . import parts, wasm_abi
from .settings import settings

_F32 = np.dtype(np.float32)
_UNARY_GELU_ERF = wasm_abi.UNARY_OPS["gelu_erf"]


class _Unfit(Exception):
    """A weight the kernels cannot take."""


def _f32(tensor) -> np.ndarray:
    if tensor is None:
        raise _Unfit
    array = tensor.storage_numpy() if hasattr(tensor, "storage_numpy") else tensor
    if not isinstance(array, np.ndarray) or array.dtype != _F32:
        raise _Unfit
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
                raise _Unfit
        self.n_head = block.n_head
        linear = lambda affine: _Linear(call, _f32(affine.weight), affine.bias, use_half)  # noqa: E731
        self.attn_ln = _norm(block.attn_ln)
        self.qkv = linear(block.qkv)
        self.attn_out = linear(block.attn_out)
        self.mlp_ln = _norm(block.mlp_ln)
        self.fc1 = linear(block.fc1)
        self.fc2 = linear(block.fc2)
        self.cross = None
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
                raise _Unfit
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
        except _Unfit:
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
            raise _Unfit
        # f16 bits for matrices that hold only f16 values, unless CANDLE_WEB_WHISPER_F16=0.
        use_half = settings().whisper_f16
        self.blocks = [_WhisperBlock(call, block, use_half) for block in weights.blocks]
        self.projection = _Linear(call, self.embedding, None, use_half)  # tied: [vocab, d]
        self._features = None  # weakref to the features the cross K/V below belong to
        self._cross = None

    @staticmethod
    def build(backend, weights):
        try:
            return WhisperDecoderStep(backend, weights)
        except _Unfit:
            return None

    def _cross_kv(self, features: np.ndarray) -> list:
        """Per block and audio row: (keys, values) [h, n_audio, dh]."""
        if self._features is not None and self._features() is features:
            return self._cross
        cross = []
        for block in self.blocks:
            per_row = []
            d = features.shape[2]
            for audio in features:
                kv = block.cross_kv(np.ascontiguousarray(audio, dtype=_F32))  # [n_audio, 2d]
                per_row.append((_split_heads(kv[:, :d], block.n_head),
                                _split_heads(kv[:, d:], block.n_head)))
            cross.append(per_row)
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
        for block, (keys, values), cross_kv in zip(self.blocks, caches, cross):
            h = block.n_head
            dh = d // h
            capacity = keys.shape[2]
            qkv = block.qkv(_layer_norm(call, block.attn_ln, x))  # [R, 3d]
            keys[:, :, position, :] = qkv[:, d:2 * d].reshape(rows, h, dh)
            values[:, :, position, :] = qkv[:, 2 * d:].reshape(rows, h, dh)
            q = np.ascontiguousarray(qkv[:, :d])  # [R, h, dh] as rows of dh
            attended = np.empty((rows, d), _F32)
            _attend(call, q, dh, keys, capacity * dh, values, capacity * dh, rows * h, 1,
                    position + 1, dh, None, attended)
            x += block.attn_out(attended)
            q = block.cross_q(_layer_norm(call, block.cross_ln, x))
            attended = np.empty((rows, d), _F32)
            for r in range(rows):
                ck, cv = cross_kv[r if len(cross_kv) > 1 else 0]
                n_audio = ck.shape[1]
                _attend(call, q[r], dh, ck, n_audio * dh, cv, n_audio * dh, h, 1, n_audio, dh,
                        None, attended[r])
            x += block.cross_out(attended)
            hidden = block.fc1(_layer_norm(call, block.mlp_ln, x))
            call("unary_f32", _UNARY_GELU_ERF, hidden.size, hidden, hidden)
            x += block.fc2(hidden)
        if not with_logits:
            return None
        return self.projection(_layer_norm(call, self.ln, x))


# -- LLaMA ----------------------------------------------------------------------------------------
class _QLinear:
    """y = x W^T for a QMatMul: each of its GGML tensors (a fused QKV may hold three) straight
    from its blocks into its slice of the output, or f32 weights through gemm_f32."""

    def __init__(self, call, qmatmul, types: frozenset):
        self.call = call
        self.pieces = []
        if qmatmul.is_quantized:
            offset = 0
            for qtensor in qmatmul.qweights:
                kind = int(qtensor.dtype)
                if kind not in types:
                    raise _Unfit
                n, k = qtensor.shape
                self.pieces.append((kind, offset, n, k, np.asarray(qtensor.data)))
                offset += n
            self.n, self.k = offset, self.pieces[0][3]
        else:
            self.weight = _f32(qmatmul.weight)
            self.n, self.k = self.weight.shape

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """x [k] -> [n]."""
        out = np.empty((1, self.n), _F32)
        if not self.pieces:
            self.call("gemm_f32", 1, 1, self.n, self.k, x, 0, self.k, 1, self.weight, 0, 1,
                      self.k, out, 0, self.n, 0.0)
            return out[0]
        for kind, offset, n, k, blocks in self.pieces:
            self.call("linear_q", kind, 1, n, k, x, k, blocks, out[0, offset:offset + n], n)
        return out[0]


class LlamaDecoderStep:
    """`llama.decoder_step` on the wasm kernels: one token of batch 1 through every block."""

    def __init__(self, backend, weights: parts.LlamaDecoderWeights):
        self.call = call = backend.host.call
        types = frozenset(wasm_abi.LINEAR_Q_TYPES)
        self.w = weights
        self.layers = []
        for layer in weights.layers:
            self.layers.append((
                _f32(layer.attn_norm).reshape(-1), _f32(layer.mlp_norm).reshape(-1),
                float(layer.eps), _QLinear(call, layer.qkv, types), _QLinear(call, layer.out, types),
                _QLinear(call, layer.gate_up, types), _QLinear(call, layer.down, types)))
        self.norm = _f32(weights.norm).reshape(-1)
        self.head = _QLinear(call, weights.lm_head, types)
        self.scale = 1.0 / math.sqrt(weights.head_dim)

    @staticmethod
    def build(backend, weights):
        try:
            return LlamaDecoderStep(backend, weights)
        except _Unfit:
            return None

    def __call__(self, x: np.ndarray, pos: int, caches, cos: np.ndarray, sin: np.ndarray):
        call = self.call
        w = self.w
        hd, nh, nkv = w.head_dim, w.num_heads, w.num_kv_heads
        q_size, kv_size = nh * hd, nkv * hd
        n_rep = nh // nkv
        x = np.array(x, dtype=_F32).reshape(1, -1)
        d = x.shape[1]
        h = np.empty_like(x)
        cos_row = np.ascontiguousarray(cos[pos:pos + 1])
        sin_row = np.ascontiguousarray(sin[pos:pos + 1])
        interleaved = 1 if w.rope_interleaved else 0
        for (attn_norm, mlp_norm, eps, qkv, out, gate_up, down), (keys, values) in zip(
                self.layers, caches):
            call("rms_norm_rows", 1, d, x, attn_norm, eps, h)
            projected = qkv(h[0])  # [q | k | v]
            qk = projected[:q_size + kv_size]
            # q heads then k heads, each [1, hd]: one rope call over nh + nkv "rows".
            call("rope_f32", interleaved, nh + nkv, 1, hd, qk, cos_row, sin_row, qk)
            capacity = keys.shape[1]
            keys[:, pos, :] = qk[q_size:].reshape(nkv, hd)
            values[:, pos, :] = projected[q_size + kv_size:].reshape(nkv, hd)
            attended = np.empty(q_size, _F32)
            # Grouped queries: the n_rep query heads of a kv head are n_rep query rows of it.
            call("attention_f32", nkv, n_rep, pos + 1, hd, projected, n_rep * hd, keys,
                 capacity * hd, values, capacity * hd, None, 0, self.scale, attended, n_rep * hd)
            x += out(attended)
            call("rms_norm_rows", 1, d, x, mlp_norm, eps, h)
            gu = gate_up(h[0])
            ffn = gu.shape[0] // 2
            act = np.empty(ffn, _F32)
            call("silu_mul", ffn, gu[:ffn], gu[ffn:], act)
            x += down(act)
        call("rms_norm_rows", 1, d, x, self.norm, w.norm_eps, h)
        return self.head(h[0])


def register() -> None:
    """Offer the parts on the wasm backend (called when the backend is created)."""
    parts.register_part(parts.WHISPER_ENCODER, "wasm",
                        lambda weights: _build(WhisperEncoder, weights))
    parts.register_part(parts.WHISPER_DECODER_STEP, "wasm",
                        lambda weights: _build(WhisperDecoderStep, weights))
    parts.register_part(parts.LLAMA_DECODER_STEP, "wasm",
                        lambda weights: _build(LlamaDecoderStep, weights))


def _build(cls, weights):
    from . import get_backend

    return cls.build(get_backend("wasm"), weights)
