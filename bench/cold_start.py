"""Process cold start: a fresh Python process from launch to the first generated token (LLaMA)
or the first transcribed segment (Whisper), candle-web against the PyTorch stacks.

    .venv/bin/python bench/cold_start.py [--repeat 3] [--threads 2] [--only llama|whisper]

Each measurement is one new subprocess, timed from the parent (interpreter start, imports,
model load, tokenization, compute, exit), median of `--repeat`:

- LLaMA, SmolLM2-135M-Instruct, a short ChatML prompt, one greedy token:
  candle-web numpy / numba on the Q4_1 GGUF; `import torch` + transformers
  LlamaForCausalLM.from_pretrained on the dequantized float checkpoint (safetensors).
- Whisper tiny.en, the first 3 s of a LibriVox clip, greedy: candle-web numpy / numba
  (load_whisper + transcribe); `import torch` + openai-whisper load_model (a .pt checkpoint
  converted once from the same weights) + transcribe.

The numba kernel cache is warmed by one untimed run per candle-web variant first (the state a
user is in after `make demo`); PyTorch's runs get the same untimed first run, so file caches
are warm for everyone. The checkpoints PyTorch loads are written to a temp folder beforehand.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
# bench/whisper.py would shadow the openai-whisper package: keep this folder off the path.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != BENCH_DIR]
sys.path[:0] = [str(REPO / "pkg"), str(REPO / "native"), str(REPO)]

LLAMA_MODEL = "smollm2-135m-instruct"
LLAMA_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
WHISPER_MODEL = "whisper-tiny.en"
CLIP_SECONDS = 3.0
THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
                    "NUMBA_NUM_THREADS")
QUESTION = "What is the capital of France?"

# Child programs: each prints one JSON line with what it produced (a sanity check that the
# work really ran). Paths arrive through argv; the child's sys.path is set by PYTHONPATH.
CANDLE_LLAMA = textwrap.dedent("""
    import json, sys
    from candle_web import Device
    from candle_web.generation.chat_templates import chat_template_for
    from candle_web.pipelines import load_llama
    loaded = load_llama(sys.argv[1], device=Device.cpu(backend=sys.argv[2]))
    model, tokenizer = loaded.model, loaded.tokenizer
    prompt = chat_template_for(model, tokenizer).render([{"role": "user", "content": sys.argv[3]}])
    ids = tokenizer.encode(prompt, add_special_tokens=False).ids
    token = int(model.forward([ids]).to_numpy()[0].argmax())
    print(json.dumps({"first": tokenizer.decode([token])}))
