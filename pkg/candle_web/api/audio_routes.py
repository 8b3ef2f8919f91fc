"""POST /v1/audio/transcriptions and /v1/audio/translations: Whisper behind the OpenAI audio
routes (a mixin of routes.OpenAiApi, which owns the model pool and the limits)."""

from __future__ import annotations

import asyncio

from ..core.errors import Cancelled, CandleError, InvalidOption, UnsupportedError
from . import audio_fields
from . import validation as check
from .errors import ApiError, bad_request, internal_error
from .http_io import (TEXT_MEDIA, candle_error, event_bridge, json_response, limited_receive,
                      run_on_worker)
from .model_pool import WHISPER_KIND

RESPONSE_FORMATS = ("json", "text", "srt", "vtt", "verbose_json")

def transcribe_options(task: str, language=None, prompt=None, temperature=None,
                       word_timestamps: bool = False):
    """The options `candle-web transcribe FILE` decodes with (its defaults, through
    pipelines.transcribe.options_from_args, as the CLI and `batch transcribe` build them), with
    the request's task, language, prompt, starting temperature (fallback up from it, as
    `--temperature`) and word timestamps (`--word-timestamps`)."""
    from ..pipelines.arguments import transcribe_defaults  # noqa: PLC0415
    from ..pipelines.transcribe import options_from_args  # noqa: PLC0415

    args = transcribe_defaults()
    args.task, args.language, args.initial_prompt = task, language or None, prompt or None
    args.word_timestamps = word_timestamps
    if temperature is not None:
        args.temperature = temperature
    return options_from_args(args)



