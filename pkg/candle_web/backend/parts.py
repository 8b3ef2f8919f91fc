"""Accelerated parts: whole model steps that a backend may run as one fused call.

Some speed only comes from fusing a model step (a Whisper encoder pass, one Whisper or LLaMA
decode step). Each such step is declared here by name, with the flat weights dataclass the
model exports for it and what its implementation takes and returns. Backends outside this
package (the native twin's numba kernels, later the browser's wasm kernels) register an
implementation per part with `register_part`; a model asks `find_part` in one place and, when
it gets None, runs its generic tensor path, which stays the reference the tests compare with.

The weights dataclasses hold the model's own tensors (no copies) and plain numbers, never the
model objects, so an implementation depends on this declaration only. An implementation's
factory returns None when the weights do not fit its kernels (another dtype, a missing bias).

Parts and their implementations' call signatures (arrays are the backend's, f32, C-ordered):

- ``whisper.encoder`` (WhisperEncoderWeights): ``impl(mel [b, n_mels, frames]) ->
  features [b, frames // 2, d]`` (after the final layer norm).
- ``whisper.decoder_step`` (WhisperDecoderWeights): ``impl.step(token_ids [R] ints, position,
  caches, features [1 or R, n_audio, d], with_logits) -> logits [R, vocab] or None``: one token
  per row through every block; `caches` holds per block the (keys, values) buffers
  [R, h, capacity, dh] of the model's `nn.KvCache`, into which the step writes `position`.
- ``llama.decoder_step`` (LlamaDecoderWeights): ``impl(x [d], position, caches, cos, sin) ->
  logits [vocab]``: one token of batch 1; `caches` per block (keys, values) [n_kv, capacity,
  head_dim], written at `position`; cos/sin the rotary tables covering it.
  An implementation may also offer ``impl.step_rows(xs [B, d], positions [B], row_caches,
  cos, sin) -> logits [B, vocab]``: B sequences at once, row b at positions[b] with its own
  caches row_caches[b] (per block as above), each row bit-identical to `impl` on it alone
  (`start_batched_causal_decoding`, the API's continuous batching); and
  ``impl.step_prompts(xs [R, d], segments, cos, sin) -> logits [len(segments), vocab]``:
  prompt tokens of one or more sequences as rows, `segments` [(start, length, caches)] in row
  order (`length` rows of one sequence at positions start .. start + length - 1), the logits of
  each segment's last row bit-identical to feeding its tokens to `impl` one by one.

Switches that turn a part off live in `settings` (read once, listed in the README).

**The fast path is a decoding strategy chosen here, not in the model files.** A model file holds
the reference computation and exports its weights (`part_weights()`); the four entry points
below (and batched_steps.py's, for servers) decide, in one place, whether a step runs through
a backend's part:

- `encode_audio(encoder, mel)`: the Whisper encoder's part, or the encoder itself;
- `start_whisper_decoding(decoder, features)`: the model's own `DecoderState`, or a
  `FusedWhisperDecoding` wrapping it, whose short token runs go through the part;
- `start_causal_decoding(model)`: a `ReferenceSteps` calling the model's `forward`, or
  `FusedCausalSteps` sending single tokens (and prompts, where the part has `step_prompts`)
  through the part.
- `batched_steps.start_batched_causal_decoding(model)` (its own module, beside this one): one
  token for each of B sequences at their own positions, `FusedBatchedSteps` (the part's
  `step_rows`, and `step_prompts` for several prompts at once) or `ReferenceBatchedSteps`.

`FastPath` owns the guards every call passes (the settings switch, gradient tracking, dtype,
device) and builds the implementation once per model; the fused strategies own the KV-cache
hand-off (they write the same caches the reference path reads, so the two can alternate
within one sequence). A new model family exports the same weights dataclass with its own
fields; an implementation that cannot run them returns None and the reference runs.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..core import dtype as dt
from ..core.autograd import is_tracking
from ..core.tensor import Tensor
from .settings import Settings, settings

WHISPER_ENCODER = "whisper.encoder"
WHISPER_DECODER_STEP = "whisper.decoder_step"
LLAMA_DECODER_STEP = "llama.decoder_step"


# -- weights the models export ---------------------------------------------------------------
@dataclass(frozen=True)
class LayerNormWeights:
    weight: object  # Tensor [d]
    bias: object  # Tensor [d] or None
    eps: float


@dataclass(frozen=True)
class AffineWeights:
    """y = x W^T + b (a linear layer, or a convolution's kernel and bias)."""
    weight: object  # Tensor [out, in] ([out, in, kernel] for a convolution)
    bias: object  # Tensor [out] or None


@dataclass(frozen=True)
class WhisperBlockWeights:
    n_head: int
    attn_ln: LayerNormWeights
    qkv: AffineWeights  # self-attention Q, K, V fused: [3d, d]
    attn_out: AffineWeights
    mlp_ln: LayerNormWeights
    fc1: AffineWeights
    fc2: AffineWeights
    # Decoder blocks only: cross-attention over the audio features.
    cross_ln: LayerNormWeights = None
    cross_q: AffineWeights = None
    cross_kv: AffineWeights = None  # K and V fused: [2d, d]
    cross_out: AffineWeights = None


@dataclass(frozen=True)
class WhisperEncoderWeights:
    conv1: AffineWeights  # [d, n_mels, 3], padding 1
    conv2: AffineWeights  # [d, d, 3], padding 1, stride 2
    positions: object  # Tensor [n_audio_ctx, d]
    blocks: tuple  # WhisperBlockWeights
    ln_post: LayerNormWeights


@dataclass(frozen=True)
class WhisperDecoderWeights:
    token_embedding: object  # Tensor [vocab, d], tied to the output projection
    positions: object  # Tensor [n_text_ctx, d]
    blocks: tuple  # WhisperBlockWeights with the cross-attention fields
    ln: LayerNormWeights


@dataclass(frozen=True)
class LlamaLayerWeights:
    """One block of the LLaMA-family decoder (models/llama.py). The fields after `down` are the
    other families' differences; their defaults mean plain LLaMA. Norm weights are the ones to
    multiply by (Gemma's 1 + w already added)."""
    attn_norm: object  # Tensor [d] (RMS norm)
    mlp_norm: object  # Tensor [d]
    eps: float
    qkv: object  # QMatMul [(h + 2 kv) * head_dim, d]
    out: object  # QMatMul [d, h * head_dim]
    gate_up: object  # QMatMul [2 * ffn, d]
    down: object  # QMatMul [d, ffn]
    qkv_bias: object = None  # Tensor [(h + 2 kv) * head_dim] (qwen2)
    q_norm: object = None  # Tensor [head_dim]: RMS norm of each query head before RoPE (qwen3,
    k_norm: object = None  # gemma3), and of each key head
    attn_post_norm: object = None  # Tensor [d]: RMS norm of the attention output before the
    mlp_post_norm: object = None  # residual add (gemma2/3), and of the MLP output
    window: int = None  # sliding window: a query sees the last `window` positions (itself
    #                     included); None: every position
    rope: object = None  # the layer's own rotary tables (an object with `.tables(start, n)`
    #                      -> (cos, sin) and `.cos`/`.sin`), None: the ones the step is given


@dataclass(frozen=True)
class LlamaDecoderWeights:
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_interleaved: bool  # GGUF's row-permuted Q/K (Candle's rope_i)
    layers: tuple  # LlamaLayerWeights
    norm: object  # Tensor [d]
    norm_eps: float
    lm_head: object  # QMatMul [vocab, d]
    activation: str = "silu"  # the gate's activation: "silu", or "gelu_tanh" (gemma)
    embedding_scale: float = 1.0  # x = embed(ids) * scale before the first block (gemma)
    attn_scale: float = None  # q.k multiplier; None: 1 / sqrt(head_dim)
    attn_softcap: float = None  # scores = cap * tanh(scores / cap) before the mask (gemma2)
    final_softcap: float = None  # the same on the logits (gemma2)

    def family_fields(self) -> set:
        """The names of the fields (decoder- and layer-level) that differ from plain LLaMA: an
        implementation returns None from its factory when one of them is not in the set it
        implements, so such a model takes the reference path."""
        used = {name for name, plain in _PLAIN_DECODER.items() if getattr(self, name) != plain}
        for layer in self.layers:
            used |= {name for name in _PLAIN_LAYER if getattr(layer, name) is not None}
        return used


_PLAIN_DECODER = {"activation": "silu", "embedding_scale": 1.0, "attn_scale": None,
                  "attn_softcap": None, "final_softcap": None}
_PLAIN_LAYER = ("qkv_bias", "q_norm", "k_norm", "attn_post_norm", "mlp_post_norm", "window",
                "rope")


# -- declarations -------------------------------------------------------------------------------
@dataclass(frozen=True)
class PartSpec:
    name: str
    weights: type
    enabled: Callable[[Settings], bool]  # the settings switch that can turn it off


PARTS = {spec.name: spec for spec in (
    PartSpec(WHISPER_ENCODER, WhisperEncoderWeights, lambda s: s.fused_whisper_encoder),
    PartSpec(WHISPER_DECODER_STEP, WhisperDecoderWeights, lambda s: s.fused_whisper_decoder),
    PartSpec(LLAMA_DECODER_STEP, LlamaDecoderWeights, lambda s: s.fused_llama_decoder),
)}

# (part name, backend name) -> factory(weights, backend) -> implementation or None
_IMPLEMENTATIONS: dict[tuple[str, str], Callable] = {}


def register_part(name: str, backend_name: str, factory: Callable) -> None:
    """Offer an implementation of a declared part on one backend: `factory(weights, backend)`
    gets the model's exported weights and the backend instance they live on, and returns the
    implementation or None (weights it cannot run)."""
    if name not in PARTS:
        raise KeyError(f"register_part: {name!r} is not a declared part ({sorted(PARTS)})")
    _IMPLEMENTATIONS[(name, backend_name)] = factory


def find_part(name: str, device, weights: Callable):
    """The implementation of part `name` for `device`'s backend built from `weights()` (a
    callable, so that a model exports its weights only where a part exists), or None: no
    implementation on this backend, turned off in the settings, or unfit for the weights."""
    spec = PARTS[name]
    factory = _IMPLEMENTATIONS.get((name, device.backend.name))
    if factory is None or not spec.enabled(settings()):
        return None
    exported = weights()
    if not isinstance(exported, spec.weights):
        raise TypeError(f"find_part({name!r}): expected {spec.weights.__name__}, got "
                        f"{type(exported).__name__}")
    return factory(exported, device.backend)


# -- the fast path: one object that decides ---------------------------------------------------
_NOT_BUILT = object()


class FastPath:
    """Part `name` for one model's weights (`owner.part_weights()`) on the owner's device.

    The implementation is looked up and built once (`impl`); `usable(*inputs, weights=...)`
    guards each call and returns the implementation, or None when the generic path must run:
    the part is switched off in the settings, the backend has none or it cannot take these
    weights, an input is not f32, is empty or lives on another backend, or an input or one of
    the given weights tracks gradients (the parts compute no gradients)."""

    def __init__(self, name: str, owner, device):
        self.name, self.device = name, device
        self._owner = weakref.ref(owner)
        self._impl = _NOT_BUILT

    @property
    def impl(self):
        """The implementation for these weights (built once), or None: switched off now, none
        on this backend, or unfit for the weights."""
        if not PARTS[self.name].enabled(settings()):
            return None  # not remembered: the switch may be turned back on
        if self._impl is _NOT_BUILT:
            self._impl = find_part(self.name, self.device, self._owner().part_weights)
        return self._impl

    def usable(self, *inputs, weights=()):
        impl = self.impl
        if impl is None:
            return None
        for tensor in inputs:
            if (tensor.dtype is not dt.f32 or 0 in tensor.dims()
                    or tensor.device.backend is not self.device.backend):
                return None
        if is_tracking(*inputs, *weights):
            return None
        return impl


_FAST_PATHS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def fast_path(name: str, owner, device) -> FastPath:
    """The FastPath of part `name` for `owner` (a model or module exporting `part_weights`),
    made on first use and kept as long as the owner lives: the one cache of part lookups."""
    paths = _FAST_PATHS.setdefault(owner, {})
    if name not in paths:
        paths[name] = FastPath(name, owner, device)
    return paths[name]


# -- Whisper ------------------------------------------------------------------------------------
# Prompts up to this many new tokens go through the fused one-token step, a token at a time;
# longer ones (previous-text prompts of long-form transcription, up to 224 tokens) through the
# batched generic path. Why: the generic path projects every block's cross-attention keys and
# values from the features first: 154 ms of the 236 ms a 4-token prompt took on whisper-base
# with numba, and with the prompt as four fused steps a window's whole greedy decode went from
# 30.7-39.6 to 21.2-25.6 ms per token (LibriVox clips).
FUSED_PROMPT_TOKENS = 8


def encode_audio(encoder, mel):
    """Whisper's encoder on mel [b, n_mels, frames]: the backend's `whisper.encoder` part when
    it may run, else the encoder's own tensor path (which also reports bad shapes)."""
    weights = encoder.conv1_w
    impl = fast_path(WHISPER_ENCODER, encoder, weights.device).usable(mel, weights=(weights,))
    if impl is None:
        return encoder(mel)
    encoder.check_frames((mel.dims()[2] - 1) // 2 + 1)  # after conv2 (kernel 3, pad 1, stride 2)
    return Tensor.from_numpy(impl(mel.to_numpy()), device=mel.device)


def start_whisper_decoding(decoder, audio_features):
    """A decoding of `audio_features` [b, n_audio, d]: the decoder's own DecoderState, or a
    FusedWhisperDecoding around it when the backend has a `whisper.decoder_step` part."""
    state = decoder.start(audio_features)
    path = fast_path(WHISPER_DECODER_STEP, decoder, decoder.token_embedding.device)
    if path.usable(weights=(decoder.token_embedding,)) is None:
        return state
    return FusedWhisperDecoding(decoder, state, path)


class FusedWhisperDecoding:
    """A Whisper decoding whose short token runs go through the fused step.

    It wraps the model's DecoderState (the KV caches, the features, beam reordering) and
    writes into the same caches, so a long prompt can take the generic path and the next
    tokens the fused one. The part reads the features as one host array [1 or R, n_audio, d],
    converted once per decoding and again only when the number of rows changes."""

    def __init__(self, decoder, state, path: FastPath):
        self.decoder, self.state, self.path = decoder, state, path
        self.features = None

    @property
    def offset(self) -> int:
        return self.state.offset

    @property
    def caches(self) -> list:
        return self.state.caches

    @property
    def audio_features(self):
        return self.state.audio_features

    def reorder(self, indices) -> None:
        rows = self.state.audio_features.dims()[0]
        self.state.reorder(indices)
        if len(indices) != rows:
            self.features = None

    def logits(self, tokens, positions=None):
        """As DecoderState.logits: tokens [b, t] -> logits [b, t or len(positions), vocab]."""
        b, t = tokens.dims()
        embedding = self.decoder.token_embedding
        impl = self.path.usable(weights=(embedding,)) if 0 < t <= FUSED_PROMPT_TOKENS else None
        if impl is None:
            return self.state.logits(tokens, positions)
        self.decoder.check_positions(self.offset, t)
        if self.features is None:
            self.features = self.state.audio_features.to_numpy()
        ids = tokens.to_numpy().reshape(b, t)
        wanted = list(range(t)) if positions is None else list(positions)
        d = self.decoder.token_embedding.dims()[1]
        rows = {}
        for i in range(t):
            position = self.offset
            caches = [cache.buffers(1, (b, block.attn.n_head, 1, d // block.attn.n_head), dt.f32,
                                    tokens.device)
                      for cache, block in zip(self.state.caches, self.decoder.blocks)]
            logits = impl.step(ids[:, i], position, caches, self.features, with_logits=i in wanted)
            for cache in self.state.caches:
                cache.advance(1)
            if logits is not None:
                rows[i] = logits
        stacked = np.stack([rows[i] for i in wanted], axis=1)  # [b, len(wanted), vocab]
        return Tensor.from_numpy(stacked, device=tokens.device)


# -- causal LMs (the LLaMA-family decode step) ---------------------------------------------------
def start_causal_decoding(model):
    """How a causal LM's new tokens run from here: `FusedCausalSteps` when the backend has a
    `llama.decoder_step` part for the model's weights, else `ReferenceSteps` (its `forward`).
    Both are called as steps(ids [b, t] ints, index_pos) -> f32 logits Tensor [b, vocab]."""
    if not hasattr(model, "part_weights"):
        return ReferenceSteps(model)
    path = fast_path(LLAMA_DECODER_STEP, model, model.device)
    if path.impl is None:
        return ReferenceSteps(model)
    return FusedCausalSteps(model, path)


class ReferenceSteps:
    """Every call through the model's own tensor path."""

    def __init__(self, model):
        self.model = model

    def __call__(self, ids, index_pos: int):
        return self.model.forward(ids, index_pos)

    def splits_exactly(self) -> bool:
        """No: a prompt's rows go through matmuls whose sums the backend may order by the
        number of rows, so a prompt in one pass and in pieces can differ in the last bits."""
        return False


class FusedCausalSteps:
    """Single tokens (batch 1) through the part; a prompt of batch 1 through its `step_prompts`
    when it has one, in chunks of PROMPT_CHUNK tokens (bounding the rows' temporaries: 128
    rows of Qwen2.5-0.5B's gate|up are 5 MB); everything else through `model.forward`. With
    `step_prompts` a prompt's logits and caches are bit for bit those of feeding it token by
    token, so a sequence's answer does not depend on how its prompt was split (a chat turn
    that reuses the cached prefix, a server's batch).

    The KV-cache hand-off: the part writes each block's new key and value at `index_pos` of
    the model's own caches ([n_kv, capacity, head_dim] per block), then the caches advance, so
    the prompt's generic pass and the fused steps fill one cache. The model supplies `embed`
    (token rows), `caches` (nn.KvCache per block), `rotary` (cos/sin tables grown on demand)
    and `config.num_kv_heads` / `config.head_dim`."""

    PROMPT_CHUNK = 128

    def __init__(self, model, path: FastPath):
        self.model, self.path = model, path

    def __call__(self, ids, index_pos: int):
        model = self.model
        array = ids.to_numpy() if isinstance(ids, Tensor) else np.asarray(ids)
        impl = self.path.usable()
        if (impl is None or array.ndim != 2 or array.shape[0] != 1 or not array.shape[1]
                or index_pos != model.seq_len
                or (array.shape[1] > 1 and getattr(impl, "step_prompts", None) is None)):
            return model.forward(ids, index_pos)  # (which also reports a wrong index_pos)
        for start in range(0, array.shape[1], self.PROMPT_CHUNK):
            logits = self._run(impl, array[:, start:start + self.PROMPT_CHUNK], index_pos + start)
        return Tensor.from_storage(logits.reshape(1, -1), dt.f32, model.device)

    def splits_exactly(self) -> bool:
        """Whether a prompt's logits and cached keys and values are the same bits however it
        is split into calls (the part's `step_prompts`, token by token, or a cached prefix and
        the rest): the API's prefix reuse relies on it."""
        impl = self.path.usable()
        return impl is not None and getattr(impl, "step_prompts", None) is not None

    def _run(self, impl, array: np.ndarray, index_pos: int) -> np.ndarray:
        """Tokens array [1, t] at index_pos .. index_pos + t - 1 through the part -> the last
        token's logits; the caches advance by t."""
        model, t = self.model, array.shape[1]
        x = model.embed(Tensor.from_numpy(array.astype(np.int64), dt.i64, model.device))
        cfg = model.config
        entry = (1, cfg.num_kv_heads, 1, cfg.head_dim)
        buffers = []
        for cache in model.caches:
            keys, values = cache.buffers(t, entry, x.dtype, x.device)
            buffers.append((keys[0], values[0]))  # [n_kv, capacity, head_dim]
        model.rotary.tables(index_pos, t)  # grows the tables to cover every position
        cos, sin = model.rotary.cos.storage(), model.rotary.sin.storage()
        if t == 1:
            logits = impl(x.storage().reshape(-1), index_pos, buffers, cos, sin)
        else:
            logits = impl.step_prompts(x.storage().reshape(t, -1), [(index_pos, t, buffers)],
                                       cos, sin)[0]
        for cache in model.caches:
            cache.advance(t)
        return logits
