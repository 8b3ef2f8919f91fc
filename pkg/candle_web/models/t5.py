"""T5 (Raffel et al. 2020): the text-to-text encoder-decoder, read top to bottom.

    input ids [b, s] -> shared embedding -> Encoder: n x (x += SelfAttention(rms(x)) with a
      bidirectional relative position bias; x += FF(rms(x))) -> rms -> encoder states [b, s, d]
    decoder ids [b, t] -> shared embedding -> Decoder: n x (x += causal SelfAttention (KV cache,
      causal relative bias); x += CrossAttention(rms(x), encoder states); x += FF(rms(x)))
      -> rms -> (* d_model ** -0.5 when the head is tied) -> logits [b, t, vocab]

What sets T5 apart from the textbook transformer:
  * no absolute positions: each attention score gets a learned bias per head, looked up by the
    bucket of the relative distance (key - query). Exact buckets for small distances, log-spaced
    ones up to `relative_attention_max_distance`. Only layer 0 of each stack has the table; the
    other layers reuse layer 0's bias (with the mask folded in).
  * no 1/sqrt(d_kv) attention scaling (folded into the initialisation), no biases anywhere,
    RMS layer norm without mean subtraction or bias ("T5LayerNorm").
  * FF: v1.0 is wo(relu(wi(x))); v1.1 / flan-t5 is gated: wo(gelu_new(wi_0(x)) * wi_1(x)).
  * a tied head (v1.0: logits = (h * d_model ** -0.5) @ shared^T); v1.1 / flan have an untied
    lm_head and no rescale. The rescale follows `tie_word_embeddings` in config.json.

Weights load from two namings onto the same modules, through the table T5_WEIGHT_NAMES at the
end of this file: HF `T5ForConditionalGeneration` names (safetensors, or a GGUF with HF names as
Candle's quantized T5 writes, with config.json beside it) and llama.cpp's GGUF `t5` arch (config
in the metadata). Old checkpoints also carry
decoder.block.0.layer.1.EncDecAttention.relative_attention_bias, which T5 never uses
(cross-attention has no position bias): it is ignored.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..core import dtype as dt
from ..core.device import Device
from ..core.errors import FormatError, UnsupportedError
from ..core.tensor import Tensor
from ..generation import GenerationOptions, Seq2SeqLM, sample_steps
from ..io.checkpoint import open_checkpoint
from ..io.weights import FirstOf, GgufWeights, WeightNames, open_weights
from ..nn import ops
from ..nn.kv_cache import KvCache
from ..nn.layers import Activation, RmsNorm
from ..nn.var_builder import VarBuilder
from ..quantized.qmatmul import QMatMul
from .config_fields import ConfigFields, read_json_config
from .inputs import additive_padding_mask, token_ids

# Sequence length the released checkpoints were trained with (`n_positions` in old configs).
# Relative positions have no hard limit, but far longer inputs are out of distribution and
# cost quadratic memory: longer inputs are truncated with a notice.
DEFAULT_MAX_INPUT_TOKENS = 512
DEFAULT_MAX_NEW_TOKENS = 64
REQUIRED_CONFIG_FIELDS = ("vocab_size", "d_model", "d_kv", "d_ff", "num_layers", "num_heads")


@dataclass(frozen=True)
class T5Config:
    vocab_size: int
    d_model: int
    d_kv: int
    d_ff: int
    num_layers: int
    num_decoder_layers: int
    num_heads: int
    relative_attention_num_buckets: int = 32
    relative_attention_max_distance: int = 128
    layer_norm_epsilon: float = 1e-6
    dense_act_fn: str = "relu"
    is_gated_act: bool = False
    scale_decoder_outputs: bool = True  # tied head: hidden * d_model ** -0.5 before the head
    pad_token_id: int = 0
    eos_token_id: int = 1
    decoder_start_token_id: int = 0
    max_input_tokens: int = DEFAULT_MAX_INPUT_TOKENS

    @property
    def inner_dim(self) -> int:
        return self.num_heads * self.d_kv

    @staticmethod
    def parse_feed_forward_proj(value: str) -> tuple:
        """HF `feed_forward_proj`: "relu", "gated-gelu", "gated-silu"... -> (activation, gated).
        "gated-gelu" means the tanh GELU (`gelu_new`), for backward compatibility in HF."""
        if not isinstance(value, str) or not value:
            raise FormatError(f"t5 config.json: feed_forward_proj must be a string, got {value!r}")
        parts = value.split("-")
        if len(parts) > 2 or (len(parts) == 2 and parts[0] != "gated"):
            raise FormatError(f"t5 config.json: feed_forward_proj {value!r} is not of the form "
                              f"'ACT' or 'gated-ACT'")
        gated = len(parts) == 2
        activation = "gelu_new" if value == "gated-gelu" else parts[-1]
        try:
            Activation(activation)
        except UnsupportedError as error:
            raise UnsupportedError(f"t5 config.json feed_forward_proj {value!r}: {error}") from None
        return activation, gated

    @staticmethod
    def from_hf_config(cfg: dict, source: str = "t5 config.json") -> "T5Config":
        """From an HF config.json object; `source` names the file in errors."""
        fields = ConfigFields(cfg, source)
        sizes = {name: fields.positive_int(name) for name in REQUIRED_CONFIG_FIELDS}
        vocab = sizes["vocab_size"]
        activation, gated = T5Config.parse_feed_forward_proj(cfg.get("feed_forward_proj", "relu"))
        pad = fields.token_id("pad_token_id", vocab, 0)
        eos_ids = fields.token_ids("eos_token_id", vocab, (1,))
        if not eos_ids:
            raise fields.fail("eos_token_id", f"a token id in 0..{vocab - 1}", cfg["eos_token_id"])
        return T5Config(
            **sizes, num_decoder_layers=fields.positive_int("num_decoder_layers",
                                                            sizes["num_layers"]),
            relative_attention_num_buckets=fields.positive_int("relative_attention_num_buckets", 32),
            relative_attention_max_distance=fields.positive_int("relative_attention_max_distance",
                                                                128),
            layer_norm_epsilon=fields.number("layer_norm_epsilon", 1e-6, positive=True),
            dense_act_fn=activation, is_gated_act=gated,
            # HF: only an explicit `tie_word_embeddings: false` (v1.1, flan) drops the rescale.
            scale_decoder_outputs=fields.boolean("tie_word_embeddings", True),
            pad_token_id=pad, eos_token_id=eos_ids[0],
            decoder_start_token_id=fields.token_id("decoder_start_token_id", vocab, pad),
            max_input_tokens=fields.positive_int("n_positions", DEFAULT_MAX_INPUT_TOKENS))

    @staticmethod
    def from_gguf(gguf) -> "T5Config":
        """From llama.cpp's `t5.*` metadata; activation and tying follow from the tensors."""
        source = f"GGUF {gguf.source}"
        field = ConfigFields(gguf.metadata, source, kind="metadata key", key_prefix="t5.")
        tokens = ConfigFields(gguf.metadata, source, kind="metadata key",
                              key_prefix="tokenizer.ggml.")
        embed = gguf.qtensor("token_embd.weight")
        vocab = embed.shape[0]
        gated = "enc.blk.0.ffn_gate.weight" in gguf.tensors
        n_layers = field.positive_int("block_count")
        return T5Config(
            vocab_size=vocab, d_model=field.positive_int("embedding_length"),
            d_kv=field.positive_int("attention.key_length"),
            d_ff=field.positive_int("feed_forward_length"),
            num_layers=n_layers,
            num_decoder_layers=field.positive_int("decoder_block_count", n_layers),
            num_heads=field.positive_int("attention.head_count"),
            relative_attention_num_buckets=field.positive_int("attention.relative_buckets_count",
                                                              32),
            layer_norm_epsilon=field.number("attention.layer_norm_rms_epsilon", 1e-6,
                                            positive=True),
            # llama.cpp's convention: gated FF means flan/v1.1 (gelu_new), else v1.0 relu.
            dense_act_fn="gelu_new" if gated else "relu", is_gated_act=gated,
            scale_decoder_outputs="output.weight" not in gguf.tensors,
            eos_token_id=tokens.token_id("eos_token_id", vocab, 1),
            pad_token_id=tokens.token_id("padding_token_id", vocab, 0),
            decoder_start_token_id=field.token_id("decoder_start_token_id", vocab, 0),
            max_input_tokens=field.positive_int("context_length", DEFAULT_MAX_INPUT_TOKENS))


