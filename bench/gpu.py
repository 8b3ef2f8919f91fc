"""GPU benchmark: candle-web on CUDA (the cupy backend) next to PyTorch CUDA, in one process.

    python bench/gpu.py [--device cuda|cpu] [--peer auto|transformers|minimal]
                        [--only whisper,llama] [--decode-steps 50] [--json PATH]

Weights are RANDOM, seeded, of the real models' shapes, generated on the fly (a GPU machine gets
only a small copy of the tree; speed does not depend on the weight values):
  * Whisper tiny.en and base: encoder ms for one 30 s window (80 x 3000 mel frames), decoder ms
    per token (greedy, one token per step over the KV cache, cross-attention K/V computed
    before timing; mean over --decode-steps steps).
  * SmolLM2-135M shape: prompt tok/s (128 tokens, one forward) and decode tok/s (greedy, one
    token per step), for candle-web with f32 weights and with Q8_0 / Q4_0 weights
    (QTensor.from_float, multiplied by the backend's quantized kernels), next to torch f32.
The peer is transformers (WhisperForConditionalGeneration / LlamaForCausalLM, sdpa attention)
built from the same weights when importable, else the minimal eager torch models in
bench/_torch_minimal.py; the output says which ran. Timings are synchronised (cupy / torch
device synchronize) and f32 throughout: TF32 is off on both sides.

Correctness, in the same run, on short inputs: candle-web on the target device against
candle-web's numpy reference backend (CPU), and against the torch peer. PASS when
max|a - b| <= 1e-3 * max(1, max|b|) (the values are O(1-10); f32 sums over up to 2k terms in
different orders differ by ~1e-5 relative). The exit status is 1 if any check fails or any
workload raised.

--device cpu runs everything on the CPU (candle-web's default CPU backend, numba when present,
against the numpy reference; torch on CPU): the same code path end to end, for testing the
script without a GPU.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "pkg"), str(REPO / "native"), str(REPO / "bench")]

# bench/run_all.py reads this line and skips the script when no CUDA device is present.
NEEDS_CUDA = True

SEED = 0
TOLERANCE = 1e-3
ENCODER_REPEATS = 5
PROMPT_REPEATS = 3
DEFAULT_DECODE_STEPS = 50
PROMPT_TOKENS = 128
WARMUP_STEPS = 3

# Real shapes (Hugging Face config.json fields).
WHISPER_SHAPES = {
    "whisper-tiny.en": {"d_model": 384, "encoder_layers": 4, "decoder_layers": 4,
                        "encoder_attention_heads": 6, "decoder_attention_heads": 6,
                        "vocab_size": 51864},
    "whisper-base": {"d_model": 512, "encoder_layers": 6, "decoder_layers": 6,
                     "encoder_attention_heads": 8, "decoder_attention_heads": 8,
                     "vocab_size": 51865},
}
WHISPER_MELS, WHISPER_FRAMES, WHISPER_AUDIO_CTX, WHISPER_TEXT_CTX = 80, 3000, 1500, 448
WHISPER_SOT = 50257
# Tokens for the correctness check: start of transcript, then arbitrary ids (the weights are
# random, so any ids do); a 4-token prefix in one call, then one more token over the cache.
WHISPER_CHECK_PREFIX = [WHISPER_SOT, 440, 2068, 7586]
WHISPER_CHECK_NEXT = 318

SMOLLM2_135M = {
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 49152,
    "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
    "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64, "hidden_act": "silu",
    "rms_norm_eps": 1e-5, "rope_theta": 100000.0, "max_position_embeddings": 8192,
    "tie_word_embeddings": True, "attention_bias": False, "mlp_bias": False,
    "bos_token_id": 1, "eos_token_id": 2,
}
LLAMA_QUANT_TYPES = ("Q8_0", "Q4_0")
# 12 prompt tokens reach the quantized kernels' batched (dequantize + GEMM) path, the decode
# step after them the matrix-vector path.
LLAMA_CHECK_PROMPT = 12


# -- devices and timing -------------------------------------------------------------------
@dataclass
class Target:
    """Where candle-web and the torch peer run, and how to wait for each to finish."""

    kind: str  # "cuda" or "cpu"
    candle_device: object
    torch_device: str
    candle_sync: object
    torch_sync: object

    @property
    def label(self) -> str:
        return f"{self.kind} ({self.candle_device.backend.name} backend)"


def make_target(kind: str) -> Target:
    import torch

    from candle_web import Device

    if kind == "cpu":
        return Target("cpu", Device.cpu(), "cpu", lambda: None, lambda: None)
    import cupy

    device = Device.cuda(0)
    device.backend  # fails here, with the reason, when cupy or the device is missing
    if not torch.cuda.is_available():
        raise SystemExit("torch sees no CUDA device; the peer cannot run on the GPU")
    return Target("cuda", device, "cuda:0", cupy.cuda.Device(0).synchronize, torch.cuda.synchronize)


def disable_tf32(torch) -> None:
    """Plain f32 on the torch side, as cupy (no CUPY_TF32) computes."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def median_seconds(fn, sync, repeats: int) -> float:
    fn()  # warm-up: kernel compilation, weight upload, allocator growth
    sync()
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        sync()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def seconds_per_step(step, first_token: int, steps: int, sync) -> float:
    """Mean time of `steps` greedy steps; `step(token) -> next token` reads the argmax back to
    the host each step, as a real decoding loop does."""
    token = first_token
    sync()
    started = time.perf_counter()
    for _ in range(steps):
        token = step(token)
    sync()
    return (time.perf_counter() - started) / steps


