"""The numba backend's fused Whisper decode step: one machine-code call per decoder block plus
one for the final norm and vocabulary projection (numba_kernels/whisper_step.py), instead of
~60 tensor ops per block.

It implements the part ``whisper.decoder_step`` (candle_web.backend.parts):
`FusedWhisperDecoder.build(weights)` prepares the model's exported WhisperDecoderWeights once,
or returns None when they do not fit the kernels (no bias on a linear, another dtype); the model then keeps its
generic path. The weight matrices are kept as f16 bits when they all hold f16 values (the
CTranslate2 files store f16): a step reads every weight once and is bound by DRAM bandwidth, so
half the bytes is nearly half the time; widening is exact (numba_kernels/half.py). Otherwise
they stay f32, taken from the model's tensors without copies. Cross-attention reads the audio
features and the K/V projection weights instead of projected keys and values, so a decoding
that stays on this path never projects them (see whisper_step._cross_attend).

Under the compute type int8 (CANDLE_WEB_COMPUTE_TYPE) the six linear layers of every block are
quantized to int8 per output row when the part is built (int8_linear.py) and multiplied in
integer arithmetic (kernels/qint8.py); the vocabulary projection (see _linear_storage) and the
cross-attention's key/value matrices (see whisper_step's doc) stay float.

Short prompts run here a token at a time (backend/parts.py, FUSED_PROMPT_TOKENS); longer ones
go through the generic path. Both write the same KV caches (the model's nn.KvCache buffers), so
the two paths take turns without copying anything.
"""

from __future__ import annotations

import numba
import numpy as np
from candle_web.backend.settings import settings

from ..decode_threads import decode_in_parallel
from ..kernels import whisper_step as nk
from ..kernels.half import exact_half_bits
from .int8_linear import GROUP, int8_compute, int8_weight


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
    def __init__(self, block, matrix, linear):
        """`block`: a decoder block's WhisperBlockWeights (candle_web.backend.parts);
        `matrix` prepares the cross-attention's key/value matrix (f32 as is, or its f16 bits),
        `linear` the other weight matrices (as `matrix`, or int8: see _linear_storage)."""
        if block.cross_q is None:
            raise _Unfit
        self.n_head = block.n_head
        self.eps = np.float32(block.attn_ln.eps)
        self.weights = (
            _f32(block.attn_ln.weight), _f32(block.attn_ln.bias),
            linear(block.qkv.weight), _f32(block.qkv.bias),
            linear(block.attn_out.weight), _f32(block.attn_out.bias))
        self.cross_weights = (
            _f32(block.cross_ln.weight), _f32(block.cross_ln.bias),
            linear(block.cross_q.weight), _f32(block.cross_q.bias))
        # The fused K/V projection [2d, d] split into its key and value halves (views).
        d = block.cross_q.weight.dims()[0]
        kv_weight, kv_bias = matrix(block.cross_kv.weight), _f32(block.cross_kv.bias)
        self.cross_kv = (kv_weight[:d], kv_bias[:d], kv_weight[d:], kv_bias[d:])
        self.cross_out = (linear(block.cross_out.weight), _f32(block.cross_out.bias))
        self.mlp_weights = (
            _f32(block.mlp_ln.weight), _f32(block.mlp_ln.bias),
            linear(block.fc1.weight), _f32(block.fc1.bias),
            linear(block.fc2.weight), _f32(block.fc2.bias))
        if len({block.attn_ln.eps, block.cross_ln.eps, block.mlp_ln.eps}) != 1:
            raise _Unfit


def _linear_matrices(decoder) -> list:
    """The blocks' matrices the step multiplies by rows of activations (int8 under the compute
    type int8)."""
    matrices = []
    for block in decoder.blocks:
        matrices += [block.qkv.weight, block.attn_out.weight, block.cross_q.weight,
                     block.cross_out.weight, block.fc1.weight, block.fc2.weight]
    return matrices


