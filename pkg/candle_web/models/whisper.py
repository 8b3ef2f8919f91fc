"""Whisper (Radford et al. 2022): encoder-decoder speech recognition, read top to bottom.

    log-mel [b, n_mels, 3000]
      -> AudioEncoder: conv1 (k3) gelu, conv2 (k3, stride 2) gelu, + positions, blocks, ln
      -> audio features [b, 1500, d]
    tokens [b, t] -> TextDecoder: embed + positions, blocks (self-attn with KV cache,
      cross-attn over the audio features), ln, logits = x @ embed^T  [b, t, vocab]

Weights load from two layouts onto the same modules, through the table WHISPER_WEIGHT_NAMES at
the end of this file: Hugging Face safetensors (`openai/whisper-*`) and CTranslate2 model.bin
(faster-whisper), whose self-attention linear_0 is the fused QKV and whose cross-attention
linear_1 is the fused KV. Self-attention Q/K/V (and cross-attention K/V) are kept fused, one
matmul per step: stacked at load; k has no bias (HF stores none, CTranslate2 a zero slice).
The decoder's token embedding is tied to the output projection.
Decoding one window (greedy, beam search, timestamps) is in whisper_decode.py; long-form
transcription over 30 s windows in pipelines/transcribe.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..core import dtype as dt
from ..backend import parts
from ..core.errors import FormatError, ShapeMismatch
from ..io.checkpoint import open_checkpoint
from ..io.weights import Ct2Weights, RowSlice, WeightNames, open_weights
from ..nn import ops
from ..nn.kv_cache import KvCache
from ..nn.layers import LayerNorm, Linear
from ..nn.var_builder import VarBuilder
from ..core.tensor import Tensor
from .config_fields import ConfigFields, read_json_config

N_AUDIO_CTX = 1500  # encoder positions for one 30 s window (3000 mel frames / stride 2)


@dataclass(frozen=True)
class WhisperConfig:
    n_mels: int
    n_vocab: int
    d_model: int
    n_audio_layer: int
    n_audio_head: int
    n_text_layer: int
    n_text_head: int
    n_audio_ctx: int = N_AUDIO_CTX
    n_text_ctx: int = 448
    suppress_tokens: tuple = ()
    begin_suppress_tokens: tuple = ()
    alignment_heads: tuple = ()
    lang_ids: tuple = ()

    @property
    def is_multilingual(self) -> bool:
        return self.n_vocab >= 51865

    @staticmethod
    def from_hf_config(cfg: dict, source: str = "whisper config.json") -> "WhisperConfig":
        """From an HF `openai/whisper-*` config.json object; `source` names the file in errors."""
        fields = ConfigFields(cfg, source)
        d_model, n_vocab = fields.positive_int("d_model"), fields.positive_int("vocab_size")
        n_audio_head = fields.positive_int("encoder_attention_heads")
        n_text_head = fields.positive_int("decoder_attention_heads")
        fields.check_divides("encoder_attention_heads", n_audio_head, "d_model", d_model)
        fields.check_divides("decoder_attention_heads", n_text_head, "d_model", d_model)
        return WhisperConfig(
            n_mels=fields.positive_int("num_mel_bins"), n_vocab=n_vocab, d_model=d_model,
            n_audio_layer=fields.positive_int("encoder_layers"), n_audio_head=n_audio_head,
            n_text_layer=fields.positive_int("decoder_layers"), n_text_head=n_text_head,
            n_audio_ctx=fields.positive_int("max_source_positions", N_AUDIO_CTX),
            n_text_ctx=fields.positive_int("max_target_positions", 448),
            suppress_tokens=fields.int_list("suppress_tokens", (), 0, n_vocab - 1),
            begin_suppress_tokens=fields.int_list("begin_suppress_tokens", (), 0, n_vocab - 1))


# -- modules in forward order -------------------------------------------------------------
class MultiHeadAttention:
    """Self-attention with a fused QKV projection, or cross-attention (q from the text,
    fused KV from the audio features, computed once per audio and reused every step)."""

    def __init__(self, n_head: int, out: Linear, qkv: Linear = None, q: Linear = None,
                 kv: Linear = None):
        self.n_head = n_head
        self.qkv, self.q, self.kv, self.out = qkv, q, kv, out

    def _split_heads(self, x: Tensor) -> Tensor:
        b, t, d = x.dims()
        return x.reshape(b, t, self.n_head, d // self.n_head).transpose(1, 2)  # [b, h, t, dh]

    def self_attend(self, x: Tensor, cache: KvCache = None, causal: bool = False) -> Tensor:
        b, t, d = x.dims()
        qkv = self.qkv(x)  # [b, t, 3d]
        q = self._split_heads(qkv.narrow(2, 0, d))
        k = self._split_heads(qkv.narrow(2, d, d))
        v = self._split_heads(qkv.narrow(2, 2 * d, d))
        offset = 0
        if cache is not None:
            offset = cache.current_seq_len()
            k, v = cache.append(k.contiguous(), v.contiguous())
        mask = ops.causal_mask(t, offset, device=x.device) if causal and t > 1 else None
        return self._merge(ops.scaled_dot_product_attention(q, k, v, mask))

    def cross_kv(self, audio: Tensor):
        d = audio.dims()[-1]
        kv = self.kv(audio)
        return (self._split_heads(kv.narrow(2, 0, d)).contiguous(),
                self._split_heads(kv.narrow(2, d, d)).contiguous())

    def cross_attend(self, x: Tensor, k: Tensor, v: Tensor) -> Tensor:
        return self._merge(ops.scaled_dot_product_attention(self._split_heads(self.q(x)), k, v))

    def _merge(self, heads: Tensor) -> Tensor:
        b, h, t, dh = heads.dims()
        return self.out(heads.transpose(1, 2).reshape(b, t, h * dh))


class Mlp:
    def __init__(self, fc1: Linear, fc2: Linear):
        self.fc1, self.fc2 = fc1, fc2

    def __call__(self, x: Tensor) -> Tensor:
        return self.fc2(self.fc1(x).gelu_erf())  # Whisper uses the exact (erf) GELU


class ResidualAttentionBlock:
    def __init__(self, attn_ln, attn, mlp_ln, mlp, cross_ln=None, cross_attn=None):
        self.attn_ln, self.attn = attn_ln, attn
        self.cross_ln, self.cross_attn = cross_ln, cross_attn
        self.mlp_ln, self.mlp = mlp_ln, mlp

    def encode(self, x: Tensor) -> Tensor:
        x = x.add(self.attn.self_attend(self.attn_ln(x)))
        return x.add(self.mlp(self.mlp_ln(x)))

    def decode(self, x: Tensor, cross_k: Tensor, cross_v: Tensor, cache: KvCache) -> Tensor:
        x = x.add(self.attn.self_attend(self.attn_ln(x), cache, causal=True))
        x = x.add(self.cross_attn.cross_attend(self.cross_ln(x), cross_k, cross_v))
        return x.add(self.mlp(self.mlp_ln(x)))

    def decode_with_cross_scores(self, x: Tensor, cross_k: Tensor, cross_v: Tensor, cache: KvCache):
        """`decode`, also returning the cross-attention scores q k^T / sqrt(dh) [b, h, t, frames]
        before the softmax: word timing reads the alignment heads' rows of them."""
        x = x.add(self.attn.self_attend(self.attn_ln(x), cache, causal=True))
        attn = self.cross_attn
        q = attn._split_heads(attn.q(self.cross_ln(x)))  # [b, h, t, dh]
        scores = q.matmul(cross_k.t()).affine(1.0 / float(np.sqrt(q.dims()[-1])), 0.0)
        x = x.add(attn._merge(ops.softmax_last_dim(scores).matmul(cross_v)))
        return x.add(self.mlp(self.mlp_ln(x))), scores

    def part_weights(self) -> parts.WhisperBlockWeights:
        """This block's tensors for the accelerated parts (self-attention with fused QKV)."""
        cross = self.cross_attn
        return parts.WhisperBlockWeights(
            n_head=self.attn.n_head, attn_ln=_norm_weights(self.attn_ln),
            qkv=_affine_weights(self.attn.qkv), attn_out=_affine_weights(self.attn.out),
            mlp_ln=_norm_weights(self.mlp_ln), fc1=_affine_weights(self.mlp.fc1),
            fc2=_affine_weights(self.mlp.fc2),
            cross_ln=None if cross is None else _norm_weights(self.cross_ln),
            cross_q=None if cross is None else _affine_weights(cross.q),
            cross_kv=None if cross is None else _affine_weights(cross.kv),
            cross_out=None if cross is None else _affine_weights(cross.out))


