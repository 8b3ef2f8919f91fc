"""Soak (issue 37 item 7, opt-in): `candle-web serve --api` with SmolLM2 as a child process on
127.0.0.1, eight clients for CANDLE_WEB_SOAK_SECONDS (600) connecting and hanging up at random:
streaming chats cut after a random number of events, streams read to their end, requests cut
inside their head or body. Afterwards the server answers a chat exactly as before the soak,
every stream read to its end got its [DONE], and its resident memory at the end is within
RSS_GROWTH_BOUND of what it was after the warm-up (the first quarter, at most 60 s).

    CANDLE_WEB_SOAK=1 CANDLE_WEB_SOAK_SECONDS=120 .venv/bin/python -m pytest -s \
        tests/api/test_api_soak.py

Off by default: ten minutes of two busy cores is more than `make test` may take."""

from __future__ import annotations

import json
import os
import random
import socket
import threading
import time

import pytest

pytestmark = pytest.mark.skipif(
    os.environ.get("CANDLE_WEB_SOAK") != "1",
    reason="the 10-minute soak is opt-in: CANDLE_WEB_SOAK=1 runs it (CANDLE_WEB_SOAK_SECONDS "
           "sets its length, 600 by default)")

pytest.importorskip("starlette", reason="the serve extra installs starlette")
pytest.importorskip("uvicorn", reason="the serve extra installs uvicorn")

from tests.api.api_testlib import (HTTP_TIMEOUT_S, LLM, Stream,  # noqa: E402
                                   chat_messages, chat_request)
from tests.serve.test_serve_drain import ServeProcess  # noqa: E402

CLIENTS = 8
QUESTIONS = ["What is the capital of France?", "Name a primary colour.", "What is 2 + 2?",
             "Say hello in Spanish.", "Write a haiku about rain."]
# Resident memory may end this much above its level after the warm-up: the allocator's free
# lists and the prefix pool's entries for these few questions settle within the warm-up, so
# a steady climb (a request's caches, buffers or tasks kept after its client left) shows as
# more than this over ten minutes.
RSS_GROWTH_BOUND = 48 << 20


def resident(pid: int, field: str = "VmRSS") -> int:
    with open(f"/proc/{pid}/status") as handle:
        for line in handle:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} for process {pid}")


class Client(threading.Thread):
    """One client: until `deadline`, a random one of three visits, each bounded by the
    socket timeout (a hang fails the soak)."""

    def __init__(self, url: str, port: int, deadline: float, seed: int):
        super().__init__(daemon=True)
        self.url, self.port, self.deadline = url, port, deadline
        self.random = random.Random(seed)
        self.counts = {"cut_stream": 0, "whole_stream": 0, "cut_request": 0}
        self.problems: list[str] = []

    def run(self) -> None:
        try:
            while time.monotonic() < self.deadline:
                visit = self.random.choices(["cut_stream", "whole_stream", "cut_request"],
                                            [6, 3, 1])[0]
                getattr(self, visit)()
                self.counts[visit] += 1
        except Exception as error:  # noqa: BLE001  (reported by the test)
            self.problems.append(f"{type(error).__name__}: {error}")

    def _stream(self, max_tokens: int) -> Stream:
        stream = Stream(self.url, self.random.choice(QUESTIONS), max_tokens)
        if stream.response.status != 200:
            self.problems.append(f"status {stream.response.status}: "
                                 f"{stream.response.read()[:300]!r}")
        return stream

    def cut_stream(self) -> None:
        """A stream hung up after 0..12 events (0: right after the response's head)."""
        stream = self._stream(self.random.randint(8, 48))
        cut_after = self.random.randint(0, 12)
        events = stream.events()
        for _ in range(cut_after):
            if next(events, "[DONE]") == "[DONE]":
                break
        stream.hang_up()

    def whole_stream(self) -> None:
        stream = self._stream(self.random.randint(4, 24))
        events = list(stream.events())
        stream.connection.close()
        if events.count("[DONE]") != 1:
            self.problems.append(f"a stream read to its end had {events.count('[DONE]')} "
                                 f"[DONE] in {len(events)} events")

    def cut_request(self) -> None:
        """A request cut inside its head or its JSON body, then hung up."""
        body = json.dumps({"model": LLM, "messages": chat_messages(), "max_tokens": 16,
                           "stream": True}).encode()
        request = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                   f"application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body
        with socket.create_connection(("127.0.0.1", self.port), timeout=HTTP_TIMEOUT_S) as sock:
            sock.sendall(request[:self.random.randint(1, len(request) - 1)])


def test_soak_clients_hanging_up_at_random_leave_memory_flat():
    duration = float(os.environ.get("CANDLE_WEB_SOAK_SECONDS", "600"))
    warm_up = min(60.0, duration / 4)
    server = ServeProcess("--api", "--model", LLM, "--parallel", "2", "--queue", "16")
    try:
        url = f"http://127.0.0.1:{server.port}"
        pid = server.process.pid
        status, before = chat_request(url, QUESTIONS[0], 16)
        assert status == 200, before
        started = time.monotonic()
        clients = [Client(url, server.port, started + duration, seed) for seed in range(CLIENTS)]
        for client in clients:
            client.start()
        time.sleep(warm_up)
        after_warm_up = resident(pid)
        samples = []
        while any(client.is_alive() for client in clients) and \
                time.monotonic() < started + duration + 2 * HTTP_TIMEOUT_S:
            samples.append(resident(pid))
            time.sleep(5)
        for client in clients:
            client.join(HTTP_TIMEOUT_S)
        assert not any(client.is_alive() for client in clients), "a client is still waiting"

        # Idle again: a chat is answered exactly as before the soak.
        status, after = chat_request(url, QUESTIONS[0], 16)
        assert status == 200, after
        at_end = resident(pid)
        counts = {name: sum(client.counts[name] for client in clients)
                  for name in clients[0].counts}
        print(f"soak: {duration:.0f} s, {CLIENTS} clients, visits {counts}; server RSS "
              f"{after_warm_up / 2**20:.1f} MiB after the {warm_up:.0f} s warm-up, "
              f"{at_end / 2**20:.1f} MiB at the end ({(at_end - after_warm_up) / 2**20:+.1f} "
              f"MiB; bound +{RSS_GROWTH_BOUND / 2**20:.0f} MiB), highest sample "
              f"{max(samples, default=at_end) / 2**20:.1f} MiB, peak (VmHWM) "
              f"{resident(pid, 'VmHWM') / 2**20:.1f} MiB")
        assert server.process.poll() is None, server.output()[-3000:]
        problems = [problem for client in clients for problem in client.problems]
        assert not problems, problems[:10]
        assert after["token_ids"] == before["token_ids"]
        assert at_end - after_warm_up <= RSS_GROWTH_BOUND
    finally:
        server.stop()
