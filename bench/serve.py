"""`candle-web serve --api` under concurrent streaming chats, next to llama.cpp's llama-server.

For each model (SmolLM2-135M-Instruct Q4_1, Qwen2.5-Coder-0.5B-Instruct Q4_K_M) and each
server (candle-web started as `candle-web serve --api --model M --parallel 8`; llama-server
with `--parallel 8` on the same GGUF), C clients (1, 4, 8) each stream one greedy chat of
--tokens tokens at the same time; per level it prints the aggregate decode rate (completion
tokens of all clients / wall time from the first request to the last answer) and the p50/p95
time to first token, then the ratio candle-web / llama-server: of --repeats runs of a level on
the same server (3 by default), the median one by tok/s (llama-server's figures moved by up to
20% between single runs: its slots keep earlier prompts' caches, and which slot a request
lands in varies). It also prints each server's time from process start to its first answer.
By default every run sends the same 8 prompts, as a service whose clients repeat themselves
would see: both servers then reuse the caches of earlier prompts (llama-server's slots,
candle-web's prefix pool); --fresh-prompts starts every user message with a new number, so
only the chat template's shared start can be reused. Loopback only; compare the ratios.
Both servers get the same --threads (llama-server's -t; candle-web's NUMBA_NUM_THREADS; its
BLAS keeps the caller's OPENBLAS_NUM_THREADS: on a loaded machine set it to 1, OpenBLAS's
spinning threads made one answer 15x slower here).

--startup measures only the start of `candle-web serve --api --model M` and prints where the
time goes, from the process's start to the first chat answer (a one-token greedy chat of the
first prompt, through the chat template): the interpreter, the imports (candle_web, the server
stack, numba), the model's load (GGUF, tokenizer, weight layout), the warm-up (numba's cached
machine code loaded, first-call costs), the bind, and the first
answer; then a second answer for comparison, whether numba compiled anything (files written to
its cache during the start; 0 means every kernel came from the on-disk cache) and the load
average. The server child writes its own timestamps (it wraps ModelPool._warm_up_text and
announce for that, nothing else); .pyc files are used as an installed package would
(PYTHONDONTWRITEBYTECODE is dropped for the child).

llama-server comes from the llama.cpp sources the other benches build: scripts/build_llama_cpp.sh
builds it beside llama-bench (~/.cache/candle-web/llama.cpp/bin/llama-server); or pass
--llama-server PATH or set $LLAMA_SERVER; without one its column is empty and the reason is
printed. It runs with --parallel 8, 2048 context tokens per slot (-c 16384) and no web UI.

    .venv/bin/python bench/serve.py [--models smollm2-135m-instruct,qwen2.5-coder-0.5b-instruct]
                                    [--clients 1,4,8] [--tokens 64] [--llama-server PATH]
                                    [--threads 2] [--repeats 3] [--fresh-prompts] [--startup]
                                    [--schema]

--schema measures structured outputs instead: on candle-web alone, each level of clients runs
without and with a json_schema response_format (4 fields) and prints the time per token of both
and their ratio (issue 33's goal: <= 1.15x the unconstrained step).
"""

from __future__ import annotations

import argparse
import http.client
import itertools
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
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
SLOTS = 8
CONTEXT_PER_SLOT = 2048
STARTUP_CHILD_FLAG = "--startup-child"


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


def stream_chat(base: str, model: str, prompt: str, max_tokens: int,
                response_format: dict = None) -> dict:
    """One streaming greedy chat: time to first content, completion tokens, end time."""
    parsed = urllib.parse.urlsplit(base)
    connection = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=600)
    started = time.perf_counter()
    request = {"model": model, "messages": [{"role": "user", "content": prompt}],
               "max_tokens": max_tokens, "temperature": 0, "stream": True,
               "stream_options": {"include_usage": True}}
    if response_format is not None:
        request["response_format"] = response_format
    body = json.dumps(request)
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


_FRESH = itertools.count()