def _norm_weights(norm: LayerNorm) -> parts.LayerNormWeights:
    return parts.LayerNormWeights(norm.weight, norm.bias, norm.eps)


def _affine_weights(linear) -> parts.AffineWeights:
    return None if linear is None else parts.AffineWeights(linear.weight, linear.bias)


class AudioEncoder:
    def __init__(self, conv1_w, conv1_b, conv2_w, conv2_b, positions, blocks, ln_post):
        self.conv1_w, self.conv1_b = conv1_w, conv1_b.reshape(1, -1, 1)
        self.conv2_w, self.conv2_b = conv2_w, conv2_b.reshape(1, -1, 1)
        self.positions = positions  # [1500, d]
        self.blocks = blocks
        self.ln_post = ln_post

    def part_weights(self) -> parts.WhisperEncoderWeights:
        """The weights the accelerated part `whisper.encoder` takes (the same tensors)."""
        return parts.WhisperEncoderWeights(
            conv1=parts.AffineWeights(self.conv1_w, self.conv1_b.reshape(-1)),
            conv2=parts.AffineWeights(self.conv2_w, self.conv2_b.reshape(-1)),
            positions=self.positions, blocks=tuple(block.part_weights() for block in self.blocks),
            ln_post=_norm_weights(self.ln_post))

    def __call__(self, mel: Tensor) -> Tensor:
        x = mel.conv1d(self.conv1_w, padding=1).broadcast_add(self.conv1_b).gelu_erf()
        x = x.conv1d(self.conv2_w, padding=1, stride=2).broadcast_add(self.conv2_b).gelu_erf()
        x = x.transpose(1, 2)  # [b, 1500, d]
        self.check_frames(x.dims()[1])
        x = x.broadcast_add(self.positions.narrow(0, 0, x.dims()[1]))
        for block in self.blocks:
            x = block.encode(x)
        return self.ln_post(x)

    def check_frames(self, frames: int) -> None:
        if frames > self.positions.dims()[0]:
            raise ShapeMismatch(f"whisper encoder: {frames} frames exceed the "
                                f"{self.positions.dims()[0]} positions of the model")


