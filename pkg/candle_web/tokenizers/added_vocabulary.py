"""Added and special tokens: matched in the text before the model sees it.

As in HF: tokens with `normalized: false` are searched in the raw text first; the remaining
pieces are normalized and then searched for the `normalized: true` tokens (whose content is
normalized the same way). Matching is leftmost-longest; `single_word`, `lstrip` and `rstrip`
use Unicode `\\w` and White_Space as Rust's regex crate defines them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .fields import Fields
from .unicode_classes import WHITE_SPACE, class_body


@dataclass(frozen=True)
class AddedToken:
    content: str
    single_word: bool = False
    lstrip: bool = False
    rstrip: bool = False
    normalized: bool = True
    special: bool = False

    @classmethod
    def from_config(cls, entry: dict, index: int) -> "AddedToken":
        fields = Fields(entry, f"added_tokens[{index}]")
        content = fields.string("content")
        # The id is HF's own check that the vocabulary did not move; ids are reassigned here
        # the way HF does, so it is only type-checked.
        fields.integer("id", None)
        special = fields.boolean("special", False)
        return cls(content, fields.boolean("single_word", False),
                   fields.boolean("lstrip", False), fields.boolean("rstrip", False),
                   fields.boolean("normalized", not special), special)


_WORD_CHAR = None


def _word_char_regex():
    global _WORD_CHAR
    if _WORD_CHAR is None:
        _WORD_CHAR = re.compile("[" + class_body("word") + "]")
    return _WORD_CHAR


class AddedVocabulary:
    def __init__(self):
        self.token_ids: dict = {}      # content -> id
        self.tokens_by_id: dict = {}   # id -> AddedToken
        self.normalized_content: dict = {}  # id -> content after the normalizer
        self.special_contents: set = set()
        self.encode_special_tokens = False
        self._raw_regex = None
        self._normalized_regex = None
        self._pattern_ids: tuple = ({}, {})

    def __len__(self) -> int:
        return len(self.token_ids)

    def add_tokens(self, tokens: list, model, normalizer) -> None:
        """Assign ids the way HF does: an existing id, else the next free one."""
        if self.tokens_by_id:
            highest = max(self.tokens_by_id)
            vocab_size = model.get_vocab_size()
            next_id = highest + 1 if highest >= vocab_size or vocab_size == 0 else vocab_size
        else:
            next_id = model.get_vocab_size()
        for token in tokens:
            if not token.content:
                continue
            existing = self.token_ids.get(token.content)
            if existing is not None and self.tokens_by_id.get(existing) == token:
                continue
            token_id = existing if existing is not None else model.token_to_id(token.content)
            if token_id is None:
                token_id = next_id
                next_id += 1
            if token.normalized and normalizer is not None:
                normalized = normalizer.normalize(token.content)
                if normalized != token.content:
                    self.normalized_content[token_id] = normalized
            self.token_ids[token.content] = token_id
            if token.special:
                self.special_contents.add(token.content)
            self.tokens_by_id[token_id] = token
        self._build_regexes()

    def _build_regexes(self) -> None:
        raw, normalized = {}, {}
        for token_id, token in self.tokens_by_id.items():
            if token.normalized:
                normalized[self.normalized_content.get(token_id, token.content)] = token_id
            else:
                raw[token.content] = token_id
        self._pattern_ids = (raw, normalized)
        self._raw_regex = self._alternation(raw)
        self._normalized_regex = self._alternation(normalized)

    @staticmethod
    def _alternation(patterns: dict):
        if not patterns:
            return None
        # Longest first: Python's alternation is leftmost-first, so at a given position the
        # longest literal wins, which is leftmost-longest matching.
        ordered = sorted(patterns, key=lambda content: (-len(content), content))
        return re.compile("|".join(re.escape(content) for content in ordered))

    def id_to_token(self, token_id: int):
        token = self.tokens_by_id.get(token_id)
        if token is None:
            return None
        return self.normalized_content.get(token_id, token.content)

    def is_special(self, content: str) -> bool:
        return content in self.special_contents

    def find_matches(self, text: str, normalized: bool) -> list:
        """[(start, stop, token id or None)] covering `text` (HF AddedVocabulary::find_matches)."""
        regex = self._normalized_regex if normalized else self._raw_regex
        if not text:
            return [(0, 0, None)]
        if regex is None:
            return [(0, len(text), None)]
        ids = self._pattern_ids[1 if normalized else 0]
        word_char = _word_char_regex()
        pieces = []
        consumed = 0
        for match in regex.finditer(text):
            start, stop = match.span()
            token_id = ids[match.group()]
            token = self.tokens_by_id[token_id]
            if self.encode_special_tokens and token.content in self.special_contents:
                continue
            if token.single_word:
                word_before = start > 0 and word_char.match(text, start - 1) is not None
                word_after = stop < len(text) and word_char.match(text, stop) is not None
                if word_before or word_after:
                    continue
            if token.lstrip:
                new_start = start
                while new_start > 0 and text[new_start - 1] in WHITE_SPACE:
                    new_start -= 1
                start = max(new_start, consumed)
            if token.rstrip:
                while stop < len(text) and text[stop] in WHITE_SPACE:
                    stop += 1
            if consumed < start:
                pieces.append((consumed, start, None))
            pieces.append((start, stop, token_id))
            consumed = stop
        if consumed != len(text):
            pieces.append((consumed, len(text), None))
        return pieces

    def extract_and_normalize(self, text: str, normalizer) -> list:
        """Split `text` into [(piece, at_origin, token id or None)], non-token pieces normalized.

        Empty pieces are dropped, as HF's PreTokenizedString::split does."""
        result = []
        for start, stop, token_id in self.find_matches(text, normalized=False):
            piece = text[start:stop]
            if not piece:
                continue
            if token_id is not None:
                result.append((piece, start == 0, token_id))
                continue
            at_origin = start == 0
            if normalizer is not None:
                normalized_piece, kept_origin = normalizer.normalize_keeping_origin(piece)
                at_origin = at_origin and kept_origin
            else:
                normalized_piece = piece
            for sub_start, sub_stop, sub_id in self.find_matches(normalized_piece,
                                                                 normalized=True):
                sub_piece = normalized_piece[sub_start:sub_stop]
                if sub_piece:
                    result.append((sub_piece, at_origin and sub_start == 0, sub_id))
        return result
