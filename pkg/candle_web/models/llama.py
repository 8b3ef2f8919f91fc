"""LLaMA-family decoder-only transformer (Touvron et al. 2023), read top to bottom.

    ids [b, t] -> embed -> x [b, t, d]
      -> n_layers x Block:
           x = x + attn(rms_norm(x))   fused QKV, RoPE on q/k, KV cache, grouped-query attention
           x = x + mlp(rms_norm(x))    fused gate|up, silu(gate) * up, down
      -> rms_norm -> logits = x @ W_out^T   [b, vocab] (last position) or [b, t, vocab]
    W_out is the embedding table when the checkpoint has no separate output weight (tied).

Weights load from HF safetensors (float) and GGUF (quantized) onto the same modules, through
the table LLAMA_WEIGHT_NAMES at the end of this file; Q/K/V are stacked into one matrix and so
are gate/up (one matmul each per step). The head is the embedding table when the checkpoint has
no separate output weight (tied). llama3 rope scaling: `rope_scaling` in config.json, or a
`rope_freqs.weight` tensor in GGUF (read with the config).

RoPE layouts: llama.cpp's converter permutes the rows of Q and K inside each head so that the
rotated pairs are adjacent (the original Meta layout), so GGUF weights use interleaved RoPE
(`rope_i`); HF checkpoints rotate the two halves of each head (`rope`). Weights are never
shuffled at load; `LlamaConfig.rope_interleaved` records which layout the checkpoint uses.

This file is the reference computation only. Decoding chooses, in backend/parts.py
(`start_causal_decoding`), whether single-token steps go to a backend's fused part
`llama.decoder_step` (fed with `part_weights()`, writing the same KV caches as the tensor path;
the same result up to f32 summation order) or to `forward` below.

Grouped-query attention without repeating K/V: the h query heads are grouped as
[n_kv, n_rep], so q [b, h, t, hd] is viewed as [b, n_kv, n_rep * t, hd] and attends to the
n_kv cached heads directly; the causal mask is tiled n_rep times along its rows.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..core import dtype as dt
from ..backend import parts
from ..core.device import Device
from ..core.errors import FormatError, IndexOutOfRange, ModelNotFound, ShapeMismatch, UnsupportedError
from ..io.checkpoint import open_checkpoint
from ..io.weights import GgufWeights, WeightNames, open_weights
from ..nn import ops
from ..nn.kv_cache import KvCache
from ..nn.layers import RmsNorm
from ..nn.rotary import rope, rope_frequencies, rope_i
from ..nn.var_builder import VarBuilder
from ..quantized.qmatmul import QMatMul
from ..quantized.qtensor import QTensor
from ..core.tensor import Tensor
from .config_fields import ConfigFields, read_json_config
from .inputs import token_ids

SUPPORTED_GGUF_ARCHITECTURES = ("llama", "qwen2")
SUPPORTED_HF_MODEL_TYPES = ("llama", "qwen2")
# llama.cpp's converter permutes the Q/K rows (interleaved RoPE) for these architectures only;
# the others keep HF's half-split layout (llama.cpp's NEOX rope type).
GGUF_PERMUTED_QK_ARCHITECTURES = ("llama",)
SUPPORTED_ROPE_SCALING = ("linear", "llama3")
DEFAULT_ROPE_THETA = 10000.0
DEFAULT_RMS_NORM_EPS = 1e-5
# KV cache positions allocated up front when the caller does not say how long the sequence
# will be; the cache doubles when full.
DEFAULT_CACHE_CAPACITY = 256
# Rotary tables are computed for this many positions first and doubled on demand, so a
# 128k-context model does not build 128k rows for a short chat.
INITIAL_ROPE_POSITIONS = 2048


# -- configuration ------------------------------------------------------------------------
@dataclass(frozen=True)
class RopeScaling:
    """Rescaling of the rotary inverse frequencies for long context.

    linear: every frequency divided by `factor` (positions interpolated).
    llama3: long wavelengths divided by `factor`, short ones kept, a smooth blend between
    (Llama 3.1's scheme). freq_factors: each frequency divided by its own factor (how
    llama.cpp stores llama3 scaling in GGUF: a `rope_freqs.weight` tensor)."""

    kind: str
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192
    freq_factors: tuple = ()

    def apply(self, inv_freq: np.ndarray) -> np.ndarray:
        if self.kind == "linear":
            return inv_freq / self.factor
        if self.kind == "freq_factors":
            factors = np.asarray(self.freq_factors, dtype=np.float64)
            if factors.shape != inv_freq.shape:
                raise ShapeMismatch(f"rope_freqs: {factors.size} factors for {inv_freq.size} "
                                    "rotary frequencies")
            return inv_freq / factors
        if self.kind == "llama3":
            return self._llama3(inv_freq)
        raise UnsupportedError(f"rope scaling {self.kind!r} is not supported; supported: "
                               f"{SUPPORTED_ROPE_SCALING}")

    def _llama3(self, inv_freq: np.ndarray) -> np.ndarray:
        old_context = float(self.original_max_position_embeddings)
        low_freq_wavelen = old_context / self.low_freq_factor
        high_freq_wavelen = old_context / self.high_freq_factor
        wavelen = 2.0 * math.pi / inv_freq
        smooth = (old_context / wavelen - self.low_freq_factor) / \
            (self.high_freq_factor - self.low_freq_factor)
        blended = (1.0 - smooth) * inv_freq / self.factor + smooth * inv_freq
        out = np.where(wavelen > low_freq_wavelen, inv_freq / self.factor, blended)
        return np.where(wavelen < high_freq_wavelen, inv_freq, out)

    @staticmethod
    def from_hf(fields):
        """From config.json's `rope_scaling` (or transformers 5's `rope_parameters`), as a
        ConfigFields section (a plain dict is accepted too)."""
        if isinstance(fields, dict):
            fields = ConfigFields(fields, "config.json", label_prefix="rope_scaling.")
        if fields is None or not fields.mapping:
            return None
        kind = fields.string("rope_type", fields.string("type", "default"))
        if kind == "default":
            return None
        if kind not in SUPPORTED_ROPE_SCALING:
            raise UnsupportedError(f"{fields.source}: rope scaling {kind!r} is not supported; "
                                   f"supported: {SUPPORTED_ROPE_SCALING}")
        if kind == "linear":
            return RopeScaling("linear", fields.number("factor", positive=True))
        return RopeScaling("llama3", fields.number("factor", positive=True),
                           fields.number("low_freq_factor", 1.0, positive=True),
                           fields.number("high_freq_factor", 4.0, positive=True),
                           fields.positive_int("original_max_position_embeddings", 8192))


@dataclass(frozen=True)
class LlamaConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = DEFAULT_RMS_NORM_EPS
    rope_theta: float = DEFAULT_ROPE_THETA
    max_position_embeddings: int = 4096
    rope_interleaved: bool = False  # True for GGUF's permuted Q/K (see the module doc)
    rope_scaling: RopeScaling = None
    tie_word_embeddings: bool = False
    bos_token_id: int = None
    eos_token_ids: tuple = ()
    family: str = "llama"  # the architecture the file names (chooses the weight-name table)
    qkv_bias: bool = False  # qwen2: biases on the Q, K and V projections

    def __post_init__(self):
        if self.num_kv_heads <= 0 or self.num_heads % self.num_kv_heads:
            raise FormatError(f"llama config: {self.num_heads} attention heads cannot be "
                              f"grouped over {self.num_kv_heads} key/value heads")
        if self.head_dim % 2:
            raise FormatError(f"llama config: head_dim {self.head_dim} must be even for RoPE")

    @property
    def n_rep(self) -> int:
        return self.num_heads // self.num_kv_heads

    @staticmethod
    def from_hf_config(cfg: dict, source: str = "llama config.json") -> "LlamaConfig":
        """From an HF config.json object; `source` names the file in errors."""
        fields = ConfigFields(cfg, source)
        model_type = cfg.get("model_type")
        if model_type not in SUPPORTED_HF_MODEL_TYPES:
            raise UnsupportedError(f"{source}: model_type {model_type!r} is not supported "
                                   f"by the llama model; supported: {SUPPORTED_HF_MODEL_TYPES}")
        for flag in ("attention_bias", "mlp_bias"):
            if fields.boolean(flag, False):
                raise UnsupportedError(f"{source}: {flag}=true is not supported")
        if model_type == "qwen2" and fields.boolean("use_sliding_window", False):
            raise UnsupportedError(f"{source}: use_sliding_window=true is not supported")
        rope_fields = fields.section("rope_parameters")
        scaling = fields.section("rope_scaling") or rope_fields
        theta = fields.number("rope_theta", None, positive=True)
        if theta is None:
            theta = rope_fields.number("rope_theta", DEFAULT_ROPE_THETA, positive=True) \
                if rope_fields is not None else DEFAULT_ROPE_THETA
        vocab, hidden = fields.positive_int("vocab_size"), fields.positive_int("hidden_size")
        heads = fields.positive_int("num_attention_heads")
        kv_heads = fields.positive_int("num_key_value_heads", heads)
        fields.check_divides("num_key_value_heads", kv_heads, "num_attention_heads", heads)
        if not fields.has("head_dim"):
            fields.check_divides("num_attention_heads", heads, "hidden_size", hidden)
        return LlamaConfig(
            vocab_size=vocab, hidden_size=hidden,
            intermediate_size=fields.positive_int("intermediate_size"),
            num_layers=fields.positive_int("num_hidden_layers"), num_heads=heads,
            num_kv_heads=kv_heads, head_dim=fields.positive_int("head_dim", hidden // heads),
            rms_norm_eps=fields.number("rms_norm_eps", DEFAULT_RMS_NORM_EPS, positive=True),
            rope_theta=theta,
            max_position_embeddings=fields.positive_int("max_position_embeddings", 4096),
            rope_interleaved=False, rope_scaling=RopeScaling.from_hf(scaling),
            tie_word_embeddings=fields.boolean("tie_word_embeddings", False),
            bos_token_id=fields.token_id("bos_token_id", vocab, None),
            eos_token_ids=fields.token_ids("eos_token_id", vocab),
            family=model_type, qkv_bias=model_type == "qwen2")

    @staticmethod
    def from_gguf(gguf) -> "LlamaConfig":
        """From a GgufFile's metadata (`llama.*` keys) and tensor shapes."""
        meta = gguf.metadata
        arch = meta.get("general.architecture")
        if arch not in SUPPORTED_GGUF_ARCHITECTURES:
            raise UnsupportedError(f"GGUF {gguf.source}: general.architecture {arch!r} is not "
                                   f"supported; supported: {SUPPORTED_GGUF_ARCHITECTURES}")
        source = f"GGUF {gguf.source}"
        field = ConfigFields(meta, source, kind="metadata key", key_prefix=f"{arch}.")
        tokens = ConfigFields(meta, source, kind="metadata key", key_prefix="tokenizer.ggml.")
        hidden = field.positive_int("embedding_length")
        heads = field.positive_int("attention.head_count")
        if not field.has("attention.key_length"):
            field.check_divides("attention.head_count", heads, "embedding_length", hidden)
        head_dim = field.positive_int("attention.key_length", hidden // heads)
        rotary_dims = field.positive_int("rope.dimension_count", head_dim)
        if rotary_dims != head_dim:
            raise UnsupportedError(f"GGUF {gguf.source}: partial rotary embeddings "
                                   f"({rotary_dims} of {head_dim} dims) are not supported")
        kv_heads = field.positive_int("attention.head_count_kv", heads)
        field.check_divides("attention.head_count_kv", kv_heads, "attention.head_count", heads)
        embed_info = gguf.tensors.get("token_embd.weight")
        if embed_info is None or len(embed_info.shape) != 2 or not embed_info.shape[0]:
            raise FormatError(f"GGUF {gguf.source}: no token_embd.weight [vocab, d] tensor")
        vocab = int(embed_info.shape[0])
        end_ids = (tokens.token_id(name, vocab, None) for name in ("eos_token_id", "eot_token_id"))
        return LlamaConfig(
            vocab_size=vocab, hidden_size=hidden,
            intermediate_size=field.positive_int("feed_forward_length"),
            num_layers=field.positive_int("block_count"), num_heads=heads,
            num_kv_heads=kv_heads, head_dim=head_dim,
            rms_norm_eps=field.number("attention.layer_norm_rms_epsilon", DEFAULT_RMS_NORM_EPS,
                                      positive=True),
            rope_theta=field.number("rope.freq_base", DEFAULT_ROPE_THETA, positive=True),
            max_position_embeddings=field.positive_int("context_length", 4096),
            rope_interleaved=arch in GGUF_PERMUTED_QK_ARCHITECTURES,
            rope_scaling=_gguf_rope_scaling(gguf, arch, field),
            tie_word_embeddings="output.weight" not in gguf.tensors,
            bos_token_id=tokens.token_id("bos_token_id", vocab, None),
            eos_token_ids=tuple(dict.fromkeys(i for i in end_ids if i is not None)),
            family=arch, qkv_bias="blk.0.attn_q.bias" in gguf.tensors)


def _gguf_rope_scaling(gguf, arch: str, field: ConfigFields):
    if "rope_freqs.weight" in gguf.tensors:
        factors = gguf.qtensor("rope_freqs.weight").dequantize().reshape(-1)
        if not (np.isfinite(factors).all() and (factors > 0).all()):
            raise FormatError(f"GGUF {gguf.source}: rope_freqs.weight must hold positive "
                              "finite factors")
        return RopeScaling("freq_factors", freq_factors=tuple(float(f) for f in factors))
    kind = field.string("rope.scaling.type", "none")
    factor = field.number("rope.scaling.factor", None, positive=True)
    if factor is None:
        factor = field.number("rope.scale_linear", None, positive=True)
    if kind == "none" and factor is None:
        return None
    if kind in ("linear", "none") and factor is not None:
        return None if factor == 1.0 else RopeScaling("linear", factor)
    raise UnsupportedError(f"GGUF {gguf.source}: {arch}.rope.scaling.type {kind!r} is not "
                           "supported; supported: linear (and llama3 via rope_freqs.weight)")


# -- modules in forward order -------------------------------------------------------------
class TokenEmbedding:
    """Rows of the [vocab, d] table; from f32 (shared with a dequantized tied head) or
    from GGML blocks, decoding only the rows looked up."""

    def __init__(self, table: Tensor = None, qtable: QTensor = None, device=None):
        self.table, self.qtable = table, qtable
        self.device = table.device if table is not None else Device.parse(device)
        self.vocab_size = (table.dims() if table is not None else qtable.shape)[0]

    def __call__(self, ids: Tensor) -> Tensor:
        flat = ids.to_numpy().reshape(-1).astype(np.int64)
        if flat.size and (flat.min() < 0 or flat.max() >= self.vocab_size):
            bad = flat[(flat < 0) | (flat >= self.vocab_size)][0]
            raise IndexOutOfRange(f"llama embedding: token id {int(bad)} is outside the "
                                  f"vocabulary of {self.vocab_size}")
        if self.table is not None:
            rows = self.table.index_select(Tensor.from_numpy(flat, dt.i64, self.device), 0)
        else:
            row_bytes = self.qtable.dtype.row_bytes(self.qtable.shape[1])
            blocks = np.asarray(self.qtable.data).reshape(self.vocab_size, row_bytes)[flat]
            rows = Tensor.from_numpy(QTensor(self.qtable.dtype, (flat.size, self.qtable.shape[1]),
                                             blocks.reshape(-1)).dequantize(), dt.f32, self.device)
        return rows.reshape(ids.dims() + (rows.dims()[-1],))


class RotaryEmbedding:
    """cos/sin tables [positions, head_dim/2], grown by doubling as positions advance."""

    def __init__(self, cfg: LlamaConfig, device):
        self.cfg, self.device = cfg, device
        self.apply = rope_i if cfg.rope_interleaved else rope
        self.positions = 0
        self.cos = self.sin = None

    def tables(self, start: int, length: int):
        """(cos, sin) for positions start .. start + length - 1, each [length, head_dim/2]."""
        needed = start + length
        if needed > self.positions:
            size = max(needed, 2 * self.positions, INITIAL_ROPE_POSITIONS)
            scaling = self.cfg.rope_scaling.apply if self.cfg.rope_scaling else None
            self.cos, self.sin = rope_frequencies(self.cfg.head_dim, size, self.cfg.rope_theta,
                                                  scaling, self.device)
            self.positions = size
        return self.cos.narrow(0, start, length), self.sin.narrow(0, start, length)


class Attention:
    def __init__(self, cfg: LlamaConfig, qkv: QMatMul, out: QMatMul, qkv_bias: Tensor = None):
        self.n_heads, self.n_kv, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.n_rep = cfg.n_rep
        self.scale = 1.0 / math.sqrt(cfg.head_dim)
        self.qkv, self.out, self.qkv_bias = qkv, out, qkv_bias  # bias [(h + 2kv) * hd] or None

    def __call__(self, x: Tensor, rotary: RotaryEmbedding, cos, sin, cache: KvCache,
                 mask) -> Tensor:
        b, t, _ = x.dims()
        h, kv, hd = self.n_heads, self.n_kv, self.head_dim
        qkv = self.qkv(x)  # [b, t, (h + 2kv) * hd]
        if self.qkv_bias is not None:
            qkv = qkv.broadcast_add(self.qkv_bias)
        heads = qkv.reshape(b, t, h + 2 * kv, hd).transpose(1, 2)  # [b, h+2kv, t, hd]
        qk = rotary.apply(heads.narrow(1, 0, h + kv), cos, sin)  # q and k heads in one call
        q = qk.narrow(1, 0, h)  # [b, h, t, hd]
        k = qk.narrow(1, h, kv)  # [b, kv, t, hd]
        v = heads.narrow(1, h + kv, kv)
        k, v = cache.append(k, v)  # [b, kv, T, hd], T = positions so far
        grouped = q.reshape(b, kv, self.n_rep * t, hd)  # query heads grouped per kv head
        y = ops.scaled_dot_product_attention(grouped, k, v, mask, self.scale)
        y = y.reshape(b, h, t, hd).transpose(1, 2).reshape(b, t, h * hd)
        return self.out(y)  # [b, t, d]


class Mlp:
    """SwiGLU: down(silu(gate(x)) * up(x)), gate and up fused into one matmul."""

    def __init__(self, gate_up: QMatMul, down: QMatMul):
        self.gate_up, self.down = gate_up, down
        self.hidden = gate_up.out_features // 2

    def __call__(self, x: Tensor) -> Tensor:
        gate_up = self.gate_up(x)  # [b, t, 2 * ffn]
        gate = gate_up.narrow(2, 0, self.hidden)
        up = gate_up.narrow(2, self.hidden, self.hidden)
        return self.down(ops.swiglu(gate, up))


class Block:
    def __init__(self, attn_norm: RmsNorm, attn: Attention, mlp_norm: RmsNorm, mlp: Mlp):
        self.attn_norm, self.attn = attn_norm, attn
        self.mlp_norm, self.mlp = mlp_norm, mlp

    def __call__(self, x, rotary, cos, sin, cache, mask) -> Tensor:
        x = x.add(self.attn(self.attn_norm(x), rotary, cos, sin, cache, mask))
        return x.add(self.mlp(self.mlp_norm(x)))


class Llama:
    """A loaded model with its KV cache. `forward(ids, index_pos)` runs new tokens and
    returns logits; `clear_kv_cache` starts a new sequence."""

    def __init__(self, cfg: LlamaConfig, embed: TokenEmbedding, blocks: list, norm: RmsNorm,
                 lm_head: QMatMul, device=None, chat_template: str = None):
        self.config = cfg
        self.embed, self.blocks, self.norm, self.lm_head = embed, blocks, norm, lm_head
        self.device = Device.parse(device)
        self.rotary = RotaryEmbedding(cfg, self.device)
        self.chat_template = chat_template
        self.clear_kv_cache()

    def clear_kv_cache(self, capacity: int = None) -> None:
        """Forget the sequence; preallocate `capacity` positions (the cache doubles beyond)."""
        capacity = capacity or DEFAULT_CACHE_CAPACITY
        self.caches = [KvCache(dim=2, initial_capacity=capacity) for _ in self.blocks]

    @property
    def seq_len(self) -> int:
        return self.caches[0].length

    def forward(self, ids, index_pos: int = None, all_logits: bool = False) -> Tensor:
        """ids [b, t] (new tokens; a list, numpy array or integer Tensor) at positions
        index_pos .. index_pos + t - 1 -> f32 logits [b, vocab] of the last position, or
        [b, t, vocab] with all_logits."""
        ids = token_ids(ids, self.device, "llama forward")
        b, t = ids.dims()
        if index_pos is None:
            index_pos = self.seq_len
        if index_pos != self.seq_len:
            raise ShapeMismatch(f"llama forward: index_pos {index_pos} but the KV cache holds "
                                f"{self.seq_len} positions (call clear_kv_cache to restart)")
        x = self.embed(ids)  # [b, t, d]
        cos, sin = self.rotary.tables(index_pos, t)
        mask = self._mask(t, index_pos)
        for block, cache in zip(self.blocks, self.caches):
            x = block(x, self.rotary, cos, sin, cache, mask)
        if not all_logits:
            x = x.narrow(1, t - 1, 1)  # only the last position's logits are needed
        logits = self.lm_head(self.norm(x))  # [b, t', vocab]
        return logits if all_logits else logits.squeeze(1)

    __call__ = forward

    def part_weights(self) -> parts.LlamaDecoderWeights:
        """The weights the accelerated part `llama.decoder_step` takes (the same objects)."""
        cfg = self.config
        layers = tuple(parts.LlamaLayerWeights(
            attn_norm=block.attn_norm.weight, mlp_norm=block.mlp_norm.weight,
            eps=block.attn_norm.eps, qkv=block.attn.qkv, out=block.attn.out,
            gate_up=block.mlp.gate_up, down=block.mlp.down, qkv_bias=block.attn.qkv_bias)
            for block in self.blocks)
        return parts.LlamaDecoderWeights(
            num_heads=cfg.num_heads, num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
            rope_interleaved=cfg.rope_interleaved, layers=layers, norm=self.norm.weight,
            norm_eps=self.norm.eps, lm_head=self.lm_head)

    def _mask(self, t: int, index_pos: int):
        """Causal additive mask [n_rep * t, index_pos + t] for the grouped queries; none
        for a single new token (it may see every cached position)."""
        if t == 1:
            return None
        mask = ops.causal_mask(t, index_pos).to_numpy()
        return Tensor.from_numpy(np.tile(mask, (self.config.n_rep, 1)), dt.f32, self.device)

    # -- loading ------------------------------------------------------------------------
    @staticmethod
    def load(weights, config=None, device=None, mode: str = "auto",
             chat_template: str = None) -> "Llama":
        """weights: a weights source (io/weights.py) or what `open_weights` takes (a .gguf,
        safetensors path(s) or bytes, a dict of arrays or QTensors); config: a LlamaConfig or
        HF config.json (path, bytes or parsed), or None for a GGUF (config, and chat template,
        from its metadata). `mode` chooses how quantized matmuls run (quantized/qmatmul.py): by
        default the numpy backend dequantizes at load. Weights of any float dtype compute in
        f32; every tensor is checked against the shape the config implies, so a file whose
        tensors disagree with its own metadata fails here, naming the tensor."""
        if config is not None and not isinstance(config, LlamaConfig):
            source = (f"llama config.json {config}" if isinstance(config, (str, Path))
                      else "llama config.json")
            config = LlamaConfig.from_hf_config(read_json_config(config, "llama config.json"),
                                                source)
        weights = open_weights(weights)
        gguf = weights.gguf if isinstance(weights, GgufWeights) else None
        if config is None:
            if gguf is None:
                raise FormatError(f"{weights.label}: pass the model's config.json (only a GGUF "
                                  f"carries its own config)")
            config = LlamaConfig.from_gguf(gguf)
        if chat_template is None and gguf is not None:
            chat_template = gguf.metadata.get("tokenizer.chat_template")
        names = weight_names(config.family)
        naming = names.naming_of(weights)
        if naming is None:
            raise FormatError(f"{weights.label}: no token embedding (model.embed_tokens.weight "
                              f"or token_embd.weight); not a LLaMA-family model")
        device = Device.parse(device)
        vb = VarBuilder(names.view(weights, naming), dt.f32, device, mode=mode)
        return _build(config, vb, device, chat_template)

    @staticmethod
    def from_pretrained(path, device=None, mode: str = "auto") -> "Llama":
        """From what io/checkpoint.py opens (a .gguf file; a folder holding one .gguf, or HF
        config.json + *.safetensors; a registry name; a Hub "org/name@revision"; received
        bytes; a Checkpoint). A GGUF carries its config and chat template; an HF checkpoint's
        come from config.json (+ the end tokens of generation_config.json) and
        chat_template.jinja or tokenizer_config.json."""
        checkpoint = open_checkpoint(path, kind="llama")
        if checkpoint.format == "gguf":
            return Llama.load(checkpoint.weights, None, device, mode)
        if checkpoint.config is None:
            raise ModelNotFound(f"{checkpoint.label}: {checkpoint.format} weights but no "
                                f"config.json")
        cfg = _with_generation_eos(
            LlamaConfig.from_hf_config(checkpoint.config, checkpoint.config_label), checkpoint)
        chat_template = checkpoint.chat_template  # read (and checked) before the weights
        return Llama.load(checkpoint.weights, cfg, device, mode, chat_template)


def _build(cfg: LlamaConfig, vb: VarBuilder, device, chat_template) -> Llama:
    """The modules from the weights, by the model's names (LLAMA_WEIGHT_NAMES)."""
    d, hd, ffn = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    q_rows, kv_rows = cfg.num_heads * hd, cfg.num_kv_heads * hd

    def norm(v, name):
        return RmsNorm(v.get((d,), name), cfg.rms_norm_eps)

    blocks = []
    for i in range(cfg.num_layers):
        v = vb.pp(f"blocks.{i}")
        qkv_bias = None
        if cfg.qkv_bias:
            qkv_bias = Tensor.cat([v.get((q_rows,), "attn.q.bias"), v.get((kv_rows,), "attn.k.bias"),
                                   v.get((kv_rows,), "attn.v.bias")], 0)
        attn = Attention(cfg, v.fused_matrix([((q_rows, d), "attn.q.weight"),
                                              ((kv_rows, d), "attn.k.weight"),
                                              ((kv_rows, d), "attn.v.weight")]),
                         v.matrix((d, q_rows), "attn.out.weight"), qkv_bias)
        mlp = Mlp(v.fused_matrix([((ffn, d), "mlp.gate.weight"), ((ffn, d), "mlp.up.weight")]),
                  v.matrix((d, ffn), "mlp.down.weight"))
        blocks.append(Block(norm(v, "attn_norm.weight"), attn, norm(v, "mlp_norm.weight"), mlp))
    tied = cfg.tie_word_embeddings or not vb.has("lm_head.weight")
    embedding_shape = (cfg.vocab_size, d)
    lm_head = vb.matrix(embedding_shape, "embed.table" if tied else "lm_head.weight")
    if tied and not lm_head.is_quantized:
        embed = TokenEmbedding(table=lm_head.weight)  # one f32 table serves both
    else:
        # Only rows are looked up: GGML blocks stay packed, each row decoded when read.
        table = vb.pp("embed").set_mode("quantized").matrix(embedding_shape, "table")
        embed = (TokenEmbedding(qtable=table.qweights[0], device=device) if table.is_quantized
                 else TokenEmbedding(table=table.weight))
    return Llama(cfg, embed, blocks, norm(vb, "norm.weight"), lm_head, device, chat_template)


def _with_generation_eos(cfg: LlamaConfig, checkpoint) -> LlamaConfig:
    """Add the end tokens of generation_config.json (Llama 3 lists several there)."""
    generation = checkpoint.generation_config
    if generation is None:
        return cfg
    fields = ConfigFields(generation,
                          f"generation_config.json {checkpoint.where('generation_config.json')}")
    extra = fields.token_ids("eos_token_id", cfg.vocab_size)
    merged = tuple(dict.fromkeys(cfg.eos_token_ids + extra))
    return dataclasses.replace(cfg, eos_token_ids=merged)


# -- weight names ---------------------------------------------------------------------------
# The model's names (its modules' attribute paths; the pieces of the stacked qkv and gate_up
# matrices by their own names) -> HF `LlamaForCausalLM` and llama.cpp's GGUF names.
LLAMA_WEIGHT_NAMES = WeightNames(("hf", "gguf"), {
    "embed.table": ("model.embed_tokens.weight", "token_embd.weight"),
    "blocks.{i}.attn_norm.weight": ("model.layers.{i}.input_layernorm.weight",
                                    "blk.{i}.attn_norm.weight"),
    "blocks.{i}.attn.q.weight": ("model.layers.{i}.self_attn.q_proj.weight",
                                 "blk.{i}.attn_q.weight"),
    "blocks.{i}.attn.k.weight": ("model.layers.{i}.self_attn.k_proj.weight",
                                 "blk.{i}.attn_k.weight"),
    "blocks.{i}.attn.v.weight": ("model.layers.{i}.self_attn.v_proj.weight",
                                 "blk.{i}.attn_v.weight"),
    "blocks.{i}.attn.q.bias": ("model.layers.{i}.self_attn.q_proj.bias", "blk.{i}.attn_q.bias"),
    "blocks.{i}.attn.k.bias": ("model.layers.{i}.self_attn.k_proj.bias", "blk.{i}.attn_k.bias"),
    "blocks.{i}.attn.v.bias": ("model.layers.{i}.self_attn.v_proj.bias", "blk.{i}.attn_v.bias"),
    "blocks.{i}.attn.out.weight": ("model.layers.{i}.self_attn.o_proj.weight",
                                   "blk.{i}.attn_output.weight"),
    "blocks.{i}.mlp_norm.weight": ("model.layers.{i}.post_attention_layernorm.weight",
                                   "blk.{i}.ffn_norm.weight"),
    "blocks.{i}.mlp.gate.weight": ("model.layers.{i}.mlp.gate_proj.weight",
                                   "blk.{i}.ffn_gate.weight"),
    "blocks.{i}.mlp.up.weight": ("model.layers.{i}.mlp.up_proj.weight", "blk.{i}.ffn_up.weight"),
    "blocks.{i}.mlp.down.weight": ("model.layers.{i}.mlp.down_proj.weight",
                                   "blk.{i}.ffn_down.weight"),
    "norm.weight": ("model.norm.weight", "output_norm.weight"),
    "lm_head.weight": ("lm_head.weight", "output.weight"),
}, marker="embed.table")


# Each family's table (by HF model_type or GGUF architecture).
FAMILY_WEIGHT_NAMES = {"llama": LLAMA_WEIGHT_NAMES, "qwen2": LLAMA_WEIGHT_NAMES}


def weight_names(family: str) -> WeightNames:
    """The weight-name table of a family (an HF model_type or a GGUF architecture)."""
    if family not in FAMILY_WEIGHT_NAMES:
        raise UnsupportedError(f"llama: no weight names for family {family!r}; supported: "
                               f"{tuple(FAMILY_WEIGHT_NAMES)}")
    return FAMILY_WEIGHT_NAMES[family]
