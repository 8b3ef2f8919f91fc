"""Record openai-whisper word timestamps and long-form transcripts, for tests/models.

    .venv/bin/python tests/reference/record_whisper_words.py [--out tests/reference/whisper_words_reference.json]

The weights are candle-web's CTranslate2 model.bin files loaded into openai-whisper's own
`whisper.model.Whisper` (record_whisper.load_openai_model), with the model's alignment heads
set from openai-whisper's published `_ALIGNMENT_HEADS`; everything else (log-mel, tokenizer,
decoding, `whisper.timing`) is openai-whisper's code. Recorded, greedy (temperature 0):

- per test clip: `transcribe(word_timestamps=True)` segments with their words;
- the long recording (every clip joined with 6 s of silence, ~72 s, 3+ windows):
  `transcribe()` text and segments, with and without word timestamps.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root: tests.<area> imports
from tests.reference.record_whisper import REPO, load_openai_model, speech_clips  # noqa: E402

MODELS = {"whisper-tiny.en": "tiny.en", "whisper-base": "base"}
OUT = Path(__file__).with_name("whisper_words_reference.json")
SILENCE_S = 6.0


def long_recording(clips: dict) -> np.ndarray:
    """The clips in name order, each followed by 6 s of silence (as test_whisper_longform)."""
    silence = np.zeros(int(SILENCE_S * 16000), dtype=np.float32)
    pieces = []
    for name in sorted(clips):
        pieces += [clips[name], silence]
    return np.concatenate(pieces)


def segments_of(result: dict) -> list:
    return [{"start": s["start"], "end": s["end"], "text": s["text"], "tokens": s["tokens"],
             **({"words": [{k: (float(v) if k != "word" else v) for k, v in w.items()}
                           for w in s["words"]]} if "words" in s else {})}
            for s in result["segments"]]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--models", nargs="*", default=list(MODELS))
    args = parser.parse_args(argv)
    import torch
    import whisper

    torch.set_num_threads(2)
    sys.path.insert(0, str(REPO / "pkg"))
    from candle_web import hub

    clips = speech_clips(hub.cache_dir() / "testdata" / "speech")
    out = {"_about": "openai-whisper word timestamps and long-form transcripts, greedy, fp16 off "
                     f"(recorded by tests/reference/{Path(__file__).name})"}
    for name in args.models:
        model = load_openai_model(hub.fetch(name, "model.bin", offline=True))
        model.set_alignment_heads(whisper._ALIGNMENT_HEADS[MODELS[name]])
        entry = out[name] = {"clips": {}}
        options = dict(temperature=0.0, fp16=False, language="en", verbose=None)
        for clip, samples in clips.items():
            started = time.perf_counter()
            with torch.no_grad():
                result = model.transcribe(torch.from_numpy(samples), word_timestamps=True, **options)
            entry["clips"][clip] = segments_of(result)
            print(f"{name} {clip}: {len(entry['clips'][clip])} segments "
                  f"({time.perf_counter() - started:.1f} s)")
        audio = torch.from_numpy(long_recording(clips))
        for key, words in (("long", False), ("long_words", True)):
            with torch.no_grad():
                result = model.transcribe(audio, word_timestamps=words, **options)
            entry[key] = {"text": result["text"], "segments": segments_of(result)}
            print(f"{name} {key}: {result['text']!r}")
    args.out.write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
