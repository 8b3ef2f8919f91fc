"""ONNX exports of candle-web's own checkpoints, for the transformers.js peer of bench/browser.py.

    .venv/bin/python scripts/export_onnx.py [--models whisper-tiny.en,smollm2-135m-instruct]
                                            [--q8] [--verify] [--force] [--json]

The peer must run the same weights as candle-web, and no ONNX file of them can be fetched here,
so they are exported locally from the registry's files (the model cache, models/fetch.py):
  * whisper-tiny.en: the CTranslate2 model.bin (float16), widened to float32 exactly, into a
    small PyTorch module of Whisper's computation, exported with torch.onnx (TorchScript
    exporter, opset 17) as `onnx/encoder_model.onnx` (input_features -> last_hidden_state) and
    `onnx/decoder_model_merged.onnx` (one graph for the first step and the steps with past key
    values; see WhisperDecoderStep for how it avoids optimum's If node).
  * smollm2-135m-instruct: the GGUF Q4_1 file, dequantized by `transformers` (gguf_file=, with
    its Q/K un-permutation), into `onnx/model.onnx` with past key values (text generation with
    past), inputs input_ids, attention_mask, position_ids, past_key_values.N.key/value.
Next to them: config.json, generation_config.json, tokenizer.json, tokenizer_config.json (and
preprocessor_config.json for Whisper), the file layout transformers.js 4.x loads with
`env.localModelPath`. --q8 adds `onnx/*_quantized.onnx` (transformers.js's dtype "q8": dynamic
int8 MatMul weights from onnxruntime.quantization.quantize_dynamic).

Cache: <model cache>/onnx/<model>/<first 16 hex of the source file's sha256>-<EXPORTER_TAG>/,
EXPORTER_TAG naming this script's format version, torch's version and the opset; export.json is
written last (provenance and every file's sha256), so a folder without it is incomplete and is
rebuilt; a second run only reads export.json (torch is not imported).

After a fresh export the graphs run in onnxruntime, greedily, on the first LibriVox clip / the
Generate prompt, and their token ids are compared with candle-web's numpy backend on the same
input (the same log-mel features for Whisper); --verify does it on every LibriVox clip. The
first difference is printed with onnxruntime's top-2 logit margin there. Exit status 1 when
the fp32 ids differ (a q8 graph's weights are re-quantized: its differences are reported only).

Needs the `bench` extra: `pip install -e '.[bench]'` (onnx, onnxruntime) on top of `dev` (torch,
transformers, gguf).
"""
from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "pkg"))

# Bump when the graphs or the side files change: the cache key includes it.
EXPORT_FORMAT_VERSION = 1
OPSET = 17
WHISPER_MODELS = ("whisper-tiny.en",)
LLAMA_MODEL = "smollm2-135m-instruct"
MODELS = WHISPER_MODELS + (LLAMA_MODEL,)
MARKER = "export.json"
SAMPLES_DIR = REPO / "web" / "vendor" / "samples"
# Whisper's special tokens (English-only vocabulary of 51864 ids).
SOT, EOT, NO_TIMESTAMPS = 50257, 50256, 50362
SPACE = 220  # "Ġ": suppressed at the first step, with EOT (openai-whisper's SuppressBlank)
FILES_NEEDED = {
    "whisper": ("config.json", "generation_config.json", "preprocessor_config.json",
                "tokenizer.json", "tokenizer_config.json", "onnx/encoder_model.onnx",
                "onnx/decoder_model_merged.onnx"),
    "llama": ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
              "onnx/model.onnx"),
}
QUANTIZED = {"whisper": ("onnx/encoder_model_quantized.onnx",
                         "onnx/decoder_model_merged_quantized.onnx"),
             "llama": ("onnx/model_quantized.onnx",)}


class ExportError(Exception):
    """An export that cannot be made here; the message says why."""


def log(message: str) -> None:
    print(f"[export_onnx] {message}", file=sys.stderr, flush=True)


def exporter_tag() -> str:
    try:
        torch_version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        torch_version = "none"
    return f"x{EXPORT_FORMAT_VERSION}-torch{torch_version}-opset{OPSET}"


def source_file(model: str) -> tuple[str, str]:
    """(file name, sha256) of the registry file the export is made from."""
    from candle_web.hub import default_registry

    entry = default_registry()[model]
    name = "model.bin" if entry.kind == "whisper" else next(
        file.name for file in entry.files if file.name.endswith(".gguf"))
    return name, entry.file(name).sha256


def export_folder(model: str) -> Path:
    """Where the export of `model` lives in the cache (whether or not it exists yet)."""
    from candle_web import hub

    if model not in MODELS:
        raise ExportError(f"--models: {model!r} has no ONNX export here (known: {MODELS})")
    _, sha256 = source_file(model)
    return hub.cache_dir() / "onnx" / model / f"{sha256[:16]}-{exporter_tag()}"


def kind_of(model: str) -> str:
    return "whisper" if model in WHISPER_MODELS else "llama"


def cached_export(model: str, q8: bool = False) -> dict | None:
    """export.json of a complete cached export (with the q8 files when asked), else None."""
    folder = export_folder(model)
    marker = folder / MARKER
    if not marker.is_file():
        return None
    info = json.loads(marker.read_text())
    wanted = FILES_NEEDED[kind_of(model)] + (QUANTIZED[kind_of(model)] if q8 else ())
    if not all(name in info["files"] and (folder / name).is_file() for name in wanted):
        return None
    info["folder"] = str(folder)
    return info


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_json(path: Path, value) -> None:
    path.write_text(json.dumps(value, indent=2) + "\n")