""")
TORCH_LLAMA = textwrap.dedent("""
    import json, sys
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM
    model = LlamaForCausalLM.from_pretrained(sys.argv[1], torch_dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(sys.argv[1])
    ids = tokenizer.apply_chat_template([{"role": "user", "content": sys.argv[3]}],
                                        add_generation_prompt=True)
    ids = ids["input_ids"] if hasattr(ids, "keys") else ids
    with torch.no_grad():
        token = int(model(torch.tensor([ids])).logits[0, -1].argmax())
    print(json.dumps({"first": tokenizer.decode([token])}))
""")
CANDLE_WHISPER = textwrap.dedent("""
    import json, sys
    import numpy as np
    from candle_web import Device
    from candle_web.pipelines.transcribe import TranscribeOptions, transcribe
    from candle_web.pipelines import load_whisper
    loaded = load_whisper(sys.argv[1], device=Device.cpu(backend=sys.argv[2]))
    model, tokenizer = loaded.model, loaded.tokenizer
    samples = np.load(sys.argv[3])
    result = transcribe(model, tokenizer, samples, TranscribeOptions(temperatures=(0.0,)))
    print(json.dumps({"first": result.segments[0].text if result.segments else ""}))
""")
TORCH_WHISPER = textwrap.dedent("""
    import json, sys
    import numpy as np
    import torch
    import whisper
    model = whisper.load_model(sys.argv[1], device="cpu")
    samples = np.load(sys.argv[3])
    result = model.transcribe(samples, temperature=0.0, fp16=False, language="en")
    print(json.dumps({"first": result["segments"][0]["text"] if result["segments"] else ""}))
""")


def _median(values):
    values = sorted(values)
    return values[len(values) // 2]


def run_child(program: str, args: list, env: dict) -> tuple:
    """(wall seconds, parsed JSON output) of one fresh `python -c program args...`."""
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", program, *map(str, args)], env=env,
                          capture_output=True, text=True)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"cold-start child failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return elapsed, json.loads(done.stdout.strip().splitlines()[-1])


def child_env(threads: int, backend: str = None) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "pkg"), str(REPO / "native")])
    for variable in THREAD_VARIABLES:
        env[variable] = str(threads)
    if backend:
        env["CANDLE_WEB_BACKEND"] = backend
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return env


def prepare_llama(work: Path) -> tuple:
    """(GGUF path, HF float folder with tokenizer) for SmolLM2."""
    from tests.reference.record_llama import read_with_candle_web, write_hf_checkpoint

    from candle_web import hub

    gguf = hub.fetch(LLAMA_MODEL, LLAMA_GGUF)
    metadata, tensors = read_with_candle_web(gguf)
    folder = work / "smollm2-hf"
    write_hf_checkpoint(metadata, tensors, folder)
    # transformers builds its tokenizer (and chat template) from the GGUF vocabulary.
    from transformers import AutoTokenizer

    AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name).save_pretrained(folder)
    return gguf, folder


def prepare_whisper(work: Path) -> tuple:
    """(openai-whisper .pt checkpoint converted from the CT2 model.bin, 3 s clip .npy)."""
    import numpy as np
    import torch

    from tests.reference import record_whisper as reference
    from candle_web import hub
    from candle_web.io import audio

    model_bin = hub.fetch(WHISPER_MODEL, "model.bin")
    model = reference.load_openai_model(model_bin)
    checkpoint = work / "tiny.en.pt"
    torch.save({"dims": vars(model.dims), "model_state_dict": model.state_dict()}, checkpoint)
    clips = reference.speech_clips(hub.cache_dir() / "testdata" / "speech")
    first = next(name for name in clips if name.startswith("librivox/"))
    clip = work / "clip3s.npy"
    np.save(clip, clips[first][:int(CLIP_SECONDS * audio.SAMPLE_RATE)].astype(np.float32))
    return checkpoint, clip


def measure(label, program, args, env, repeat, rows):
    run_child(program, args, env)  # untimed: warms the numba cache and the file cache
    times, output = [], None
    for _ in range(repeat):
        elapsed, output = run_child(program, args, env)
        times.append(elapsed)
    rows.append((label, _median(times), min(times), output["first"]))
    print(f"  {label:34} median {_median(times):6.2f} s  (min {min(times):.2f})  "
          f"-> {output['first']!r}", flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--only", choices=("llama", "whisper"))
    args = parser.parse_args(argv)
    load = os.getloadavg()
    print(f"cold start, fresh process each, median of {args.repeat}; {args.threads} threads; "
          f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} CPUs")
    rows = []
    with tempfile.TemporaryDirectory(prefix="candle-web-cold-start-") as work:
        work = Path(work)
        if args.only in (None, "llama"):
            print("LLaMA (SmolLM2-135M-Instruct, first token of a chat answer):")
            gguf, folder = prepare_llama(work)
            for backend in ("numpy", "numba"):
                measure(f"llama candle-web {backend} (Q4_1)", CANDLE_LLAMA,
                        [gguf, backend, QUESTION], child_env(args.threads, backend),
                        args.repeat, rows)
            measure("llama torch + transformers (f32)", TORCH_LLAMA, [folder, "-", QUESTION],
                    child_env(args.threads), args.repeat, rows)
        if args.only in (None, "whisper"):
            print(f"Whisper tiny.en ({CLIP_SECONDS:.0f} s clip, first segment):")
            checkpoint, clip = prepare_whisper(work)
            for backend in ("numpy", "numba"):
                measure(f"whisper candle-web {backend}", CANDLE_WHISPER,
                        [WHISPER_MODEL, backend, clip], child_env(args.threads, backend),
                        args.repeat, rows)
            measure("whisper torch + openai-whisper", TORCH_WHISPER, [checkpoint, "-", clip],
                    child_env(args.threads), args.repeat, rows)
    torch_rows = {label.split()[0]: median for label, median, _, _ in rows if "torch" in label}
    print(f"\n{'process':36} {'median s':>9} {'x torch':>8}")
    for label, median, _, _ in rows:
        base = torch_rows.get(label.split()[0])
        ratio = f"{median / base:.2f}" if base else "-"
        print(f"{label:36} {median:9.2f} {ratio:>8}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
