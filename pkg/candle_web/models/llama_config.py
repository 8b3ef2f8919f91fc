"""The configuration of the LLM families that models/llama.py computes: `LlamaConfig` (from an
HF config.json or a GGUF's metadata and tensor list), its RoPE scaling, and the weight-name
tables that map the model's names to HF and GGUF names (`weight_names(family)`).

Each family's differences are fields here (see models/llama.py's module doc for what each field
does to the computation); defaults where a config.json leaves a field out are transformers'
class defaults, and a GGUF's are what llama.cpp's converter writes.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from ..core.errors import FormatError, ShapeMismatch, UnsupportedError
from ..io.weights import WeightNames
from .config_fields import REQUIRED, ConfigFields

# GGUF general.architecture values and HF model_type values -> the family (its name table).
GGUF_FAMILIES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "phi3": "phi3",
                 "gemma2": "gemma2", "gemma3": "gemma3"}
HF_FAMILIES = {"llama": "llama", "mistral": "mistral", "qwen2": "qwen2", "qwen3": "qwen3",
               "phi3": "phi3", "gemma2": "gemma2", "gemma3_text": "gemma3"}
SUPPORTED_GGUF_ARCHITECTURES = tuple(GGUF_FAMILIES)
SUPPORTED_HF_MODEL_TYPES = tuple(HF_FAMILIES)
GEMMA_FAMILIES = ("gemma2", "gemma3")
QK_NORM_FAMILIES = ("qwen3", "gemma3")
# llama.cpp's converter permutes the Q/K rows (interleaved RoPE) for these architectures only;
# the others keep HF's half-split layout (llama.cpp's NEOX rope type).
GGUF_PERMUTED_QK_ARCHITECTURES = ("llama",)
SUPPORTED_ROPE_SCALING = ("linear", "llama3", "longrope")
SUPPORTED_ACTIVATIONS = ("silu", "gelu_pytorch_tanh")
DEFAULT_ROPE_THETA = 10000.0
DEFAULT_RMS_NORM_EPS = 1e-5
# Where a config.json leaves them out, transformers' class defaults: Gemma 2's soft-caps, Gemma's
# query_pre_attn_scalar, Gemma 3's local RoPE base and sliding pattern, Qwen's first windowed layer.
GEMMA2_SOFTCAPS = (50.0, 30.0)  # (attention, final)
GEMMA_QUERY_PRE_ATTN_SCALAR = 256
GEMMA3_LOCAL_ROPE_THETA = 10000.0
SLIDING_WINDOW_PATTERN = {"gemma2": 2, "gemma3": 6}  # every n-th layer attends to everything
QWEN_MAX_WINDOW_LAYERS = 28
# llama.cpp scales Gemma 2/3 27B's scores by 1/sqrt(d / heads) instead of 1/sqrt(head_dim) (no
# GGUF key says so; it recognises the model by its layer count).
GGUF_GEMMA_27B_BLOCKS = {"gemma2": 46, "gemma3": 62}


# -- configuration ------------------------------------------------------------------------
@dataclass(frozen=True)
class RopeScaling:
    """Rescaling of the rotary inverse frequencies for long context.

    linear: every frequency divided by `factor` (positions interpolated).
    llama3: long wavelengths divided by `factor`, short ones kept, a smooth blend between
    (Llama 3.1's scheme). freq_factors: each frequency divided by its own factor (how
    llama.cpp stores llama3 scaling in GGUF: a `rope_freqs.weight` tensor). longrope (Phi-3,
    formerly "su"): each frequency divided by its own short factor while the sequence is at most
    original_max_position_embeddings long, by its long factor beyond (transformers' rule: the
    tables switch when the sequence grows past it; cached keys keep their rotation), and cos/sin
    multiplied by `attention_factor`."""

    kind: str
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192
    freq_factors: tuple = ()
    long_factors: tuple = ()  # longrope's; freq_factors holds its short ones
    attention_factor: float = 1.0  # cos and sin are multiplied by it (longrope)

    def uses_long_factors(self, positions: int) -> bool:
        """Whether tables for a sequence of `positions` use longrope's long factors."""
        return self.kind == "longrope" and positions > self.original_max_position_embeddings

    def apply(self, inv_freq: np.ndarray, long: bool = False) -> np.ndarray:
        if self.kind == "linear":
            return inv_freq / self.factor
        if self.kind in ("freq_factors", "longrope"):
            factors = np.asarray(self.long_factors if long else self.freq_factors, np.float64)
            if factors.shape != inv_freq.shape:
                raise ShapeMismatch(f"rope scaling {self.kind}: {factors.size} factors for "
                                    f"{inv_freq.size} rotary frequencies")
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
    def from_hf(fields, top: ConfigFields = None):
        """From config.json's `rope_scaling` (or transformers 5's `rope_parameters`), as a
        ConfigFields section (a plain dict is accepted too); `top`: the whole config (longrope
        reads max_position_embeddings and original_max_position_embeddings there)."""
        if isinstance(fields, dict):
            fields = ConfigFields(fields, "config.json", label_prefix="rope_scaling.")
        if fields is None or not fields.mapping:
            return None
        kind = fields.string("rope_type", fields.string("type", "default"))
        if kind == "default":
            return None
        if kind in ("longrope", "su"):  # "su": Phi-3's first name for it
            return RopeScaling._longrope(fields, top or fields)
        if kind not in SUPPORTED_ROPE_SCALING:
            raise UnsupportedError(f"{fields.source}: rope scaling {kind!r} is not supported; "
                                   f"supported: {SUPPORTED_ROPE_SCALING}")
        if kind == "linear":
            return RopeScaling("linear", fields.number("factor", positive=True))
        return RopeScaling("llama3", fields.number("factor", positive=True),
                           fields.number("low_freq_factor", 1.0, positive=True),
                           fields.number("high_freq_factor", 4.0, positive=True),
                           fields.positive_int("original_max_position_embeddings", 8192))

    @staticmethod
    def _longrope(fields: ConfigFields, top: ConfigFields) -> "RopeScaling":
        original = fields.positive_int("original_max_position_embeddings", None) or \
            top.positive_int("original_max_position_embeddings")
        factor = fields.number("factor", None, positive=True) or \
            top.positive_int("max_position_embeddings", 4096) / original
        attention = fields.number("attention_factor", None, positive=True)
        if attention is None:  # transformers' (and the LongRoPE paper's) default
            attention = 1.0 if factor <= 1.0 else \
                math.sqrt(1.0 + math.log(factor) / math.log(original))
        return RopeScaling("longrope", factor, original_max_position_embeddings=original,
                           freq_factors=_positive_numbers(fields, "short_factor"),
                           long_factors=_positive_numbers(fields, "long_factor"),
                           attention_factor=attention)


