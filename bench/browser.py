"""Whisper and LLaMA generation in the browser (Pyodide worker, headless Chromium) next to
native numpy, in one run.

    .venv/bin/python bench/browser.py [--tasks whisper,generate] [--model whisper-tiny.en]
                                      [--clips 5] [--profile] [--generate-tokens 64]
                                      [--json bench/results/browser.json]

Measures, with the real page and worker served by `candle-web serve` on 127.0.0.1:
  * page open -> ready: Pyodide runtime, numpy, scipy, the candle_web wheel (worker phases)
  * model load cold (empty Cache API: download + sha256 + build) and cached (second load)
  * per LibriVox clip: browser transcription time and real-time factor (encoder and decoder
    time inside), then the same clip natively with the numpy backend (tests/ui/native_whisper.py,
    one BLAS thread, run after the browser so the two never share the cores), and the ratio
    browser / native. Both sides get bit-identical samples (--chromium-pcm) and the token ids
    are compared.
--profile transcribes the first clip once more under cProfile inside the worker and prints
the functions with the most own time.
Generate (SmolLM2-135M-Instruct Q4_1, the Generate view's worker command): model load cold
(download + sha256 + dequantize to f32) and cached; then a greedy ChatML generation of
--generate-tokens tokens, twice, with prompt and decode tok/s; then the same generation
natively (tests/ui/native_text_models.py, numpy backend, one BLAS thread, after the browser),
the ratio of the decode speeds, and whether the token ids are equal.
Nothing leaves 127.0.0.1: other requests are aborted (and reported).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "pkg")]
SAMPLES_DIR = REPO / "web" / "vendor" / "samples"
NATIVE_SCRIPT = REPO / "tests" / "ui" / "native_whisper.py"
NATIVE_TEXT_SCRIPT = REPO / "tests" / "ui" / "native_text_models.py"
GENERATE_MODEL = "smollm2-135m-instruct"
GENERATE_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
# A prompt with a long answer, so decode runs the whole budget (the model rarely stops early).
GENERATE_PROMPT = "Write a long story about a lighthouse keeper and a lost whale."
GENERATE_RUNS = 2
TASKS = ("whisper", "generate")
READY_TIMEOUT_MS = 300_000
TRANSCRIBE_TIMEOUT_MS = 900_000


def load_by_path(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def vendor() -> None:
    sys.path.insert(0, str(REPO / "scripts"))
    vendor_pyodide = load_by_path("vendor_pyodide", REPO / "scripts" / "vendor_pyodide.py")
    vendor_pyodide.vendor(offline=vendor_pyodide.offline_requested(), build_candle_wheel=True)


def librivox_clips(count: int) -> list[dict]:
    manifest = json.loads((SAMPLES_DIR / "manifest.json").read_text())
    return [clip for clip in manifest["clips"] if clip["librivox"]][:count]


# JS run in the page: decode a served sample like the view does, transcribe it in the worker.
TRANSCRIBE_JS = """async ([file, model, profile]) => {
    const {decodeToMono16k} = await import('./transcribe.js');
    const bytes = await (await fetch('vendor/samples/' + file)).arrayBuffer();
    const samples = await decodeToMono16k(bytes, file);
    const copy = samples.slice();
    const started = performance.now();
    const reply = await window.candleWeb.client.request('transcribe',
        {model, samples: copy, options: {}, profile}, {transfer: [copy.buffer]});
    reply.pageMs = performance.now() - started;
    delete reply.exports;
    return reply;
}"""

LOAD_JS = """async ([model, kind]) => {
    const started = performance.now();
    const reply = await window.candleWeb.client.request('load', {model, kind});
    reply.pageMs = performance.now() - started;
    return reply;
}"""

# JS run in the page: one generation through the Generate view's worker command.
GENERATE_JS = """async ([model, prompt, options]) => {
    const started = performance.now();
    const reply = await window.candleWeb.client.request('generate',
        {model, prompt, chat: true, options});
    reply.pageMs = performance.now() - started;
    return reply;
}"""


def generate_options(tokens: int) -> dict:
    return {"maxTokens": tokens, "temperature": 0, "seed": 299792458, "repeatPenalty": 1}


def run_browser(model: str, clips: list[dict], profile: bool, generate_tokens: int = 0) -> dict:
    from candle_web.serve import make_site_config, start_in_thread
    from playwright.sync_api import sync_playwright

    config = load_by_path("playwright_config", REPO / "playwright.config.py")
    server, url = start_in_thread("127.0.0.1", 0, make_site_config(REPO / "web"))
    origin = url.rstrip("/")
    blocked: list[str] = []

    def guard(route):
        if route.request.url.startswith((origin + "/", "data:", "blob:")):
            route.continue_()
        else:
            blocked.append(route.request.url)
            route.abort("blockedbyclient")

    profile_dir = tempfile.mkdtemp(prefix="candle-web-bench-")
    out: dict = {"clips": {}}
    try:
        with sync_playwright() as playwright:
            context = playwright.chromium.launch_persistent_context(profile_dir,
                                                                    **config.LAUNCH_OPTIONS)
            context.route("**/*", guard)
            page = context.new_page()
            opened = time.perf_counter()
            page.goto(url)
            page.wait_for_function("() => window.candleWeb !== undefined")
            summary = page.evaluate("() => window.candleWeb.ready")
            out["readyWallS"] = time.perf_counter() - opened
            out["ready"] = summary
            page.set_default_timeout(TRANSCRIBE_TIMEOUT_MS)
            if clips:
                out["loadCold"] = page.evaluate(LOAD_JS, [model, "whisper"])
                out["loadCached"] = page.evaluate(LOAD_JS, [model, "whisper"])
            for clip in clips:
                out["clips"][clip["file"]] = page.evaluate(TRANSCRIBE_JS,
                                                           [clip["file"], model, False])
            if profile and clips:
                out["profile"] = page.evaluate(TRANSCRIBE_JS, [clips[0]["file"], model, True])
            if generate_tokens:
                options = generate_options(generate_tokens)
                out["generate"] = {
                    "loadCold": page.evaluate(LOAD_JS, [GENERATE_MODEL, "llama"]),
                    "loadCached": page.evaluate(LOAD_JS, [GENERATE_MODEL, "llama"]),
                    "runs": [page.evaluate(GENERATE_JS, [GENERATE_MODEL, GENERATE_PROMPT, options])
                             for _ in range(GENERATE_RUNS)],
                }
            context.close()
    finally:
        server.shutdown()
        server.server_close()
        shutil.rmtree(profile_dir, ignore_errors=True)
    out["blocked"] = blocked
    return out


def run_native(model: str, clips: list[dict]) -> dict:
    environment = dict(os.environ, CANDLE_WEB_BACKEND="numpy", OPENBLAS_NUM_THREADS="1",
                       OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    command = [sys.executable, str(NATIVE_SCRIPT), "--chromium-pcm", model] + \
        [str(SAMPLES_DIR / clip["file"]) for clip in clips]
    done = subprocess.run(command, env=environment, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"native run failed:\n{done.stderr}")
    return json.loads(done.stdout)


def run_native_generate(tokens: int) -> dict:
    """The browser's generation natively (numpy backend, one BLAS thread), after the browser."""
    from candle_web import hub

    environment = dict(os.environ, CANDLE_WEB_BACKEND="numpy", OPENBLAS_NUM_THREADS="1",
                       OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    job = {"task": "generate", "gguf": str(hub.fetch(GENERATE_MODEL, GENERATE_GGUF, offline=True)),
           "prompt": GENERATE_PROMPT, "chat": True, "options": generate_options(tokens)}
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as jobs:
        json.dump([job], jobs)
    try:
        done = subprocess.run([sys.executable, str(NATIVE_TEXT_SCRIPT), jobs.name],
                              env=environment, capture_output=True, text=True, check=False)
    finally:
        os.unlink(jobs.name)
    if done.returncode != 0:
        raise SystemExit(f"native generate failed:\n{done.stderr}")
    native = json.loads(done.stdout)
    return {"backend": native["backend"], "loadSeconds": native["loadSeconds"][0],
            "result": native["results"][0]}


def print_load(label: str, load: dict) -> None:
    timings = load["timingsMs"]
    files = ("from the Cache API" if load["cached"]
             else f"{load['downloadedBytes'] / 1e6:.1f} MB downloaded")
    print(f"{label}: {load['pageMs'] / 1000:.2f} s (files {timings['download'] / 1000:.2f} s, "
          f"{files}; build {timings['build'] / 1000:.2f} s)")


def print_generate_report(browser: dict, native: dict) -> None:
    print(f"\ngenerate: {GENERATE_MODEL} ({GENERATE_GGUF}), greedy ChatML, "
          f"{len(browser['runs'][0]['tokenIds'])} tokens")
    print_load("model load cold", browser["loadCold"])
    print_load("model load cached", browser["loadCached"])
    header = f"{'run':8} | {'prompt tok':>10} {'prompt tok/s':>12} | {'decode tok/s':>12} | ids"
    print(header)
    print("-" * len(header))
    twin = native["result"]
    for index, run in enumerate(browser["runs"]):
        timings = run["timings"]
        same = run["tokenIds"] == twin["tokenIds"]
        print(f"{'browser' + str(index + 1):8} | {len(run['promptIds']):10d} "
              f"{timings['promptTokensPerSecond']:12.1f} | {timings['tokensPerSecond']:12.2f} | "
              f"{'equal' if same else 'DIFFER'}")
    timings = twin["timings"]
    print(f"{'native':8} | {len(twin['promptIds']):10d} {timings['promptTokensPerSecond']:12.1f} | "
          f"{timings['tokensPerSecond']:12.2f} | (load {native['loadSeconds']:.2f} s, "
          f"{native['backend']} backend)")
    best = max(run["timings"]["tokensPerSecond"] for run in browser["runs"])
    if best > 0:
        print(f"decode: native / browser = {timings['tokensPerSecond'] / best:.2f}x "
              f"(browser best of {len(browser['runs'])})")


def print_report(model: str, browser: dict, native: dict) -> None:
    ready = browser["ready"]
    phases = ", ".join(f"{name} {ms / 1000:.2f}" for name, ms in ready["phases"].items())
    print(f"Pyodide {ready['versions']['pyodide']}, numpy "
          f"{ready['versions']['numpy']}, scipy {ready['versions']['scipy']}")
    print(f"page open -> ready: {browser['readyWallS']:.2f} s wall (worker: {phases} s)")
    if browser["blocked"]:
        print(f"WARNING: {len(browser['blocked'])} off-host request(s) blocked: "
              f"{browser['blocked'][:3]}")
    if browser["clips"]:
        print_whisper_report(model, browser, native)


def print_whisper_report(model: str, browser: dict, native: dict) -> None:
    print(f"\ntranscribe: {model}")
    print_load("model load cold", browser["loadCold"])
    print_load("model load cached", browser["loadCached"])
    header = (f"{'clip':6} {'audio s':>7} | {'browser s':>9} {'RTF':>5} {'enc s':>6} "
              f"{'dec ms/call':>11} | {'native s':>8} {'RTF':>5} | {'ratio':>5} ids")
    print(header)
    print("-" * len(header))
    ratios = []
    for name, result in browser["clips"].items():
        timings = result["timings"]
        twin = native["clips"][name]
        same_input = twin["sha256"] == result["input"]["sha256"]
        same_ids = [s["tokens"] for s in twin["segments"]] == \
            [s["tokens"] for s in result["segments"]]
        browser_s = timings["elapsedMs"] / 1000
        ratio = browser_s / twin["seconds"]
        ratios.append(ratio)
        per_call = timings["decodeMs"] / max(timings["decoderCalls"], 1)
        print(f"{name[-8:-4]:6} {timings['audioSeconds']:7.2f} | {browser_s:9.2f} "
              f"{timings['rtf']:5.2f} {timings['encodeMs'] / 1000:6.2f} {per_call:11.1f} | "
              f"{twin['seconds']:8.2f} {twin['seconds'] / timings['audioSeconds']:5.2f} | "
              f"{ratio:5.2f} {'equal' if same_ids and same_input else 'DIFFER'}")
    if ratios:
        print(f"browser / native numpy: median ratio {statistics.median(ratios):.2f} "
              f"over {len(ratios)} clips")
    if "profile" in browser:
        print("\nprofile (first clip under cProfile, top functions by own time):")
        for row in browser["profile"]["profile"]:
            print(f"  {row['ownMs']:9.1f} ms own {row['cumulativeMs']:9.1f} ms cum "
                  f"{row['calls']:7d} calls  {row['function']}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="whisper-tiny.en")
    parser.add_argument("--clips", type=int, default=5, help="how many LibriVox clips (1-5)")
    parser.add_argument("--profile", action="store_true", help="cProfile one clip in the worker")
    parser.add_argument("--tasks", default=",".join(TASKS),
                        help=f"comma-separated, of {', '.join(TASKS)} (default: all)")
    parser.add_argument("--generate-tokens", type=int, default=64,
                        help="tokens per generation (greedy; 1-2048)")
    parser.add_argument("--json", type=Path, default=None, help="also write the raw figures")
    args = parser.parse_args(argv)
    tasks = [task.strip() for task in args.tasks.split(",") if task.strip()]
    unknown = sorted(set(tasks) - set(TASKS))
    if unknown or not tasks:
        parser.error(f"--tasks: unknown {unknown}; choose from {', '.join(TASKS)}")
    if not 1 <= args.generate_tokens <= 2048:
        parser.error("--generate-tokens must be 1..2048")
    vendor()
    clips = librivox_clips(args.clips) if "whisper" in tasks else []
    if "whisper" in tasks and not clips:
        raise SystemExit("no LibriVox sample clips: run scripts/fetch_test_audio.sh first")
    generate_tokens = args.generate_tokens if "generate" in tasks else 0
    browser = run_browser(args.model, clips, args.profile, generate_tokens)
    native = run_native(args.model, clips) if clips else {"clips": {}}
    print_report(args.model, browser, native)
    if generate_tokens:
        native["generate"] = run_native_generate(generate_tokens)
        print_generate_report(browser["generate"], native["generate"])
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"browser": browser, "native": native}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
