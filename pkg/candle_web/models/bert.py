"""BERT (Devlin et al. 2019) for sentence embeddings (sentence-transformers style), top to bottom.

    ids, token types [b, t] -> embeddings: word + position + token type, LayerNorm
      -> n x post-norm layer: x = LN(x + attn(x)); x = LN(x + W2 gelu(W1 x))
      -> hidden states [b, t, d]
      -> mean over the real tokens (attention mask) -> L2-normalised vector [b, d]

all-MiniLM-L6-v2 (the registry's "all-minilm-l6-v2") is exactly this: 6 layers, 384 dims,
mean pooling, normalised. Sentences in, vectors out (tokenizing, batching, truncation) is
pipelines/embed.py.

Weights: HF `BertModel` names through the table BERT_WEIGHT_NAMES at the end of this file (a
`bert.` prefix, as in BertForMaskedLM checkpoints, is accepted); query/key/value are stacked
into one matrix at load. The pooler (pooler.dense, tanh of the first token) is not used by
sentence embeddings.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..core import dtype as dt
from ..core.device import Device
from ..core.errors import FormatError, ShapeMismatch
from ..io.checkpoint import open_checkpoint
from ..io.weights import WeightNames, open_weights
from ..nn import ops
from ..nn.layers import Activation, LayerNorm, Linear
from ..nn.var_builder import VarBuilder
from ..core.tensor import Tensor
from .config_fields import ConfigFields, read_json_config
from .inputs import additive_padding_mask, token_ids

REQUIRED_CONFIG_FIELDS = ("vocab_size", "hidden_size", "num_hidden_layers",
                          "num_attention_heads", "intermediate_size", "max_position_embeddings")
# What a BertForMaskedLM (or BertForSequenceClassification...) checkpoint puts before the
# BertModel names.
TASK_MODEL_PREFIX = "bert."


@dataclass(frozen=True)
class BertConfig:
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    max_position_embeddings: int
    type_vocab_size: int = 2
    hidden_act: str = "gelu"
    layer_norm_eps: float = 1e-12
    pad_token_id: int = 0

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @staticmethod
    def from_hf_config(cfg: dict, source: str = "bert config.json") -> "BertConfig":
        """From an HF config.json object; `source` names the file in errors."""
        fields = ConfigFields(cfg, source)
        sizes = {name: fields.positive_int(name) for name in REQUIRED_CONFIG_FIELDS}
        fields.check_divides("num_attention_heads", sizes["num_attention_heads"], "hidden_size",
                             sizes["hidden_size"])
        position_type = fields.string("position_embedding_type", "absolute")
        if position_type != "absolute":
            raise FormatError(f"{source}: position_embedding_type {position_type!r} is "
                              f"not supported (only 'absolute')")
        hidden_act = fields.string("hidden_act", "gelu")
        Activation(hidden_act)  # an unknown name raises here, naming it
        return BertConfig(
            **sizes, type_vocab_size=fields.positive_int("type_vocab_size", 2),
            hidden_act=hidden_act,
            layer_norm_eps=fields.number("layer_norm_eps", 1e-12, positive=True),
            pad_token_id=fields.token_id("pad_token_id", sizes["vocab_size"], 0))


# -- modules in forward order ---------------------------------------------------------------
class BertEmbeddings:
    def __init__(self, word: Tensor, position: Tensor, token_type: Tensor, norm: LayerNorm):
        self.word, self.position, self.token_type, self.norm = word, position, token_type, norm

    def __call__(self, ids: Tensor, token_type_ids: Tensor) -> Tensor:
        t = ids.dims()[1]
        x = self.word.embedding(ids).add(self.token_type.embedding(token_type_ids))
        x = x.broadcast_add(self.position.narrow(0, 0, t))  # positions 0..t-1 for every row
        return self.norm(x)


class BertSelfAttention:
    """Scaled dot-product attention with a fused QKV projection and an output projection."""

    def __init__(self, qkv: Linear, out: Linear, num_heads: int):
        self.qkv, self.out, self.num_heads = qkv, out, num_heads

    def __call__(self, x: Tensor, mask: Tensor) -> Tensor:
        b, t, d = x.dims()
        head_dim = d // self.num_heads
        qkv = self.qkv(x).reshape(b, t, 3, self.num_heads, head_dim).permute(2, 0, 3, 1, 4)
        q, v = qkv.i(0).contiguous(), qkv.i(2).contiguous()  # [b, h, t, head_dim]
        # k as the transpose of a contiguous [b, h, head_dim, t]: the attention kernel's k^T is
        # then contiguous. numpy's batched matmul takes a slow non-BLAS loop on strided
        # operands (measured 40-700x slower on [8, 12, 128, 32]).
        k = qkv.i(1).transpose(2, 3).contiguous().transpose(2, 3)
        heads = ops.scaled_dot_product_attention(q, k, v, mask, scale=1.0 / math.sqrt(head_dim))
        return self.out(heads.transpose(1, 2).reshape(b, t, d))


class BertLayer:
    def __init__(self, attention: BertSelfAttention, attention_norm: LayerNorm, intermediate: Linear,
                 output: Linear, output_norm: LayerNorm, activation: str):
        self.attention, self.attention_norm = attention, attention_norm
        self.intermediate, self.output, self.output_norm = intermediate, output, output_norm
        self.act = Activation(activation)

    def __call__(self, x: Tensor, mask: Tensor) -> Tensor:
        x = self.attention_norm(x.add(self.attention(x, mask)))  # post-norm, unlike GPT/T5
        return self.output_norm(x.add(self.output(self.act(self.intermediate(x)))))


class BertModel:
    def __init__(self, config: BertConfig, embeddings: BertEmbeddings, layers: list, device=None):
        self.config = config
        self.embeddings = embeddings
        self.layers = layers
        self.device = Device.parse(device)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None) -> Tensor:
        """ids [b, t] (+ 1/0 mask, token types) -> last hidden states [b, t, d]."""
        ids = token_ids(input_ids, self.device, "bert input_ids")
        b, t = ids.dims()
        if t > self.config.max_position_embeddings:
            raise ShapeMismatch(f"bert: {t} tokens exceed the {self.config.max_position_embeddings} "
                                f"positions of the model (truncate the input)")
        types = (Tensor.zeros((b, t), dt.i64, self.device) if token_type_ids is None
                 else token_ids(token_type_ids, self.device, "bert token_type_ids"))
        if types.dims() != (b, t):
            raise ShapeMismatch(f"bert: token_type_ids {list(types.shape)} do not match the ids "
                                f"[{b}, {t}]")
        mask = additive_padding_mask(attention_mask, b, t, self.device, "bert")
        x = self.embeddings(ids, types)
        for layer in self.layers:
            x = layer(x, mask)
        return x

    __call__ = forward

    # -- loading ----------------------------------------------------------------------------
    @staticmethod
    def load(weights, config, device=None) -> "BertModel":
        """weights: a weights source (io/weights.py) or what `open_weights` takes (safetensors
        path(s) or bytes, a dict of arrays); config: a BertConfig or config.json (path, bytes
        or parsed). Every tensor is checked against the shape the config implies."""
        device = Device.parse(device)
        # First: a broken config.json is named before the weights load.
        config = _read_config(config)
        weights = open_weights(weights)
        names = BERT_WEIGHT_NAMES.view(weights, "hf")
        if not names.has("embeddings.word"):
            prefixed = BERT_WEIGHT_NAMES.view(weights, "hf", TASK_MODEL_PREFIX)
            names = prefixed if prefixed.has("embeddings.word") else names
        vb = VarBuilder(names, dt.f32, device)
        return _build(config, vb, device)

    @staticmethod
    def from_pretrained(folder, device=None) -> "BertModel":
        """From what io/checkpoint.py opens (a folder, a registry name, a Hub spec, received
        bytes, a Checkpoint): config.json with *.safetensors, or a PyTorch pytorch_model.bin
        (read without unpickling, io/pytorch.py) when there are no safetensors."""
        checkpoint = open_checkpoint(folder, kind="bert")
        # The config first: a broken config.json is named before the weights are opened.
        config = BertConfig.from_hf_config(checkpoint.required_config(), checkpoint.config_label)
        return BertModel.load(checkpoint.weights, config, device)


def _build(config: BertConfig, vb: VarBuilder, device) -> BertModel:
    """The modules from the weights, by the model's names (BERT_WEIGHT_NAMES)."""
    d, ffn, eps = config.hidden_size, config.intermediate_size, config.layer_norm_eps

    def linear(v, out_dim, in_dim):
        return Linear(v.get((out_dim, in_dim), "weight"), v.get((out_dim,), "bias"))

    def layer_norm(v):
        return LayerNorm(v.get((d,), "weight"), v.get((d,), "bias"), eps)

    emb = vb.pp("embeddings")
    embeddings = BertEmbeddings(
        emb.get((config.vocab_size, d), "word"),
        emb.get((config.max_position_embeddings, d), "position"),
        emb.get((config.type_vocab_size, d), "token_type"), layer_norm(emb.pp("norm")))
    layers = []
    for i in range(config.num_hidden_layers):
        v = vb.pp(f"layers.{i}")
        q, k, vv = (linear(v.pp(f"attention.{n}"), d, d) for n in ("q", "k", "v"))
        qkv = Linear(Tensor.cat([q.weight, k.weight, vv.weight], 0),
                     Tensor.cat([q.bias, k.bias, vv.bias], 0))
        attention = BertSelfAttention(qkv, linear(v.pp("attention.out"), d, d),
                                      config.num_attention_heads)
        layers.append(BertLayer(attention, layer_norm(v.pp("attention_norm")),
                                linear(v.pp("intermediate"), ffn, d),
                                linear(v.pp("output"), d, ffn), layer_norm(v.pp("output_norm")),
                                config.hidden_act))
    return BertModel(config, embeddings, layers, device)


