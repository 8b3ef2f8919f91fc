"""The OpenAI REST routes under /v1, as a Starlette application (see candle_web.api)."""

from __future__ import annotations

import asyncio
import base64
import functools
import hmac
import json
import time
import uuid
from dataclasses import dataclass, field

import numpy as np

from ..core.errors import (Cancelled, CandleError, FormatError, InvalidOption, ModelNotFound,
                           UnsupportedError)
from . import embedding_fields, sampling_fields, tool_fields
from . import validation as check
from .audio_routes import AudioRoutes
from .errors import AUTHENTICATION, NOT_FOUND, ApiError, bad_request, internal_error
from .http_io import (ApiLimits, candle_error, client_closed, error_response, event_bridge,
                      json_response, next_event, read_json, run_on_worker)
from .model_pool import BERT_KIND, TEXT_KIND, ModelPool
from .scheduler import TextRequest

API_KEY_ENV_VAR = "CANDLE_WEB_API_KEY"


def _created() -> int:
    return int(time.time())


def _cancel(jobs) -> None:
    """Frees the slots of a request's choices (those finished already ignore it)."""
    for job in jobs:
        job.cancelled = True


@dataclass
class _Choice:
    """One choice of a text request, as its events arrive."""

    pieces: list = field(default_factory=list)
    logprobs: list = field(default_factory=list)
    done: dict = None  # the "done" payload

    def add(self, payload: dict) -> None:
        self.pieces.append(payload["text"])
        if "logprob" in payload:
            self.logprobs.append(payload["logprob"])

    def shaped(self, index: int, chat: bool, tokenizer, top_logprobs, tools=None) -> dict:
        text = "".join(self.pieces)
        finish = FINISH_REASONS.get(self.done["reason"], "stop")
        logprobs = None
        if top_logprobs is not None:
            logprobs = ({"content": [sampling_fields.chat_entry(tokenizer, lp)
                                     for lp in self.logprobs], "refusal": None} if chat
                        else sampling_fields.completion_logprobs(tokenizer, self.logprobs))
        if chat:
            fields, called = tool_fields.message(text, tools)
            return {"index": index, "message": {"role": "assistant", **fields, "refusal": None},
                    "logprobs": logprobs,
                    "finish_reason": called if called and finish == "stop" else finish,
                    "token_ids": self.done["token_ids"]}
        return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish,
                "token_ids": self.done["token_ids"]}


FINISH_REASONS = {"eos": "stop", "stop_string": "stop", "max_tokens": "length",
                  "context_length": "length"}



# -- the application ------------------------------------------------------------------------

