"""Who may talk to `candle-web serve`, and for how long: the Host check that refuses DNS
rebinding (421) and the connection bounds -- more than MAX_CONNECTIONS get 503 at once, a
connection idle for IDLE_TIMEOUT_S is closed (a stalled request body gets a 408 JSON error
first), and a request that does not parse gets 400 with the security headers. The bounds live
in a subclass of uvicorn's httptools protocol, built on first use (uvicorn is a native-only
dependency, never imported by the page)."""
from __future__ import annotations

import functools
import re
from http import HTTPStatus
from typing import Optional

from .replies import raw_reply

DEFAULT_HOST = "127.0.0.1"
# A connection that sends nothing for this long (a half-sent request, an idle keep-alive) is
# closed: without it, 200 half-sent requests held 200 threads indefinitely. Each socket
# operation gets the limit, so a slow but moving model download is not cut off.
IDLE_TIMEOUT_S = 10.0
# Connections served at once; more are answered 503 at once and closed. A browser opens at
# most 6 per host, so this only bounds misbehaving clients.
MAX_CONNECTIONS = 64
# Host names a request may carry besides the bound address: a page on another site that
# rebinds its DNS name to 127.0.0.1 sends its own name, and is refused (421).
LOOPBACK_HOST_NAMES = ("127.0.0.1", "localhost", "::1")
MISDIRECTED_JSON = (b'{"error": {"message": "Host: not this server\'s address, a loopback name '
                    b'or an --allowed-host (DNS rebinding is refused)", "type": '
                    b'"invalid_request_error", "param": null, "code": "misdirected_request"}}')
# What `--allowed-host` accepts: a DNS name or an IP address, without a port (any port is
# served, as for the loopback names).
_HOST_NAME = re.compile(r"^[a-z0-9_]([a-z0-9_.-]*[a-z0-9_])?$|^[0-9a-f:.]*:[0-9a-f:.]*$")


def allowed_host_name(text: str) -> str:
    """The lower-case form of an `--allowed-host` name (`[v6]` loses its brackets), or
    ValueError naming what is wrong with it."""
    name = text.strip().lower().rstrip(".")  # box.example. is box.example
    if name.startswith("[") and name.endswith("]"):
        name = name[1:-1]
    if name.count(":") == 1:
        raise ValueError(f"{text!r}: give the name without a port (every port is served)")
    if not _HOST_NAME.match(name):
        raise ValueError(f"{text!r}: not a host name or IP address")
    return name


def host_allowed(host_header: Optional[str], bound_host: str, allowed_hosts=()) -> bool:
    """The Host is this server's address, a loopback name or one of `allowed_hosts` (lower
    case, see allowed_host_name; any port). A request without one (HTTP/1.0) cannot be a
    DNS-rebinding page, which always sends its name."""
    if host_header is None:
        return True
    host = host_header.strip().lower()
    if host.startswith("["):  # [::1]:8000
        host = host[1:host.find("]")] if "]" in host else host
    elif host.count(":") == 1:
        host = host.rsplit(":", 1)[0]
    return host in LOOPBACK_HOST_NAMES or host == str(bound_host).lower() \
        or host.rstrip(".") in allowed_hosts