class DecoderState:
    """Everything that persists between decoding steps for one batch of sequences."""

    def __init__(self, blocks: list, audio_features: Tensor):
        self.audio_features = audio_features  # [b, 1500, d]
        self._blocks = blocks
        self._cross_kv = None
        self.caches = [KvCache(dim=2) for _ in blocks]
        self._decoder = None  # set by TextDecoder.start

    @property
    def cross_kv(self) -> list:
        """Per layer (k, v) [b, h, 1500, dh], projected from the audio features on first use:
        a fused step (backend/parts.py) attends over the features directly, so a decoding that
        stays on it never pays for this projection."""
        if self._cross_kv is None:
            self._cross_kv = [block.cross_attn.cross_kv(self.audio_features) for block in self._blocks]
        return self._cross_kv

    @property
    def offset(self) -> int:
        return self.caches[0].length

    def logits(self, tokens: Tensor, positions=None) -> Tensor:
        """The new tokens through the decoder's tensor path (TextDecoder.__call__)."""
        return self._decoder(tokens, self, positions)

    def reorder(self, indices) -> None:
        """Keep batch rows `indices` (beam search): caches and cross K/V follow their beams.
        Rows of one audio share its features, so those change only with the number of rows."""
        ids = Tensor.from_numpy(np.asarray(indices, dtype=np.int64), device=self.audio_features.device)
        same_rows = len(indices) == self.audio_features.dims()[0]
        if not same_rows:
            self.audio_features = self.audio_features.index_select(ids, 0).contiguous()
            if self._cross_kv is not None:
                self._cross_kv = [(k.index_select(ids, 0).contiguous(), v.index_select(ids, 0).contiguous())
                                  for k, v in self._cross_kv]
        for cache in self.caches:
            cache.reorder(indices)


