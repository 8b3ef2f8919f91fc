"""Continuous batching in the API's text scheduler (api/scheduler.py TextScheduler): requests
joining at different rounds, with prompts of different lengths and budgets, run in one batched
decode step per round (backend/batched_steps.py start_batched_causal_decoding) and each gets the
greedy ids `generate` gives it alone -- the batched step's rows are bit-identical to the
single step (tests/backend/test_batched_decoding.py), so any difference here is the
scheduler's (a row fed the wrong token, position or cache). A request cancelled mid-way
frees its slot and leaves the others' ids unchanged. No timings: the scheduler's counters say
that rounds were batched."""

from __future__ import annotations

import threading

import pytest

from candle_web.generation import GenerationOptions, generate
from tests.api.api_testlib import wait_until

MODELS = ["smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct"]
TEXTS = ["Hello", "The capital of France is", "def fibonacci(n):",
         "Once upon a time, in a land far away, there lived a", "1, 2, 3,",
         "Write a haiku about the sea.", "import numpy as np\n"]
BUDGETS = [10, 6, 12, 5, 9, 7, 8]
# Request i is submitted once the scheduler has run JOIN_ROUNDS[i] rounds.
JOIN_ROUNDS = [0, 0, 2, 3, 5, 6, 8]
CANCELLED = 4  # this one's client goes away after its third token
BOUNDED_WAIT_S = 300


@pytest.fixture(scope="module", params=MODELS)
def served(request):
    from candle_web.api import ModelPool

    pool = ModelPool(parallel=4, queue_size=16)
    served = pool.add(request.param)
    yield served
    pool.close()


def test_requests_joining_at_different_rounds_get_their_ids_alone(served):
    from candle_web.api.scheduler import TextRequest

    loaded, scheduler = served.loaded, served.scheduler
    prompts = [loaded.tokenizer.encode(text).ids for text in TEXTS]
    alone = [generate(loaded.model, loaded.tokenizer, prompt,
                      GenerationOptions(max_new_tokens=budget)).token_ids
             for prompt, budget in zip(prompts, BUDGETS)]
    results, events = {}, threading.Event()
    requests = []

    def emitter(index):
        def emit(kind, payload):
            if kind == "token" and index == CANCELLED and len(requests[index].generated) >= 3:
                requests[index].cancelled = True
            if kind in ("done", "error"):
                results[index] = (kind, payload)
            if len(results) == len(TEXTS) - 1 and CANCELLED not in results:
                events.set()
            if len(results) == len(TEXTS):
                events.set()
        return emit

    start_rounds, start_cancelled = scheduler.rounds, scheduler.cancelled
    for index, (prompt, budget) in enumerate(zip(prompts, BUDGETS)):
        wait_until(BOUNDED_WAIT_S, lambda: scheduler.rounds - start_rounds >= JOIN_ROUNDS[index],
                   f"round {JOIN_ROUNDS[index]}")
        requests.append(TextRequest(list(prompt), GenerationOptions(max_new_tokens=budget),
                                    emitter(index), budget=budget))
        scheduler.submit(requests[-1])
    assert events.wait(BOUNDED_WAIT_S), "the requests did not all finish"
    wait_until(BOUNDED_WAIT_S, lambda: scheduler.load()["active"] == 0, "the slots to empty")
    for index, expected in enumerate(alone):
        if index == CANCELLED:
            assert index not in results  # no "done" after its client went away
            assert requests[index].generated == expected[:len(requests[index].generated)]
            continue
        kind, payload = results[index]
        assert kind == "done", payload
        assert payload["token_ids"] == expected, f"request {index} ({TEXTS[index]!r})"
    assert scheduler.cancelled - start_cancelled == 1
    assert scheduler.max_batch_seen >= 3, "rounds were not batched"


def run_alone(scheduler, prompt, budget):
    """Submit one request and wait for its "done" payload."""
    from candle_web.api.scheduler import TextRequest

    done, result = threading.Event(), {}

    def emit(kind, payload):
        if kind in ("done", "error"):
            result[kind] = payload
            done.set()

    scheduler.submit(TextRequest(list(prompt), GenerationOptions(max_new_tokens=budget), emit,
                                 budget=budget))
    assert done.wait(BOUNDED_WAIT_S), "the request did not finish"
    assert "done" in result, result
    return result["done"]["token_ids"]


