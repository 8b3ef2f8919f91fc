"""`candle-web serve --api`: the OpenAI-compatible API driven by the official `openai` client,
on real models (SmolLM2-135M-Instruct Q4_1, whisper-tiny.en, all-MiniLM-L6-v2), answers equal
to the package's own pipelines (what the CLI runs), and every bad field refused with OpenAI's
error JSON while the server keeps serving. Traffic stays on 127.0.0.1; each server stops at the
end of its fixture."""

from __future__ import annotations

import base64
import json
import socket
import time
import urllib.parse

import numpy as np
import pytest

openai = pytest.importorskip("openai", reason="the dev extra installs the openai client")
pytest.importorskip("starlette", reason="the serve extra installs starlette")

from candle_web import hub  # noqa: E402
from candle_web.serve import ISOLATION_HEADERS, SiteConfig, start_in_thread  # noqa: E402
from tests.api.api_testlib import (API_KEY, BERT, CLIP, CLIP_B, HTTP_TIMEOUT_S, LLM,  # noqa: E402
                                   MAX_TOKENS, WHISPER, chat_messages, multipart_body, post_json,
                                   raw_request, reference_chat, reference_generate,
                                   reference_transcript)

# Small limits for the refusal tests (a second app on the same models).
SMALL_BODY, SMALL_UPLOAD, SHORT_IDLE_S = 64 << 10, 256 << 10, 1.0


@pytest.fixture(scope="module")
def pool():
    from candle_web.api import ModelPool

    if not CLIP.is_file():
        pytest.fail("test speech is missing: run `make test` (scripts/fetch_test_audio.sh)",
                    pytrace=False)
    pool = ModelPool(parallel=4, queue_size=16)
    for name in (LLM, WHISPER, BERT):
        pool.add(name)
    yield pool
    pool.close()


def _start(tmp_path_factory, app, **site_options):
    web = tmp_path_factory.mktemp("api-web")
    (web / "index.html").write_text("<!doctype html><title>api test</title>\n")
    server, url = start_in_thread(site=SiteConfig(web_root=web, **site_options), api=app)
    return server, url


@pytest.fixture(scope="module")
def server_url(pool, tmp_path_factory):
    from candle_web.api import build_app

    server, url = _start(tmp_path_factory, build_app(pool))
    yield url.rstrip("/")
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def small_url(pool, tmp_path_factory):
    """The same models behind small body/upload limits, a short idle limit and an API key."""
    from candle_web.api import ApiLimits, build_app

    limits = ApiLimits(max_body_bytes=SMALL_BODY, max_upload_bytes=SMALL_UPLOAD)
    server, url = _start(tmp_path_factory, build_app(pool, api_key=API_KEY, limits=limits),
                         idle_timeout_s=SHORT_IDLE_S)
    yield url.rstrip("/")
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def client(server_url):
    return openai.OpenAI(base_url=server_url + "/v1", api_key="unused", max_retries=0,
                         timeout=HTTP_TIMEOUT_S)


# The references (the pipelines the CLI runs, on models loaded independently): the `llama` and
# `whisper` fixtures of tests/api/conftest.py and api_testlib's reference_* functions.


def assert_error_shape(status: int, body: bytes, param, expected_status: int = 400) -> dict:
    assert status == expected_status, body[:500]
    error = json.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert isinstance(error["message"], str) and error["message"]
    if param is not None:
        assert error["param"] == param, error
        assert param.split("[")[0].split(".")[0] in error["message"], error
    return error


def assert_still_serving(url: str, headers: dict = None) -> None:
    status, _, body = raw_request(url, "GET", "/v1/models", headers=headers)
    assert status == 200, body[:300]


# -- models -------------------------------------------------------------------------------

def test_models_lists_the_registry_and_what_is_loaded(client):
    cards = {model.id: model for model in client.models.list().data}
    assert {LLM, WHISPER, BERT} <= set(cards)
    served_kinds = {m.name for m in hub.list_models() if m.kind in ("llama", "whisper", "bert")}
    assert set(cards) == served_kinds  # test inputs (Gemma...) and T5 are not offered
    for name in (LLM, WHISPER, BERT):
        assert cards[name].model_extra["loaded"] is True
    assert cards[LLM].model_extra["kind"] == "llama"
    assert client.models.retrieve(BERT).id == BERT