def _read_config(config) -> BertConfig:
    """A BertConfig from a BertConfig, a parsed config.json, its bytes or its path."""
    if isinstance(config, BertConfig):
        return config
    source = f"bert config.json {config}" if isinstance(config, (str, Path)) else "bert config.json"
    return BertConfig.from_hf_config(read_json_config(config, "bert config.json"), source)


# -- pooling ------------------------------------------------------------------------------
def mean_pool(hidden: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
    """Mean of the hidden states of the real tokens: [b, t, d], [b, t] -> [b, d]."""
    mask = np.asarray(attention_mask, dtype=np.float32)[:, :, None]
    counts = np.maximum(mask.sum(axis=1), 1e-9)  # sentence-transformers' clamp
    return (hidden * mask).sum(axis=1) / counts


def l2_normalize(vectors: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(vectors, axis=-1, keepdims=True)
    return vectors / np.maximum(norms, 1e-12)  # torch.nn.functional.normalize's eps


# -- weight names ---------------------------------------------------------------------------
# The model's names (its modules' attribute paths; query/key/value, stacked at load, by their
# own names) -> HF `BertModel` names.
BERT_WEIGHT_NAMES = WeightNames(("hf",), {
    "embeddings.word": ("embeddings.word_embeddings.weight",),
    "embeddings.position": ("embeddings.position_embeddings.weight",),
    "embeddings.token_type": ("embeddings.token_type_embeddings.weight",),
    "embeddings.norm.weight": ("embeddings.LayerNorm.weight",),
    "embeddings.norm.bias": ("embeddings.LayerNorm.bias",),
    "layers.{i}.attention.q.weight": ("encoder.layer.{i}.attention.self.query.weight",),
    "layers.{i}.attention.q.bias": ("encoder.layer.{i}.attention.self.query.bias",),
    "layers.{i}.attention.k.weight": ("encoder.layer.{i}.attention.self.key.weight",),
    "layers.{i}.attention.k.bias": ("encoder.layer.{i}.attention.self.key.bias",),
    "layers.{i}.attention.v.weight": ("encoder.layer.{i}.attention.self.value.weight",),
    "layers.{i}.attention.v.bias": ("encoder.layer.{i}.attention.self.value.bias",),
    "layers.{i}.attention.out.weight": ("encoder.layer.{i}.attention.output.dense.weight",),
    "layers.{i}.attention.out.bias": ("encoder.layer.{i}.attention.output.dense.bias",),
    "layers.{i}.attention_norm.weight": ("encoder.layer.{i}.attention.output.LayerNorm.weight",),
    "layers.{i}.attention_norm.bias": ("encoder.layer.{i}.attention.output.LayerNorm.bias",),
    "layers.{i}.intermediate.weight": ("encoder.layer.{i}.intermediate.dense.weight",),
    "layers.{i}.intermediate.bias": ("encoder.layer.{i}.intermediate.dense.bias",),
    "layers.{i}.output.weight": ("encoder.layer.{i}.output.dense.weight",),
    "layers.{i}.output.bias": ("encoder.layer.{i}.output.dense.bias",),
    "layers.{i}.output_norm.weight": ("encoder.layer.{i}.output.LayerNorm.weight",),
    "layers.{i}.output_norm.bias": ("encoder.layer.{i}.output.LayerNorm.bias",),
}, marker="embeddings.word")

__all__ = ["BertConfig", "BertModel", "BERT_WEIGHT_NAMES", "mean_pool", "l2_normalize"]