class TextDecoder:
    def __init__(self, token_embedding, positions, blocks, ln):
        self.token_embedding = token_embedding  # [vocab, d], tied to the output projection
        self.positions = positions  # [448, d]
        self.blocks = blocks
        self.ln = ln

    def start(self, audio_features: Tensor) -> DecoderState:
        state = DecoderState(self.blocks, audio_features)
        state._decoder = self
        return state

    def part_weights(self) -> parts.WhisperDecoderWeights:
        """The weights the accelerated part `whisper.decoder_step` takes (the same tensors)."""
        return parts.WhisperDecoderWeights(
            token_embedding=self.token_embedding, positions=self.positions,
            blocks=tuple(block.part_weights() for block in self.blocks), ln=_norm_weights(self.ln))

    def check_positions(self, offset: int, t: int) -> None:
        if offset + t > self.positions.dims()[0]:
            raise ShapeMismatch(f"whisper decoder: {offset + t} tokens exceed the "
                                f"{self.positions.dims()[0]} text positions")

    def __call__(self, tokens: Tensor, state: DecoderState, positions=None) -> Tensor:
        """tokens [b, t] (new tokens only) -> logits [b, t, vocab] in f32, or [b, p, vocab] for
        only the `positions` (indices into the t new tokens) that the caller reads: decoding a
        prompt of 100 tokens needs 2 rows of logits, not 100 x vocab."""
        b, t = tokens.dims()
        offset = state.offset
        self.check_positions(offset, t)
        x = self.token_embedding.embedding(tokens).broadcast_add(self.positions.narrow(0, offset, t))
        for block, (k, v), cache in zip(self.blocks, state.cross_kv, state.caches):
            x = block.decode(x, k, v, cache)
        if positions is not None:
            ids = Tensor.from_numpy(np.asarray(positions, dtype=np.int64), device=x.device)
            x = x.index_select(ids, 1)
            t = len(positions)
        x = self.ln(x)
        return x.reshape(b * t, -1).matmul(self.token_embedding.t()).reshape(b, t, -1)


    def cross_attention_scores(self, tokens: Tensor, audio_features: Tensor):
        """One pass of a whole token sequence [1, t] over fresh caches (the reference path):
        (logits [1, t, vocab], per block the cross-attention scores [1, h, t, frames] before
        the softmax). Word timing (whisper_timing.py) aligns tokens to frames from these."""
        state = self.start(audio_features)
        b, t = tokens.dims()
        self.check_positions(0, t)
        x = self.token_embedding.embedding(tokens).broadcast_add(self.positions.narrow(0, 0, t))
        scores = []
        for block, (k, v), cache in zip(self.blocks, state.cross_kv, state.caches):
            x, block_scores = block.decode_with_cross_scores(x, k, v, cache)
            scores.append(block_scores)
        x = self.ln(x)
        return x.reshape(b * t, -1).matmul(self.token_embedding.t()).reshape(b, t, -1), scores