def _positive_numbers(fields: ConfigFields, name: str) -> tuple:
    """A required JSON list of positive finite numbers (longrope's per-frequency factors)."""
    values = fields.raw(name)
    if not isinstance(values, list) or not values or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0
            for v in values):
        raise fields.fail(name, "a list of positive finite numbers", values)
    return tuple(float(v) for v in values)


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
    # The families' differences (defaults: plain LLaMA; see the module doc).
    family: str = "llama"  # chooses the weight-name table (weight_names)
    qkv_bias: bool = False  # biases on the Q, K and V projections
    qk_norm: bool = False  # RMS norm over each query and key head before RoPE
    post_norms: bool = False  # RMS norms of the attention and MLP outputs before the residual
    norm_weight_offset: float = 0.0  # every RMS norm multiplies by (offset + w)
    hidden_act: str = "silu"  # the MLP gate's activation
    embedding_scale: float = 1.0  # the embedded tokens are multiplied by this (rounded to f32)
    query_pre_attn_scalar: float = None  # scores scaled by its -1/2 power; None: head_dim's
    attn_logit_softcap: float = None  # scores -> cap * tanh(scores / cap)
    final_logit_softcap: float = None  # logits -> cap * tanh(logits / cap)
    sliding_window: int = None  # a windowed layer's query sees this many positions (itself too)
    sliding_layers: tuple = None  # per layer, whether it is windowed; None: all (if a window)
    rope_local_theta: float = None  # the windowed layers' RoPE base, unscaled; None: rope_theta

    def __post_init__(self):
        if self.num_kv_heads <= 0 or self.num_heads % self.num_kv_heads:
            raise FormatError(f"llama config: {self.num_heads} attention heads cannot be "
                              f"grouped over {self.num_kv_heads} key/value heads")
        if self.head_dim % 2:
            raise FormatError(f"llama config: head_dim {self.head_dim} must be even for RoPE")
        if self.hidden_act not in SUPPORTED_ACTIVATIONS:
            raise UnsupportedError(f"llama config: activation {self.hidden_act!r} is not "
                                   f"supported; supported: {SUPPORTED_ACTIVATIONS}")
        if self.sliding_layers is not None and len(self.sliding_layers) != self.num_layers:
            raise FormatError(f"llama config: {len(self.sliding_layers)} layer types for "
                              f"{self.num_layers} layers")

    @property
    def n_rep(self) -> int:
        return self.num_heads // self.num_kv_heads

    @property
    def attention_scale(self) -> float:
        return 1.0 / math.sqrt(self.query_pre_attn_scalar or self.head_dim)

    def window(self, layer: int):
        """The sliding window of layer `layer`, or None (it sees every position)."""
        if self.sliding_window is None:
            return None
        if self.sliding_layers is not None and not self.sliding_layers[layer]:
            return None
        return self.sliding_window

    def local_rope(self, layer: int) -> bool:
        """Whether layer `layer` rotates with the local base (Gemma 3's windowed layers)."""
        return self.rope_local_theta is not None and self.window(layer) is not None

    @staticmethod
    def from_hf_config(cfg: dict, source: str = "llama config.json") -> "LlamaConfig":
        """From an HF config.json object; `source` names the file in errors."""
        fields = ConfigFields(cfg, source)
        model_type = cfg.get("model_type")
        if not isinstance(model_type, str) or model_type not in HF_FAMILIES:
            raise UnsupportedError(f"{source}: model_type {model_type!r} is not supported "
                                   f"by the llama model; supported: {SUPPORTED_HF_MODEL_TYPES}")
        family = HF_FAMILIES[model_type]
        gemma = family in GEMMA_FAMILIES
        for flag in ("attention_bias", "mlp_bias"):
            if fields.boolean(flag, False):
                raise UnsupportedError(f"{source}: {flag}=true is not supported")
        rope_fields = fields.section("rope_parameters")
        global_rope = local_rope = rope_fields
        if rope_fields is not None and rope_fields.has("full_attention"):
            # transformers 5's Gemma 3: one section per layer type.
            global_rope = rope_fields.section("full_attention")
            local_rope = rope_fields.section("sliding_attention")
        scaling = fields.section("rope_scaling") or global_rope
        if fields.number("partial_rotary_factor", 1.0) != 1.0 or (
                global_rope is not None and global_rope.number("partial_rotary_factor", 1.0) != 1.0):
            raise UnsupportedError(f"{source}: partial_rotary_factor below 1 (partial rotary "
                                   f"embeddings) is not supported")
        theta = _rope_theta(fields, "rope_theta", global_rope, DEFAULT_ROPE_THETA)
        vocab, hidden = fields.positive_int("vocab_size"), fields.positive_int("hidden_size")
        heads = fields.positive_int("num_attention_heads")
        kv_heads = fields.positive_int("num_key_value_heads", heads)
        layers = fields.positive_int("num_hidden_layers")
        fields.check_divides("num_key_value_heads", kv_heads, "num_attention_heads", heads)
        if not fields.has("head_dim"):
            fields.check_divides("num_attention_heads", heads, "hidden_size", hidden)
        window, sliding_layers = _hf_sliding_window(fields, family, layers)
        # Gemma 2's defaults only where the key is absent: an explicit null means no cap.
        softcaps = [cap if family == "gemma2" and key not in cfg else None for cap, key in
                    zip(GEMMA2_SOFTCAPS, ("attn_logit_softcapping", "final_logit_softcapping"))]
        act = fields.string("hidden_activation", None) or fields.string(
            "hidden_act", "gelu_pytorch_tanh" if gemma else "silu")
        return LlamaConfig(
            vocab_size=vocab, hidden_size=hidden,
            intermediate_size=fields.positive_int("intermediate_size"),
            num_layers=layers, num_heads=heads,
            num_kv_heads=kv_heads, head_dim=fields.positive_int("head_dim", hidden // heads),
            rms_norm_eps=fields.number("rms_norm_eps", DEFAULT_RMS_NORM_EPS, positive=True),
            rope_theta=theta,
            max_position_embeddings=fields.positive_int("max_position_embeddings", 4096),
            rope_interleaved=False, rope_scaling=RopeScaling.from_hf(scaling, fields),
            tie_word_embeddings=fields.boolean("tie_word_embeddings", gemma),
            bos_token_id=fields.token_id("bos_token_id", vocab, None),
            eos_token_ids=fields.token_ids("eos_token_id", vocab),
            family=family, qkv_bias=family == "qwen2", qk_norm=family in QK_NORM_FAMILIES,
            post_norms=gemma, norm_weight_offset=1.0 if gemma else 0.0, hidden_act=act,
            embedding_scale=math.sqrt(hidden) if gemma else 1.0,
            query_pre_attn_scalar=fields.number("query_pre_attn_scalar",
                                                GEMMA_QUERY_PRE_ATTN_SCALAR, positive=True)
            if gemma else None,
            attn_logit_softcap=fields.number("attn_logit_softcapping", softcaps[0], positive=True),
            final_logit_softcap=fields.number("final_logit_softcapping", softcaps[1],
                                              positive=True),
            sliding_window=window, sliding_layers=sliding_layers,
            rope_local_theta=_rope_theta(fields, "rope_local_base_freq", local_rope,
                                         GEMMA3_LOCAL_ROPE_THETA) if family == "gemma3" else None)

    @staticmethod
    def from_gguf(gguf) -> "LlamaConfig":
        """From a GgufFile's metadata (`<arch>.*` keys) and tensor names and shapes."""
        meta = gguf.metadata
        arch = meta.get("general.architecture")
        if not isinstance(arch, str) or arch not in GGUF_FAMILIES:
            raise UnsupportedError(f"GGUF {gguf.source}: general.architecture {arch!r} is not "
                                   f"supported; supported: {SUPPORTED_GGUF_ARCHITECTURES}")
        source = f"GGUF {gguf.source}"
        field = ConfigFields(meta, source, kind="metadata key", key_prefix=f"{arch}.")
        tokens = ConfigFields(meta, source, kind="metadata key", key_prefix="tokenizer.ggml.")
        gemma = arch in GEMMA_FAMILIES
        hidden = field.positive_int("embedding_length")
        heads = field.positive_int("attention.head_count")
        layers = field.positive_int("block_count")
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
        # Gemma's converter writes the window and Gemma 2's soft-caps: required there.
        required = REQUIRED if gemma else None
        # Phi-3's converter writes 0 for "no window".
        window = field.integer("attention.sliding_window", required, minimum=0) or None
        pattern = SLIDING_WINDOW_PATTERN.get(arch)
        if pattern is not None:
            pattern = field.positive_int("attention.sliding_window_pattern", pattern)
        softcap = required if arch == "gemma2" else None
        scalar = None
        if gemma:
            big = layers == GGUF_GEMMA_27B_BLOCKS[arch]
            scalar = float(hidden // heads) if big else float(head_dim)
        return LlamaConfig(
            vocab_size=vocab, hidden_size=hidden,
            intermediate_size=field.positive_int("feed_forward_length"),
            num_layers=layers, num_heads=heads,
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
            family=GGUF_FAMILIES[arch], qkv_bias="blk.0.attn_q.bias" in gguf.tensors,
            qk_norm="blk.0.attn_q_norm.weight" in gguf.tensors,
            post_norms="blk.0.post_attention_norm.weight" in gguf.tensors,
            hidden_act="gelu_pytorch_tanh" if gemma else "silu",
            embedding_scale=math.sqrt(hidden) if gemma else 1.0, query_pre_attn_scalar=scalar,
            attn_logit_softcap=field.number("attn_logit_softcapping", softcap, positive=True),
            final_logit_softcap=field.number("final_logit_softcapping", softcap, positive=True),
            sliding_window=window,
            sliding_layers=None if pattern is None else _pattern_layers(pattern, layers),
            rope_local_theta=field.number("rope.freq_base_swa", GEMMA3_LOCAL_ROPE_THETA,
                                          positive=True) if arch == "gemma3" else None)


def _rope_theta(fields: ConfigFields, name: str, section, default: float) -> float:
    """A RoPE base: the top-level field `name` (older config.json), else the rope section's
    `rope_theta` (transformers 5's rope_parameters), else `default`."""
    theta = fields.number(name, None, positive=True)
    if theta is None and section is not None:
        theta = section.number("rope_theta", None, positive=True)
    return default if theta is None else theta


def _pattern_layers(pattern: int, layers: int) -> tuple:
    """Every `pattern`-th layer (counting from 1) attends to everything, the others slide."""
    return tuple(bool((i + 1) % pattern) for i in range(layers))


def _hf_sliding_window(fields: ConfigFields, family: str, layers: int) -> tuple:
    """(sliding_window, sliding_layers) from config.json: `layer_types` when present (what
    transformers 5 saves), else each family's rule (transformers' defaults)."""
    window = fields.positive_int("sliding_window", None)
    if family in ("qwen2", "qwen3") and not fields.boolean("use_sliding_window", False):
        window = None
    if window is None:
        return None, None
    types = fields.raw("layer_types", None)
    if types is not None:
        kinds = ("sliding_attention", "full_attention")
        if not isinstance(types, list) or len(types) != layers or any(t not in kinds
                                                                        for t in types):
            raise fields.fail("layer_types", f"a list of {layers} of {list(kinds)}", types)
        return window, tuple(t == "sliding_attention" for t in types)
    if family in SLIDING_WINDOW_PATTERN:
        pattern = fields.positive_int("sliding_window_pattern", SLIDING_WINDOW_PATTERN[family])
        return window, _pattern_layers(pattern, layers)
    if family in ("qwen2", "qwen3"):
        first = fields.integer("max_window_layers", QWEN_MAX_WINDOW_LAYERS, minimum=0)
        return window, tuple(i >= first for i in range(layers))
    return window, None  # mistral, phi3: every layer


def _gguf_factors(gguf, name: str) -> tuple:
    factors = gguf.qtensor(name).dequantize().reshape(-1)
    if not (np.isfinite(factors).all() and (factors > 0).all()):
        raise FormatError(f"GGUF {gguf.source}: {name} must hold positive finite factors")
    return tuple(float(f) for f in factors)


def _gguf_rope_scaling(gguf, arch: str, field: ConfigFields):
    if "rope_freqs.weight" in gguf.tensors:
        return RopeScaling("freq_factors", freq_factors=_gguf_factors(gguf, "rope_freqs.weight"))
    if "rope_factors_long.weight" in gguf.tensors or "rope_factors_short.weight" in gguf.tensors:
        # Phi-3's longrope as llama.cpp's converter writes it: both factor tensors, the
        # original context length and the attention factor it computed.
        original = field.positive_int("rope.scaling.original_context_length")
        return RopeScaling("longrope", original_max_position_embeddings=original,
                           freq_factors=_gguf_factors(gguf, "rope_factors_short.weight"),
                           long_factors=_gguf_factors(gguf, "rope_factors_long.weight"),
                           attention_factor=field.number("rope.scaling.attn_factor", 1.0,
                                                         positive=True))
    kind = field.string("rope.scaling.type", "none")
    factor = field.number("rope.scaling.factor", None, positive=True)
    if factor is None:
        factor = field.number("rope.scale_linear", None, positive=True)
    if kind == "none" and factor is None:
        return None
    if kind in ("linear", "none") and factor is not None:
        return None if factor == 1.0 else RopeScaling("linear", factor)
    raise UnsupportedError(f"GGUF {gguf.source}: {arch}.rope.scaling.type {kind!r} is not "
                           "supported; supported: linear (llama3 via rope_freqs.weight, longrope "
                           "via rope_factors_long/short.weight)")


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
# matrices by their own names) -> HF `*ForCausalLM` and llama.cpp's GGUF names, per family.
# None: the naming has no such tensor (the model asks for it only when its config says so, or
# checks `contains` first, as for the fused attn.qkv / mlp.gate_up).
_LLAMA_ROWS = {
    "embed.table": ("model.embed_tokens.weight", "token_embd.weight"),
    "blocks.{i}.attn_norm.weight": ("model.layers.{i}.input_layernorm.weight",
                                    "blk.{i}.attn_norm.weight"),
    "blocks.{i}.attn.q.weight": ("model.layers.{i}.self_attn.q_proj.weight",
                                 "blk.{i}.attn_q.weight"),
    "blocks.{i}.attn.k.weight": ("model.layers.{i}.self_attn.k_proj.weight",
                                 "blk.{i}.attn_k.weight"),
    "blocks.{i}.attn.v.weight": ("model.layers.{i}.self_attn.v_proj.weight",
                                 "blk.{i}.attn_v.weight"),
    "blocks.{i}.attn.qkv.weight": (None, None),
    "blocks.{i}.attn.q.bias": ("model.layers.{i}.self_attn.q_proj.bias", "blk.{i}.attn_q.bias"),
    "blocks.{i}.attn.k.bias": ("model.layers.{i}.self_attn.k_proj.bias", "blk.{i}.attn_k.bias"),
    "blocks.{i}.attn.v.bias": ("model.layers.{i}.self_attn.v_proj.bias", "blk.{i}.attn_v.bias"),
    "blocks.{i}.attn.q_norm.weight": ("model.layers.{i}.self_attn.q_norm.weight",
                                      "blk.{i}.attn_q_norm.weight"),
    "blocks.{i}.attn.k_norm.weight": ("model.layers.{i}.self_attn.k_norm.weight",
                                      "blk.{i}.attn_k_norm.weight"),
    "blocks.{i}.attn.out.weight": ("model.layers.{i}.self_attn.o_proj.weight",
                                   "blk.{i}.attn_output.weight"),
    "blocks.{i}.attn_post_norm.weight": (None, None),
    "blocks.{i}.mlp_norm.weight": ("model.layers.{i}.post_attention_layernorm.weight",
                                   "blk.{i}.ffn_norm.weight"),
    "blocks.{i}.mlp.gate.weight": ("model.layers.{i}.mlp.gate_proj.weight",
                                   "blk.{i}.ffn_gate.weight"),
    "blocks.{i}.mlp.up.weight": ("model.layers.{i}.mlp.up_proj.weight", "blk.{i}.ffn_up.weight"),
    "blocks.{i}.mlp.gate_up.weight": (None, None),
    "blocks.{i}.mlp.down.weight": ("model.layers.{i}.mlp.down_proj.weight",
                                   "blk.{i}.ffn_down.weight"),
    "blocks.{i}.mlp_post_norm.weight": (None, None),
    "norm.weight": ("model.norm.weight", "output_norm.weight"),
    "lm_head.weight": ("lm_head.weight", "output.weight"),
}
LLAMA_WEIGHT_NAMES = WeightNames(("hf", "gguf"), _LLAMA_ROWS, marker="embed.table")
# Phi-3 stores Q/K/V as one qkv_proj and gate/up as one gate_up_proj (GGUF: attn_qkv, and
# ffn_up holding [gate; up]), in the model's stacking order.
PHI3_WEIGHT_NAMES = WeightNames(("hf", "gguf"), _LLAMA_ROWS | {
    "blocks.{i}.attn.q.weight": (None, "blk.{i}.attn_q.weight"),
    "blocks.{i}.attn.k.weight": (None, "blk.{i}.attn_k.weight"),
    "blocks.{i}.attn.v.weight": (None, "blk.{i}.attn_v.weight"),
    "blocks.{i}.attn.qkv.weight": ("model.layers.{i}.self_attn.qkv_proj.weight",
                                   "blk.{i}.attn_qkv.weight"),
    "blocks.{i}.mlp.gate.weight": (None, None),
    "blocks.{i}.mlp.up.weight": (None, None),
    "blocks.{i}.mlp.gate_up.weight": ("model.layers.{i}.mlp.gate_up_proj.weight",
                                      "blk.{i}.ffn_up.weight"),
}, marker="embed.table")
# Gemma: four norms per layer; HF's post_attention_layernorm is the attention output's norm
# and pre_feedforward_layernorm the MLP input's.
GEMMA_WEIGHT_NAMES = WeightNames(("hf", "gguf"), _LLAMA_ROWS | {
    "blocks.{i}.attn_post_norm.weight": ("model.layers.{i}.post_attention_layernorm.weight",
                                         "blk.{i}.post_attention_norm.weight"),
    "blocks.{i}.mlp_norm.weight": ("model.layers.{i}.pre_feedforward_layernorm.weight",
                                   "blk.{i}.ffn_norm.weight"),
    "blocks.{i}.mlp_post_norm.weight": ("model.layers.{i}.post_feedforward_layernorm.weight",
                                        "blk.{i}.post_ffw_norm.weight"),
}, marker="embed.table")
FAMILY_WEIGHT_NAMES = {"llama": LLAMA_WEIGHT_NAMES, "mistral": LLAMA_WEIGHT_NAMES,
                       "qwen2": LLAMA_WEIGHT_NAMES, "qwen3": LLAMA_WEIGHT_NAMES,
                       "phi3": PHI3_WEIGHT_NAMES, "gemma2": GEMMA_WEIGHT_NAMES,
                       "gemma3": GEMMA_WEIGHT_NAMES}


def weight_names(family: str) -> WeightNames:
    """The weight-name table of a family (an HF model_type or a GGUF architecture)."""
    family = HF_FAMILIES.get(family, family)
    if family not in FAMILY_WEIGHT_NAMES:
        raise UnsupportedError(f"llama: no weight names for family {family!r}; supported: "
                               f"{tuple(FAMILY_WEIGHT_NAMES)}")
    return FAMILY_WEIGHT_NAMES[family]
