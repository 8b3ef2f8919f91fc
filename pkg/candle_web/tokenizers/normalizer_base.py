"""The base class of normalizers: its own module so that the precompiled (SentencePiece)
normalizer and the rest of normalizers.py can both build on it without importing each other."""

from __future__ import annotations


class Normalizer:
    def normalize(self, text: str) -> str:
        raise NotImplementedError

    def normalize_keeping_origin(self, text: str) -> tuple:
        """(normalized text, whether its first character still comes from original offset 0).

        HF tracks alignments; the only use here is Metaspace's prepend_scheme "first", which
        needs to know whether leading characters were removed (Strip, clean_text...)."""
        normalized = self.normalize(text)
        return normalized, not self.drops_leading(text)

    def drops_leading(self, text: str) -> bool:
        return False
