"""The API under concurrent load (loopback only, bounded): requests to one model share its
slots and keep the greedy ids they get alone; a full queue answers 429 with Retry-After; a
client that goes away frees its slot; 16 streaming chats + 4 uploads at once are each answered
exactly once. No timings are asserted: the scheduler's own counters say what happened."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("openai", reason="the dev extra installs the openai client")
pytest.importorskip("starlette", reason="the serve extra installs starlette")

from tests.api.api_testlib import (CLIP, CLIP_B, HTTP_TIMEOUT_S, LLM, WHISPER,  # noqa: E402
                                   chat_messages, multipart_body, raw_request, reference_chat,
                                   reference_transcript, run_stream, wait_until)
from tests.signals_testlib import default_sigint  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[2]
QUESTIONS = ["What is the capital of France?", "Name a primary colour.",
             "What is 2 + 2?", "Say hello in Spanish.", "What do bees make?",
             "Name a planet.", "What colour is the sky?", "Name a fruit."]
LOAD_TOKENS = 12
LONG_TOKENS = 400
LONG_QUESTION = "Write a long story about a dragon and a knight, with many chapters."
BOUNDED_WAIT_S = 120


@pytest.fixture(scope="module")
def pool():
    from candle_web.api import ModelPool

    pool = ModelPool(parallel=4, queue_size=16)
    pool.add(LLM)
    pool.add(WHISPER)
    yield pool
    pool.close()


def _serve(pool, tmp_path):
    from candle_web.api import build_app
    from candle_web.serve import SiteConfig, start_in_thread

    (tmp_path / "index.html").write_text("<!doctype html>")
    server, url = start_in_thread(site=SiteConfig(web_root=tmp_path), api=build_app(pool))
    return server, url.rstrip("/")


@pytest.fixture(scope="module")
def server_url(pool, tmp_path_factory):
    server, url = _serve(pool, tmp_path_factory.mktemp("load-web"))
    yield url
    server.shutdown()
    server.server_close()


def test_requests_sharing_rounds_keep_their_greedy_ids(pool, server_url, llama):
    """Four chats admitted in the same round (the compute lock holds the scheduler until all
    four are queued) each get the ids they get alone."""
    references = [reference_chat(pool, llama, question, temperature=0.0,
                                 max_new_tokens=LOAD_TOKENS) for question in QUESTIONS[:4]]
    scheduler = pool.models[LLM].scheduler
    rounds_before = scheduler.rounds
    answers = [None] * 4

    def ask(index: int) -> None:
        status, _, body = raw_request(server_url, "POST", "/v1/chat/completions", json.dumps({
            "model": LLM, "messages": chat_messages(QUESTIONS[index]),
            "max_tokens": LOAD_TOKENS, "temperature": 0}).encode(),
            {"Content-Type": "application/json"})
        answers[index] = (status, json.loads(body))

    threads = [threading.Thread(target=ask, args=(index,)) for index in range(4)]
    with pool.compute:  # nothing computes until every request waits for its slot
        for thread in threads:
            thread.start()
        wait_until(BOUNDED_WAIT_S, lambda: sum(scheduler.load()[k] for k in ("active", "waiting")) == 4,
                   "four requests queued")
    for thread in threads:
        thread.join(BOUNDED_WAIT_S)
    assert scheduler.max_active_seen >= 4
    for (status, answer), reference in zip(answers, references):
        assert status == 200, answer
        assert answer["token_ids"] == reference.token_ids
        assert answer["choices"][0]["message"]["content"] == reference.text
    # Rounds advance every active sequence: the four shared rounds rather than queueing.
    longest = max(len(reference.token_ids) for reference in references)
    assert scheduler.rounds - rounds_before <= longest + 4


def test_a_full_queue_gets_429_and_a_client_that_leaves_frees_its_slot(tmp_path, llama):
    from candle_web.api import ModelPool

    pool = ModelPool(parallel=1, queue_size=1)
    pool.add(LLM)
    server, url = _serve(pool, tmp_path)
    scheduler = pool.models[LLM].scheduler
    try:
        reference = reference_chat(pool, llama, QUESTIONS[1], temperature=0.0,
                                   max_new_tokens=LOAD_TOKENS)
        results = {}
        with pool.compute:
            # Long enough that it cannot end before its client's hang-up is noticed.
            first = threading.Thread(target=lambda: results.update(
                first=run_stream(url, LONG_QUESTION, LONG_TOKENS, hang_up_after_first=True)))
            first.start()
            wait_until(BOUNDED_WAIT_S, lambda: scheduler.load()["active"] == 1, "the first request in its slot")
            second = threading.Thread(target=lambda: results.update(
                second=run_stream(url, QUESTIONS[1], LOAD_TOKENS)))
            second.start()
            wait_until(BOUNDED_WAIT_S, lambda: scheduler.load()["waiting"] == 1, "the second request queued")
            status, headers, body = raw_request(url, "POST", "/v1/chat/completions", json.dumps({
                "model": LLM, "messages": chat_messages(), "max_tokens": 4}).encode(),
                {"Content-Type": "application/json"})
            assert status == 429, body
            assert headers["retry-after"] == "1"
            assert json.loads(body)["error"]["code"] == "rate_limit_exceeded"
        first.join(BOUNDED_WAIT_S)
        second.join(BOUNDED_WAIT_S)
        assert results["first"]["hung_up"]
        # The queued request ran to its end once the first client left: its whole answer.
        assert results["second"]["text"] == reference.text
        assert results["second"]["done"] == 1
        wait_until(BOUNDED_WAIT_S, lambda: scheduler.load()["cancelled"] == 1, "the first request dropped")
        # Only the second ran to its end. The scheduler counts it after its last chunk went out,
        # so the client can read [DONE] just before: wait for the count (a run under load failed
        # the immediate check), then check that nothing else finished.
        wait_until(BOUNDED_WAIT_S, lambda: scheduler.load()["finished"] >= 1, "the second request counted")
        assert scheduler.load()["finished"] == 1
        status, _, _ = raw_request(url, "GET", "/v1/models")
        assert status == 200
    finally:
        server.shutdown()
        server.server_close()
        pool.close()


def test_sixteen_streams_and_four_uploads_at_once(pool, server_url, llama, whisper):
    """16 streaming chats (4 of whose clients hang up after their first words) and 4
    transcription uploads at once on this 2-core machine: every request gets exactly one
    answer, the greedy answers equal the ones made alone, the transcripts equal the CLI's."""
    chat_refs = {q: reference_chat(pool, llama, q, temperature=0.0, max_new_tokens=LOAD_TOKENS)
                 for q in QUESTIONS}
    clips = [CLIP, CLIP_B, CLIP, CLIP_B]
    audio_refs = {clip: reference_transcript(pool, whisper, clip).text for clip in set(clips)}
    scheduler = pool.models[LLM].scheduler
    before = scheduler.load()
    outcomes: dict = {}
    lock = threading.Lock()

    def chat(index: int) -> None:
        result = run_stream(server_url, QUESTIONS[index % len(QUESTIONS)], LOAD_TOKENS,
                            hang_up_after_first=index % 4 == 3)
        with lock:
            assert ("chat", index) not in outcomes
            outcomes[("chat", index)] = result

    def upload(index: int) -> None:
        body, content_type = multipart_body({"model": WHISPER}, "clip.wav",
                                        clips[index].read_bytes())
        status, _, reply = raw_request(server_url, "POST", "/v1/audio/transcriptions", body,
                                       {"Content-Type": content_type})
        with lock:
            assert ("audio", index) not in outcomes
            outcomes[("audio", index)] = (status, reply)

    threads = ([threading.Thread(target=chat, args=(i,)) for i in range(16)]
               + [threading.Thread(target=upload, args=(i,)) for i in range(4)])
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(BOUNDED_WAIT_S * 2)
    assert not any(thread.is_alive() for thread in threads)
    assert len(outcomes) == 20
    for index in range(16):
        result = outcomes[("chat", index)]
        assert result["status"] == 200, result
        reference = chat_refs[QUESTIONS[index % len(QUESTIONS)]]
        if result["hung_up"]:
            assert reference.text.startswith(result["text"])
            continue
        assert result["text"] == reference.text
        assert result["done"] == 1 and len(result["finish"]) == 1
        assert result["usage"]["completion_tokens"] == len(reference.token_ids)
    for index in range(4):
        status, reply = outcomes[("audio", index)]
        assert status == 200, reply
        assert json.loads(reply)["text"] == audio_refs[clips[index]]
    wait_until(BOUNDED_WAIT_S, lambda: scheduler.load()["active"] + scheduler.load()["waiting"] == 0,
               "every slot free again")
    after = scheduler.load()
    assert after["finished"] - before["finished"] + after["cancelled"] - before["cancelled"] == 16
    assert after["cancelled"] - before["cancelled"] <= 4  # a hang-up after the last token ends
    status, _, _ = raw_request(server_url, "GET", "/v1/models")
    assert status == 200


