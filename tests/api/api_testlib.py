"""Shared by the API tests: the models they serve, plain HTTP requests, and the package's own
pipelines run as the CLI runs them (the reference each answer must equal)."""

from __future__ import annotations

import http.client
import json
import time
import urllib.parse

from candle_web import hub

LLM, WHISPER, BERT = "smollm2-135m-instruct", "whisper-tiny.en", "all-minilm-l6-v2"
SPEECH = hub.cache_dir() / "testdata" / "speech"
CLIP = SPEECH / "librivox" / "sense_and_sensibility_01_austen_64kb-0880.wav"  # 3 s
CLIP_B = SPEECH / "librivox" / "sense_and_sensibility_01_austen_64kb-0930.wav"  # 3.3 s
HTTP_TIMEOUT_S = 120
API_KEY = "test-key-0123456789"
SYSTEM = "You are a concise assistant."
QUESTION = "What is the capital of France?"
MAX_TOKENS = 24


def chat_messages(question: str = QUESTION) -> list:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]


def reference_generate(pool, llama, prompt: str, chat: bool, **options):
    """What `candle-web generate [--chat]` computes (cli.cmd_generate), under the server's
    compute lock so the two never run kernels at once."""
    from candle_web.generation import GenerationOptions, generate

    loaded, _ = llama
    options = GenerationOptions(add_special_tokens=not chat, **options)
    with pool.compute:
        return generate(loaded.model, loaded.tokenizer, prompt, options)


def reference_chat(pool, llama, question: str = QUESTION, **options):
    _, template = llama
    return reference_generate(pool, llama, template.render(chat_messages(question)), chat=True,
                              **{"max_new_tokens": MAX_TOKENS, **options})


def reference_transcript(pool, whisper, path, task: str = "transcribe"):
    """What `candle-web transcribe FILE [--task translate]` computes (cli.cmd_transcribe: its
    parser's defaults through options_from_args)."""
    from candle_web.cli import build_parser
    from candle_web.io.audio import load_audio
    from candle_web.pipelines.transcribe import transcribe
    from candle_web.pipelines.transcribe import options_from_args

    options = options_from_args(build_parser().parse_args(["transcribe", str(path), "--task",
                                                           task]))
    with pool.compute:
        return transcribe(whisper.model, whisper.tokenizer, load_audio(str(path)), options)


def raw_request(url: str, method: str, path: str, body: bytes = b"", headers: dict = None):
    """(status, headers, body) of one request over a fresh connection."""
    parsed = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(parsed.hostname, parsed.port,
                                            timeout=HTTP_TIMEOUT_S)
    try:
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        headers = {name.lower(): value for name, value in response.getheaders()}
        return response.status, headers, response.read()
    finally:
        connection.close()


def post_json(url: str, path: str, payload, headers: dict = None):
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    return raw_request(url, "POST", path, body,
                       {"Content-Type": "application/json", **(headers or {})})


def multipart_body(fields: dict, file_name: str, data: bytes) -> tuple[bytes, str]:
    boundary = "candle-web-test-boundary"
    parts = []
    for name, value in fields.items():
        parts.append(f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n'
                     f"{value}\r\n".encode())
    parts.append(f'--{boundary}\r\nContent-Disposition: form-data; name="file"; '
                 f'filename="{file_name}"\r\nContent-Type: application/octet-stream\r\n\r\n'
                 .encode() + data + b"\r\n")
    parts.append(f"--{boundary}--\r\n".encode())
    return b"".join(parts), f"multipart/form-data; boundary={boundary}"


def wait_until(timeout_s: float, condition, what: str, poll_s: float = 0.005) -> None:
    """Polls `condition` until it holds; an AssertionError naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting: {what}")
        time.sleep(poll_s)
