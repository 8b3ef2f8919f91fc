"""SentencePiece's "Precompiled" normalizer (T5, ALBERT, XLM-R, mT5... tokenizer.json files).

`precompiled_charsmap` (base64) is SentencePiece's compiled normalization rule set:

    u32 little-endian   trie size in bytes (a multiple of 4)
    u32[size / 4]       a Darts-clone double-array trie over UTF-8 bytes; each leaf's value
                        is a byte offset into the string pool
    bytes               the string pool: NUL-terminated UTF-8 replacement strings

Semantics follow HF `tokenizers` (crate spm_precompiled), which differ from SentencePiece's
own longest-match walk and must be reproduced exactly to get the same ids:
- the text is cut into extended grapheme clusters (`graphemes.py`);
- a cluster shorter than 6 UTF-8 bytes whose bytes start with a trie key is replaced *whole*
  by the value of the *shortest* such key (so "Ａ" + U+0301 becomes "A": the mark is lost);
- otherwise each character is looked up alone, again by its shortest key prefix, and kept
  when no key matches;
- a lookup stops at a NUL byte, so NUL never matches.
"""

from __future__ import annotations

import base64
import binascii
import struct
import sys
from array import array

from ..core.errors import FormatError, check_text
from .graphemes import cluster_spans
from .normalizer_base import Normalizer

# A grapheme is looked up as a whole only below this many UTF-8 bytes (HF's rule).
WHOLE_GRAPHEME_MAX_BYTES = 5
TRIE_SIZE_BYTES = 4
UNIT_BYTES = 4

# Bit layout of a double-array unit (Darts-clone).
LEAF_FLAG_SHIFT = 8
OFFSET_SHIFT = 10
OFFSET_EXTENDED_FLAG = 1 << 9
VALUE_MASK = (1 << 31) - 1
LABEL_MASK = (1 << 31) | 0xFF


def _unit_offset(unit: int) -> int:
    # A unit stores its child offset in the top 22 bits, scaled by 256 when bit 9 is set.
    return (unit >> OFFSET_SHIFT) << ((unit & OFFSET_EXTENDED_FLAG) >> 6)


class DoubleArrayTrie:
    """A read-only Darts-clone double array: `units` are u32 values."""

    def __init__(self, units, where: str):
        if not units:
            raise FormatError(f"{where}: the trie is empty (size 0)")
        self.units = units
        self.where = where

    def _unit(self, position: int) -> int:
        if position >= len(self.units):
            raise FormatError(f"{self.where}: trie walk reached unit {position}, past the end "
                              f"of the {len(self.units)}-unit trie")
        return self.units[position]

    def shortest_prefix_value(self, key: bytes):
        """Value of the shortest key in the trie that is a prefix of `key`, else None."""
        position = _unit_offset(self._unit(0))
        for byte in key:
            if byte == 0:
                return None
            position ^= byte
            unit = self._unit(position)
            if unit & LABEL_MASK != byte:
                return None
            position ^= _unit_offset(unit)
            if (unit >> LEAF_FLAG_SHIFT) & 1:
                return self._unit(position) & VALUE_MASK
        return None


def decode_charsmap(encoded, where: str) -> bytes:
    if not isinstance(encoded, str):
        raise FormatError(f"{where}.precompiled_charsmap: expected a base64 string, got "
                          f"{type(encoded).__name__}")
    try:
        return base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise FormatError(f"{where}.precompiled_charsmap: invalid base64 ({exc})") from None


