"""Shared by the API tests: the models they serve, plain HTTP requests, and the package's own
pipelines run as the CLI runs them (the reference each answer must equal)."""

from __future__ import annotations

import contextlib
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


@contextlib.contextmanager
def api_server(pool, tmp_path_factory, **app_options):
    """`candle-web serve --api` on loopback over `pool` (`app_options`: build_app's api_key,
    limits): yields its URL without the trailing slash, and stops it at the end."""
    from candle_web.api import build_app
    from candle_web.serve import SiteConfig, start_in_thread

    web = tmp_path_factory.mktemp("api-web")
    (web / "index.html").write_text("<!doctype html><title>api test</title>\n")
    server, url = start_in_thread(site=SiteConfig(web_root=web),
                                  api=build_app(pool, **app_options))
    try:
        yield url.rstrip("/")
    finally:
        server.shutdown()
        server.server_close()


def raw_request(url: str, method: str, path: str, body: bytes = b"", headers: dict = None,
                timeout: float = HTTP_TIMEOUT_S):
    """(status, headers, body) of one request over a fresh connection."""
    parsed = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=timeout)
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


class Stream:
    """One streaming chat over http.client: the events as they come, and a way to hang up."""

    def __init__(self, url: str, question: str, max_tokens: int):
        parsed = urllib.parse.urlsplit(url)
        self.connection = http.client.HTTPConnection(parsed.hostname, parsed.port,
                                                     timeout=HTTP_TIMEOUT_S)
        body = json.dumps({"model": LLM, "messages": chat_messages(question),
                           "max_tokens": max_tokens, "temperature": 0, "stream": True,
                           "stream_options": {"include_usage": True}})
        self.connection.request("POST", "/v1/chat/completions", body=body,
                                headers={"Content-Type": "application/json"})
        self.response = self.connection.getresponse()

    def events(self):
        """The `data:` payloads, decoded JSON or the literal [DONE]."""
        buffer = b""
        while line := self.response.readline():
            buffer += line
            if buffer.endswith(b"\n\n"):
                for event in buffer.decode().split("\n\n"):
                    if event.startswith("data: "):
                        data = event[len("data: "):]
                        yield data if data == "[DONE]" else json.loads(data)
                buffer = b""

    def hang_up(self) -> None:
        self.connection.sock.shutdown(2)
        self.connection.close()


def run_stream(url: str, question: str, max_tokens: int, hang_up_after_first: bool = False) -> dict:
    """A greedy streaming chat read to its end (or hung up after the first words): its status,
    text, [DONE] count, finish reasons and usage."""
    stream = Stream(url, question, max_tokens)
    outcome = {"status": stream.response.status, "text": "", "done": 0, "finish": [],
               "usage": None, "hung_up": False}
    if stream.response.status != 200:
        outcome["error"] = stream.response.read()
        return outcome
    for event in stream.events():
        if event == "[DONE]":
            outcome["done"] += 1
            continue
        if event.get("usage"):
            outcome["usage"] = event["usage"]
        for choice in event["choices"]:
            outcome["text"] += choice["delta"].get("content") or ""
            if choice["finish_reason"]:
                outcome["finish"].append(choice["finish_reason"])
        if hang_up_after_first and outcome["text"]:
            stream.hang_up()
            outcome["hung_up"] = True
            return outcome
    stream.connection.close()
    return outcome


def chat_request(url: str, question: str, max_tokens: int, timeout: float = HTTP_TIMEOUT_S):
    """(status, decoded JSON) of one greedy, non-streaming chat."""
    status, _, body = raw_request(url, "POST", "/v1/chat/completions", json.dumps({
        "model": LLM, "messages": chat_messages(question), "max_tokens": max_tokens,
        "temperature": 0}).encode(), {"Content-Type": "application/json"}, timeout=timeout)
    return status, json.loads(body)


def wait_until(timeout_s: float, condition, what: str, poll_s: float = 0.005) -> None:
    """Polls `condition` until it holds; an AssertionError naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting: {what}")
        time.sleep(poll_s)
