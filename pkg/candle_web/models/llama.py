"""The decoder-only transformer of the LLM families, read top to bottom: LLaMA (Touvron et al.
2023), Mistral, Qwen2/2.5, Qwen3, Phi-3, Gemma 2 and Gemma 3 are one model whose differences
are fields of `LlamaConfig` (llama_config.py: read from config.json or GGUF metadata; this
is the family file; the names Llama/LlamaConfig stay).

    ids [b, t] -> embed -> x [b, t, d]  (times embedding_scale: sqrt(d) for Gemma)
      -> n_layers x Block:
           a = attn(rms_norm(x))     fused QKV (+ qkv_bias), per-head q/k RMS norm (qk_norm),
                                     RoPE on q/k (the layer's own base for Gemma 3's local
                                     layers), KV cache, grouped-query attention, scores scaled
                                     by 1/sqrt(query_pre_attn_scalar or head_dim), soft-capped
                                     (attn_logit_softcap), a sliding window on some layers
           x = x + post_norm(a)      (post_norms: Gemma's norm of the attention output)
           m = mlp(rms_norm(x))      fused gate|up, act(gate) * up (silu; Gemma: GELU-tanh), down
           x = x + post_norm(m)
      -> rms_norm -> logits = x @ W_out^T   [b, vocab] (last position) or [b, t, vocab]
         (soft-capped: final_logit_softcap)
    W_out is the embedding table when the checkpoint has no separate output weight (tied).

Which family does what (each a config field, read from config.json or the GGUF's `<arch>.*`
metadata and tensor list):
    qwen2    qkv_bias
    mistral  sliding_window on every layer (GGUF: the llama architecture)
    qwen3    qk_norm, head_dim not d / heads
    phi3     Q/K/V and gate/up stored fused (names only), longrope RoPE scaling
    gemma2   embedding_scale, norm_weight_offset 1 (HF stores w, the norm multiplies by 1 + w;
             llama.cpp's converter stores 1 + w), post_norms, GELU-tanh, query_pre_attn_scalar,
             attention and final soft-capping, sliding window on every other layer
    gemma3   as gemma2 without soft-capping, plus qk_norm; 5 of every 6 layers slide, with
             their own RoPE base (rope_local_theta)

Weights load from HF safetensors (float) and GGUF (quantized) onto the same modules, through
the name tables of llama_config.py (`weight_names(family)`); Q/K/V are stacked into one
matrix and so are gate/up (one matmul each per step). llama3 rope scaling: `rope_scaling` in
config.json, or a `rope_freqs.weight` tensor in GGUF (read with the config).

RoPE layouts: llama.cpp's converter permutes the rows of Q and K inside each head for the llama
architecture only, so that the rotated pairs are adjacent (the original Meta layout); those
GGUF weights use interleaved RoPE (`rope_i`). HF checkpoints, and the other GGUF architectures,
rotate the two halves of each head (`rope`). Weights are never shuffled at load;
`LlamaConfig.rope_interleaved` records which layout the checkpoint uses.

Sliding window: a query at position p sees positions p - window + 1 .. p (transformers' and
llama.cpp's rule). A prompt pass masks the rest; a single-token step reads only the last
`window` cached positions.

This file is the reference computation only. Decoding chooses, in backend/parts.py
(`start_causal_decoding`), whether single-token steps go to a backend's fused part
`llama.decoder_step` (fed with `part_weights()`, writing the same KV caches as the tensor path;
the same result up to f32 summation order) or to `forward` below. An implementation that does
not implement a family field the weights use returns None, and `forward` runs.

Grouped-query attention without repeating K/V: the h query heads are grouped as
[n_kv, n_rep], so q [b, h, t, hd] is viewed as [b, n_kv, n_rep * t, hd] and attends to the
n_kv cached heads directly; the causal mask is tiled n_rep times along its rows.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from ..core import dtype as dt
from ..backend import parts
from ..core.device import Device
from ..core.errors import FormatError, IndexOutOfRange, ModelNotFound, ShapeMismatch
from ..io.checkpoint import open_checkpoint
from ..io.weights import GgufWeights, open_weights
from ..nn import ops
from ..nn.kv_cache import KvCache
from ..nn.layers import Activation, RmsNorm
from ..nn.rotary import rope, rope_frequencies, rope_i
from ..nn.var_builder import VarBuilder
from ..quantized.qmatmul import QMatMul
from ..quantized.qtensor import QTensor
from ..core.tensor import Tensor
from .config_fields import read_json_config
from .inputs import token_ids
# The configuration and weight names live in llama_config.py; importers name them here too.
from .llama_config import (FAMILY_WEIGHT_NAMES, LLAMA_WEIGHT_NAMES, LlamaConfig,  # noqa: F401
                           RopeScaling, _with_generation_eos, weight_names)

# KV cache positions allocated up front when the caller does not say how long the sequence
# will be; the cache doubles when full.
DEFAULT_CACHE_CAPACITY = 256
# Rotary tables are computed for this many positions first and doubled on demand, so a
# 128k-context model does not build 128k rows for a short chat.
INITIAL_ROPE_POSITIONS = 2048


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
    """cos/sin tables [positions, head_dim/2] for one RoPE base (and scaling), grown by
    doubling as positions advance."""

    def __init__(self, cfg: LlamaConfig, device, theta: float = None, scaling="config"):
        self.head_dim, self.device = cfg.head_dim, device
        self.theta = cfg.rope_theta if theta is None else theta
        self.scaling = cfg.rope_scaling if scaling == "config" else scaling
        self.apply = rope_i if cfg.rope_interleaved else rope
        self.positions = 0
        self.long = False  # built with longrope's long factors
        self.cos = self.sin = None

    def tables(self, start: int, length: int):
        """(cos, sin) for positions start .. start + length - 1, each [length, head_dim/2]."""
        needed = start + length
        long = bool(self.scaling and self.scaling.uses_long_factors(needed))
        if needed > self.positions or long != self.long:
            size = max(needed, 2 * self.positions, INITIAL_ROPE_POSITIONS)
            scaling = None
            if self.scaling:
                scaling = lambda inv_freq: self.scaling.apply(inv_freq, long)  # noqa: E731
            self.cos, self.sin = rope_frequencies(self.head_dim, size, self.theta, scaling,
                                                  self.device)
            if self.scaling and self.scaling.attention_factor != 1.0:
                factor = self.scaling.attention_factor
                self.cos, self.sin = self.cos.affine(factor, 0.0), self.sin.affine(factor, 0.0)
            self.positions, self.long = size, long
        return self.cos.narrow(0, start, length), self.sin.narrow(0, start, length)


def softcap(x: Tensor, cap: float) -> Tensor:
    """cap * tanh(x / cap): Gemma 2's soft-capping of scores and logits."""
    return x.affine(1.0 / cap, 0.0).tanh().affine(cap, 0.0)