def parse_charsmap(blob: bytes, where: str) -> tuple:
    """(trie units, string pool) from the binary charsmap, sizes checked before any copy."""
    if len(blob) < TRIE_SIZE_BYTES:
        raise FormatError(f"{where}.precompiled_charsmap: {len(blob)} bytes, too short for "
                          f"the {TRIE_SIZE_BYTES}-byte trie size header")
    (trie_bytes,) = struct.unpack_from("<I", blob, 0)
    available = len(blob) - TRIE_SIZE_BYTES
    if trie_bytes > available:
        raise FormatError(f"{where}.precompiled_charsmap: header says the trie has "
                          f"{trie_bytes} bytes but only {available} follow")
    # HF reads size // 4 units; a ragged size would leave bytes that belong to neither part.
    if trie_bytes % UNIT_BYTES:
        raise FormatError(f"{where}.precompiled_charsmap: trie size {trie_bytes} is not a "
                          f"multiple of {UNIT_BYTES}")
    units = array("I")
    if units.itemsize != UNIT_BYTES:
        units = array("L")
    units.frombytes(blob[TRIE_SIZE_BYTES:TRIE_SIZE_BYTES + trie_bytes])
    if sys.byteorder != "little":
        units.byteswap()
    pool = blob[TRIE_SIZE_BYTES + trie_bytes:]
    try:
        pool.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FormatError(f"{where}.precompiled_charsmap: the replacement strings are not "
                          f"UTF-8 ({exc})") from None
    return units, pool


class PrecompiledNormalizer(Normalizer):
    def __init__(self, blob: bytes, where: str = "normalizer"):
        self.where = where
        units, self.pool = parse_charsmap(blob, where)
        self.trie = DoubleArrayTrie(units, f"{where}.precompiled_charsmap")
        # Lookups repeat a lot (the same characters over and over): remember them.
        self._replacements: dict = {}
        self._character_table = _CharacterTable(self)
        # Walk the ASCII range now: a trie that cannot be walked fails at load, not later.
        "".join(map(chr, range(128))).translate(self._character_table)

    @classmethod
    def from_config(cls, config: dict, where: str):
        return cls(decode_charsmap(config.get("precompiled_charsmap"), where), where)

    def _pool_string(self, offset: int) -> str:
        if offset > len(self.pool):
            raise FormatError(f"{self.where}.precompiled_charsmap: replacement offset {offset} "
                              f"is past the end of the {len(self.pool)}-byte string pool")
        stop = self.pool.find(b"\0", offset)
        if stop < 0:
            stop = len(self.pool)
        try:
            return self.pool[offset:stop].decode("utf-8")
        except UnicodeDecodeError:
            raise FormatError(f"{self.where}.precompiled_charsmap: replacement offset {offset} "
                              f"is not at a character boundary") from None

    def transform(self, piece: str):
        """Replacement of the shortest trie key prefixing `piece`, or None."""
        try:
            return self._replacements[piece]
        except KeyError:
            pass
        try:
            key = piece.encode("utf-8")
        except UnicodeEncodeError:
            # Tokenizer.encode refuses lone surrogates first; a direct caller gets the same.
            check_text(piece, f"{self.where}: text")
            raise
        value = self.trie.shortest_prefix_value(key)
        replacement = None if value is None else self._pool_string(value)
        self._replacements[piece] = replacement
        return replacement

    def normalize(self, text: str) -> str:
        table = self._character_table
        pieces = []
        position = 0
        # Characters outside multi-character graphemes are looked up one by one (translate).
        for start, stop in cluster_spans(text):
            pieces.append(text[position:start].translate(table))
            grapheme = text[start:stop]
            replacement = None
            if len(grapheme.encode("utf-8")) <= WHOLE_GRAPHEME_MAX_BYTES:
                replacement = self.transform(grapheme)
            pieces.append(grapheme.translate(table) if replacement is None else replacement)
            position = stop
        pieces.append(text[position:].translate(table))
        return "".join(pieces)


class _CharacterTable(dict):
    """The `str.translate` table of single characters: code point -> replacement, or the
    code point itself when no key prefixes it. Filled on first sight of each character, so
    translate runs at C speed once the text's characters are known."""

    def __init__(self, normalizer: PrecompiledNormalizer):
        super().__init__()
        self.normalizer = normalizer

    def __missing__(self, code_point: int):
        replacement = self.normalizer.transform(chr(code_point))
        value = code_point if replacement is None else replacement
        self[code_point] = value
        return value
