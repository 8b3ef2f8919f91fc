"""Chaos (issue 37 item 7), on 127.0.0.1 only, every wait bounded (a hang guard, not a timing
threshold):

- a server whose address space is capped (RLIMIT_AS, what `ulimit -v` sets, applied to the
  running `candle-web serve --api` child once its models are loaded and warm) is sent work far
  beyond its memory: a 256-input embedding batch of inputs far past the model's 128 tokens (cut
  and batched: answered, every vector the one its text gets alone), a million-character prompt
  with the largest max_tokens, n=64, a 52-minute upload (each an OpenAI-shaped 400); the
  process stays alive and a normal chat afterwards gets the same answer as before the cap;
- under the same cap, a chat whose KV cache (the whole context) runs out of memory gets a 507
  `out_of_memory` error, its memory is given back (the address space falls back toward the warm
  mapping) and the next chat gets the same answer as before;
- a Ray Serve replica killed with SIGKILL in the middle of a stream: that stream's client gets
  a broken stream (no [DONE], no finish reason) instead of waiting for ever, the stream on the
  other replica runs to its end, Serve starts a new replica in the dead one's place, and it
  answers.

The 10-minute soak (clients hanging up at random, resident memory flat) is opt-in:
tests/api/test_api_soak.py."""

from __future__ import annotations

import http.client
import json
import os
import resource
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

import pytest

pytest.importorskip("starlette", reason="the serve extra installs starlette")
pytest.importorskip("uvicorn", reason="the serve extra installs uvicorn")

from tests.api.api_testlib import (BERT, LLM, WHISPER, Stream,  # noqa: E402
                                   chat_messages, multipart_body, post_json, raw_request,
                                   wait_until)
from tests.serve.test_serve_drain import ServeProcess  # noqa: E402
from tests.signals_testlib import default_sigint  # noqa: E402

HANG_GUARD_S = 120
# What a capped server may map beyond what it maps once warm: room for normal requests' caches,
# buffers and a few more threads' stacks (8 MiB each), far below what the oversized work would
# need. The KV-cache case uses less, so that its 8192-position cache (~360 MiB) cannot fit.
HEADROOM_BYTES = 512 << 20
KV_CASE_HEADROOM_BYTES = 256 << 20


def address_space(pid: int) -> int:
    """VmSize of `pid`, the figure RLIMIT_AS caps."""
    with open(f"/proc/{pid}/status") as handle:
        for line in handle:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmSize for process {pid}")


def api_error(status: int, body: bytes) -> dict:
    """The `error` object of an OpenAI-shaped error reply."""
    assert status >= 400, (status, body[:300])
    error = json.loads(body)["error"]
    assert error["message"] and error["type"], error
    return error


def long_quiet_wav(seconds: int, rate: int = 8000) -> bytes:
    """`seconds` of silence as 8-bit unsigned PCM (one byte a sample): 52 minutes in 25 MB."""
    frames = seconds * rate
    header = b"RIFF" + struct.pack("<I", 36 + frames) + b"WAVEfmt " + struct.pack(
        "<IHHIIHH", 16, 1, 1, rate, rate, 1, 8) + b"data" + struct.pack("<I", frames)
    return header + b"\x80" * frames


@pytest.fixture
def serve_capped():
    """Starts `candle-web serve --api` with `models`, warms it with `warm(url)` (a first use of
    each model's path, so the cap does not land on one), then caps its address space at what
    it maps so far plus `headroom`."""
    servers = []

    def start(models, warm, headroom: int = HEADROOM_BYTES):
        server = ServeProcess("--api", *[arg for name in models for arg in ("--model", name)],
                              "--parallel", "2")
        servers.append(server)
        url = f"http://127.0.0.1:{server.port}"
        warm(url)
        mapped = address_space(server.process.pid)
        cap = mapped + headroom
        resource.prlimit(server.process.pid, resource.RLIMIT_AS, (cap, cap))
        print(f"server {server.process.pid}: address space {mapped / 2**20:.0f} MiB when warm, "
              f"capped at {cap / 2**20:.0f} MiB")
        return server, url

    yield start
    for server in servers:
        server.stop()


NORMAL_CHAT = {"model": LLM, "messages": chat_messages(), "max_tokens": 8, "temperature": 0}


def chat_text(url: str) -> str:
    status, _, body = post_json(url, "/v1/chat/completions", NORMAL_CHAT)
    assert status == 200, body[:500]
    return json.loads(body)["choices"][0]["message"]["content"]


