"""A multi-turn chat on one causal LM whose KV cache carries over from turn to turn.

    chat = Conversation(model, tokenizer, system="You are terse.")
    turn = chat.send("My name is Ada.", GenerationOptions(max_new_tokens=64), on_event=cb)
    turn.reused_tokens, turn.new_tokens       # what the prompt pass skipped / processed
    chat.send("What is my name?")             # only the new tokens run through the model
    chat.regenerate(); chat.edit(0, "My name is Bob.")

Each turn renders the whole conversation with the model's chat template (the same prompt a
fresh run would build), tokenizes it, and compares it with the ids whose keys and values the
model's caches hold: the shared prefix stays, the caches are truncated where the two diverge
(an edit, a regenerate, a re-tokenized answer that differs from the sampled ids) and only the
rest runs. So the ids of turn N equal those of a fresh run of the same conversation.

That holds only where the decode steps split a prompt exactly (`splits_exactly()`: the numba
part's `step_prompts`, whose keys, values and logits are bit for bit those of feeding the
tokens one by one), the condition the API's prefix pool uses too. Elsewhere (numpy, the wasm
part, which has no `step_prompts`) a prompt run in one pass sums in another order than its
prefix and rest run apart, and a near-tie could pick another id; there every turn runs its
whole prompt, as a fresh run does, and the turn's `reuse_note` says why nothing was reused.

Context limits: a turn needs its prompt plus `max_new_tokens` positions. When the model's
context (or `context_length`) cannot hold them, the oldest whole turns leave the model's view
(the system prompt stays, the messages stay in `messages` for the user to see) and the turn
carries a `notice` saying so. The new message itself is never cut: if it does not fit with the
system prompt alone, the turn is refused with a CandleError naming the sizes.

The model must have `caches` (one nn.KvCache per block) and `clear_kv_cache`, as
models.llama.Llama does; the steps still go through backend.parts.start_causal_decoding
(CausalLM), so the fused decode step runs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np

from ..core.errors import Cancelled, CandleError, FormatError
from .decode_loop import CausalLM, GenerationOptions, GenerationResult, generate

ROLES = ("system", "user", "assistant")
# What a turn says where its prompt runs whole although the caches held a prefix of it.
PREFIX_NOT_EXACT = ("the cached prefix is not reused on this backend: its steps would not "
                    "give the same bits as one pass over the prompt, so every turn runs its "
                    "whole prompt (as a fresh run does)")
STOP_CANCELLED = "cancelled"  # Stop pressed, Ctrl-C: the partial answer is kept
MAX_IMPORT_MESSAGES = 10_000
MAX_IMPORT_CHARS = 4_000_000


@dataclass
class ChatTurn:
    """One answer: the text, its ids, how the prompt was processed and what the context
    window left out."""

    text: str
    token_ids: list
    prompt_tokens: int
    reused_tokens: int
    new_tokens: int
    dropped_messages: int = 0  # messages before the window (not seen by the model)
    notice: str = None  # the visible notice when older turns were dropped
    result: GenerationResult = None
    reuse_note: str = None  # why no prefix was reused where the steps are not exact, else None

    @property
    def stop_reason(self) -> str:
        return self.result.stop_reason if self.result is not None else STOP_CANCELLED


class PrefixCachedLM(CausalLM):
    """CausalLM whose caches are kept between calls: `prepare(prompt_ids)` truncates them to
    the longest prefix shared with what they hold (at most all but the prompt's last id, whose
    logits start the answer) and `start` runs only the rest. `cached` lists the ids the caches
    hold, recorded before each step runs, so an interrupted step is caught by `prepare`.
    Where the steps do not split a prompt exactly (`reuses_prefixes` False) `prepare` always
    starts over, so the answer is the one a fresh run gives."""

    def __init__(self, model):
        super().__init__(model)
        self.cached = []
        self.keep = 0
        self.owned = None  # the model's cache list these ids describe
        self.reuses_prefixes = self.steps.splits_exactly()

    def cache_length(self) -> int:
        """Positions every block's cache holds and `cached` names (an interrupted step can
        leave some blocks one ahead); 0 when the model's caches were replaced since (another
        caller's clear_kv_cache)."""
        if self.model.caches is not self.owned:
            return 0
        lengths = [cache.length for cache in self.model.caches]
        return min([len(self.cached)] + lengths)

    def prepare(self, prompt_ids: list) -> int:
        held = self.cache_length() if self.reuses_prefixes else 0
        limit = min(held, len(prompt_ids) - 1)
        keep = 0
        while keep < limit and self.cached[keep] == prompt_ids[keep]:
            keep += 1
        if keep == 0:
            self.model.clear_kv_cache()
            self.owned = self.model.caches
        for cache in self.model.caches:
            cache.truncate(keep)
        del self.cached[keep:]
        self.keep = keep
        return keep

    def reset(self, capacity: int) -> None:
        """Between turns nothing is cleared: `prepare` already rolled back."""

    def clear(self) -> None:
        self.model.clear_kv_cache()
        self.cached, self.keep = [], 0

    def start(self, prompts: list) -> np.ndarray:
        ids = list(prompts[0])
        new = ids[self.keep:]
        self.cached.extend(new)
        self.position = len(ids)
        return self.steps(np.asarray([new], dtype=np.int64), self.keep).to_numpy()

    def step(self, ids: np.ndarray) -> np.ndarray:
        self.cached.extend(int(i) for i in np.asarray(ids).reshape(-1))
        return super().step(ids)