# --- Whisper --------------------------------------------------------------------------------

def tied_logits(x, embed):
    """x [B, T, D] @ embed^T, 2-D in the middle so share_tied_embedding can make it a Gemm."""
    from torch.nn import functional as F

    return F.linear(x.flatten(0, 1), embed).reshape(x.shape[0], x.shape[1], embed.shape[0])


def share_tied_embedding(path: Path, embedding: str) -> None:
    """The exporter folds embed^T into a second initializer (80 MB for Whisper, 113 MB for
    SmolLM2): make that MatMul a Gemm(transB=1) on the embedding the Gather already holds."""
    import numpy as np
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(str(path))
    graph = model.graph
    initializers = {tensor.name: tensor for tensor in graph.initializer}
    table = numpy_helper.to_array(initializers[embedding])
    for index, node in enumerate(graph.node):
        if node.op_type != "MatMul" or node.input[1] not in initializers:
            continue
        candidate = initializers[node.input[1]]
        if tuple(candidate.dims) != table.shape[::-1]:
            continue
        if not np.array_equal(numpy_helper.to_array(candidate), table.T):
            continue
        gemm = helper.make_node("Gemm", [node.input[0], embedding], list(node.output),
                                name=node.name + "_tied", transB=1)
        graph.node.remove(node)
        graph.node.insert(index, gemm)
        graph.initializer.remove(candidate)
        onnx.save(model, str(path))
        return
    raise ExportError(f"{path.name}: no MatMul on the transposed {embedding!r} to share")


