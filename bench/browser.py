"""Whisper and LLaMA generation in the browser (Pyodide worker, headless Chromium) next to
native numpy and next to transformers.js in the same Chromium, in one run.

    .venv/bin/python bench/browser.py [--tasks whisper,generate] [--model whisper-tiny.en]
                                      [--clips 5] [--profile] [--generate-tokens 64]
                                      [--modes backend=numpy,backend=wasm]
                                      [--peers fp32:1,fp32:2,q8:1,q8:2] [--no-q8]
                                      [--peer-only | --skip-peer] [--skip-native]
                                      [--json bench/results/browser.json]

Measures, with the real page and worker served by `candle-web serve` on 127.0.0.1, once per
--modes entry (the page URL's query, e.g. `?backend=numpy`; each page in a fresh browser
profile, so every page-ready figure is cold):
  * page open -> ready: Pyodide runtime, numpy, scipy, the candle_web wheel (worker phases),
    and the backend the page says it runs (its ready answer or its footer). A mode whose
    backend the page does not report running is "not available" with the page's answer.
  * model load cold (empty Cache API: download + sha256 + build) and cached (second load)
  * per LibriVox clip: browser transcription time and real-time factor (encoder and decoder
    time inside), then the same clip natively with the numpy backend (tests/ui/native_whisper.py,
    one BLAS thread, run after the browser so the two never share the cores), and the ratio
    browser / native. Both sides get bit-identical samples (--chromium-pcm) and the token ids
    are compared.
The peer (unless --skip-peer): transformers.js 4.3.1 (package.json's devDependencies, npm ci'd
here when missing) with onnxruntime-web's wasm from node_modules, in the same Chromium, on ONNX
files exported from the same weights by scripts/export_onnx.py (cached in the model cache;
the first run exports: ~1 min). bench/peer/transformers_js.html, once per --peers entry
(dtype:threads; q8 = the *_quantized.onnx files; 2 threads need crossOriginIsolated, which
the server's headers give), transcribes the same clips from the same decoded 16 kHz samples
(sha256 compared) with the ASR pipeline, greedy, no timestamps. Printed side by side: RTF per
clip and over all clips for each candle-web mode and each peer, the ratios candle-web / peer
(above 1: candle-web slower), page-ready times, and the word-level agreement of every
transcript with the native numpy one (candle-web's transcripts carry timestamps, the peer's
do not; words are compared lower-cased, without punctuation).
--profile transcribes the first clip once more under cProfile inside the worker and prints
the functions with the most own time.
Generate (SmolLM2-135M-Instruct Q4_1, the Generate view's worker command): model load cold
(download + sha256 + dequantize to f32) and cached; then a greedy ChatML generation of
--generate-tokens tokens, twice, with prompt and decode tok/s; then the same generation
natively (tests/ui/native_text_models.py, numpy backend, one BLAS thread, after the browser),
the ratio of the decode speeds, and whether the token ids are equal. The peer runs the same
prompt ids (candle-web's ChatML rendering) through transformers.js's generate on the ONNX
export of the same GGUF (dequantized to f32; q8 re-quantizes those), greedy, same budget.
--tasks llm (bench/browser_llm.py): candle-web's page next to wllama 3.13.0 (llama.cpp in
WebAssembly) on the same GGUF files (SmolLM2 Q4_1, its Q8_0 and Q4_0 requantizations, Qwen2.5-
Coder-0.5B Q4_K_M), 1 and 2 threads, greedy, the same prompt; --llm-files picks the files.
--tasks faces (bench/browser_faces.py): the Faces view next to face-api 1.7.15 on TensorFlow.js's
wasm backend (SIMD, 1 and 2 threads) on face-api's six demo photos (tiny detector + landmarks),
and the view's camera frame rate on Chromium's fake camera.
Nothing leaves 127.0.0.1: other requests are aborted (and reported).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "pkg"), str(REPO / "bench")]
from browser_faces import run_faces  # noqa: E402  (the face-api peer, --tasks faces)
from browser_llm import LLM_FILES, run_llm  # noqa: E402  (the wllama peer, --tasks llm)
SAMPLES_DIR = REPO / "web" / "vendor" / "samples"
NATIVE_SCRIPT = REPO / "tests" / "ui" / "native_whisper.py"
NATIVE_TEXT_SCRIPT = REPO / "tests" / "ui" / "native_text_models.py"
GENERATE_MODEL = "smollm2-135m-instruct"
GENERATE_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
# A prompt with a long answer, so decode runs the whole budget (the model rarely stops early).
GENERATE_PROMPT = "Write a long story about a lighthouse keeper and a lost whale."
GENERATE_RUNS = 2
# llm: bench/browser_llm.py (the wllama peer); faces: bench/browser_faces.py (face-api's)
TASKS = ("whisper", "generate", "llm", "faces")
READY_TIMEOUT_MS = 300_000
TRANSCRIBE_TIMEOUT_MS = 900_000
# threads=1 / threads=2: the wasm backend on one thread and on two (the page's default where
# the browser reports two cores), each counted only when the page's answer confirms it.
DEFAULT_MODES = ("backend=numpy", "backend=wasm&threads=1", "backend=wasm&threads=2")
DEFAULT_PEERS = ("fp32:1", "fp32:2", "q8:1", "q8:2")
PEER_DTYPES = ("fp32", "q8")
PEER_PAGE = "transformers_js.html"
TRANSFORMERS_JS_VERSION = "4.3.1"
NODE_MODULES = REPO / "node_modules"
# /models/local/<name>/ folders the server maps for the peer page (serve.SiteConfig).
PEER_FOLDERS = {
    "peer": REPO / "bench" / "peer",
    "transformers-js": NODE_MODULES / "@huggingface" / "transformers" / "dist",
    "onnxruntime-web": NODE_MODULES / "onnxruntime-web" / "dist",
}
PEER_MODEL_PREFIX = "tjs-"


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
TRANSCRIBE_JS = """async ([file, model, profile, options]) => {
    const {decodeToMono16k} = await import('./transcribe.js');
    const bytes = await (await fetch('vendor/samples/' + file)).arrayBuffer();
    const samples = await decodeToMono16k(bytes, file);
    const copy = samples.slice();
    const started = performance.now();
    const reply = await window.candleWeb.client.request('transcribe',
        {model, samples: copy, options: options || {}, profile}, {transfer: [copy.buffer]});
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


class BrowserSession:
    """One `candle-web serve` (web/ plus the peer's folders) and Playwright; every page gets a
    fresh Chromium profile (launch_persistent_context), so each page-ready figure is cold."""

    def __init__(self, peer_folders: dict):
        from candle_web.serve import make_site_config, start_in_thread
        from playwright.sync_api import sync_playwright

        self.config = load_by_path("playwright_config", REPO / "playwright.config.py")
        site = make_site_config(REPO / "web")
        site.local_models.update(peer_folders)
        self.server, url = start_in_thread("127.0.0.1", 0, site)
        self.origin = url.rstrip("/")
        self.blocked: list[str] = []
        self.playwright = sync_playwright().start()

    def guard(self, route):
        if route.request.url.startswith((self.origin + "/", "data:", "blob:")):
            route.continue_()
        else:
            self.blocked.append(route.request.url)
            route.abort("blockedbyclient")

    def run_page(self, path: str, work):
        """Open origin/path in a fresh profile, return work(page, opened_perf_counter)."""
        profile_dir = tempfile.mkdtemp(prefix="candle-web-bench-")
        try:
            context = self.playwright.chromium.launch_persistent_context(
                profile_dir, **self.config.LAUNCH_OPTIONS)
            try:
                context.route("**/*", self.guard)
                page = context.new_page()
                page.set_default_timeout(READY_TIMEOUT_MS)
                opened = time.perf_counter()
                page.goto(f"{self.origin}/{path}")
                return work(page, opened)
            finally:
                context.close()
        finally:
            shutil.rmtree(profile_dir, ignore_errors=True)

    def close(self):
        self.playwright.stop()
        self.server.shutdown()
        self.server.server_close()


def reported_backend(page, summary) -> dict:
    """What the page says it runs: its ready answer's `backend` object (name, variant, label,
    reason, ...), else a name found as "backend: NAME" in the page's text (the footer)."""
    value = summary.get("backend") if isinstance(summary, dict) else None
    if isinstance(value, dict) and value.get("name"):
        return value
    if isinstance(value, str) and value:
        return {"name": value}
    text = page.evaluate("() => document.body.innerText")
    found = re.search(r"backend:\s*([A-Za-z0-9_.-]+)", text)
    return {"name": found.group(1)} if found else {}


def unmet_options(query: str, backend: dict) -> list[str]:
    """The query's options the page's answer does not confirm. backend=NAME needs that name
    (an old page that reports none runs numpy, its only backend); any other option (e.g. a
    future threads=2) needs the same value in the answer's backend object."""
    unmet = []
    for key, value in (part.split("=", 1) for part in query.split("&") if "=" in part):
        if key == "backend":
            name = backend.get("name") or "numpy"
            if name != value:
                unmet.append(f"backend={value} (the page runs {name}"
                             + (f": {backend['reason']}" if backend.get("reason") else "") + ")")
        elif str(backend.get(key)) != value:
            unmet.append(f"{key}={value} (the page reports {key} {backend.get(key)!r})")
    return unmet


def run_candle_page(session: BrowserSession, query: str, model: str, clips: list[dict],
                    profile: bool, generate_tokens: int = 0, words: bool = False) -> dict:
    """candle-web's page at ?query: ready, then the clips and the generation, when the page
    confirms it runs what the query asks for."""

    def work(page, opened):
        out: dict = {"query": query, "clips": {}}
        page.wait_for_function("() => window.candleWeb !== undefined")
        try:
            summary = page.evaluate("() => window.candleWeb.ready")
        except Exception as error:  # the page's own refusal (e.g. ?backend=wasm, no kernels)
            out.update(available=False, reason=f"the page did not start: {first_line(error)}")
            return out
        out["readyWallS"] = time.perf_counter() - opened
        out["ready"] = summary
        backend = reported_backend(page, summary)
        out["backend"] = backend.get("name")
        out["backendLabel"] = backend.get("label")
        unmet = unmet_options(query, backend)
        if unmet:
            out.update(available=False, reason="not confirmed by the page: " + "; ".join(unmet))
            return out
        out["available"] = True
        page.set_default_timeout(TRANSCRIBE_TIMEOUT_MS)
        if clips:
            out["loadCold"] = page.evaluate(LOAD_JS, [model, "whisper"])
            out["loadCached"] = page.evaluate(LOAD_JS, [model, "whisper"])
        for clip in clips:
            out["clips"][clip["file"]] = page.evaluate(TRANSCRIBE_JS,
                                                       [clip["file"], model, False])
        if profile and clips:
            out["profile"] = page.evaluate(TRANSCRIBE_JS, [clips[0]["file"], model, True])
        if words and clips:  # word timestamps off and on, clip by clip (issue 26)
            out["words"] = [[page.evaluate(TRANSCRIBE_JS, [clip["file"], model, False, options])
                             ["timings"]["elapsedMs"]
                             for options in ({}, {"word_timestamps": True})] for clip in clips]
        if generate_tokens:
            options = generate_options(generate_tokens)
            out["generate"] = {
                "loadCold": page.evaluate(LOAD_JS, [GENERATE_MODEL, "llama"]),
                "loadCached": page.evaluate(LOAD_JS, [GENERATE_MODEL, "llama"]),
                "runs": [page.evaluate(GENERATE_JS, [GENERATE_MODEL, GENERATE_PROMPT, options])
                         for _ in range(GENERATE_RUNS)],
            }
        return out

    return session.run_page(f"?{query}" if query else "", work)


def mode_label(mode: dict) -> str:
    """cw NAME plus the query's other options: "cw numpy", "cw wasm", "cw wasm threads=2"."""
    extra = [part for part in mode["query"].split("&") if part and not part.startswith("backend=")]
    return " ".join(["cw", mode.get("backend") or "numpy", *extra])


def first_line(error) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0][:300]


