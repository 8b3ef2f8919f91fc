"""`candle-web serve --api` under concurrent streaming chats, next to llama.cpp's llama-server.

For each model (SmolLM2-135M-Instruct Q4_1, Qwen2.5-Coder-0.5B-Instruct Q4_K_M) and each
server (candle-web started as `candle-web serve --api --model M --parallel 8`; llama-server
with `--parallel 8` on the same GGUF), C clients (1, 4, 8) each stream one greedy chat of
--tokens tokens at the same time; per level it prints the aggregate decode rate (completion
tokens of all clients / wall time from the first request to the last answer) and the p50/p95
time to first token, then the ratio candle-web / llama-server. It also prints each server's
time from process start to its first answer. Loopback only; one run, so compare the ratios.

llama-server comes from the llama.cpp sources the other benches build
(scripts/build_llama_cpp.sh builds llama-bench only): pass --llama-server PATH or set
$LLAMA_SERVER; without one its column is empty and the reason is printed.

    .venv/bin/python bench/serve.py [--models smollm2-135m-instruct,qwen2.5-coder-0.5b-instruct]
                                    [--clients 1,4,8] [--tokens 64] [--llama-server PATH]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.parse
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "pkg"))

PROMPTS = ["Write a short poem about the sea.", "Explain what a CPU does.",
           "List three uses of copper.", "Describe a cat to a child.",
           "Why is the sky blue?", "Give advice for a job interview.",
           "What is a prime number?", "Tell a story about a lost key."]
START_TIMEOUT_S = 600


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_answer(base: str, model: str, deadline: float) -> None:
    """Poll with a one-token chat until the server answers it (bounded by deadline)."""
    while True:
        try:
            stream_chat(base, model, PROMPTS[0], 1)
            return
        except (OSError, http.client.HTTPException, RuntimeError):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{base}: no answer within {START_TIMEOUT_S} s") from None
            time.sleep(0.05)


def stream_chat(base: str, model: str, prompt: str, max_tokens: int) -> dict:
    """One streaming greedy chat: time to first content, completion tokens, end time."""
    parsed = urllib.parse.urlsplit(base)
    connection = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=600)
    started = time.perf_counter()
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": prompt}],
                       "max_tokens": max_tokens, "temperature": 0, "stream": True,
                       "stream_options": {"include_usage": True}})
    connection.request("POST", parsed.path + "/chat/completions", body=body,
                       headers={"Content-Type": "application/json"})
    response = connection.getresponse()
    if response.status != 200:
        raise RuntimeError(f"HTTP {response.status}: {response.read()[:300]!r}")
    first, tokens, pieces = None, None, 0
    for raw in response:
        line = raw.decode().strip()
        if not line.startswith("data: "):
            continue
        data = line[len("data: "):]
        if data == "[DONE]":
            break
        event = json.loads(data)
        if event.get("usage"):
            tokens = event["usage"]["completion_tokens"]
        for choice in event.get("choices", []):
            if choice.get("delta", {}).get("content"):
                pieces += 1
                if first is None:
                    first = time.perf_counter() - started
    connection.close()
    return {"ttft": first if first is not None else time.perf_counter() - started,
            "tokens": tokens if tokens is not None else pieces, "end": time.perf_counter()}


def run_level(base: str, model: str, clients: int, max_tokens: int) -> dict:
    results = [None] * clients
    barrier = threading.Barrier(clients)

    def client(index: int) -> None:
        barrier.wait()
        results[index] = stream_chat(base, model, PROMPTS[index % len(PROMPTS)], max_tokens)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = max(r["end"] for r in results) - started
    ttfts = sorted(r["ttft"] for r in results)
    p95 = ttfts[min(len(ttfts) - 1, int(round(0.95 * (len(ttfts) - 1))))]
    return {"tok_s": sum(r["tokens"] for r in results) / wall,
            "ttft_p50": statistics.median(ttfts), "ttft_p95": p95,
            "tokens": sum(r["tokens"] for r in results)}


class Server:
    def __init__(self, argv: list, base: str, model: str, environment=None):
        self.base, self.model = base, model
        started = time.monotonic()
        self.process = subprocess.Popen(argv, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.PIPE, text=True, env=environment)
        try:
            wait_for_answer(base, model, started + START_TIMEOUT_S)
        except RuntimeError:
            self.stop()
            raise
        self.start_to_first_answer = time.monotonic() - started

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()


def candle_server(model: str) -> Server:
    port = free_port()
    environment = dict(os.environ, PYTHONPATH=str(REPO / "pkg"))
    argv = [sys.executable, "-m", "candle_web.cli", "serve", "--api", "--model", model,
            "--parallel", "8", "--port", str(port)]
    return Server(argv, f"http://127.0.0.1:{port}/v1", model, environment)


def llama_server(binary: str, model: str) -> Server:
    from candle_web import hub  # noqa: PLC0415

    files = hub.fetch_model(model)
    gguf = next(path for path in files.values() if str(path).endswith(".gguf"))
    port = free_port()
    argv = [binary, "-m", str(gguf), "--parallel", "8", "--port", str(port), "--host",
            "127.0.0.1", "-c", str(8 * 2048), "--threads", str(os.cpu_count() or 2)]
    return Server(argv, f"http://127.0.0.1:{port}/v1", model)


def find_llama_server(given: str):
    for candidate in (given, os.environ.get("LLAMA_SERVER"),
                      str(Path.home() / ".cache/candle-web/llama.cpp/bin/llama-server"),
                      shutil.which("llama-server")):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="smollm2-135m-instruct,qwen2.5-coder-0.5b-instruct")
    parser.add_argument("--clients", default="1,4,8")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--llama-server", default=None)
    args = parser.parse_args()
    levels = [int(x) for x in args.clients.split(",")]
    peer = find_llama_server(args.llama_server)
    if peer is None:
        print("llama-server: not built here (scripts/build_llama_cpp.sh builds llama-bench only; "
              "pass --llama-server PATH or set $LLAMA_SERVER): its column is left empty")
    print(f"load average {os.getloadavg()[0]:.1f}; {args.tokens} greedy tokens per client\n")
    print(f"{'model':30} {'clients':>7} {'server':12} {'tok/s':>8} {'TTFT p50':>9} "
          f"{'TTFT p95':>9} {'ratio tok/s':>12}")
    for model in args.models.split(","):
        figures = {}
        for name, start in (("candle-web", lambda m=model: candle_server(m)),
                            ("llama-server", (lambda m=model: llama_server(peer, m))
                             if peer else None)):
            if start is None:
                continue
            server = start()
            try:
                figures[(name, "start")] = server.start_to_first_answer
                for clients in levels:
                    figures[(name, clients)] = run_level(server.base, model, clients,
                                                         args.tokens)
            finally:
                server.stop()
        for clients in levels:
            ours = figures[("candle-web", clients)]
            theirs = figures.get(("llama-server", clients))
            for name, row in (("candle-web", ours), ("llama-server", theirs)):
                if row is None:
                    print(f"{model:30} {clients:7d} {name:12} {'-':>8} {'-':>9} {'-':>9}")
                    continue
                ratio = (f"{ours['tok_s'] / theirs['tok_s']:.2f}x" if theirs and name ==
                         "candle-web" else "")
                print(f"{model:30} {clients:7d} {name:12} {row['tok_s']:8.1f} "
                      f"{row['ttft_p50'] * 1000:7.0f}ms {row['ttft_p95'] * 1000:7.0f}ms "
                      f"{ratio:>12}")
        for name in ("candle-web", "llama-server"):
            if (name, "start") in figures:
                print(f"{model:30} start to first answer ({name}): "
                      f"{figures[(name, 'start')]:.2f} s")
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