def whisper_torch_modules(ct2):
    """(encoder, decoder step) torch modules holding the CTranslate2 weights as float32."""
    import torch
    from torch import nn
    from torch.nn import functional as F

    def tensor(name):
        return nn.Parameter(torch.from_numpy(ct2.get_f32(name).copy()), requires_grad=False)

    def linear(prefix, bias=True):
        layer = nn.Linear(1, 1, bias=bias)
        layer.weight = tensor(f"{prefix}/weight")
        layer.in_features, layer.out_features = layer.weight.shape[1], layer.weight.shape[0]
        if bias:
            layer.bias = tensor(f"{prefix}/bias")
        return layer

    def layer_norm(prefix):
        norm = nn.LayerNorm(ct2[f"{prefix}/gamma"].shape[0], eps=1e-5)
        norm.weight, norm.bias = tensor(f"{prefix}/gamma"), tensor(f"{prefix}/beta")
        return norm

    def count_layers(side):
        count = 0
        while f"{side}/layer_{count}/ffn/linear_0/weight" in ct2:
            count += 1
        return count

    heads = int(ct2.scalar("encoder/num_heads"))
    if int(ct2.scalar("decoder/num_heads")) != heads:
        raise ExportError("encoder and decoder head counts differ: not a Whisper checkpoint")

    d_head = ct2["decoder/embeddings/weight"].shape[1] // heads

    def split_heads(x):  # [B, T, D] -> [B, H, T, D/H]; no -1: T may be 0 (see below)
        return x.unflatten(-1, (heads, d_head)).transpose(1, 2)

    def merge_heads(x):  # [B, H, T, D/H] -> [B, T, D]
        return x.transpose(1, 2).flatten(2)

    def attend(q, k, v, mask=None):
        scores = q @ k.transpose(-1, -2) * (q.shape[-1] ** -0.5)
        if mask is not None:
            scores = scores + mask
        return torch.softmax(scores, dim=-1) @ v

    class Mlp(nn.Module):
        def __init__(self, prefix):
            super().__init__()
            self.norm = layer_norm(f"{prefix}/layer_norm")
            self.fc1, self.fc2 = linear(f"{prefix}/linear_0"), linear(f"{prefix}/linear_1")

        def forward(self, x):
            return x + self.fc2(F.gelu(self.fc1(self.norm(x))))

    class EncoderLayer(nn.Module):
        def __init__(self, index):
            super().__init__()
            prefix = f"encoder/layer_{index}"
            self.norm = layer_norm(f"{prefix}/self_attention/layer_norm")
            self.qkv = linear(f"{prefix}/self_attention/linear_0")  # fused q|k|v, k bias 0
            self.out = linear(f"{prefix}/self_attention/linear_1")
            self.mlp = Mlp(f"{prefix}/ffn")

        def forward(self, x):
            q, k, v = (split_heads(part) for part in self.qkv(self.norm(x)).chunk(3, dim=-1))
            return self.mlp(x + self.out(merge_heads(attend(q, k, v))))

    class Encoder(nn.Module):
        """input_features [B, 80, 3000] -> last_hidden_state [B, 1500, 384]."""

        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv1d(1, 1, 3, padding=1)
            self.conv2 = nn.Conv1d(1, 1, 3, stride=2, padding=1)
            for conv in ("conv1", "conv2"):
                module = getattr(self, conv)
                module.weight = tensor(f"encoder/{conv}/weight")
                module.bias = tensor(f"encoder/{conv}/bias")
                module.in_channels, module.out_channels = (module.weight.shape[1],
                                                           module.weight.shape[0])
            self.positions = tensor("encoder/position_encodings/encodings")
            self.layers = nn.ModuleList(EncoderLayer(i) for i in range(count_layers("encoder")))
            self.norm = layer_norm("encoder/layer_norm")

        def forward(self, input_features):
            x = F.gelu(self.conv2(F.gelu(self.conv1(input_features)))).transpose(1, 2)
            x = x + self.positions[: x.shape[1]]
            for layer in self.layers:
                x = layer(x)
            return self.norm(x)

    class DecoderLayer(nn.Module):
        def __init__(self, index):
            super().__init__()
            prefix = f"decoder/layer_{index}"
            self.self_norm = layer_norm(f"{prefix}/self_attention/layer_norm")
            self.self_qkv = linear(f"{prefix}/self_attention/linear_0")
            self.self_out = linear(f"{prefix}/self_attention/linear_1")
            self.cross_norm = layer_norm(f"{prefix}/attention/layer_norm")
            self.cross_q = linear(f"{prefix}/attention/linear_0")
            self.cross_kv = linear(f"{prefix}/attention/linear_1")  # fused k|v, k bias 0
            self.cross_out = linear(f"{prefix}/attention/linear_2")
            self.mlp = Mlp(f"{prefix}/ffn")

        def forward(self, x, mask, past_k, past_v, past_cross_k, past_cross_v, audio):
            q, k, v = (split_heads(part)
                       for part in self.self_qkv(self.self_norm(x)).chunk(3, dim=-1))
            k, v = torch.cat([past_k, k], dim=2), torch.cat([past_v, v], dim=2)
            x = x + self.self_out(merge_heads(attend(q, k, v, mask)))
            # The audio rows not yet in the cross cache: all 1500 at the first step, none after
            # (a projection of zero rows), so the steps with past never recompute them.
            fresh = audio[:, past_cross_k.shape[2]:]
            new_k, new_v = (split_heads(part) for part in self.cross_kv(fresh).chunk(2, dim=-1))
            cross_k = torch.cat([past_cross_k, new_k], dim=2)
            cross_v = torch.cat([past_cross_v, new_v], dim=2)
            q = split_heads(self.cross_q(self.cross_norm(x)))
            x = x + self.cross_out(merge_heads(attend(q, cross_k, cross_v)))
            return self.mlp(x), k, v, cross_k, cross_v

    class WhisperDecoderStep(nn.Module):
        """transformers.js's decoder_model_merged contract without optimum's If node.

        optimum merges a no-past and a with-past graph under `use_cache_branch`; transformers.js
        feeds that input only when the graph has it. At the first step it feeds zero-length
        past tensors (the metadata shape with its symbolic dims set to 0), so one graph serves
        both: the self-attention concatenates the (empty) past, and the cross-attention
        projects only the audio frames beyond its cached length. Same arithmetic per step as
        optimum's two branches."""

        def __init__(self):
            super().__init__()
            self.embed = tensor("decoder/embeddings/weight")
            self.positions = tensor("decoder/position_encodings/encodings")
            self.layers = nn.ModuleList(DecoderLayer(i) for i in range(count_layers("decoder")))
            self.norm = layer_norm("decoder/layer_norm")

        def forward(self, input_ids, encoder_hidden_states, *past):
            past_length = past[0].shape[2]
            steps = input_ids.shape[1]
            x = self.embed[input_ids] + self.positions[past_length: past_length + steps]
            rows = torch.arange(steps).unsqueeze(1) + past_length
            columns = torch.arange(steps + past_length).unsqueeze(0)
            mask = torch.where(columns > rows, float("-inf"), 0.0)
            presents = []
            for index, layer in enumerate(self.layers):
                x, k, v, cross_k, cross_v = layer(x, mask, *past[4 * index: 4 * index + 4],
                                                  encoder_hidden_states)
                presents += [k, v, cross_k, cross_v]
            return (tied_logits(self.norm(x), self.embed), *presents)

    return Encoder().eval(), WhisperDecoderStep().eval(), count_layers("decoder"), heads