# -- results ------------------------------------------------------------------------------
@dataclass
class Report:
    rows: list = field(default_factory=list)  # (workload, metric, candle, peer, higher_is_better)
    checks: list = field(default_factory=list)  # (name, max_abs_diff, bound, passed)
    errors: list = field(default_factory=list)

    def row(self, workload, metric, candle, peer, higher_is_better):
        self.rows.append((workload, metric, candle, peer, higher_is_better))

    def check(self, name, got, want):
        got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
        if got.shape != want.shape:
            self.checks.append((f"{name} (shapes {got.shape} vs {want.shape})", float("inf"),
                                0.0, False))
            print(f"  FAIL {name}: shapes {got.shape} vs {want.shape}")
            return
        diff = float(np.max(np.abs(got - want)))
        bound = TOLERANCE * max(1.0, float(np.max(np.abs(want))))
        passed = bool(diff <= bound)  # NaN compares False: a NaN fails
        self.checks.append((name, diff, bound, passed))
        print(f"  {'PASS' if passed else 'FAIL'} {name}: max|diff| {diff:.2e} (bound {bound:.2e})")


def speedup(candle, peer, higher_is_better) -> float:
    """How many times faster candle-web is (above 1: candle-web faster)."""
    return candle / peer if higher_is_better else peer / candle


def print_tables(report: Report, peer_names: dict, target: Target) -> None:
    print()
    print(f"== candle-web on {target.label} next to PyTorch on {target.torch_device} "
          f"(peer: {', '.join(f'{k}: {v}' for k, v in peer_names.items()) or 'none'})")
    header = f"{'workload':30} {'metric':24} {'candle-web':>11} {'PyTorch':>11} {'speed-up':>9}"
    print(header)
    print("-" * len(header))
    for workload, metric, candle, peer, higher in report.rows:
        ratio = f"{speedup(candle, peer, higher):8.2f}x" if peer else f"{'-':>9}"
        peer_cell = f"{peer:11.2f}" if peer else f"{'-':>11}"
        print(f"{workload:30} {metric:24} {candle:11.2f} {peer_cell} {ratio}")
    print("speed-up = PyTorch time / candle-web time (tok/s: candle-web / PyTorch); "
          "above 1 = candle-web faster")
    print()
    print("== correctness (max|a - b| <= 1e-3 * max(1, max|b|))")
    for name, diff, bound, passed in report.checks:
        print(f"{'PASS' if passed else 'FAIL'}  {name:58} {diff:9.2e} <= {bound:.2e}")
    for error in report.errors:
        print(f"ERROR {error}")
    failed = sum(not c[3] for c in report.checks)
    print(f"{len(report.checks) - failed} passed, {failed} failed, {len(report.errors)} errors")


# -- Whisper ------------------------------------------------------------------------------
def whisper_config(shape: dict) -> dict:
    d = shape["d_model"]
    return {
        "model_type": "whisper", "architectures": ["WhisperForConditionalGeneration"],
        "num_mel_bins": WHISPER_MELS, "encoder_ffn_dim": 4 * d, "decoder_ffn_dim": 4 * d,
        "max_source_positions": WHISPER_AUDIO_CTX, "max_target_positions": WHISPER_TEXT_CTX,
        "activation_function": "gelu", "scale_embedding": False, "tie_word_embeddings": True,
        "pad_token_id": 50256, "bos_token_id": WHISPER_SOT, "eos_token_id": 50256,
        "decoder_start_token_id": WHISPER_SOT, **shape,
    }


