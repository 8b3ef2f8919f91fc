"""bench/browser.py --tasks llm: candle-web's page next to wllama (llama.cpp in WebAssembly with
SIMD and threads; npm @wllama/wllama 3.13.0, package.json's devDependencies) on the same GGUF
files, in the same Chromium, on 1 and 2 threads, greedy, the same prompt.

Files (--llm-files, default all): SmolLM2-135M-Instruct Q4_1 (the registry's), its Q8_0 and
Q4_0 requantizations (llama.cpp has no WebAssembly SIMD kernel for Q4_1; made here by the
project's own quantizer and GGUF writer from the Q4_1 file's dequantized values, cached under
the model cache's bench-requantized/), and Qwen2.5-Coder-0.5B-Instruct Q4_K_M (the registry's).
Each file is served to both engines from one folder as model.gguf (/models/local/llm-<label>/).

Per file and thread count: candle-web's page (?backend=wasm&threads=N&compute=C for each
compute type of --llm-compute, float32 by default; confirmed by the page's ready answer) loads the file (cold: download + sha256-less check + build) and generates
--generate-tokens tokens twice with the ChatML prompt; wllama loads the same file in a fresh
profile and completes the prompt text candle-web rendered (the same ids: wllama tokenizes it
with the same GGUF vocabulary), greedy, EOS ignored, twice. Printed: prompt and decode tok/s
(best of two), ready/load seconds, the worker's heap after the run, and candle-web / wllama
ratios (above 1: candle-web faster). Timings under load rank nothing: the load average is
printed with the table.
"""
from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WLLAMA_VERSION = "3.13.0"
WLLAMA_DIST = REPO / "node_modules" / "@wllama" / "wllama" / "esm"
PEER_PAGE = "wllama.html"
SMOLLM2 = ("smollm2-135m-instruct", "SmolLM2-135M-Instruct.Q4_1.gguf")
QWEN = ("qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")
LLM_FILES = ("smollm2-q4_1", "smollm2-q8_0", "smollm2-q4_0", "qwen2.5-q4_k_m")
THREADS = (1, 2)
RUNS = 2


def installed_wllama() -> str | None:
    import json

    try:
        return json.loads((WLLAMA_DIST.parent / "package.json").read_text())["version"]
    except (OSError, ValueError, KeyError):
        return None


def ensure_wllama() -> None:
    """node_modules/@wllama/wllama at the pinned version (`npm ci` with dev dependencies)."""
    import shutil
    import subprocess
    import sys

    if installed_wllama() == WLLAMA_VERSION and (WLLAMA_DIST / "wasm" / "wllama.wasm").is_file():
        return
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError("npm not found: it installs wllama for the peer")
    print(f"installing @wllama/wllama@{WLLAMA_VERSION} (npm ci) ...", file=sys.stderr,
          flush=True)
    done = subprocess.run([npm, "ci", "--include=dev", "--omit=optional", "--ignore-scripts",
                           "--no-audit", "--no-fund"], cwd=REPO, capture_output=True, text=True,
                          check=False)
    if done.returncode != 0 or installed_wllama() != WLLAMA_VERSION:
        raise RuntimeError(f"npm ci failed (exit {done.returncode}): {done.stderr.strip()[-800:]}")


def requantized(source: Path, kind: str) -> Path:
    """`source` with every quantized 2-D weight requantized to `kind` (Q8_0, Q4_0) by the
    project's quantizer, written by its GGUF writer (metadata and other tensors as they are);
    cached next to the model cache."""
    from candle_web import hub
    from candle_web.io.gguf import GgufFile, write_gguf
    from candle_web.quantized import GgmlDType, QTensor

    target = GgmlDType.parse(kind)
    folder = hub.cache_dir() / "bench-requantized"
    dest = folder / f"{source.stem}.{kind}.gguf"
    if dest.is_file():
        return dest
    folder.mkdir(parents=True, exist_ok=True)
    with GgufFile.open(source) as gguf:
        tensors = {}
        for name in gguf.tensors:
            q = gguf.qtensor(name)
            if q.dtype.is_quantized and len(q.shape) == 2:
                q = QTensor.from_float(q.dequantize(), target)
            tensors[name] = q
        partial = dest.with_suffix(".partial")
        write_gguf(partial, gguf.metadata, tensors, metadata_types=gguf.metadata_types)
    partial.replace(dest)
    return dest


