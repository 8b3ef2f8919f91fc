"""The generate loop on a tiny random-weight Llama with the real SmolLM2 tokenizer: events,
stop conditions, cancel, sampling reproducibility and the repeat-penalty wiring. (Output
quality and exact ids on real weights: tests/models/test_llama.py.)"""

from __future__ import annotations

import numpy as np
import pytest

from candle_web.core.errors import Cancelled, CandleError
from candle_web.generation import GenerationOptions, apply_repeat_penalty, generate

PROMPT = "The weather today is"


def test_events_and_max_tokens(tiny_llama, smollm2_tokenizer):
    events = []
    result = generate(tiny_llama, smollm2_tokenizer, PROMPT,
                      GenerationOptions(max_new_tokens=7, eos_token_ids=()),
                      on_event=lambda kind, payload: events.append((kind, payload)))
    kinds = [kind for kind, _ in events]
    assert kinds[0] == "prompt" and kinds[-1] == "done"
    tokens = [payload for kind, payload in events if kind == "token" and payload["id"] is not None]
    assert [t["index"] for t in tokens] == list(range(7))
    assert [t["id"] for t in tokens] == result.token_ids
    assert "".join(p["text"] for k, p in events if k == "token") == result.text
    assert result.text == smollm2_tokenizer.decode(result.token_ids)
    assert result.stop_reason == "max_tokens" and len(result.token_ids) == 7
    assert events[0][1]["n_tokens"] == len(result.prompt_ids)
    assert result.prompt_ids == smollm2_tokenizer.encode(PROMPT).ids


def test_greedy_matches_a_manual_loop_with_repeat_penalty(tiny_llama, smollm2_tokenizer):
    options = GenerationOptions(max_new_tokens=8, repeat_penalty=1.8, repeat_last_n=4,
                                eos_token_ids=())
    result = generate(tiny_llama, smollm2_tokenizer, PROMPT, options)
    tokens = list(result.prompt_ids)
    tiny_llama.clear_kv_cache()
    logits = tiny_llama.forward(tokens)
    for _ in range(8):
        scores = apply_repeat_penalty(logits.to_numpy()[0], 1.8, tokens[-4:])
        tokens.append(int(np.argmax(scores)))
        logits = tiny_llama.forward([tokens[-1]])
    assert result.token_ids == tokens[len(result.prompt_ids):]


def test_stops_at_eos_without_emitting_it(tiny_llama, smollm2_tokenizer):
    free = generate(tiny_llama, smollm2_tokenizer, PROMPT,
                    GenerationOptions(max_new_tokens=6, eos_token_ids=()))
    eos = free.token_ids[3]
    first = free.token_ids.index(eos)
    stopped = generate(tiny_llama, smollm2_tokenizer, PROMPT,
                       GenerationOptions(max_new_tokens=6, eos_token_ids=(eos,)))
    assert stopped.stop_reason == "eos"
    assert stopped.token_ids == free.token_ids[:first]


def test_context_length_caps_generation(tiny_llama, smollm2_tokenizer):
    context = tiny_llama.config.max_position_embeddings
    prompt = list(range(100, 100 + context - 3))
    result = generate(tiny_llama, smollm2_tokenizer, prompt,
                      GenerationOptions(max_new_tokens=10, eos_token_ids=()))
    assert result.stop_reason == "context_length" and len(result.token_ids) == 3
    with pytest.raises(CandleError, match="context"):
        generate(tiny_llama, smollm2_tokenizer, list(range(context)), GenerationOptions())


def test_cancel_by_raising_in_the_callback(tiny_llama, smollm2_tokenizer):
    def on_event(kind, payload):
        if kind == "token" and payload["index"] == 2:
            raise Cancelled("stop button")

    with pytest.raises(Cancelled, match="stop button"):
        generate(tiny_llama, smollm2_tokenizer, PROMPT, GenerationOptions(max_new_tokens=10),
                 on_event)


def test_seeded_sampling(tiny_llama, smollm2_tokenizer):
    def run(seed):
        options = GenerationOptions(max_new_tokens=8, temperature=1.0, top_p=0.95, seed=seed,
                                    eos_token_ids=())
        return generate(tiny_llama, smollm2_tokenizer, PROMPT, options).token_ids

    assert run(7) == run(7)
    assert run(7) != run(8)


def test_bad_options_and_prompts(tiny_llama, smollm2_tokenizer):
    with pytest.raises(CandleError, match="empty"):
        generate(tiny_llama, smollm2_tokenizer, [], GenerationOptions())
    with pytest.raises(CandleError, match="max_new_tokens"):
        GenerationOptions(max_new_tokens=-1)
    with pytest.raises(CandleError, match="k must be"):
        GenerationOptions(temperature=0.5, top_k=0)