class Whisper:
    def __init__(self, config: WhisperConfig, encoder: AudioEncoder, decoder: TextDecoder):
        self.config = config
        self.encoder = encoder
        self.decoder = decoder

    @property
    def device(self):
        """Where the weights live; inputs are created there."""
        return self.decoder.token_embedding.device

    def encode(self, mel: Tensor) -> Tensor:
        if mel.rank == 2:
            mel = mel.unsqueeze(0)
        if mel.dims()[1] != self.config.n_mels:
            raise ShapeMismatch(f"whisper: mel has {mel.dims()[1]} bins, model expects "
                                f"{self.config.n_mels}")
        return parts.encode_audio(self.encoder, mel)  # a backend's fused encoder, or the reference

    def start_decoding(self, audio_features: Tensor):
        """A DecoderState, or a fused decoding around one (backend/parts.py chooses)."""
        return parts.start_whisper_decoding(self.decoder, audio_features)

    def logits(self, tokens: Tensor, state, positions=None) -> Tensor:
        return state.logits(tokens, positions)

    def cross_attention_scores(self, tokens: Tensor, audio_features: Tensor):
        """(logits, per-block cross-attention scores) of one full pass: TextDecoder's."""
        return self.decoder.cross_attention_scores(tokens, audio_features)

    # -- loading ----------------------------------------------------------------------------
    @staticmethod
    def load(weights, config=None, device=None) -> "Whisper":
        """weights: a weights source (io/weights.py) or what `open_weights` takes: HF
        `openai/whisper-*` safetensors (path(s) or bytes), or a faster-whisper CTranslate2
        model.bin (a path, a Ct2Model, or `Ct2Weights(data)` for bytes). config: a
        WhisperConfig or the checkpoint's config.json (a path, bytes or the parsed object):
        HF's (required), or faster-whisper's (optional: token lists and alignment heads; the
        sizes come from model.bin itself)."""
        weights = open_weights(weights)
        naming = WHISPER_WEIGHT_NAMES.naming_of(weights)
        if naming is None:
            raise FormatError(f"{weights.label}: neither HF (model.decoder.embed_tokens.weight) "
                              f"nor CTranslate2 (decoder/embeddings/weight) Whisper weights")
        if not isinstance(config, WhisperConfig):
            config = (_ct2_config_of(weights, config) if naming == "ct2"
                      else _hf_config(config))
        vb = VarBuilder(WHISPER_WEIGHT_NAMES.view(weights, naming), dt.f32, device)
        return _build(config, vb)

    @staticmethod
    def from_pretrained(model_dir, device=None) -> "Whisper":
        """From what io/checkpoint.py opens (a folder, a registry name, a Hub spec, received
        bytes, a Checkpoint): a CTranslate2 model.bin (faster-whisper's config.json optional)
        or HF weights (model.safetensors) + config.json."""
        checkpoint = open_checkpoint(model_dir, kind="whisper")  # a Checkpoint as it is
        # config.json and the weights through the checkpoint, which reads each file once and
        # keeps it for whoever asks next (the loader's tokenizer, a caller's config); messages
        # name the file (checkpoint.config_label).
        if checkpoint.format == "ct2":
            config = _ct2_config_of(checkpoint.weights, checkpoint.config,
                                    checkpoint.config_label)
        else:
            # The config first: a broken config.json is named before the weights are read.
            config = _hf_config(checkpoint.config, checkpoint.config_label)
        return Whisper.load(checkpoint.weights, config, device)


def _build(config: WhisperConfig, vb: VarBuilder) -> Whisper:
    """The modules from the weights, by the model's names (WHISPER_WEIGHT_NAMES)."""
    d = config.d_model

    def layer_norm(v):
        return LayerNorm(v.get((d,), "weight"), v.get((d,), "bias"), 1e-5)

    def linear(v, out_dim, in_dim):
        return Linear(v.get((out_dim, in_dim), "weight"), v.get((out_dim,), "bias"))

    def stacked(v, names):
        """One Linear for several [d, d] projections of the same input; a missing bias is 0."""
        weights = [v.get((d, d), f"{name}.weight") for name in names]
        biases = [v.get((d,), f"{name}.bias") if v.has(f"{name}.bias")
                  else Tensor.zeros((d,), dt.f32, vb.device) for name in names]
        return Linear(Tensor.cat(weights, 0), Tensor.cat(biases, 0))

    def mlp(v):
        hidden = v.shape("fc1.weight")[0]  # 4 * d for every released size
        return Mlp(linear(v.pp("fc1"), hidden, d), linear(v.pp("fc2"), d, hidden))

    def self_attention(v, n_head):
        return MultiHeadAttention(n_head, out=linear(v.pp("out"), d, d),
                                  qkv=stacked(v, ("q", "k", "v")))

    enc = vb.pp("encoder")
    encoder_blocks = []
    for i in range(config.n_audio_layer):
        v = enc.pp(f"blocks.{i}")
        encoder_blocks.append(ResidualAttentionBlock(
            layer_norm(v.pp("attn_ln")), self_attention(v.pp("attn"), config.n_audio_head),
            layer_norm(v.pp("mlp_ln")), mlp(v.pp("mlp"))))
    dec = vb.pp("decoder")
    decoder_blocks = []
    for i in range(config.n_text_layer):
        v = dec.pp(f"blocks.{i}")
        cross = v.pp("cross_attn")
        decoder_blocks.append(ResidualAttentionBlock(
            layer_norm(v.pp("attn_ln")), self_attention(v.pp("attn"), config.n_text_head),
            layer_norm(v.pp("mlp_ln")), mlp(v.pp("mlp")), cross_ln=layer_norm(v.pp("cross_ln")),
            cross_attn=MultiHeadAttention(config.n_text_head, out=linear(cross.pp("out"), d, d),
                                          q=linear(cross.pp("q"), d, d),
                                          kv=stacked(cross, ("k", "v")))))
    encoder = AudioEncoder(enc.get((d, config.n_mels, 3), "conv1_w"), enc.get((d,), "conv1_b"),
                           enc.get((d, d, 3), "conv2_w"), enc.get((d,), "conv2_b"),
                           enc.get((config.n_audio_ctx, d), "positions"), encoder_blocks,
                           layer_norm(enc.pp("ln_post")))
    decoder = TextDecoder(dec.get((config.n_vocab, d), "token_embedding"),
                          dec.get((config.n_text_ctx, d), "positions"), decoder_blocks,
                          layer_norm(dec.pp("ln")))
    return Whisper(config, encoder, decoder)


