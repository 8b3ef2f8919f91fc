"""The pieces every reply of `candle-web serve` is made of: the security headers that every
response carries (cross-origin isolation for the page's SharedArrayBuffer, nosniff, no framing,
no referrer), ASGI header helpers, whole responses and short refusals, and the raw replies the
connection layer writes before any ASGI cycle exists."""
from __future__ import annotations

from http import HTTPStatus

ISOLATION_HEADERS = {
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Embedder-Policy": "require-corp",
    "Cross-Origin-Resource-Policy": "same-origin",
    # Without nosniff a browser may second-guess the types below.
    "X-Content-Type-Options": "nosniff",
    # Nothing here is meant to be framed by another site or to leak its URL onwards.
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
}


def encode_headers(headers) -> list:
    """ASGI header pairs (latin-1 bytes) from (name, value) string pairs or a dict."""
    items = headers.items() if isinstance(headers, dict) else headers
    return [(name.encode("latin-1"), str(value).encode("latin-1")) for name, value in items]


def request_headers(scope) -> dict:
    """{lower-case name: value} of an ASGI request; the first of repeated headers wins, as
    http.server's `headers.get` did."""
    found = {}
    for name, value in scope.get("headers", ()):
        found.setdefault(name.decode("latin-1").lower(), value.decode("latin-1"))
    return found


async def respond(send, status: int, headers=(), body: bytes = b"", send_body: bool = True) -> None:
    """One whole response; Content-Length is the body's unless headers give one (HEAD)."""
    pairs = list(headers.items() if isinstance(headers, dict) else headers)
    if not any(name.lower() == "content-length" for name, _ in pairs):
        pairs.append(("Content-Length", str(len(body))))
    await send({"type": "http.response.start", "status": int(status),
                "headers": encode_headers(pairs)})
    await send({"type": "http.response.body", "body": body if send_body else b""})


def _plain_body(status: HTTPStatus) -> bytes:
    return f"{status.value} {status.phrase}\n".encode("ascii")


async def refuse(send, status: HTTPStatus, send_body: bool = True, headers=()) -> None:
    """A short text/plain refusal that is never cached."""
    body = _plain_body(status)
    await respond(send, status, [("Content-Type", "text/plain; charset=utf-8"),
                                 ("Content-Length", str(len(body))),
                                 ("Cache-Control", "no-store"), *headers], body, send_body)


def raw_reply(status: HTTPStatus, extra_headers: dict = None, body: bytes = b"",
              content_type: str = None) -> bytes:
    """A whole HTTP/1.1 reply written straight to a socket (no ASGI cycle exists yet), with
    the security headers, closing the connection."""
    lines = [f"HTTP/1.1 {status.value} {status.phrase}", f"Content-Length: {len(body)}",
             "Connection: close"]
    if content_type:
        lines.append(f"Content-Type: {content_type}")
    for name, value in {**ISOLATION_HEADERS, **(extra_headers or {})}.items():
        lines.append(f"{name}: {value}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body