def whisper_side_files(folder: Path, ct2, ct2_config: dict, tokenizer_json: Path, layers: int,
                       heads: int) -> None:
    """config.json, generation_config.json, preprocessor_config.json, tokenizer files."""
    d_model = ct2["decoder/embeddings/weight"].shape[1]
    vocab = ct2["decoder/embeddings/weight"].shape[0]
    encoder_layers = 0
    while f"encoder/layer_{encoder_layers}/ffn/linear_0/weight" in ct2:
        encoder_layers += 1
    if vocab != 51864:
        raise ExportError(f"vocabulary of {vocab} ids: only the English-only Whisper "
                          "vocabulary (51864) is exported here")
    write_json(folder / "config.json", {
        "model_type": "whisper", "architectures": ["WhisperForConditionalGeneration"],
        "vocab_size": vocab, "num_mel_bins": int(ct2["encoder/conv1/weight"].shape[1]),
        "d_model": int(d_model), "encoder_layers": encoder_layers, "decoder_layers": layers,
        "num_hidden_layers": encoder_layers, "encoder_attention_heads": heads,
        "decoder_attention_heads": heads, "encoder_ffn_dim": 4 * int(d_model),
        "decoder_ffn_dim": 4 * int(d_model), "max_source_positions": 1500,
        "max_target_positions": 448, "activation_function": "gelu", "scale_embedding": False,
        "is_encoder_decoder": True, "use_cache": True, "pad_token_id": EOT,
        "bos_token_id": SOT, "eos_token_id": EOT, "decoder_start_token_id": SOT,
        "tie_word_embeddings": True, "torch_dtype": "float32",
    })
    write_json(folder / "generation_config.json", {
        "alignment_heads": ct2_config.get("alignment_heads", []),
        "begin_suppress_tokens": ct2_config.get("suppress_ids_begin", [SPACE, EOT]),
        "suppress_tokens": ct2_config["suppress_ids"],
        "bos_token_id": SOT, "decoder_start_token_id": SOT, "eos_token_id": EOT,
        "pad_token_id": EOT, "is_multilingual": False, "max_initial_timestamp_index": 50,
        "max_length": 448, "no_timestamps_token_id": NO_TIMESTAMPS, "return_timestamps": False,
    })
    write_json(folder / "preprocessor_config.json", {
        "feature_extractor_type": "WhisperFeatureExtractor", "processor_class": "WhisperProcessor",
        "chunk_length": 30, "feature_size": 80, "hop_length": 160, "n_fft": 400,
        "n_samples": 480000, "nb_max_frames": 3000, "padding_side": "right",
        "padding_value": 0.0, "return_attention_mask": False, "sampling_rate": 16000,
    })
    shutil.copyfile(tokenizer_json, folder / "tokenizer.json")
    write_json(folder / "tokenizer_config.json", {
        "tokenizer_class": "WhisperTokenizer", "model_max_length": 1024,
        "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>",
        "unk_token": "<|endoftext|>", "pad_token": "<|endoftext|>",
        "add_prefix_space": False, "clean_up_tokenization_spaces": True,
        "errors": "replace",
    })


def export_whisper(model: str, folder: Path) -> dict:
    import torch

    from candle_web import hub
    from candle_web.io.ct2 import read_ct2

    paths = {name: hub.fetch(model, name, offline=hub.is_offline())
             for name in ("model.bin", "config.json", "tokenizer.json")}
    ct2 = read_ct2(str(paths["model.bin"]))
    ct2_config = json.loads(Path(paths["config.json"]).read_text())
    encoder, decoder, layers, heads = whisper_torch_modules(ct2)
    whisper_side_files(folder, ct2, ct2_config, Path(paths["tokenizer.json"]), layers, heads)
    (folder / "onnx").mkdir()
    d_head = ct2["decoder/embeddings/weight"].shape[1] // heads
    with torch.no_grad():
        features = torch.zeros(1, 80, 3000)
        torch.onnx.export(encoder, (features,), str(folder / "onnx" / "encoder_model.onnx"),
                          dynamo=False, opset_version=OPSET, input_names=["input_features"],
                          output_names=["last_hidden_state"],
                          dynamic_axes={"input_features": {0: "batch_size"},
                                        "last_hidden_state": {0: "batch_size"}})
        audio = encoder(features)
        past_names, present_names, past, axes = [], [], [], {}
        for index in range(layers):
            for side, length in (("decoder", 3), ("encoder", 0)):
                for part in ("key", "value"):
                    name = f"past_key_values.{index}.{side}.{part}"
                    out = f"present.{index}.{side}.{part}"
                    past_names.append(name)
                    present_names.append(out)
                    past.append(torch.zeros(1, heads, length, d_head))
                    sequence = ("past_decoder_sequence_length" if side == "decoder"
                                else "encoder_sequence_length_out")
                    present = ("past_decoder_sequence_length + decoder_sequence_length"
                               if side == "decoder" else "encoder_sequence_length_out")
                    axes[name] = {0: "batch_size", 2: sequence}
                    axes[out] = {0: "batch_size", 2: present}
        # Per layer, in the module's order: self k, self v, cross k, cross v.
        input_ids = torch.tensor([[SOT, NO_TIMESTAMPS]])
        axes.update({"input_ids": {0: "batch_size", 1: "decoder_sequence_length"},
                     "encoder_hidden_states": {0: "batch_size", 1: "encoder_sequence_length"},
                     "logits": {0: "batch_size", 1: "decoder_sequence_length"}})
        torch.onnx.export(decoder, (input_ids, audio, *past),
                          str(folder / "onnx" / "decoder_model_merged.onnx"), dynamo=False,
                          opset_version=OPSET,
                          input_names=["input_ids", "encoder_hidden_states", *past_names],
                          output_names=["logits", *present_names], dynamic_axes=axes)
    share_tied_embedding(folder / "onnx" / "decoder_model_merged.onnx", "embed")
    return {"source": {"model": model, "file": "model.bin",
                       "sha256": source_file(model)[1], "format": "CTranslate2 float16"}}


# --- SmolLM2 (LLaMA) ------------------------------------------------------------------------

