"""BERT (Devlin et al. 2019) as a sentence embedder (sentence-transformers style), top to bottom.

    ids, token types [b, t] -> embeddings: word + position + token type, LayerNorm
      -> n x post-norm layer: x = LN(x + attn(x)); x = LN(x + W2 gelu(W1 x))
      -> hidden states [b, t, d]
      -> mean over the real tokens (attention mask) -> L2-normalised vector [b, d]
    similarity = cosine = dot product of normalised vectors

all-MiniLM-L6-v2 (the registry's "all-minilm-l6-v2") is exactly this: 6 layers, 384 dims,
mean pooling, normalised. Its tokenizer.json pads every input to 128 tokens and truncates at 128:
padding is turned off here (the batch is padded to its longest input and masked instead), and
an input longer than the limit is truncated with a warning and a `truncated` flag.

Weight names (HF `BertModel`; a `bert.` prefix, as in BertForMaskedLM checkpoints, is accepted):
    embeddings.word_embeddings | position_embeddings | token_type_embeddings .weight
    embeddings.LayerNorm.weight|bias
    encoder.layer.N.attention.self.query|key|value .weight|bias     -> fused qkv here
    encoder.layer.N.attention.output.dense, .attention.output.LayerNorm
    encoder.layer.N.intermediate.dense, encoder.layer.N.output.dense, .output.LayerNorm
The pooler (pooler.dense, tanh of the first token) is not used by sentence embeddings.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..core import dtype as dt
from ..core.device import Device
from ..core.errors import FormatError, ModelNotFound, ShapeMismatch
from ..nn import ops
from ..nn.layers import Activation, LayerNorm, Linear
from ..core.tensor import Tensor
from .config_fields import ConfigFields, read_json_config
from .inputs import additive_padding_mask, token_ids

REQUIRED_CONFIG_FIELDS = ("vocab_size", "hidden_size", "num_hidden_layers",
                          "num_attention_heads", "intermediate_size", "max_position_embeddings")
# Sentences embedded per forward pass: padding is to the longest in the batch, so batches are
# formed from inputs sorted by length.
DEFAULT_BATCH_SIZE = 32
# Padded tokens per forward pass: bounds memory (attention is [batch, heads, t, t]) and the
# work wasted on padding when lengths differ.
MAX_BATCH_TOKENS = 2048
PADDING_RATIO = 2


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
    def from_safetensors(weights, config, device=None) -> "BertModel":
        """HF safetensors (path(s) or bytes) + config.json (path, dict or BertConfig)."""
        from ..nn.var_builder import VarBuilder

        device = Device.parse(device)
        config = _read_config(config)
        vb = VarBuilder.from_safetensors(weights, dt.f32, device)
        if not vb.contains("embeddings.word_embeddings.weight") and vb.contains(
                "bert.embeddings.word_embeddings.weight"):
            vb = vb.pp("bert")
        return _build(config, vb, device)

    @staticmethod
    def from_pretrained(folder, device=None) -> "BertModel":
        folder = Path(folder)
        shards = sorted(folder.glob("*.safetensors"))
        if not (folder / "config.json").exists() or not shards:
            raise ModelNotFound(f"{folder}: expected config.json and *.safetensors BERT weights")
        return BertModel.from_safetensors([str(s) for s in shards], folder / "config.json", device)


def _build(config: BertConfig, vb, device) -> BertModel:
    d, ffn, eps = config.hidden_size, config.intermediate_size, config.layer_norm_eps

    def linear(v, out_dim, in_dim):
        return Linear(v.get((out_dim, in_dim), "weight"), v.get((out_dim,), "bias"))

    def layer_norm(v):
        return LayerNorm(v.get((d,), "weight"), v.get((d,), "bias"), eps)

    emb = vb.pp("embeddings")
    embeddings = BertEmbeddings(
        emb.get((config.vocab_size, d), "word_embeddings.weight"),
        emb.get((config.max_position_embeddings, d), "position_embeddings.weight"),
        emb.get((config.type_vocab_size, d), "token_type_embeddings.weight"),
        layer_norm(emb.pp("LayerNorm")))
    layers = []
    for i in range(config.num_hidden_layers):
        v = vb.pp(f"encoder.layer.{i}")
        q, k, vv = (linear(v.pp(f"attention.self.{n}"), d, d) for n in ("query", "key", "value"))
        qkv = Linear(Tensor.cat([q.weight, k.weight, vv.weight], 0),
                     Tensor.cat([q.bias, k.bias, vv.bias], 0))
        attention = BertSelfAttention(qkv, linear(v.pp("attention.output.dense"), d, d),
                                      config.num_attention_heads)
        layers.append(BertLayer(attention, layer_norm(v.pp("attention.output.LayerNorm")),
                                linear(v.pp("intermediate.dense"), ffn, d),
                                linear(v.pp("output.dense"), d, ffn),
                                layer_norm(v.pp("output.LayerNorm")), config.hidden_act))
    return BertModel(config, embeddings, layers, device)


def _read_config(config) -> BertConfig:
    """A BertConfig from a BertConfig, a parsed config.json, its bytes or its path."""
    if isinstance(config, BertConfig):
        return config
    source = f"bert config.json {config}" if isinstance(config, (str, Path)) else "bert config.json"
    return BertConfig.from_hf_config(read_json_config(config, "bert config.json"), source)


# -- pooling and similarity -----------------------------------------------------------------
def mean_pool(hidden: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
    """Mean of the hidden states of the real tokens: [b, t, d], [b, t] -> [b, d]."""
    mask = np.asarray(attention_mask, dtype=np.float32)[:, :, None]
    counts = np.maximum(mask.sum(axis=1), 1e-9)  # sentence-transformers' clamp
    return (hidden * mask).sum(axis=1) / counts


def l2_normalize(vectors: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(vectors, axis=-1, keepdims=True)
    return vectors / np.maximum(norms, 1e-12)  # torch.nn.functional.normalize's eps


def cosine_similarity(a: np.ndarray, b: np.ndarray = None) -> np.ndarray:
    """Pairwise cosine similarity [n, m] of the rows of a and b (b defaults to a)."""
    a = l2_normalize(np.atleast_2d(np.asarray(a, dtype=np.float32)))
    b = a if b is None else l2_normalize(np.atleast_2d(np.asarray(b, dtype=np.float32)))
    return a @ b.T


# -- sentences in, vectors out --------------------------------------------------------------
@dataclass
class Embeddings:
    vectors: np.ndarray  # [n, d] float32, L2-normalised unless asked otherwise
    token_counts: list  # tokens used per sentence (after truncation, with [CLS]/[SEP])
    truncated: list  # per sentence: was it longer than the limit

    def similarity(self) -> np.ndarray:
        return cosine_similarity(self.vectors)


class SentenceEmbedder:
    """BertModel + tokenizer -> sentence vectors (mean pooling, L2 normalisation)."""

    def __init__(self, model: BertModel, tokenizer, max_tokens: int = None):
        self.model = model
        self.tokenizer = tokenizer
        # The limit: the tokenizer.json truncation length when it has one (what the model was
        # used with), never more than the model's positions.
        limit = model.config.max_position_embeddings
        truncation = getattr(tokenizer, "truncation", None)
        if max_tokens is None and truncation is not None:
            max_tokens = truncation.max_length
        self.max_tokens = min(limit, max_tokens) if max_tokens else limit
        # Tokenize the whole input and cut here, so that a cut can be reported.
        if truncation is not None:
            tokenizer.no_truncation()
        if getattr(tokenizer, "padding", None) is not None:
            tokenizer.no_padding()
        sep = tokenizer.token_to_id("[SEP]")
        self.sep_id = sep

    def tokenize(self, text: str) -> tuple:
        """(ids, truncated): [CLS] ... [SEP], cut to max_tokens keeping the final [SEP]."""
        if not isinstance(text, str):
            raise TypeError(f"embed: expected str sentences, got {type(text).__name__}")
        ids = list(self.tokenizer.encode(text).ids)
        if len(ids) <= self.max_tokens:
            return ids, False
        if self.sep_id is not None and ids[-1] == self.sep_id:
            return ids[:self.max_tokens - 1] + [self.sep_id], True
        return ids[:self.max_tokens], True

    def embed(self, sentences, normalize: bool = True,
              batch_size: int = DEFAULT_BATCH_SIZE) -> Embeddings:
        if isinstance(sentences, str):
            sentences = [sentences]
        sentences = list(sentences)
        hidden = self.model.config.hidden_size
        if not sentences:
            return Embeddings(np.zeros((0, hidden), np.float32), [], [])
        tokenized = [self.tokenize(text) for text in sentences]
        cut = [index for index, (_, truncated) in enumerate(tokenized) if truncated]
        if cut:
            warnings.warn(f"embed: {len(cut)} input(s) longer than the model's limit of "
                          f"{self.max_tokens} tokens were truncated (inputs {cut[:10]})",
                          stacklevel=2)
        vectors = np.zeros((len(sentences), hidden), np.float32)
        for rows in _length_batches([len(ids) for ids, _ in tokenized], batch_size):
            width = max(len(tokenized[row][0]) for row in rows)
            ids = np.full((len(rows), width), self.model.config.pad_token_id, np.int64)
            mask = np.zeros((len(rows), width), np.int64)
            for i, row in enumerate(rows):
                tokens = tokenized[row][0]
                ids[i, :len(tokens)] = tokens
                mask[i, :len(tokens)] = 1
            states = self.model(ids, mask).to_numpy()
            vectors[rows] = mean_pool(states, mask)
        if normalize:
            vectors = l2_normalize(vectors)
        return Embeddings(vectors.astype(np.float32), [len(ids) for ids, _ in tokenized],
                          [truncated for _, truncated in tokenized])


# -- helpers --------------------------------------------------------------------------------
def _length_batches(lengths: list, batch_size: int) -> list:
    """Row indices grouped for batched forwards: sorted by length, and cut where the longest
    input would be more than PADDING_RATIO times the shortest, or the batch would exceed
    MAX_BATCH_TOKENS padded tokens (one long input does not pad many short ones to its length)."""
    order = sorted(range(len(lengths)), key=lambda index: lengths[index])
    batches, current = [], []
    for index in order:
        width = lengths[index]  # the longest so far: the order is ascending
        too_uneven = width > PADDING_RATIO * lengths[current[0]] if current else False
        if current and (len(current) >= batch_size or too_uneven
                        or (len(current) + 1) * width > MAX_BATCH_TOKENS):
            batches.append(current)
            current = []
        current.append(index)
    if current:
        batches.append(current)
    return batches


def load_sentence_embedder(folder, device=None) -> SentenceEmbedder:
    """A folder with config.json, *.safetensors and tokenizer.json."""
    from ..tokenizers import Tokenizer

    folder = Path(folder)
    tokenizer_path = folder / "tokenizer.json"
    if not tokenizer_path.exists():
        raise ModelNotFound(f"{folder}: no tokenizer.json next to the BERT weights")
    return SentenceEmbedder(BertModel.from_pretrained(folder, device), Tokenizer.from_file(tokenizer_path))


__all__ = ["BertConfig", "BertModel", "SentenceEmbedder", "Embeddings", "mean_pool",
           "l2_normalize", "cosine_similarity", "load_sentence_embedder"]
