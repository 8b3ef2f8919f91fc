"""Minimal eager PyTorch Whisper and LLaMA, the peers of bench/gpu.py when `transformers` is not
importable. Written from the architectures' published math (the same math as candle-web's
models and transformers' classes), loading the same Hugging-Face-named weights:

  Whisper: conv1(k3) gelu, conv2(k3, stride 2) gelu, + positions, pre-LN blocks (self-attention,
  [cross-attention], GELU MLP), final LN; logits = LN(x) @ embed_tokens^T. k_proj has no bias.
  LLaMA: RMSNorm pre-norm blocks, RoPE rotating the two halves of each head (HF layout),
  grouped-query attention, SwiGLU MLP, tied or separate lm_head.

Attention is torch's scaled_dot_product_attention, as transformers' default "sdpa" path.
Not a workload script (the leading underscore keeps bench/run_all.py from running it).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

LAYER_NORM_EPS = 1e-5


def _tensors(state: dict, device) -> dict:
    return {name: torch.from_numpy(value).to(device) for name, value in state.items()}


# -- Whisper ------------------------------------------------------------------------------
class MinimalWhisper:
    """`encode(mel)` -> features; `start(features)` -> state; `step(tokens, state)` -> logits
    [b, t, vocab] for the new tokens, extending the per-layer self-attention KV cache."""

    def __init__(self, state: dict, config: dict, device):
        self.w = _tensors(state, device)
        self.n_audio_head = config["encoder_attention_heads"]
        self.n_text_head = config["decoder_attention_heads"]
        self.n_audio_layer = config["encoder_layers"]
        self.n_text_layer = config["decoder_layers"]

    def _ln(self, x, name):
        return F.layer_norm(x, x.shape[-1:], self.w[f"{name}.weight"], self.w[f"{name}.bias"],
                            LAYER_NORM_EPS)

    def _linear(self, x, name):
        return F.linear(x, self.w[f"{name}.weight"], self.w.get(f"{name}.bias"))

    @staticmethod
    def _heads(x, n_head):
        b, t, d = x.shape
        return x.view(b, t, n_head, d // n_head).transpose(1, 2)

    @staticmethod
    def _merge(x):
        b, h, t, dh = x.shape
        return x.transpose(1, 2).reshape(b, t, h * dh)

    def _mlp(self, x, p):
        return self._linear(F.gelu(self._linear(x, f"{p}.fc1")), f"{p}.fc2")

    def encode(self, mel):
        p = "model.encoder"
        x = F.gelu(F.conv1d(mel, self.w[f"{p}.conv1.weight"], self.w[f"{p}.conv1.bias"], padding=1))
        x = F.gelu(F.conv1d(x, self.w[f"{p}.conv2.weight"], self.w[f"{p}.conv2.bias"], padding=1,
                            stride=2))
        x = x.transpose(1, 2)
        x = x + self.w[f"{p}.embed_positions.weight"][: x.shape[1]]
        for i in range(self.n_audio_layer):
            lp = f"{p}.layers.{i}"
            h = self._ln(x, f"{lp}.self_attn_layer_norm")
            q, k, v = (self._heads(self._linear(h, f"{lp}.self_attn.{n}_proj"), self.n_audio_head)
                       for n in ("q", "k", "v"))
            x = x + self._linear(self._merge(F.scaled_dot_product_attention(q, k, v)),
                                 f"{lp}.self_attn.out_proj")
            x = x + self._mlp(self._ln(x, f"{lp}.final_layer_norm"), lp)
        return self._ln(x, f"{p}.layer_norm")

    def start(self, features):
        cross = []
        for i in range(self.n_text_layer):
            lp = f"model.decoder.layers.{i}.encoder_attn"
            cross.append((self._heads(self._linear(features, f"{lp}.k_proj"), self.n_text_head),
                          self._heads(self._linear(features, f"{lp}.v_proj"), self.n_text_head)))
        return {"cross": cross, "self": [None] * self.n_text_layer, "offset": 0}

    def step(self, tokens, state):
        p = "model.decoder"
        t = tokens.shape[1]
        offset = state["offset"]
        embed = self.w[f"{p}.embed_tokens.weight"]
        x = embed[tokens] + self.w[f"{p}.embed_positions.weight"][offset:offset + t]
        for i in range(self.n_text_layer):
            lp = f"{p}.layers.{i}"
            h = self._ln(x, f"{lp}.self_attn_layer_norm")
            q, k, v = (self._heads(self._linear(h, f"{lp}.self_attn.{n}_proj"), self.n_text_head)
                       for n in ("q", "k", "v"))
            if state["self"][i] is not None:
                past_k, past_v = state["self"][i]
                k, v = torch.cat([past_k, k], dim=2), torch.cat([past_v, v], dim=2)
            state["self"][i] = (k, v)
            # Causal within the new tokens; every cached position is visible.
            attn = F.scaled_dot_product_attention(q, k, v, attn_mask=_causal_mask(t, offset, x))
            x = x + self._linear(self._merge(attn), f"{lp}.self_attn.out_proj")
            h = self._ln(x, f"{lp}.encoder_attn_layer_norm")
            cq = self._heads(self._linear(h, f"{lp}.encoder_attn.q_proj"), self.n_text_head)
            ck, cv = state["cross"][i]
            x = x + self._linear(self._merge(F.scaled_dot_product_attention(cq, ck, cv)),
                                 f"{lp}.encoder_attn.out_proj")
            x = x + self._mlp(self._ln(x, f"{lp}.final_layer_norm"), lp)
        state["offset"] = offset + t
        return self._ln(x, f"{p}.layer_norm") @ embed.T


def _causal_mask(t: int, offset: int, like):
    """Boolean mask [t, offset + t] (True = may attend), None for a single new token."""
    if t == 1:
        return None
    rows = torch.arange(t, device=like.device)[:, None] + offset
    cols = torch.arange(offset + t, device=like.device)[None, :]
    return cols <= rows


# -- LLaMA --------------------------------------------------------------------------------
class MinimalLlama:
    """`forward(ids, cache, all_logits)` -> logits; `cache` is a list (one (k, v) per layer,
    None before the first call), extended in place."""

    def __init__(self, state: dict, config: dict, device):
        self.w = _tensors(state, device)
        self.n_layers = config["num_hidden_layers"]
        self.n_heads = config["num_attention_heads"]
        self.n_kv = config["num_key_value_heads"]
        self.head_dim = config.get("head_dim") or config["hidden_size"] // self.n_heads
        self.eps = config["rms_norm_eps"]
        self.lm_head = self.w.get("lm_head.weight", self.w["model.embed_tokens.weight"])
        inv_freq = 1.0 / (config["rope_theta"] ** (
            torch.arange(0, self.head_dim, 2, dtype=torch.float64) / self.head_dim))
        self.inv_freq = inv_freq.to(device)

    def new_cache(self):
        return [None] * self.n_layers

    def _rms(self, x, name):
        variance = x.pow(2).mean(-1, keepdim=True)
        return x * torch.rsqrt(variance + self.eps) * self.w[name]

    def _rope(self, x, cos, sin):
        half = x.shape[-1] // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * cos + rotated * sin

    def forward(self, ids, cache, all_logits: bool = False):
        b, t = ids.shape
        offset = 0 if cache[0] is None else cache[0][0].shape[2]
        positions = torch.arange(offset, offset + t, device=ids.device, dtype=torch.float64)
        angles = positions[:, None] * self.inv_freq[None, :]
        angles = torch.cat([angles, angles], dim=-1)
        cos, sin = angles.cos().float(), angles.sin().float()
        x = self.w["model.embed_tokens.weight"][ids]
        mask = _causal_mask(t, offset, x)
        hd = self.head_dim
        for i in range(self.n_layers):
            p = f"model.layers.{i}."
            h = self._rms(x, p + "input_layernorm.weight")
            q = F.linear(h, self.w[p + "self_attn.q_proj.weight"]).view(b, t, self.n_heads, hd)
            k = F.linear(h, self.w[p + "self_attn.k_proj.weight"]).view(b, t, self.n_kv, hd)
            v = F.linear(h, self.w[p + "self_attn.v_proj.weight"]).view(b, t, self.n_kv, hd)
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
            q, k = self._rope(q, cos, sin), self._rope(k, cos, sin)
            if cache[i] is not None:
                k = torch.cat([cache[i][0], k], dim=2)
                v = torch.cat([cache[i][1], v], dim=2)
            cache[i] = (k, v)
            # Each key/value head serves n_heads / n_kv query heads (grouped-query attention).
            rep = self.n_heads // self.n_kv
            attn = F.scaled_dot_product_attention(q, k.repeat_interleave(rep, dim=1),
                                                  v.repeat_interleave(rep, dim=1), attn_mask=mask)
            x = x + F.linear(attn.transpose(1, 2).reshape(b, t, self.n_heads * hd),
                             self.w[p + "self_attn.o_proj.weight"])
            h = self._rms(x, p + "post_attention_layernorm.weight")
            gate = F.linear(h, self.w[p + "mlp.gate_proj.weight"])
            up = F.linear(h, self.w[p + "mlp.up_proj.weight"])
            x = x + F.linear(F.silu(gate) * up, self.w[p + "mlp.down_proj.weight"])
        if not all_logits:
            x = x[:, -1:]
        return F.linear(self._rms(x, "model.norm.weight"), self.lm_head)
