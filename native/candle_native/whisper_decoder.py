"""The numba backend's fused Whisper decode step: one machine-code call per decoder block plus
one for the final norm and vocabulary projection (numba_kernels/whisper_step.py), instead of
~60 tensor ops per block.

`FusedWhisperDecoder.build(text_decoder)` prepares the weights once or returns None when the
decoder does not fit the kernels (no bias on a linear, another dtype); the model then keeps its
generic path. The weight matrices are kept as f16 bits when they all hold f16 values (the
CTranslate2 files store f16): a step reads every weight once and is bound by DRAM bandwidth, so
half the bytes is nearly half the time; widening is exact (numba_kernels/half.py). Otherwise
they stay f32, taken from the model's tensors without copies. Cross-attention reads the audio
features and the K/V projection weights instead of projected keys and values, so a decoding
that stays on this path never projects them (see whisper_step._cross_attend).

Short prompts run here a token at a time (models/whisper.py, FUSED_PROMPT_TOKENS); longer ones
go through the generic path, and `begin` then copies its KV caches into this path's own fixed
buffers, and decode steps of one token per sequence run here.
The per-sequence state is a `FusedRun` (see models/whisper.py, DecoderState).
"""

from __future__ import annotations

import os

import numba
import numpy as np

from .decode_threads import decode_in_parallel
from .numba_kernels import whisper_step as nk
from .numba_kernels.half import exact_half_bits

# CANDLE_WEB_WHISPER_F16=0 keeps the matrices in f32 even when they hold f16 values (to compare).
F16_VARIABLE = "CANDLE_WEB_WHISPER_F16"


def _f32(tensor) -> np.ndarray:
    if tensor is None:
        raise _Unfit
    array = tensor.storage_numpy()
    if array.dtype != np.float32:
        raise _Unfit
    return array


class _Unfit(Exception):
    """A weight the kernels cannot take (missing bias, not f32)."""


class _Block:
    def __init__(self, block, matrix):
        """`matrix` prepares each weight matrix (f32 as is, or its f16 bits)."""
        attn, cross, mlp = block.attn, block.cross_attn, block.mlp
        self.n_head = attn.n_head
        self.eps = np.float32(block.attn_ln.eps)
        self.weights = (
            _f32(block.attn_ln.weight), _f32(block.attn_ln.bias),
            matrix(attn.qkv.weight), _f32(attn.qkv.bias), matrix(attn.out.weight), _f32(attn.out.bias))
        self.cross_weights = (
            _f32(block.cross_ln.weight), _f32(block.cross_ln.bias),
            matrix(cross.q.weight), _f32(cross.q.bias))
        # The fused K/V projection [2d, d] split into its key and value halves (views).
        d = cross.q.weight.dims()[0]
        kv_weight, kv_bias = matrix(cross.kv.weight), _f32(cross.kv.bias)
        self.cross_kv = (kv_weight[:d], kv_bias[:d], kv_weight[d:], kv_bias[d:])
        self.cross_out = (matrix(cross.out.weight), _f32(cross.out.bias))
        self.mlp_weights = (
            _f32(block.mlp_ln.weight), _f32(block.mlp_ln.bias),
            matrix(mlp.fc1.weight), _f32(mlp.fc1.bias), matrix(mlp.fc2.weight), _f32(mlp.fc2.bias))
        if len({block.attn_ln.eps, block.cross_ln.eps, block.mlp_ln.eps}) != 1:
            raise _Unfit


def _matrix_storage(decoder):
    """How the step kernels take the decoder's weight matrices: as f16 bits when every one of
    them (and the tied vocabulary projection) holds only f16 values -- the CTranslate2 files
    store f16, so this halves the bytes a step reads without changing a value -- else all as
    f32 (an f32 checkpoint, or CANDLE_WEB_WHISPER_F16=0). All or none: the kernels are
    compiled once per storage type, not per mix."""
    matrices = [decoder.token_embedding]
    for block in decoder.blocks:
        matrices += [block.attn.qkv.weight, block.attn.out.weight, block.cross_attn.q.weight,
                     block.cross_attn.kv.weight, block.cross_attn.out.weight, block.mlp.fc1.weight, block.mlp.fc2.weight]
    if os.environ.get(F16_VARIABLE, "1") != "0":
        halves = {}
        for tensor in matrices:
            bits = exact_half_bits(_f32(tensor))
            if bits is None:
                break
            halves[id(tensor)] = bits
        else:
            return lambda tensor: halves[id(tensor)]
    return _f32


