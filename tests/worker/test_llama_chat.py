"""The worker's `chat` command natively (LlamaSession.chat_turn, what the Chat view calls):
built from the SmolLM2 GGUF bytes as the browser builds it, each turn sends the whole
conversation; the session's Conversation carries the KV cache over (turn 2 reuses turn 1),
an edited conversation rolls back, and the ids equal the in-process Conversation's (the same
code the terminal chat runs). Bad requests are refused with the field named."""

from __future__ import annotations

import json

import pytest

from candle_web.core.errors import CandleError, FormatError
from candle_web.worker import LlamaSession
from candle_web.worker.session import files_from_folder

MODEL, GGUF = "smollm2-135m-instruct", "SmolLM2-135M-Instruct.Q4_1.gguf"
OPTIONS = {"maxTokens": 20, "temperature": 0, "seed": 1}


@pytest.fixture(scope="module")
def session(model_file):
    path = model_file(MODEL, GGUF)
    llama = LlamaSession()
    key = "smollm2"
    for name, data in files_from_folder(path.parent, [GGUF]).items():
        llama.allocate_file(key, name, data.size)[:] = data
    llama.build_model(key)
    return llama, key


def turn(session, messages, **fields):
    llama, key = session
    reply, _ = llama.run(key, {"messages": messages, "options": OPTIONS, **fields})
    return json.loads(reply)


def test_turns_reuse_the_cache_and_match_the_native_conversation(session):
    from candle_web.generation import GenerationOptions
    from candle_web.generation.conversation import Conversation
    from candle_web.pipelines import load_llama

    system = {"role": "system", "content": "You are a helpful assistant."}
    first = turn(session, [system, {"role": "user", "content": "My name is Ada."}])
    assert first["reusedTokens"] == 0 and first["stopReason"] in ("eos", "max_tokens")
    history = [system, {"role": "user", "content": "My name is Ada."},
               {"role": "assistant", "content": first["text"]}]
    second = turn(session, history + [{"role": "user", "content": "Repeat my name."}])
    assert second["reusedTokens"] >= first["promptTokens"]
    assert second["newTokens"] == second["promptTokens"] - second["reusedTokens"]
    assert second["reuseNote"] is None  # natively on numba the steps split prompts exactly

    loaded = load_llama(MODEL)
    native = Conversation(loaded.model, loaded.tokenizer, system=system["content"])
    options = GenerationOptions(max_new_tokens=OPTIONS["maxTokens"])
    assert native.send("My name is Ada.", options).token_ids == first["tokenIds"]
    assert native.send("Repeat my name.", options).token_ids == second["tokenIds"]

    edited = turn(session, [system, {"role": "user", "content": "My name is Bob."}])
    assert 0 < edited["reusedTokens"] < first["promptTokens"]  # rolled back to "Ada"/"Bob"


def test_a_small_context_drops_old_turns_with_a_notice(session):
    messages = []
    for text in ("Tell me about the sea.", "Tell me about ships.", "Tell me about birds."):
        messages.append({"role": "user", "content": text})
        reply = turn(session, messages, context=100)
        messages.append({"role": "assistant", "content": reply["text"]})
    assert reply["droppedMessages"] > 0 and "context of 100 tokens" in reply["notice"]
    assert reply["promptTokens"] + OPTIONS["maxTokens"] <= 100


@pytest.mark.parametrize("messages, context, match", [
    ([], None, "end with a user message"),
    ([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}], None,
     "end with a user message"),
    ([{"role": "wizard", "content": "hi"}], None, r"messages\[0\]\.role"),
    ([{"role": "user", "content": "hi"}], 4, "context must be"),
    ([{"role": "user", "content": "hi"}], True, "context must be"),
    ([{"role": "user", "content": "x" * 30_000}] * 14 + [{"role": "user", "content": "hi"}],
     None, "at most 400000"),
])
def test_bad_chat_requests_are_refused(session, messages, context, match):
    with pytest.raises((CandleError, FormatError), match=match):
        turn(session, messages, context=context)
