"""Multi-turn chat with the KV cache carried over (generation/conversation.py), on the real
SmolLM2-135M-Instruct and Qwen2.5-Coder-0.5B-Instruct GGUFs.

The reference for every turn is a fresh run: the model's caches cleared and the same
conversation rendered by the same template, decoded greedily by `generate`. Reusing the cache
must give the same ids; the prompt pass of a reused turn runs the new tokens only.

A prefix is reused only where the decode steps split a prompt exactly (the numba part's
`step_prompts`): there the reused turn's cached keys and values are bit for bit a fresh run's,
so its ids cannot differ on any prompt. The multi-turn tests run on numba (skipped, saying so,
where it is missing); on numpy and on the wasm part (natively under wasmtime) no prefix is
reused, the turn says why, and the caches and ids are again a fresh run's.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from candle_web.core.errors import CandleError, FormatError, ShapeMismatch
from candle_web.core.tensor import Tensor
from candle_web.generation import GenerationOptions, generate
from candle_web.generation.conversation import (PREFIX_NOT_EXACT, STOP_CANCELLED,
                                                Conversation, check_messages)
from candle_web.nn.kv_cache import KvCache

GREEDY = GenerationOptions(max_new_tokens=24)


SMOLLM2 = "smollm2-135m-instruct"


@pytest.fixture(scope="module")
def smollm2(numba_device):
    """On numba, whose part splits prompts exactly: the turns reuse their prefix."""
    from candle_web.pipelines import load_llama

    return load_llama(SMOLLM2, device=numba_device)


@pytest.fixture(scope="module")
def qwen(numba_device):
    from candle_web.pipelines import load_llama

    return load_llama("qwen2.5-coder-0.5b-instruct", device=numba_device)


def fresh_ids(chat: Conversation, options=GREEDY) -> list:
    """The answer a fresh run gives to the conversation before its last answer."""
    history = chat.messages[chat.first:-1]
    ids = chat.prompt_ids(history)
    chat.model.clear_kv_cache()
    opts = GenerationOptions(max_new_tokens=options.max_new_tokens, add_special_tokens=False)
    return generate(chat.model, chat.tokenizer, ids, opts).token_ids


def cached_bits(model) -> list:
    """Copies of every block's cached keys and values (the positions the caches hold)."""
    return [(cache.k.current_data().to_numpy().copy(), cache.v.current_data().to_numpy().copy())
            for cache in model.caches]


def assert_caches_equal(got: list, want: list) -> None:
    assert len(got) == len(want)
    for block, ((k, v), (fresh_k, fresh_v)) in enumerate(zip(got, want)):
        assert k.shape == fresh_k.shape, block
        # Bit for bit (NaN-safe): not close, the same floats.
        assert np.array_equal(k.view(np.uint32), fresh_k.view(np.uint32)), f"block {block} keys"
        assert np.array_equal(v.view(np.uint32), fresh_v.view(np.uint32)), f"block {block} values"


def test_turn_two_reuses_turn_one_and_equals_a_fresh_run(smollm2):
    chat = Conversation(smollm2.model, smollm2.tokenizer, system="You are a helpful assistant.")
    seen = []
    first = chat.send("My name is Ada. Say hello to me.", GREEDY,
                      on_event=lambda kind, payload: seen.append((kind, payload)))
    assert first.reused_tokens == 0 and first.new_tokens == first.prompt_tokens
    prompt_event = [p for k, p in seen if k == "prompt"][0]
    assert prompt_event["reused"] == 0 and prompt_event["new_tokens"] == first.prompt_tokens

    second = chat.send("What is my name?", GREEDY)
    # The whole of turn 1 (its prompt and the answer's fed ids) was in the cache.
    assert second.reused_tokens >= first.prompt_tokens + len(first.token_ids) - 1
    assert second.new_tokens == second.prompt_tokens - second.reused_tokens
    assert second.new_tokens < 20
    assert second.reuse_note is None and chat.reuse_note is None
    # Not only the ids: every key and value the reused turn left in the caches (turn 1's
    # prompt and answer, turn 2's new tokens and answer) is the fresh run's, bit for bit.
    reused = cached_bits(smollm2.model)
    assert second.token_ids == fresh_ids(chat)
    assert_caches_equal(reused, cached_bits(smollm2.model))
    assert [m["role"] for m in chat.messages] == ["user", "assistant"] * 2


