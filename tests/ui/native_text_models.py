"""The native side of the text-model twin checks (Similarity, Generate, Text-to-text views),
run as a subprocess by the UI tests and by bench/browser.py: build each model from the very
file bytes the browser gets, through the same session code (candle_web.worker), with the
numpy backend, and print one JSON object.

    CANDLE_WEB_BACKEND=numpy python tests/ui/native_text_models.py JOBS.json

JOBS.json holds a list of jobs, each one of
    {"task": "embed", "folder": DIR, "sentences": [...]}
        -> {"vectors": [[f32 as float]...], "summary": {...}}
    {"task": "generate", "gguf": FILE, "prompt": "...", "chat": true, "options": {...},
     "responseFormat"?: {...}}   (the page's JSON option: the native engine, xgrammar)
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
sys.path.insert(0, str(REPO_ROOT / "pkg"))

from candle_web.worker import session_for  # noqa: E402  (after the path is set)
from candle_web.worker.session import files_from_folder  # noqa: E402


def run_session(kind: str, folder, request: dict, names=None) -> tuple:
    """(payload, load seconds, run seconds): the browser's build and compute, natively, from
    the files `names` of `folder` (by default the files the session requires)."""
    session = session_for(kind)
    started = time.perf_counter()
    model = session.build(files_from_folder(folder, names or session.required_files))
    loaded = time.perf_counter()
    payload = session.compute(model, **request)
    return payload, loaded - started, time.perf_counter() - loaded


def run_embed(job: dict) -> tuple:
    payload, load_s, run_s = run_session("bert", job["folder"], {"sentences": job["sentences"]})
    vectors = payload.pop("vectors")
    # float(f32) is exact in a double, and JSON writes doubles round-trip exactly.
    return ({"vectors": [[float(x) for x in row] for row in vectors], "summary": payload},
            load_s, run_s)


def run_generate(job: dict) -> tuple:
    gguf = Path(job["gguf"])
    return run_session("llama", gguf.parent, {"prompt": job["prompt"], "chat": job["chat"],
                                              "options": job.get("options"),
                                              "response_format": job.get("responseFormat")},
                       [gguf.name])


def run_text2text(job: dict) -> tuple:
    return run_session("t5", job["folder"], {"prompt": job["prompt"],
                                             "options": job.get("options")})


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