# --- the transformers.js peer -----------------------------------------------------------------

def parse_peers(spec: str) -> list[tuple[str, int]]:
    peers = []
    for item in (part.strip() for part in spec.split(",")):
        if not item:
            continue
        dtype, _, threads = item.partition(":")
        if dtype not in PEER_DTYPES or not threads.isdigit() or not 1 <= int(threads) <= 8:
            raise ValueError(f"--peers: {item!r} is not DTYPE:THREADS with DTYPE in "
                             f"{PEER_DTYPES} and THREADS 1..8")
        peers.append((dtype, int(threads)))
    return peers


def installed_transformers_js() -> str | None:
    manifest = NODE_MODULES / "@huggingface" / "transformers" / "package.json"
    try:
        return json.loads(manifest.read_text())["version"]
    except (OSError, ValueError, KeyError):
        return None


def ensure_transformers_js() -> None:
    """node_modules/@huggingface/transformers at the pinned version: `npm ci` (package-lock.json,
    dev dependencies included) when it is missing; the set-up's own npm ci omits them."""
    if installed_transformers_js() == TRANSFORMERS_JS_VERSION and \
            (PEER_FOLDERS["onnxruntime-web"] / "ort-wasm-simd-threaded.asyncify.wasm").is_file():
        return
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError("npm not found: it installs transformers.js for the peer")
    print(f"installing @huggingface/transformers@{TRANSFORMERS_JS_VERSION} (npm ci) ...",
          file=sys.stderr, flush=True)
    done = subprocess.run([npm, "ci", "--include=dev", "--omit=optional", "--ignore-scripts",
                           "--no-audit", "--no-fund"], cwd=REPO, capture_output=True, text=True,
                          check=False)
    if done.returncode != 0 or installed_transformers_js() != TRANSFORMERS_JS_VERSION:
        raise RuntimeError(f"npm ci failed (exit {done.returncode}): {done.stderr.strip()[-800:]}")