class OpenAiApi(AudioRoutes):
    def __init__(self, pool: ModelPool, api_key: str = None, limits: ApiLimits = ApiLimits()):
        self.pool, self.limits = pool, limits
        self._key = api_key.encode("utf-8") if api_key else None

    # -- every route passes here --
    def authorise(self, request) -> None:
        if self._key is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        # compare_digest: the time taken does not depend on how much of the key matched.
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode("utf-8"),
                                                                 self._key):
            raise ApiError(401, "Authorization: a valid 'Bearer <API key>' header is required",
                           type=AUTHENTICATION, code="invalid_api_key",
                           headers={"WWW-Authenticate": "Bearer"})

    def route(self, handler):
        async def endpoint(request):
            try:
                self.authorise(request)
                return await handler(request)
            except ApiError as error:
                return error_response(error)
            except ModelNotFound as error:
                return error_response(ApiError(404, str(error), param="model",
                                               code="model_not_found", type=NOT_FOUND))
            except (InvalidOption, FormatError, UnsupportedError) as error:
                return error_response(candle_error(error))
            except CandleError as error:
                return error_response(candle_error(error))
            except Exception as error:  # noqa: BLE001  (the server keeps serving)
                # Out of memory (507) or a bug (500), as the scheduler's thread answers them.
                return error_response(internal_error(error))
        return endpoint

    async def loaded(self, name, kinds, param: str = "model"):
        served = self.pool.lookup(name, kinds, param)
        if served.loaded is None:
            loop = asyncio.get_running_loop()
            served = await loop.run_in_executor(None, self.pool.load, served.name)
        return served

    # -- GET /v1/models --
    async def list_models(self, request):
        data = [self._model_card(served) for served in self.pool.models.values()]
        data += [{**self._model_card(self.pool.models[target]), "id": alias, "alias_of": target}
                 for alias, target in self.pool.aliases.items()]
        return json_response({"object": "list", "data": data})

    async def get_model(self, request):
        name = request.path_params["model"]
        served = self.pool.models.get(self.pool.aliases.get(name, name))
        if served is None:
            raise ApiError(404, f"model: {name[:80]!r} does not exist here", param="model",
                           code="model_not_found", type=NOT_FOUND)
        return json_response(self._model_card(served))

    @staticmethod
    def _model_card(served) -> dict:
        card = {"id": served.name, "object": "model", "created": 0, "owned_by": "candle-web",
                "kind": served.kind, "loaded": served.loaded is not None}
        if served.scheduler is not None:
            card["slots"] = served.scheduler.load()
            card["context_length"] = served.scheduler.context_length
        return card

    # -- text: shared by chat and completions --
    def _generation(self, body: dict, scheduler, prompt_ids: list, chat: bool):
        """(the sampling fields, one GenerationOptions per choice)."""
        from ..generation import GenerationOptions  # noqa: PLC0415

        context = scheduler.context_length
        sampling = sampling_fields.parse(body, context, len(prompt_ids), chat,
                                         scheduler.parallel)
        if len(prompt_ids) >= context:
            param = "messages" if chat else "prompt"
            raise bad_request(f"{param}: the prompt has {len(prompt_ids)} tokens; the model's "
                              f"context is {context}", param, "context_length_exceeded")
        temperature = check.number(body, "temperature", default=1.0, minimum=0, maximum=2)
        top_p = check.number(body, "top_p", minimum=0, maximum=1, open_minimum=True)
        for penalty in ("presence_penalty", "frequency_penalty"):
            check.number(body, penalty, minimum=-2, maximum=2)
            check.unsupported_unless(body, penalty, (0, 0.0))
        check.unsupported_unless(body, "best_of", (1,))
        check.unsupported_unless(body, "echo", (False,))
        check.unsupported_unless(body, "logit_bias", ({},))
        stops = check.stop_strings(body)
        constraint = check.response_format(body)
        options = [GenerationOptions(max_new_tokens=sampling.max_tokens, temperature=temperature,
                                     top_p=top_p, stop_strings=stops, seed=seed,
                                     add_special_tokens=not chat, constraint=constraint)
                   for seed in sampling.choice_seeds()]
        return sampling, options

    async def _run_text(self, request, body, served, prompt_ids, chat: bool, tools=None):
        sampling, options = self._generation(body, served.scheduler, prompt_ids, chat)
        options = tool_fields.with_constraint(options, tools)
        if options[0].constraint is not None:  # compiled here, not on the scheduler thread
            config = served.loaded.model.config
            await asyncio.get_running_loop().run_in_executor(
                None, check.compile_constraint, served.loaded.tokenizer, options[0].constraint,
                config.vocab_size, config.eos_token_ids)
        stream = check.boolean(body, "stream")
        stream_options = body.get("stream_options")
        if stream_options is not None and not isinstance(stream_options, dict):
            raise bad_request("stream_options: expected an object", "stream_options",
                              "invalid_type")
        include_usage = bool(stream and stream_options and check.boolean(
            stream_options, "include_usage"))
        loop = asyncio.get_running_loop()
        queue, emit = event_bridge(loop)
        # One request per choice, each its own row of the batch with its own seed.
        jobs = [TextRequest(prompt_ids, choice_options, functools.partial(emit, index=index),
                            budget=sampling.budget, top_logprobs=sampling.top_logprobs)
                for index, choice_options in enumerate(options)]
        sampling_fields.check_free_slots(served.scheduler, sampling.n)
        try:
            for job in jobs:
                served.scheduler.submit(job)  # 429 when full: before any byte is sent
        except ApiError:
            _cancel(jobs)
            raise
        ident = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        created = _created()
        headers = {sampling_fields.SEED_HEADER: str(sampling.seed)}
        tokenizer = served.loaded.tokenizer
        if stream:
            return self._stream_text(request, queue, jobs, served.name, ident, created, chat,
                                     include_usage, tokenizer, headers, tools)
        choices = [_Choice() for _ in jobs]
        try:
            while not all(choice.done for choice in choices):
                event = await next_event(queue, request)
                if event is None:
                    _cancel(jobs)
                    raise client_closed()
                kind, payload, index = event
                if kind == "token":
                    choices[index].add(payload)
                elif kind == "error":
                    _cancel(jobs)
                    raise payload
                elif kind == "done":
                    choices[index].done = payload
        except asyncio.CancelledError:
            _cancel(jobs)
            raise
        first = choices[0].done
        completion = sum(len(choice.done["token_ids"]) for choice in choices)
        usage = {"prompt_tokens": len(prompt_ids), "completion_tokens": completion,
                 "total_tokens": len(prompt_ids) + completion,
                 "prompt_tokens_details": {"cached_tokens": first.get("cached_tokens", 0)}}
        return json_response({"id": ident, "object": "chat.completion" if chat
                               else "text_completion", "created": created,
                               "model": served.name, "system_fingerprint": None,
                               "choices": [choice.shaped(index, chat, tokenizer,
                                                         sampling.top_logprobs, tools)
                                           for index, choice in enumerate(choices)],
                               "usage": usage,
                               # candle-web's own: the generated ids (equal to the CLI's) and
                               # the seed (sent back as `seed`, the same answer)
                               "token_ids": first["token_ids"], "seed": sampling.seed},
                              headers=headers)

    def _stream_text(self, request, queue, jobs, model, ident, created, chat, include_usage,
                     tokenizer, headers, tools=None):
        from starlette.responses import StreamingResponse  # noqa: PLC0415

        obj = "chat.completion.chunk" if chat else "text_completion"

        def chunk(choices, usage=None) -> bytes:
            payload = {"id": ident, "object": obj, "created": created, "model": model,
                       "system_fingerprint": None, "choices": choices}
            if include_usage:
                payload["usage"] = usage
            return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n".encode("utf-8")

        def piece(index: int, text: str = None, finish: str = None, role: bool = False,
                  logprobs: dict = None, delta: dict = None) -> dict:
            if chat and delta is not None:  # a tool call's piece (tool_fields.stream_reader)
                return {"index": index, "delta": delta, "logprobs": logprobs,
                        "finish_reason": finish}
            if chat:
                delta = {}
                if role:
                    delta = {"role": "assistant", "content": ""}
                elif text is not None:
                    delta = {"content": text}
                return {"index": index, "delta": delta, "logprobs": logprobs,
                        "finish_reason": finish}
            return {"index": index, "text": text or "", "logprobs": logprobs,
                    "finish_reason": finish}

        async def events():
            finished, offsets, completion = {}, [0] * len(jobs), 0
            readers = [tool_fields.stream_reader(tools) for _ in jobs]
            try:
                if chat:
                    for index in range(len(jobs)):
                        yield chunk([piece(index, role=True)])
                while len(finished) < len(jobs):
                    event = await next_event(queue, request)
                    if event is None:
                        return
                    kind, payload, index = event
                    if kind == "token" and (payload["text"] or "logprob" in payload):
                        logprobs = None
                        if "logprob" in payload:
                            logprobs = ({"content": [sampling_fields.chat_entry(
                                tokenizer, payload["logprob"])], "refusal": None} if chat
                                else sampling_fields.completion_logprobs(
                                    tokenizer, [payload["logprob"]], offsets[index]))
                        offsets[index] += len(payload["text"])
                        if readers[index] is None:
                            yield chunk([piece(index, payload["text"], logprobs=logprobs)])
                            continue
                        # Text, or a tool call's pieces once the model writes one.
                        deltas = readers[index].feed(payload["text"]) or (
                            [{}] if logprobs else [])
                        for number, delta in enumerate(deltas):
                            yield chunk([piece(index, delta=delta,
                                               logprobs=None if number else logprobs)])
                    elif kind == "error":
                        error = internal_error(payload)
                        yield f"data: {error.body().decode('utf-8')}\n\n".encode("utf-8")
                        break
                    elif kind == "done":
                        finished[index] = payload
                        completion += len(payload["token_ids"])
                        finish = FINISH_REASONS.get(payload["reason"], "stop")
                        if readers[index] is not None:
                            for delta in readers[index].finish():
                                yield chunk([piece(index, delta=delta)])
                            if readers[index].calls and finish == "stop":
                                finish = "tool_calls"
                        yield chunk([piece(index, finish=finish)])
                if include_usage and len(finished) == len(jobs):
                    first = finished[0]
                    yield chunk([], {"prompt_tokens": first["prompt_tokens"],
                                     "completion_tokens": completion,
                                     "total_tokens": first["prompt_tokens"] + completion,
                                     "prompt_tokens_details": {
                                         "cached_tokens": first.get("cached_tokens", 0)}})
                yield b"data: [DONE]\n\n"
            finally:
                # A client that went away (the response task is cancelled) frees its slots.
                _cancel(jobs)

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", **headers})

    # -- POST /v1/chat/completions --
    async def chat_completions(self, request):
        body = await read_json(request, self.limits)
        served = await self.loaded(check.string(body, "model", required=True), (TEXT_KIND,))
        messages = check.messages(body)
        for index, message in enumerate(messages):
            if len(message["content"] or "") > self.limits.max_input_chars:
                raise bad_request(f"messages[{index}].content: longer than "
                                  f"{self.limits.max_input_chars} characters",
                                  f"messages[{index}].content", "string_above_max_length")
        template = served.chat_template
        if isinstance(template, Exception):
            raise bad_request(f"model: {served.name} has no usable chat template ({template}); "
                              "use /v1/completions", "model", "model_not_supported")
        tokenizer = served.loaded.tokenizer
        tools = tool_fields.parse(body, messages, template, served.name)

        def encode() -> list:
            prompt = tool_fields.render(template, messages, tools)
            return list(tokenizer.encode(prompt, add_special_tokens=False).ids)

        # In a thread: a long prompt must not stall the event loop (and every other stream).
        prompt_ids = await asyncio.get_running_loop().run_in_executor(None, encode)
        return await self._run_text(request, body, served, prompt_ids, chat=True, tools=tools)

    # -- POST /v1/completions --
    async def completions(self, request):
        body = await read_json(request, self.limits)
        served = await self.loaded(check.string(body, "model", required=True), (TEXT_KIND,))
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]
        vocab = served.loaded.model.config.vocab_size
        if isinstance(prompt, str):
            if len(prompt) > self.limits.max_input_chars:
                raise bad_request(f"prompt: longer than {self.limits.max_input_chars} characters",
                                  "prompt", "string_above_max_length")
            tokenizer = served.loaded.tokenizer
            ids = await asyncio.get_running_loop().run_in_executor(
                None, lambda: list(tokenizer.encode(prompt, add_special_tokens=True).ids))
        elif isinstance(prompt, list) and prompt and all(
                isinstance(i, int) and not isinstance(i, bool) for i in prompt):
            if any(not 0 <= i < vocab for i in prompt):
                raise bad_request(f"prompt: token ids must be in 0..{vocab - 1}", "prompt")
            ids = list(prompt)
        elif prompt is None:
            raise bad_request("prompt: a required field is missing", "prompt", "missing_required")
        else:
            raise bad_request("prompt: expected a string, one string in an array, or an array "
                              f"of token ids, got {check.json_type_name(prompt)}", "prompt",
                              "invalid_type")
        check.unsupported_unless(body, "suffix", ("",))
        if not ids:
            raise bad_request("prompt: it encodes to no tokens", "prompt")
        return await self._run_text(request, body, served, ids, chat=False)

    # -- POST /v1/embeddings --
    async def embeddings(self, request):
        body = await read_json(request, self.limits)
        served = await self.loaded(check.string(body, "model", required=True), (BERT_KIND,))
        embedder = served.embedder
        items = embedding_fields.inputs(body, self.limits.max_embedding_inputs,
                                        self.limits.max_input_chars,
                                        served.loaded.model.config.vocab_size)
        encoding = check.string(body, "encoding_format", default="float",
                                choices=("float", "base64"))
        embedding_fields.check_dimensions(body, served.name,
                                          served.loaded.model.config.hidden_size)
        truncate = check.boolean(body, "truncate")

        def run(should_continue):
            # Tokenized here, in the worker: a long input must not stall the event loop.
            tokenized = embedding_fields.tokenized(embedder, items, truncate)
            with self.pool.compute:
                if not should_continue():  # its client left while it waited
                    raise Cancelled("embeddings: the client went away")
                return embedder.embed_tokenized(tokenized)

        result = await run_on_worker(served.worker, request, run)
        data = []
        for index, vector in enumerate(result.vectors):
            vector = np.asarray(vector, dtype="<f4")
            value = (base64.b64encode(vector.tobytes()).decode("ascii") if encoding == "base64"
                     else [float(x) for x in vector])
            data.append({"object": "embedding", "index": index, "embedding": value})
        tokens = int(sum(result.token_counts))
        return json_response({"object": "list", "data": data, "model": served.name,
                               "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})

    async def not_found(self, request):
        raise ApiError(404, f"{request.method} {request.url.path}: no such API route",
                       type=NOT_FOUND, code="unknown_url")


def build_app(pool: ModelPool, api_key: str = None, limits: ApiLimits = ApiLimits()):
    """The Starlette application serving /v1 (mounted by candle_web.serve on the page's
    port)."""
    from starlette.applications import Starlette  # noqa: PLC0415
    from starlette.routing import Route  # noqa: PLC0415

    api = OpenAiApi(pool, api_key, limits)
    r = api.route
    routes = [
        Route("/v1/models", r(api.list_models), methods=["GET"]),
        Route("/v1/models/{model:path}", r(api.get_model), methods=["GET"]),
        Route("/v1/chat/completions", r(api.chat_completions), methods=["POST"]),
        Route("/v1/completions", r(api.completions), methods=["POST"]),
        Route("/v1/embeddings", r(api.embeddings), methods=["POST"]),
        Route("/v1/audio/transcriptions", r(api.transcriptions), methods=["POST"]),
        Route("/v1/audio/translations", r(api.translations), methods=["POST"]),
        Route("/v1/{rest:path}", r(api.not_found),
              methods=["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD"]),
        Route("/v1", r(api.not_found), methods=["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD"]),
    ]
    app = Starlette(routes=routes)
    app.state.api = api
    return app
