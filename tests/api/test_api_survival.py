"""The API server survives what used to stop or jam it (loopback only, every wait bounded, no
timings asserted), through the official routes on SmolLM2 and Whisper tiny.en:

- out of memory while requests start (injected into TextScheduler._begin, in the prompt pass
  two requests share and in one alone) or anywhere else in a round (TextScheduler.
  _start_together as a whole): each request gets a 507 `out_of_memory` in OpenAI's error shape
  (what the routes answer a MemoryError with) and the scheduler thread serves the next one;
  before, the thread died and the clients waited forever;
- a request's KV caches leave with it, finished or out of memory half-way through allocating
  them (injected into nn.kv_cache.Cache.reserve): every buffer it allocated is freed once its
  slot is empty, and none is in the model's caches; before, the model kept the last slot's;
- out of memory while a finished request's caches go to the prefix pool (injected into
  PrefixPool.keep): the answer was out already and stands, the request beside it in the same
  rounds still gets its whole answer;
- a model being read from disk does not hold the compute lock: another model's stream runs
  to its end meanwhile;
- a transcription whose client hangs up stops at its next window or token;
- a request whose client left while it waited holds no place toward the 429 limit;
- every text model keeps its prefixes in the server's one pool.
"""

from __future__ import annotations

import http.client
import json
import threading
import urllib.parse
import weakref

import pytest

pytest.importorskip("starlette", reason="the serve extra installs starlette")

from tests.api.api_testlib import (CLIP, LLM, WHISPER, Stream, chat_request,  # noqa: E402
                                   multipart_body, raw_request, reference_chat, run_stream,
                                   wait_until)

QUESTIONS = ["What is the capital of France?", "Name a primary colour.", "What is 2 + 2?",
             "What do bees make?"]
TOKENS = 8
BOUNDED_WAIT_S = 60


@pytest.fixture(scope="module")
def pool():
    from candle_web.api import ModelPool

    # Two slots and one place in the queue: three requests fill the server.
    pool = ModelPool(parallel=2, queue_size=1)
    pool.add(LLM)
    yield pool
    pool.close()


@pytest.fixture(scope="module")
def server_url(pool, tmp_path_factory):
    from candle_web.api import build_app
    from candle_web.serve import SiteConfig, start_in_thread

    web_root = tmp_path_factory.mktemp("survival-web")
    (web_root / "index.html").write_text("<!doctype html>")
    server, url = start_in_thread(site=SiteConfig(web_root=web_root), api=build_app(pool))
    yield url.rstrip("/")
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def references(pool, llama):
    """What `candle-web generate --chat` answers each question with, greedy."""
    answers = {}

    def reference(question: str, max_tokens: int = TOKENS):
        if (question, max_tokens) not in answers:
            answers[question, max_tokens] = reference_chat(
                pool, llama, question, temperature=0.0, max_new_tokens=max_tokens)
        return answers[question, max_tokens]
    return reference


def in_thread(function, *args) -> tuple[threading.Thread, dict]:
    """Runs function(*args) on a thread; the dict gets its "result" (or "error")."""
    outcome = {}

    def run():
        try:
            outcome["result"] = function(*args)
        except Exception as error:  # noqa: BLE001  (the test reads it)
            outcome["error"] = error

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def asked_together(pool, url: str, asks: list) -> list:
    """Each (question, max_tokens) as a greedy chat, sent while the compute lock is held so
    that the first takes a slot and the others queue behind it; the (status, answer) pairs."""
    scheduler = pool.models[LLM].scheduler
    calls = []
    with pool.compute:
        for index, (question, max_tokens) in enumerate(asks):
            calls.append(in_thread(chat_request, url, question, max_tokens, BOUNDED_WAIT_S))
            if index == 0:
                wait_until(BOUNDED_WAIT_S, lambda: scheduler.load()["active"] == 1,
                           "the first request in its slot")
            else:
                wait_until(BOUNDED_WAIT_S, lambda: scheduler.load()["waiting"] == index,
                           f"request {index} queued")
    answers = []
    for thread, outcome in calls:
        thread.join(BOUNDED_WAIT_S + 5)
        assert "result" in outcome, f"no answer: {outcome.get('error')!r}"
        answers.append(outcome["result"])
    return answers