@functools.lru_cache(maxsize=None)
def _protocol_base():
    """uvicorn's httptools protocol with this server's bounds (built on first use: uvicorn is
    a native-only dependency, never imported by the page)."""
    import httptools  # noqa: PLC0415
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol  # noqa: PLC0415

    class BoundedProtocol(HttpToolsProtocol):
        """Refuses connections beyond `max_connections` with 503, closes a connection that
        sends nothing for `idle_timeout_s` (a half-sent request, an idle keep-alive, a body that
        stalls: 408), and answers unparseable requests 400 with the security headers."""

        max_connections = MAX_CONNECTIONS
        idle_timeout_s = IDLE_TIMEOUT_S
        extra_headers: dict = {}
        _refused = False
        _idle_timer = None
        _stalled_buffer = None
        _upgrade_body_left = None  # bytes of body still due after a refused Upgrade

        def connection_made(self, transport) -> None:
            if len(self.connections) >= self.max_connections:
                self._refused = True
                transport.write(raw_reply(HTTPStatus.SERVICE_UNAVAILABLE,
                                          {"Retry-After": "1", **self.extra_headers}))
                transport.close()
                return
            super().connection_made(transport)
            self._arm_idle_timer()

        def connection_lost(self, exc) -> None:
            if self._refused:
                return
            if self._idle_timer is not None:
                self._idle_timer.cancel()
                self._idle_timer = None
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self._refused:
                return
            self._arm_idle_timer()
            if self._upgrade_body_left is not None:
                self._take_upgrade_body(data)
                return
            self._unset_keepalive_if_required()
            try:
                self.parser.feed_data(data)
            except httptools.HttpParserError:
                self.send_400_response("Invalid HTTP request received.")
            except httptools.HttpParserUpgrade as upgrade:
                self._refuse_upgrade(data[upgrade.args[0]:] if upgrade.args else b"")

        def _refuse_upgrade(self, rest: bytes) -> None:
            """An `Upgrade:` this server does not speak (h2c, which Java's default HttpClient
            asks for on every http:// request; websockets): llhttp ended the message at its
            headers, so the body, if any, follows as plain bytes. Read it by Content-Length,
            answer in HTTP/1.1 and close (the parser cannot go on after an upgrade)."""
            cycle = self.cycle
            if cycle is None or cycle.response_complete:
                self.transport.close()
                return
            cycle.keep_alive = False
            headers = dict(self.headers or ())
            if b"chunked" in headers.get(b"transfer-encoding", b"").lower():
                self.send_400_response("chunked body with an Upgrade header")
                return
            length = headers.get(b"content-length", b"0")
            self._upgrade_body_left = int(length) if length.isdigit() else 0
            cycle.more_body = self._upgrade_body_left > 0
            self._take_upgrade_body(rest)

        def _take_upgrade_body(self, data: bytes) -> None:
            cycle = self.cycle
            taken = data[:self._upgrade_body_left]
            self._upgrade_body_left -= len(taken)
            if taken and not cycle.response_complete:
                cycle.body += taken
            if self._upgrade_body_left == 0:
                cycle.more_body = False
            cycle.message_event.set()

        def send_400_response(self, msg: str) -> None:
            body = b"400 Bad Request\n"
            self.transport.write(raw_reply(HTTPStatus.BAD_REQUEST, self.extra_headers, body,
                                           "text/plain; charset=utf-8"))
            self.transport.close()

        def _arm_idle_timer(self) -> None:
            if self._idle_timer is not None:
                self._idle_timer.cancel()
            self._idle_timer = self.loop.call_later(self.idle_timeout_s, self._on_idle)

        def _on_idle(self) -> None:
            self._idle_timer = None
            if self.transport is None or self.transport.is_closing():
                return
            cycle = self.cycle
            if cycle is not None and not cycle.response_complete and not cycle.more_body:
                # The request is in: the application is working or streaming. Only a client
                # that stopped reading (the write buffer full and not draining) is dropped.
                if self.flow.write_paused:
                    size = self.transport.get_write_buffer_size()
                    if size == self._stalled_buffer:
                        self.transport.close()
                        return
                    self._stalled_buffer = size
                else:
                    self._stalled_buffer = None
                self._arm_idle_timer()
                return
            if cycle is not None and cycle.more_body and not cycle.response_started:
                # Headers came, the body stopped: say so before closing (the app sees a
                # disconnect and drops the request).
                body = (b'{"error": {"message": "the request body stopped arriving (idle for '
                        + f"{self.idle_timeout_s:g}".encode() + b' s)", "type": '
                        b'"invalid_request_error", "param": null, "code": "request_timeout"}}')
                self.transport.write(raw_reply(HTTPStatus.REQUEST_TIMEOUT, self.extra_headers,
                                               body, "application/json"))
            self.transport.close()

    return BoundedProtocol
