"""Record reference LLaMA generations with transformers (PyTorch), for tests/models.

    .venv/bin/python tests/reference/record_llama.py [--out tests/reference/llama_reference.json]

The reference model is a float HF checkpoint derived from the SmolLM2-135M-Instruct Q4_1 GGUF
that candle-web runs: every tensor is dequantized by the `gguf` package (gguf.quants), the
Q/K rows that llama.cpp's converter permuted are put back in HF order, and the result is saved
as model.safetensors + config.json (+ the tokenizer that transformers builds from the GGUF
vocabulary, tokenizer.json). transformers' LlamaForCausalLM then generates greedily; its chat
prompts come from `apply_chat_template` (Jinja). The ids, texts and the top logits of the
last prompt position go to the JSON; tests/models/test_llama.py compares candle-web against
the JSON and, when transformers is installed, against transformers live for one prompt.

Both sides compute with the same f32 weights (candle-web's numpy backend dequantizes at
load), so greedy ids are expected to match exactly.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root: tests.<area> imports
# torch_greedy: test_llama_float runs it through this module (llama_testlib.reference_script).
from tests.reference.reference_testlib import REPO, greedy_record, torch_greedy  # noqa: E402,F401

sys.path[:0] = [str(REPO / "pkg")]

MODEL = "smollm2-135m-instruct"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
OUT = Path(__file__).with_name("llama_reference.json")
MAX_NEW_TOKENS = 24
# (name, kind, text): kind "chat" wraps the text as one user message in the chat template.
PROMPTS = [
    ("capital", "chat", "What is the capital of France?"),
    ("fox", "text", "The quick brown fox"),
    ("haiku", "chat", "Write a haiku about the sea."),
]

# GGUF name -> HF name; "{i}" is the layer.
GGUF_TO_HF = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
    "blk.{i}.attn_norm.weight": "model.layers.{i}.input_layernorm.weight",
    "blk.{i}.attn_q.weight": "model.layers.{i}.self_attn.q_proj.weight",
    "blk.{i}.attn_k.weight": "model.layers.{i}.self_attn.k_proj.weight",
    "blk.{i}.attn_v.weight": "model.layers.{i}.self_attn.v_proj.weight",
    "blk.{i}.attn_output.weight": "model.layers.{i}.self_attn.o_proj.weight",
    "blk.{i}.ffn_norm.weight": "model.layers.{i}.post_attention_layernorm.weight",
    "blk.{i}.ffn_gate.weight": "model.layers.{i}.mlp.gate_proj.weight",
    "blk.{i}.ffn_up.weight": "model.layers.{i}.mlp.up_proj.weight",
    "blk.{i}.ffn_down.weight": "model.layers.{i}.mlp.down_proj.weight",
}


def unpermute_rows(weight: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row permutation. Within each head the converter orders rows as
    (pair index, half) so rotated pairs sit side by side; HF orders them (half, pair index)."""
    rows = weight.shape[0]
    head_dim = rows // n_heads
    grouped = weight.reshape(n_heads, head_dim // 2, 2, *weight.shape[1:])
    return np.ascontiguousarray(grouped.swapaxes(1, 2).reshape(weight.shape))


def hf_name(gguf_name: str) -> str:
    parts = gguf_name.split(".")
    if parts[0] == "blk":
        key = ".".join(["blk", "{i}"] + parts[2:])
        return GGUF_TO_HF[key].format(i=parts[1])
    return GGUF_TO_HF[gguf_name]


def read_with_gguf_package(path: Path):
    """(metadata of scalars, {name: f32 array in numpy shape}) via the gguf package."""
    from gguf import GGUFReader
    from gguf.quants import dequantize

    reader = GGUFReader(str(path))
    metadata = {}
    for key, fld in reader.fields.items():
        if len(fld.types) == 1 and fld.types[0].name != "ARRAY":
            value = fld.parts[fld.data[0]]
            metadata[key] = (bytes(value).decode("utf-8") if fld.types[0].name == "STRING"
                             else value.tolist()[0])
    tensors = {}
    for tensor in reader.tensors:
        values = dequantize(tensor.data, tensor.tensor_type)
        shape = tuple(int(d) for d in reversed(tensor.shape.tolist()))
        tensors[tensor.name] = np.asarray(values, dtype=np.float32).reshape(shape)
    return metadata, tensors


def read_with_candle_web(path: Path):
    """The same, through candle-web's own reader (checked bit-exact against gguf.quants in
    tests/quantized); faster, used by the tests to derive the checkpoint on the fly."""
    from candle_web.io.gguf import GgufFile

    gguf = GgufFile(path)
    metadata = {k: v for k, v in gguf.metadata.items() if isinstance(v, (int, float, str))}
    return metadata, {name: gguf.qtensor(name).dequantize() for name in gguf.tensors}


def hf_config(metadata: dict, tensors: dict) -> dict:
    arch = metadata["general.architecture"]
    heads = int(metadata[f"{arch}.attention.head_count"])
    hidden = int(metadata[f"{arch}.embedding_length"])
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": int(tensors["token_embd.weight"].shape[0]),
        "hidden_size": hidden,
        "intermediate_size": int(metadata[f"{arch}.feed_forward_length"]),
        "num_hidden_layers": int(metadata[f"{arch}.block_count"]),
        "num_attention_heads": heads,
        "num_key_value_heads": int(metadata[f"{arch}.attention.head_count_kv"]),
        "head_dim": hidden // heads,
        "hidden_act": "silu",
        "rms_norm_eps": float(metadata[f"{arch}.attention.layer_norm_rms_epsilon"]),
        "rope_theta": float(metadata[f"{arch}.rope.freq_base"]),
        "max_position_embeddings": int(metadata[f"{arch}.context_length"]),
        "tie_word_embeddings": "output.weight" not in tensors,
        "attention_bias": False,
        "mlp_bias": False,
        "bos_token_id": int(metadata["tokenizer.ggml.bos_token_id"]),
        "eos_token_id": int(metadata["tokenizer.ggml.eos_token_id"]),
        "torch_dtype": "float32",
    }