def llama_torch_module(hf_model):
    """A decode step over flat past tensors, from a transformers LlamaForCausalLM's weights."""
    import torch
    from torch import nn
    from torch.nn import functional as F

    config = hf_model.config
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    d_head = getattr(config, "head_dim", None) or config.hidden_size // heads
    theta = getattr(config, "rope_theta", None) or config.rope_parameters["rope_theta"]
    eps = config.rms_norm_eps
    state = {name: tensor.detach().float() for name, tensor in hf_model.state_dict().items()}

    def weight(name):
        return nn.Parameter(state[name].contiguous(), requires_grad=False)

    def rms(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w

    def rotate(x, cos, sin):  # the half-split rotation of HF LLaMA (Q/K un-permuted)
        half = x.shape[-1] // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * cos + rotated * sin

    class Layer(nn.Module):
        def __init__(self, index):
            super().__init__()
            prefix = f"model.layers.{index}"
            for short, name in (("ln1", "input_layernorm"), ("ln2", "post_attention_layernorm"),
                                ("wq", "self_attn.q_proj"), ("wk", "self_attn.k_proj"),
                                ("wv", "self_attn.v_proj"), ("wo", "self_attn.o_proj"),
                                ("gate", "mlp.gate_proj"), ("up", "mlp.up_proj"),
                                ("down", "mlp.down_proj")):
                setattr(self, short, weight(f"{prefix}.{name}.weight"))

        def forward(self, x, cos, sin, bias, past_k, past_v):
            h = rms(x, self.ln1)
            q = F.linear(h, self.wq).unflatten(-1, (heads, d_head)).transpose(1, 2)
            k = F.linear(h, self.wk).unflatten(-1, (kv_heads, d_head)).transpose(1, 2)
            v = F.linear(h, self.wv).unflatten(-1, (kv_heads, d_head)).transpose(1, 2)
            q, k = rotate(q, cos, sin), rotate(k, cos, sin)
            k, v = torch.cat([past_k, k], dim=2), torch.cat([past_v, v], dim=2)
            group = heads // kv_heads
            keys = k.repeat_interleave(group, dim=1)
            values = v.repeat_interleave(group, dim=1)
            scores = q @ keys.transpose(-1, -2) * (d_head ** -0.5) + bias
            x = x + F.linear((torch.softmax(scores, -1) @ values).transpose(1, 2).flatten(2),
                             self.wo)
            h = rms(x, self.ln2)
            return x + F.linear(F.silu(F.linear(h, self.gate)) * F.linear(h, self.up),
                                self.down), k, v

    class Step(nn.Module):
        """input_ids, attention_mask [B, past+T], position_ids [B, T], past k/v per layer ->
        logits [B, T, vocab], present k/v (transformers.js's text-generation-with-past)."""

        def __init__(self):
            super().__init__()
            self.embed = weight("model.embed_tokens.weight")
            # transformers' state_dict lists a tied head under lm_head.weight too.
            tied = config.tie_word_embeddings or "lm_head.weight" not in state
            self.head = self.embed if tied else weight("lm_head.weight")
            self.norm = weight("model.norm.weight")
            self.layers = nn.ModuleList(Layer(i) for i in range(config.num_hidden_layers))
            self.register_buffer("inv_freq", 1.0 / theta ** (
                torch.arange(0, d_head, 2, dtype=torch.float32) / d_head), persistent=False)

        def forward(self, input_ids, attention_mask, position_ids, *past):
            x = self.embed[input_ids]
            angles = position_ids.unsqueeze(-1).float() * self.inv_freq  # [B, T, d/2]
            angles = torch.cat([angles, angles], dim=-1).unsqueeze(1)
            cos, sin = angles.cos(), angles.sin()
            past_length = past[0].shape[2]
            steps = input_ids.shape[1]
            rows = torch.arange(steps).unsqueeze(1) + past_length
            columns = torch.arange(steps + past_length).unsqueeze(0)
            causal = columns > rows
            padded = (attention_mask == 0)[:, None, None, :]
            bias = torch.where(causal[None, None] | padded, float("-inf"), 0.0)
            presents = []
            for index, layer in enumerate(self.layers):
                x, k, v = layer(x, cos, sin, bias, past[2 * index], past[2 * index + 1])
                presents += [k, v]
            return (tied_logits(rms(x, self.norm), self.head), *presents)

    return Step().eval(), config, kv_heads, d_head


def load_llama_reference(gguf_path: Path):
    """transformers' LlamaForCausalLM and tokenizer from the GGUF file (dequantized)."""
    try:
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as error:
        raise ExportError(f"transformers is needed to read the GGUF file: {error}") from None
    folder, name = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype="float32")
    return model.eval(), tokenizer


