"""The HTTP side of the API's handlers: request limits and bounded JSON bodies, OpenAI-shaped
error responses, the queue that carries scheduler events to a handler, and running a job on a
model's SerialWorker while watching that the client is still there."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass

from . import validation as check
from .errors import ApiError, bad_request

# How often a request waiting for its answer checks that its client is still there.
DISCONNECT_POLL_S = 0.5
TEXT_MEDIA = "text/plain; charset=utf-8"


@dataclass(frozen=True)
class ApiLimits:
    max_body_bytes: int = 4 << 20  # a JSON request
    max_upload_bytes: int = 25 << 20  # an audio upload (OpenAI's limit)
    max_embedding_inputs: int = 256
    max_input_chars: int = 1 << 20  # one prompt, message content or embedding input
    # The longest audio a transcription decodes (`--max-audio-seconds`): 25 MiB of 32 kbps
    # audio is 1.8 h, and decoding is bounded by this, not by the upload.
    max_audio_seconds: float = 30 * 60


# -- plumbing -------------------------------------------------------------------------------

def json_response(payload, status: int = 200, headers: dict = None):
    from starlette.responses import Response  # noqa: PLC0415

    return Response(json.dumps(payload, ensure_ascii=False), status_code=status,
                    media_type="application/json", headers=headers)


def error_response(error: ApiError):
    headers = dict(error.headers)
    if error.status == 413 or error.code == "request_timeout":
        headers["Connection"] = "close"  # the rest of the body is not read
    return json_response(error.payload(), error.status, headers)


def candle_error(error: Exception, param: str = None) -> ApiError:
    """A model-side refusal (bad option value, bad audio...) as a 400 naming the field."""
    message = str(error) or type(error).__name__
    return bad_request(f"{param}: {message}" if param and not message.startswith(param)
                       else message, param, "invalid_value")


async def _read_limited(request, limit: int, what: str) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise bad_request("Content-Length: not a number", None, "invalid_header")
        if int(declared) > limit:
            raise ApiError(413, f"{what}: {int(declared)} bytes is above the limit of {limit}",
                           code="request_too_large")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise ApiError(413, f"{what}: more than {limit} bytes", code="request_too_large")
    return bytes(body)


def limited_receive(receive, limit: int, what: str):
    seen = 0

    async def limited():
        nonlocal seen
        message = await receive()
        if message["type"] == "http.request":
            seen += len(message.get("body", b""))
            if seen > limit:
                raise ApiError(413, f"{what}: more than {limit} bytes", code="request_too_large")
        return message

    return limited


async def read_json(request, limits: ApiLimits) -> dict:
    body = await _read_limited(request, limits.max_body_bytes, "the request body")
    try:
        return check.require_object(json.loads(body.decode("utf-8")))
    except UnicodeDecodeError:
        raise bad_request("the request body is not UTF-8", None, "invalid_json") from None
    except (ValueError, RecursionError) as error:
        raise bad_request(f"the request body is not valid JSON: {str(error)[:120]}", None,
                          "invalid_json") from None



def event_bridge(loop):
    """A queue the scheduler thread fills through loop.call_soon_threadsafe; each event is
    (kind, payload, index): `index` tells the choices of one request (n > 1) apart."""
    queue: asyncio.Queue = asyncio.Queue()

    def emit(kind, payload, index: int = 0) -> None:
        try:
            loop.call_soon_threadsafe(queue.put_nowait, (kind, payload, index))
        except RuntimeError:  # the loop is closed: the server stopped
            pass

    return queue, emit


async def next_event(queue, request):
    """The next scheduler event; None when the client disconnected while waiting."""
    while True:
        try:
            return await asyncio.wait_for(queue.get(), DISCONNECT_POLL_S)
        except asyncio.TimeoutError:
            if await request.is_disconnected():
                return None




def client_closed() -> ApiError:
    return ApiError(499, "the client closed the request", code="client_closed")


async def run_on_worker(worker, request, function, *args):
    """`function(should_continue, *args)` on the model's SerialWorker (429 when its queue is
    full); the job is cancelled when the client goes away (checked as next_event does) or
    this handler is cancelled, so no work runs on for nobody."""
    job = worker.submit(function, *args)
    future = asyncio.wrap_future(job.future)
    try:
        while True:
            done, _ = await asyncio.wait({future}, timeout=DISCONNECT_POLL_S)
            if done:
                return future.result()
            if await request.is_disconnected():
                raise client_closed()
    finally:
        if not future.done():
            job.cancel()
            future.add_done_callback(_ignore_outcome)


def _ignore_outcome(future) -> None:
    """Retrieves the end of a job nobody waits for any more (its Cancelled), so asyncio does
    not log it as never retrieved."""
    if not future.cancelled():
        future.exception()