def assert_answer(answer, reference) -> None:
    status, body = answer
    assert status == 200, body
    assert body["token_ids"] == reference.token_ids


def assert_out_of_memory(answer) -> None:
    """A 507 in OpenAI's error shape that says what happened."""
    status, body = answer
    assert status == 507, body
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "server_error" and error["code"] == "out_of_memory"
    assert "out of memory" in error["message"]


def test_every_text_model_keeps_its_prefixes_in_the_servers_one_pool(pool):
    from candle_web.api.prefixes import DEFAULT_MAX_BYTES

    assert pool.models[LLM].scheduler.prefixes is pool.prefixes
    assert pool.prefixes.max_bytes == DEFAULT_MAX_BYTES


def test_out_of_memory_starting_requests_answers_507_and_the_thread_goes_on(
        pool, server_url, references, monkeypatch):
    from candle_web.api.scheduler import TextScheduler

    scheduler = pool.models[LLM].scheduler
    reference = references(QUESTIONS[0])

    def out_of_memory(*args, **kwargs):
        raise MemoryError("injected: no memory for the sampler")

    monkeypatch.setattr(TextScheduler, "_begin", out_of_memory)
    shared_before = scheduler.started_together
    # The first starts alone; the next two are admitted together and share their prompt pass.
    answers = asked_together(pool, server_url, [(question, TOKENS) for question in QUESTIONS[:3]])
    assert scheduler.started_together - shared_before == 2, "the shared prompt pass did not run"
    for answer in answers:
        assert_out_of_memory(answer)
    monkeypatch.undo()
    assert_answer(chat_request(server_url, QUESTIONS[0], TOKENS, BOUNDED_WAIT_S), reference)
    # The answer is sent before its slot is retired: wait for the slot to empty, bounded.
    wait_until(BOUNDED_WAIT_S, lambda: scheduler.load()["active"] == 0, "the slots to empty")


def test_a_round_failing_outside_any_request_answers_507_and_the_next_one_runs(
        pool, server_url, references, monkeypatch):
    from candle_web.api.scheduler import TextScheduler

    scheduler = pool.models[LLM].scheduler

    def out_of_memory(self, requests):
        raise MemoryError("injected: no memory for the round")

    monkeypatch.setattr(TextScheduler, "_start_together", out_of_memory)
    assert_out_of_memory(chat_request(server_url, QUESTIONS[1], TOKENS, BOUNDED_WAIT_S))
    monkeypatch.undo()
    assert_answer(chat_request(server_url, QUESTIONS[1], TOKENS, BOUNDED_WAIT_S),
                  references(QUESTIONS[1]))
    assert scheduler.load()["failed_rounds"] >= 1


def test_out_of_memory_keeping_a_prefix_fails_nothing(pool, server_url, references,
                                                      monkeypatch):
    scheduler = pool.models[LLM].scheduler
    short, long = references(QUESTIONS[1], 2), references(QUESTIONS[2])

    def out_of_memory(*args, **kwargs):
        raise MemoryError("injected: no memory for the copy")

    monkeypatch.setattr(scheduler.prefixes, "keep", out_of_memory)
    before = scheduler.load()
    # The short one ends (and its caches fail to be kept) while the long one is mid-answer.
    answers = asked_together(pool, server_url, [(QUESTIONS[1], 2), (QUESTIONS[2], TOKENS)])
    assert_answer(answers[0], short)
    assert_answer(answers[1], long)
    assert scheduler.load()["unkept_prefixes"] - before["unkept_prefixes"] == 2
    monkeypatch.undo()
    assert_answer(chat_request(server_url, QUESTIONS[3], TOKENS, BOUNDED_WAIT_S),
                  references(QUESTIONS[3]))


