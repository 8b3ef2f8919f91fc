"""Helpers for the LLaMA tests: tiny random checkpoints in both layouts.

A tiny config (GQA, even head_dim) gets random weights in HF naming; `to_gguf` writes the
same weights as a GGUF file the way llama.cpp's converter (convert_hf_to_gguf.py) lays them out
for the architecture (names mapped through the model's own table, which test_llama_tiny and
test_llm_families check against the `gguf` package; Q/K rows permuted so rotated pairs are
adjacent for the llama architecture only; Gemma's norm weights stored as 1 + w), optionally
quantized. The other families' weights come from transformers' own random init
(test_llm_families); `transformers_logits` runs any family's *ForCausalLM on a state.
"""

from __future__ import annotations

import importlib.util
import json
import math
from contextlib import contextmanager
from pathlib import Path

import numpy as np

REFERENCE_SCRIPT = Path(__file__).resolve().parent.parent / "reference" / "record_llama.py"

TINY_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 96,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "max_position_embeddings": 128,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "mlp_bias": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
}


def random_state(config: dict, seed: int = 0) -> dict:
    """HF-named float32 weights; scaled so activations stay O(1) through the layers."""
    rng = np.random.default_rng(seed)
    d, ffn = config["hidden_size"], config["intermediate_size"]
    hd = config["head_dim"]
    q_rows, kv_rows = config["num_attention_heads"] * hd, config["num_key_value_heads"] * hd

    def matrix(rows, cols):
        return (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float32)

    def norm(size):
        return (1.0 + 0.1 * rng.standard_normal(size)).astype(np.float32)

    embeddings = rng.standard_normal((config["vocab_size"], d)).astype(np.float32)
    state = {"model.embed_tokens.weight": embeddings, "model.norm.weight": norm(d)}
    if not config.get("tie_word_embeddings"):
        state["lm_head.weight"] = matrix(config["vocab_size"], d)
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        state[p + "input_layernorm.weight"] = norm(d)
        state[p + "post_attention_layernorm.weight"] = norm(d)
        state[p + "self_attn.q_proj.weight"] = matrix(q_rows, d)
        state[p + "self_attn.k_proj.weight"] = matrix(kv_rows, d)
        state[p + "self_attn.v_proj.weight"] = matrix(kv_rows, d)
        state[p + "self_attn.o_proj.weight"] = matrix(d, q_rows)
        state[p + "mlp.gate_proj.weight"] = matrix(ffn, d)
        state[p + "mlp.up_proj.weight"] = matrix(ffn, d)
        state[p + "mlp.down_proj.weight"] = matrix(d, ffn)
    return state


# What llama.cpp's converter does per GGUF architecture: LlamaModel (llama; HF Mistral converts
# to it too) permutes the Q/K rows; Qwen2Model, Qwen3Model, Phi3MiniModel and the Gemma models
# keep HF's half-split rows (llama.cpp's NEOX rope). Gemma2Model/Gemma3Model add 1 to every
# tensor whose name ends in "norm.weight" (HF's Gemma RMSNorm multiplies by 1 + w).
PERMUTED_QK_ARCHITECTURES = ("llama",)
NORM_PLUS_ONE_ARCHITECTURES = ("gemma2", "gemma3")
# HF model_type -> the GGUF architecture llama.cpp's converter writes.
GGUF_ARCHITECTURE = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3",
                     "phi3": "phi3", "gemma2": "gemma2", "gemma3_text": "gemma3"}


