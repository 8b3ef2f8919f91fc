"""Whisper transcription, candle-web next to openai-whisper (PyTorch CPU), in one process.

    .venv/bin/python bench/whisper.py [--model whisper-tiny.en] [--threads 2] [--repeat 1]

For each LibriVox clip: end-to-end greedy transcription time (temperature 0, as the tests),
encoder ms per 30 s window and decoder ms per token, for each engine, then the ratio
candle-web / PyTorch (below 1 = candle-web faster). Both engines run the same weights with the
same thread count; the CPU backend is whatever `Device.cpu()` picks (CANDLE_WEB_BACKEND=numpy
or numba to choose).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "pkg"), str(REPO / "native"), str(REPO / "tests" / "reference")]


def _median(values):
    values = sorted(values)
    return values[len(values) // 2]


def bench_candle(model, tokenizer, samples, repeat):
    from candle_web import Tensor, audio
    from candle_web.models.whisper_decode import (DecodingOptions, TranscribeOptions,
                                                  WhisperTokenizer, WindowDecoder, transcribe)

    totals, encoders, per_token = [], [], []
    for _ in range(repeat):
        started = time.perf_counter()
        result = transcribe(model, tokenizer, samples, TranscribeOptions(temperatures=(0.0,),
                                                                         language="en" if model.config.is_multilingual else None))
        totals.append(time.perf_counter() - started)
        mel = audio.pad_or_trim(audio.log_mel_spectrogram(samples, model.config.n_mels), audio.N_FRAMES)
        started = time.perf_counter()
        features = model.encode(Tensor.from_numpy(mel[None]))
        encoders.append(time.perf_counter() - started)
        tk = WhisperTokenizer(tokenizer, model.config.is_multilingual, "en" if model.config.is_multilingual else None)
        started = time.perf_counter()
        decoded = WindowDecoder(model, tk, DecodingOptions()).run(features)
        per_token.append((time.perf_counter() - started) / max(len(decoded.tokens) + 1, 1))
    return _median(totals), _median(encoders), _median(per_token), result.text


def bench_torch(model, samples, repeat):
    import torch
    import whisper

    audio_t = torch.from_numpy(samples)
    totals, encoders, per_token = [], [], []
    with torch.no_grad():
        for _ in range(repeat):
            started = time.perf_counter()
            result = model.transcribe(audio_t, temperature=0.0, fp16=False, language="en", verbose=None)
            totals.append(time.perf_counter() - started)
            mel = whisper.pad_or_trim(whisper.log_mel_spectrogram(audio_t, model.dims.n_mels), whisper.audio.N_FRAMES)
            started = time.perf_counter()
            model.embed_audio(mel[None])
            encoders.append(time.perf_counter() - started)
            started = time.perf_counter()
            decoded = whisper.decode(model, mel, whisper.DecodingOptions(temperature=0.0, fp16=False, language="en"))
            per_token.append((time.perf_counter() - started) / max(len(decoded.tokens) + 1, 1))
    return _median(totals), _median(encoders), _median(per_token), result["text"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="whisper-tiny.en")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    import record_whisper as reference
    from candle_web import Device, hub
    from candle_web.pipelines import load_whisper

    started = time.perf_counter()
    model, tokenizer = load_whisper(args.model)
    candle_load = time.perf_counter() - started
    started = time.perf_counter()
    torch_model = reference.load_openai_model(hub.fetch(args.model, "model.bin"))
    torch_load = time.perf_counter() - started
    clips = {k: v for k, v in reference.speech_clips(hub.cache_dir() / "testdata" / "speech").items()
             if k.startswith("librivox/")}
    backend = Device.cpu().backend.name
    print(f"model {args.model}; candle-web backend {backend}; torch {torch.__version__} with "
          f"{args.threads} threads; load: candle-web {candle_load:.2f} s, torch {torch_load:.2f} s")
    header = (f"{'clip':10} {'audio s':>7} | {'cw total':>8} {'cw enc ms':>9} {'cw ms/tok':>9} | "
              f"{'pt total':>8} {'pt enc ms':>9} {'pt ms/tok':>9} | {'total x':>7} {'enc x':>6} {'tok x':>6}")
    print(header)
    print("-" * len(header))
    sums = [0.0, 0.0, 0.0]
    for name, samples in clips.items():
        c_total, c_enc, c_tok, c_text = bench_candle(model, tokenizer, samples, args.repeat)
        t_total, t_enc, t_tok, t_text = bench_torch(torch_model, samples, args.repeat)
        duration = len(samples) / 16000
        sums[0] += duration
        sums[1] += c_total
        sums[2] += t_total
        same = "" if c_text.strip() == t_text.strip() else "  (texts differ!)"
        print(f"{name[-9:]:10} {duration:7.2f} | {c_total:8.2f} {c_enc * 1e3:9.0f} {c_tok * 1e3:9.1f} | "
              f"{t_total:8.2f} {t_enc * 1e3:9.0f} {t_tok * 1e3:9.1f} | {c_total / t_total:7.2f} "
              f"{c_enc / t_enc:6.2f} {c_tok / t_tok:6.2f}{same}")
    print(f"all clips: {sums[0]:.1f} s audio; candle-web {sums[1]:.2f} s (RTF {sums[1] / sums[0]:.3f}), "
          f"PyTorch {sums[2]:.2f} s (RTF {sums[2] / sums[0]:.3f}); ratio {sums[1] / sums[2]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