def test_capped_server_answers_oversized_work_with_errors_and_keeps_serving(serve_capped):
    before = {}

    def warm(url):
        before["chat"] = chat_text(url)
        status, _, body = post_json(url, "/v1/embeddings", {"model": BERT, "input": "warm"})
        assert status == 200, body[:500]
        # (No transcription: the long upload is refused before Whisper runs.)

    server, url = serve_capped([LLM, BERT, WHISPER], warm)
    pid = server.process.pid

    # 256 inputs of 700 words (1.3 MB, under the 4 MiB body limit), each far past the model's
    # 128 tokens: answered within the cap because inputs are cut to 128 tokens ("truncate":
    # true asks for it) and run 32 at a time, every vector the one the text gets alone.
    text = " ".join(f"word{i}" for i in range(700))
    status, _, body = post_json(url, "/v1/embeddings", {"model": BERT, "input": [text],
                                                        "truncate": True})
    assert status == 200, body[:500]
    alone = json.loads(body)["data"][0]["embedding"]
    status, _, body = post_json(url, "/v1/embeddings", {"model": BERT, "input": [text] * 256,
                                                        "truncate": True})
    assert status == 200, body[:500]
    batch = json.loads(body)
    assert len(batch["data"]) == 256 and batch["usage"]["prompt_tokens"] == 256 * 128
    assert all(max(abs(a - b) for a, b in zip(item["embedding"], alone)) < 1e-5
               for item in batch["data"])

    # A million-character prompt (the per-message limit) with the largest max_tokens: tokenized
    # under the cap, then refused for the context it does not fit.
    huge_prompt = {**NORMAL_CHAT, "max_tokens": 8192,
                   "messages": [{"role": "user", "content": "hello " * ((1 << 20) // 6)}]}
    status, _, body = post_json(url, "/v1/chat/completions", huge_prompt)
    error = api_error(status, body)
    assert (status, error["code"]) == (400, "context_length_exceeded"), error
    status, _, body = post_json(url, "/v1/chat/completions", {**NORMAL_CHAT, "n": 64})
    assert api_error(status, body)["param"] == "n"

    # 52 minutes of audio in a 25 MB upload, above the server's 30-minute default: refused
    # from the header, before 52 minutes are decoded (~200 MB as float32 at 16 kHz).
    form, content_type = multipart_body({"model": WHISPER}, "long.wav", long_quiet_wav(52 * 60))
    status, _, body = raw_request(url, "POST", "/v1/audio/transcriptions", form,
                                  {"Content-Type": content_type})
    error = api_error(status, body)
    assert (status, error["param"]) == (400, "file") and "limit" in error["message"], error

    assert server.process.poll() is None, server.output()[-3000:]
    assert chat_text(url) == before["chat"]
    print(f"server {pid}: address space {address_space(pid) / 2**20:.0f} MiB at the end")


def test_capped_server_gives_back_the_memory_of_a_request_that_ran_out(serve_capped):
    before = {}
    server, url = serve_capped([LLM], lambda url: before.setdefault("chat", chat_text(url)),
                               KV_CASE_HEADROOM_BYTES)
    pid = server.process.pid
    warm = resource.prlimit(pid, resource.RLIMIT_AS)[0] - KV_CASE_HEADROOM_BYTES
    # A short prompt with the whole context as its budget: its KV cache (8192 positions of 30
    # layers, ~360 MiB) is more than the cap leaves. Out of memory, answered as such.
    status, _, body = post_json(url, "/v1/chat/completions", {**NORMAL_CHAT, "max_tokens": 8192})
    error = api_error(status, body)
    assert (status, error["code"]) == (507, "out_of_memory"), (status, error)
    assert "out of memory" in error["message"], error
    try:
        wait_until(10, lambda: address_space(pid) < warm + KV_CASE_HEADROOM_BYTES // 2,
                   "the failed request's memory to be given back", 0.2)
    finally:
        print(f"server {pid}: address space {address_space(pid) / 2**20:.0f} MiB after the "
              f"failed request ({warm / 2**20:.0f} MiB when warm)")
    assert chat_text(url) == before["chat"]
    assert server.process.poll() is None


# -- a replica killed mid-stream ------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def head_only_cluster():
    """One Ray node (the head, 2 logical CPUs: one per replica, 100 MB object store): the
    smallest cluster two replicas fit on."""
    pytest.importorskip("ray.serve", reason="the cluster extra installs ray[serve]")
    from tests.batch.batch_testlib import RAY, LocalCluster

    if not RAY.exists():
        pytest.skip("Ray is not installed: the cluster extra")
    cluster = LocalCluster()
    try:
        cluster._start("head", ["--head", f"--port={cluster.port}", "--num-cpus=2",
                                "--include-dashboard=false", f"--dashboard-port={cluster.dashboard}"])
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def ray_api(head_only_cluster):
    """`candle-web serve --api --ray-address ... --replicas 2 --parallel 1`: one request per
    replica at a time, so two streams at once run on the two replicas."""
    from tests.batch.batch_testlib import cli_env

    port = _free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "candle_web.cli", "serve", "--api", "--ray-address",
         head_only_cluster.address, "--replicas", "2", "--parallel", "1", "--model", LLM,
         "--port", str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=cli_env(),
        start_new_session=True, preexec_fn=default_sigint)
    lines = []
    reader = threading.Thread(target=lambda: lines.extend(process.stdout), daemon=True)
    reader.start()
    try:
        wait_until(600, lambda: any("OpenAI-compatible API at" in line for line in lines)
                   or process.poll() is not None, "the Ray Serve application to start", 0.5)
        assert process.poll() is None, "".join(lines)[-3000:]
        yield f"http://127.0.0.1:{port}"
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def read_to_the_end(stream: Stream) -> dict:
    """What a client sees reading a stream on: its text, [DONE] count, finish reasons, and the
    error that broke it if one did. A read that waits past the socket's timeout raises (a
    hang fails the test)."""
    seen = {"text": "", "done": 0, "finish": [], "broken": None}
    try:
        for event in stream.events():
            if event == "[DONE]":
                seen["done"] += 1
                continue
            for choice in event["choices"]:
                seen["text"] += choice["delta"].get("content") or ""
                if choice["finish_reason"]:
                    seen["finish"].append(choice["finish_reason"])
    except (http.client.IncompleteRead, ConnectionError, json.JSONDecodeError) as error:
        seen["broken"] = f"{type(error).__name__}: {error}"
    return seen


def first_words(stream: Stream) -> str:
    """Reads events until the first text: the stream is in the middle of its answer."""
    for event in stream.events():
        assert event != "[DONE]", "the stream ended before any text"
        text = "".join(c["delta"].get("content") or "" for c in event["choices"])
        if text:
            return text
    raise AssertionError("the stream ended before any text")


def replica_pid(headers: dict) -> int:
    return int(headers["x-candle-web-replica"].rsplit("/", 1)[1])


def test_replica_killed_mid_stream_breaks_only_its_stream_and_is_replaced(ray_api,
                                                                           head_only_cluster):
    doomed = Stream(ray_api, "Write a long story about a dragon.", 256)
    survivor = Stream(ray_api, "Name a primary colour.", 48)
    for stream in (doomed, survivor):
        assert stream.response.status == 200
        stream.headers = {k.lower(): v for k, v in stream.response.getheaders()}
        first_words(stream)
    victim, other = replica_pid(doomed.headers), replica_pid(survivor.headers)
    assert victim != other, "both streams ran on one replica"
    assert victim in head_only_cluster.processes(), "the replica is not this cluster's process"
    os.kill(victim, signal.SIGKILL)

    results = {}
    threads = [threading.Thread(target=lambda n=name, s=stream: results.__setitem__(
        n, read_to_the_end(s))) for name, stream in (("doomed", doomed), ("survivor", survivor))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(HANG_GUARD_S * 2)
    assert set(results) == {"doomed", "survivor"}, "a stream's client is still waiting"
    print(f"killed replica {victim}; its client saw {results['doomed']}")
    assert results["doomed"]["done"] == 0 and not results["doomed"]["finish"], results["doomed"]
    assert results["survivor"]["done"] == 1 and results["survivor"]["finish"], results["survivor"]

    # Serve starts a replica in the dead one's place: two requests at once (one slot per
    # replica) are answered by two live replicas, one of them new.
    def two_at_once() -> set:
        answers = []

        def ask():
            status, headers, body = post_json(ray_api, "/v1/chat/completions", {
                "model": LLM, "messages": chat_messages(), "max_tokens": 2, "temperature": 0})
            answers.append((status, headers, body))
        askers = [threading.Thread(target=ask) for _ in range(2)]
        for asker in askers:
            asker.start()
        for asker in askers:
            asker.join(HANG_GUARD_S)
        for status, _, body in answers:
            assert status == 200, body[:500]
        return {replica_pid(headers) for _, headers, _ in answers}

    started = time.monotonic()
    seen = set()
    wait_until(300, lambda: seen.update(two_at_once()) or bool(seen - {victim, other}),
               "a replica in the killed one's place", 1.0)
    print(f"replica pids answering: {sorted(seen)} ({time.monotonic() - started:.0f} s "
          "after the kill)")
    assert victim not in seen