# -- configs from the checkpoint ---------------------------------------------------------------
def _source_name(what: str, source) -> str:
    """`what` and the file's path when `source` is one (bytes from the browser have none)."""
    if isinstance(source, (str, Path)):
        return f"{what} {source}"
    return what


def _hf_config(config, source: str | None = None) -> WhisperConfig:
    """HF's config.json (a path, bytes or the parsed object) as a WhisperConfig; `source`
    names it in messages (default: its path, when it is one)."""
    if isinstance(config, WhisperConfig):
        return config
    if config is None:
        raise FormatError("whisper: HF safetensors weights need their config.json")
    return WhisperConfig.from_hf_config(read_json_config(config, "whisper config.json"),
                                        source or _source_name("whisper config.json", config))


def _ct2_config_of(weights, config_json, config_source: str | None = None) -> WhisperConfig:
    """The config of a CTranslate2 model.bin, with faster-whisper's config.json (or None);
    `config_source` names that in messages (default: its path, when it is one)."""
    if not isinstance(weights, Ct2Weights):
        raise FormatError(f"{weights.label}: CTranslate2 names without a model.bin: pass a "
                          f"WhisperConfig")
    extra = {} if config_json is None else read_json_config(config_json, "whisper config.json")
    return _ct2_config(weights.ct2, extra, _source_name("CTranslate2 whisper model", weights.path),
                       config_source or _source_name("whisper config.json", config_json))


def _ct2_variable(ct2, name: str, source: str):
    array = ct2.get(name)
    if array is None:
        raise FormatError(f"{source}: missing variable {name!r}")
    return array


def _count_ct2_layers(ct2, side: str, source: str) -> int:
    n = 0
    while ct2.get(f"{side}/layer_{n}/ffn/linear_0/weight") is not None:
        n += 1
    if n == 0:
        raise FormatError(f"{source}: no {side} layers found")
    return n