def test_prompts_sharing_a_prefix_reuse_its_cache_and_keep_their_ids(served):
    """A prompt that starts with what an earlier request held (its prompt, then its answer:
    a chat resent with its history; or a shared system prompt) runs only its new tokens on a
    copy of the kept keys and values (api/prefixes.py), and its greedy ids are still those
    `generate` gives it from scratch: the numba part splits a prompt exactly."""
    loaded, scheduler = served.loaded, served.scheduler
    assert scheduler._reuse_prefixes, "the numba part should split prompts exactly"
    first = list(loaded.tokenizer.encode("A list of fruits: apple, banana,").ids)
    first_ids = run_alone(scheduler, first, 6)
    # the next turn: the first prompt, its answer, then new text
    follow = first + first_ids + list(loaded.tokenizer.encode(" and a list of colours:").ids)
    # a prompt sharing only the first prompt's beginning
    sibling = first[:-2] + list(loaded.tokenizer.encode(" cherry and").ids)
    for prompt in (follow, sibling):
        before = scheduler.load()["reused_prompt_tokens"]
        ids = run_alone(scheduler, prompt, 8)
        reused = scheduler.load()["reused_prompt_tokens"] - before
        assert reused >= len(first) - 2, f"only {reused} prompt tokens reused"
        assert reused < len(prompt)
        assert ids == generate(loaded.model, loaded.tokenizer, prompt,
                               GenerationOptions(max_new_tokens=8)).token_ids


def test_the_prefix_pool_stays_within_its_bytes(served):
    from candle_web.api.prefixes import PrefixPool

    loaded, scheduler = served.loaded, served.scheduler
    pool, scheduler.prefixes = scheduler.prefixes, PrefixPool(max_bytes=1)
    try:
        run_alone(scheduler, list(loaded.tokenizer.encode("Tell me about the moon.").ids), 3)
        assert not scheduler.prefixes.entries and scheduler.prefixes.bytes == 0
    finally:
        scheduler.prefixes = pool
    assert 0 < pool.bytes <= pool.max_bytes


def test_requests_admitted_together_share_their_prompt_pass(served):
    """Requests that arrive while the scheduler is idle are admitted in one round, and their
    prompts run as the rows of shared steps (TextScheduler._start_together); each still gets
    the ids `generate` gives it alone. One of them shares a prefix with an earlier request."""
    from candle_web.api.scheduler import TextRequest

    loaded, scheduler = served.loaded, served.scheduler
    texts = ["Three facts about owls:", "def add(a, b):", "Paris is",
             "Three facts about owls: they"]
    prompts = [list(loaded.tokenizer.encode(text).ids) for text in texts]
    run_alone(scheduler, prompts[0], 4)  # leaves a prefix for the last prompt
    alone = [generate(loaded.model, loaded.tokenizer, prompt,
                      GenerationOptions(max_new_tokens=6)).token_ids for prompt in prompts]
    results, done = {}, threading.Event()

    def emitter(index):
        def emit(kind, payload):
            if kind in ("done", "error"):
                results[index] = (kind, payload)
                if len(results) == len(prompts):
                    done.set()
        return emit

    before = scheduler.started_together
    wait_until(BOUNDED_WAIT_S, lambda: scheduler.load()["active"] == 0, "the slots to empty")
    with scheduler._condition:  # all four are waiting when the scheduler next looks
        for index, prompt in enumerate(prompts):
            scheduler.submit(TextRequest(list(prompt), GenerationOptions(max_new_tokens=6),
                                         emitter(index), budget=6))
    assert done.wait(BOUNDED_WAIT_S), "the requests did not all finish"
    assert scheduler.started_together - before == len(prompts)
    for index, expected in enumerate(alone):
        kind, payload = results[index]
        assert kind == "done", payload
        assert payload["token_ids"] == expected, f"request {index} ({texts[index]!r})"
    assert results[3][1]["cached_tokens"] > 0