def check_messages(messages, where: str = "messages") -> list:
    """OpenAI-style [{"role", "content"}] as plain dicts; a bad entry is a FormatError naming
    its index and field. At most one system message, first."""
    if not isinstance(messages, list):
        raise FormatError(f"{where}: expected a JSON list of messages, got "
                          f"{type(messages).__name__}")
    if len(messages) > MAX_IMPORT_MESSAGES:
        raise FormatError(f"{where}: {len(messages)} messages, at most {MAX_IMPORT_MESSAGES}")
    out, total = [], 0
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            raise FormatError(f"{where}[{index}]: expected an object with role and content")
        role, content = message.get("role"), message.get("content")
        if role not in ROLES:
            raise FormatError(f"{where}[{index}].role: {role!r} is not one of {list(ROLES)}")
        if not isinstance(content, str):
            raise FormatError(f"{where}[{index}].content: expected a string, got "
                              f"{type(content).__name__}")
        if role == "system" and index != 0:
            raise FormatError(f"{where}[{index}]: a system message may only come first")
        total += len(content)
        if total > MAX_IMPORT_CHARS:
            raise FormatError(f"{where}: more than {MAX_IMPORT_CHARS} characters of content")
        out.append({"role": role, "content": content})
    return out


class Conversation:
    """Messages (user and assistant, alternating from a user's), an optional system prompt,
    and the model's KV cache kept in step with them; see the module doc."""

    def __init__(self, model, tokenizer, system: str = None, template=None,
                 context_length: int = None):
        from .chat_templates import chat_template_for

        self.model, self.tokenizer = model, tokenizer
        self.template = template if template is not None else chat_template_for(model, tokenizer)
        self.lm = PrefixCachedLM(model)
        limit = model.config.max_position_embeddings
        self.context_length = min(context_length or limit, limit) if limit else context_length
        self.system = system
        self.messages = []
        self.first = 0  # messages[first:] are in the model's view

    @property
    def reuse_note(self) -> str:
        """Why turns never reuse the cached prefix on this model's backend, or None where they
        do (the steps split a prompt exactly)."""
        return None if self.lm.reuses_prefixes else PREFIX_NOT_EXACT

    # -- the conversation as data ------------------------------------------------------------
    def openai_messages(self) -> list:
        """The whole conversation (dropped turns included) in OpenAI's messages format."""
        head = [{"role": "system", "content": self.system}] if self.system else []
        return head + [dict(m) for m in self.messages]

    def to_json(self) -> str:
        return json.dumps(self.openai_messages(), ensure_ascii=False, indent=2)

    def load_messages(self, messages, where: str = "messages") -> None:
        """Replace the conversation by OpenAI messages (the cache keeps what still matches)."""
        messages = check_messages(messages, where)
        self.system = None
        if messages and messages[0]["role"] == "system":
            self.system = messages.pop(0)["content"]
        self.messages, self.first = messages, 0

    def reset(self) -> None:
        """Forget the turns; the system prompt (and its cached prefix) stays."""
        self.messages, self.first = [], 0

    def set_system(self, text: str = None) -> None:
        self.system = text or None

    # -- turns -----------------------------------------------------------------------------
    def send(self, text: str, options: GenerationOptions = GenerationOptions(),
             on_event=None) -> ChatTurn:
        """Add a user message and answer it."""
        if not isinstance(text, str) or not text.strip():
            raise CandleError("chat: the message is empty")
        if self.messages and self.messages[-1]["role"] == "user":
            self.messages.pop()  # an unanswered message (a failed turn) is replaced
        self.messages.append({"role": "user", "content": text})
        return self._answer(options, on_event)

    def regenerate(self, options: GenerationOptions = GenerationOptions(),
                   on_event=None) -> ChatTurn:
        """Answer the last user message again (its previous answer is dropped)."""
        if self.messages and self.messages[-1]["role"] == "assistant":
            self.messages.pop()
        if not self.messages:
            raise CandleError("chat: nothing to regenerate (no user message yet)")
        return self._answer(options, on_event)

    def edit(self, index: int, text: str, options: GenerationOptions = GenerationOptions(),
             on_event=None) -> ChatTurn:
        """Replace user message `index` (of `messages`), drop what followed, answer it."""
        if not isinstance(index, int) or not 0 <= index < len(self.messages) \
                or self.messages[index]["role"] != "user":
            raise CandleError(f"chat: message {index!r} is not a user message of this "
                              f"conversation ({len(self.messages)} messages)")
        del self.messages[index:]
        self.first = min(self.first, index)
        return self.send(text, options, on_event)

    def prompt_ids(self, messages=None) -> list:
        """The token ids of the rendered conversation (system + `messages`) ending with the
        assistant's generation prompt; the template places BOS itself."""
        messages = self.messages[self.first:] if messages is None else messages
        head = [{"role": "system", "content": self.system}] if self.system else []
        rendered = self.template.render(head + list(messages), add_generation_prompt=True)
        return list(self.tokenizer.encode(rendered, add_special_tokens=False).ids)

    def _window(self, room: int) -> tuple:
        """(prompt ids, dropped count): the oldest whole turns leave the view until the prompt
        plus `room` new tokens fit the context. The window starts at `first` or at a later user
        message; fewer messages never need more tokens, so the earliest start that fits is
        found by bisection (a few renders, not one per dropped turn)."""
        ids = self.prompt_ids()
        limit = self.context_length
        if limit is None or len(ids) + room <= limit:
            return ids, self.first
        starts = [i for i in range(self.first + 1, len(self.messages))
                  if self.messages[i]["role"] == "user"]
        low, high = 0, len(starts) - 1  # starts[high] (the new message alone) is the last resort
        fitting = {}
        while low < high:
            middle = (low + high) // 2
            candidate = self.prompt_ids(self.messages[starts[middle]:])
            if len(candidate) + room <= limit:
                high = middle
                fitting[middle] = candidate
            else:
                low = middle + 1
        if starts:
            self.first = starts[low]
            ids = fitting.get(low) or self.prompt_ids()
        if len(ids) >= limit:
            raise CandleError(f"chat: the message needs {len(ids)} tokens with the system "
                              f"prompt and the template; the model's context is {limit} "
                              "(shorten the message or the system prompt)")
        return ids, self.first

    def _answer(self, options: GenerationOptions, on_event) -> ChatTurn:
        dropped_before = self.first
        ids, dropped = self._window(options.max_new_tokens)
        notice = None
        if dropped:
            notice = (f"{dropped} earlier message{'s' if dropped != 1 else ''} left the "
                      f"model's view to fit its context of {self.context_length} tokens")
        keep = self.lm.prepare(ids)
        reuse_note = self.reuse_note
        info = {"reused": keep, "new_tokens": len(ids) - keep, "dropped": dropped,
                "newly_dropped": dropped - dropped_before, "notice": notice,
                "reuse_note": reuse_note}

        pieces, generated = [], []

        def forward(kind, payload):
            if kind == "prompt":
                payload = dict(payload, **info)
            elif kind == "token":
                pieces.append(payload["text"])
                if payload["id"] is not None:
                    generated.append(payload["id"])
            return None if on_event is None else on_event(kind, payload)

        try:
            result = generate(self.lm, self.tokenizer, ids, _without_bos(options),
                              on_event=forward)
        except (Cancelled, KeyboardInterrupt):
            # Stopped by the user: what was said so far stays as the answer (the cache keeps
            # what it holds; the next turn's prepare rolls back whatever does not match).
            text = "".join(pieces)
            self.messages.append({"role": "assistant", "content": text})
            return ChatTurn(text, generated, len(ids), keep, len(ids) - keep, dropped, notice,
                            reuse_note=reuse_note)
        self.messages.append({"role": "assistant", "content": result.text})
        return ChatTurn(result.text, list(result.token_ids), len(ids), keep, len(ids) - keep,
                        dropped, notice, result, reuse_note)


def _without_bos(options: GenerationOptions) -> GenerationOptions:
    from dataclasses import replace

    return options if not options.add_special_tokens else replace(options,
                                                                  add_special_tokens=False)
