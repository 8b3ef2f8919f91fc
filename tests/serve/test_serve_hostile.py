"""`candle-web serve` against hostile clients (issue 17): DNS-rebinding Host headers, half-sent
requests, too many connections, garbage request lines. Traffic stays on 127.0.0.1."""

from __future__ import annotations

import http.client
import socket
import time

import pytest

from candle_web.serve import ISOLATION_HEADERS, SiteConfig, start_in_thread

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