def watch_kv_buffers(monkeypatch, fail_at: int = None) -> list:
    """Weak references to every KV-cache buffer allocated from now on (nn.kv_cache.Cache.
    reserve wrapped). With `fail_at`, that allocation raises MemoryError instead, as a cache
    that does not fit: the buffers before it stay allocated, a half-made cache."""
    from candle_web.nn import kv_cache

    made = []
    real_reserve = kv_cache.Cache.reserve

    def reserve(cache, *args, **kwargs):
        before = cache.buffer()
        if before is None and fail_at is not None and len(made) + 1 >= fail_at:
            raise MemoryError("injected: no memory for this KV cache")
        real_reserve(cache, *args, **kwargs)
        if cache.buffer() is not before:
            made.append(weakref.ref(cache.buffer()))

    monkeypatch.setattr(kv_cache.Cache, "reserve", reserve)
    return made


def assert_given_back(scheduler, made: list) -> None:
    """Once the request's slot is empty, none of the KV buffers it allocated is in the model's
    caches, and none is alive at all (freed as its last reference went: no gc pass needed)."""
    wait_until(BOUNDED_WAIT_S, lambda: scheduler.load()["active"] == 0, "the slot to empty")
    assert made, "the request allocated no KV-cache buffer"
    in_model = {id(buffer) for cache in scheduler.model.caches
                for buffer in (cache.k.buffer(), cache.v.buffer()) if buffer is not None}
    alive = [buffer for buffer in (ref() for ref in made) if buffer is not None]
    held = [buffer.nbytes for buffer in alive if id(buffer) in in_model]
    assert len(held) == 0, (f"the model holds {len(held)} of the request's {len(made)} KV "
                            f"buffers ({sum(held)} bytes)")
    assert len(alive) == 0, f"{len(alive)} of the request's {len(made)} KV buffers are held"


def test_a_finished_request_takes_its_kv_caches_with_it(pool, server_url, references,
                                                       monkeypatch):
    scheduler = pool.models[LLM].scheduler
    reference = references(QUESTIONS[2])  # (on its own model) before the watch starts
    made = watch_kv_buffers(monkeypatch)
    assert_answer(chat_request(server_url, QUESTIONS[2], TOKENS, BOUNDED_WAIT_S), reference)
    assert_given_back(scheduler, made)


def test_a_request_out_of_memory_for_its_kv_caches_gives_back_the_part_it_got(
        pool, server_url, references, monkeypatch):
    scheduler = pool.models[LLM].scheduler
    reference = references(QUESTIONS[3])
    blocks = len(scheduler.model.caches)
    # Keys and values of half the blocks allocated, then no memory for the next one.
    made = watch_kv_buffers(monkeypatch, fail_at=blocks + 1)
    assert_out_of_memory(chat_request(server_url, QUESTIONS[3], TOKENS, BOUNDED_WAIT_S))
    assert len(made) == blocks
    assert_given_back(scheduler, made)
    monkeypatch.undo()
    assert_answer(chat_request(server_url, QUESTIONS[3], TOKENS, BOUNDED_WAIT_S), reference)


def test_a_request_whose_client_left_the_queue_holds_no_place(pool, server_url, references):
    scheduler = pool.models[LLM].scheduler
    cancelled_before = scheduler.load()["cancelled"]
    calls = []
    with pool.compute:
        calls.append(in_thread(chat_request, server_url, QUESTIONS[0], TOKENS, BOUNDED_WAIT_S))
        wait_until(BOUNDED_WAIT_S, lambda: scheduler.load()["active"] == 1, "a request in a slot")
        leaving = Stream(server_url, QUESTIONS[1], TOKENS)  # queued, then its client leaves
        calls.append(in_thread(chat_request, server_url, QUESTIONS[2], TOKENS, BOUNDED_WAIT_S))
        wait_until(BOUNDED_WAIT_S, lambda: scheduler.load()["waiting"] == 2, "two queued")
        leaving.hang_up()
        wait_until(BOUNDED_WAIT_S, lambda: any(request.cancelled for request in
                                               list(scheduler.waiting)), "the hang-up seen")
        # The server is full but for the request that left: this one takes its place (while
        # the compute lock is still held, so that no slot frees meanwhile).
        calls.append(in_thread(chat_request, server_url, QUESTIONS[3], TOKENS, BOUNDED_WAIT_S))
        wait_until(BOUNDED_WAIT_S, lambda: "result" in calls[-1][1]
                   or scheduler.load()["cancelled"] > cancelled_before,
                   "the last request refused, or queued in place of the one that left")
    for (thread, outcome), question in zip(calls, (QUESTIONS[0], QUESTIONS[2], QUESTIONS[3])):
        thread.join(BOUNDED_WAIT_S + 5)
        assert_answer(outcome["result"], references(question))
    assert scheduler.load()["cancelled"] - cancelled_before == 1


