"""The numba backend's fused Whisper decode step: one machine-code call per decoder block plus
one for the final norm and vocabulary projection (numba_kernels/whisper_step.py), instead of
~60 tensor ops per block.

`FusedWhisperDecoder.build(text_decoder)` prepares the weights once (f32, C-contiguous, taken
from the model's tensors without copies when they already are) or returns None when the decoder
does not fit the kernels (no bias on a linear, another dtype); the model then keeps its generic
path. Prompts (several new tokens) always go through the generic path; `begin` then copies its
KV caches into this path's own fixed buffers, and decode steps of one token per sequence run
here. The per-sequence state is a `FusedRun` (see models/whisper.py, DecoderState).
"""

from __future__ import annotations

import numpy as np

from .numba_kernels import whisper_step as nk


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
    def __init__(self, block):
        attn, cross, mlp = block.attn, block.cross_attn, block.mlp
        self.n_head = attn.n_head
        self.eps = np.float32(block.attn_ln.eps)
        self.weights = (
            _f32(block.attn_ln.weight), _f32(block.attn_ln.bias),
            _f32(attn.qkv.weight), _f32(attn.qkv.bias), _f32(attn.out.weight), _f32(attn.out.bias))
        self.cross_weights = (
            _f32(block.cross_ln.weight), _f32(block.cross_ln.bias),
            _f32(cross.q.weight), _f32(cross.q.bias))
        self.cross_out = (_f32(cross.out.weight), _f32(cross.out.bias))
        self.mlp_weights = (
            _f32(block.mlp_ln.weight), _f32(block.mlp_ln.bias),
            _f32(mlp.fc1.weight), _f32(mlp.fc1.bias), _f32(mlp.fc2.weight), _f32(mlp.fc2.bias))
        if len({block.attn_ln.eps, block.cross_ln.eps, block.mlp_ln.eps}) != 1:
            raise _Unfit


class FusedRun:
    """One decoding's state on the fused path: KV caches [R, h, n_text_ctx, dh] per block, the
    number of positions filled, and the cross-attention keys/values as numpy arrays."""

    def __init__(self, caches, length, cross):
        self.caches = caches
        self.length = length
        self.cross = cross

    def reorder(self, indices, cross=None) -> None:
        """Beam search: keep rows `indices` (caches follow their beams); `cross` replaces the
        cross keys/values when their batch changed."""
        ids = np.asarray(indices, dtype=np.intp)
        self.caches = [(k[ids], v[ids]) for k, v in self.caches]
        if cross is not None:
            self.cross = cross


class FusedWhisperDecoder:
    def __init__(self, decoder):
        self.embedding = _f32(decoder.token_embedding)
        self.positions = _f32(decoder.positions)
        self.ln = (_f32(decoder.ln.weight), _f32(decoder.ln.bias), np.float32(decoder.ln.eps))
        self.blocks = [_Block(block) for block in decoder.blocks]
        self.n_text_ctx = self.positions.shape[0]

    @staticmethod
    def build(decoder):
        try:
            return FusedWhisperDecoder(decoder)
        except _Unfit:
            return None
        except AttributeError:  # a decoder built differently (e.g. no fused qkv)
            return None

    @staticmethod
    def cross_arrays(cross_kv):
        return [(_f32(k), _f32(v)) for k, v in cross_kv]

    def begin(self, rows: int, kv_caches, cross_kv) -> FusedRun:
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
        return FusedRun(caches, length, self.cross_arrays(cross_kv))

    def step(self, run: FusedRun, token_ids) -> np.ndarray:
        """One token per row: token_ids [R] -> logits [R, vocab]; appends to the caches."""
        pos = run.length
        ids = np.asarray(token_ids, dtype=np.intp)
        x = self.embedding[ids] + self.positions[pos]
        for block, (k_cache, v_cache), (cross_k, cross_v) in zip(self.blocks, run.caches, run.cross):
            nk.whisper_block_step(x, pos, block.n_head, block.eps, *block.weights, k_cache, v_cache,
                                  *block.cross_weights, cross_k, cross_v, *block.cross_out,
                                  *block.mlp_weights)
        run.length = pos + 1
        logits = np.empty((x.shape[0], self.embedding.shape[0]), np.float32)
        ln_w, ln_b, eps = self.ln
        nk.whisper_logits_step(x, ln_w, ln_b, eps, self.embedding, logits)
        return logits
