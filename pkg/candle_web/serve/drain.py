"""Stopping `candle-web serve` on SIGTERM without cutting anyone off: the server drains.

Requests already running (a transcription, a streamed chat, a model download) finish; every new
request gets 503 with `Retry-After` and `Connection: close` (OpenAI's error JSON under /v1); the
listening socket stays open meanwhile, so a client is told why instead of finding nothing there.
Once no request is left, or after the drain timeout (`--drain-seconds`; what still runs is then
cancelled), uvicorn's own shutdown runs and the process exits with status 0: a drain is the
stop that was asked for, not a failure. A second SIGTERM ends the wait at once; Ctrl-C (SIGINT)
stops as before.

The hook is a subclass of uvicorn's Server built on first use (uvicorn is a native-only
dependency, never imported by the page): its signal handler starts the drain instead of the
immediate stop, and its once-every-0.1-s tick ends the main loop when the drain is over.
"""
from __future__ import annotations

import functools
import signal
import sys
import time
from http import HTTPStatus
from typing import Optional

from .replies import refuse, respond

# How long requests in flight get to finish after SIGTERM: under the 30 s that Kubernetes (its
# default grace period) and systemd (TimeoutStopSec) wait before they SIGKILL.
DEFAULT_DRAIN_S = 20.0
DRAINING_JSON = (b'{"error": {"message": "the server is shutting down (SIGTERM): requests in '
                 b'flight finish, new ones are refused; retry on another instance or once it '
                 b'is back", "type": "server_error", "param": null, "code": '
                 b'"server_shutting_down"}}')
DRAINING_HEADERS = (("Retry-After", "1"), ("Connection", "close"))


class Drain:
    """The requests in flight, and whether the server is draining. `begin` may run in a signal
    handler (it only sets fields); everything else runs on the server's event loop."""

    def __init__(self, timeout_s: float = DEFAULT_DRAIN_S):
        self.timeout_s = timeout_s
        self.in_flight = 0
        self.deadline: Optional[float] = None  # time.monotonic(); None until SIGTERM
        self.announced = False
        self.cut = 0  # requests still running when the timeout ended the drain

    @property
    def draining(self) -> bool:
        return self.deadline is not None

    def begin(self) -> None:
        now = time.monotonic()
        # A second SIGTERM: the sender means it, stop waiting.
        self.deadline = now + self.timeout_s if self.deadline is None else now

    def tick(self) -> bool:
        """On each server tick: whether a drain has ended (no request left, or the timeout),
        printing what it does as it starts and ends."""
        if not self.draining:
            return False
        if not self.announced:
            self.announced = True
            print(f"candle-web: SIGTERM: draining {self.in_flight} request(s) in flight for at "
                  f"most {self.timeout_s:g} s; new requests get 503", flush=True)
        if self.in_flight == 0:
            print("candle-web: drained: no request in flight", flush=True)
            return True
        if time.monotonic() >= self.deadline:
            self.cut = self.in_flight
            print(f"candle-web: drain timeout ({self.timeout_s:g} s): cutting {self.cut} "
                  "request(s) still in flight", file=sys.stderr, flush=True)
            return True
        return False


async def refuse_while_draining(send, to_api: bool, send_body: bool) -> None:
    """503 for a request that arrives while the server drains (JSON under /v1)."""
    if to_api:
        await respond(send, HTTPStatus.SERVICE_UNAVAILABLE,
                      [("Content-Type", "application/json"), *DRAINING_HEADERS], DRAINING_JSON,
                      send_body)
    else:
        await refuse(send, HTTPStatus.SERVICE_UNAVAILABLE, send_body, headers=DRAINING_HEADERS)


@functools.lru_cache(maxsize=None)
def draining_server_class():
    """uvicorn's Server, with SIGTERM starting a drain (see the module's docstring)."""
    import uvicorn  # noqa: PLC0415

    class DrainingServer(uvicorn.Server):
        drain: Drain

        def handle_exit(self, sig, frame) -> None:
            if sig == signal.SIGTERM and not self.should_exit:
                # Not recorded in uvicorn's captured signals: it would raise SIGTERM again
                # after the shutdown, and the process would end killed (143), not with 0.
                self.drain.begin()
                return
            super().handle_exit(sig, frame)

        async def on_tick(self, counter: int) -> bool:
            if self.drain.tick():
                if self.drain.cut:
                    # They had the drain's time already: cancel them now, not
                    # GRACEFUL_SHUTDOWN_S later.
                    self.config.timeout_graceful_shutdown = 0
                return True
            return await super().on_tick(counter)

    return DrainingServer