class FusedRun:
    """One decoding's state on the fused path: KV caches [R, h, n_text_ctx, dh] per block, the
    number of positions filled, and the audio features [1 or R, n_audio, d] (numpy) that every
    block's cross-attention reads."""

    def __init__(self, caches, length, features):
        self.caches = caches
        self.length = length
        self.features = features

    def reorder(self, indices, features=None) -> None:
        """Beam search: keep rows `indices` (caches follow their beams); `features` (a Tensor)
        replaces the audio features when their batch changed."""
        ids = np.asarray(indices, dtype=np.intp)
        self.caches = [(k[ids], v[ids]) for k, v in self.caches]
        if features is not None:
            self.features = _f32(features)


class FusedWhisperDecoder:
    def __init__(self, decoder):
        self.embedding = _f32(decoder.token_embedding)
        self.positions = _f32(decoder.positions)
        self.ln = (_f32(decoder.ln.weight), _f32(decoder.ln.bias), np.float32(decoder.ln.eps))
        matrix = _matrix_storage(decoder)
        self.projection = matrix(decoder.token_embedding)  # tied: [vocab, d]
        self.blocks = [_Block(block, matrix) for block in decoder.blocks]
        self.n_text_ctx = self.positions.shape[0]
        # numba threads for each step's products and cross-attention heads (1: the calling
        # thread only); settable.
        self.threads = numba.get_num_threads() if decode_in_parallel() else 1

    @staticmethod
    def build(decoder):
        try:
            return FusedWhisperDecoder(decoder)
        except _Unfit:
            return None
        except AttributeError:  # a decoder built differently (e.g. no fused qkv)
            return None

    def begin(self, rows: int, kv_caches, audio_features) -> FusedRun:
        """Take over from the generic path: copy its caches ((k, v) Tensors [R, h, n, dh] per
        block, n the prompt length so far, or None when nothing was decoded yet) into fixed
        buffers sized for the whole text context."""
        caches = []
        length = 0
        for block, filled in zip(self.blocks, kv_caches):
            dh = self.embedding.shape[1] // block.n_head
            k_buf = np.empty((rows, block.n_head, self.n_text_ctx, dh), np.float32)
            v_buf = np.empty_like(k_buf)
            if filled is not None:
                k, v = filled[0].to_numpy(), filled[1].to_numpy()
                length = k.shape[2]
                k_buf[:, :, :length] = k
                v_buf[:, :, :length] = v
            caches.append((k_buf, v_buf))
        return FusedRun(caches, length, _f32(audio_features))

    def step(self, run: FusedRun, token_ids, with_logits: bool = True):
        """One token per row: token_ids [R] -> logits [R, vocab] (None without `with_logits`:
        a prompt position nobody reads); appends to the caches."""
        pos = run.length
        ids = np.asarray(token_ids, dtype=np.intp)
        x = self.embedding[ids] + self.positions[pos]
        for block, (k_cache, v_cache) in zip(self.blocks, run.caches):
            nk.whisper_block_step(x, pos, block.n_head, block.eps, *block.weights, k_cache, v_cache,
                                  *block.cross_weights, *block.cross_kv, run.features,
                                  *block.cross_out, *block.mlp_weights, self.threads)
        run.length = pos + 1
        if not with_logits:
            return None
        logits = np.empty((x.shape[0], self.embedding.shape[0]), np.float32)
        ln_w, ln_b, eps = self.ln
        nk.whisper_logits_step_parallel(x, ln_w, ln_b, eps, self.projection, logits)
        return logits
