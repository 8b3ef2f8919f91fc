"""GPT-2's byte-level alphabet: every byte as a printable character, reversibly. Shared by the
ByteLevel pre-tokenizer and normalizer (bytes -> characters) and the ByteLevel decoder (back)."""

from __future__ import annotations

import functools

from ..core.errors import check_text


@functools.lru_cache(maxsize=1)
def byte_to_unicode() -> dict:
    """GPT-2's reversible byte -> printable character table."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD))
                 + list(range(0xAE, 0x100)))
    table = {byte: chr(byte) for byte in printable}
    shifted = 0
    for byte in range(256):
        if byte not in table:
            table[byte] = chr(256 + shifted)
            shifted += 1
    return table


@functools.lru_cache(maxsize=1)
def unicode_to_byte() -> dict:
    return {char: byte for byte, char in byte_to_unicode().items()}


@functools.lru_cache(maxsize=1)
def _byte_translation() -> list:
    table = byte_to_unicode()
    return [table[byte] for byte in range(256)]


def bytes_to_unicode_text(text: str) -> str:
    translation = _byte_translation()
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError:
        # Tokenizer.encode refuses lone surrogates first; a direct caller gets the same error.
        check_text(text, "ByteLevel: text")
        raise
    return "".join([translation[byte] for byte in data])
