"""Autoregressive text generation for causal language models (the LLaMA family here).

    generate(model, tokenizer, prompt, GenerationOptions(...), on_event=callback)

`model` is anything with `forward(ids [b, t], index_pos) -> logits [b, vocab]`,
`clear_kv_cache(capacity)` and a `config` with `eos_token_ids` and
`max_position_embeddings` (models.llama.Llama). One callback serves streaming, progress and
cancellation: `on_event(kind, payload)` receives

    ("prompt", {"n_tokens", "seconds"})          after the prompt is processed
    ("token",  {"index", "id", "text"})          per generated token; text may be '' while a
                                                 character or a possible stop string is open
    ("done",   {"reason", "n_tokens", ...})      at the end

and cancels by returning False or raising `Cancelled`. The browser worker passes a callback
that posts each piece to the page; the CLI one writes to stdout.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from ..core import option_limits as limits
from ..core.errors import Cancelled, CandleError
from .logits_processor import DEFAULT_SEED, LogitsProcessor, Sampling
from .penalties import DEFAULT_REPEAT_LAST_N, apply_repeat_penalty, penalty_window
from .stopping import StopStringMatcher
from .streaming import TokenOutputStream

DEFAULT_MAX_NEW_TOKENS = 256

STOP_EOS = "eos"
STOP_STRING = "stop_string"
STOP_MAX_TOKENS = "max_tokens"
STOP_CONTEXT = "context_length"


@dataclass(frozen=True)
class GenerationOptions:
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    temperature: float = 0.0  # 0 (or None): greedy
    top_k: int = None
    top_p: float = None
    seed: int = DEFAULT_SEED
    repeat_penalty: float = 1.0  # 1.0: off
    repeat_last_n: int = DEFAULT_REPEAT_LAST_N
    stop_strings: tuple = ()
    eos_token_ids: tuple = None  # None: the model's (config.eos_token_ids)
    add_special_tokens: bool = True  # when the prompt is text: the tokenizer's BOS etc.

    def __post_init__(self):
        """Range checks at construction (the CLI, the browser worker and Python callers build
        this), so a bad value fails before the model runs and names the option and range."""
        limits.MAX_NEW_TOKENS.check(self.max_new_tokens, "max_new_tokens")
        limits.TEMPERATURE.check(self.temperature, "temperature", optional=True)
        limits.TOP_K.check(self.top_k, "top_k", optional=True)
        limits.TOP_P.check(self.top_p, "top_p", optional=True)
        limits.SEED.check(self.seed, "seed")
        limits.REPEAT_PENALTY.check(self.repeat_penalty, "repeat_penalty")
        limits.REPEAT_LAST_N.check(self.repeat_last_n, "repeat_last_n")
        self.sampling()  # validate the sampling fields now, not at the first token

    def sampling(self) -> Sampling:
        return Sampling.from_options(self.temperature, self.top_k, self.top_p)


@dataclass
class GenerationResult:
    text: str  # the generated text (stop string and EOS excluded)
    token_ids: list  # generated ids; the EOS that ended generation is not included
    prompt_ids: list
    stop_reason: str
    prompt_seconds: float = 0.0
    decode_seconds: float = 0.0
    stop_string: str = None
    extra: dict = field(default_factory=dict)

    @property
    def tokens_per_second(self) -> float:
        """Decode speed: generated tokens after the first (the first comes with the prompt
        pass) per second of decode steps."""
        steps = max(len(self.token_ids) - 1, 0)
        return steps / self.decode_seconds if self.decode_seconds > 0 else 0.0

    @property
    def prompt_tokens_per_second(self) -> float:
        return len(self.prompt_ids) / self.prompt_seconds if self.prompt_seconds > 0 else 0.0


def _emit(on_event, kind: str, payload: dict) -> None:
    if on_event is not None and on_event(kind, payload) is False:
        raise Cancelled(f"generation cancelled at {kind} {payload.get('index', '')}".rstrip())


def _prompt_ids(tokenizer, prompt, add_special_tokens: bool) -> list:
    if isinstance(prompt, str):
        ids = tokenizer.encode(prompt, add_special_tokens=add_special_tokens).ids
    else:
        ids = [int(i) for i in prompt]
    if not ids:
        raise CandleError("generate: the prompt is empty (no tokens to condition on)")
    return list(ids)


def generate(model, tokenizer, prompt, options: GenerationOptions = GenerationOptions(),
             on_event=None) -> GenerationResult:
    """Generate from `prompt` (text, or a list of token ids) until EOS, a stop string,
    max_new_tokens or the model's context length; see the module doc for `on_event`."""
    prompt_ids = _prompt_ids(tokenizer, prompt, options.add_special_tokens)
    eos = set(options.eos_token_ids if options.eos_token_ids is not None
              else model.config.eos_token_ids)
    context_length = model.config.max_position_embeddings
    if len(prompt_ids) >= context_length:
        raise CandleError(f"generate: the prompt has {len(prompt_ids)} tokens; the model's "
                          f"context is {context_length}")
    budget = min(options.max_new_tokens, context_length - len(prompt_ids))
    processor = LogitsProcessor(options.seed, sampling=options.sampling())
    stream = TokenOutputStream(tokenizer)
    stops = StopStringMatcher(options.stop_strings)
    tokens = list(prompt_ids)  # the repeat-penalty context: prompt and generated ids
    generated, pieces = [], []
    reason = STOP_MAX_TOKENS if budget == options.max_new_tokens else STOP_CONTEXT
    model.clear_kv_cache(len(prompt_ids) + budget)

    started = time.perf_counter()
    logits = model.forward(np.asarray([prompt_ids], dtype=np.int64), 0) if budget else None
    prompt_seconds = time.perf_counter() - started
    _emit(on_event, "prompt", {"n_tokens": len(prompt_ids), "seconds": prompt_seconds})

    decode_started = time.perf_counter()
    for index in range(budget):
        if index > 0:
            logits = model.forward(np.asarray([[generated[-1]]], dtype=np.int64), len(tokens) - 1)
        scores = logits.to_numpy()[0]
        if options.repeat_penalty != 1.0:
            scores = apply_repeat_penalty(scores, options.repeat_penalty,
                                          penalty_window(tokens, options.repeat_last_n))
        next_id = processor.sample(scores)
        if next_id in eos:
            reason = STOP_EOS
            break
        generated.append(next_id)
        tokens.append(next_id)
        text = stops.feed(stream.next_token(next_id))
        pieces.append(text)
        _emit(on_event, "token", {"index": index, "id": next_id, "text": text})
        if stops.stopped:
            reason = STOP_STRING
            break
    decode_seconds = time.perf_counter() - decode_started

    tail = stops.feed(stream.finish())
    tail += stops.flush()
    if tail:
        pieces.append(tail)
        _emit(on_event, "token", {"index": len(generated), "id": None, "text": tail})
    if stops.stopped:
        reason = STOP_STRING
    result = GenerationResult("".join(pieces), generated, prompt_ids, reason, prompt_seconds,
                              decode_seconds, stops.matched)
    if on_event is not None:  # nothing is left to cancel: the return value is ignored
        on_event("done", {"reason": reason, "n_tokens": len(generated),
                          "tokens_per_second": result.tokens_per_second,
                          "prompt_tokens_per_second": result.prompt_tokens_per_second})
    return result
