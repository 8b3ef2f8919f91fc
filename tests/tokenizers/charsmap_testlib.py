"""Build SentencePiece `precompiled_charsmap` blobs from a {key: replacement} dict, for tests.

Writes the Darts-clone double-array layout that SentencePiece compiles its normalization rules
into (see candle_web/tokenizers/precompiled.py), so tests can feed the same hand-chosen rules
to HF `tokenizers` and to candle_web. Both read the bytes; this builder only has to produce a
valid trie, not SentencePiece's exact one.
"""

from __future__ import annotations

import struct

LEAF_FLAG = 1 << 8
VALUE_FLAG = 1 << 31
MAX_PLAIN_OFFSET = 1 << 21


def _string_pool(rules: dict) -> tuple[bytes, dict]:
    pool = bytearray()
    offsets = {}
    for replacement in sorted(set(rules.values())):
        offsets[replacement] = len(pool)
        pool += replacement.encode("utf-8") + b"\0"
    return bytes(pool), offsets


def _byte_tree(rules: dict, offsets: dict) -> dict:
    """Nested dicts by byte; the key None holds the pool offset of a key ending there."""
    root: dict = {}
    for key, replacement in rules.items():
        node = root
        for byte in key.encode("utf-8"):
            node = node.setdefault(byte, {})
        node[None] = offsets[replacement]
    return root


def build_charsmap(rules: dict) -> bytes:
    pool, offsets = _string_pool(rules)
    units: dict[int, int] = {0: 0}
    used_bases = set()

    def find_base(labels):
        # Distinct bases keep a walk from landing on another node's child with the same label.
        base = 1
        while base in used_bases or any((base ^ label) in units for label in labels):
            base += 1
        used_bases.add(base)
        return base

    pending = [(0, _byte_tree(rules, offsets))]
    while pending:
        position, node = pending.pop()
        labels = [0 if label is None else label for label in node]
        base = find_base(labels)
        offset = position ^ base
        assert offset < MAX_PLAIN_OFFSET, "test trie too large for plain offsets"
        # The parent unit keeps its label and leaf bit; add the offset to its children.
        units[position] |= offset << 10
        for label, child in node.items():
            if label is None:
                units[base] = child | VALUE_FLAG
                continue
            units[base ^ label] = label | (LEAF_FLAG if None in child else 0)
        # Every child gets a base, even one holding only a value (kept at its base ^ 0).
        pending += [(base ^ label, child) for label, child in node.items() if label is not None]
    # Pad so that a walk probing any byte from any base stays inside the array, as in
    # SentencePiece's tries (blocks of 256 units).
    size = (max(max(units), max(used_bases)) | 0xFF) + 1
    trie = b"".join(struct.pack("<I", units.get(index, 0)) for index in range(size))
    return struct.pack("<I", len(trie)) + trie + pool