# -- relative position buckets --------------------------------------------------------------
def relative_position_bucket(relative_position: np.ndarray, bidirectional: bool,
                             num_buckets: int, max_distance: int) -> np.ndarray:
    """Bucket of each (key - query) distance. Bidirectional (encoder): half the buckets for
    keys after the query. Causal (decoder): only keys at or before the query count. Below
    `max_exact` each distance has its own bucket, above it buckets are log-spaced up to
    `max_distance` and the last bucket takes everything further.

    The log branch is computed in float32 like the reference implementation: a distance that
    lands exactly on a bucket boundary must round the same way."""
    relative_position = np.asarray(relative_position, dtype=np.int64)
    buckets = np.zeros_like(relative_position)
    if bidirectional:
        num_buckets //= 2
        buckets += (relative_position > 0).astype(np.int64) * num_buckets
        distance = np.abs(relative_position)
    else:
        distance = -np.minimum(relative_position, 0)
    max_exact = num_buckets // 2
    is_small = distance < max_exact
    with np.errstate(divide="ignore"):  # log(0) only in the small branch, which is not used
        scaled = (np.log(distance.astype(np.float32) / np.float32(max_exact))
                  / np.float32(math.log(max_distance / max_exact))
                  * np.float32(num_buckets - max_exact))
    large = max_exact + np.where(is_small, 0, scaled).astype(np.int64)
    large = np.minimum(large, num_buckets - 1)
    return buckets + np.where(is_small, distance, large)