def _ct2_config(ct2, extra: dict, source: str, config_source: str) -> WhisperConfig:
    """The config a model.bin implies: sizes from its variables' shapes, head counts from its
    num_heads scalars, token lists from config.json; each checked, so that 0 heads or a
    suppressed id outside the vocabulary fail here rather than in the first transcription."""
    embeddings = _ct2_variable(ct2, "decoder/embeddings/weight", source).shape
    conv1 = _ct2_variable(ct2, "encoder/conv1/weight", source).shape
    positions = _ct2_variable(ct2, "decoder/position_encodings/encodings", source).shape
    audio_positions = _ct2_variable(ct2, "encoder/position_encodings/encodings", source).shape
    if len(embeddings) != 2 or len(conv1) != 3 or len(positions) != 2 or 0 in embeddings + conv1:
        raise FormatError(f"{source}: decoder/embeddings/weight {list(embeddings)}, "
                          f"encoder/conv1/weight {list(conv1)} and decoder/position_encodings "
                          f"{list(positions)} must be non-empty [vocab, d], [d, mels, 3], [ctx, d]")
    if len(audio_positions) != 2 or not audio_positions[0]:
        raise FormatError(f"{source}: encoder/position_encodings {list(audio_positions)} must be "
                          f"non-empty [ctx, d]")
    n_vocab, d_model = embeddings
    names = ("encoder/num_heads", "decoder/num_heads")
    variables = ConfigFields({name: ct2.scalar(name) for name in names if name in ct2}, source,
                             kind="variable")
    n_audio_head, n_text_head = (variables.positive_int(name) for name in names)
    for name, heads in zip(names, (n_audio_head, n_text_head)):
        variables.check_divides(name, heads, "d_model", d_model)
    n_text_layer = _count_ct2_layers(ct2, "decoder", source)
    fields = ConfigFields(extra, config_source)
    return WhisperConfig(
        n_mels=conv1[1], n_vocab=n_vocab, d_model=d_model,
        n_audio_layer=_count_ct2_layers(ct2, "encoder", source), n_audio_head=n_audio_head,
        n_text_layer=n_text_layer, n_text_head=n_text_head, n_audio_ctx=audio_positions[0],
        n_text_ctx=positions[0],
        suppress_tokens=fields.int_list("suppress_ids", (), 0, n_vocab - 1),
        begin_suppress_tokens=fields.int_list("suppress_ids_begin", (), 0, n_vocab - 1),
        alignment_heads=fields.int_pairs("alignment_heads", n_text_layer, n_text_head,
                                         names=("decoder layer", "head")),
        lang_ids=fields.int_list("lang_ids", (), 0, n_vocab - 1))


