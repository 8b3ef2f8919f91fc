"""The sampling fields of /v1/chat/completions and /v1/completions as OpenAI's clients use
them: `seed` (a fresh one per request when absent, reported back), `n` (choices, each a row
of the batch with its own seed), `max_tokens` (at least 1; absent, the context's remainder, as
llama-server), and `logprobs` / `top_logprobs` (chat) or `logprobs: K` (completions).

Log-probabilities are the log-softmax of the raw logits the step sampled from (before the
temperature and the top-p mask, as OpenAI reports them): the batched step gives each row its
logits bit for bit as alone, so they are the same batched and alone.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

import numpy as np

from . import validation as check
from .errors import ApiError, bad_request, rate_limited

# OpenAI's limits: chat's top_logprobs is 0..20, completions' logprobs 0..5.
MAX_CHAT_TOP_LOGPROBS = 20
MAX_COMPLETION_LOGPROBS = 5
# A fresh seed is drawn below this, so that choice i's seed (seed + i) stays a small,
# copyable integer.
FRESH_SEED_BITS = 32
# The response header (and the body's `seed` field) that reports the seed a request used:
# sending it back as `seed` gives the same answer.
SEED_HEADER = "X-Candle-Web-Seed"


@dataclass(frozen=True)
class Sampling:
    max_tokens: int
    budget: int  # tokens each choice may generate: max_tokens within the context
    seed: int
    n: int
    top_logprobs: int = None  # None: no logprobs; else how many alternatives per token

    def choice_seeds(self) -> list:
        """Choice i samples with seed + i: what `generate` gives batch row i."""
        return [self.seed + index for index in range(self.n)]


def parse(body: dict, context: int, prompt_tokens: int, chat: bool, parallel: int) -> Sampling:
    """The request's sampling fields, checked (400 naming the field)."""
    # max_completion_tokens is OpenAI's newer name; it wins when both are given.
    name = "max_completion_tokens" if body.get("max_completion_tokens") is not None \
        else "max_tokens"
    max_tokens = check.integer(body, name, minimum=1, maximum=context,
                               maximum_reason=" (the model's context length)")
    remainder = context - prompt_tokens
    if max_tokens is None:
        max_tokens = remainder  # llama-server's default: until the context is full
    seed = check.integer(body, "seed", minimum=0, maximum=2**63 - 1)
    if seed is None:
        seed = secrets.randbits(FRESH_SEED_BITS)
    n = check.integer(body, "n", default=1, minimum=1, maximum=parallel,
                      maximum_reason=f" (the model's {parallel} parallel slots: each choice "
                                     "takes one)")
    return Sampling(max_tokens, min(max_tokens, remainder), seed, n,
                    _top_logprobs(body, chat))


def _top_logprobs(body: dict, chat: bool):
    if not chat:
        # completions: `logprobs: K`, the K most likely alternatives per token (0 is the
        # sampled token's alone).
        return check.integer(body, "logprobs", minimum=0, maximum=MAX_COMPLETION_LOGPROBS)
    wanted = check.boolean(body, "logprobs")
    top = check.integer(body, "top_logprobs", minimum=0, maximum=MAX_CHAT_TOP_LOGPROBS)
    if top is not None and not wanted:
        raise bad_request("top_logprobs: it needs \"logprobs\": true", "top_logprobs")
    return (top or 0) if wanted else None


def check_free_slots(scheduler, n: int) -> None:
    """n > 1 choices run side by side, so they need n free slots now (429 when fewer)."""
    if n < 2:
        return
    free = scheduler.load()
    free = free["parallel"] - free["active"] - free["waiting"]
    if n > free:
        error = rate_limited(scheduler.name)
        raise ApiError(429, f"n: {n} choices need {n} free slots of {scheduler.name}; {max(free, 0)} "
                            "free now", param="n", code=error.code, type=error.type,
                       headers=error.headers)


# -- the log-probabilities ------------------------------------------------------------------

def token_logprobs(logits, token: int, top: int) -> dict:
    """{"id", "logprob", "top": [(id, logprob)...]} of `token` under log-softmax(logits):
    float64 over the vocabulary, the top `top` in decreasing order (equal ones by id)."""
    scores = np.asarray(logits, dtype=np.float64).reshape(-1)
    shifted = scores - scores.max()
    logprobs = shifted - np.log(np.exp(shifted).sum())
    best = []
    if top:
        # The top few without sorting the vocabulary (this runs on the scheduler's thread for
        # every token): a partition, then those few in order.
        few = np.argpartition(-logprobs, top - 1)[:top]
        best = sorted(((int(i), float(logprobs[i])) for i in few),
                      key=lambda pair: (-pair[1], pair[0]))
    return {"id": int(token), "logprob": float(logprobs[token]), "top": best}


def token_bytes(tokenizer, token: int) -> bytes:
    """The bytes a token stands for: a byte-level BPE token's characters map back to bytes
    (one token may hold part of a character); other tokenizers' tokens as their UTF-8 text."""
    from ..tokenizers.byte_level import unicode_to_byte  # noqa: PLC0415

    piece = tokenizer.id_to_token(int(token))
    table = unicode_to_byte()
    if piece is not None and type(tokenizer.decoder).__name__ == "ByteLevel" \
            and all(char in table for char in piece):
        return bytes(table[char] for char in piece)
    return tokenizer.decode([int(token)], skip_special_tokens=False).encode("utf-8")


def _token_text(tokenizer, token: int) -> str:
    return token_bytes(tokenizer, token).decode("utf-8", errors="replace")


def chat_entry(tokenizer, logprob: dict) -> dict:
    """One token of a chat choice's `logprobs.content`."""
    def described(token, value) -> dict:
        return {"token": _token_text(tokenizer, token), "logprob": value,
                "bytes": list(token_bytes(tokenizer, token))}

    entry = described(logprob["id"], logprob["logprob"])
    entry["top_logprobs"] = [described(token, value) for token, value in logprob["top"]]
    return entry


def completion_logprobs(tokenizer, logprobs: list, text_offset: int = 0) -> dict:
    """A completions choice's `logprobs`: tokens, their logprobs, the top alternatives (a
    {token: logprob} object each) and each token's character offset in the text."""
    tokens, offsets, offset = [], [], text_offset
    for logprob in logprobs:
        text = _token_text(tokenizer, logprob["id"])
        tokens.append(text)
        offsets.append(offset)
        offset += len(text)
    return {"tokens": tokens, "token_logprobs": [lp["logprob"] for lp in logprobs],
            "top_logprobs": [{_token_text(tokenizer, t): v for t, v in lp["top"]}
                             for lp in logprobs],
            "text_offset": offsets}