class RelativePositionBias:
    """The learned bias table [num_buckets, heads] of layer 0 -> bias [1, heads, q, k]."""

    def __init__(self, table: Tensor, bidirectional: bool, max_distance: int):
        self.table = table
        self.bidirectional = bidirectional
        self.num_buckets = table.dims()[0]
        self.max_distance = max_distance

    def __call__(self, q_len: int, k_len: int, q_offset: int = 0) -> Tensor:
        query = np.arange(q_offset, q_offset + q_len)[:, None]
        key = np.arange(k_len)[None, :]
        buckets = relative_position_bucket(key - query, self.bidirectional, self.num_buckets,
                                           self.max_distance)
        ids = Tensor.from_numpy(buckets.reshape(-1), dt.i64, self.table.device)
        values = self.table.index_select(ids, 0).reshape(q_len, k_len, -1)  # [q, k, h]
        return values.permute(2, 0, 1).unsqueeze(0)  # [1, h, q, k]


# -- modules in forward order ---------------------------------------------------------------
class T5Attention:
    """Multi-head attention without scaling or biases; keys/values either from `x` itself
    (self-attention, optionally cached) or precomputed from the encoder (cross-attention)."""

    def __init__(self, q: QMatMul, k: QMatMul, v: QMatMul, o: QMatMul, num_heads: int, d_kv: int):
        self.q, self.k, self.v, self.o = q, k, v, o
        self.num_heads, self.d_kv = num_heads, d_kv

    def _split_heads(self, x: Tensor) -> Tensor:
        b, t, _ = x.dims()
        return x.reshape(b, t, self.num_heads, self.d_kv).transpose(1, 2)  # [b, h, t, d_kv]

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, bias: Tensor) -> Tensor:
        heads = ops.scaled_dot_product_attention(q, k, v, bias, scale=1.0)  # [b, h, t, d_kv]
        b, h, t, d_kv = heads.dims()
        return self.o(heads.transpose(1, 2).reshape(b, t, h * d_kv))

    def self_attend(self, x: Tensor, bias: Tensor, cache: KvCache = None) -> Tensor:
        q = self._split_heads(self.q(x)).contiguous()
        k = self._split_heads(self.k(x))
        v = self._split_heads(self.v(x)).contiguous()
        if cache is not None:
            k, v = cache.append(k.contiguous(), v)
        else:
            k = _keys_for_matmul(k)
        return self._attend(q, k, v, bias)

    def encoder_kv(self, encoder_states: Tensor):
        """Cross-attention keys and values, computed once per input and reused every step."""
        return (_keys_for_matmul(self._split_heads(self.k(encoder_states))),
                self._split_heads(self.v(encoder_states)).contiguous())

    def cross_attend(self, x: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
        return self._attend(self._split_heads(self.q(x)), k, v, mask)


def _keys_for_matmul(k: Tensor) -> Tensor:
    """k [b, h, t, d] as the transpose of a contiguous [b, h, d, t]: the attention kernel's
    k^T is then contiguous. numpy's batched matmul takes a slow non-BLAS loop on strided
    operands (measured 40-700x slower at BERT/T5 sizes); the numbers are the same."""
    return k.transpose(2, 3).contiguous().transpose(2, 3)


class FeedForward:
    """v1.0: wo(act(wi(x))); gated (v1.1, flan): wo(act(wi_0(x)) * wi_1(x))."""

    def __init__(self, activation: str, wo: QMatMul, wi: QMatMul = None, wi_0: QMatMul = None,
                 wi_1: QMatMul = None):
        self.act = Activation(activation)
        self.wi, self.wi_0, self.wi_1, self.wo = wi, wi_0, wi_1, wo

    def __call__(self, x: Tensor) -> Tensor:
        if self.wi is not None:
            return self.wo(self.act(self.wi(x)))
        return self.wo(self.act(self.wi_0(x)).mul(self.wi_1(x)))


class EncoderBlock:
    def __init__(self, attn_norm: RmsNorm, attn: T5Attention, ff_norm: RmsNorm, ff: FeedForward):
        self.attn_norm, self.attn, self.ff_norm, self.ff = attn_norm, attn, ff_norm, ff

    def __call__(self, x: Tensor, bias: Tensor) -> Tensor:
        x = x.add(self.attn.self_attend(self.attn_norm(x), bias))
        return x.add(self.ff(self.ff_norm(x)))


class DecoderBlock:
    def __init__(self, attn_norm, attn: T5Attention, cross_norm, cross: T5Attention, ff_norm,
                 ff: FeedForward):
        self.attn_norm, self.attn = attn_norm, attn
        self.cross_norm, self.cross = cross_norm, cross
        self.ff_norm, self.ff = ff_norm, ff

    def __call__(self, x, bias, cross_k, cross_v, cross_mask, cache: KvCache) -> Tensor:
        x = x.add(self.attn.self_attend(self.attn_norm(x), bias, cache))
        x = x.add(self.cross.cross_attend(self.cross_norm(x), cross_k, cross_v, cross_mask))
        return x.add(self.ff(self.ff_norm(x)))


class DecoderState:
    """What persists between decoding steps: cross-attention K/V per layer (from the encoder
    output, computed once), the self-attention caches and the encoder padding mask."""

    def __init__(self, cross_kv: list, cross_mask, n_layers: int, use_cache: bool = True):
        self.cross_kv = cross_kv  # per layer (k, v), [b, h, s, d_kv]
        self.cross_mask = cross_mask  # [b, 1, 1, s] additive, or None without padding
        # Without caches (teacher forcing) the keys stay in the autograd graph, which the
        # caches' preallocated buffers would cut; such a state decodes one whole sequence once.
        self.caches = [KvCache(dim=2) if use_cache else None for _ in range(n_layers)]
        self.decoded = False

    @property
    def offset(self) -> int:
        return self.caches[0].current_seq_len() if self.caches[0] is not None else 0


class T5ForConditionalGeneration:
    def __init__(self, config: T5Config, shared: Tensor, encoder_blocks: list,
                 encoder_bias: RelativePositionBias, encoder_norm: RmsNorm, decoder_blocks: list,
                 decoder_bias: RelativePositionBias, decoder_norm: RmsNorm, lm_head: QMatMul,
                 device=None):
        self.config = config
        self.shared = shared  # [vocab, d]
        self.encoder_blocks, self.encoder_bias, self.encoder_norm = (encoder_blocks, encoder_bias,
                                                                     encoder_norm)
        self.decoder_blocks, self.decoder_bias, self.decoder_norm = (decoder_blocks, decoder_bias,
                                                                     decoder_norm)
        self.lm_head = lm_head
        self.device = Device.parse(device)

    # -- encoder ----------------------------------------------------------------------------
    def encode(self, input_ids, attention_mask=None) -> Tensor:
        """input ids [b, s] (+ 1/0 mask [b, s] for padded batches) -> states [b, s, d]."""
        ids = token_ids(input_ids, self.device, "t5 encode")
        b, s = ids.dims()
        x = self.shared.embedding(ids)
        bias = self.encoder_bias(s, s)  # [1, h, s, s]
        pad_mask = additive_padding_mask(attention_mask, b, s, self.device, "t5")
        if pad_mask is not None:
            bias = bias.broadcast_add(pad_mask)  # [b, h, s, s]
        for block in self.encoder_blocks:
            x = block(x, bias)
        return self.encoder_norm(x)

    # -- decoder ----------------------------------------------------------------------------
    def start_decoding(self, encoder_states: Tensor, attention_mask=None,
                       use_cache: bool = True) -> DecoderState:
        b, s, _ = encoder_states.dims()
        cross = [block.cross.encoder_kv(encoder_states) for block in self.decoder_blocks]
        return DecoderState(cross, additive_padding_mask(attention_mask, b, s, self.device, "t5"),
                            len(self.decoder_blocks), use_cache)

    def decode(self, decoder_ids, state: DecoderState) -> Tensor:
        """New decoder ids [b, t] -> logits [b, t, vocab]; the caches advance by t."""
        ids = token_ids(decoder_ids, self.device, "t5 decode")
        if state.decoded and state.caches[0] is None:
            raise UnsupportedError("t5 decode: a state without caches decodes one sequence once")
        state.decoded = True
        t = ids.dims()[1]
        offset = state.offset
        x = self.shared.embedding(ids)
        bias = self.decoder_bias(t, offset + t, q_offset=offset)  # [1, h, t, offset + t]
        if t > 1:
            bias = bias.broadcast_add(ops.causal_mask(t, offset, device=self.device))
        for block, (k, v), cache in zip(self.decoder_blocks, state.cross_kv, state.caches):
            x = block(x, bias, k, v, state.cross_mask, cache)
        x = self.decoder_norm(x)
        if self.config.scale_decoder_outputs:
            x = x.affine(self.config.d_model ** -0.5, 0.0)
        return self.lm_head(x)

    def forward(self, input_ids, decoder_ids, attention_mask=None) -> Tensor:
        """Teacher-forced logits [b, t, vocab] for decoder ids that start with the start token
        (differentiable when the weights are Vars: see t5_training)."""
        state = self.start_decoding(self.encode(input_ids, attention_mask), attention_mask,
                                    use_cache=False)
        return self.decode(decoder_ids, state)

    __call__ = forward

    # -- generation -------------------------------------------------------------------------
    def generate(self, input_ids, attention_mask=None, options: GenerationOptions = None,
                 on_step=None) -> list:
        """Generated ids per batch row (without the start token; ending with the eos token
        unless the budget ran out), through generation's token loop. Sampling, repeat penalty
        and eos ids come from the shared `generation.GenerationOptions` (stop strings are
        applied by pipelines.text2text). `on_step(step, new_ids)` is called after each step:
        the hook for progress and cancel (it may raise `Cancelled`)."""
        options = options or GenerationOptions(max_new_tokens=DEFAULT_MAX_NEW_TOKENS)
        lm = Seq2SeqLM(self, attention_mask)  # the encoder once, then decoder steps
        eos = set(options.eos_token_ids if options.eos_token_ids is not None
                  else lm.eos_token_ids)
        logits = lm.start(input_ids)
        generated = [[] for _ in range(logits.shape[0])]
        steps = sample_steps(lm, logits, options, eos, options.max_new_tokens, generated)
        for step, (next_ids, _) in enumerate(steps):
            if on_step is not None:
                on_step(step, next_ids)
        return generated

    # -- loading ----------------------------------------------------------------------------
    @staticmethod
    def load(weights, config=None, device=None, mode: str = "auto") -> "T5ForConditionalGeneration":
        """weights: a weights source (io/weights.py) or what `open_weights` takes (safetensors
        path(s) or bytes, a .gguf, a dict of arrays); config: a T5Config or config.json (path,
        bytes or parsed), or None for a GGUF of llama.cpp's `t5` arch (config from its
        metadata). `mode`: how GGML matrices multiply (quantized/qmatmul.py). Every tensor is
        checked against the shape the config implies."""
        if config is not None:
            # First: a broken config.json is named before the weights load.
            config = _read_config(config)
        weights = open_weights(weights)
        naming = T5_WEIGHT_NAMES.naming_of(weights)
        if naming is None:
            raise FormatError(f"{weights.label}: no T5 embedding tensor (token_embd.weight or "
                              f"shared.weight); not a T5 model")
        gguf = weights.gguf if isinstance(weights, GgufWeights) else None
        if naming == "gguf" and gguf is not None:
            arch = gguf.get("general.architecture")
            if arch not in (None, "t5"):
                raise UnsupportedError(f"GGUF {gguf.source}: architecture {arch!r} is not t5")
        if config is None:
            if gguf is None:
                raise FormatError(f"{weights.label}: pass its config.json (only a GGUF of "
                                  f"llama.cpp's t5 arch carries its config)")
            if naming != "gguf":
                raise FormatError(f"{weights.label} uses HF tensor names and has no t5 metadata: "
                                  f"pass its config.json")
            config = T5Config.from_gguf(gguf)
        device = Device.parse(device)
        vb = VarBuilder(T5_WEIGHT_NAMES.view(weights, naming), dt.f32, device, mode=mode)
        return _build(config, vb, device)

    @staticmethod
    def from_pretrained(path, device=None, mode: str = "auto") -> "T5ForConditionalGeneration":
        """From what io/checkpoint.py opens: a folder with config.json + *.safetensors (or
        pytorch_model.bin), or one .gguf (with config.json beside it when it uses HF names; a
        GGUF of llama.cpp's t5 arch carries its config); a .gguf file; a registry name; a Hub
        spec; received bytes; a Checkpoint."""
        checkpoint = open_checkpoint(path, kind="t5")
        # The config first: a broken config.json is named before the weights are opened.
        config = (checkpoint.config if checkpoint.format == "gguf"
                  else checkpoint.required_config())
        if config is not None:
            config = T5Config.from_hf_config(config, checkpoint.config_label)
        return T5ForConditionalGeneration.load(checkpoint.weights, config, device, mode)


def _build(config: T5Config, vb: VarBuilder, device) -> T5ForConditionalGeneration:
    """The modules from the weights, by the model's names (T5_WEIGHT_NAMES); each checked
    against the config's shape. The order of the reads is the order a fresh training VarMap
    draws its initial values in (models/t5_training.py): keep it."""
    d, inner, d_ff, eps = config.d_model, config.inner_dim, config.d_ff, config.layer_norm_epsilon

    def norm(v):
        return RmsNorm(v.get((d,), "weight"), eps)

    def attention(v):
        return T5Attention(v.matrix((inner, d), "q.weight"), v.matrix((inner, d), "k.weight"),
                           v.matrix((inner, d), "v.weight"), v.matrix((d, inner), "o.weight"),
                           config.num_heads, config.d_kv)

    def feed_forward(v):
        wo = v.matrix((d, d_ff), "wo.weight")
        if config.is_gated_act:
            return FeedForward(config.dense_act_fn, wo, wi_0=v.matrix((d_ff, d), "wi_0.weight"),
                               wi_1=v.matrix((d_ff, d), "wi_1.weight"))
        return FeedForward(config.dense_act_fn, wo, wi=v.matrix((d_ff, d), "wi.weight"))

    def position_bias(name, bidirectional):
        table = vb.get((config.relative_attention_num_buckets, config.num_heads), name)
        return RelativePositionBias(table, bidirectional, config.relative_attention_max_distance)

    encoder_blocks = []
    for i in range(config.num_layers):
        v = vb.pp(f"encoder_blocks.{i}")
        encoder_blocks.append(EncoderBlock(norm(v.pp("attn_norm")), attention(v.pp("attn")),
                                           norm(v.pp("ff_norm")), feed_forward(v.pp("ff"))))
    decoder_blocks = []
    for i in range(config.num_decoder_layers):
        v = vb.pp(f"decoder_blocks.{i}")
        decoder_blocks.append(DecoderBlock(
            norm(v.pp("attn_norm")), attention(v.pp("attn")), norm(v.pp("cross_norm")),
            attention(v.pp("cross")), norm(v.pp("ff_norm")), feed_forward(v.pp("ff"))))
    shared = vb.get((config.vocab_size, d), "shared")
    if vb.has("lm_head.weight"):
        lm_head = vb.matrix((config.vocab_size, d), "lm_head.weight")
    else:
        lm_head = vb.tied_matrix(shared)  # v1.0: the head is the embedding (one table)
    return T5ForConditionalGeneration(
        config, shared, encoder_blocks, position_bias("encoder_bias.table", True),
        norm(vb.pp("encoder_norm")), decoder_blocks, position_bias("decoder_bias.table", False),
        norm(vb.pp("decoder_norm")), lm_head, device)


def _read_config(config) -> T5Config:
    """A T5Config from a T5Config, a parsed config.json, its bytes or its path."""
    if isinstance(config, T5Config):
        return config
    source = f"t5 config.json {config}" if isinstance(config, (str, Path)) else "t5 config.json"
    return T5Config.from_hf_config(read_json_config(config, "t5 config.json"), source)


# -- weight names ---------------------------------------------------------------------------
# The model's names (its modules' attribute paths) -> HF `T5ForConditionalGeneration` names and
# llama.cpp's GGUF `t5` names (its converter's mapping). Only layer 0 of each stack stores the
# position bias table.
T5_WEIGHT_NAMES = WeightNames(("hf", "gguf"), {
    # Some exports keep only the stacks' copies of the embedding.
    "shared": (FirstOf("shared.weight", "encoder.embed_tokens.weight"), "token_embd.weight"),
    "encoder_blocks.{i}.attn_norm.weight": ("encoder.block.{i}.layer.0.layer_norm.weight",
                                            "enc.blk.{i}.attn_norm.weight"),
    "encoder_blocks.{i}.attn.q.weight": ("encoder.block.{i}.layer.0.SelfAttention.q.weight",
                                         "enc.blk.{i}.attn_q.weight"),
    "encoder_blocks.{i}.attn.k.weight": ("encoder.block.{i}.layer.0.SelfAttention.k.weight",
                                         "enc.blk.{i}.attn_k.weight"),
    "encoder_blocks.{i}.attn.v.weight": ("encoder.block.{i}.layer.0.SelfAttention.v.weight",
                                         "enc.blk.{i}.attn_v.weight"),
    "encoder_blocks.{i}.attn.o.weight": ("encoder.block.{i}.layer.0.SelfAttention.o.weight",
                                         "enc.blk.{i}.attn_o.weight"),
    "encoder_blocks.{i}.ff_norm.weight": ("encoder.block.{i}.layer.1.layer_norm.weight",
                                          "enc.blk.{i}.ffn_norm.weight"),
    "encoder_blocks.{i}.ff.wi.weight": ("encoder.block.{i}.layer.1.DenseReluDense.wi.weight",
                                        "enc.blk.{i}.ffn_up.weight"),
    "encoder_blocks.{i}.ff.wi_0.weight": ("encoder.block.{i}.layer.1.DenseReluDense.wi_0.weight",
                                          "enc.blk.{i}.ffn_gate.weight"),
    "encoder_blocks.{i}.ff.wi_1.weight": ("encoder.block.{i}.layer.1.DenseReluDense.wi_1.weight",
                                          "enc.blk.{i}.ffn_up.weight"),
    "encoder_blocks.{i}.ff.wo.weight": ("encoder.block.{i}.layer.1.DenseReluDense.wo.weight",
                                        "enc.blk.{i}.ffn_down.weight"),
    "encoder_bias.table": ("encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
                           "enc.blk.0.attn_rel_b.weight"),
    "encoder_norm.weight": ("encoder.final_layer_norm.weight", "enc.output_norm.weight"),
    "decoder_blocks.{i}.attn_norm.weight": ("decoder.block.{i}.layer.0.layer_norm.weight",
                                            "dec.blk.{i}.attn_norm.weight"),
    "decoder_blocks.{i}.attn.q.weight": ("decoder.block.{i}.layer.0.SelfAttention.q.weight",
                                         "dec.blk.{i}.attn_q.weight"),
    "decoder_blocks.{i}.attn.k.weight": ("decoder.block.{i}.layer.0.SelfAttention.k.weight",
                                         "dec.blk.{i}.attn_k.weight"),
    "decoder_blocks.{i}.attn.v.weight": ("decoder.block.{i}.layer.0.SelfAttention.v.weight",
                                         "dec.blk.{i}.attn_v.weight"),
    "decoder_blocks.{i}.attn.o.weight": ("decoder.block.{i}.layer.0.SelfAttention.o.weight",
                                         "dec.blk.{i}.attn_o.weight"),
    "decoder_blocks.{i}.cross_norm.weight": ("decoder.block.{i}.layer.1.layer_norm.weight",
                                             "dec.blk.{i}.cross_attn_norm.weight"),
    "decoder_blocks.{i}.cross.q.weight": ("decoder.block.{i}.layer.1.EncDecAttention.q.weight",
                                          "dec.blk.{i}.cross_attn_q.weight"),
    "decoder_blocks.{i}.cross.k.weight": ("decoder.block.{i}.layer.1.EncDecAttention.k.weight",
                                          "dec.blk.{i}.cross_attn_k.weight"),
    "decoder_blocks.{i}.cross.v.weight": ("decoder.block.{i}.layer.1.EncDecAttention.v.weight",
                                          "dec.blk.{i}.cross_attn_v.weight"),
    "decoder_blocks.{i}.cross.o.weight": ("decoder.block.{i}.layer.1.EncDecAttention.o.weight",
                                          "dec.blk.{i}.cross_attn_o.weight"),
    "decoder_blocks.{i}.ff_norm.weight": ("decoder.block.{i}.layer.2.layer_norm.weight",
                                          "dec.blk.{i}.ffn_norm.weight"),
    "decoder_blocks.{i}.ff.wi.weight": ("decoder.block.{i}.layer.2.DenseReluDense.wi.weight",
                                        "dec.blk.{i}.ffn_up.weight"),
    "decoder_blocks.{i}.ff.wi_0.weight": ("decoder.block.{i}.layer.2.DenseReluDense.wi_0.weight",
                                          "dec.blk.{i}.ffn_gate.weight"),
    "decoder_blocks.{i}.ff.wi_1.weight": ("decoder.block.{i}.layer.2.DenseReluDense.wi_1.weight",
                                          "dec.blk.{i}.ffn_up.weight"),
    "decoder_blocks.{i}.ff.wo.weight": ("decoder.block.{i}.layer.2.DenseReluDense.wo.weight",
                                        "dec.blk.{i}.ffn_down.weight"),
    "decoder_bias.table": ("decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
                           "dec.blk.0.attn_rel_b.weight"),
    "decoder_norm.weight": ("decoder.final_layer_norm.weight", "dec.output_norm.weight"),
    "lm_head.weight": ("lm_head.weight", "output.weight"),
}, marker="shared")

__all__ = ["T5Config", "T5ForConditionalGeneration", "T5_WEIGHT_NAMES", "GenerationOptions",
           "relative_position_bucket"]
