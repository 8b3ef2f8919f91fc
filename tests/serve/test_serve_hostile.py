"""`candle-web serve` against hostile clients (issue 17): DNS-rebinding Host headers, half-sent
requests, too many connections, garbage request lines. Traffic stays on 127.0.0.1."""

from __future__ import annotations

import http.client
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from candle_web import serve
from candle_web.serve import ISOLATION_HEADERS, SiteConfig, allowed_host_name, start_in_thread

REPO_ROOT = Path(__file__).resolve().parents[2]

IDLE_S = 0.5  # short for the test; the default is serve.IDLE_TIMEOUT_S
MAX_CONNECTIONS = 4


@pytest.fixture
def server(tmp_path):
    (tmp_path / "index.html").write_text("<!doctype html><title>t</title>")
    site = SiteConfig(web_root=tmp_path, idle_timeout_s=IDLE_S, max_connections=MAX_CONNECTIONS)
    running, url = start_in_thread(site=site)
    yield running, running.server_address[1]
    running.shutdown()
    running.server_close()


def get(port: int, host_header: str | None) -> http.client.HTTPResponse:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    connection.putrequest("GET", "/", skip_host=True)
    if host_header is not None:
        connection.putheader("Host", host_header)
    connection.endheaders()
    response = connection.getresponse()
    response.read()
    connection.close()
    return response


@pytest.mark.parametrize("host", ["127.0.0.1:{port}", "localhost:{port}", "[::1]:{port}",
                                  "LOCALHOST", None])
def test_loopback_hosts_are_served(server, host):
    _, port = server
    response = get(port, None if host is None else host.format(port=port))
    assert response.status == 200


@pytest.mark.parametrize("host", ["evil.example", "evil.example:{port}", "127.0.0.1.evil.example",
                                  "192.168.1.2:{port}"])
def test_a_foreign_host_is_refused_with_the_security_headers(server, host):
    _, port = server
    response = get(port, host.format(port=port))
    assert response.status == 421
    for name, value in ISOLATION_HEADERS.items():
        assert response.getheader(name) == value


def test_a_garbage_request_line_gets_a_reply_with_headers(server):
    _, port = server
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"\x16\x03\x01 garbage\r\n\r\n")
        reply = b""
        while chunk := sock.recv(4096):
            reply += chunk
    head = reply.split(b"\r\n\r\n", 1)[0].decode("latin-1")
    assert head.startswith(("HTTP/1.0 400", "HTTP/1.1 400")), head
    assert "X-Content-Type-Options: nosniff" in head
    assert "Cross-Origin-Resource-Policy: same-origin" in head


def test_half_sent_requests_are_dropped_after_the_idle_limit(server):
    _, port = server
    sockets = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(3)]
    started = time.monotonic()
    for sock in sockets:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # never finished
    for sock in sockets:
        assert sock.recv(4096) == b""  # the server closed it
        sock.close()
    elapsed = time.monotonic() - started
    assert IDLE_S * 0.8 <= elapsed < IDLE_S + 4, elapsed
    assert get(port, "127.0.0.1").status == 200  # and the threads came back


def test_connections_beyond_the_bound_get_503_and_the_rest_still_work(server):
    _, port = server
    held = [socket.create_connection(("127.0.0.1", port), timeout=5)
            for _ in range(MAX_CONNECTIONS)]
    time.sleep(0.1)  # let the server accept them all
    with socket.create_connection(("127.0.0.1", port), timeout=5) as extra:
        reply = extra.recv(4096).decode("latin-1")
    assert reply.startswith("HTTP/1.1 503"), reply
    assert "X-Content-Type-Options: nosniff" in reply
    for sock in held:
        sock.close()
    deadline = time.monotonic() + 5
    while True:  # the slots are released as the server notices the closed connections
        try:
            assert get(port, "127.0.0.1").status == 200
            break
        except (AssertionError, ConnectionError, http.client.HTTPException):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


# --- --allowed-host: the names a server on 0.0.0.0 is reached by ---------------------------

@pytest.fixture
def named_server(tmp_path):
    """A server that also answers to box.example (as `--allowed-host box.example` makes it)."""
    (tmp_path / "index.html").write_text("<!doctype html><title>t</title>")
    site = SiteConfig(web_root=tmp_path, allowed_hosts=(allowed_host_name("Box.Example"),))
    running, _ = start_in_thread(site=site)
    yield running.server_address[1]
    running.shutdown()
    running.server_close()


@pytest.mark.parametrize("host", ["box.example", "box.example:{port}", "BOX.example:8080",
                                  "box.example.", "127.0.0.1:{port}"])
def test_an_allowed_host_name_is_served(named_server, host):
    assert get(named_server, host.format(port=named_server)).status == 200


@pytest.mark.parametrize("host", ["evil.example", "box.example.evil.example", "www.box.example",
                                  "box.exampl"])
def test_a_name_not_allowed_is_still_refused(named_server, host):
    response = get(named_server, host)
    assert response.status == 421
    for name, value in ISOLATION_HEADERS.items():
        assert response.getheader(name) == value


@pytest.mark.parametrize("text, expected", [("Box.Example.", "box.example"),
                                            ("[fe80::1]", "fe80::1"), ("10.0.0.5", "10.0.0.5")])
def test_allowed_host_names_are_normalised(text, expected):
    assert allowed_host_name(text) == expected


@pytest.mark.parametrize("text, fragment", [("box.example:8000", "without a port"),
                                            ("", "not a host name"), ("a b", "not a host name"),
                                            ("box/evil", "not a host name"),
                                            ("-box.example", "not a host name")])
def test_the_command_line_refuses_a_bad_allowed_host(text, fragment, capsys):
    with pytest.raises(SystemExit) as exit_info:
        serve.main([f"--allowed-host={text}", "--port", "0"])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert "--allowed-host" in error and fragment in error and repr(text) in error


def test_candle_web_serve_passes_allowed_hosts_to_the_running_server():
    """`candle-web serve --allowed-host box.example` (the real command, a child process): the
    listed name is served, another gets 421."""
    environment = dict(os.environ, PYTHONUNBUFFERED="1")
    environment["PYTHONPATH"] = os.pathsep.join(
        [str(REPO_ROOT / "pkg"), environment.get("PYTHONPATH", "")])
    process = subprocess.Popen(
        [sys.executable, "-m", "candle_web.cli", "serve", "--port", "0", "--allowed-host",
         "box.example", "--allowed-host", "other.example"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=environment)
    try:
        line = process.stdout.readline()
        assert line.startswith("candle-web: serving "), line
        port = int(line.rsplit(":", 1)[1].strip().rstrip("/"))
        assert get(port, f"box.example:{port}").status == 200
        assert get(port, "other.example").status == 200
        assert get(port, f"third.example:{port}").status == 421
    finally:
        process.terminate()
        process.wait(timeout=30)