def export_llama(model: str, folder: Path) -> dict:
    import torch

    from candle_web import hub

    gguf_name, sha256 = source_file(model)
    gguf_path = Path(hub.fetch(model, gguf_name, offline=hub.is_offline()))
    hf_model, tokenizer = load_llama_reference(gguf_path)
    step, config, kv_heads, d_head = llama_torch_module(hf_model)
    tokenizer.save_pretrained(str(folder))
    tokenizer_config = json.loads((folder / "tokenizer_config.json").read_text())
    # transformers 5 names its own backend class and the load's locality; transformers.js knows
    # SmolLM2's published class (a byte-level BPE from tokenizer.json either way).
    for key in ("backend", "is_local", "local_files_only"):
        tokenizer_config.pop(key, None)
    tokenizer_config.update(tokenizer_class="GPT2Tokenizer",
                            model_max_length=config.max_position_embeddings)
    write_json(folder / "tokenizer_config.json", tokenizer_config)
    template = folder / "chat_template.jinja"
    if "chat_template" not in tokenizer_config and template.is_file():
        # transformers 5 writes the template beside; transformers.js reads it from here.
        tokenizer_config["chat_template"] = template.read_text()
        write_json(folder / "tokenizer_config.json", tokenizer_config)
    if "chat_template" not in tokenizer_config and tokenizer.chat_template:
        tokenizer_config["chat_template"] = tokenizer.chat_template
        write_json(folder / "tokenizer_config.json", tokenizer_config)
    hf_config = config.to_dict()
    hf_config.update({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                      "use_cache": True, "torch_dtype": "float32"})
    for key in ("dtype", "quantization_config", "_name_or_path", "id2label", "label2id"):
        hf_config.pop(key, None)
    write_json(folder / "config.json", hf_config)
    generation = {"bos_token_id": config.bos_token_id, "eos_token_id": config.eos_token_id,
                  "pad_token_id": config.pad_token_id}
    write_json(folder / "generation_config.json",
               {key: value for key, value in generation.items() if value is not None})
    (folder / "onnx").mkdir()
    names, outs, past, axes = [], [], [], {}
    for index in range(config.num_hidden_layers):
        for part in ("key", "value"):
            names.append(f"past_key_values.{index}.{part}")
            outs.append(f"present.{index}.{part}")
            past.append(torch.zeros(1, kv_heads, 3, d_head))
            axes[names[-1]] = {0: "batch_size", 2: "past_sequence_length"}
            axes[outs[-1]] = {0: "batch_size", 2: "total_sequence_length"}
    axes.update({"input_ids": {0: "batch_size", 1: "sequence_length"},
                 "attention_mask": {0: "batch_size", 1: "total_sequence_length"},
                 "position_ids": {0: "batch_size", 1: "sequence_length"},
                 "logits": {0: "batch_size", 1: "sequence_length"}})
    input_ids = torch.tensor([[1, 2]])
    with torch.no_grad():
        torch.onnx.export(step, (input_ids, torch.ones(1, 5, dtype=torch.int64),
                                 torch.tensor([[3, 4]]), *past),
                          str(folder / "onnx" / "model.onnx"), dynamo=False, opset_version=OPSET,
                          input_names=["input_ids", "attention_mask", "position_ids", *names],
                          output_names=["logits", *outs], dynamic_axes=axes)
    if step.head is step.embed:
        share_tied_embedding(folder / "onnx" / "model.onnx", "embed")
    return {"source": {"model": model, "file": gguf_name, "sha256": sha256,
                       "format": "GGUF Q4_1, dequantized to float32 by transformers "
                                 f"{importlib.metadata.version('transformers')}"}}


# --- q8 ------------------------------------------------------------------------------------

