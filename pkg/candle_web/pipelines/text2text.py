"""Text in, text out with T5: the prompt (with its task prefix, e.g. "translate English to
German: ...") through the encoder, the answer from generation's decode loop, streamed through
the shared callback protocol (generation/decode_loop.py)."""

from __future__ import annotations

import warnings
from dataclasses import dataclass

from ..generation import STOP_EOS, STOP_MAX_TOKENS, GenerationOptions, Seq2SeqLM, generate
from ..models.t5 import DEFAULT_MAX_NEW_TOKENS, T5ForConditionalGeneration


@dataclass
class Text2TextResult:
    text: str
    token_ids: list  # as generated, the final eos included
    input_tokens: int
    truncated: bool  # the input was longer than the model's limit and was cut
    stop_reason: str = STOP_MAX_TOKENS


class T5TextGenerator:
    """A T5 model with its tokenizer: prompt in, text out."""

    def __init__(self, model: T5ForConditionalGeneration, tokenizer):
        self.model = model
        self.tokenizer = tokenizer
        # Padding in tokenizer.json would feed pad tokens into the encoder unmasked.
        if getattr(tokenizer, "padding", None) is not None:
            tokenizer.no_padding()

    def encode_prompt(self, prompt: str) -> tuple:
        """(ids, truncated): the prompt's ids (ending with </s>), cut to the model's limit."""
        if not isinstance(prompt, str):
            raise TypeError(f"t5 prompt: expected a str, got {type(prompt).__name__}")
        ids = list(self.tokenizer.encode(prompt).ids)
        if not ids:
            ids = [self.model.config.eos_token_id]
        limit = self.model.config.max_input_tokens
        if len(ids) <= limit:
            return ids, False
        warnings.warn(f"t5: the input has {len(ids)} tokens, more than the model's limit of "
                      f"{limit}; it was truncated to the first {limit}", stacklevel=3)
        ends_with_eos = ids[-1] == self.model.config.eos_token_id
        kept = ids[:limit - 1] + [ids[-1]] if ends_with_eos else ids[:limit]
        return kept, True

    def __call__(self, prompt: str, options: GenerationOptions = None,
                 on_event=None) -> Text2TextResult:
        """on_event(kind, payload) as in generation.generate ("prompt", "token", "done");
        returning False (or raising Cancelled) cancels."""
        options = options or GenerationOptions(max_new_tokens=DEFAULT_MAX_NEW_TOKENS)
        ids, truncated = self.encode_prompt(prompt)
        result = generate(Seq2SeqLM(self.model), self.tokenizer, ids, options, on_event)
        token_ids = list(result.token_ids)
        if result.stop_reason == STOP_EOS:
            token_ids.append(result.end_token)
        return Text2TextResult(result.text, token_ids, len(ids), truncated, result.stop_reason)


__all__ = ["T5TextGenerator", "Text2TextResult"]
