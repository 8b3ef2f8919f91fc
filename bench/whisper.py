"""Whisper transcription: candle-web (numpy and numba backends, numba also under the compute
type int8) next to openai-whisper (PyTorch CPU) and CTranslate2 (faster-whisper's engine, int8
and float32 on the registry's own model.bin), all in one process, interleaved clip by clip so
that machine load hits every engine alike.

    .venv/bin/python bench/whisper.py [--model whisper-tiny.en] [--threads 2] [--repeat 1]
                                      [--backends numpy,numba,numba-int8] [--ct2 int8,float32]
                                      [--no-torch] [--features]

`numba-int8` is the numba backend with the compute type int8 (CANDLE_WEB_COMPUTE_TYPE; the
Whisper parts' linear layers in integer arithmetic). CTranslate2 (`pip install
'candle-web[bench]'`) runs the same model.bin; its greedy decode of each clip's one 30 s window
(the clips are shorter) starts from candle-web's log-mel, so a total counts the mel, the encoder
and the decode, as candle-web's does. Its summary line gives each candle-web engine's total
over CTranslate2's.

For each LibriVox clip and engine: end-to-end greedy transcription time (temperature 0, as the
tests), encoder ms per 30 s window and decoder ms per token (the first window's greedy decode
from precomputed audio features, so the encoder is not counted), then each candle-web backend's
ratio to PyTorch (below 1 = candle-web faster). `--threads` sets BLAS, OpenMP, numba and torch
threads alike before any of them is imported.

`--features` times what issue 26 added instead, per engine and interleaved: transcription with
word timestamps against without (the cost of words, openai-whisper's own ratio beside it), and
with Silero VAD against without on a recording that is half silence (the clips, each after as
much silence as it lasts): the time VAD saves and whether the words stay the same.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
# This file is named whisper.py: drop its folder from the path, or `import whisper` (the
# openai-whisper package) would import this script instead.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != BENCH_DIR]
sys.path[:0] = [str(REPO / "pkg"), str(REPO / "native"), str(REPO)]

THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
                    "NUMBA_NUM_THREADS")


def _median(values):
    values = sorted(values)
    return values[len(values) // 2]


class CandleEngine:
    def __init__(self, spec: str, model_name: str):
        """`spec`: a CPU backend name, or `numba-int8` (numba, compute type int8)."""
        from candle_web import Device
        from candle_web.backend.settings import override_settings, reload_settings
        from candle_web.pipelines import load_whisper

        backend, _, compute = spec.partition("-")
        self.name = f"cw-{spec}"
        started = time.perf_counter()
        # The parts read the compute type when they are built, at the first encode and decode.
        override_settings(compute_type=compute or "float32")
        try:
            loaded = load_whisper(model_name, device=Device.cpu(backend=backend))
            self.model, self.tokenizer = loaded.model, loaded.tokenizer
            import numpy as np

            mel = np.zeros((self.model.config.n_mels, 3000), np.float32)
            self.decode(self.encode(mel))
        finally:
            reload_settings()
        self.load_s = time.perf_counter() - started

    def transcribe(self, samples, words=False, vad=False):
        from candle_web.models.silero_vad import VadOptions
        from candle_web.pipelines.transcribe import TranscribeOptions, transcribe
        from candle_web.pipelines import load_vad

        language = "en" if self.model.config.is_multilingual else None
        options = TranscribeOptions(temperatures=(0.0,), language=language, word_timestamps=words,
                                    vad=VadOptions() if vad else None)
        return transcribe(self.model, self.tokenizer, samples, options,
                          vad_model=load_vad() if vad else None).text

    def encode(self, mel):
        from candle_web import Tensor

        return self.model.encode(Tensor.from_numpy(mel[None], device=self.model.device))

    def decode(self, features):
        """Greedy-decode one window from its features; returns the number of tokens sampled."""
        from candle_web.models.whisper_decode import DecodingOptions, WhisperTokenizer, WindowDecoder

        multilingual = self.model.config.is_multilingual
        tk = WhisperTokenizer(self.tokenizer, multilingual, "en" if multilingual else None)
        return len(WindowDecoder(self.model, tk, DecodingOptions()).run(features).tokens)


class CTranslate2Engine:
    """CTranslate2's Whisper on the registry's model.bin (a folder of links beside it, with the
    vocabulary.json CTranslate2 wants, written from tokenizer.json)."""

    def __init__(self, compute_type: str, model_name: str, threads: int, model_dir: Path):
        import ctranslate2

        from candle_web import hub
        from candle_web.pipelines import load_whisper

        self.name = f"ct2-{compute_type}"
        loaded = load_whisper(model_name)  # its tokenizer and config: the prompt, the text
        folder = _ct2_folder(hub, model_name, model_dir, loaded.model.config.n_vocab)
        started = time.perf_counter()
        self.model = ctranslate2.models.Whisper(str(folder), device="cpu",
                                                compute_type=compute_type,
                                                intra_threads=threads, inter_threads=1)
        self.load_s = time.perf_counter() - started
        self.tokenizer = loaded.tokenizer
        self.multilingual = loaded.model.config.is_multilingual
        ids = self.tokenizer.token_to_id
        self.prompt = [ids("<|startoftranscript|>")] + (
            [ids("<|en|>"), ids("<|transcribe|>")] if self.multilingual else [])
        self.text_ids_below = ids("<|endoftext|>")
        self.n_mels = loaded.model.config.n_mels

    def _generate(self, features):
        import ctranslate2

        if not isinstance(features, ctranslate2.StorageView):
            features = ctranslate2.StorageView.from_array(features)
        return self.model.generate(features, [self.prompt], beam_size=1, max_length=448,
                                   suppress_blank=True, suppress_tokens=[-1])[0].sequences_ids[0]

    def transcribe(self, samples, words=False, vad=False):
        import numpy as np

        from candle_web.io import audio

        assert not (words or vad), "the CTranslate2 column times plain transcription only"
        mel = audio.pad_or_trim(audio.log_mel_spectrogram(samples, self.n_mels), audio.N_FRAMES)
        ids = self._generate(np.ascontiguousarray(mel[None], np.float32))
        return self.tokenizer.decode([i for i in ids if i < self.text_ids_below])

    def encode(self, mel):
        import ctranslate2
        import numpy as np

        return self.model.encode(ctranslate2.StorageView.from_array(
            np.ascontiguousarray(mel[None], np.float32)))

    def decode(self, features):
        return len(self._generate(features))


def _ct2_folder(hub, model_name: str, folder: Path, n_vocab: int) -> Path:
    """model.bin and config.json linked, and vocabulary.json: tokenizer.json's tokens, then the
    timestamp tokens up to the model's vocabulary (tokenizer.json does not list them)."""
    import json

    source = hub.fetch(model_name, "model.bin").parent
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("model.bin", "config.json"):
        link = folder / name
        if not link.exists():
            link.symlink_to(source / name)
    tokenizer = json.loads((source / "tokenizer.json").read_text(encoding="utf-8"))
    tokens = {index: token for token, index in tokenizer["model"]["vocab"].items()}
    tokens.update({added["id"]: added["content"] for added in tokenizer["added_tokens"]})
    first_timestamp = len(tokens)
    tokens.update({i: f"<|{(i - first_timestamp) * 0.02:.2f}|>"
                   for i in range(first_timestamp, n_vocab)})
    (folder / "vocabulary.json").write_text(json.dumps([tokens[i] for i in range(n_vocab)]),
                                            encoding="utf-8")
    return folder


