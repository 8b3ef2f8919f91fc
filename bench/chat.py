"""Time to the first token of a chat's second turn: the KV cache carried over from turn 1
(generation.Conversation) against a cold run of the same conversation (caches cleared, the
whole rendered conversation through the prompt pass), per model.

Turn 1 is a user message of about --turn1-tokens tokens (a passage to read) and a greedy answer
of --answer-tokens; turn 2 is a short question about it. Both runs of turn 2 render the same
prompt; the warm one processes only what the cache does not hold. Time to first token = from
the call to the first streamed token (rendering, tokenizing, the prompt pass, the first
sample). Each figure is the median of --repeats runs (the warm run replays turn 1 each time;
the cold run is a fresh Conversation loaded with the same messages). Goal: warm <= 0.3x cold.
The two runs' first answer ids are also compared (the reuse must not change them).

    .venv/bin/python bench/chat.py [--models smollm2-135m-instruct,qwen2.5-coder-0.5b-instruct]
                                   [--turn1-tokens 300] [--answer-tokens 32] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
for folder in ("pkg", "native"):
    sys.path.insert(0, str(REPO / folder))

PASSAGE = ("The lighthouse keeper, whose name was Ada Lovelace Brown, kept a logbook of every "
           "ship that passed the northern cape. Each entry gave the hour, the wind, the colour "
           "of the sky and the name painted on the bow. ")
QUESTION = "What was the lighthouse keeper's name?"


def turn_one(tokenizer, target: int) -> str:
    """A reading passage of about `target` tokens followed by an instruction."""
    text = ""
    while len(tokenizer.encode(text, add_special_tokens=False).ids) < target:
        text += PASSAGE
    return text + "\nRead this passage carefully."


def first_token_seconds(run) -> tuple:
    """(seconds to the first streamed token, the turn) for run(on_event)."""
    marks = {}
    started = time.perf_counter()

    def on_event(kind, payload):
        if kind == "token" and "first" not in marks:
            marks["first"] = time.perf_counter() - started

    turn = run(on_event)
    return marks.get("first", time.perf_counter() - started), turn


def bench_model(name: str, args) -> dict:
    from candle_web.generation import GenerationOptions
    from candle_web.generation.conversation import Conversation
    from candle_web.pipelines import load_llama

    loaded = load_llama(name)
    system = "You are a helpful assistant."
    first_message = turn_one(loaded.tokenizer, args.turn1_tokens)
    answer = GenerationOptions(max_new_tokens=args.answer_tokens)
    one = GenerationOptions(max_new_tokens=1)
    warm_times, cold_times, rows = [], [], {}
    for _ in range(args.repeats):
        chat = Conversation(loaded.model, loaded.tokenizer, system=system)
        loaded.model.clear_kv_cache()
        turn1 = chat.send(first_message, answer)
        seconds, warm = first_token_seconds(lambda ev: chat.send(QUESTION, one, ev))
        warm_times.append(seconds)
        history = chat.openai_messages()[:-2]  # the same conversation, before turn 2

        cold_chat = Conversation(loaded.model, loaded.tokenizer)
        cold_chat.load_messages(history)
        loaded.model.clear_kv_cache()
        seconds, cold = first_token_seconds(lambda ev: cold_chat.send(QUESTION, one, ev))
        cold_times.append(seconds)
        rows = {"turn1_prompt": turn1.prompt_tokens, "turn1_answer": len(turn1.token_ids),
                "turn2_prompt": warm.prompt_tokens, "reused": warm.reused_tokens,
                "new": warm.new_tokens, "same_ids": warm.token_ids == cold.token_ids}
    warm_s, cold_s = statistics.median(warm_times), statistics.median(cold_times)
    return dict(rows, warm=warm_s, cold=cold_s, ratio=warm_s / cold_s)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="smollm2-135m-instruct,qwen2.5-coder-0.5b-instruct")
    parser.add_argument("--turn1-tokens", type=int, default=300)
    parser.add_argument("--answer-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    print("model                          turn1 (prompt+answer)  turn2 prompt (reused/new)  "
          "TTFT warm   cold     warm/cold  same ids")
    for name in args.models.split(","):
        r = bench_model(name.strip(), args)
        print(f"{name:30} {r['turn1_prompt']:5d} + {r['turn1_answer']:3d}            "
              f"{r['turn2_prompt']:5d} ({r['reused']}/{r['new']})         "
              f"{r['warm'] * 1000:7.0f} ms {r['cold'] * 1000:7.0f} ms  {r['ratio']:.2f}x    "
              f"{r['same_ids']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
