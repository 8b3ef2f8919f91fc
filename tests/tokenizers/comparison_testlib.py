"""Helpers comparing candle_web tokenizers with HF `tokenizers`, field by field."""

from __future__ import annotations

from tests.tokenizers.corpus_testlib import build_corpus

FIELDS = ("ids", "tokens", "type_ids", "attention_mask", "special_tokens_mask")
MAX_REPORTED = 5


def encoding_fields(encoding) -> tuple:
    return tuple(list(getattr(encoding, name)) for name in FIELDS)


def differences(mine, reference, corpus, decode: bool = True) -> list:
    """Every (text, what) where the two tokenizers disagree: encodings with and without
    special tokens, and decoding of the reference ids with and without skipping specials."""
    found = []
    for text in corpus:
        for add_special in (True, False):
            ours = mine.encode(text, add_special_tokens=add_special)
            theirs = reference.encode(text, add_special_tokens=add_special)
            if encoding_fields(ours) != encoding_fields(theirs):
                found.append((text, f"encode(add_special_tokens={add_special})",
                              ours.ids[:40], theirs.ids[:40]))
                continue
            if not decode:
                continue
            for skip in (True, False):
                decoded = mine.decode(theirs.ids, skip_special_tokens=skip)
                expected = reference.decode(theirs.ids, skip_special_tokens=skip)
                if decoded != expected:
                    found.append((text, f"decode(skip_special_tokens={skip})", decoded,
                                  expected))
    return found


def report(found: list) -> str:
    lines = [f"{len(found)} differences; first ones:"]
    for text, what, ours, theirs in found[:MAX_REPORTED]:
        lines.append(f"  {what} on {text!r}:\n    ours   {ours!r}\n    theirs {theirs!r}")
    return "\n".join(lines)


def corpus_for(special_tokens=(), random_count: int = 1500, seed: int = 0) -> list:
    return build_corpus(seed=seed, random_count=random_count, special_tokens=special_tokens)