def sinusoids(length: int, channels: int) -> np.ndarray:
    """Whisper's fixed encoder positions: sin then cos of position / 10000^(i / (channels/2 - 1))
    (every real checkpoint stores them; a random one must be given the same table)."""
    rates = np.exp(-np.log(10000.0) / (channels // 2 - 1) * np.arange(channels // 2))
    angles = np.arange(length)[:, None] * rates[None, :]
    return np.concatenate([np.sin(angles), np.cos(angles)], axis=1).astype(np.float32)


def whisper_random_state(config: dict, seed: int) -> dict:
    """HF-named f32 weights, scaled so activations stay O(1) and logits O(1-10)."""
    rng = np.random.default_rng(seed)
    d, ffn, vocab = config["d_model"], config["encoder_ffn_dim"], config["vocab_size"]

    def matrix(rows, cols):
        return (rng.standard_normal((rows, cols), dtype=np.float32) / np.sqrt(cols)).astype(np.float32)

    def small(*shape):
        return (0.02 * rng.standard_normal(shape, dtype=np.float32)).astype(np.float32)

    state = {}

    def layer_norm(name):
        state[f"{name}.weight"] = (1.0 + small(d) * 5).astype(np.float32)
        state[f"{name}.bias"] = small(d)

    def linear(name, rows, cols, bias=True):
        state[f"{name}.weight"] = matrix(rows, cols)
        if bias:
            state[f"{name}.bias"] = small(rows)

    def attention(name):
        linear(f"{name}.q_proj", d, d)
        linear(f"{name}.k_proj", d, d, bias=False)  # Whisper's key projection has no bias
        linear(f"{name}.v_proj", d, d)
        linear(f"{name}.out_proj", d, d)

    enc, dec = "model.encoder", "model.decoder"
    state[f"{enc}.conv1.weight"] = (rng.standard_normal((d, WHISPER_MELS, 3), dtype=np.float32)
                                    / np.sqrt(3 * WHISPER_MELS)).astype(np.float32)
    state[f"{enc}.conv1.bias"] = small(d)
    state[f"{enc}.conv2.weight"] = (rng.standard_normal((d, d, 3), dtype=np.float32)
                                    / np.sqrt(3 * d)).astype(np.float32)
    state[f"{enc}.conv2.bias"] = small(d)
    state[f"{enc}.embed_positions.weight"] = sinusoids(WHISPER_AUDIO_CTX, d)
    for side, n_layers in ((enc, config["encoder_layers"]), (dec, config["decoder_layers"])):
        for i in range(n_layers):
            p = f"{side}.layers.{i}"
            layer_norm(f"{p}.self_attn_layer_norm")
            attention(f"{p}.self_attn")
            if side == dec:
                layer_norm(f"{p}.encoder_attn_layer_norm")
                attention(f"{p}.encoder_attn")
            layer_norm(f"{p}.final_layer_norm")
            linear(f"{p}.fc1", ffn, d)
            linear(f"{p}.fc2", d, ffn)
        layer_norm(f"{side}.layer_norm")
    state[f"{dec}.embed_tokens.weight"] = (2.0 * matrix(vocab, d)).astype(np.float32)
    state[f"{dec}.embed_positions.weight"] = small(WHISPER_TEXT_CTX, d)
    return state


class TransformersWhisper:
    name = "transformers"

    def __init__(self, state: dict, config: dict, device: str):
        import torch
        import transformers

        cfg = transformers.WhisperConfig(**{k: v for k, v in config.items()
                                            if k not in ("model_type", "architectures")})
        model = transformers.WhisperForConditionalGeneration(cfg)
        tensors = {k: torch.from_numpy(v) for k, v in state.items()}
        missing, unexpected = model.load_state_dict(tensors, strict=False)
        # proj_out is tied to embed_tokens; nothing else may be missing.
        if unexpected or set(missing) - {"proj_out.weight"}:
            raise RuntimeError(f"transformers whisper: missing {missing}, unexpected {unexpected}")
        model.tie_weights()
        if not torch.equal(model.proj_out.weight, tensors["model.decoder.embed_tokens.weight"]):
            raise RuntimeError("transformers whisper: proj_out is not tied to embed_tokens")
        self.model = model.eval().to(device)
        self.attn = getattr(cfg, "_attn_implementation", "?")
        self.cache_keyword = cache_keyword(self.model)

    def encode(self, mel):
        return self.model.model.encoder(input_features=mel).last_hidden_state

    def smoke(self) -> None:
        """Two cached decoder steps over a few random audio positions."""
        import torch

        device = self.model.device
        with torch.inference_mode():
            features = torch.randn(1, 8, self.model.config.d_model, device=device)
            state = self.start(features)
            for token in ([WHISPER_SOT, WHISPER_CHECK_NEXT], [WHISPER_CHECK_NEXT]):
                logits = self.step(torch.tensor([token], device=device), state)
                if logits.shape[:2] != (1, len(token)) or state["cache"] is None:
                    raise RuntimeError(f"unexpected logits {tuple(logits.shape)} or no cache")

    def start(self, features):
        from transformers.modeling_outputs import BaseModelOutput

        return {"encoder_outputs": BaseModelOutput(last_hidden_state=features), "cache": None}

    def step(self, tokens, state):
        out = self.model(encoder_outputs=state["encoder_outputs"], decoder_input_ids=tokens,
                         use_cache=True, **{self.cache_keyword: state["cache"]})
        state["cache"] = returned_cache(out)
        return out.logits


class MinimalTorchWhisper:
    name = "minimal torch (bench/_torch_minimal.py)"
    attn = "sdpa"

    def __init__(self, state: dict, config: dict, device: str):
        from _torch_minimal import MinimalWhisper

        self.model = MinimalWhisper(state, config, device)

    def encode(self, mel):
        return self.model.encode(mel)

    def start(self, features):
        return self.model.start(features)

    def step(self, tokens, state):
        return self.model.step(tokens, state)


def cache_keyword(model) -> str:
    """transformers 5.2x renamed forward's `past_key_values` to `cache` (the old name still
    works, with a deprecation warning); use whichever this version's forward declares."""
    import inspect

    parameters = inspect.signature(model.forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


def returned_cache(output):
    cache = getattr(output, "cache", None)
    return cache if cache is not None else output.past_key_values


def make_peer(requested: str, transformers_cls, minimal_cls, *args):
    """The torch peer. `auto` takes transformers when it imports and passes a two-step smoke
    run (its forward's keywords change between versions), else the minimal torch model."""
    if requested == "minimal":
        return minimal_cls(*args)
    if requested == "transformers":
        return transformers_cls(*args)
    try:
        import transformers  # noqa: F401
    except ImportError:
        return minimal_cls(*args)
    try:
        peer = transformers_cls(*args)
        peer.smoke()
        return peer
    except Exception as error:  # an API this script does not know: fall back, and say so
        print(f"  transformers peer failed its smoke run ({type(error).__name__}: {error}); "
              "using the minimal torch peer")
        return minimal_cls(*args)


def bench_whisper(name: str, target: Target, peer_request: str, steps: int, report: Report,
                  peer_names: dict) -> None:
    import torch

    from candle_web import Device, Tensor
    from candle_web.io.safetensors import serialize
    from candle_web.models.whisper import Whisper

    print(f"-- {name}: random weights of the real shape")
    config = whisper_config(WHISPER_SHAPES[name])
    state = whisper_random_state(config, SEED)
    weights = serialize(state)
    mel = np.random.default_rng(SEED + 1).standard_normal(
        (1, WHISPER_MELS, WHISPER_FRAMES), dtype=np.float32).astype(np.float32)
    device = target.candle_device

    # candle-web on the target device
    model = Whisper.load(weights, config, device)
    mel_t = Tensor.from_numpy(mel, device=device)
    features_holder = {}

    def candle_encode():
        features_holder["f"] = model.encode(mel_t)

    candle_encoder = median_seconds(candle_encode, target.candle_sync, ENCODER_REPEATS)
    features = features_holder["f"]

    def candle_tokens(ids):
        return Tensor.from_numpy(np.asarray([ids], dtype=np.int64), device=device)

    def candle_decoder_state():
        decoding = model.start_decoding(features)
        first = model.logits(candle_tokens([WHISPER_SOT]), decoding)
        return decoding, int(first.argmax(-1).to_numpy().reshape(-1)[0])

    def candle_step_fn(decoding):
        def step(token):
            logits = model.logits(candle_tokens([token]), decoding)
            return int(logits.argmax(-1).to_numpy().reshape(-1)[0])
        return step

    warm_state, warm_token = candle_decoder_state()
    seconds_per_step(candle_step_fn(warm_state), warm_token, WARMUP_STEPS, target.candle_sync)
    timed_state, first_token = candle_decoder_state()
    candle_token = seconds_per_step(candle_step_fn(timed_state), first_token, steps,
                                    target.candle_sync)

    # the torch peer on the same weights
    peer = make_peer(peer_request, TransformersWhisper, MinimalTorchWhisper, state, config,
                     target.torch_device)
    peer_names["whisper"] = f"{peer.name} (attention {peer.attn})"
    mel_torch = torch.from_numpy(mel).to(target.torch_device)
    with torch.inference_mode():
        peer_holder = {}

        def peer_encode():
            peer_holder["f"] = peer.encode(mel_torch)

        peer_encoder = median_seconds(peer_encode, target.torch_sync, ENCODER_REPEATS)
        peer_features = peer_holder["f"]

        def peer_tokens(ids):
            return torch.tensor([ids], dtype=torch.long, device=target.torch_device)

        def peer_decoder_state():
            decoding = peer.start(peer_features)
            first = peer.step(peer_tokens([WHISPER_SOT]), decoding)
            return decoding, int(first[0, -1].argmax().item())

        def peer_step_fn(decoding):
            def step(token):
                return int(peer.step(peer_tokens([token]), decoding)[0, -1].argmax().item())
            return step

        warm_state, warm_token = peer_decoder_state()
        seconds_per_step(peer_step_fn(warm_state), warm_token, WARMUP_STEPS, target.torch_sync)
        timed_state, first_token = peer_decoder_state()
        peer_token = seconds_per_step(peer_step_fn(timed_state), first_token, steps,
                                      target.torch_sync)

        report.row(name, "encoder ms (30 s window)", candle_encoder * 1e3, peer_encoder * 1e3, False)
        report.row(name, f"decoder ms/token ({steps})", candle_token * 1e3, peer_token * 1e3, False)
        print(f"  encoder {candle_encoder * 1e3:.2f} ms vs {peer_encoder * 1e3:.2f} ms; "
              f"decoder {candle_token * 1e3:.2f} vs {peer_token * 1e3:.2f} ms/token")

        # correctness: the same short input through candle-web (target, numpy) and the peer
        def candle_check_logits(m, feats):
            decoding = m.start_decoding(feats)
            dev = feats.device
            prefix = m.logits(Tensor.from_numpy(np.asarray([WHISPER_CHECK_PREFIX], np.int64),
                                                device=dev), decoding).to_numpy()
            nxt = m.logits(Tensor.from_numpy(np.asarray([[WHISPER_CHECK_NEXT]], np.int64),
                                             device=dev), decoding).to_numpy()
            return prefix, nxt

        reference = Whisper.load(weights, config, Device.cpu("numpy"))
        ref_features = reference.encode(Tensor.from_numpy(mel, device=Device.cpu("numpy")))
        ref_prefix, ref_next = candle_check_logits(reference, ref_features)
        got_prefix, got_next = candle_check_logits(model, features)
        what = f"{name} candle-web {target.kind} vs numpy"
        report.check(f"{what}: encoder output", features.to_numpy(), ref_features.to_numpy())
        report.check(f"{what}: logits, 4-token prefix", got_prefix, ref_prefix)
        report.check(f"{what}: logits, next step (cache)", got_next, ref_next)

        decoding = peer.start(peer_features)
        peer_prefix = peer.step(peer_tokens(WHISPER_CHECK_PREFIX), decoding).float().cpu().numpy()
        peer_next = peer.step(peer_tokens([WHISPER_CHECK_NEXT]), decoding).float().cpu().numpy()
        what = f"{name} candle-web {target.kind} vs torch"
        report.check(f"{what}: encoder output", features.to_numpy(), peer_features.cpu().numpy())
        report.check(f"{what}: logits, 4-token prefix", got_prefix, peer_prefix)
        report.check(f"{what}: logits, next step (cache)", got_next, peer_next)


# -- LLaMA (SmolLM2-135M shape) -----------------------------------------------------------
def llama_random_state(config: dict, seed: int) -> dict:
    """HF-named f32 weights (tied head), scaled so activations stay O(1) and logits O(1)."""
    rng = np.random.default_rng(seed)
    d, ffn, hd = config["hidden_size"], config["intermediate_size"], config["head_dim"]
    q_rows, kv_rows = config["num_attention_heads"] * hd, config["num_key_value_heads"] * hd

    def matrix(rows, cols):
        return (rng.standard_normal((rows, cols), dtype=np.float32) / np.sqrt(cols)).astype(np.float32)

    def norm(size):
        return (1.0 + 0.1 * rng.standard_normal(size, dtype=np.float32)).astype(np.float32)

    state = {"model.embed_tokens.weight": (2.0 * matrix(config["vocab_size"], d)).astype(np.float32),
             "model.norm.weight": norm(d)}
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


def quantize_state(state: dict, ggml_type: str) -> dict:
    """Every 2-D weight as a QTensor of `ggml_type` (norm vectors stay f32)."""
    from candle_web.quantized import QTensor

    return {name: QTensor.from_float(value, ggml_type) if value.ndim == 2 else value
            for name, value in state.items()}


def quantized_llama(qstate: dict, cfg, device, mode: str):
    """candle-web's Llama over quantized weights in HF layout (halves RoPE, tied head), loaded
    as any checkpoint is. mode "quantized" multiplies from the blocks on every call;
    "dequantize" expands them to f32 once (the numpy reference)."""
    from candle_web.models.llama import Llama

    return Llama.load(qstate, cfg, device, mode)


class TransformersLlama:
    name = "transformers"

    def __init__(self, state: dict, config: dict, device: str):
        import torch
        import transformers

        cfg = transformers.LlamaConfig(**{k: v for k, v in config.items()
                                          if k not in ("model_type", "architectures")})
        model = transformers.LlamaForCausalLM(cfg)
        tensors = {k: torch.from_numpy(v) for k, v in state.items()}
        missing, unexpected = model.load_state_dict(tensors, strict=False)
        if unexpected or set(missing) - {"lm_head.weight"}:
            raise RuntimeError(f"transformers llama: missing {missing}, unexpected {unexpected}")
        model.tie_weights()
        if not torch.equal(model.lm_head.weight, tensors["model.embed_tokens.weight"]):
            raise RuntimeError("transformers llama: lm_head is not tied to embed_tokens")
        self.model = model.eval().to(device)
        self.attn = getattr(cfg, "_attn_implementation", "?")
        self.cache_keyword = cache_keyword(self.model)

    def new_cache(self):
        return {"cache": None}

    def smoke(self) -> None:
        """A two-token prompt then one cached step."""
        import torch

        device = self.model.device
        with torch.inference_mode():
            cache = self.new_cache()
            for ids, all_logits in (([1, 2], True), ([3], False)):
                logits = self.forward(torch.tensor([ids], device=device), cache, all_logits)
                if logits.shape[:2] != (1, len(ids)) or cache["cache"] is None:
                    raise RuntimeError(f"unexpected logits {tuple(logits.shape)} or no cache")

    def forward(self, ids, cache, all_logits=False):
        # logits_to_keep=1: only the last position's logits, as candle-web computes them.
        out = self.model(input_ids=ids, use_cache=True, logits_to_keep=0 if all_logits else 1,
                         **{self.cache_keyword: cache["cache"]})
        cache["cache"] = returned_cache(out)
        return out.logits


class MinimalTorchLlama:
    name = "minimal torch (bench/_torch_minimal.py)"
    attn = "sdpa"

    def __init__(self, state: dict, config: dict, device: str):
        from _torch_minimal import MinimalLlama

        self.model = MinimalLlama(state, config, device)

    def new_cache(self):
        return self.model.new_cache()

    def forward(self, ids, cache, all_logits=False):
        return self.model.forward(ids, cache, all_logits)


def candle_llama_speed(model, prompt: list, steps: int, sync):
    """(prompt tok/s, decode tok/s) of a candle-web Llama."""

    def prefill():
        model.clear_kv_cache()
        return model.forward([prompt])

    prompt_seconds = median_seconds(prefill, sync, PROMPT_REPEATS)

    def step(token):
        return int(model.forward([[token]]).argmax(-1).to_numpy().reshape(-1)[0])

    first = int(prefill().argmax(-1).to_numpy().reshape(-1)[0])
    seconds_per_step(step, first, WARMUP_STEPS, sync)
    first = int(prefill().argmax(-1).to_numpy().reshape(-1)[0])
    per_token = seconds_per_step(step, first, steps, sync)
    return len(prompt) / prompt_seconds, 1.0 / per_token


def torch_llama_speed(peer, prompt: list, steps: int, device: str, sync):
    import torch

    ids = torch.tensor([prompt], dtype=torch.long, device=device)
    holder = {}

    def prefill():
        holder["cache"] = peer.new_cache()
        return peer.forward(ids, holder["cache"])

    prompt_seconds = median_seconds(prefill, sync, PROMPT_REPEATS)

    def step(token):
        tokens = torch.tensor([[token]], dtype=torch.long, device=device)
        return int(peer.forward(tokens, holder["cache"])[0, -1].argmax().item())

    first = int(prefill()[0, -1].argmax().item())
    seconds_per_step(step, first, WARMUP_STEPS, sync)
    first = int(prefill()[0, -1].argmax().item())
    per_token = seconds_per_step(step, first, steps, sync)
    return len(prompt) / prompt_seconds, 1.0 / per_token


def candle_llama_check_logits(model, prompt: list, next_token: int):
    model.clear_kv_cache()
    prefix = model.forward([prompt], all_logits=True).to_numpy()
    nxt = model.forward([[next_token]]).to_numpy()
    return prefix, nxt


def bench_llama(target: Target, peer_request: str, steps: int, report: Report,
                peer_names: dict) -> None:
    import torch

    from candle_web import Device
    from candle_web.io.safetensors import serialize
    from candle_web.models.llama import Llama, LlamaConfig

    name = "smollm2-135m"
    print(f"-- {name}: random weights of the real shape")
    state = llama_random_state(SMOLLM2_135M, SEED)
    cfg = LlamaConfig.from_hf_config(SMOLLM2_135M)
    rng = np.random.default_rng(SEED + 2)
    prompt = [int(t) for t in rng.integers(0, cfg.vocab_size, PROMPT_TOKENS)]
    check_prompt, check_next = prompt[:LLAMA_CHECK_PROMPT], prompt[LLAMA_CHECK_PROMPT]
    device, cpu_ref = target.candle_device, Device.cpu("numpy")

    # torch first: its f32 speed is the baseline of every candle-web row
    peer = make_peer(peer_request, TransformersLlama, MinimalTorchLlama, state, SMOLLM2_135M,
                     target.torch_device)
    peer_names["llama"] = f"{peer.name} (attention {peer.attn})"
    with torch.inference_mode():
        peer_prompt, peer_decode = torch_llama_speed(peer, prompt, steps, target.torch_device,
                                                     target.torch_sync)
        check_ids = torch.tensor([check_prompt], dtype=torch.long, device=target.torch_device)
        cache = peer.new_cache()
        peer_prefix = peer.forward(check_ids, cache, all_logits=True).float().cpu().numpy()
        peer_next = peer.forward(torch.tensor([[check_next]], device=target.torch_device),
                                 cache).float().cpu().numpy()[:, -1]
    del peer
    print(f"  torch f32: prompt {peer_prompt:.1f} tok/s, decode {peer_decode:.1f} tok/s")

    # candle-web f32 through the ordinary loader, from safetensors bytes
    weights = serialize(state)
    model = Llama.load(weights, cfg, device)
    prompt_rate, decode_rate = candle_llama_speed(model, prompt, steps, target.candle_sync)
    report.row(f"{name} f32", f"prompt tok/s ({PROMPT_TOKENS})", prompt_rate, peer_prompt, True)
    report.row(f"{name} f32", f"decode tok/s ({steps})", decode_rate, peer_decode, True)
    print(f"  candle-web f32: prompt {prompt_rate:.1f} tok/s, decode {decode_rate:.1f} tok/s")
    got_prefix, got_next = candle_llama_check_logits(model, check_prompt, check_next)
    del model
    reference = Llama.load(weights, cfg, cpu_ref)
    ref_prefix, ref_next = candle_llama_check_logits(reference, check_prompt, check_next)
    del reference, weights
    what = f"{name} f32 candle-web {target.kind}"
    report.check(f"{what} vs numpy: logits, {LLAMA_CHECK_PROMPT}-token prompt", got_prefix, ref_prefix)
    report.check(f"{what} vs numpy: logits, next step (cache)", got_next, ref_next)
    report.check(f"{what} vs torch: logits, {LLAMA_CHECK_PROMPT}-token prompt", got_prefix, peer_prefix)
    report.check(f"{what} vs torch: logits, next step (cache)", got_next, peer_next)

    for ggml_type in LLAMA_QUANT_TYPES:
        started = time.perf_counter()
        qstate = quantize_state(state, ggml_type)
        print(f"  quantized to {ggml_type} in {time.perf_counter() - started:.1f} s")
        model = quantized_llama(qstate, cfg, device, "quantized")
        prompt_rate, decode_rate = candle_llama_speed(model, prompt, steps, target.candle_sync)
        report.row(f"{name} {ggml_type} (torch f32)", f"prompt tok/s ({PROMPT_TOKENS})",
                   prompt_rate, peer_prompt, True)
        report.row(f"{name} {ggml_type} (torch f32)", f"decode tok/s ({steps})", decode_rate,
                   peer_decode, True)
        print(f"  candle-web {ggml_type}: prompt {prompt_rate:.1f} tok/s, "
              f"decode {decode_rate:.1f} tok/s")
        got_prefix, got_next = candle_llama_check_logits(model, check_prompt, check_next)
        del model
        reference = quantized_llama(qstate, cfg, cpu_ref, "dequantize")
        ref_prefix, ref_next = candle_llama_check_logits(reference, check_prompt, check_next)
        del reference, qstate
        what = f"{name} {ggml_type} candle-web {target.kind} vs numpy"
        report.check(f"{what}: logits, {LLAMA_CHECK_PROMPT}-token prompt", got_prefix, ref_prefix)
        report.check(f"{what}: logits, next step (cache)", got_next, ref_next)


# -- main ---------------------------------------------------------------------------------
def versions(target: Target) -> dict:
    import numpy
    import torch

    found = {"python": platform.python_version(), "numpy": numpy.__version__,
             "torch": torch.__version__, "torch CUDA": torch.version.cuda,
             "candle-web target": target.label}
    for package in ("transformers", "numba", "cupy"):
        try:
            found[package] = __import__(package).__version__
        except ImportError:
            found[package] = "not installed"
    if target.kind == "cuda":
        import cupy

        props = cupy.cuda.runtime.getDeviceProperties(0)
        found["GPU"] = props["name"].decode()
        found["CUDA runtime (cupy)"] = cupy.cuda.runtime.runtimeGetVersion()
        found["CUDA driver"] = cupy.cuda.runtime.driverGetVersion()
        found["torch GPU"] = torch.cuda.get_device_name(0)
    else:
        found["CPU threads (torch)"] = torch.get_num_threads()
    return found


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="where candle-web and torch run (cpu: test the script without a GPU)")
    parser.add_argument("--peer", choices=("auto", "transformers", "minimal"), default="auto",
                        help="the PyTorch implementation (auto: transformers when importable)")
    parser.add_argument("--only", default="whisper,llama",
                        help="comma-separated workloads: whisper, llama")
    parser.add_argument("--whisper", default=",".join(WHISPER_SHAPES),
                        help=f"comma-separated Whisper shapes ({', '.join(WHISPER_SHAPES)})")
    parser.add_argument("--decode-steps", type=int, default=DEFAULT_DECODE_STEPS,
                        help="timed greedy steps per decoder measurement")
    parser.add_argument("--json", help="also write the results to this JSON file")
    args = parser.parse_args(argv)

    import torch

    disable_tf32(torch)
    started = time.perf_counter()
    target = make_target(args.device)
    found = versions(target)
    print("versions: " + "; ".join(f"{k} {v}" for k, v in found.items()))
    print("TF32: off (torch.backends.cuda.matmul.allow_tf32 = cudnn.allow_tf32 = False; "
          "cupy without CUPY_TF32)")

    report, peer_names = Report(), {}
    workloads = [w.strip() for w in args.only.split(",") if w.strip()]
    jobs = []
    if "whisper" in workloads:
        for name in [n.strip() for n in args.whisper.split(",") if n.strip()]:
            jobs.append((name, lambda name=name: bench_whisper(
                name, target, args.peer, args.decode_steps, report, peer_names)))
    if "llama" in workloads:
        jobs.append(("smollm2-135m", lambda: bench_llama(
            target, args.peer, args.decode_steps, report, peer_names)))
    for name, job in jobs:
        job_started = time.perf_counter()
        try:
            job()
        except Exception:  # one broken workload must not hide the others' results
            report.errors.append(f"{name}: {traceback.format_exc(limit=8).strip()}")
            print(report.errors[-1])
        print(f"  ({name}: {time.perf_counter() - job_started:.0f} s)")

    print_tables(report, peer_names, target)
    elapsed = time.perf_counter() - started
    print(f"bench/gpu.py: {elapsed:.0f} s in all")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({
            "versions": {k: str(v) for k, v in found.items()}, "peers": peer_names,
            "rows": [{"workload": w, "metric": m, "candle_web": c, "pytorch": p,
                      "speedup": speedup(c, p, h) if p else None} for w, m, c, p, h in report.rows],
            "checks": [{"name": n, "max_abs_diff": d, "bound": b, "passed": ok}
                       for n, d, b, ok in report.checks],
            "errors": report.errors, "seconds": elapsed}, indent=2))
    failed = report.errors or not all(c[3] for c in report.checks)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