def quantize_q8(folder: Path, kind: str) -> None:
    """onnx/X_quantized.onnx: 8-bit weights of the MatMul, Gemm and Gather (embedding) nodes,
    activations quantized per call (onnxruntime's dynamic quantization)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    for quantized in QUANTIZED[kind]:
        source = folder / quantized.replace("_quantized", "")
        quantize_dynamic(str(source), str(folder / quantized), weight_type=QuantType.QInt8,
                         op_types_to_quantize=["MatMul", "Gemm", "Gather"], per_channel=False,
                         reduce_range=False, extra_options={"EnableSubgraph": True})


# --- verification ----------------------------------------------------------------------------

def ort_session(path: Path):
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    return onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def first_difference(a: list, b: list):
    for index, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return index
    return None if len(a) == len(b) else min(len(a), len(b))


def verify_whisper(model: str, folder: Path, variant: str = "", all_clips: bool = False) -> dict:
    """ORT greedy ids vs candle-web numpy greedy ids (no timestamps) on the first LibriVox clip
    (all of them with all_clips), from the same log-mel features."""
    os.environ.setdefault("CANDLE_WEB_BACKEND", "numpy")
    from candle_web.pipelines import load_whisper

    loaded = load_whisper(model)
    cw_model, tokenizer = loaded.model, loaded.tokenizer
    generation = json.loads((folder / "generation_config.json").read_text())
    encoder = ort_session(folder / "onnx" / f"encoder_model{variant}.onnx")
    decoder = ort_session(folder / "onnx" / f"decoder_model_merged{variant}.onnx")
    clips = [whisper_clip_check(clip, cw_model, tokenizer, encoder, decoder, generation)
             for clip in clip_paths()[: None if all_clips else 1]]
    equal = sum(clip["equal"] for clip in clips)
    differences = "; ".join(f"{clip['clip']}: first at {clip['firstDifference']} (ORT margin "
                            f"{clip['ortMarginThere']})" for clip in clips if not clip["equal"])
    return {"variant": variant or "fp32", "equal": equal == len(clips), "clips": clips,
            "summary": f"{equal}/{len(clips)} LibriVox clip(s) with equal token ids "
                       f"({sum(len(clip['ortTokens']) for clip in clips)} tokens)"
                       + (f"; {differences}" if differences else "")}


def whisper_clip_check(clip: Path, cw_model, tokenizer, encoder, decoder, generation) -> dict:
    import numpy as np

    from candle_web import Tensor
    from candle_web.io import audio
    from candle_web.pipelines.transcribe import TranscribeOptions, transcribe

    samples = audio.load_audio(str(clip))
    options = TranscribeOptions(temperatures=(0.0,), without_timestamps=True)
    transcript = transcribe(cw_model, tokenizer, samples, options)
    want = [token for segment in transcript.segments for token in segment.tokens]
    mel = audio.pad_or_trim(audio.log_mel_spectrogram(samples), audio.N_FRAMES)
    audio_states = encoder.run(None, {"input_features": mel[None].astype(np.float32)})[0]
    reference_states = cw_model.encode(Tensor.from_numpy(mel[None])).to_numpy()
    feeds = {"encoder_hidden_states": audio_states}
    for meta in decoder.get_inputs():
        if meta.name.startswith("past_key_values"):
            feeds[meta.name] = np.zeros((1, meta.shape[1], 0, meta.shape[3]), np.float32)
    prompt = [SOT, NO_TIMESTAMPS]
    tokens, margins, ids = [], [], np.array([prompt], dtype=np.int64)
    suppress = np.array(generation["suppress_tokens"], dtype=np.int64)
    begin = np.array(generation["begin_suppress_tokens"], dtype=np.int64)
    outputs = [meta.name for meta in decoder.get_outputs()]
    for step in range(224):
        results = dict(zip(outputs, decoder.run(None, dict(feeds, input_ids=ids))))
        logits = results["logits"][0, -1].astype(np.float64)
        logits[suppress] = -np.inf
        if step == 0:
            logits[begin] = -np.inf
        best = int(np.argmax(logits))
        ordered = np.sort(logits)
        margins.append(float(ordered[-1] - ordered[-2]))
        if best == EOT:
            break
        tokens.append(best)
        for name, value in results.items():
            if name.startswith("present"):
                feeds[name.replace("present", "past_key_values")] = value
        ids = np.array([[best]], dtype=np.int64)
    diff = first_difference(tokens, want)
    report = {"clip": clip.name, "ortTokens": tokens,
              "candleTokens": want, "equal": diff is None,
              "encoderMaxAbsDiff": float(np.max(np.abs(audio_states - reference_states))),
              "text": tokenizer.decode(tokens)}
    if diff is not None:
        report["firstDifference"] = diff
        report["ortMarginThere"] = margins[diff] if diff < len(margins) else None
    return report


def verify_llama(model: str, folder: Path, tokens: int = 32, variant: str = "") -> dict:
    """ORT greedy ids vs candle-web numpy greedy ids on the Generate prompt (ChatML)."""
    import numpy as np

    prompt_text = "Write a long story about a lighthouse keeper and a lost whale."
    native = llama_native_ids(model, prompt_text, tokens)
    session = ort_session(folder / "onnx" / f"model{variant}.onnx")
    inputs = {meta.name: meta for meta in session.get_inputs()}
    outputs = [meta.name for meta in session.get_outputs()]
    prompt = native["promptIds"]
    feeds = {name: np.zeros((1, meta.shape[1], 0, meta.shape[3]), np.float32)
             for name, meta in inputs.items() if name.startswith("past_key_values")}
    ids, produced, margins, length = list(prompt), [], [], 0
    step_ids = np.array([ids], dtype=np.int64)
    for _ in range(tokens):
        steps = step_ids.shape[1]
        feeds.update(input_ids=step_ids,
                     attention_mask=np.ones((1, length + steps), dtype=np.int64),
                     position_ids=np.arange(length, length + steps, dtype=np.int64)[None])
        results = dict(zip(outputs, session.run(None, feeds)))
        logits = results["logits"][0, -1].astype(np.float64)
        ordered = np.sort(logits)
        margins.append(float(ordered[-1] - ordered[-2]))
        best = int(np.argmax(logits))
        produced.append(best)
        length += steps
        for name, value in results.items():
            if name.startswith("present"):
                feeds[name.replace("present", "past_key_values")] = value
        if best in native["eos"]:
            break
        step_ids = np.array([[best]], dtype=np.int64)
    want = native["tokenIds"][: len(produced)]
    diff = first_difference(produced, want)
    report = {"variant": variant or "fp32", "ortTokens": produced, "candleTokens": want,
              "equal": diff is None, "promptTokens": len(prompt),
              "summary": f"{len(produced)} greedy token(s) on the Generate prompt, "
                         + ("equal" if diff is None else
                            f"first difference at {diff} (ORT margin {margins[diff]})")}
    if diff is not None:
        report["firstDifference"] = diff
        report["ortMarginThere"] = margins[diff]
    return report


def llama_native_ids(model: str, prompt: str, tokens: int) -> dict:
    """candle-web's greedy ChatML generation (numpy backend), as the Generate view runs it."""
    script = REPO / "tests" / "ui" / "native_text_models.py"
    from candle_web import hub

    gguf = hub.fetch(model, source_file(model)[0], offline=True)
    job = {"task": "generate", "gguf": str(gguf), "prompt": prompt, "chat": True,
           "options": {"maxTokens": tokens, "temperature": 0, "seed": 299792458,
                       "repeatPenalty": 1}}
    import subprocess

    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as jobs:
        json.dump([job], jobs)
    try:
        env = dict(os.environ, CANDLE_WEB_BACKEND="numpy", OPENBLAS_NUM_THREADS="1")
        done = subprocess.run([sys.executable, str(script), jobs.name], env=env,
                              capture_output=True, text=True, check=False)
    finally:
        os.unlink(jobs.name)
    if done.returncode != 0:
        raise ExportError(f"native generation failed:\n{done.stderr[-2000:]}")
    result = json.loads(done.stdout)["results"][0]
    from candle_web.pipelines import load_llama

    tokenizer = load_llama(model).tokenizer
    eos = {tokenizer.token_to_id(name) for name in ("<|im_end|>", "<|endoftext|>")} - {None}
    return {"promptIds": result["promptIds"], "tokenIds": result["tokenIds"], "eos": eos}


