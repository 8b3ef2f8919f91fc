"""Normalizers of the HF tokenizer.json format: text -> text, applied before pre-tokenization.

Each class mirrors one `"type"` of the `normalizer` field. Character-level behaviour follows the
Rust implementation: lowercasing is per character (no final-sigma context, unlike `str.lower`),
"whitespace" is the Unicode White_Space property, "control" is any category C*.
"""

from __future__ import annotations

import unicodedata

from ..core.errors import FormatError, UnsupportedError
from .byte_level import bytes_to_unicode_text
from .fields import SOURCE, Fields, as_string, check_nesting, describe, sequence_steps
from .normalizer_base import Normalizer
from .precompiled import PrecompiledNormalizer
from .unicode_classes import compile_pattern, is_whitespace, legacy_flip_set


def lowercase_per_char(text: str) -> str:
    # str.lower() on the whole string turns a word-final capital sigma into 'ς'; Rust's
    # char::to_lowercase (what HF uses) has no context and always gives 'σ'.
    if text.isascii():
        return text.lower()
    return "".join([char.lower() for char in text])


def unicode_normalize(form: str, text: str) -> str:
    """unicodedata.normalize, except that characters HF's normalization tables do not know
    (assigned in recent Unicode versions) are left as they are, as HF does."""
    if text.isascii():
        return text
    unknown = legacy_flip_set("NORMALIZATION_UNKNOWN")
    if not any(char in unknown for char in text):
        return unicodedata.normalize(form, text)
    pieces = []
    segment_start = 0
    for index, char in enumerate(text):
        if char in unknown:
            pieces.append(unicodedata.normalize(form, text[segment_start:index]))
            pieces.append(char)
            segment_start = index + 1
    pieces.append(unicodedata.normalize(form, text[segment_start:]))
    return "".join(pieces)


class UnicodeNormalizer(Normalizer):
    def __init__(self, form: str):
        self.form = form

    def normalize(self, text: str) -> str:
        return unicode_normalize(self.form, text)


class Lowercase(Normalizer):
    def normalize(self, text: str) -> str:
        return lowercase_per_char(text)


def strip_marks(text: str, categories: tuple, flipped: frozenset) -> str:
    """Drop characters whose category is in `categories` (answer flipped on `flipped`)."""
    return "".join([char for char in text
                    if (unicodedata.category(char) in categories) == (char in flipped)])


class StripAccents(Normalizer):
    """Removes every combining mark (Mn, Mc, Me); usually placed after NFD/NFKD."""

    def drops_leading(self, text):
        return bool(text) and not self.normalize(text[0])

    def normalize(self, text: str) -> str:
        if text.isascii():
            return text
        return strip_marks(text, ("Mn", "Mc", "Me"), legacy_flip_set("COMBINING_MARK_FLIP"))


class Strip(Normalizer):
    def __init__(self, strip_left: bool = True, strip_right: bool = True):
        self.strip_left = strip_left
        self.strip_right = strip_right

    def normalize(self, text: str) -> str:
        start = 0
        stop = len(text)
        if self.strip_left:
            while start < stop and is_whitespace(text[start]):
                start += 1
        if self.strip_right:
            while stop > start and is_whitespace(text[stop - 1]):
                stop -= 1
        return text[start:stop]

    def drops_leading(self, text):
        return self.strip_left and bool(text) and is_whitespace(text[0])


class Replace(Normalizer):
    def __init__(self, pattern: dict, content: str, where: str = "normalizer.pattern"):
        self.regex = compile_split_pattern(pattern, where)
        self.content = content

    def normalize(self, text: str) -> str:
        # A lambda so that backslashes in `content` are taken literally.
        return self.regex.sub(lambda _match: self.content, text)


class Prepend(Normalizer):
    def __init__(self, prepend: str):
        self.prepend = prepend

    def normalize(self, text: str) -> str:
        return self.prepend + text if text else text