def test_the_page_is_still_served_on_the_same_port(server_url):
    status, headers, body = raw_request(server_url, "GET", "/")
    assert status == 200 and b"api test" in body
    for name, value in ISOLATION_HEADERS.items():
        assert headers.get(name.lower()) == value


# -- chat and completions -----------------------------------------------------------------

def test_chat_greedy_equals_the_cli(client, pool, llama):
    reference = reference_chat(pool, llama, temperature=0.0)
    response = client.chat.completions.create(model=LLM, messages=chat_messages(),
                                              max_tokens=MAX_TOKENS, temperature=0)
    choice = response.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content == reference.text
    assert response.model_extra["token_ids"] == reference.token_ids
    assert "Paris" in reference.text  # the model answers; not a vacuous comparison
    assert choice.finish_reason == ("stop" if reference.stop_reason == "eos" else "length")
    assert response.usage.prompt_tokens == len(reference.prompt_ids)
    assert response.usage.completion_tokens == len(reference.token_ids)
    assert response.usage.total_tokens == len(reference.prompt_ids) + len(reference.token_ids)
    assert response.object == "chat.completion" and response.id.startswith("chatcmpl-")


def test_chat_stream_equals_the_whole_answer_and_ends_with_done(client, server_url, pool, llama):
    reference = reference_chat(pool, llama, temperature=0.0)
    stream = client.chat.completions.create(model=LLM, messages=chat_messages(),
                                            max_tokens=MAX_TOKENS, temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    pieces, finish, usage, roles = [], None, None, []
    for chunk in stream:
        assert chunk.object == "chat.completion.chunk"
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            roles += [choice.delta.role] if choice.delta.role else []
            pieces.append(choice.delta.content or "")
            finish = choice.finish_reason or finish
    assert "".join(pieces) == reference.text
    assert roles == ["assistant"]
    assert finish in ("stop", "length")
    assert usage.completion_tokens == len(reference.token_ids)

    # The wire format itself: server-sent events, the last one `data: [DONE]`.
    status, headers, body = post_json(server_url, "/v1/chat/completions", {
        "model": LLM, "messages": chat_messages(), "max_tokens": 4, "temperature": 0,
        "stream": True})
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    events = [line for line in body.decode().split("\n\n") if line]
    assert all(event.startswith("data: ") for event in events)
    assert events[-1] == "data: [DONE]"
    assert body.endswith(b"data: [DONE]\n\n")


def test_a_repeated_prompt_reports_its_cached_tokens(client):
    """Prompt caching as OpenAI reports it: a request whose prompt the server already holds
    (api/prefixes.py) says how many prompt tokens it did not run, in
    usage.prompt_tokens_details.cached_tokens, streamed or not, and answers the same."""
    messages = [{"role": "user", "content": "Name one colour of the rainbow."}]
    first = client.chat.completions.create(model=LLM, messages=messages, max_tokens=4,
                                           temperature=0)
    again = client.chat.completions.create(model=LLM, messages=messages, max_tokens=4,
                                           temperature=0)
    # all but the last prompt token (whose logits start the answer)
    assert again.usage.prompt_tokens_details.cached_tokens == again.usage.prompt_tokens - 1
    assert again.choices[0].message.content == first.choices[0].message.content
    usage = None
    for chunk in client.chat.completions.create(model=LLM, messages=messages, max_tokens=4,
                                                temperature=0, stream=True,
                                                stream_options={"include_usage": True}):
        usage = chunk.usage or usage
    assert usage.prompt_tokens_details.cached_tokens == usage.prompt_tokens - 1


def test_completions_equal_the_cli_and_stream(client, pool, llama):
    prompt = "The three primary colours are"
    reference = reference_generate(pool, llama, prompt, chat=False, max_new_tokens=16)
    response = client.completions.create(model=LLM, prompt=prompt, max_tokens=16, temperature=0)
    assert response.choices[0].text == reference.text
    assert response.model_extra["token_ids"] == reference.token_ids
    assert response.usage.prompt_tokens == len(reference.prompt_ids)
    streamed = "".join(chunk.choices[0].text for chunk in client.completions.create(
        model=LLM, prompt=prompt, max_tokens=16, temperature=0, stream=True) if chunk.choices)
    assert streamed == reference.text
    # Token ids as the prompt: the same answer.
    by_ids = client.completions.create(model=LLM, prompt=reference.prompt_ids, max_tokens=16,
                                       temperature=0)
    assert by_ids.choices[0].text == reference.text


def test_seeded_sampling_equals_the_cli(client, pool, llama):
    reference = reference_chat(pool, llama, temperature=0.9, top_p=0.95, seed=1234)
    response = client.chat.completions.create(model=LLM, messages=chat_messages(),
                                              max_tokens=MAX_TOKENS, temperature=0.9,
                                              top_p=0.95, seed=1234)
    assert response.model_extra["token_ids"] == reference.token_ids
    other = client.chat.completions.create(model=LLM, messages=chat_messages(),
                                           max_tokens=MAX_TOKENS, temperature=0.9, top_p=0.95,
                                           seed=99)
    assert other.model_extra["token_ids"] != reference.token_ids  # the seed is used


def test_stop_and_length_finish_reasons(client, pool, llama):
    reference = reference_chat(pool, llama, temperature=0.0, stop_strings=("Paris",))
    response = client.chat.completions.create(model=LLM, messages=chat_messages(),
                                              max_tokens=MAX_TOKENS, temperature=0,
                                              stop=["Paris"])
    assert response.choices[0].message.content == reference.text
    assert "Paris" not in reference.text and reference.stop_reason == "stop_string"
    assert response.choices[0].finish_reason == "stop"
    short = client.chat.completions.create(model=LLM, messages=chat_messages(),
                                           max_completion_tokens=3, temperature=0)
    assert short.choices[0].finish_reason == "length"
    assert short.usage.completion_tokens == 3


# -- embeddings ---------------------------------------------------------------------------

def test_embeddings_equal_the_cli_as_floats_and_base64(client, server_url, pool):
    from candle_web.pipelines import load_bert
    from candle_web.pipelines.embed import SentenceEmbedder

    texts = ["A man is eating food.", "A man is riding a horse.", "Ein Mann isst."]
    loaded = load_bert(BERT)
    with pool.compute:
        reference = SentenceEmbedder(loaded.model, loaded.tokenizer).embed(texts)
    response = client.embeddings.create(model=BERT, input=texts, encoding_format="float")
    vectors = np.array([row.embedding for row in response.data], dtype=np.float32)
    np.testing.assert_array_equal(vectors, reference.vectors)  # bit for bit: the same code
    assert [row.index for row in response.data] == [0, 1, 2]
    assert response.usage.prompt_tokens == sum(reference.token_counts)
    # The client's default asks for base64 and decodes it; check the raw bytes too.
    decoded = client.embeddings.create(model=BERT, input=texts)
    np.testing.assert_array_equal(np.array([row.embedding for row in decoded.data],
                                           dtype=np.float32), reference.vectors)
    status, _, body = post_json(server_url, "/v1/embeddings", {
        "model": BERT, "input": texts[0], "encoding_format": "base64"})
    raw = base64.b64decode(json.loads(body)["data"][0]["embedding"])
    np.testing.assert_array_equal(np.frombuffer(raw, "<f4"), reference.vectors[0])


# -- audio --------------------------------------------------------------------------------

def test_transcriptions_equal_the_cli_in_every_format(client, pool, whisper):
    from candle_web.pipelines import subtitles

    reference = reference_transcript(pool, whisper, CLIP)
    assert "not an" in reference.text and "young man" in reference.text  # the clip's words
    with CLIP.open("rb") as audio:
        as_json = client.audio.transcriptions.create(model=WHISPER, file=audio)
    assert as_json.text == reference.text
    for fmt, cli_format in (("text", "txt"), ("srt", "srt"), ("vtt", "vtt")):
        with CLIP.open("rb") as audio:
            answer = client.audio.transcriptions.create(model=WHISPER, file=audio,
                                                        response_format=fmt)
        assert answer == subtitles.render(reference, cli_format), fmt
    with CLIP.open("rb") as audio:
        verbose = client.audio.transcriptions.create(model=WHISPER, file=audio,
                                                     response_format="verbose_json")
    assert verbose.text == reference.text
    assert verbose.duration == pytest.approx(reference.duration)
    assert [s.text for s in verbose.segments] == [s.text for s in reference.segments]
    assert [s.start for s in verbose.segments] == [s.start for s in reference.segments]


def test_a_transcript_equals_the_cli_process_output(client):
    """The text answer against `candle-web transcribe CLIP` run as a process (its stdout)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    environment = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(repo / "pkg"), str(repo / "native"), os.environ.get("PYTHONPATH", "")]))
    process = subprocess.run([sys.executable, "-m", "candle_web.cli", "transcribe", str(CLIP)],
                             capture_output=True, text=True, timeout=600, env=environment)
    assert process.returncode == 0, process.stderr[-2000:]
    with CLIP.open("rb") as audio:
        answer = client.audio.transcriptions.create(model=WHISPER, file=audio,
                                                    response_format="text")
    assert answer == process.stdout and answer.strip()


def test_translations_run_the_translate_task(client, pool, whisper):
    reference = reference_transcript(pool, whisper, CLIP_B, task="translate")
    with CLIP_B.open("rb") as audio:
        answer = client.audio.translations.create(model=WHISPER, file=audio)
    assert answer.text == reference.text and answer.text.strip()


# -- refusals: OpenAI's error JSON, naming the field, and the server keeps serving --------

CHAT = "/v1/chat/completions"
BAD_CHATS = [
    ({"messages": [{"role": "user", "content": "hi"}]}, "model"),
    ({"model": 7, "messages": [{"role": "user", "content": "hi"}]}, "model"),
    ({"model": LLM}, "messages"),
    ({"model": LLM, "messages": "hi"}, "messages"),
    ({"model": LLM, "messages": []}, "messages"),
    ({"model": LLM, "messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role"),
    ({"model": LLM, "messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ({"model": LLM, "messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
     "messages[0].content[0]"),
    ({"model": LLM, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 10**9},
     "max_tokens"),
    ({"model": LLM, "messages": [{"role": "user", "content": "hi"}], "max_tokens": "5"},
     "max_tokens"),
    ({"model": LLM, "messages": [{"role": "user", "content": "hi"}], "max_tokens": -1},
     "max_tokens"),
    ({"model": LLM, "messages": [{"role": "user", "content": "hi"}],
      "max_completion_tokens": 1.5}, "max_completion_tokens"),
    ({"model": LLM, "messages": [{"role": "user", "content": "hi"}], "temperature": "hot"},
     "temperature"),
    ({"model": LLM, "messages": [{"role": "user", "content": "hi"}], "temperature": 3},
     "temperature"),
    ({"model": LLM, "messages": [{"role": "user", "content": "hi"}], "top_p": 0}, "top_p"),
    ({"model": LLM, "messages": [{"role": "user", "content": "hi"}], "seed": -3}, "seed"),
    ({"model": LLM, "messages": [{"role": "user", "content": "hi"}], "stop": 3}, "stop"),
    ({"model": LLM, "messages": [{"role": "user", "content": "hi"}], "stop": ["a"] * 5}, "stop"),
    ({"model": LLM, "messages": [{"role": "user", "content": "hi"}], "stream": "yes"}, "stream"),
    ({"model": LLM, "messages": [{"role": "user", "content": "hi"}], "n": 5}, "n"),  # above the 4 slots
    ({"model": BERT, "messages": [{"role": "user", "content": "hi"}]}, "model"),
]


@pytest.mark.parametrize("payload, param", BAD_CHATS)
def test_bad_chat_fields_are_named(server_url, payload, param):
    status, _, body = post_json(server_url, CHAT, payload)
    assert_error_shape(status, body, param)
    assert_still_serving(server_url)


def test_unknown_model_is_404_model_not_found(client, server_url):
    with pytest.raises(openai.NotFoundError) as caught:
        client.chat.completions.create(model="no-such-model", messages=chat_messages())
    assert caught.value.body["code"] == "model_not_found"
    assert caught.value.body["param"] == "model"
    assert_still_serving(server_url)


@pytest.mark.parametrize("path, payload, param", [
    ("/v1/completions", {"model": LLM}, "prompt"),
    ("/v1/completions", {"model": LLM, "prompt": {"a": 1}}, "prompt"),
    ("/v1/completions", {"model": LLM, "prompt": [1, 2, 10**9]}, "prompt"),
    ("/v1/completions", {"model": LLM, "prompt": "x", "echo": True}, "echo"),
    ("/v1/embeddings", {"model": BERT, "input": [1, 2, 10**9]}, "input[0]"),
    ("/v1/embeddings", {"model": BERT, "input": ["ok", ""]}, "input[1]"),
    ("/v1/embeddings", {"model": BERT, "input": "x", "encoding_format": "hex"},
     "encoding_format"),
    ("/v1/embeddings", {"model": LLM, "input": "x"}, "model"),
])
def test_bad_fields_of_other_endpoints_are_named(server_url, path, payload, param):
    status, _, body = post_json(server_url, path, payload)
    assert_error_shape(status, body, param)
    assert_still_serving(server_url)


@pytest.mark.parametrize("body", [b"{not json", b"[1, 2]", b"\xff\xfe", b"[" * 100000])
def test_bodies_that_are_not_a_json_object_get_400(server_url, body):
    status, _, reply = post_json(server_url, CHAT, body)
    assert_error_shape(status, reply, None)
    assert_still_serving(server_url)


def test_unknown_routes_get_json_404(server_url):
    status, _, body = raw_request(server_url, "GET", "/v1/nothing-here")
    assert_error_shape(status, body, None, 404)


@pytest.mark.parametrize("fields, data, param", [
    ({"model": WHISPER}, b"this is not audio at all, just text" * 10, "file"),
    ({"model": WHISPER}, b"RIFF\x10\x00\x00\x00WAVEfmt ", "file"),  # a truncated WAV header
    ({}, None, "model"),
    ({"model": "no-such-model"}, None, "model"),
    ({"model": LLM}, None, "model"),
    ({"model": WHISPER, "response_format": "docx"}, None, "response_format"),
    ({"model": WHISPER, "temperature": "warm"}, None, "temperature"),
    ({"model": WHISPER, "temperature": "7"}, None, "temperature"),
])
def test_bad_audio_requests_are_named(server_url, fields, data, param):
    audio = CLIP.read_bytes() if data is None else data
    body, content_type = multipart_body(fields, "clip.wav", audio)
    status, _, reply = raw_request(server_url, "POST", "/v1/audio/transcriptions", body,
                                   {"Content-Type": content_type})
    expected = 404 if fields.get("model") == "no-such-model" else 400
    assert_error_shape(status, reply, param, expected)
    assert_still_serving(server_url)


def test_a_transcription_without_a_file_or_multipart_is_refused(server_url):
    body, content_type = multipart_body({"model": WHISPER}, "x.wav", b"")
    body = body.replace(b'name="file"', b'name="other"')
    status, _, reply = raw_request(server_url, "POST", "/v1/audio/transcriptions", body,
                                   {"Content-Type": content_type})
    assert_error_shape(status, reply, "file")
    status, _, reply = post_json(server_url, "/v1/audio/transcriptions", {"model": WHISPER})
    assert_error_shape(status, reply, "file")


# -- limits and the key -------------------------------------------------------------------

AUTH = {"Authorization": f"Bearer {API_KEY}"}


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"},
                                     {"Authorization": API_KEY},
                                     {"Authorization": f"Basic {API_KEY}"},
                                     {"Authorization": f"Bearer {API_KEY}x"}])
def test_the_api_key_is_required(small_url, headers):
    status, reply_headers, body = raw_request(small_url, "GET", "/v1/models", headers=headers)
    error = assert_error_shape(status, body, None, 401)
    assert error["code"] == "invalid_api_key"
    assert reply_headers.get("www-authenticate") == "Bearer"
    assert_still_serving(small_url, AUTH)


def test_the_key_opens_every_endpoint_through_the_client(small_url):
    keyed = openai.OpenAI(base_url=small_url + "/v1", api_key=API_KEY, max_retries=0,
                          timeout=HTTP_TIMEOUT_S)
    assert LLM in {m.id for m in keyed.models.list().data}
    answer = keyed.chat.completions.create(model=LLM, messages=chat_messages(), max_tokens=2,
                                           temperature=0)
    assert answer.usage.completion_tokens == 2
    wrong = openai.OpenAI(base_url=small_url + "/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong.models.list()
    # The page itself needs no key.
    status, _, _ = raw_request(small_url, "GET", "/")
    assert status == 200


def test_an_oversize_body_gets_413(small_url):
    payload = {"model": LLM, "messages": [{"role": "user", "content": "x" * SMALL_BODY}]}
    status, _, body = post_json(small_url, CHAT, payload, AUTH)
    assert_error_shape(status, body, None, 413)
    assert_still_serving(small_url, AUTH)


def test_an_oversize_upload_gets_413_naming_the_file(small_url):
    body, content_type = multipart_body({"model": WHISPER}, "big.wav", bytes(SMALL_UPLOAD + 1))
    status, _, reply = raw_request(small_url, "POST", "/v1/audio/transcriptions", body,
                                   {"Content-Type": content_type, **AUTH})
    assert_error_shape(status, reply, "file", 413)
    assert_still_serving(small_url, AUTH)


def _connect(url: str) -> socket.socket:
    parsed = urllib.parse.urlsplit(url)
    return socket.create_connection((parsed.hostname, parsed.port), timeout=HTTP_TIMEOUT_S)


def _read_reply(sock: socket.socket) -> bytes:
    reply = b""
    while chunk := sock.recv(65536):
        reply += chunk
        if b"\r\n\r\n" in reply:
            head, _, rest = reply.partition(b"\r\n\r\n")
            length = [line for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:")]
            if length and len(rest) >= int(length[0].split(b":")[1]):
                break
    return reply


def test_a_body_that_never_ends_gets_413(small_url):
    """Chunked, without end: the server answers once the limit is passed (the loop is bounded
    at four times the limit) and closes."""
    head = (f"POST {CHAT} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Authorization: Bearer {API_KEY}\r\nTransfer-Encoding: chunked\r\n\r\n").encode()
    chunk = b"2000\r\n" + b" " * 0x2000 + b"\r\n"
    with _connect(small_url) as sock:
        sock.sendall(head)
        try:
            for _ in range(4 * SMALL_BODY // 0x2000):
                sock.sendall(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server stopped reading: its answer is waiting
        reply = _read_reply(sock)
    status_line, _, rest = reply.partition(b"\r\n")
    assert status_line.startswith(b"HTTP/1.1 413"), reply[:300]
    body = rest.partition(b"\r\n\r\n")[2]
    assert_error_shape(413, body, None, 413)
    assert_still_serving(small_url, AUTH)


def test_a_body_that_stops_arriving_gets_408_after_the_idle_limit(small_url):
    head = (f"POST {CHAT} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Authorization: Bearer {API_KEY}\r\nContent-Length: 1000\r\n\r\n").encode()
    with _connect(small_url) as sock:
        sock.sendall(head + b'{"model": ')
        started = time.monotonic()
        reply = _read_reply(sock)
        elapsed = time.monotonic() - started
    assert reply.startswith(b"HTTP/1.1 408"), reply[:300]
    assert_error_shape(408, reply.partition(b"\r\n\r\n")[2], None, 408)
    assert elapsed >= SHORT_IDLE_S * 0.8  # it waited for the body first
    assert_still_serving(small_url, AUTH)


def test_a_foreign_host_is_refused_on_the_api_too(server_url):
    status, _, body = raw_request(server_url, "GET", "/v1/models",
                                  headers={"Host": "evil.example"})
    assert assert_error_shape(status, body, None, 421)["code"] == "misdirected_request"
    assert_still_serving(server_url)