@pytest.mark.parametrize("backend", ["numpy", "wasm"])
def test_no_prefix_is_reused_where_the_steps_do_not_split_a_prompt_exactly(backend,
                                                                             model_file):
    """numpy runs prompts through the model's matmuls (ReferenceSteps) and the wasm part has no
    `step_prompts`: a prompt in pieces need not be the bits of one pass, so every turn runs its
    whole prompt, the prompt event and the turn say why, and the answer is a fresh run's."""
    from candle_web import Device
    from candle_web.backend import get_backend
    from candle_web.core.errors import BackendUnavailable
    from candle_web.pipelines import load_llama

    try:
        get_backend(backend)
    except BackendUnavailable as error:
        pytest.skip(f"{backend} backend unavailable: {error}")
    model_file(SMOLLM2, "SmolLM2-135M-Instruct.Q4_1.gguf")  # fail with the fetch hint if missing
    loaded = load_llama(SMOLLM2, device=Device.cpu(backend=backend))
    options = GenerationOptions(max_new_tokens=12)
    chat = Conversation(loaded.model, loaded.tokenizer, system="You are a helpful assistant.")
    assert chat.reuse_note == PREFIX_NOT_EXACT
    first = chat.send("My name is Ada. Say hello to me.", options)
    prompt_events = []
    second = chat.send("What is my name?", options,
                       on_event=lambda kind, data: prompt_events.append(data)
                       if kind == "prompt" else None)
    # The caches held turn 1 (a prefix of turn 2's prompt): none of it was kept.
    assert second.prompt_tokens > first.prompt_tokens + len(first.token_ids)
    assert second.reused_tokens == 0 and second.new_tokens == second.prompt_tokens
    assert second.reuse_note == PREFIX_NOT_EXACT
    assert prompt_events[0]["reused"] == 0 and prompt_events[0]["reuse_note"] == PREFIX_NOT_EXACT
    ran = cached_bits(loaded.model)
    assert second.token_ids == fresh_ids(chat, options)
    assert_caches_equal(ran, cached_bits(loaded.model))


def test_regenerate_and_edit_roll_back_to_the_divergence(smollm2):
    chat = Conversation(smollm2.model, smollm2.tokenizer)
    first = chat.send("My name is Ada.", GREEDY)
    second = chat.send("Tell me a fact about cats.", GREEDY)

    again = chat.regenerate(GREEDY)
    assert again.token_ids == second.token_ids  # greedy: the same answer
    # Everything up to the last answer stays; only its generation prompt tail may run again.
    assert again.reused_tokens == again.prompt_tokens - 1
    assert len(chat.messages) == 4

    edited = chat.edit(0, "My name is Bob.", GREEDY)
    assert len(chat.messages) == 2 and chat.messages[0]["content"] == "My name is Bob."
    # Rolled back to where "Ada" and "Bob" diverge: less than turn 1's prompt was kept.
    assert 0 < edited.reused_tokens < first.prompt_tokens
    assert edited.token_ids == fresh_ids(chat)
    # ...and the caches hold exactly the ids the next turn compares with.
    chat_again = chat.send("What is my name?", GREEDY)
    assert chat_again.token_ids == fresh_ids(chat)


def test_qwen_recalls_a_name_with_the_cache_carried_over(qwen):
    chat = Conversation(qwen.model, qwen.tokenizer, system="You are a helpful assistant.")
    first = chat.send("My name is Ada. Please remember it.", GREEDY)
    second = chat.send("What is my name? Answer with the name only.", GREEDY)
    assert "Ada" in second.text
    assert second.reused_tokens >= first.prompt_tokens + len(first.token_ids) - 1
    assert second.token_ids == fresh_ids(chat)