def test_the_command_serves_the_api_and_stops_on_ctrl_c():
    """`candle-web serve --api --model smollm2-135m-instruct --port 0`: the URL line, a chat
    answered through the official client, and a clean stop on SIGINT."""
    import openai

    environment = dict(os.environ, PYTHONUNBUFFERED="1")
    environment["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT / "pkg"),
                                                 environment.get("PYTHONPATH", "")])
    environment.pop("CANDLE_WEB_API_KEY", None)
    started = time.monotonic()
    process = subprocess.Popen(
        [sys.executable, "-m", "candle_web.cli", "serve", "--api", "--model", LLM, "--port", "0",
         "--parallel", "2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=environment, preexec_fn=default_sigint)
    try:
        url = None
        for _ in range(10):  # bounded: the page line, then the API line
            line = process.stdout.readline()
            if line.startswith("candle-web: OpenAI-compatible API at "):
                url = line.split(" at ", 1)[1].split()[0]
                break
        assert url and url.startswith("http://127.0.0.1:"), line
        client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0,
                               timeout=HTTP_TIMEOUT_S)
        answer = client.chat.completions.create(model=LLM, messages=chat_messages(),
                                                max_tokens=8, temperature=0)
        print(f"start to first answer: {time.monotonic() - started:.2f} s")
        assert answer.usage.completion_tokens >= 1
        process.send_signal(signal.SIGINT)
        out, _ = process.communicate(timeout=30)
        assert "candle-web: stopped" in out
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