def write_hf_checkpoint(metadata: dict, tensors: dict, out_dir: Path) -> dict:
    """model.safetensors + config.json in `out_dir`; returns the config."""
    from safetensors.numpy import save_file

    out_dir.mkdir(parents=True, exist_ok=True)
    config = hf_config(metadata, tensors)
    state = {}
    for name, values in tensors.items():
        if name.endswith("attn_q.weight"):
            values = unpermute_rows(values, config["num_attention_heads"])
        elif name.endswith("attn_k.weight"):
            values = unpermute_rows(values, config["num_key_value_heads"])
        state[hf_name(name)] = np.ascontiguousarray(values, dtype=np.float32)
    save_file(state, str(out_dir / "model.safetensors"))
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))
    return config


def load_transformers_model(folder: Path):
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM.from_pretrained(str(folder), torch_dtype=torch.float32,
                                             attn_implementation="eager")
    return model.eval()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--work", type=Path, default=Path("/tmp/candle-web-llama-reference"))
    args = parser.parse_args(argv)

    import torch
    import transformers
    from transformers import AutoTokenizer

    from candle_web import hub

    gguf_path = hub.fetch(MODEL, GGUF_NAME)
    started = time.perf_counter()
    metadata, tensors = read_with_gguf_package(gguf_path)
    config = write_hf_checkpoint(metadata, tensors, args.work)
    del tensors
    # transformers builds its tokenizer from the GGUF vocabulary (its own converter).
    (args.work / gguf_path.name).unlink(missing_ok=True)
    (args.work / gguf_path.name).symlink_to(gguf_path)
    tokenizer = AutoTokenizer.from_pretrained(str(args.work), gguf_file=gguf_path.name)
    (args.work / gguf_path.name).unlink()
    tokenizer.save_pretrained(str(args.work))
    print(f"derived checkpoint in {time.perf_counter() - started:.1f} s", file=sys.stderr)

    model = load_transformers_model(args.work)
    records = []
    for name, kind, text in PROMPTS:
        if kind == "chat":
            prompt = tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                                   tokenize=False, add_generation_prompt=True)
            prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        else:
            prompt = text
            prompt_ids = tokenizer(prompt)["input_ids"]
        record = greedy_record(model, tokenizer, prompt, prompt_ids, MAX_NEW_TOKENS,
                               config["eos_token_id"])
        records.append({"name": name, "kind": kind, "text": text, **record})
        print(f"{name}: {record['generated_text']!r}", file=sys.stderr)
    out = {
        "model": MODEL, "file": GGUF_NAME, "max_new_tokens": MAX_NEW_TOKENS,
        "reference": (f"transformers {transformers.__version__} LlamaForCausalLM (torch "
                      f"{torch.__version__}, f32, eager attention) on the GGUF dequantized by "
                      "gguf.quants, Q/K un-permuted"),
        "config": config, "prompts": records,
    }
    args.out.write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