def permute_rows(weight: np.ndarray, n_heads: int) -> np.ndarray:
    """llama.cpp's converter order: within each head, rows (half, pair) become (pair, half)."""
    head_dim = weight.shape[0] // n_heads
    grouped = weight.reshape(n_heads, 2, head_dim // 2, *weight.shape[1:])
    return np.ascontiguousarray(grouped.swapaxes(1, 2).reshape(weight.shape))


def gguf_name(hf_name: str, arch: str = "llama") -> str:
    from candle_web.models.llama import FAMILY_WEIGHT_NAMES, weight_names

    # An architecture the model does not know (a test of that error) gets llama's names.
    return weight_names(arch if arch in FAMILY_WEIGHT_NAMES else "llama").translate(
        hf_name, "hf", "gguf")


def gguf_metadata(config: dict, arch: str = "llama") -> dict:
    """The `<arch>.*` keys llama.cpp's converter writes for `config` (HF config.json fields);
    the family keys only where the config has them."""
    optional = {
        "sliding_window": "attention.sliding_window",
        "attn_logit_softcapping": "attn_logit_softcapping",
        "final_logit_softcapping": "final_logit_softcapping",
        "sliding_window_pattern": "attention.sliding_window_pattern",
    }
    extra = {f"{arch}.{key}": config[field] for field, key in optional.items()
             if config.get(field) is not None}
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    if (config.get("rope_scaling") or {}).get("type") in ("longrope", "su"):
        # Phi3MiniModel's keys (its factors go in tensors: to_gguf); attn_factor as it computes it.
        scale = config["max_position_embeddings"] / config["original_max_position_embeddings"]
        extra[f"{arch}.rope.scaling.original_context_length"] = \
            config["original_max_position_embeddings"]
        extra[f"{arch}.rope.scaling.attn_factor"] = math.sqrt(
            1 + math.log(scale) / math.log(config["original_max_position_embeddings"]))
    return extra | {
        "general.architecture": arch,
        f"{arch}.block_count": config["num_hidden_layers"],
        f"{arch}.context_length": config["max_position_embeddings"],
        f"{arch}.embedding_length": config["hidden_size"],
        f"{arch}.feed_forward_length": config["intermediate_size"],
        f"{arch}.attention.head_count": config["num_attention_heads"],
        f"{arch}.attention.head_count_kv": config["num_key_value_heads"],
        f"{arch}.rope.freq_base": float(config["rope_theta"]),
        f"{arch}.attention.layer_norm_rms_epsilon": float(config["rms_norm_eps"]),
        f"{arch}.attention.key_length": head_dim,
        f"{arch}.attention.value_length": head_dim,
        f"{arch}.rope.dimension_count": head_dim,
        "tokenizer.ggml.bos_token_id": config["bos_token_id"],
        "tokenizer.ggml.eos_token_id": config["eos_token_id"],
    }


def to_gguf(state: dict, config: dict, path: Path, quantize_to=None, extra_metadata=None,
            extra_tensors=None, arch: str = "llama") -> Path:
    """Write `state` as a llama.cpp-style GGUF of architecture `arch`; 2-D weights optionally
    quantized (a GgmlDType)."""
    from candle_web.io.gguf import write_gguf
    from candle_web.quantized import QTensor

    tensors = {}
    for name, values in state.items():
        if arch in PERMUTED_QK_ARCHITECTURES and name.endswith("q_proj.weight"):
            values = permute_rows(values, config["num_attention_heads"])
        elif arch in PERMUTED_QK_ARCHITECTURES and name.endswith("k_proj.weight"):
            values = permute_rows(values, config["num_key_value_heads"])
        if arch in NORM_PLUS_ONE_ARCHITECTURES and name.endswith("norm.weight"):
            values = (values.astype(np.float64) + 1.0).astype(values.dtype)
        if quantize_to is not None and values.ndim == 2:
            values = QTensor.from_float(values, quantize_to)
        tensors[gguf_name(name, arch)] = values
    scaling = config.get("rope_scaling") or {}
    if scaling.get("type") in ("longrope", "su"):
        tensors["rope_factors_long.weight"] = np.array(scaling["long_factor"], np.float32)
        tensors["rope_factors_short.weight"] = np.array(scaling["short_factor"], np.float32)
    tensors.update(extra_tensors or {})
    metadata = gguf_metadata(config, arch)
    metadata.update(extra_metadata or {})
    write_gguf(path, metadata, tensors)
    return path


# K-quants need rows of 256: a wider tiny model (still 2 layers, GQA 4 heads over 2).
WIDE_CONFIG = dict(TINY_CONFIG, hidden_size=256, intermediate_size=256, head_dim=64,
                   vocab_size=128)


def tiny_gguf(folder: Path, qtype: str | None = None, wide: bool = False, seed: int = 3):
    """The tiny random model as a GGUF of `qtype` (a GGML type name, None: f32) in `folder`;
    `wide` makes rows of 256 (the K-quants' block). Returns (path, state, config, GGML type)."""
    from candle_web.quantized import GgmlDType

    config = WIDE_CONFIG if wide else TINY_CONFIG
    state = random_state(config, seed=seed)
    kind = None if qtype is None else GgmlDType.parse(qtype)
    path = to_gguf(state, config, Path(folder) / f"{qtype}-{seed}.gguf", quantize_to=kind)
    return path, state, config, kind


def dequantized_state(state: dict, quantize_to=None) -> dict:
    """The weights a GGUF written by to_gguf(state, quantize_to=...) holds, in HF layout: 2-D
    weights quantized and decoded (blocks run along rows, so quantizing commutes with the Q/K
    row permutation)."""
    from candle_web.quantized import QTensor

    if quantize_to is None:
        return dict(state)
    return {name: QTensor.from_float(values, quantize_to).dequantize() if values.ndim == 2
            else values for name, values in state.items()}


def to_hf_folder(state: dict, config: dict, folder: Path) -> Path:
    """config.json + model.safetensors written by the `safetensors` library."""
    from safetensors.numpy import save_file

    folder.mkdir(parents=True, exist_ok=True)
    save_file(state, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def transformers_model(config: dict, state: dict = None, dtype=np.float32):
    """transformers' *ForCausalLM for config["model_type"] (LlamaForCausalLM by default; eager
    attention) in `dtype`, on the weights `state`, or randomly initialised by transformers."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = {k: v for k, v in config.items() if k not in ("architectures", "model_type")}
    cfg = AutoConfig.for_model(config.get("model_type", "llama"), **fields)
    cfg._attn_implementation = "eager"
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()
    if np.dtype(dtype) == np.float64:
        model = model.double()
    if state is not None:
        weights = {k: torch.from_numpy(v.astype(dtype)) for k, v in state.items()}
        missing, unexpected = model.load_state_dict(weights, strict=False)
        # A tied head has no lm_head.weight of its own; nothing else may be missing.
        assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
        if config.get("tie_word_embeddings"):
            model.tie_weights()
    return model


def transformers_logits(config: dict, state: dict, ids, dtype=np.float32) -> np.ndarray:
    """All-position logits [t, vocab] of transformers' *ForCausalLM for config["model_type"]
    on the same weights, computed in `dtype` (float64: the truth f32 paths are measured
    against)."""
    import torch

    model = transformers_model(config, state, dtype)
    with torch.no_grad():
        return model(torch.tensor([list(ids)])).logits[0].numpy()


def reference_script():
    """tests/reference/record_llama.py as a module (its conversion helpers)."""
    spec = importlib.util.spec_from_file_location("record_llama", REFERENCE_SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@contextmanager
def one_blas_thread():
    """Run numpy's BLAS on one thread. On the shared 2-core test machine, multithreaded
    OpenBLAS gemm measured 10x slower when the cores are oversubscribed (a 37-token prefill:
    0.5 s on one thread, 5-7 s on two); results are identical either way."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        yield
        return
    with threadpool_limits(limits=1, user_api="blas"):
        yield


# qwen2 with a projection of mixed GGML types in each fused layer, as in the Qwen2.5 Q4_K_M
# file (Q5_0 q/k with a Q8_0 or Q6_K v; Q4_K or Q6_K down): the numba and wasm parts join the
# pieces into one kernel weight (tests/models/test_llama_fused_decode.py,
# tests/backend/test_wasm_parts.py).
QWEN2_CONFIG = dict(WIDE_CONFIG, model_type="qwen2", architectures=["Qwen2ForCausalLM"],
                    rope_theta=1e6)
QWEN2_TYPES = {"q_proj": "Q5_0", "k_proj": "Q5_0", "v_proj": "Q6_K", "o_proj": "Q8_0",
               "gate_proj": "Q4_K", "up_proj": "Q5_0", "down_proj": "Q6_K", "lm_head": "Q8_0"}


def qwen2_state(seed):
    """random_state plus the Q/K/V biases (away from 0, so a bias left out shows)."""
    rng = np.random.default_rng(seed + 100)
    state = random_state(QWEN2_CONFIG, seed=seed)
    hd = QWEN2_CONFIG["head_dim"]
    rows = {"q": QWEN2_CONFIG["num_attention_heads"] * hd,
            "k": QWEN2_CONFIG["num_key_value_heads"] * hd,
            "v": QWEN2_CONFIG["num_key_value_heads"] * hd}
    for i in range(QWEN2_CONFIG["num_hidden_layers"]):
        for name, n in rows.items():
            state[f"model.layers.{i}.self_attn.{name}_proj.bias"] = (
                0.5 * rng.standard_normal(n)).astype(np.float32)
    return state


def qwen2_mixed_gguf(folder: Path, seed: int = 7):
    """The qwen2 model above as a GGUF of QWEN2_TYPES in `folder`. Returns (path, the HF state
    as the file holds it: quantized matrices decoded)."""
    from candle_web.quantized import GgmlDType, QTensor

    state = qwen2_state(seed=seed)
    quantized, decoded = {}, dict(state)
    for name, values in state.items():
        kind = next((GgmlDType.parse(k) for part, k in QWEN2_TYPES.items() if part in name), None)
        if values.ndim == 2 and kind is not None:
            q = QTensor.from_float(values, kind)
            quantized[gguf_name(name, "qwen2")], decoded[name] = q, q.dequantize()
    path = to_gguf(state, QWEN2_CONFIG, Path(folder) / "qwen2-mixed.gguf",
                   extra_tensors=quantized, arch="qwen2")
    return path, decoded
