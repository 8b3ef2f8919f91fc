"""`candle-web serve --api`: candle-web's models behind the OpenAI REST API, on the page's port.

    GET  /v1/models                  the registry's servable models (and local --model paths),
                                     with "loaded" and, for text models, their slots
    POST /v1/chat/completions        messages through the model's chat template; stream (SSE,
                                     ending `data: [DONE]`), max_tokens / max_completion_tokens,
                                     temperature, top_p, seed, stop, usage, finish_reason
    POST /v1/completions             a prompt (text or token ids), the same options
    POST /v1/embeddings              BERT sentence vectors; encoding_format float | base64
    POST /v1/audio/transcriptions    Whisper; multipart file, model, language, prompt,
    POST /v1/audio/translations      temperature, response_format json | text | srt | vtt |
                                     verbose_json

Answers come from the package's own pipelines (pipelines.load_*, generation, the Whisper
decoder, pipelines.subtitles), so they equal the CLI's for the same inputs: greedy ids,
transcripts, vectors. Every refusal is OpenAI's error JSON with a 4xx status naming the field
(errors.py, validation.py); requests to a text model share its slots (scheduler.py: continuous
batching by turns, a bounded queue answering 429 with Retry-After), Whisper and BERT requests
take turns in their model's serial_worker.py, model_pool.py loads and holds the models, and
fair_lock.py is the lock their computation takes; `api_key` requires `Authorization: Bearer
...` (compared in constant time). Starlette and uvicorn are imported
when the API is built, never by the page.
"""

from .errors import ApiError
from .fair_lock import FairLock
from .model_pool import ModelPool
from .routes import API_KEY_ENV_VAR, ApiLimits, OpenAiApi, build_app
from .scheduler import DEFAULT_PARALLEL, DEFAULT_QUEUE, TextScheduler

__all__ = ["ModelPool", "TextScheduler", "FairLock", "ApiError", "ApiLimits", "OpenAiApi",
           "build_app", "API_KEY_ENV_VAR", "DEFAULT_PARALLEL",
           "DEFAULT_QUEUE"]