def prepare_peer(tasks: list[str], model: str, q8: bool) -> tuple[dict, dict]:
    """({local folder name: path} for the server, {task: export info or the reason it has none})."""
    exporter = load_by_path("export_onnx", REPO / "scripts" / "export_onnx.py")
    folders, exports = dict(PEER_FOLDERS), {}
    ensure_transformers_js()
    wanted = {"whisper": model, "generate": GENERATE_MODEL}
    for task in tasks:
        name = wanted[task]
        try:
            info = exporter.ensure_export(name, q8=q8)
        except (exporter.ExportError, ImportError) as error:
            exports[task] = {"error": f"{type(error).__name__}: {error}"}
            continue
        exports[task] = info
        folders[PEER_MODEL_PREFIX + name] = Path(info["folder"])
    return folders, exports


PEER_TRANSCRIBE_JS = "file => window.peer.transcribe(file)"
PEER_GENERATE_JS = "([ids, tokens]) => window.peer.generate(ids, tokens)"


def run_peer_page(session: BrowserSession, task: str, model: str, dtype: str, threads: int,
                  clips: list[dict] = (), prompt_ids: list | None = None,
                  tokens: int = 0) -> dict:
    query = f"task={task}&model={PEER_MODEL_PREFIX}{model}&dtype={dtype}&threads={threads}"

    def work(page, opened):
        out: dict = {"dtype": dtype, "threads": threads, "clips": {}}
        page.wait_for_function("() => window.peer !== undefined")
        try:
            out["ready"] = page.evaluate("() => window.peer.ready")
        except Exception as error:
            out["error"] = first_line(error)
            return out
        out["readyWallS"] = time.perf_counter() - opened
        page.set_default_timeout(TRANSCRIBE_TIMEOUT_MS)
        for clip in clips:
            out["clips"][clip["file"]] = page.evaluate(PEER_TRANSCRIBE_JS, clip["file"])
        if prompt_ids is not None:
            out["runs"] = [page.evaluate(PEER_GENERATE_JS, [prompt_ids, tokens])
                           for _ in range(GENERATE_RUNS)]
        return out

    return session.run_page(f"models/local/peer/{PEER_PAGE}?{query}", work)


