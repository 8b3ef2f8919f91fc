"""The OpenAI error shape: every refusal of the API is JSON

    {"error": {"message": "...", "type": "invalid_request_error", "param": "max_tokens",
               "code": "integer_above_max_value"}}

with a 4xx status (5xx only for the server's own faults), and a message naming the field."""

from __future__ import annotations

import json

INVALID_REQUEST = "invalid_request_error"
AUTHENTICATION = "authentication_error"
NOT_FOUND = "not_found_error"
RATE_LIMIT = "rate_limit_error"
SERVER_ERROR = "server_error"


class ApiError(Exception):
    """A request the API refuses: HTTP status, OpenAI error type, the field (param) and a
    short machine-readable code; `headers` go on the reply (Retry-After, WWW-Authenticate)."""

    def __init__(self, status: int, message: str, *, param: str = None, code: str = None,
                 type: str = INVALID_REQUEST, headers: dict = None):  # noqa: A002 (OpenAI's name)
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = (
            int(status), message, param, code, type)
        self.headers = dict(headers or {})

    def payload(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}

    def body(self) -> bytes:
        return json.dumps(self.payload(), ensure_ascii=False).encode("utf-8")


def bad_request(message: str, param: str = None, code: str = "invalid_value") -> ApiError:
    return ApiError(400, message, param=param, code=code)


# Seconds a client that got 429 is told to wait before trying again.
RETRY_AFTER_S = 1


def rate_limited(what: str) -> ApiError:
    return ApiError(429, f"{what}: every slot is busy and the queue is full; retry in "
                         f"{RETRY_AFTER_S} s", type=RATE_LIMIT, code="rate_limit_exceeded",
                    headers={"Retry-After": str(RETRY_AFTER_S)})


def server_stopping(what: str) -> ApiError:
    return ApiError(503, f"{what}: the server is stopping", type=SERVER_ERROR,
                    code="unavailable")


def internal_error(error: BaseException) -> ApiError:
    """The server's own failure while it ran a request, whichever layer caught it (a route, or
    the text scheduler's thread, whose error reaches the route as an event): out of memory as
    a 507 `out_of_memory` (the request asked for more than the server has free; the same
    request may pass later or with a smaller max_tokens), anything else (a bug) as a 500
    `internal_error`. An ApiError passes as it is."""
    if isinstance(error, ApiError):
        return error
    detail = f": {str(error)[:200]}" if str(error) else ""
    if isinstance(error, MemoryError):
        return ApiError(507, f"out of memory for this request{detail}", type=SERVER_ERROR,
                        code="out_of_memory")
    return ApiError(500, f"internal error: {type(error).__name__}{detail}", type=SERVER_ERROR,
                    code="internal_error")
