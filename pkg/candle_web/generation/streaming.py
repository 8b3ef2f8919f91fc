"""Streaming decoded text token by token without ever splitting a character.

Byte-level BPE (GPT-2 style) and SentencePiece byte-fallback tokens can end in the middle of
a UTF-8 sequence: an emoji is often 2-4 tokens. Decoding such a prefix yields U+FFFD
replacement characters, so `TokenOutputStream` (after Candle's) holds tokens back until their
text ends on a complete character, then emits only the new part.

It decodes a sliding window `ids[prev:]` and subtracts the text of `ids[prev:current]`, so
decoders that treat the first token specially (SentencePiece drops its leading space) only
ever affect the window's first token, which is context and already emitted. The emitted
pieces concatenate to `tokenizer.decode(all ids)`.
"""

from __future__ import annotations

REPLACEMENT_CHAR = "\ufffd"


class TokenOutputStream:
    def __init__(self, tokenizer, skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.tokens = []
        self.prev_index = 0  # start of the decode window (context, already emitted)
        self.current_index = 0  # end of what has been emitted

    def _decode(self, ids) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=self.skip_special_tokens)

    def next_token(self, token_id: int) -> str:
        """Add one token; returns the newly completed text ('' while a character is open)."""
        emitted = self._decode(self.tokens[self.prev_index:self.current_index])
        self.tokens.append(int(token_id))
        text = self._decode(self.tokens[self.prev_index:])
        if len(text) > len(emitted) and not text.endswith(REPLACEMENT_CHAR):
            self.prev_index = self.current_index
            self.current_index = len(self.tokens)
            return text[len(emitted):]
        return ""

    def finish(self) -> str:
        """Whatever is still held back (an unfinished character decodes as U+FFFD)."""
        emitted = self._decode(self.tokens[self.prev_index:self.current_index])
        text = self._decode(self.tokens[self.prev_index:])
        self.prev_index = self.current_index = len(self.tokens)
        return text[len(emitted):] if len(text) > len(emitted) else ""

    def decode_all(self) -> str:
        return self._decode(self.tokens)

    def clear(self) -> None:
        self.tokens = []
        self.prev_index = self.current_index = 0