# -- weight names ---------------------------------------------------------------------------
def _block_names(hf: str, ct2: str, cross: bool) -> dict:
    """The rows of one encoder or decoder block: `hf` and `ct2` are the block's prefix in each
    naming (with {i}); the model's prefix is the key's."""
    rows = {
        "attn_ln.weight": (f"{hf}.self_attn_layer_norm.weight",
                           f"{ct2}/self_attention/layer_norm/gamma"),
        "attn_ln.bias": (f"{hf}.self_attn_layer_norm.bias",
                         f"{ct2}/self_attention/layer_norm/beta"),
        "mlp_ln.weight": (f"{hf}.final_layer_norm.weight", f"{ct2}/ffn/layer_norm/gamma"),
        "mlp_ln.bias": (f"{hf}.final_layer_norm.bias", f"{ct2}/ffn/layer_norm/beta"),
        "mlp.fc1.weight": (f"{hf}.fc1.weight", f"{ct2}/ffn/linear_0/weight"),
        "mlp.fc1.bias": (f"{hf}.fc1.bias", f"{ct2}/ffn/linear_0/bias"),
        "mlp.fc2.weight": (f"{hf}.fc2.weight", f"{ct2}/ffn/linear_1/weight"),
        "mlp.fc2.bias": (f"{hf}.fc2.bias", f"{ct2}/ffn/linear_1/bias"),
        "attn.out.weight": (f"{hf}.self_attn.out_proj.weight",
                            f"{ct2}/self_attention/linear_1/weight"),
        "attn.out.bias": (f"{hf}.self_attn.out_proj.bias", f"{ct2}/self_attention/linear_1/bias"),
        # CTranslate2 fuses Q/K/V in linear_0 (its k-bias slice is zero); HF has no k bias.
        "attn.q.weight": (f"{hf}.self_attn.q_proj.weight",
                          RowSlice(f"{ct2}/self_attention/linear_0/weight", 0, 3)),
        "attn.q.bias": (f"{hf}.self_attn.q_proj.bias",
                        RowSlice(f"{ct2}/self_attention/linear_0/bias", 0, 3)),
        "attn.k.weight": (f"{hf}.self_attn.k_proj.weight",
                          RowSlice(f"{ct2}/self_attention/linear_0/weight", 1, 3)),
        "attn.k.bias": (None, RowSlice(f"{ct2}/self_attention/linear_0/bias", 1, 3)),
        "attn.v.weight": (f"{hf}.self_attn.v_proj.weight",
                          RowSlice(f"{ct2}/self_attention/linear_0/weight", 2, 3)),
        "attn.v.bias": (f"{hf}.self_attn.v_proj.bias",
                        RowSlice(f"{ct2}/self_attention/linear_0/bias", 2, 3)),
    }
    if cross:  # CTranslate2: attention/linear_0 = q, linear_1 = fused K/V, linear_2 = out
        rows.update({
            "cross_ln.weight": (f"{hf}.encoder_attn_layer_norm.weight",
                                f"{ct2}/attention/layer_norm/gamma"),
            "cross_ln.bias": (f"{hf}.encoder_attn_layer_norm.bias",
                              f"{ct2}/attention/layer_norm/beta"),
            "cross_attn.q.weight": (f"{hf}.encoder_attn.q_proj.weight",
                                    f"{ct2}/attention/linear_0/weight"),
            "cross_attn.q.bias": (f"{hf}.encoder_attn.q_proj.bias",
                                  f"{ct2}/attention/linear_0/bias"),
            "cross_attn.k.weight": (f"{hf}.encoder_attn.k_proj.weight",
                                    RowSlice(f"{ct2}/attention/linear_1/weight", 0, 2)),
            "cross_attn.k.bias": (None, RowSlice(f"{ct2}/attention/linear_1/bias", 0, 2)),
            "cross_attn.v.weight": (f"{hf}.encoder_attn.v_proj.weight",
                                    RowSlice(f"{ct2}/attention/linear_1/weight", 1, 2)),
            "cross_attn.v.bias": (f"{hf}.encoder_attn.v_proj.bias",
                                  RowSlice(f"{ct2}/attention/linear_1/bias", 1, 2)),
            "cross_attn.out.weight": (f"{hf}.encoder_attn.out_proj.weight",
                                      f"{ct2}/attention/linear_2/weight"),
            "cross_attn.out.bias": (f"{hf}.encoder_attn.out_proj.bias",
                                    f"{ct2}/attention/linear_2/bias"),
        })
    side = "decoder" if cross else "encoder"
    return {f"{side}.blocks.{{i}}.{name}": entries for name, entries in rows.items()}


# The model's names (its modules' attribute paths; the pieces of the stacked qkv and kv
# matrices by their own names) -> HF `WhisperForConditionalGeneration` and CTranslate2's
# WhisperSpec names.
WHISPER_WEIGHT_NAMES = WeightNames(("hf", "ct2"), {
    "encoder.conv1_w": ("model.encoder.conv1.weight", "encoder/conv1/weight"),
    "encoder.conv1_b": ("model.encoder.conv1.bias", "encoder/conv1/bias"),
    "encoder.conv2_w": ("model.encoder.conv2.weight", "encoder/conv2/weight"),
    "encoder.conv2_b": ("model.encoder.conv2.bias", "encoder/conv2/bias"),
    "encoder.positions": ("model.encoder.embed_positions.weight",
                          "encoder/position_encodings/encodings"),
    **_block_names("model.encoder.layers.{i}", "encoder/layer_{i}", cross=False),
    "encoder.ln_post.weight": ("model.encoder.layer_norm.weight", "encoder/layer_norm/gamma"),
    "encoder.ln_post.bias": ("model.encoder.layer_norm.bias", "encoder/layer_norm/beta"),
    "decoder.token_embedding": ("model.decoder.embed_tokens.weight", "decoder/embeddings/weight"),
    "decoder.positions": ("model.decoder.embed_positions.weight",
                          "decoder/position_encodings/encodings"),
    **_block_names("model.decoder.layers.{i}", "decoder/layer_{i}", cross=True),
    "decoder.ln.weight": ("model.decoder.layer_norm.weight", "decoder/layer_norm/gamma"),
    "decoder.ln.bias": ("model.decoder.layer_norm.bias", "decoder/layer_norm/beta"),
}, marker="decoder.token_embedding")
