"""SentencePiece "Precompiled" normalizer (T5 / Unigram files carry a precompiled charsmap).

Not implemented yet: the charsmap is a serialized double-array trie plus grapheme-level rules,
and a partial version would silently give different ids. Loading such a file fails clearly.
"""

from __future__ import annotations

from ..errors import UnsupportedError


class PrecompiledNormalizer:
    @classmethod
    def from_config(cls, config: dict, where: str):
        size = len(config.get("precompiled_charsmap") or "")
        raise UnsupportedError(
            f"tokenizer.json {where}: the 'Precompiled' normalizer (SentencePiece charsmap, "
            f"{size} base64 chars) is not supported by the pure-Python tokenizer yet; use "
            f"Tokenizer.from_file(path, backend='hf') natively")