def llm_files(labels) -> dict:
    """{label: path of the GGUF} for the labels asked for."""
    from candle_web import hub

    smollm2 = hub.fetch(*SMOLLM2, offline=True)
    makers = {"smollm2-q4_1": lambda: smollm2,
              "smollm2-q8_0": lambda: requantized(smollm2, "Q8_0"),
              "smollm2-q4_0": lambda: requantized(smollm2, "Q4_0"),
              "qwen2.5-q4_k_m": lambda: hub.fetch(*QWEN, offline=True)}
    return {label: Path(makers[label]()) for label in labels}


def served_folders(files: dict, scratch: Path) -> dict:
    """{local folder name: folder} serving each file as model.gguf (a hard link where the
    file system allows, else a copy), wllama's dist and the peer page."""
    import shutil

    folders = {"peer": REPO / "bench" / "peer", "wllama": WLLAMA_DIST}
    for label, path in files.items():
        folder = scratch / label
        folder.mkdir()
        try:
            os.link(path, folder / "model.gguf")
        except OSError:
            shutil.copyfile(path, folder / "model.gguf")
        folders[f"llm-{label}"] = folder
    return folders


CANDLE_RUN_JS = """async ([url, prompt, options, runs]) => {
    const client = window.candleWeb.client;
    const started = performance.now();
    const load = await client.request('load', {kind: 'llama', url});
    load.pageMs = performance.now() - started;
    const out = [];
    for (let i = 0; i < runs; i++) {
        out.push(await client.request('generate', {model: load.key, prompt, chat: true, options}));
    }
    return {load, runs: out};
}"""


# The engine column of candle-web's page per compute type (?compute=, --llm-compute).
CANDLE_ENGINES = {"float32": "candle-web", "int8": "cw int8"}


def run_candle(session, label: str, threads: int, prompt: str, options: dict,
               compute: str = "float32") -> dict:
    def work(page, opened):
        page.wait_for_function("() => window.candleWeb !== undefined")
        summary = page.evaluate("() => window.candleWeb.ready")
        backend = summary.get("backend") or {}
        out = {"engine": CANDLE_ENGINES[compute], "label": label, "threads": threads,
               "readyS": time.perf_counter() - opened, "backend": backend}
        if (backend.get("name") != "wasm" or backend.get("threads") != threads
                or (backend.get("computeType") or "float32") != compute):
            out["error"] = (f"the page runs {backend} (asked wasm on {threads} threads, "
                            f"compute {compute})")
            return out
        page.set_default_timeout(900_000)
        reply = page.evaluate(CANDLE_RUN_JS, [f"models/local/llm-{label}/", prompt, options, RUNS])
        out["loadS"] = reply["load"]["pageMs"] / 1000
        out["runs"] = [{"promptPerSecond": r["timings"]["promptTokensPerSecond"],
                        "decodePerSecond": r["timings"]["tokensPerSecond"],
                        "tokens": len(r["tokenIds"]), "promptTokens": len(r["promptIds"]),
                        "heapBytes": r["heap"]["endBytes"], "tokenIds": r["tokenIds"],
                        "renderedPrompt": r["renderedPrompt"], "text": r["text"]}
                       for r in reply["runs"]]
        return out

    return session.run_page(f"?backend=wasm&threads={threads}&compute={compute}", work)


def run_wllama(session, label: str, threads: int, prompt: str, tokens: int) -> dict:
    def work(page, opened):
        page.wait_for_function("() => window.peer !== undefined")
        page.set_default_timeout(900_000)
        out = {"engine": "wllama", "label": label, "threads": threads}
        try:
            out["ready"] = page.evaluate("() => window.peer.ready")
        except Exception as error:  # noqa: BLE001  (reported in the table)
            out["error"] = str(error).splitlines()[0]
            return out
        out["readyS"] = time.perf_counter() - opened
        out["loadS"] = out["ready"]["phases"].get("load", 0) / 1000
        out["runs"] = [page.evaluate("([p, n]) => window.peer.generate(p, n)", [prompt, tokens])
                       for _ in range(RUNS)]
        return out

    return session.run_page(f"models/local/peer/{PEER_PAGE}?gguf=llm-{label}/model.gguf"
                            f"&threads={threads}", work)