class TorchEngine:
    name = "torch"

    def __init__(self, model_name: str):
        from tests.reference import record_whisper as reference
        from candle_web import hub

        started = time.perf_counter()
        self.model = reference.load_openai_model(hub.fetch(model_name, "model.bin"))
        heads = {"whisper-tiny.en": "tiny.en", "whisper-base": "base"}.get(model_name)
        if heads:
            import whisper

            self.model.set_alignment_heads(whisper._ALIGNMENT_HEADS[heads])
        self.load_s = time.perf_counter() - started

    def transcribe(self, samples, words=False, vad=False):
        import torch

        assert not vad, "openai-whisper has no VAD"
        with torch.no_grad():
            return self.model.transcribe(torch.from_numpy(samples), temperature=0.0, fp16=False,
                                         language="en", verbose=None, word_timestamps=words)["text"]

    def encode(self, mel):
        import torch

        with torch.no_grad():
            return self.model.embed_audio(torch.from_numpy(mel)[None])

    def decode(self, features):
        import torch
        import whisper

        # Features of shape [1500, d] make whisper.decode skip its encoder.
        with torch.no_grad():
            result = whisper.decode(self.model, features[0],
                                    whisper.DecodingOptions(temperature=0.0, fp16=False, language="en"))
        return len(result.tokens)


