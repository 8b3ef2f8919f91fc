"""Issue 37: `candle-web serve --api` as a real child process on 127.0.0.1, stopped the way
orchestrators stop it (SIGTERM), and its audio duration cap.

- SIGTERM drains: a transcription whose upload is still arriving when the signal comes is
  answered in full (the same transcript as before the signal), every new request gets 503 (the
  OpenAI error JSON under /v1), and the process exits with status 0 once nothing is in flight.
- A drain that would never end (a request that stalls, a five-minute transcription) ends at
  `--drain-seconds`, or at a second SIGTERM: the process still exits 0, saying what it cut.
- `--max-audio-seconds` / $CANDLE_WEB_MAX_AUDIO_SECONDS: a longer upload gets 400 naming the
  duration and the limit, a shorter one is transcribed.

Each server is its own process; every wait is bounded (a hang guard, not a timing threshold)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("starlette", reason="the serve extra installs starlette")
pytest.importorskip("uvicorn", reason="the serve extra installs uvicorn")

from candle_web import serve  # noqa: E402
from candle_web.io.wav import encode_wav, parse_wav_header, read_wav  # noqa: E402
from tests.api.api_testlib import CLIP, CLIP_B, WHISPER, multipart_body  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[2]
HANG_GUARD_S = 120  # start-up with a model, one transcription, the drain: far above each


class ServeProcess:
    """`python -m candle_web.cli serve ARGS --port 0`, its output collected by a thread."""

    def __init__(self, *args: str, environment: dict = None):
        env = dict(os.environ, PYTHONUNBUFFERED="1", **(environment or {}))
        env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT / "pkg"), env.get("PYTHONPATH", "")])
        env.pop("CANDLE_WEB_API_KEY", None)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "candle_web.cli", "serve", "--port", "0", *args],
            cwd=REPO_ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.port = self._port()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))

    def _port(self) -> int:
        deadline = time.monotonic() + HANG_GUARD_S
        while time.monotonic() < deadline and self.process.poll() is None:
            for line in self.lines:
                if line.startswith("candle-web: serving "):
                    return int(line.rsplit(":", 1)[1].strip().rstrip("/"))
            time.sleep(0.05)
        raise AssertionError("the server did not start:\n" + "\n".join(self.lines))

    def output(self) -> str:
        self._reader.join(HANG_GUARD_S)
        return "\n".join(self.lines)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(HANG_GUARD_S)


@pytest.fixture
def started():
    servers = []

    def start(*args, environment=None) -> ServeProcess:
        servers.append(ServeProcess(*args, environment=environment))
        return servers[-1]

    yield start
    for server in servers:
        server.stop()


def exchange(port: int, request: bytes) -> tuple[int, dict, bytes]:
    """One whole request on a fresh connection: (status, lower-case headers, body)."""
    with socket.create_connection(("127.0.0.1", port), timeout=HANG_GUARD_S) as sock:
        sock.sendall(request)
        return read_reply(sock)


def read_reply(sock: socket.socket) -> tuple[int, dict, bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"the connection closed before a reply: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    headers = {name.lower(): value for name, value in headers.items()}
    while len(body) < int(headers["content-length"]):
        chunk = sock.recv(65536)
        assert chunk, "the connection closed inside the body"
        body += chunk
    return int(lines[0].split()[1]), headers, body


def get(path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode()


def transcription(clip: Path, expect_continue: bool = False) -> tuple[bytes, bytes]:
    """(request head, body) of POST /v1/audio/transcriptions with `clip`."""
    body, content_type = multipart_body({"model": WHISPER}, clip.name, clip.read_bytes())
    expect = "Expect: 100-continue\r\n" if expect_continue else ""
    head = (f"POST /v1/audio/transcriptions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
            f"{content_type}\r\nContent-Length: {len(body)}\r\n{expect}\r\n").encode()
    return head, body


def start_in_flight(port: int, head: bytes) -> socket.socket:
    """A request whose head (with `Expect: 100-continue`) is sent and whose body is not: the
    server's "100 Continue" says the application has it and waits for the body, so it is in
    flight for sure (no sleep, no race with the signal that follows)."""
    assert b"Expect: 100-continue" in head
    sock = socket.create_connection(("127.0.0.1", port), timeout=HANG_GUARD_S)
    sock.sendall(head)
    interim = b""
    while not interim.endswith(b"\r\n\r\n"):
        chunk = sock.recv(1)
        assert chunk, f"the connection closed before 100 Continue: {interim!r}"
        interim += chunk
    assert interim.startswith(b"HTTP/1.1 100 Continue"), interim
    return sock


def assert_openai_error(status: int, body: bytes, expected_status: int) -> dict:
    assert status == expected_status, body[:300]
    error = json.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    return error


def clip_seconds(path: Path) -> float:
    return parse_wav_header(path.read_bytes()).duration_s


@pytest.fixture(scope="module", autouse=True)
def speech():
    if not CLIP.is_file() or not CLIP_B.is_file():
        pytest.fail("test speech is missing: run `make test` (scripts/fetch_test_audio.sh)",
                    pytrace=False)


def test_sigterm_lets_an_upload_in_flight_finish_refuses_new_requests_and_exits_0(started):
    server = started("--api", "--model", WHISPER)
    head, body = transcription(CLIP)
    status, _, before = exchange(server.port, head + body)
    assert status == 200, before[:300]

    # A transcription in flight: its upload has begun, the rest is still to come.
    head, body = transcription(CLIP, expect_continue=True)
    in_flight = start_in_flight(server.port, head)
    in_flight.sendall(body[:len(body) // 2])
    signalled = time.monotonic()
    server.process.send_signal(signal.SIGTERM)

    # New requests are refused while it runs: keep asking until the server says it drains.
    deadline = time.monotonic() + HANG_GUARD_S
    while True:
        status, headers, reply = exchange(server.port, get("/v1/models"))
        if status == 503 or time.monotonic() > deadline:
            break
    error = assert_openai_error(status, reply, 503)
    assert error["code"] == "server_shutting_down" and "SIGTERM" in error["message"]
    assert headers["connection"] == "close" and headers["retry-after"] == "1"
    page_status, page_headers, _ = exchange(server.port, get("/"))
    assert page_status == 503 and page_headers["connection"] == "close"
    new_head, new_body = transcription(CLIP_B)
    status, _, reply = exchange(server.port, new_head + new_body)
    assert_openai_error(status, reply, 503)

    # The request in flight completes, with the transcript it had before the signal.
    in_flight.sendall(body[len(body) // 2:])
    status, headers, after = read_reply(in_flight)
    in_flight.close()
    assert status == 200, after[:300]
    assert json.loads(after)["text"] == json.loads(before)["text"]
    assert headers["connection"] == "close"  # a drained server keeps no connection open

    assert server.process.wait(HANG_GUARD_S) == 0
    print(f"SIGTERM to exit: {time.monotonic() - signalled:.2f} s")
    output = server.output()
    assert "candle-web: SIGTERM: draining 1 request(s) in flight" in output, output
    assert "candle-web: drained: no request in flight" in output
    assert "candle-web: stopped" in output and "cutting" not in output
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", server.port), timeout=5).close()


def test_a_drain_that_would_never_end_stops_at_its_timeout_with_status_0(started):
    """A request whose body stalls (the 10 s idle limit is further off than the drain's 1 s)
    is cut when the drain's time is up; the process still exits 0 and says so."""
    server = started("--api", "--drain-seconds", "1")
    stalled = start_in_flight(server.port, b"POST /v1/chat/completions HTTP/1.1\r\nHost: "
                              b"127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: "
                              b"100\r\nExpect: 100-continue\r\n\r\n")
    stalled.sendall(b'{"model"')  # and nothing more
    server.process.send_signal(signal.SIGTERM)
    assert server.process.wait(HANG_GUARD_S) == 0
    stalled.close()
    output = server.output()
    assert "cutting 1 request(s) still in flight" in output, output
    assert "candle-web: stopped" in output


def test_a_long_transcription_cut_by_the_drain_timeout_does_not_hold_the_exit(started):
    """Five minutes of speech uploaded whole, then SIGTERM with a 3 s drain: the transcription
    is cut (its model's worker thread may still be busy; the process does not wait for it) and
    the process exits 0."""
    samples, rate = read_wav(CLIP.read_bytes(), mono=True)
    five_minutes = encode_wav(np.tile(samples, int(np.ceil(300 * rate / samples.size))), rate)
    body, content_type = multipart_body({"model": WHISPER}, "long.wav", five_minutes)
    head = (f"POST /v1/audio/transcriptions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
            f"{content_type}\r\nContent-Length: {len(body)}\r\nExpect: 100-continue\r\n\r\n")
    server = started("--api", "--model", WHISPER, "--drain-seconds", "3")
    in_flight = start_in_flight(server.port, head.encode())
    in_flight.sendall(body)
    server.process.send_signal(signal.SIGTERM)
    assert server.process.wait(HANG_GUARD_S) == 0
    in_flight.close()
    output = server.output()
    assert "cutting 1 request(s) still in flight" in output, output
    assert "candle-web: stopped" in output


def test_a_second_sigterm_ends_the_drain_at_once(started):
    """The sender of a second SIGTERM means it: the drain's 10 minutes are not waited for."""
    server = started("--api", "--drain-seconds", "600")
    stalled = start_in_flight(server.port, b"POST /v1/embeddings HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                              b"Content-Type: application/json\r\nContent-Length: 100\r\n"
                              b"Expect: 100-continue\r\n\r\n")
    server.process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + HANG_GUARD_S
    while not any("SIGTERM: draining 1 request(s)" in line for line in server.lines):
        assert time.monotonic() < deadline and server.process.poll() is None, server.lines
        time.sleep(0.05)
    server.process.send_signal(signal.SIGTERM)
    assert server.process.wait(HANG_GUARD_S) == 0  # the hang guard is far below 600 s
    stalled.close()
    assert "cutting 1 request(s) still in flight" in server.output()


def test_uploads_longer_than_the_cap_get_400_naming_duration_and_limit(started):
    short, long = clip_seconds(CLIP), clip_seconds(CLIP_B)
    assert short < long
    cap = round((short + long) / 2, 2)  # the first clip fits, the second does not
    # Through the environment variable (the flag is the same value: see the parser test).
    server = started("--api", "--model", WHISPER,
                     environment={serve.MAX_AUDIO_ENV_VAR: str(cap)})
    status, _, reply = exchange(server.port, b"".join(transcription(CLIP)))
    assert status == 200 and json.loads(reply)["text"].strip(), reply[:300]
    status, _, reply = exchange(server.port, b"".join(transcription(CLIP_B)))
    error = assert_openai_error(status, reply, 400)
    assert error["param"] == "file" and error["code"] == "audio_too_long", error
    assert f"lasts {long:.1f} s" in error["message"], error
    assert f"limit of {cap:g} s" in error["message"], error
    status, _, _ = exchange(server.port, get("/v1/models"))
    assert status == 200  # and it goes on serving


@pytest.mark.parametrize("argv, environment, fragment", [
    (["--max-audio-seconds", "0"], {}, "--max-audio-seconds: must be a number of seconds > 0"),
    (["--max-audio-seconds", "ten"], {}, "--max-audio-seconds: not a number of seconds"),
    (["--drain-seconds", "-1"], {}, "--drain-seconds: must be a number of seconds > 0"),
    ([], {serve.MAX_AUDIO_ENV_VAR: "inf"}, "$CANDLE_WEB_MAX_AUDIO_SECONDS: must be a number"),
])
def test_bad_durations_are_refused_naming_the_option(argv, environment, fragment, capsys,
                                                      monkeypatch):
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as exit_info:
        serve.main(["--api", "--port", "0", *argv])
    assert exit_info.value.code == 2
    assert fragment in capsys.readouterr().err


def test_the_flag_wins_over_the_variable_and_the_default_is_the_apis(monkeypatch):
    import argparse

    from candle_web.api import ApiLimits

    parser = argparse.ArgumentParser()
    serve.add_api_arguments(parser)
    monkeypatch.setenv(serve.MAX_AUDIO_ENV_VAR, "90")
    assert serve.server.max_audio_seconds_from(parser.parse_args([]), parser) == 90
    assert serve.server.max_audio_seconds_from(
        parser.parse_args(["--max-audio-seconds", "12.5"]), parser) == 12.5
    monkeypatch.delenv(serve.MAX_AUDIO_ENV_VAR)
    assert serve.server.max_audio_seconds_from(parser.parse_args([]), parser) is None
    # None means ApiLimits' default, which the help and the README state.
    assert f"else {ApiLimits().max_audio_seconds:g}," in " ".join(parser.format_help().split())