def _linear_storage(decoder, matrix):
    """How the step kernels take the linear layers' matrices: under the compute type int8
    quantized per output row (int8_linear.py), else as the cross-attention's key/value matrix
    is (`matrix`). The tied vocabulary projection stays float either way: quantized too (as
    CTranslate2's int8 does), tiny.en read LibriVox clip 0890 "coldhearted ... old-exposed"
    for float32's "cold-hearted ... ill-disposed" -- CTranslate2 4.8.5 int8 reads it so too --
    where the int8 blocks alone change no word of the test clips."""
    if not int8_compute():
        return matrix
    matrices = _linear_matrices(decoder)
    if any(_f32(tensor).shape[1] % GROUP for tensor in matrices):
        raise _Unfit  # the int8 products take whole 32-element blocks
    quantized = {id(tensor): int8_weight(_f32(tensor)) for tensor in matrices}
    return lambda tensor: quantized[id(tensor)]


def _matrix_storage(decoder):
    """How the step kernels take the decoder's float weight matrices: as f16 bits when every
    one of them (and the tied vocabulary projection) holds only f16 values -- the CTranslate2
    files store f16, so this halves the bytes a step reads without changing a value -- else all
    as f32 (an f32 checkpoint, or CANDLE_WEB_WHISPER_F16=0). All or none: the kernels are
    compiled once per storage type, not per mix. Under the compute type int8 only the
    vocabulary projection and the cross-attention's key/value matrices stay float."""
    matrices = [decoder.token_embedding] + [block.cross_kv.weight for block in decoder.blocks]
    if not int8_compute():
        matrices += _linear_matrices(decoder)
    if settings().whisper_f16:
        halves = {}
        for tensor in matrices:
            bits = exact_half_bits(_f32(tensor))
            if bits is None:
                break
            halves[id(tensor)] = bits
        else:
            return lambda tensor: halves[id(tensor)]
    return _f32


class FusedWhisperDecoder:
    def __init__(self, decoder):
        self.embedding = _f32(decoder.token_embedding)
        self.positions = _f32(decoder.positions)
        self.ln = (_f32(decoder.ln.weight), _f32(decoder.ln.bias), np.float32(decoder.ln.eps))
        matrix = _matrix_storage(decoder)
        linear = _linear_storage(decoder, matrix)
        self.projection = matrix(decoder.token_embedding)  # tied: [vocab, d]
        self.blocks = [_Block(block, matrix, linear) for block in decoder.blocks]
        # numba threads for each step's products and cross-attention heads (1: the calling
        # thread only); settable.
        self.threads = numba.get_num_threads() if decode_in_parallel() else 1

    @staticmethod
    def build(decoder):
        try:
            return FusedWhisperDecoder(decoder)
        except _Unfit:
            return None
        except AttributeError:  # weights without a fused qkv
            return None

    def step(self, token_ids, position: int, caches, features, with_logits: bool = True):
        """One token per row: token_ids [R] -> logits [R, vocab] (None without `with_logits`:
        a prompt position nobody reads). Writes each block's key and value at `position` of
        its (keys, values) buffers [R, h, capacity, dh]; `features` [1 or R, n_audio, d]."""
        ids = np.asarray(token_ids, dtype=np.intp)
        x = self.embedding[ids] + self.positions[position]
        for block, (k_cache, v_cache) in zip(self.blocks, caches):
            nk.whisper_block_step(x, position, block.n_head, block.eps, *block.weights, k_cache,
                                  v_cache, *block.cross_weights, *block.cross_kv, features,
                                  *block.cross_out, *block.mlp_weights, self.threads)
        if not with_logits:
            return None
        logits = np.empty((x.shape[0], self.embedding.shape[0]), np.float32)
        ln_w, ln_b, eps = self.ln
        nk.whisper_logits_step_parallel(x, ln_w, ln_b, eps, self.projection, logits)
        return logits