# --- transcripts compared word by word -----------------------------------------------------------

def words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+(?:'[a-z0-9]+)*", text.lower())


def word_agreement(reference: str, other: str) -> float:
    """1 - word edit distance / reference words (1.0: the same words in the same order)."""
    ref, hyp = words(reference), words(other)
    if not ref:
        return 1.0 if not hyp else 0.0
    previous = list(range(len(hyp) + 1))
    for i, word in enumerate(ref, 1):
        current = [i] + [0] * len(hyp)
        for j, candidate in enumerate(hyp, 1):
            current[j] = min(previous[j] + 1, current[j - 1] + 1,
                             previous[j - 1] + (word != candidate))
        previous = current
    return 1.0 - previous[-1] / len(ref)


def candle_text(reply: dict) -> str:
    return " ".join(segment["text"].strip() for segment in reply["segments"])


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
    """One candle-web page: its start, backend and clips against native numpy."""
    print(f"\n== candle-web page ?{browser['query']} ==")
    if not browser["available"]:
        print(f"not available: {browser['reason']}")
        return
    ready = browser["ready"]
    phases = ", ".join(f"{name} {ms / 1000:.2f}" for name, ms in ready["phases"].items())
    versions = ready.get("versions", {})
    label = f" ({browser['backendLabel']})" if browser.get("backendLabel") else ""
    print(f"backend {browser['backend'] or 'not reported (numpy)'}{label}; Pyodide "
          f"{versions.get('pyodide')}, numpy {versions.get('numpy')}, scipy "
          f"{versions.get('scipy', '-')}")
    print(f"page open -> ready: {browser['readyWallS']:.2f} s wall (worker: {phases} s)")
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
        twin = native.get("clips", {}).get(name)
        browser_s = timings["elapsedMs"] / 1000
        per_call = timings["decodeMs"] / max(timings["decoderCalls"], 1)
        if twin is None:  # --skip-native
            print(f"{name[-8:-4]:6} {timings['audioSeconds']:7.2f} | {browser_s:9.2f} "
                  f"{timings['rtf']:5.2f} {timings['encodeMs'] / 1000:6.2f} {per_call:11.1f} |"
                  f" (no native run)")
            continue
        same_input = twin["sha256"] == result["input"]["sha256"]
        same_ids = [s["tokens"] for s in twin["segments"]] == \
            [s["tokens"] for s in result["segments"]]
        ratio = browser_s / twin["seconds"]
        ratios.append(ratio)
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


def print_side_by_side(model: str, clips: list[dict], modes: list[dict], peers: list[dict],
                       native: dict) -> None:
    """RTF per clip for every candle-web mode and peer, totals, ratios and word agreement."""
    engines = [(mode_label(mode), mode["clips"], "candle")
               for mode in modes if mode["available"] and mode["clips"]]
    engines += [(f"tjs {peer['dtype']} {peer['threads']}t", peer["clips"], "peer")
                for peer in peers if peer["clips"]]
    if not engines:
        return
    print(f"\nside by side: {model}, {len(clips)} LibriVox clips, RTF = seconds / audio seconds "
          "(below 1: faster than real time)")
    width = {name: max(15, len(name)) for name, _, _ in engines}
    header = f"{'clip':6} {'audio s':>7} | " + " ".join(f"{name:>{width[name]}}"
                                                         for name, _, _ in engines)
    if native["clips"]:
        header += f" | {'native numpy':>12}"
    print(header)
    print("-" * len(header))
    totals = {name: 0.0 for name, _, _ in engines}
    audio_total = 0.0
    for clip in clips:
        file = clip["file"]
        audio = None
        cells = []
        for name, results, kind in engines:
            result = results.get(file)
            if result is None:
                cells.append(f"{'-':>{width[name]}}")
                continue
            seconds = (result["timings"]["elapsedMs"] if kind == "candle" else result["ms"]) / 1000
            audio = (result["timings"]["audioSeconds"] if kind == "candle"
                     else result["audioSeconds"])
            totals[name] += seconds
            cells.append(f"{f'{seconds:7.2f}s {seconds / audio:6.3f}':>{width[name]}}")
        audio_total += audio or 0.0
        line = f"{file[-8:-4]:6} {audio or 0:7.2f} | " + " ".join(cells)
        if native["clips"]:
            twin = native["clips"][file]
            line += f" | {twin['seconds']:6.2f}s {twin['seconds'] / audio:5.3f}"
        print(line)
    print("-" * len(header))
    line = f"{'all':6} {audio_total:7.2f} | " + " ".join(
        f"{f'{totals[name]:7.2f}s {totals[name] / audio_total:6.3f}':>{width[name]}}"
        for name, _, _ in engines)
    if native["clips"]:
        native_total = sum(native["clips"][clip["file"]]["seconds"] for clip in clips)
        line += f" | {native_total:6.2f}s {native_total / audio_total:5.3f}"
    print(line)
    candles = [name for name, _, kind in engines if kind == "candle"]
    peer_names = [name for name, _, kind in engines if kind == "peer"]
    for candle in candles:
        ratios = ", ".join(f"{totals[candle] / totals[peer]:.2f}x {peer}" for peer in peer_names)
        if ratios:
            print(f"{candle} / peer (above 1: candle-web slower): {ratios}")
    # Words: against the native numpy transcript (the reference twin), else the first engine.
    reference_name = "native numpy" if native["clips"] else engines[0][0]

    def text_of(kind, result):
        return candle_text(result) if kind == "candle" else result["text"]

    references = {clip["file"]: (candle_text(native["clips"][clip["file"]]) if native["clips"]
                                 else text_of(engines[0][2], engines[0][1][clip["file"]]))
                  for clip in clips}
    agreements = []
    for name, results, kind in engines:
        scores = [word_agreement(references[file], text_of(kind, result))
                  for file, result in results.items()]
        agreements.append(f"{name} {100 * statistics.mean(scores):.1f}%")
    print(f"word agreement with {reference_name} (mean over clips): " + ", ".join(agreements))
    for peer in peers:
        for file, result in peer["clips"].items():
            page = next((mode["clips"][file] for mode in modes
                         if mode["available"] and file in mode["clips"]), None)
            if page is not None and page["input"]["sha256"] != result["sha256"]:
                print(f"WARNING: {file}: the peer page decoded other samples than candle-web's")
    for name, results, kind in engines:
        if kind != "peer":
            continue
        for file, result in results.items():
            if word_agreement(references[file], result["text"]) < 1.0:
                print(f"  {name} {file[-8:-4]}: {result['text'].strip()!r}")
                print(f"  {'reference':>{len(name)}} {file[-8:-4]}: {references[file]!r}")


def print_peer_ready(peers: list[dict], label: str) -> None:
    for peer in peers:
        name = f"tjs {peer['dtype']} {peer['threads']}t"
        if "error" in peer:
            print(f"{label} {name}: did not start: {peer['error']}")
            continue
        ready = peer["ready"]
        phases = ", ".join(f"{key} {ms / 1000:.2f}" for key, ms in ready["phases"].items())
        print(f"{label} {name}: page open -> pipeline ready {peer['readyWallS']:.2f} s wall "
              f"(in page: {phases} s; crossOriginIsolated {ready['crossOriginIsolated']}, "
              f"{ready['threads']} thread(s), transformers.js {ready['versions']['transformers']}, "
              f"onnxruntime-web {ready['versions']['onnxruntimeWeb']})")


def print_candle_ready(modes: list[dict]) -> None:
    for mode in modes:
        if not mode["available"]:
            print(f"candle-web ?{mode['query']}: not available: {mode['reason']}")
            continue
        load = mode.get("loadCold")
        extra = (f" + model load cold {load['pageMs'] / 1000:.2f} s = "
                 f"{mode['readyWallS'] + load['pageMs'] / 1000:.2f} s" if load else "")
        print(f"candle-web ?{mode['query']} ({mode_label(mode)}): page open -> ready "
              f"{mode['readyWallS']:.2f} s{extra}")


def print_generate_side_by_side(modes: list[dict], peers: list[dict], native: dict | None,
                                exports: dict) -> None:
    rows = []
    for mode in modes:
        if mode["available"] and "generate" in mode:
            best = max(mode["generate"]["runs"], key=lambda r: r["timings"]["tokensPerSecond"])
            rows.append((f"{mode_label(mode)} (Q4_1)", best["tokenIds"],
                         best["timings"]["promptTokensPerSecond"],
                         best["timings"]["tokensPerSecond"]))
    for peer in peers:
        if peer.get("runs"):
            best = max(peer["runs"], key=lambda r: r["tokensPerSecond"])
            rows.append((f"tjs {peer['dtype']} {peer['threads']}t (ONNX f32"
                         f"{' -> q8' if peer['dtype'] == 'q8' else ''})", best["tokenIds"],
                         best["promptTokensPerSecond"], best["tokensPerSecond"]))
    if native:
        timings = native["result"]["timings"]
        rows.append(("native numpy (Q4_1)", native["result"]["tokenIds"],
                     timings["promptTokensPerSecond"], timings["tokensPerSecond"]))
    if "generate" in exports and "error" in exports["generate"]:
        print(f"\ngenerate peer: no ONNX export: {exports['generate']['error']}")
    if not rows:
        return
    reference = native["result"]["tokenIds"] if native else rows[0][1]
    print(f"\ngenerate side by side: {GENERATE_MODEL}, greedy, same prompt ids; best of "
          f"{GENERATE_RUNS} runs")
    header = f"{'engine':34} | {'prompt tok/s':>12} | {'decode tok/s':>12} | ids vs reference"
    print(header)
    print("-" * len(header))
    for name, ids, prompt, decode in rows:
        at = next((i for i, (a, b) in enumerate(zip(ids, reference)) if a != b),
                  None if len(ids) == len(reference) else min(len(ids), len(reference)))
        where = "equal" if at is None else f"differ at {at}"
        print(f"{name:34} | {prompt:12.1f} | {decode:12.2f} | {where}")
    candle_rows = [row for row in rows if row[0].startswith("cw ")]
    peer_rows = [row for row in rows if row[0].startswith("tjs ")]
    for candle in candle_rows:
        ratios = ", ".join(f"{candle[3] / peer[3]:.2f}x {peer[0].split(' (')[0]}"
                           for peer in peer_rows if peer[3] > 0)
        if ratios:
            print(f"{candle[0].split(' (')[0]} decode / peer (below 1: candle-web slower): "
                  f"{ratios}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="whisper-tiny.en")
    parser.add_argument("--clips", type=int, default=5, help="how many LibriVox clips (1-5)")
    parser.add_argument("--profile", action="store_true", help="cProfile one clip in the worker")
    parser.add_argument("--tasks", default=",".join(TASKS),
                        help=f"comma-separated, of {', '.join(TASKS)} (default: all)")
    parser.add_argument("--generate-tokens", type=int, default=64,
                        help="tokens per generation (greedy; 1-2048)")
    parser.add_argument("--modes", default=",".join(DEFAULT_MODES),
                        help="candle-web page URL queries, comma-separated (default: "
                             f"{','.join(DEFAULT_MODES)}); '' for the plain page")
    parser.add_argument("--peers", default=",".join(DEFAULT_PEERS),
                        help=f"transformers.js runs as DTYPE:THREADS (default: "
                             f"{','.join(DEFAULT_PEERS)})")
    parser.add_argument("--no-q8", action="store_true", help="drop the q8 peers (no quantizing)")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--peer-only", action="store_true",
                       help="only transformers.js (no candle-web page, no native run)")
    group.add_argument("--skip-peer", action="store_true", help="no transformers.js")
    parser.add_argument("--skip-native", action="store_true", help="no native numpy twin")
    parser.add_argument("--json", type=Path, default=None, help="also write the raw figures")
    parser.add_argument("--words", action="store_true",
                        help="also time each clip with word timestamps off and on in the page")
    parser.add_argument("--llm-compute", default="float32",
                        help="--tasks llm: the page's compute types, of float32,int8 (?compute=)")
    parser.add_argument("--faces-repeats", type=int, default=3,
                        help="--tasks faces: timed runs per photo on each side (after a warm-up)")
    parser.add_argument("--camera-seconds", type=float, default=20.0,
                        help="--tasks faces: how long the Faces view's camera runs")
    parser.add_argument("--faces-profile", action="store_true",
                        help="--tasks faces: one more page run of the first photo under "
                             "cProfile, its functions with the most own time printed")
    parser.add_argument("--llm-files", default=",".join(LLM_FILES),
                        help=f"--tasks llm: GGUF files, of {', '.join(LLM_FILES)}")
    args = parser.parse_args(argv)
    tasks = [task.strip() for task in args.tasks.split(",") if task.strip()]
    unknown = sorted(set(tasks) - set(TASKS))
    if unknown or not tasks:
        parser.error(f"--tasks: unknown {unknown}; choose from {', '.join(TASKS)}")
    if not 1 <= args.generate_tokens <= 2048:
        parser.error("--generate-tokens must be 1..2048")
    llm_labels = [label.strip() for label in args.llm_files.split(",") if label.strip()]
    if sorted(set(llm_labels) - set(LLM_FILES)):
        parser.error(f"--llm-files: choose from {', '.join(LLM_FILES)}")
    llm_computes = tuple(c.strip() for c in args.llm_compute.split(",") if c.strip())
    if not llm_computes or set(llm_computes) - {"float32", "int8"}:
        parser.error("--llm-compute: choose from float32, int8")
    if tasks == ["faces"]:
        vendor()
        run_faces(BrowserSession, args.faces_repeats, args.camera_seconds, args.faces_profile)
        return 0
    if tasks == ["llm"]:
        vendor()
        run_llm(llm_labels, args.generate_tokens, GENERATE_PROMPT,
                generate_options(args.generate_tokens), BrowserSession, llm_computes)
        return 0
    try:
        peers = [] if args.skip_peer else parse_peers(args.peers)
    except ValueError as error:
        parser.error(str(error))
    if args.no_q8:
        peers = [peer for peer in peers if peer[0] != "q8"]
    modes = [] if args.peer_only else [mode.strip() for mode in args.modes.split(",")]
    run_native_twin = not (args.peer_only or args.skip_native)
    vendor()
    clips = librivox_clips(args.clips) if "whisper" in tasks else []
    if "whisper" in tasks and not clips:
        raise SystemExit("no LibriVox sample clips: run scripts/fetch_test_audio.sh first")
    generate_tokens = args.generate_tokens if "generate" in tasks else 0
    folders, exports = dict(PEER_FOLDERS), {}
    if peers:
        folders, exports = prepare_peer(tasks, args.model,
                                        q8=any(dtype == "q8" for dtype, _ in peers))
    session = BrowserSession(folders)
    results: dict = {"modes": [], "peers": {"whisper": [], "generate": []}, "exports": exports}
    try:
        for query in modes:
            results["modes"].append(run_candle_page(session, query, args.model, clips,
                                                    args.profile, generate_tokens, args.words))
        if clips and "error" not in exports.get("whisper", {"error": "skipped"}):
            for dtype, threads in peers:
                results["peers"]["whisper"].append(
                    run_peer_page(session, "whisper", args.model, dtype, threads, clips=clips))
        prompt_ids = next((mode["generate"]["runs"][0]["promptIds"]
                           for mode in results["modes"] if "generate" in mode), None)
        if generate_tokens and prompt_ids is None and peers:
            # No candle-web page ran the prompt: its ChatML ids from a one-token native run.
            prompt_ids = run_native_generate(1)["result"]["promptIds"]
        if generate_tokens and "error" not in exports.get("generate", {"error": "skipped"}):
            for dtype, threads in peers:
                results["peers"]["generate"].append(
                    run_peer_page(session, "generate", GENERATE_MODEL, dtype, threads,
                                  prompt_ids=prompt_ids, tokens=generate_tokens))
    finally:
        results["blocked"] = session.blocked
        session.close()
    native, native_generate = {"clips": {}}, None
    # A failing twin costs its columns only, not the browser figures already taken.
    try:
        if clips and run_native_twin:
            native = run_native(args.model, clips)
    except SystemExit as error:
        print(f"WARNING: no native numpy column: {str(error)[-1500:]}")
    try:
        if generate_tokens and run_native_twin:
            native_generate = run_native_generate(generate_tokens)
    except SystemExit as error:
        print(f"WARNING: no native generate row: {str(error)[-1500:]}")
    if args.json is not None:  # before the tables, so a report bug never loses a run
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"browser": results, "native": native,
                                         "nativeGenerate": native_generate}, indent=1,
                                        default=str))
    load = os.getloadavg()
    print(f"load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} (1 / 5 / 15 min) "
          f"after the run")
    if results["blocked"]:
        print(f"WARNING: {len(results['blocked'])} off-host request(s) blocked: "
              f"{results['blocked'][:3]}")
    for mode in results["modes"]:
        if mode.get("words"):
            off, on = (sum(pair[k] for pair in mode["words"]) for k in (0, 1))
            print(f"{mode_label(mode)}: word timestamps over {len(mode['words'])} clips: off "
                  f"{off / 1000:.2f} s, on {on / 1000:.2f} s, cost {100 * (on / off - 1):+.1f}%")
    for mode in results["modes"]:
        print_report(args.model, mode, native)
        if mode.get("generate") and native_generate:
            print_generate_report(mode["generate"], native_generate)
    for task, info in exports.items():
        if "error" in info:
            print(f"peer {task}: no ONNX export: {info['error']}")
    print()
    print_candle_ready(results["modes"])
    print_peer_ready(results["peers"]["whisper"], "whisper")
    print_peer_ready(results["peers"]["generate"], "generate")
    if clips:
        print_side_by_side(args.model, clips, results["modes"], results["peers"]["whisper"],
                           native)
    if generate_tokens:
        print_generate_side_by_side(results["modes"], results["peers"]["generate"],
                                    native_generate, exports)
    if "llm" in tasks:
        run_llm(llm_labels, args.generate_tokens, GENERATE_PROMPT,
                generate_options(args.generate_tokens), BrowserSession, llm_computes)
    if "faces" in tasks:
        run_faces(BrowserSession, args.faces_repeats, args.camera_seconds, args.faces_profile)
    return 0


if __name__ == "__main__":
    sys.exit(main())
