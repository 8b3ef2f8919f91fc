"""The page's grammar engine: structured outputs in the browser with web-xgrammar (xgrammar
compiled to WebAssembly, web/worker/grammar.js), behind the same seam as native xgrammar
(candle_web.generation.grammar), so one schema and one prompt give the same tokens in both.

web-xgrammar's factories are async and Python runs synchronously in the worker, so a request
with a response format runs in two steps:
1. before the Python job, the worker asks `LlamaSession.grammar_plan_json` for the plan (the
   constraint checked as natively, the vocabulary's and the grammar's keys, and what to compile),
   then prepares that grammar in JS (the tokenizer info once per vocabulary, the compiled grammar
   and its matcher once per constraint);
2. during decoding, `PageGrammarEngine` (registered as the default engine the first time) hands
   the decode loop a `PageMatcher` on the prepared matcher: one synchronous JS call per step to
   fill the bitmask (copied into the numpy array the loop owns), one to accept the token.

The vocabulary is the one the decode loop builds (TokenVocabulary.from_tokenizer with the
model's logits width and end tokens), so its fingerprint, and the grammar's key, are the same.
The compile options are the native engine's (XGrammarEngine.compile): xgrammar's defaults (any
whitespace, no indent, its own separators), `strict` as the constraint says.

Imported by the LLaMA session only when a request carries a response format, so the page's
start does not load the grammar seam.
"""
from __future__ import annotations

import hashlib
import json
import time

import numpy as np

from candle_web.generation import grammar
from candle_web.generation.grammar import (Constraint, GrammarEngine, GrammarError, Matcher,
                                           TokenVocabulary, register_engine)

ENGINE_NAME = "web-xgrammar"
# How the page's field is named in errors ("responseFormat.json_schema.schema: ...").
PAGE_FIELD = "responseFormat"


def page_constraint(response_format):
    """The page's responseFormat (OpenAI's response_format shape) as a Constraint, or None for
    none / {"type": "text"}; a GrammarError names the bad field."""
    return Constraint.from_response_format(response_format, PAGE_FIELD)


def page_vocabulary(llama, tokenizer):
    """The TokenVocabulary the decode loop builds for this model (generation.generate): the
    logits' width and the model's end tokens."""
    return TokenVocabulary.from_tokenizer(tokenizer, vocab_size=llama.config.vocab_size,
                                          stop_token_ids=llama.config.eos_token_ids)


def grammar_key(vocabulary, constraint) -> str:
    """The name of one prepared grammar in the worker: vocabulary and constraint together."""
    return hashlib.sha256(f"{vocabulary.fingerprint}\n{constraint.key}".encode()).hexdigest()


def compile_request(constraint) -> dict:
    """What web-xgrammar compiles, with the native engine's arguments (XGrammarEngine.compile):
    a JSON constraint as a schema (json_object: grammar.JSON_OBJECT, any object) in the very JSON
    text native xgrammar gets, xgrammar's whitespace defaults (any whitespace, no indent, its
    own separators) bounded by the constraint's max_whitespace, and its strict flag.
    tests/worker/test_page_grammar_masks.py holds the two engines' masks equal."""
    if constraint.kind in ("json_object", "json_schema"):
        schema = constraint.schema if constraint.kind == "json_schema" else grammar.JSON_OBJECT
        return {"kind": "json_schema", "schema": json.dumps(schema), "anyWhitespace": True,
                "indent": None, "strict": constraint.strict,
                "maxWhitespace": constraint.max_whitespace}
    if constraint.kind == "ebnf":
        return {"kind": "ebnf", "ebnf": constraint.grammar, "rootRule": "root"}
    return {"kind": "structural_tag",
            "structuralTag": grammar._xgrammar_structural_tag(constraint)}


def grammar_plan(llama, tokenizer, response_format, bridge) -> dict | None:
    """The worker's plan for a request's responseFormat, or None without one: {vocabularyKey,
    grammarKey, constraint (compile_request)}. Registers the page's engine (on `bridge`, the JS
    grammarBridge) as the default the first time."""
    constraint = page_constraint(response_format)
    if constraint is None:
        return None
    use_page_engine(bridge)
    _engine[0].stats = new_stats()
    vocabulary = page_vocabulary(llama, tokenizer)
    return {"vocabularyKey": vocabulary.fingerprint,
            "grammarKey": grammar_key(vocabulary, constraint),
            "constraint": compile_request(constraint)}


