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

Switches that turn a part off live in `settings` (read once, listed in the README).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

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
    attn_norm: object  # Tensor [d] (RMS norm)
    mlp_norm: object  # Tensor [d]
    eps: float
    qkv: object  # QMatMul [(h + 2 kv) * head_dim, d]
    out: object  # QMatMul [d, h * head_dim]
    gate_up: object  # QMatMul [2 * ffn, d]
    down: object  # QMatMul [d, ffn]


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


# -- declarations -------------------------------------------------------------------------------
@dataclass(frozen=True)
class PartSpec:
    name: str
    weights: type
    enabled: Callable[[Settings], bool]  # the settings switch that can turn it off


PARTS = {spec.name: spec for spec in (
    PartSpec(WHISPER_ENCODER, WhisperEncoderWeights, lambda s: s.fused_whisper_encoder),
    PartSpec(WHISPER_DECODER_STEP, WhisperDecoderWeights, lambda s: s.fused_whisper_decoder),
    PartSpec(LLAMA_DECODER_STEP, LlamaDecoderWeights, lambda s: True),
)}

# (part name, backend name) -> factory(weights) -> implementation or None
_IMPLEMENTATIONS: dict[tuple[str, str], Callable] = {}


def register_part(name: str, backend_name: str, factory: Callable) -> None:
    """Offer an implementation of a declared part on one backend."""
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
    return factory(exported)