def test_a_stopped_answer_is_kept_and_the_next_turn_still_matches(smollm2):
    chat = Conversation(smollm2.model, smollm2.tokenizer)

    def stop_after_three(kind, payload):
        return not (kind == "token" and payload["index"] >= 2)

    turn = chat.send("Write a long story about a dragon.", GREEDY, on_event=stop_after_three)
    assert turn.stop_reason == STOP_CANCELLED and len(turn.token_ids) == 3
    assert chat.messages[-1] == {"role": "assistant", "content": turn.text}
    nxt = chat.send("Now a short one.", GREEDY)
    assert nxt.reused_tokens > 0
    assert nxt.token_ids == fresh_ids(chat)


def test_context_overflow_drops_the_oldest_turns_and_keeps_the_system_prompt(smollm2):
    system = "You are a pirate."
    chat = Conversation(smollm2.model, smollm2.tokenizer, system=system, context_length=160)
    options = GenerationOptions(max_new_tokens=40)
    turns = [chat.send(text, options) for text in
             ("Tell me about the sea.", "Tell me about ships.", "Tell me about parrots.")]
    dropped = [t for t in turns if t.dropped_messages]
    assert dropped, [t.prompt_tokens for t in turns]
    last = dropped[0]
    assert last.notice and "left the model's view" in last.notice and "160" in last.notice
    assert last.prompt_tokens + options.max_new_tokens <= 160
    # The model still sees the system prompt and the whole new message.
    shown = chat.tokenizer.decode(chat.prompt_ids(chat.messages[chat.first:-1]),
                                  skip_special_tokens=False)
    assert system in shown and "Tell me about parrots." in shown
    assert len(chat.messages) == 6  # the user still sees every message
    # No more than needed left: one more turn back would not fit.
    earlier = chat.prompt_ids(chat.messages[chat.first - 2:-1])
    assert len(earlier) + options.max_new_tokens > 160
    assert turns[-1].token_ids == fresh_ids(chat, options)


def test_a_message_too_long_for_the_context_is_refused_not_cut(smollm2):
    chat = Conversation(smollm2.model, smollm2.tokenizer, context_length=64)
    with pytest.raises(CandleError, match="context is 64"):
        chat.send("word " * 200, GREEDY)


def test_openai_messages_round_trip_and_bad_input(smollm2):
    chat = Conversation(smollm2.model, smollm2.tokenizer, system="Be brief.")
    chat.load_messages([{"role": "system", "content": "Be brief."},
                        {"role": "user", "content": "Hi"},
                        {"role": "assistant", "content": "Hello!"}])
    assert json.loads(chat.to_json()) == chat.openai_messages()
    assert chat.system == "Be brief." and len(chat.messages) == 2
    for bad, field in (([{"role": "user"}], "content"), ([{"role": "robot", "content": ""}], "role"),
                       ([{"role": "user", "content": 3}], "content"),
                       ([{"role": "user", "content": "a"}, {"role": "system", "content": "b"}],
                        "system")):
        with pytest.raises(FormatError, match=field):
            check_messages(bad)


def test_kv_cache_truncate():
    cache = KvCache(dim=2, initial_capacity=4)
    for step in range(6):
        t = Tensor.from_numpy(np.full((1, 2, 1, 3), step, np.float32))
        cache.append(t, t)
    buffer = cache.k.buffer()
    cache.truncate(6)  # nothing dropped: the same buffer
    assert cache.k.buffer() is buffer
    cache.truncate(2)
    # Dropping positions moves to a copy, so a mirror of the old buffer (the wasm team's)
    # cannot keep the dropped keys as valid.
    assert cache.k.buffer() is not buffer
    k, _ = cache.append(*(Tensor.from_numpy(np.full((1, 2, 1, 3), 9, np.float32)),) * 2)
    assert k.to_numpy()[0, 0, :, 0].tolist() == [0, 1, 9]
    with pytest.raises(ShapeMismatch, match="truncate"):
        cache.truncate(4)