def measure(engine, samples, mel, repeat):
    """(total s, encoder s, decoder s per token, text): medians over `repeat` runs."""
    totals, encoders, per_token = [], [], []
    text = ""
    for _ in range(repeat):
        started = time.perf_counter()
        text = engine.transcribe(samples)
        totals.append(time.perf_counter() - started)
        started = time.perf_counter()
        features = engine.encode(mel)
        encoders.append(time.perf_counter() - started)
        started = time.perf_counter()
        n_tokens = engine.decode(features)
        # +1: the step that sampled the end-of-text token
        per_token.append((time.perf_counter() - started) / (n_tokens + 1))
    return _median(totals), _median(encoders), _median(per_token), text


def timed(function, *args, **kwargs):
    started = time.perf_counter()
    result = function(*args, **kwargs)
    return time.perf_counter() - started, result


def feature_costs(engines, clips, repeat) -> None:
    """Word timestamps on/off per engine, and VAD on/off for candle-web, interleaved."""
    import numpy as np

    print("word timestamps: total s over all clips, off / on, and the cost of words")
    off = {e.name: 0.0 for e in engines}
    on = {e.name: 0.0 for e in engines}
    for _ in range(repeat):
        for samples in clips.values():
            for engine in engines:
                off[engine.name] += timed(engine.transcribe, samples)[0]
                on[engine.name] += timed(engine.transcribe, samples, words=True)[0]
    for engine in engines:
        print(f"  {engine.name:10} off {off[engine.name]:7.2f}  on {on[engine.name]:7.2f}  "
              f"words cost {100 * (on[engine.name] / off[engine.name] - 1):+5.1f}%")
    speech = list(clips.values())
    silence = np.zeros(sum(len(c) for c in speech), np.float32)
    layouts = {  # half silence: as pauses between the clips, or as one stretch after them
        "pauses": np.concatenate([piece for c in speech for piece in (np.zeros(len(c), np.float32), c)]),
        "stretch": np.concatenate(speech + [silence])}
    for layout, half_silence in layouts.items():
        print(f"VAD: {len(half_silence) / 16000:.1f} s recording, half silence ({layout}); best of "
              f"{max(repeat, 2)}")
        for engine in (e for e in engines if e.name != "torch"):
            engine.transcribe(half_silence[:16000], vad=True)  # loads the VAD model, untimed
            runs = [(timed(engine.transcribe, half_silence), timed(engine.transcribe, half_silence, vad=True))
                    for _ in range(max(repeat, 2))]
            (plain_s, plain_text), (vad_s, vad_text) = (min((r[k] for r in runs), key=lambda t: t[0])
                                                         for k in (0, 1))
            same = plain_text.split() == vad_text.split()
            print(f"  {engine.name:10} off {plain_s:7.2f}  on {vad_s:7.2f}  time "
                  f"{100 * (vad_s / plain_s - 1):+5.1f}%  same words: {'yes' if same else 'no'} "
                  f"({len(plain_text.split())} words without VAD, {len(vad_text.split())} with)")
            if not same:
                print(f"    without VAD: ...{plain_text[-160:]!r}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="whisper-tiny.en")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--backends", default="numpy,numba,numba-int8",
                        help="comma-separated candle-web CPU backends (numba-int8: numba with "
                             "the compute type int8)")
    parser.add_argument("--ct2", default="int8,float32",
                        help="comma-separated CTranslate2 compute types ('' to skip)")
    parser.add_argument("--no-torch", action="store_true", help="skip openai-whisper")
    parser.add_argument("--clips", type=int, default=None, help="only the first N clips")
    parser.add_argument("--features", action="store_true",
                        help="time word timestamps and VAD on/off instead (issue 26)")
    args = parser.parse_args(argv)
    for variable in THREAD_VARIABLES:
        os.environ[variable] = str(args.threads)

    import numpy as np

    from tests.reference import record_whisper as reference
    from candle_web import hub
    from candle_web.io import audio

    import tempfile

    engines = [CandleEngine(b.strip(), args.model) for b in args.backends.split(",") if b.strip()]
    ct2_dir = Path(tempfile.mkdtemp(prefix="bench-ct2-"))
    engines += [CTranslate2Engine(c.strip(), args.model, args.threads, ct2_dir)
                for c in args.ct2.split(",") if c.strip() and not args.features]
    torch_version = "skipped"
    if not args.no_torch:
        import torch

        torch.set_num_threads(args.threads)
        torch_version = torch.__version__
        engines.append(TorchEngine(args.model))
    clips = {k: v for k, v in reference.speech_clips(hub.cache_dir() / "testdata" / "speech").items()
             if k.startswith("librivox/")}
    if args.clips:
        clips = dict(list(clips.items())[:args.clips])
    n_mels = engines[0].model.config.n_mels if hasattr(engines[0], "model") else 80
    mels = {name: audio.pad_or_trim(audio.log_mel_spectrogram(s, n_mels), audio.N_FRAMES).astype(np.float32)
            for name, s in clips.items()}

    # Warm-up (numba compiles or loads its kernel cache; torch allocates), untimed.
    first = next(iter(clips))
    for engine in engines:
        engine.decode(engine.encode(mels[first]))

    print(f"model {args.model}; {args.threads} threads (BLAS/OpenMP/numba/torch); torch "
          f"{torch_version}; load s: " + ", ".join(f"{e.name} {e.load_s:.2f}" for e in engines))
    if args.features:
        for engine in engines:  # warm word timing (openai-whisper's numba DTW compiles)
            engine.transcribe(clips[first], words=True)
        feature_costs(engines, clips, args.repeat)
        return 0
    columns = "".join(f" | {e.name + ' total':>14} {'enc ms':>7} {'ms/tok':>6}" for e in engines)
    has_torch = engines[-1].name == "torch"
    ratio_columns = "".join(f" | {e.name + ' x pt: total':>20} {'enc':>5} {'tok':>5}"
                            for e in engines if has_torch and e.name != "torch")
    header = f"{'clip':10} {'audio s':>7}{columns}{ratio_columns}"
    print(header)
    print("-" * len(header))
    results = {e.name: [] for e in engines}
    audio_seconds = 0.0
    for name, samples in clips.items():
        duration = len(samples) / audio.SAMPLE_RATE
        audio_seconds += duration
        row = {e.name: measure(e, samples, mels[name], args.repeat) for e in engines}
        for engine_name, figures in row.items():
            results[engine_name].append(figures)
        line = f"{name.split('/')[-1][:10]:10} {duration:7.2f}"
        for e in engines:
            total, enc, tok, _ = row[e.name]
            line += f" | {total:14.2f} {enc * 1e3:7.0f} {tok * 1e3:6.1f}"
        if has_torch:
            t_total, t_enc, t_tok, t_text = row["torch"]
            for e in engines[:-1]:
                total, enc, tok, text = row[e.name]
                same = "" if text.strip() == t_text.strip() else " (text differs!)"
                line += f" | {total / t_total:20.2f} {enc / t_enc:5.2f} {tok / t_tok:5.2f}{same}"
        print(line)
    print("-" * len(header))
    totals = {n: sum(r[0] for r in rows) for n, rows in results.items()}
    for engine_name, rows in results.items():
        summary = (f"{engine_name:10} all clips ({audio_seconds:.1f} s audio): total {totals[engine_name]:.2f} s, "
                   f"RTF {totals[engine_name] / audio_seconds:.3f}, median encoder "
                   f"{_median([r[1] for r in rows]) * 1e3:.0f} ms, median decoder "
                   f"{_median([r[2] for r in rows]) * 1e3:.1f} ms/token")
        for ct2_name in (n for n in results if n.startswith("ct2-") and engine_name.startswith("cw-")):
            same = all(r[3].strip() == c[3].strip() for r, c in zip(rows, results[ct2_name]))
            summary += (f"; x {ct2_name}: total {totals[engine_name] / totals[ct2_name]:.2f} "
                        f"(same text: {'yes' if same else 'no'})")
        if has_torch and engine_name != "torch":
            t_rows = results["torch"]
            summary += (f"; x PyTorch: total {totals[engine_name] / totals['torch']:.2f}, encoder "
                        f"{_median([r[1] / t[1] for r, t in zip(rows, t_rows)]):.2f}, decoder step "
                        f"{_median([r[2] / t[2] for r, t in zip(rows, t_rows)]):.2f} "
                        f"(PyTorch step {_median([t[2] / r[2] for r, t in zip(rows, t_rows)]):.2f}x slower)")
        print(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