class Attention:
    def __init__(self, cfg: LlamaConfig, qkv: QMatMul, out: QMatMul, rotary: RotaryEmbedding,
                 window: int = None, qkv_bias: Tensor = None, q_norm: RmsNorm = None,
                 k_norm: RmsNorm = None):
        self.n_heads, self.n_kv, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.n_rep = cfg.n_rep
        self.scale = cfg.attention_scale
        self.softcap = cfg.attn_logit_softcap
        self.qkv, self.out, self.qkv_bias = qkv, out, qkv_bias  # bias [(h + 2kv) * hd] or None
        self.q_norm, self.k_norm = q_norm, k_norm  # over each head's hd values, or None
        self.rotary, self.window = rotary, window

    def __call__(self, x: Tensor, cos, sin, cache: KvCache, mask) -> Tensor:
        return self.out(self.attend(self.project_qkv(x), cos, sin, cache, mask))  # [b, t, d]

    def project_qkv(self, x: Tensor) -> Tensor:
        qkv = self.qkv(x)  # [b, t, (h + 2kv) * hd]
        if self.qkv_bias is not None:
            qkv = qkv.broadcast_add(self.qkv_bias)
        return qkv

    def attend(self, qkv: Tensor, cos, sin, cache: KvCache, mask) -> Tensor:
        """Projected qkv [b, t, (h + 2kv) * hd] -> the heads' output [b, t, h * hd] before the
        output projection; the new keys and values are appended to `cache`."""
        b, t, _ = qkv.dims()
        h, kv, hd = self.n_heads, self.n_kv, self.head_dim
        heads = qkv.reshape(b, t, h + 2 * kv, hd).transpose(1, 2)  # [b, h+2kv, t, hd]
        qk = heads.narrow(1, 0, h + kv)
        if self.q_norm is not None:
            qk = Tensor.cat([self.q_norm(qk.narrow(1, 0, h)), self.k_norm(qk.narrow(1, h, kv))], 1)
        qk = self.rotary.apply(qk, cos, sin)  # q and k heads in one call
        q = qk.narrow(1, 0, h)  # [b, h, t, hd]
        k = qk.narrow(1, h, kv)  # [b, kv, t, hd]
        v = heads.narrow(1, h + kv, kv)
        k, v = cache.append(k, v)  # [b, kv, T, hd], T = positions so far
        if t == 1 and self.window is not None and k.dims()[2] > self.window:
            k, v = (c.narrow(2, c.dims()[2] - self.window, self.window) for c in (k, v))
        grouped = q.reshape(b, kv, self.n_rep * t, hd)  # query heads grouped per kv head
        if self.softcap is None:
            y = ops.scaled_dot_product_attention(grouped, k, v, mask, self.scale)
        else:
            scores = softcap(grouped.matmul(k.t()).affine(self.scale, 0.0), self.softcap)
            if mask is not None:
                scores = scores.broadcast_add(mask)  # [b, kv, n_rep * t, T]
            y = ops.softmax_last_dim(scores).matmul(v)
        return y.reshape(b, h, t, hd).transpose(1, 2).reshape(b, t, h * hd)


