"""The native side of the text-model twin checks (Similarity, Generate, Text-to-text views),
run as a subprocess by the UI tests and by bench/browser.py: build each model from the very
file bytes the browser gets, through the same web/py session code, with the numpy backend,
and print one JSON object.

    CANDLE_WEB_BACKEND=numpy python tests/ui/native_text_models.py JOBS.json

JOBS.json holds a list of jobs, each one of
    {"task": "embed", "folder": DIR, "sentences": [...]}
        -> {"vectors": [[f32 as float]...], "summary": {...}}
    {"task": "generate", "gguf": FILE, "prompt": "...", "chat": true, "options": {...}}
        -> the Generate view's result payload (tokenIds, text, timings, ...)
    {"task": "text2text", "folder": DIR, "prompt": "...", "options": {...}}
        -> the Text-to-text view's result payload
and the output is {"backend", "results": [...], "seconds": [...], "loadSeconds": [...]} in the
same order. A separate process because the backend is chosen once per process
(CANDLE_WEB_BACKEND), and so that it runs on the other core while the browser works.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO_ROOT / "pkg"), str(REPO_ROOT / "web" / "py")]

import bert_session  # noqa: E402  (web/py, after the path is set)
import llama_session  # noqa: E402
import model_files  # noqa: E402
import t5_session  # noqa: E402


def run_embed(job: dict) -> tuple:
    started = time.perf_counter()
    files = model_files.file_bytes_from_folder(job["folder"], bert_session.REQUIRED_FILES)
    embedder = bert_session.build_embedder(files)
    loaded = time.perf_counter()
    vectors, summary = bert_session.embed_sentences(embedder, job["sentences"])
    # float(f32) is exact in a double, and JSON writes doubles round-trip exactly.
    payload = {"vectors": [[float(x) for x in row] for row in vectors], "summary": summary}
    return payload, loaded - started, time.perf_counter() - loaded


def run_generate(job: dict) -> tuple:
    started = time.perf_counter()
    gguf = Path(job["gguf"])
    model, tokenizer = llama_session.build_generator(
        model_files.file_bytes_from_folder(gguf.parent, [gguf.name])[gguf.name])
    loaded = time.perf_counter()
    payload = llama_session.run_generation(model, tokenizer, job["prompt"], job["chat"],
                                           job.get("options"))
    return payload, loaded - started, time.perf_counter() - loaded


def run_text2text(job: dict) -> tuple:
    started = time.perf_counter()
    files = model_files.file_bytes_from_folder(job["folder"], t5_session.REQUIRED_FILES)
    generator = t5_session.build_generator(files)
    loaded = time.perf_counter()
    payload = t5_session.run_text2text(generator, job["prompt"], job.get("options"))
    return payload, loaded - started, time.perf_counter() - loaded


TASKS = {"embed": run_embed, "generate": run_generate, "text2text": run_text2text}


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    from candle_web import Device

    jobs = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    results, load_seconds, seconds = [], [], []
    for job in jobs:
        payload, load_s, run_s = TASKS[job["task"]](job)
        results.append(payload)
        load_seconds.append(load_s)
        seconds.append(run_s)
    json.dump({"backend": Device.cpu().backend.name, "results": results,
               "loadSeconds": load_seconds, "seconds": seconds}, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
