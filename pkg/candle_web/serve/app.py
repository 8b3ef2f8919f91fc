"""The ASGI application of `candle-web serve`: the Host check first, then 503 while the server
drains (drain.py), then /v1 to the API (when one is attached) and everything else to the static
site (GET and HEAD only). It counts the requests in flight, which a drain waits for."""
from __future__ import annotations

import sys
from http import HTTPStatus

from .drain import Drain, refuse_while_draining
from .hosts import DEFAULT_HOST, MISDIRECTED_JSON, host_allowed
from .replies import ISOLATION_HEADERS, encode_headers, refuse, request_headers, respond
from .site import SiteConfig, serve_file

# `candle-web serve --api`: the OpenAI-compatible routes live under this prefix (candle_web.api).
API_PREFIX = "/v1"


class SiteApp:
    """The ASGI application: the page and the model files (GET and HEAD only), and, when an
    API application is attached (`candle-web serve --api`), everything under /v1 goes to it.
    Every response, errors included, carries the isolation headers; a foreign Host gets 421."""

    def __init__(self, site: SiteConfig, api=None):
        self.site, self.api = site, api
        self.headers = encode_headers({**ISOLATION_HEADERS, **site.extra_headers})
        self.drain = Drain(site.drain_timeout_s)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":  # lifespan is off; websockets are not served
            return
        own_headers, drain = self.headers, self.drain

        async def send_with_headers(message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", [])) + own_headers
                # Draining: a client's next request would be refused, so it reconnects anew.
                if drain.draining and not any(name.lower() == b"connection"
                                              for name, _ in headers):
                    headers.append((b"connection", b"close"))
                message = dict(message, headers=headers)
            await send(message)

        method = scope["method"]
        send_body = method != "HEAD"
        bound = (scope.get("server") or (DEFAULT_HOST, 0))[0]
        url_path = (scope.get("raw_path") or scope["path"].encode("utf-8")).decode("latin-1")
        to_api = self.api is not None and (url_path == API_PREFIX
                                           or url_path.startswith(API_PREFIX + "/"))
        if not host_allowed(request_headers(scope).get("host"), bound, self.site.allowed_hosts):
            if to_api:  # API clients get OpenAI's error shape for this refusal too
                await respond(send_with_headers, HTTPStatus.MISDIRECTED_REQUEST,
                              [("Content-Type", "application/json"), ("Connection", "close")],
                              MISDIRECTED_JSON, send_body)
            else:
                await refuse(send_with_headers, HTTPStatus.MISDIRECTED_REQUEST, send_body,
                             headers=[("Connection", "close")])
            return
        if drain.draining:
            await refuse_while_draining(send_with_headers, to_api, send_body)
            return
        drain.in_flight += 1
        try:
            await self._dispatch(scope, receive, send_with_headers, url_path, to_api, send_body)
        finally:
            drain.in_flight -= 1

    async def _dispatch(self, scope, receive, send_with_headers, url_path: str, to_api: bool,
                        send_body: bool) -> None:
        method = scope["method"]
        if to_api:
            await self.api(scope, receive, send_with_headers)
            return
        if method not in ("GET", "HEAD"):
            await respond(send_with_headers, HTTPStatus.METHOD_NOT_ALLOWED,
                          {"Allow": "GET, HEAD", "Content-Length": "0"})
            return
        if self.site.verbose:  # ascii(): a path cannot write control characters to a terminal
            print(f"{method} {ascii(url_path)[1:-1]}", file=sys.stderr, flush=True)
        await serve_file(self.site, scope, send_with_headers, url_path, send_body)