class Mlp:
    """Gated: down(act(gate(x)) * up(x)), gate and up fused into one matmul (SwiGLU when the
    activation is silu)."""

    def __init__(self, gate_up: QMatMul, down: QMatMul, hidden_act: str = "silu"):
        self.gate_up, self.down = gate_up, down
        self.hidden = gate_up.out_features // 2
        self.act = None if hidden_act == "silu" else Activation(hidden_act)

    def __call__(self, x: Tensor) -> Tensor:
        gate_up = self.gate_up(x)  # [b, t, 2 * ffn]
        gate = gate_up.narrow(2, 0, self.hidden)
        up = gate_up.narrow(2, self.hidden, self.hidden)
        if self.act is None:
            return self.down(ops.swiglu(gate, up))
        return self.down(self.act(gate).mul(up))


class Block:
    def __init__(self, attn_norm: RmsNorm, attn: Attention, mlp_norm: RmsNorm, mlp: Mlp,
                 attn_post_norm: RmsNorm = None, mlp_post_norm: RmsNorm = None):
        self.attn_norm, self.attn = attn_norm, attn
        self.mlp_norm, self.mlp = mlp_norm, mlp
        self.attn_post_norm, self.mlp_post_norm = attn_post_norm, mlp_post_norm  # or None

    def __call__(self, x, cos, sin, cache, mask) -> Tensor:
        return self.after_attention(x, self.attn(self.attn_norm(x), cos, sin, cache, mask))

    def after_attention(self, x: Tensor, a: Tensor) -> Tensor:
        """The rest of the block from the attention's output `a` (projected): residual, MLP."""
        if self.attn_post_norm is not None:
            a = self.attn_post_norm(a)
        x = x.add(a)
        m = self.mlp(self.mlp_norm(x))
        if self.mlp_post_norm is not None:
            m = self.mlp_post_norm(m)
        return x.add(m)