def best(result: dict, key: str) -> float:
    return max((run.get(key) or 0.0) for run in result.get("runs", [{}]))


def print_row(result: dict) -> None:
    """One finished run as it ends (a long run killed half-way keeps what it measured)."""
    import sys

    figures = ("error" if "error" in result else
               f"prompt {best(result, 'promptPerSecond'):.1f} tok/s, decode "
               f"{best(result, 'decodePerSecond'):.2f} tok/s")
    print(f"[llm] {result['label']} {result['engine']} {result['threads']}t: {figures}; load "
          f"average {os.getloadavg()[0]:.1f}", file=sys.stderr, flush=True)


def print_table(results: list[dict], tokens: int) -> None:
    load = os.getloadavg()
    print(f"\nLLM decode in the browser, candle-web page vs wllama {WLLAMA_VERSION}: greedy, "
          f"{tokens} tokens, same prompt, best of {RUNS}; load average {load[0]:.1f} / "
          f"{load[1]:.1f} / {load[2]:.1f} (1 / 5 / 15 min) after the run")
    header = (f"{'file':16} | {'engine':10} | thr | {'ready s':>7} | {'load s':>6} | "
              f"{'prompt tok/s':>12} | {'decode tok/s':>12} | heap MiB")
    print(header)
    print("-" * len(header))
    for r in results:
        if "error" in r:
            print(f"{r['label']:16} | {r['engine']:10} | {r['threads']:3} | {r['error']}")
            continue
        heap = max(run.get("heapBytes", 0) for run in r["runs"]) / 2**20
        ran = r.get("ready", {}).get("threads", r["threads"])  # wllama's own count
        note = "" if ran == r["threads"] else f" (wllama ran {ran} thread(s))"
        print(f"{r['label']:16} | {r['engine']:10} | {r['threads']:3} | {r['readyS']:7.1f} | "
              f"{r['loadS']:6.1f} | {best(r, 'promptPerSecond'):12.1f} | "
              f"{best(r, 'decodePerSecond'):12.2f} | {f'{heap:.0f}' if heap else '-':>8}{note}")
    by_key = {(r["label"], r["engine"], r["threads"]): r for r in results if "error" not in r}
    for (label, engine, threads), r in by_key.items():
        base = by_key.get((label, "candle-web", threads))
        if engine == CANDLE_ENGINES["int8"] and base is not None:
            print(f"{label} {threads}t: int8 / float32 page decode "
                  f"{best(r, 'decodePerSecond') / max(best(base, 'decodePerSecond'), 1e-9):.2f}x, "
                  f"prompt {best(r, 'promptPerSecond') / max(best(base, 'promptPerSecond'), 1e-9):.2f}x")
        peer = by_key.get((label, "wllama", threads))
        if engine not in CANDLE_ENGINES.values() or peer is None:
            continue
        decode = best(r, "decodePerSecond") / max(best(peer, "decodePerSecond"), 1e-9)
        prompt = best(r, "promptPerSecond") / max(best(peer, "promptPerSecond"), 1e-9)
        print(f"{label} {threads}t: candle-web / wllama decode {decode:.2f}x, prompt "
              f"{prompt:.2f}x (above 1: candle-web faster)")


def run_llm(labels, tokens: int, prompt: str, options: dict, browser_session_cls,
            computes=("float32",)) -> list:
    """The whole comparison; returns the raw results (also printed). `computes`: the page's
    compute types to run (?compute=), each next to the same wllama run."""
    ensure_wllama()
    files = llm_files(labels)
    results = []
    with tempfile.TemporaryDirectory(prefix="candle-web-llm-") as scratch:
        session = browser_session_cls(served_folders(files, Path(scratch)))
        try:
            for label in files:
                for threads in THREADS:
                    rendered = None
                    for compute in computes:
                        candle = run_candle(session, label, threads, prompt, options, compute)
                        results.append(candle)
                        print_row(candle)
                        rendered = rendered or next(
                            (run["renderedPrompt"] for run in candle.get("runs", [])), None)
                    if rendered is None:
                        continue
                    results.append(run_wllama(session, label, threads, rendered, tokens))
                    print_row(results[-1])
        finally:
            session.close()
    print_table(results, tokens)
    return results
