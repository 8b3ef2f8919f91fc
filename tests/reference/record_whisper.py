"""Record reference Whisper token ids with openai-whisper (PyTorch), for tests/models.

    .venv/bin/python tests/reference/record_whisper.py [--out tests/reference/whisper_reference.json]

The weights are the same CTranslate2 model.bin files candle-web loads, converted here to
openai-whisper's state-dict names; everything else (log-mel via torch.stft, the tiktoken
tokenizer bundled with openai-whisper, decoding) is openai-whisper's own code, so the recorded
ids are an independent reference. The test compares against this file, and against
openai-whisper live when it is installed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "pkg")]

MODELS = {"whisper-tiny.en": "tiny.en", "whisper-base": "base"}
OUT = Path(__file__).with_name("whisper_reference.json")


def ct2_to_openai_state(variables: dict):
    """(ModelDimensions kwargs, state dict of torch tensors) from CT2 WhisperSpec variables."""
    import torch

    def t(name):
        return torch.from_numpy(np.asarray(variables[name], dtype=np.float32).copy())

    state = {}
    d = variables["decoder/embeddings/weight"].shape[1]

    def count(side):
        n = 0
        while f"{side}/layer_{n}/ffn/linear_0/weight" in variables:
            n += 1
        return n

    def ln(dst, src):
        state[f"{dst}.weight"], state[f"{dst}.bias"] = t(f"{src}/gamma"), t(f"{src}/beta")

    def lin(dst, src, rows=None, bias=True):
        w = t(f"{src}/weight")
        b = t(f"{src}/bias") if bias else None
        if rows is not None:
            w = w[rows]
            b = b[rows] if b is not None else None
        state[f"{dst}.weight"] = w.contiguous()
        if b is not None:
            state[f"{dst}.bias"] = b.contiguous()

    def self_attn(dst, src):
        lin(f"{dst}.query", f"{src}/linear_0", slice(0, d))
        lin(f"{dst}.key", f"{src}/linear_0", slice(d, 2 * d), bias=False)
        lin(f"{dst}.value", f"{src}/linear_0", slice(2 * d, 3 * d))
        lin(f"{dst}.out", f"{src}/linear_1")

    n_enc, n_dec = count("encoder"), count("decoder")
    state["encoder.conv1.weight"], state["encoder.conv1.bias"] = t("encoder/conv1/weight"), t("encoder/conv1/bias")
    state["encoder.conv2.weight"], state["encoder.conv2.bias"] = t("encoder/conv2/weight"), t("encoder/conv2/bias")
    state["encoder.positional_embedding"] = t("encoder/position_encodings/encodings")
    for i in range(n_enc):
        p, s = f"encoder.blocks.{i}", f"encoder/layer_{i}"
        self_attn(f"{p}.attn", f"{s}/self_attention")
        ln(f"{p}.attn_ln", f"{s}/self_attention/layer_norm")
        lin(f"{p}.mlp.0", f"{s}/ffn/linear_0")
        lin(f"{p}.mlp.2", f"{s}/ffn/linear_1")
        ln(f"{p}.mlp_ln", f"{s}/ffn/layer_norm")
    ln("encoder.ln_post", "encoder/layer_norm")
    state["decoder.token_embedding.weight"] = t("decoder/embeddings/weight")
    state["decoder.positional_embedding"] = t("decoder/position_encodings/encodings")
    for i in range(n_dec):
        p, s = f"decoder.blocks.{i}", f"decoder/layer_{i}"
        self_attn(f"{p}.attn", f"{s}/self_attention")
        ln(f"{p}.attn_ln", f"{s}/self_attention/layer_norm")
        lin(f"{p}.cross_attn.query", f"{s}/attention/linear_0")
        lin(f"{p}.cross_attn.key", f"{s}/attention/linear_1", slice(0, d), bias=False)
        lin(f"{p}.cross_attn.value", f"{s}/attention/linear_1", slice(d, 2 * d))
        lin(f"{p}.cross_attn.out", f"{s}/attention/linear_2")
        ln(f"{p}.cross_attn_ln", f"{s}/attention/layer_norm")
        lin(f"{p}.mlp.0", f"{s}/ffn/linear_0")
        lin(f"{p}.mlp.2", f"{s}/ffn/linear_1")
        ln(f"{p}.mlp_ln", f"{s}/ffn/layer_norm")
    ln("decoder.ln", "decoder/layer_norm")
    dims = dict(
        n_mels=variables["encoder/conv1/weight"].shape[1], n_audio_ctx=1500, n_audio_state=d,
        n_audio_head=int(np.asarray(variables["encoder/num_heads"])), n_audio_layer=n_enc,
        n_vocab=variables["decoder/embeddings/weight"].shape[0],
        n_text_ctx=variables["decoder/position_encodings/encodings"].shape[0], n_text_state=d,
        n_text_head=int(np.asarray(variables["decoder/num_heads"])), n_text_layer=n_dec)
    return dims, state


def load_openai_model(model_bin: Path):
    import whisper
    from whisper.model import ModelDimensions, Whisper

    from candle_web.io.ct2 import read_ct2

    ct2 = read_ct2(str(model_bin))
    variables = {name: ct2.get_f32(name) if ct2.dtype_of(name) in ("float16", "float32", "bfloat16")
                 else ct2[name] for name in ct2.variables}
    dims, state = ct2_to_openai_state(variables)
    model = Whisper(ModelDimensions(**dims))
    model.load_state_dict(state, strict=True)
    model.eval()
    _ = whisper  # the package registers the model's decode/transcribe methods
    return model


def speech_clips(speech_dir: Path) -> dict:
    """name -> float32 16 kHz samples, for every clip the tests use."""
    from candle_web.io.audio import load_audio
    from candle_web.io.wav import read_raw_int16

    clips = {}
    for wav in sorted((speech_dir / "librivox").glob("*.wav")):
        clips[f"librivox/{wav.name}"] = load_audio(str(wav))
    for raw in ("goforward.raw", "something.raw"):
        samples, _ = read_raw_int16(str(speech_dir / raw))
        clips[raw] = np.asarray(samples, dtype=np.float32)
    return clips


def record(model_bin: Path, samples: np.ndarray, model) -> dict:
    """Greedy transcription (temperature 0 only, no fallback) and the first window's
    greedy decode without timestamps."""
    import torch
    import whisper

    audio = torch.from_numpy(samples)
    with torch.no_grad():
        result = model.transcribe(audio, temperature=0.0, fp16=False, language="en",
                                  condition_on_previous_text=True, verbose=None)
        mel = whisper.log_mel_spectrogram(audio, model.dims.n_mels, padding=0)
        mel = whisper.pad_or_trim(mel, whisper.audio.N_FRAMES)
        plain = whisper.decode(model, mel, whisper.DecodingOptions(
            temperature=0.0, without_timestamps=True, fp16=False,
            language="en"))
        beam = model.transcribe(audio, temperature=0.0, fp16=False, language="en", beam_size=5,
                                condition_on_previous_text=True, verbose=None)
    return {
        "beam5_segments": [{"start": s["start"], "end": s["end"], "tokens": s["tokens"]}
                           for s in beam["segments"]],
        "text": result["text"],
        "segments": [{"start": s["start"], "end": s["end"], "tokens": s["tokens"], "text": s["text"]}
                     for s in result["segments"]],
        "notimestamps_tokens": list(plain.tokens),
        "notimestamps_text": plain.text,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--models", nargs="*", default=list(MODELS))
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(2)
    from candle_web import hub

    speech_dir = hub.cache_dir() / "testdata" / "speech"
    clips = speech_clips(speech_dir)
    out = json.loads(args.out.read_text()) if args.out.exists() else {}
    out["_about"] = ("greedy token ids from openai-whisper "
                     f"(recorded by tests/reference/{Path(__file__).name}; temperature 0, fp16 off)")
    for name in args.models:
        model_bin = hub.fetch(name, "model.bin", offline=True)
        model = load_openai_model(model_bin)
        out[name] = {}
        for clip, samples in clips.items():
            started = time.perf_counter()
            out[name][clip] = record(model_bin, samples, model)
            print(f"{name} {clip}: {out[name][clip]['text']!r} ({time.perf_counter() - started:.1f} s)")
    args.out.write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
