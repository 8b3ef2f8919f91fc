"""The per-token cost of grammar-constrained decoding, engine against engine, next to one
decode step: how candle-web picked its grammar engine (issue 33).

For each model (SmolLM2-135M-Instruct Q4_1, Qwen2.5-Coder-0.5B-Instruct Q4_K_M) it loads the
model as `candle-web generate` does, times the unconstrained decode step (median of --steps
single-token steps on the KV cache), then, on the same vocabulary (candle-web's
`TokenVocabulary` of the model's tokenizer) and the same JSON schema, walks the tokens of a
document that matches the schema through each engine: xgrammar (the native engine, and the page's
web-xgrammar is the same engine compiled to wasm) and llguidance. Per token it times what a
decode step adds: fill the next-token bitmask, mask the logits (`grammar.apply_token_bitmask`,
the same numpy step for both) and accept the token. It prints each engine's compile time, the
median and p95 of that per-token cost, and the ratio (step + mask) / step: the goal is <= 1.15.
It prints the load average with the figures (the machine may be shared).

    .venv/bin/python bench/grammar.py [--models smollm2-135m-instruct,qwen2.5-coder-0.5b-instruct]
                                      [--steps 16] [--validate]

--validate instead serves each model (`serve --api` in this process, 4 slots) and sends ten
greedy chats with a strict 4-field json_schema through the `openai` client at once, and checks
each answer with `jsonschema`: it prints how many validate (the issue asks for all ten).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "pkg"))

SCHEMA = {"type": "object", "additionalProperties": False,
          "required": ["name", "age", "city", "languages", "employed"],
          "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                         "city": {"type": "string"},
                         "languages": {"type": "array", "items": {"type": "string"}},
                         "employed": {"type": "boolean"}}}
DOCUMENT = ('{"name": "Zoë Ünal", "age": 36, "city": "Zürich", "languages": ["German", '
            '"French", "Japanese"], "employed": true}')
GOAL = 1.15


def decode_step_seconds(loaded, steps: int) -> float:
    from candle_web.generation import CausalLM

    lm = CausalLM(loaded.model)
    prompt = loaded.tokenizer.encode("The weather today is", add_special_tokens=False).ids
    lm.reset(len(prompt) + steps + 1)
    logits = lm.start([prompt])
    times = []
    for _ in range(steps):
        token = int(np.argmax(logits[0]))
        started = time.perf_counter()
        logits = lm.step(np.array([token]))
        times.append(time.perf_counter() - started)
    return statistics.median(times), logits.shape[-1]


def walk(fill, accept, ids: list, vocab_size: int, logits: np.ndarray) -> list:
    """Per-token seconds of fill + mask + accept along `ids`."""
    from candle_web.generation import grammar

    bitmask = np.empty(grammar.bitmask_words(vocab_size), dtype=np.int32)
    times = []
    for token in ids:
        started = time.perf_counter()
        fill(bitmask)
        masked = grammar.apply_token_bitmask(logits, bitmask)
        accept(token)
        times.append(time.perf_counter() - started)
        assert np.isfinite(masked[token]), f"token {token} was masked"
    return times


def xgrammar_walk(vocabulary, ids, logits):
    from candle_web.generation import grammar

    constraint = grammar.Constraint.json_schema(SCHEMA, strict=True)
    engine = grammar.get_engine("xgrammar")
    started = time.perf_counter()
    compiled = engine.compiled(vocabulary, constraint)
    compile_s = time.perf_counter() - started
    matcher = engine.matcher(compiled)
    return compile_s, walk(matcher.fill_next_token_bitmask, matcher.accept_token,
                           ids + [vocabulary.stop_token_ids[0]], vocabulary.vocab_size, logits)


class _TokenBytes:
    """What llguidance's TokenizerWrapper reads: each token's bytes (special tokens prefixed
    with 0xFF, llguidance's mark for them), the end token, and the tokenizer itself."""

    def __init__(self, tokenizer, vocabulary):
        from candle_web.tokenizers.byte_level import unicode_to_byte

        to_byte = unicode_to_byte()
        special = tokenizer.special_token_ids
        self.tokens = []
        for index, token in enumerate(vocabulary.encoded_vocab):
            if index in special:
                self.tokens.append(b"\xff" + token.encode("utf-8"))
            elif vocabulary.vocab_type == "byte_level":
                self.tokens.append(bytes(to_byte[ch] for ch in token) if all(
                    ch in to_byte for ch in token) else token.encode("utf-8"))
            else:
                self.tokens.append(token.encode("utf-8"))
        self.eos_token_id = vocabulary.stop_token_ids[0]
        self.bos_token_id = None
        self.special_token_ids = sorted(special)
        self._tokenizer = tokenizer

    def __call__(self, text):
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="replace")
        return list(self._tokenizer.encode(text, add_special_tokens=False).ids)