def clip_paths() -> list[Path]:
    manifest = json.loads((SAMPLES_DIR / "manifest.json").read_text())
    clips = [SAMPLES_DIR / clip["file"] for clip in manifest["clips"] if clip["librivox"]]
    if not clips:
        raise ExportError(f"no LibriVox clip in {SAMPLES_DIR}: run scripts/vendor_samples.py")
    return clips


# --- driver ----------------------------------------------------------------------------------

def ensure_export(model: str, q8: bool = False, force: bool = False, verify: bool = False) -> dict:
    """export.json (with "folder") of the cached export of `model`, made now if needed."""
    kind = kind_of(model)
    folder = export_folder(model)
    # After an export, one clip; asked for (--verify), every LibriVox clip.
    quick = verify_whisper if kind == "whisper" else verify_llama
    full = (lambda *args, **kw: verify_whisper(*args, all_clips=True, **kw)) \
        if kind == "whisper" else verify_llama
    info = None if force else cached_export(model)
    reports = []
    if info is None:
        started = time.perf_counter()
        log(f"exporting {model} -> {folder}")
        folder.parent.mkdir(parents=True, exist_ok=True)
        building = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
        try:
            exported = export_whisper(model, building) if kind == "whisper" else \
                export_llama(model, building)
            finish(building, exported, time.perf_counter() - started)
            log(f"exported {model} in {time.perf_counter() - started:.1f} s; verifying")
            reports.append(quick(model, building))  # before it is cached: raises if unusable
            if folder.exists():
                shutil.rmtree(folder)
            building.rename(folder)
        finally:
            shutil.rmtree(building, ignore_errors=True)
    elif verify:
        reports.append(full(model, folder))
    if q8 and (cached_export(model, q8=True) is None or (force and not reports)):
        started = time.perf_counter()
        log(f"quantizing {model} (q8)")
        quantize_q8(folder, kind)
        info = json.loads((folder / MARKER).read_text())
        for name in QUANTIZED[kind]:
            info["files"][name] = file_sha256(folder / name)
        info["q8"] = {"onnxruntime": importlib.metadata.version("onnxruntime"),
                      "seconds": time.perf_counter() - started,
                      "how": "quantize_dynamic, 8-bit weights of MatMul/Gemm/Gather, per tensor"}
        write_json(folder / MARKER, info)
        reports.append(quick(model, folder, variant="_quantized"))
    elif q8 and verify:
        reports.append(full(model, folder, variant="_quantized"))
    if reports:
        stored = json.loads((folder / MARKER).read_text())
        stored.setdefault("verify", {}).update(
            {report["variant"]: without_token_lists(report) for report in reports})
        write_json(folder / MARKER, stored)
    info = cached_export(model, q8=q8)
    for report in reports:
        log(f"verify {model} {report['variant']} against candle-web numpy: token ids "
            f"{'EQUAL' if report['equal'] else 'DIFFER'}: {report['summary']}")
    return info


def without_token_lists(report: dict) -> dict:
    """A verification report for export.json: the id lists left out (they are long)."""
    out = {key: value for key, value in report.items() if key not in ("ortTokens", "candleTokens")}
    if "clips" in out:
        out["clips"] = [without_token_lists(clip) for clip in out["clips"]]
    return out


def finish(folder: Path, exported: dict, seconds: float) -> dict:
    import onnx

    files = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            if path.suffix == ".onnx":
                onnx.checker.check_model(str(path))
            files[path.relative_to(folder).as_posix()] = file_sha256(path)
    info = dict(exported, exporter=exporter_tag(), opset=OPSET, files=files,
                exportSeconds=seconds, torch=importlib.metadata.version("torch"),
                onnx=importlib.metadata.version("onnx"))
    write_json(folder / MARKER, info)
    return info


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS),
                        help=f"comma-separated, of {', '.join(MODELS)}")
    parser.add_argument("--q8", action="store_true", help="also the *_quantized.onnx files")
    parser.add_argument("--verify", action="store_true",
                        help="compare ORT's greedy ids with candle-web's (done after any export)")
    parser.add_argument("--force", action="store_true", help="export again even if cached")
    parser.add_argument("--json", action="store_true", help="print export.json of each model")
    args = parser.parse_args(argv)
    models = [name.strip() for name in args.models.split(",") if name.strip()]
    unknown = sorted(set(models) - set(MODELS))
    if unknown or not models:
        parser.error(f"--models: unknown {unknown}; choose from {', '.join(MODELS)}")
    status = 0
    for model in models:
        try:
            info = ensure_export(model, q8=args.q8, force=args.force, verify=args.verify)
        except ExportError as error:
            print(f"{model}: not exported: {error}", file=sys.stderr)
            status = 1
            continue
        print(json.dumps(info, indent=1) if args.json else f"{model}: {info['folder']}")
        # A q8 graph may pick other ids (its weights are re-quantized); fp32 must not.
        if not info.get("verify", {}).get("fp32", {"equal": True})["equal"]:
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
