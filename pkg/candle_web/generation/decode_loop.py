"""Autoregressive decoding: one loop for causal language models (the LLaMA family) and
encoder-decoders (T5).

    generate(model, tokenizer, prompt, GenerationOptions(...), on_event=callback)
    generate(Seq2SeqLM(t5), tokenizer, prompt, ...)       # the prompt goes through the encoder

`model` is a `Decoder` adapter, or a causal LM, which is wrapped in `CausalLM`: anything with
`forward(ids [b, t], index_pos) -> logits [b, vocab]`, `clear_kv_cache(capacity)` and a
`config` with `eos_token_ids` and `max_position_embeddings` (models.llama.Llama). `Seq2SeqLM`
adapts a model with `encode`, `start_decoding` and `decode` (models.t5): the encoder output is
computed once and each step runs the decoder on its caches. Under both, `sample_steps` is the
token loop (repeat penalty, sampling, end tokens, batch rows that finish at different steps).

One callback serves streaming, progress and cancellation: `on_event(kind, payload)` receives

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

from ..backend import parts
from . import option_limits as limits
from ..core.errors import Cancelled, CandleError, InvalidOption
from .grammar import Constraint, grammar_row
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
    # grammar.Constraint (JSON object / schema, structural tag): every token is sampled from
    # the tokens the grammar allows next; None: free text.
    constraint: Constraint = None

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
        if self.constraint is not None and not isinstance(self.constraint, Constraint):
            raise InvalidOption(f"constraint: expected a generation.grammar.Constraint, got "
                                f"{type(self.constraint).__name__}")

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
    end_token: int = None  # the end (EOS) token that stopped it, when one did

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


# -- the models, as the loop sees them ------------------------------------------------------
class Decoder:
    """What the loop drives. `start(batch of prompt ids)` -> logits [rows, vocab] for the first
    new token; `step(ids [rows])` -> the next logits; `reset(capacity)` before a sequence (KV
    caches for that many positions). `eos_token_ids`: the model's end tokens; `context_length`:
    the positions prompt and generated ids share (None: no limit); `filler_id`: what a batch
    row that has finished feeds its next steps; `penalty_context(prompt_ids)`: the ids the
    repeat penalty starts from."""

    eos_token_ids: tuple = ()
    context_length: int = None
    filler_id: int = 0

    def reset(self, capacity: int) -> None:
        pass

    def start(self, prompts: list) -> np.ndarray:
        raise NotImplementedError

    def step(self, ids: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def penalty_context(self, prompt_ids: list) -> list:
        return list(prompt_ids)


class CausalLM(Decoder):
    """A causal LM: the prompt in one forward pass, then one token per step on its KV cache;
    the repeat penalty sees the prompt and the generated ids."""

    def __init__(self, model):
        self.model = model
        self.eos_token_ids = tuple(model.config.eos_token_ids)
        self.context_length = model.config.max_position_embeddings
        self.position = 0
        # The model's forward, or a backend's fused step for single tokens (backend/parts.py).
        self.steps = parts.start_causal_decoding(model)

    def reset(self, capacity: int) -> None:
        self.model.clear_kv_cache(capacity)

    def start(self, prompts: list) -> np.ndarray:
        self.position = len(prompts[0])
        return self.steps(np.asarray(prompts, dtype=np.int64), 0).to_numpy()

    def step(self, ids: np.ndarray) -> np.ndarray:
        logits = self.steps(np.asarray(ids, dtype=np.int64).reshape(-1, 1), self.position)
        self.position += 1
        return logits.to_numpy()


class Seq2SeqLM(Decoder):
    """An encoder-decoder (T5): the prompt (one row per input, padded rows with their 1/0
    `attention_mask`) through the encoder once, then the decoder from its start token, one
    token per step with its caches. The repeat penalty sees only the generated ids, and rows
    that have finished feed the pad token."""

    def __init__(self, model, attention_mask=None):
        config = model.config
        self.model, self.attention_mask = model, attention_mask
        self.eos_token_ids = (config.eos_token_id,)
        self.filler_id = config.pad_token_id
        self.state = None

    def penalty_context(self, prompt_ids: list) -> list:
        return []

    def start(self, prompts) -> np.ndarray:
        encoded = self.model.encode(prompts, self.attention_mask)  # [rows, s, d], once
        self.state = self.model.start_decoding(encoded, self.attention_mask)
        rows = encoded.dims()[0]
        return self.step(np.full(rows, self.model.config.decoder_start_token_id, dtype=np.int64))

    def step(self, ids: np.ndarray) -> np.ndarray:
        rows = len(ids)
        logits = self.model.decode(np.asarray(ids, dtype=np.int64).reshape(rows, 1), self.state)
        return logits.narrow(1, 0, 1).reshape(rows, -1).to_numpy()


def sample_steps(lm: Decoder, logits: np.ndarray, options: GenerationOptions, eos: set,
                 budget: int, contexts: list, grammars: list = None):
    """The token loop: from the first logits [rows, vocab], one token per unfinished row per
    step, for at most `budget` steps; yields (new ids [rows], finished [rows]) after each step
    and stops when every row has produced an end token. `contexts[row]` (the ids the repeat
    penalty sees) grows with each token. One seeded processor per row: row 0 samples exactly
    as a batch of one would. Stopping early is the caller's: it leaves the loop.
    `grammars[row]` (a grammar.GrammarRow, or None for free text): that row samples only
    from the tokens its grammar allows (masked after the repeat penalty, before temperature
    and top-k/top-p) and each token moves its grammar on."""
    rows = logits.shape[0] if logits is not None else 0
    processors = [LogitsProcessor(options.seed + row, sampling=options.sampling())
                  for row in range(rows)]
    finished = np.zeros(rows, dtype=bool)
    next_ids = None
    for index in range(budget):
        if index > 0:
            logits = lm.step(next_ids)
        next_ids = np.full(rows, lm.filler_id, dtype=np.int64)
        for row in np.flatnonzero(~finished):
            scores = logits[row]
            if options.repeat_penalty != 1.0:
                scores = apply_repeat_penalty(scores, options.repeat_penalty,
                                              penalty_window(contexts[row], options.repeat_last_n))
            grammar = grammars[row] if grammars is not None else None
            if grammar is not None:
                scores = grammar.mask(scores)
            token = processors[row].sample(scores)
            if grammar is not None:
                grammar.accept(token)
            next_ids[row] = token
            contexts[row].append(token)
            finished[row] = token in eos
        yield next_ids, finished
        if finished.all():
            return


def generate(model, tokenizer, prompt, options: GenerationOptions = GenerationOptions(),
             on_event=None) -> GenerationResult:
    """Generate from `prompt` (text, or a list of token ids) until EOS, a stop string,
    max_new_tokens or the model's context length; see the module doc for `model` and
    `on_event`."""
    lm = model if isinstance(model, Decoder) else CausalLM(model)
    prompt_ids = _prompt_ids(tokenizer, prompt, options.add_special_tokens)
    eos = set(options.eos_token_ids if options.eos_token_ids is not None else lm.eos_token_ids)
    budget = options.max_new_tokens
    if lm.context_length is not None:
        if len(prompt_ids) >= lm.context_length:
            raise CandleError(f"generate: the prompt has {len(prompt_ids)} tokens; the model's "
                              f"context is {lm.context_length}")
        budget = min(budget, lm.context_length - len(prompt_ids))
    stream = TokenOutputStream(tokenizer)
    stops = StopStringMatcher(options.stop_strings)
    generated, pieces = [], []
    reason = STOP_MAX_TOKENS if budget == options.max_new_tokens else STOP_CONTEXT
    end_token = None
    lm.reset(len(prompt_ids) + budget)

    started = time.perf_counter()
    logits = lm.start([prompt_ids]) if budget else None
    prompt_seconds = time.perf_counter() - started
    _emit(on_event, "prompt", {"n_tokens": len(prompt_ids), "seconds": prompt_seconds})

    grammars = None
    if options.constraint is not None and logits is not None:
        grammars = [grammar_row(tokenizer, options.constraint, logits.shape[-1], eos)]
    decode_started = time.perf_counter()
    for next_ids, _ in sample_steps(lm, logits, options, eos, budget,
                                    [lm.penalty_context(prompt_ids)], grammars):
        next_id = int(next_ids[0])
        if next_id in eos:
            reason, end_token = STOP_EOS, next_id
            break
        generated.append(next_id)
        text = stops.feed(stream.next_token(next_id))
        pieces.append(text)
        _emit(on_event, "token", {"index": len(generated) - 1, "id": next_id, "text": text})
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
                              decode_seconds, stops.matched, end_token=end_token)
    if on_event is not None:  # nothing is left to cancel: the return value is ignored
        on_event("done", {"reason": reason, "n_tokens": len(generated),
                          "tokens_per_second": result.tokens_per_second,
                          "prompt_tokens_per_second": result.prompt_tokens_per_second})
    return result