def vocabulary_json(llama, tokenizer) -> str:
    """The vocabulary as web-xgrammar's TokenizerInfo takes it (sent once per model)."""
    vocabulary = page_vocabulary(llama, tokenizer)
    return json.dumps({"encodedVocab": list(vocabulary.encoded_vocab),
                       "vocabType": vocabulary.vocab_type, "vocabSize": vocabulary.vocab_size,
                       "stopTokenIds": list(vocabulary.stop_token_ids),
                       "addPrefixSpace": vocabulary.add_prefix_space})


_engine = [None]


def new_stats() -> dict:
    """What one request's grammar calls cost in the page: steps masked, and the seconds spent in
    the JS calls that fill the mask (web-xgrammar's matcher plus the copy) and accept tokens."""
    return {"steps": 0, "fillSeconds": 0.0, "acceptSeconds": 0.0}


def request_stats() -> dict:
    """The last request's grammar cost per step, in milliseconds ({} before any)."""
    engine = _engine[0]
    if engine is None or not engine.stats["steps"]:
        return {}
    steps = engine.stats["steps"]
    return {"steps": steps, "fillMsPerStep": engine.stats["fillSeconds"] * 1000.0 / steps,
            "acceptMsPerStep": engine.stats["acceptSeconds"] * 1000.0 / steps}


def use_page_engine(bridge) -> None:
    """Make web-xgrammar (through `bridge`) the grammar engine of this Python (the page's)."""
    if _engine[0] is None:
        _engine[0] = PageGrammarEngine(bridge)
        register_engine(ENGINE_NAME, lambda: _engine[0], default=True)


class PageGrammarEngine(GrammarEngine):
    """Grammars compiled by web-xgrammar in the worker's JS; `compile` finds the one the worker
    prepared for this vocabulary and constraint (by its key)."""

    name = ENGINE_NAME

    def __init__(self, bridge):
        super().__init__()
        self.bridge = bridge
        self.generation = {}  # key -> how many matchers were made on its one JS matcher
        self.stats = new_stats()

    def compile(self, vocabulary, constraint):
        key = grammar_key(vocabulary, constraint)
        if not self.bridge.has(key):
            raise GrammarError(f"the {constraint.kind} grammar for this model was not prepared "
                               f"in the worker (its plan must run before the job)")
        return key

    def matcher(self, compiled):
        # One JS matcher per prepared grammar: the page answers one request at a time, so each
        # request resets it, and an older PageMatcher on it refuses to be used after that.
        self.generation[compiled] = self.generation.get(compiled, 0) + 1
        return PageMatcher(self, compiled, self.generation[compiled])


class PageMatcher(Matcher):
    """One request's grammar state: the prepared JS matcher of `key`."""

    def __init__(self, engine: PageGrammarEngine, key: str, generation: int):
        self.engine, self.bridge, self.key, self.generation = engine, engine.bridge, key, generation
        self.bridge.reset(key)

    def _check(self) -> None:
        if self.engine.generation.get(self.key) != self.generation:
            raise GrammarError("this grammar's matcher was taken over by a later request")

    def fill_next_token_bitmask(self, bitmask: np.ndarray) -> None:
        self._check()
        started = time.perf_counter()
        # One JS call: the words as an Int32Array, copied into the loop's own int32 array.
        self.bridge.fill(self.key).assign_to(bitmask)
        self.engine.stats["steps"] += 1
        self.engine.stats["fillSeconds"] += time.perf_counter() - started

    def accept_token(self, token_id: int) -> bool:
        self._check()
        started = time.perf_counter()
        accepted = bool(self.bridge.accept(self.key, int(token_id)))
        self.engine.stats["acceptSeconds"] += time.perf_counter() - started
        return accepted

    def is_terminated(self) -> bool:
        self._check()
        return bool(self.bridge.isTerminated(self.key))

    def rollback(self, n_tokens: int) -> None:
        self._check()
        self.bridge.rollback(self.key, int(n_tokens))

    def reset(self) -> None:
        self._check()
        self.bridge.reset(self.key)