def run_level(base: str, model: str, clients: int, max_tokens: int, fresh: bool,
              response_format: dict = None) -> dict:
    """One run of `clients` concurrent chats; with `fresh`, each user message starts with a
    number never sent before, so that no server can reuse a cached prompt past the chat
    template's shared start."""
    results = [None] * clients
    barrier = threading.Barrier(clients)
    prompts = [(f"Request {next(_FRESH)}. " if fresh else "") + PROMPTS[index % len(PROMPTS)]
               for index in range(clients)]

    def client(index: int) -> None:
        barrier.wait()
        results[index] = stream_chat(base, model, prompts[index], max_tokens, response_format)

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


def candle_environment(threads: int) -> dict:
    environment = dict(os.environ, PYTHONPATH=str(REPO / "pkg"), NUMBA_NUM_THREADS=str(threads))
    environment.pop("PYTHONDONTWRITEBYTECODE", None)  # an installed package has its .pyc
    return environment


def candle_argv(model: str, port: int) -> list:
    return ["serve", "--api", "--model", model, "--parallel", str(SLOTS), "--port", str(port)]


def candle_server(model: str, threads: int) -> Server:
    port = free_port()
    argv = [sys.executable, "-m", "candle_web.cli", *candle_argv(model, port)]
    return Server(argv, f"http://127.0.0.1:{port}/v1", model, candle_environment(threads))


def llama_server(binary: str, model: str, threads: int) -> Server:
    from candle_web import hub  # noqa: PLC0415

    files = hub.fetch_model(model)
    gguf = next(path for path in files.values() if str(path).endswith(".gguf"))
    port = free_port()
    # --parallel slots split -c evenly (the KV cache is not unified when the slot count is
    # given: its log says n_slots = 8, n_ctx_slot = 2048), so each slot holds CONTEXT_PER_SLOT
    # tokens; --no-ui (its newer name for --no-webui): the API only.
    argv = [binary, "-m", str(gguf), "--parallel", str(SLOTS), "--port", str(port), "--host",
            "127.0.0.1", "-c", str(SLOTS * CONTEXT_PER_SLOT), "--threads", str(threads),
            "--no-ui"]
    return Server(argv, f"http://127.0.0.1:{port}/v1", model)


# -- --startup: where the time from process start to the first answer goes -----------------

def startup_child(marks_path: str, cli_argv: list) -> int:
    """The server process of --startup: `candle-web serve` itself, with timestamps appended to
    marks_path (JSON lines [name, time.time(), CPU seconds of the process]) at each stage's
    end."""
    marks = open(marks_path, "a", encoding="utf-8")

    def mark(name: str) -> None:
        marks.write(json.dumps([name, time.time(), sum(os.times()[:2])]) + "\n")
        marks.flush()

    mark("interpreter")
    import candle_web.cli as cli  # noqa: PLC0415
    import candle_web.serve as serve  # noqa: PLC0415
    from candle_web import api  # noqa: F401, PLC0415
    from candle_web.api import model_pool  # noqa: PLC0415

    serve.import_server_stack()
    import starlette.applications  # noqa: F401, PLC0415
    try:
        import numba  # noqa: F401, PLC0415
    except ImportError:
        pass
    mark("imports")
    warm_up = getattr(model_pool.ModelPool, "_warm_up_text", None)
    if warm_up is not None:
        def timed_warm_up(*args, **kwargs):
            mark("load")
            result = warm_up(*args, **kwargs)
            mark("warm-up")
            return result
        model_pool.ModelPool._warm_up_text = staticmethod(timed_warm_up)
    announce = serve.server.announce

    def timed_announce(*args, **kwargs):
        mark("bind")
        return announce(*args, **kwargs)
    serve.server.announce = timed_announce
    return cli.main(cli_argv)


def numba_cache_files() -> tuple:
    try:
        import candle_native  # noqa: PLC0415
    except ImportError:
        return None, 0
    folder = candle_native.numba_cache_dir()
    return folder, sum(1 for _ in folder.rglob("*.nb[ic]")) if folder.is_dir() else 0