class Llama:
    """A loaded model with its KV cache. `forward(ids, index_pos)` runs new tokens and
    returns logits; `clear_kv_cache` starts a new sequence. `rotary` holds the (global) RoPE
    tables; a layer with its own base (Gemma 3's local layers) holds another in its Attention."""

    def __init__(self, cfg: LlamaConfig, embed: TokenEmbedding, blocks: list, norm: RmsNorm,
                 lm_head: QMatMul, device=None, chat_template: str = None,
                 rotary: RotaryEmbedding = None):
        self.config = cfg
        self.embed, self.blocks, self.norm, self.lm_head = embed, blocks, norm, lm_head
        self.device = Device.parse(device)
        self.rotary = rotary or RotaryEmbedding(cfg, self.device)
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
        cfg = self.config
        x = self.embed(ids)  # [b, t, d]
        if cfg.embedding_scale != 1.0:
            x = x.affine(cfg.embedding_scale, 0.0)
        tables, masks = {}, {}  # per rotary object and per window, computed once
        for block, cache in zip(self.blocks, self.caches):
            attn = block.attn
            if id(attn.rotary) not in tables:
                tables[id(attn.rotary)] = attn.rotary.tables(index_pos, t)
            if attn.window not in masks:
                masks[attn.window] = self._mask(t, index_pos, attn.window)
            x = block(x, *tables[id(attn.rotary)], cache, masks[attn.window])
        if not all_logits:
            x = x.narrow(1, t - 1, 1)  # only the last position's logits are needed
        logits = self.lm_head(self.norm(x))  # [b, t', vocab]
        if cfg.final_logit_softcap is not None:
            logits = softcap(logits, cfg.final_logit_softcap)
        return logits if all_logits else logits.squeeze(1)

    __call__ = forward

    def forward_rows(self, ids, row_caches: list) -> Tensor:
        """One new token for each of B sequences, row r at its own position (the length of its
        caches) with its own caches row_caches[r] (an nn.KvCache per block, as `caches`) ->
        f32 logits [B, vocab]. The projections run once for all rows (each weight read once);
        RoPE, the cache append and attention per row. The reference of the batched decode step
        (backend/batched_steps.py start_batched_causal_decoding): row r equals `forward([[ids[r]]])` on
        its caches up to the summation order of the batched products -- not bit for bit (a
        BLAS product of B rows may round a row differently from one of a single row)."""
        ids = token_ids(np.asarray(ids).reshape(-1, 1), self.device, "llama forward_rows")
        rows = ids.dims()[0]
        if len(row_caches) != rows or any(len(c) != len(self.blocks) for c in row_caches):
            raise ShapeMismatch(f"llama forward_rows: {rows} ids need {rows} rows of "
                                f"{len(self.blocks)} caches, got {len(row_caches)} rows")
        cfg = self.config
        x = self.embed(ids)  # [B, 1, d]
        if cfg.embedding_scale != 1.0:
            x = x.affine(cfg.embedding_scale, 0.0)
        for index, block in enumerate(self.blocks):
            attn = block.attn
            qkv = attn.project_qkv(block.attn_norm(x))  # [B, 1, n]
            heads = []
            for row, caches in enumerate(row_caches):
                cos, sin = attn.rotary.tables(caches[index].length, 1)
                heads.append(attn.attend(qkv.narrow(0, row, 1), cos, sin, caches[index], None))
            x = block.after_attention(x, attn.out(Tensor.cat(heads, 0)))
        logits = self.lm_head(self.norm(x))  # [B, 1, vocab]
        if cfg.final_logit_softcap is not None:
            logits = softcap(logits, cfg.final_logit_softcap)
        return logits.squeeze(1)

    def part_weights(self) -> parts.LlamaDecoderWeights:
        """The weights the accelerated part `llama.decoder_step` takes (the same objects)."""
        cfg = self.config

        def weight(norm):
            return None if norm is None else norm.weight

        layers = tuple(parts.LlamaLayerWeights(
            attn_norm=block.attn_norm.weight, mlp_norm=block.mlp_norm.weight,
            eps=block.attn_norm.eps, qkv=block.attn.qkv, out=block.attn.out,
            gate_up=block.mlp.gate_up, down=block.mlp.down, qkv_bias=block.attn.qkv_bias,
            q_norm=weight(block.attn.q_norm), k_norm=weight(block.attn.k_norm),
            attn_post_norm=weight(block.attn_post_norm),
            mlp_post_norm=weight(block.mlp_post_norm), window=block.attn.window,
            rope=None if block.attn.rotary is self.rotary else block.attn.rotary)
            for block in self.blocks)
        scale = cfg.attention_scale
        return parts.LlamaDecoderWeights(
            num_heads=cfg.num_heads, num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
            rope_interleaved=cfg.rope_interleaved, layers=layers, norm=self.norm.weight,
            norm_eps=self.norm.eps, lm_head=self.lm_head,
            activation="silu" if cfg.hidden_act == "silu" else "gelu_tanh",
            embedding_scale=cfg.embedding_scale,
            attn_scale=None if scale == 1.0 / math.sqrt(cfg.head_dim) else scale,
            attn_softcap=cfg.attn_logit_softcap, final_softcap=cfg.final_logit_softcap)

    def _mask(self, t: int, index_pos: int, window: int = None):
        """Additive mask [n_rep * t, index_pos + t] for the grouped queries: causal, and
        within `window` positions when given; none for a single new token (it may see every
        cached position; a windowed layer reads only the last `window` ones)."""
        if t == 1:
            return None
        mask = ops.causal_mask(t, index_pos).to_numpy()
        if window is not None:
            rows = np.arange(t)[:, None] + index_pos
            cols = np.arange(index_pos + t)[None, :]
            mask = np.where(cols <= rows - window, np.float32(-np.inf), mask)
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
    """The modules from the weights, by the model's names (the family's table)."""
    d, hd, ffn = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    q_rows, kv_rows = cfg.num_heads * hd, cfg.num_kv_heads * hd

    def norm(v, name, size=d):
        weight = v.get((size,), name)
        if cfg.norm_weight_offset:
            weight = weight.affine(1.0, cfg.norm_weight_offset)  # HF Gemma: 1 + w, in f32
        return RmsNorm(weight, cfg.rms_norm_eps)

    rotary = RotaryEmbedding(cfg, device)
    local = RotaryEmbedding(cfg, device, cfg.rope_local_theta, scaling=None) \
        if cfg.rope_local_theta is not None else None
    blocks = []
    for i in range(cfg.num_layers):
        v = vb.pp(f"blocks.{i}")
        if v.contains("attn.qkv.weight"):  # stored fused (phi3)
            qkv = v.matrix((q_rows + 2 * kv_rows, d), "attn.qkv.weight")
        else:
            qkv = v.fused_matrix([((q_rows, d), "attn.q.weight"), ((kv_rows, d), "attn.k.weight"),
                                  ((kv_rows, d), "attn.v.weight")])
        qkv_bias = q_norm = k_norm = None
        if cfg.qkv_bias:
            qkv_bias = Tensor.cat([v.get((q_rows,), "attn.q.bias"), v.get((kv_rows,), "attn.k.bias"),
                                   v.get((kv_rows,), "attn.v.bias")], 0)
        if cfg.qk_norm:
            q_norm, k_norm = norm(v, "attn.q_norm.weight", hd), norm(v, "attn.k_norm.weight", hd)
        attn = Attention(cfg, qkv, v.matrix((d, q_rows), "attn.out.weight"),
                         local if cfg.local_rope(i) else rotary, cfg.window(i), qkv_bias,
                         q_norm, k_norm)
        if v.contains("mlp.gate_up.weight"):  # stored fused (phi3)
            gate_up = v.matrix((2 * ffn, d), "mlp.gate_up.weight")
        else:
            gate_up = v.fused_matrix([((ffn, d), "mlp.gate.weight"), ((ffn, d), "mlp.up.weight")])
        mlp = Mlp(gate_up, v.matrix((d, ffn), "mlp.down.weight"), cfg.hidden_act)
        post = (norm(v, "attn_post_norm.weight"), norm(v, "mlp_post_norm.weight")) \
            if cfg.post_norms else (None, None)
        blocks.append(Block(norm(v, "attn_norm.weight"), attn, norm(v, "mlp_norm.weight"), mlp,
                            *post))
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
    return Llama(cfg, embed, blocks, norm(vb, "norm.weight"), lm_head, device, chat_template,
                 rotary)