# BERT's notion of a CJK ideograph: these ranges get spaces around them.
CHINESE_CHAR_RANGES = (
    (0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
    (0x2B740, 0x2B81F), (0x2B920, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F),
)
REPLACEMENT_CHARACTER = "\ufffd"
# What BERT's clean_text removes: control, format, private use (and surrogates).
CLEANED_CATEGORIES = ("Cc", "Cf", "Co", "Cs")


def is_chinese_char(char: str) -> bool:
    code_point = ord(char)
    for first, last in CHINESE_CHAR_RANGES:
        if first <= code_point <= last:
            return True
    return False


class BertNormalizer(Normalizer):
    def __init__(self, clean_text=True, handle_chinese_chars=True, strip_accents=None,
                 lowercase=True):
        self.clean_text = clean_text
        self.handle_chinese_chars = handle_chinese_chars
        # null means "strip accents when lowercasing", as in the original BERT.
        self.strip_accents = lowercase if strip_accents is None else strip_accents
        self.lowercase = lowercase

    def normalize(self, text: str) -> str:
        if self.clean_text:
            text = self._clean(text)
        if self.handle_chinese_chars and not text.isascii():
            text = "".join([f" {char} " if is_chinese_char(char) else char for char in text])
        if self.strip_accents and not text.isascii():
            text = strip_marks(unicode_normalize("NFD", text), ("Mn",),
                               legacy_flip_set("BERT_NONSPACING_MARK_FLIP"))
        if self.lowercase:
            text = lowercase_per_char(text)
        return text

    def drops_leading(self, text):
        return self.clean_text and bool(text) and not self._clean(text[0])

    @staticmethod
    def _clean(text: str) -> str:
        """Drop NUL, U+FFFD and control/format/private-use characters; whitespace -> ' '.
        Unassigned code points (Cn) are kept, as HF does."""
        flipped = legacy_flip_set("CLEAN_TEXT_FLIP")
        kept = []
        for char in text:
            if char in "\t\n\r":
                kept.append(" ")
                continue
            removed = (char == "\0" or char == REPLACEMENT_CHARACTER
                       or unicodedata.category(char) in CLEANED_CATEGORIES)
            if removed != (char in flipped):
                continue
            kept.append(" " if is_whitespace(char) else char)
        return "".join(kept)


# Characters SentencePiece's NMT normalization removes or maps to a space.
NMT_REMOVED = frozenset(chr(cp) for cp in (*range(0x01, 0x09), 0x0B, *range(0x0E, 0x20),
                                           0x7F, 0x8F, 0x9F))
NMT_TO_SPACE = frozenset(chr(cp) for cp in (0x09, 0x0A, 0x0C, 0x0D, 0x1680,
                                            *range(0x200B, 0x2010), 0x2028, 0x2029, 0x2581,
                                            0xFEFF, 0xFFFD))


class Nmt(Normalizer):
    def drops_leading(self, text):
        return bool(text) and text[0] in NMT_REMOVED

    def normalize(self, text: str) -> str:
        return "".join([" " if char in NMT_TO_SPACE else char
                        for char in text if char not in NMT_REMOVED])


class ByteLevelNormalizer(Normalizer):
    def normalize(self, text: str) -> str:
        return bytes_to_unicode_text(text)


class Sequence(Normalizer):
    def __init__(self, normalizers: list):
        self.normalizers = normalizers

    def normalize(self, text: str) -> str:
        for normalizer in self.normalizers:
            text = normalizer.normalize(text)
        return text

    def normalize_keeping_origin(self, text: str) -> tuple:
        at_origin = True
        for normalizer in self.normalizers:
            text, kept = normalizer.normalize_keeping_origin(text)
            at_origin = at_origin and kept
        return text, at_origin


def compile_split_pattern(pattern, field: str):
    """A `{"String": s}` or `{"Regex": r}` pattern object -> compiled Python regex.

    Regexes from files are checked for catastrophic backtracking before they are compiled."""
    import re
    if not isinstance(pattern, dict) or len(pattern) != 1:
        raise FormatError(f"{SOURCE} {field}: expected {{\"String\": ...}} or "
                          f"{{\"Regex\": ...}}, got {describe(pattern)}")
    (kind, value), = pattern.items()
    as_string(value, f"{field}.{kind}")
    if kind == "String":
        return re.compile(re.escape(value))
    if kind == "Regex":
        return compile_pattern(value, f"{SOURCE} {field}.Regex")
    raise FormatError(f"{SOURCE} {field}: unknown pattern kind {describe(kind)} (expected "
                      f"String or Regex)")


def _sequence(fields: Fields, depth: int) -> Sequence:
    return Sequence(sequence_steps(fields, "normalizers", normalizer_from_config, depth))


def _strip(fields: Fields) -> Strip:
    return Strip(fields.boolean("strip_left", True), fields.boolean("strip_right", True))


def _replace(fields: Fields) -> Replace:
    return Replace(fields.get("pattern"), fields.string("content"), fields.path("pattern"))


def _bert(fields: Fields) -> BertNormalizer:
    return BertNormalizer(fields.boolean("clean_text", True),
                          fields.boolean("handle_chinese_chars", True),
                          fields.boolean("strip_accents", None),
                          fields.boolean("lowercase", True))


def _precompiled(fields: Fields):
    return PrecompiledNormalizer.from_config(fields.config, fields.where)


# type -> builder(fields); the Unicode forms and Sequence are handled apart.
BUILDERS = {
    "Lowercase": lambda fields: Lowercase(),
    "StripAccents": lambda fields: StripAccents(),
    "Strip": _strip,
    "Replace": _replace,
    "Prepend": lambda fields: Prepend(fields.string("prepend")),
    "BertNormalizer": _bert,
    "Nmt": lambda fields: Nmt(),
    "ByteLevel": lambda fields: ByteLevelNormalizer(),
    "Precompiled": _precompiled,
}


def normalizer_from_config(config, where: str = "normalizer", depth: int = 0):
    if config is None:
        return None
    check_nesting(depth, where)
    fields = Fields(config, where)
    kind = fields.string("type")
    if kind in ("NFC", "NFD", "NFKC", "NFKD"):
        return UnicodeNormalizer(kind)
    if kind == "Sequence":
        return _sequence(fields, depth)
    if kind in BUILDERS:
        return BUILDERS[kind](fields)
    raise UnsupportedError(f"{SOURCE} {where}: unknown normalizer type {describe(kind)}")