def test_a_model_being_read_does_not_hold_up_another_models_stream(
        pool, server_url, references, monkeypatch):
    from candle_web import pipelines

    reference = references(QUESTIONS[0])
    real_load = pipelines.load_whisper
    reading, finish_reading = threading.Event(), threading.Event()

    def slow_read(*args, **kwargs):
        reading.set()
        finish_reading.wait(BOUNDED_WAIT_S)
        return real_load(*args, **kwargs)

    monkeypatch.setattr(pipelines, "load_whisper", slow_read)
    loader, loaded = in_thread(pool.load, WHISPER)
    try:
        assert reading.wait(BOUNDED_WAIT_S)
        outcome = run_stream(server_url, QUESTIONS[0], TOKENS)
        assert loader.is_alive(), "the load ended before the stream: nothing was shown"
    finally:
        finish_reading.set()
        loader.join(BOUNDED_WAIT_S)
    assert outcome["status"] == 200 and outcome["done"] == 1
    assert outcome["text"] == reference.text
    assert "result" in loaded and pool.models[WHISPER].loaded is not None


def test_a_transcription_stops_when_its_client_hangs_up(pool, server_url, monkeypatch):
    from candle_web.core.errors import Cancelled
    from candle_web.pipelines import transcribe as transcribe_module

    served = pool.load(WHISPER)
    real_transcribe = transcribe_module.transcribe
    first_window, hung_up = threading.Event(), threading.Event()
    seen = {}

    def watched(model, tokenizer, samples, options, on_event=None, should_continue=None,
                **kwargs):
        """The real transcription, held at its first window until the client has gone."""
        seen["should_continue"] = should_continue

        def on_window(kind, payload):
            if kind == "window" and not first_window.is_set():
                first_window.set()
                hung_up.wait(BOUNDED_WAIT_S)
            return on_event(kind, payload)

        try:
            result = real_transcribe(model, tokenizer, samples, options, on_event=on_window,
                                     should_continue=should_continue, **kwargs)
        except Cancelled:
            seen["outcome"] = "cancelled"
            raise
        seen["outcome"] = "finished"
        return result

    monkeypatch.setattr(transcribe_module, "transcribe", watched)
    body, content_type = multipart_body({"model": WHISPER}, "clip.wav", CLIP.read_bytes())
    parsed = urllib.parse.urlsplit(server_url)
    client = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=BOUNDED_WAIT_S)
    try:
        client.request("POST", "/v1/audio/transcriptions", body=body,
                       headers={"Content-Type": content_type})
        assert first_window.wait(BOUNDED_WAIT_S), "the transcription did not start"
        client.sock.shutdown(2)
    finally:
        client.close()
    try:
        wait_until(BOUNDED_WAIT_S, lambda: seen["should_continue"] is not None
                   and not seen["should_continue"](), "the job told that its client left")
    finally:
        hung_up.set()
    wait_until(BOUNDED_WAIT_S, lambda: "outcome" in seen, "the transcription to end")
    assert seen["outcome"] == "cancelled"
    monkeypatch.undo()
    # The worker goes on with the next upload (its first decoded token may compile kernels).
    status, _, reply = raw_request(server_url, "POST", "/v1/audio/transcriptions", body,
                                   {"Content-Type": content_type})
    assert status == 200, reply
    assert json.loads(reply)["text"].strip()
    assert served.worker.load()["cancelled"] >= 1