def llguidance_walk(tokenizer, vocabulary, ids, logits):
    import llguidance
    import llguidance.numpy as llnp

    started = time.perf_counter()
    lltokenizer = llguidance.LLTokenizer(llguidance.TokenizerWrapper(
        _TokenBytes(tokenizer, vocabulary)), n_vocab=vocabulary.vocab_size)
    grammar_text = llguidance.grammar_from("json_schema", json.dumps(SCHEMA))
    matcher = llguidance.LLMatcher(lltokenizer, grammar_text)
    compile_s = time.perf_counter() - started
    assert not matcher.is_error(), matcher.get_error()
    buffer = llnp.allocate_token_bitmask(1, vocabulary.vocab_size)

    def fill(bitmask):
        llnp.fill_next_token_bitmask(matcher, buffer, 0)
        bitmask[:] = buffer[0, :bitmask.size]

    def accept(token):
        assert matcher.consume_token(token), matcher.get_error()

    return compile_s, walk(fill, accept, ids + [vocabulary.stop_token_ids[0]],
                           vocabulary.vocab_size, logits)


CITY = {"type": "object", "additionalProperties": False,
        "required": ["city", "country", "population", "coastal"],
        "properties": {"city": {"type": "string"}, "country": {"type": "string"},
                       "population": {"type": "integer", "minimum": 0},
                       "coastal": {"type": "boolean"}}}
CITY_PROMPTS = ["Describe Paris as JSON.", "Describe Tokyo as JSON.", "Describe Lima as JSON.",
                "Describe Oslo as JSON.", "Describe Cairo as JSON.", "Describe Sydney as JSON.",
                "Give me facts about Berlin.", "Tell me about Nairobi.", "What is Quito like?",
                "A city you like, please."]


def validate_answers(name: str) -> None:
    import tempfile
    import threading

    import jsonschema
    import openai

    from candle_web.api import ModelPool, build_app
    from candle_web.serve import SiteConfig, start_in_thread

    pool = ModelPool(parallel=4, queue_size=16)
    pool.add(name)
    web = Path(tempfile.mkdtemp())
    (web / "index.html").write_text("<!doctype html>")
    server, url = start_in_thread(site=SiteConfig(web_root=web), api=build_app(pool))
    client = openai.OpenAI(base_url=url + "v1", api_key="unused", max_retries=0, timeout=3600)
    answers = {}
    response_format = {"type": "json_schema",
                       "json_schema": {"name": "city", "strict": True, "schema": CITY}}

    def ask(prompt):
        answers[prompt] = client.chat.completions.create(
            model=name, temperature=0, max_tokens=256, response_format=response_format,
            messages=[{"role": "user", "content": prompt}]).choices[0]

    started = time.perf_counter()
    threads = [threading.Thread(target=ask, args=(prompt,)) for prompt in CITY_PROMPTS]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    valid = 0
    for prompt in CITY_PROMPTS:
        choice = answers.get(prompt)
        try:
            jsonschema.validate(json.loads(choice.message.content), CITY)
            valid += 1
            verdict = "valid"
        except Exception as error:  # noqa: BLE001  (printed: the figure is the count)
            verdict = f"INVALID ({type(error).__name__})"
        print(f"  {prompt!r}: {verdict}: {choice.message.content if choice else None!r}")
    print(f"{name}: {valid}/{len(CITY_PROMPTS)} answers validate "
          f"({time.perf_counter() - started:.0f} s) [load {os.getloadavg()[0]:.1f}]")
    server.shutdown()
    pool.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="smollm2-135m-instruct,qwen2.5-coder-0.5b-instruct")
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--validate", action="store_true")
    args = parser.parse_args()
    if args.validate:
        for name in args.models.split(","):
            validate_answers(name)
        return 0
    from candle_web.generation import grammar
    from candle_web.pipelines import load_llama

    print(f"schema: {len(SCHEMA['properties'])} fields; document: {DOCUMENT}")
    for name in args.models.split(","):
        loaded = load_llama(name)
        step_s, vocab_size = decode_step_seconds(loaded, args.steps)
        eos = loaded.model.config.eos_token_ids
        vocabulary = grammar.TokenVocabulary.from_tokenizer(loaded.tokenizer, vocab_size, eos)
        ids = list(loaded.tokenizer.encode(DOCUMENT, add_special_tokens=False).ids)
        logits = np.random.default_rng(0).standard_normal(vocab_size).astype(np.float32)
        print(f"\n{name}: vocab {vocab_size} ({vocabulary.vocab_type}), {len(ids)} tokens; "
              f"decode step median {step_s * 1e3:.2f} ms  [load {os.getloadavg()[0]:.1f}]")
        runs = [("xgrammar", lambda: xgrammar_walk(vocabulary, ids, logits)),
                ("llguidance", lambda: llguidance_walk(loaded.tokenizer, vocabulary, ids,
                                                       logits))]
        for engine, run in runs:
            try:
                compile_s, times = run()
            except Exception as error:  # noqa: BLE001  (a bench prints what failed and goes on)
                print(f"  {engine:10s} failed: {type(error).__name__}: {str(error)[:200]}")
                continue
            median = statistics.median(times)
            p95 = sorted(times)[int(0.95 * (len(times) - 1))]
            ratio = (step_s + median) / step_s
            print(f"  {engine:10s} compile {compile_s * 1e3:8.1f} ms   per token: median "
                  f"{median * 1e6:7.1f} us, p95 {p95 * 1e6:7.1f} us   (step + mask) / step "
                  f"{ratio:.3f} {'<=' if ratio <= GOAL else '>'} {GOAL}  "
                  f"[load {os.getloadavg()[0]:.1f}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