def process_cpu_seconds(pid: int):
    """User + system CPU seconds of a running process (Linux's /proc), else None."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def wait_until_listening(port: int, process, deadline: float) -> None:
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"candle-web serve exited with {process.returncode}: "
                               f"{process.stderr.read()[-2000:]}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"nothing listens on port {port} after {START_TIMEOUT_S} s")
            time.sleep(0.01)


def _cpu(now, before=0.0) -> str:
    return "     -" if now is None or before is None else f"{now - before:6.2f}s"


def measure_startup(model: str, threads: int) -> None:
    port = free_port()
    cache, files_before = numba_cache_files()
    with tempfile.TemporaryDirectory() as folder:
        marks_path = os.path.join(folder, "marks.jsonl")
        argv = [sys.executable, str(Path(__file__).resolve()), STARTUP_CHILD_FLAG, marks_path,
                *candle_argv(model, port)]
        started = time.time()
        process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                   text=True, env=candle_environment(threads))
        try:
            wait_until_listening(port, process, time.monotonic() + START_TIMEOUT_S)
            base = f"http://127.0.0.1:{port}/v1"
            asked = time.time()
            stream_chat(base, model, PROMPTS[0], 1)
            answered = time.time()
            answered_cpu = process_cpu_seconds(process.pid)
            stream_chat(base, model, PROMPTS[0], 1)
            second = time.time() - answered
            second_cpu = process_cpu_seconds(process.pid)
        finally:
            process.terminate()
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
        with open(marks_path, encoding="utf-8") as handle:
            marks = [json.loads(line) for line in handle]
    _, files_after = numba_cache_files()
    # CPU seconds (all the server's threads) depend far less on the machine's load than the wall
    # clock does: on a loaded machine they say what a quiet one would take, roughly.
    print(f"{model}: start to first answer {answered - started:.2f} s wall, "
          f"{_cpu(answered_cpu).strip()} CPU (load average {os.getloadavg()[0]:.1f}, {threads} threads)")
    print(f"  {'stage':62} {'wall':>7} {'CPU':>7}")
    previous, previous_cpu = started, 0.0
    labels = {"interpreter": "interpreter start", "imports": "imports (candle_web, uvicorn, "
              "starlette, numba)", "load": "model load (GGUF, tokenizer, weight layout)",
              "warm-up": "warm-up (numba cache loads, first calls)",
              "bind": "pool ready to listening"}
    for name, at, cpu in marks:
        print(f"  {labels.get(name, name):62} {at - previous:6.2f}s {cpu - previous_cpu:6.2f}s")
        previous, previous_cpu = at, cpu
    print(f"  {'listening to the first answer (a 1-token chat, asked at once)':62} "
          f"{answered - max(previous, asked):6.2f}s {_cpu(answered_cpu, previous_cpu)}")
    print(f"  {'(a second 1-token chat, for comparison)':62} {second:6.2f}s "
          f"{_cpu(second_cpu, answered_cpu)}")
    if cache is not None:
        print(f"  numba cache {cache}: {files_after - files_before} file(s) written during the "
              f"start (0: nothing compiled, all loaded from the cache)")


# A 4-field schema, as the API tests use: the prompts ask for prose, the grammar makes JSON.
SCHEMA_FORMAT = {"type": "json_schema", "json_schema": {"name": "facts", "strict": True, "schema": {
    "type": "object", "additionalProperties": False,
    "required": ["topic", "summary", "count", "certain"],
    "properties": {"topic": {"type": "string"}, "summary": {"type": "string"},
                   "count": {"type": "integer"}, "certain": {"type": "boolean"}}}}}


def measure_schema_cost(model: str, levels: list, args) -> None:
    """--schema: per level, the median run without and with SCHEMA_FORMAT on one candle-web
    server; the time per generated token (wall / tokens per client) with a schema over without
    is the cost of the masks (goal <= 1.15). Constrained answers can be shorter, so their
    prompt share is larger: the ratio is an upper bound of the masks' cost."""
    server = candle_server(model, args.threads)
    try:
        # The first request with a schema compiles its grammar (cached after it, as for any
        # client that sends the same schema again): outside the figures.
        stream_chat(server.base, model, PROMPTS[0], 1, SCHEMA_FORMAT)
        print(f"{model}: load average {os.getloadavg()[0]:.1f}; up to {args.tokens} greedy "
              f"tokens per client; median of {args.repeats} runs")
        for clients in levels:
            rows = {}
            for label, response_format in (("free", None), ("schema", SCHEMA_FORMAT)):
                runs = sorted((run_level(server.base, model, clients, args.tokens,
                                         args.fresh_prompts, response_format)
                               for _ in range(args.repeats)), key=lambda r: r["tok_s"])
                rows[label] = runs[len(runs) // 2]
            per_token = {label: clients / row["tok_s"] for label, row in rows.items()}
            print(f"  {clients} clients: free {rows['free']['tok_s']:.1f} tok/s "
                  f"({per_token['free'] * 1e3:.1f} ms/token per client), schema "
                  f"{rows['schema']['tok_s']:.1f} tok/s ({per_token['schema'] * 1e3:.1f} ms); "
                  f"schema / free per token {per_token['schema'] / per_token['free']:.2f}x "
                  f"[load {os.getloadavg()[0]:.1f}]")
    finally:
        server.stop()


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
    parser.add_argument("--threads", type=int, default=2,
                        help="threads for each server (llama-server -t; candle-web's numba "
                             "threads)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="runs of each level on the same server; the median run (by "
                             "tok/s) is printed, its TTFTs with it")
    parser.add_argument("--fresh-prompts", action="store_true",
                        help="a new user message in every request (no prompt reused past the "
                             "chat template's start); default: the same 8 prompts each run, "
                             "which both servers' prompt caches reuse")
    parser.add_argument("--schema", action="store_true",
                        help="only candle-web, each level without and with a json_schema "
                             "response_format (4 fields): the cost of constrained decoding")
    parser.add_argument("--startup", action="store_true",
                        help="only measure candle-web's start to its first answer, by stage")
    args = parser.parse_args()
    if args.startup:
        for model in args.models.split(","):
            measure_startup(model, args.threads)
        return 0
    levels = [int(x) for x in args.clients.split(",")]
    if args.schema:
        for model in args.models.split(","):
            measure_schema_cost(model, levels, args)
        return 0
    peer = find_llama_server(args.llama_server)
    if peer is None:
        print("llama-server: not found (scripts/build_llama_cpp.sh builds it into "
              "~/.cache/candle-web/llama.cpp/bin/; or pass --llama-server PATH or set "
              "$LLAMA_SERVER): its column is left empty")
    print(f"load average {os.getloadavg()[0]:.1f}; {args.tokens} greedy tokens per client; "
          f"median of {args.repeats} runs per level; "
          f"{'fresh' if args.fresh_prompts else 'the same'} prompts each run\n")
    print(f"{'model':30} {'clients':>7} {'server':12} {'tok/s':>8} {'TTFT p50':>9} "
          f"{'TTFT p95':>9} {'ratio tok/s':>12}")
    for model in args.models.split(","):
        figures = {}
        for name, start in (("candle-web", lambda m=model: candle_server(m, args.threads)),
                            ("llama-server", (lambda m=model: llama_server(peer, m, args.threads))
                             if peer else None)):
            if start is None:
                continue
            server = start()
            try:
                figures[(name, "start")] = server.start_to_first_answer
                for clients in levels:
                    runs = sorted((run_level(server.base, model, clients, args.tokens,
                                             args.fresh_prompts)
                                   for _ in range(args.repeats)), key=lambda r: r["tok_s"])
                    figures[(name, clients)] = runs[len(runs) // 2]  # the median run
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
    if sys.argv[1:2] == [STARTUP_CHILD_FLAG]:
        sys.exit(startup_child(sys.argv[2], sys.argv[3:]))
    sys.exit(main())