class AudioRoutes:
    """The audio handlers of OpenAiApi (self.pool, self.limits, self.loaded come from it)."""
    # -- POST /v1/audio/transcriptions and /v1/audio/translations --
    async def transcriptions(self, request):
        return await self._audio(request, "transcribe")

    async def translations(self, request):
        return await self._audio(request, "translate")

    async def _audio(self, request, task: str):
        from starlette.datastructures import UploadFile  # noqa: PLC0415
        from starlette.exceptions import HTTPException  # noqa: PLC0415
        from starlette.requests import Request  # noqa: PLC0415

        limit = self.limits.max_upload_bytes
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise ApiError(413, f"file: the upload ({int(declared)} bytes) is above the limit of "
                                f"{limit}", param="file", code="request_too_large")
        content_type = request.headers.get("content-type", "")
        if not content_type.startswith("multipart/form-data"):
            raise bad_request("the body must be multipart/form-data with a 'file' field", "file",
                              "invalid_content_type")
        limited = Request(request.scope, limited_receive(request.receive, limit, "file"))
        try:
            form = await limited.form(max_files=1, max_fields=32, max_part_size=64 << 10)
        except HTTPException as error:
            raise bad_request(f"the multipart body does not parse: {error.detail}", "file",
                              "invalid_multipart") from None
        try:
            upload = form.get("file")
            if not isinstance(upload, UploadFile):
                raise bad_request("file: a required file field is missing", "file",
                                  "missing_required")
            fields = {}
            for name in ("model", "language", "prompt", "temperature", "response_format",
                         "stream"):
                value = form.get(name)
                if value is not None and not isinstance(value, str):
                    raise bad_request(f"{name}: expected a text field, got a file", name,
                                      "invalid_type")
                fields[name] = value
            granularities = list(form.getlist("timestamp_granularities[]")) + list(
                form.getlist("timestamp_granularities"))
            data = await upload.read()
        finally:
            await form.close()
        served = await self.loaded(check.string(fields, "model", required=True),
                                   (WHISPER_KIND,))
        response_format = check.string(fields, "response_format", default="json",
                                       choices=RESPONSE_FORMATS)
        temperature = None
        if fields["temperature"] is not None:
            try:
                temperature = float(fields["temperature"])
            except ValueError:
                raise bad_request(f"temperature: not a number ({fields['temperature'][:40]!r})",
                                  "temperature", "invalid_type") from None
            temperature = check.number({"temperature": temperature}, "temperature", minimum=0,
                                       maximum=1)
        language = check.string(fields, "language", max_length=16)
        audio_fields.check_language(language, served.name,
                                    served.loaded.model.config.is_multilingual)
        prompt = check.string(fields, "prompt", max_length=self.limits.max_input_chars)
        wanted = audio_fields.granularities(granularities, response_format)
        arguments = (served, data, task, language, prompt, temperature, "word" in wanted)
        if audio_fields.stream_flag(fields["stream"]):
            if response_format not in ("json", "text"):
                raise bad_request(f"stream: the events carry text; response_format "
                                  f"{response_format!r} cannot be streamed", "stream")
            return await self._stream_transcript(request, served, arguments)
        result = await run_on_worker(served.worker, request, self._transcribe, *arguments)
        return self._audio_response(result, response_format, task, wanted)

    async def _stream_transcript(self, request, served, arguments):
        """OpenAI's transcript.text.delta events, one per segment as the worker decodes it,
        then transcript.text.done. A refusal found before the first window (audio that does
        not decode, a bad option) is still a 4xx: the response starts at the first window."""
        from starlette.responses import StreamingResponse  # noqa: PLC0415

        queue, emit = event_bridge(asyncio.get_running_loop())

        def progress(kind, payload) -> None:
            if kind == "segment":
                emit("delta", payload.text)
            elif kind == "window":
                emit("window", None)

        task = asyncio.ensure_future(run_on_worker(served.worker, request, self._transcribe,
                                                   *arguments, progress))

        async def next_event():
            """The next (kind, payload, index) of the worker; None once it has finished."""
            while queue.empty() and not task.done():
                getter = asyncio.ensure_future(queue.get())
                await asyncio.wait({getter, task}, return_when=asyncio.FIRST_COMPLETED)
                if getter.done():
                    return getter.result()
                getter.cancel()
            return queue.get_nowait() if not queue.empty() else None

        try:
            first = await next_event()
            if first is None:
                task.result()  # its refusal, as a 4xx
        except BaseException:
            task.cancel()
            raise

        async def events():
            try:
                event = first
                while event is not None:
                    kind, payload, _ = event
                    if kind == "delta" and payload:
                        yield audio_fields.delta_event(payload)
                    event = await next_event()
                try:
                    result = task.result()
                except Exception as error:  # noqa: BLE001  (the stream has started: an event)
                    yield audio_fields.sse(internal_error(error).payload())
                    return
                yield audio_fields.done_event(result.text)
            finally:
                if not task.done():  # the client went away: the worker stops at its next step
                    task.cancel()

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})

    def _transcribe(self, should_continue, served, data: bytes, task, language, prompt,
                    temperature, word_timestamps=False, progress=None):
        """In the model's worker thread: decode the upload, then transcribe with the CLI's
        options (temperature fallback unless a temperature above 0 is given). It stops
        (Cancelled) at the first window, segment or decoded token after its client went away
        (`should_continue`); `progress(kind, payload)` sees each of them."""
        from ..io.audio import AudioTooLong, load_audio  # noqa: PLC0415
        from ..pipelines.transcribe import transcribe  # noqa: PLC0415

        try:
            samples = load_audio(data, max_seconds=self.limits.max_audio_seconds)
        except AudioTooLong as error:
            raise bad_request(f"file: the audio lasts {error.lasts}, above this server's limit of "
                              f"{error.max_seconds:g} s (--max-audio-seconds)", "file",
                              "audio_too_long") from None
        except (CandleError, OSError, ValueError) as error:
            raise bad_request(f"file: not audio this server can decode ({str(error)[:200]})",
                              "file", "invalid_audio") from None
        try:
            options = transcribe_options(task, language, prompt, temperature, word_timestamps)
        except CandleError as error:
            raise candle_error(error) from None
        compute = self.pool.compute

        def on_event(kind, payload):
            if not should_continue():
                raise Cancelled(f"transcription: the client went away (at a {kind})")
            if progress is not None:
                progress(kind, payload)
            compute.yield_turn()  # text slots step between windows, segments and tokens

        with compute:
            try:
                return transcribe(served.loaded.model, served.loaded.tokenizer, samples, options,
                                  on_event=on_event, should_continue=should_continue)
            except (InvalidOption, UnsupportedError) as error:
                param = "language" if language and "language" in str(error).lower() else None
                raise candle_error(error, param) from None

    @staticmethod
    def _audio_response(result, response_format: str, task: str, wanted: tuple = ("segment",)):
        from starlette.responses import Response  # noqa: PLC0415

        from ..pipelines import subtitles  # noqa: PLC0415

        if response_format == "json":
            return json_response({"text": result.text})
        if response_format == "verbose_json":
            return json_response(audio_fields.verbose_json(result, task, wanted))
        fmt = {"text": "txt", "srt": "srt", "vtt": "vtt"}[response_format]
        media = "text/vtt; charset=utf-8" if fmt == "vtt" else TEXT_MEDIA
        return Response(subtitles.render(result, fmt), media_type=media)
