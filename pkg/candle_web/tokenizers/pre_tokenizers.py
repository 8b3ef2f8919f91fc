"""Pre-tokenizers of the HF tokenizer.json format: cut normalized text into words.

A piece of text travels as `(text, at_origin)`: `at_origin` says whether the piece starts at
offset 0 of the original input (Metaspace's prepend_scheme "first" needs exactly that).
Splitting follows HF's `SplitDelimiterBehavior` on a list of (start, stop, is_match) spans.
"""

from __future__ import annotations

from ..core.errors import FormatError, UnsupportedError
from .byte_level import bytes_to_unicode_text
from .fields import SOURCE, Fields, check_nesting, describe, sequence_steps
from .normalizers import compile_split_pattern
from .unicode_classes import compile_pattern, is_numeric, is_punctuation, is_whitespace

GPT2_PATTERN = (r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+"
                r"|\s+(?!\S)|\s+")
# Rust regex crate pattern of the Whitespace pre-tokenizer (word runs or symbol runs).
WHITESPACE_PATTERN = r"\w+|[^\w\s]+"

BEHAVIORS = ("Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous")


def regex_spans(regex, text: str) -> list:
    """(start, stop, is_match) spans covering `text`, like HF's Pattern::find_matches."""
    if not text:
        return [(0, 0, False)]
    spans = []
    previous = 0
    for match in regex.finditer(text):
        start, stop = match.span()
        if previous != start:
            spans.append((previous, start, False))
        spans.append((start, stop, True))
        previous = stop
    if previous != len(text):
        spans.append((previous, len(text), False))
    return spans


def predicate_spans(predicate, text: str) -> list:
    """Spans where each character satisfying `predicate` is its own match."""
    if not text:
        return [(0, 0, False)]
    spans = []
    last = 0
    for index, char in enumerate(text):
        if predicate(char):
            if last < index:
                spans.append((last, index, False))
            spans.append((index, index + 1, True))
            last = index + 1
    if last < len(text):
        spans.append((last, len(text), False))
    return spans


def invert_spans(spans: list) -> list:
    return [(start, stop, not is_match) for start, stop, is_match in spans]


def apply_behavior(spans: list, behavior: str) -> list:
    """Turn match spans into (start, stop) pieces to keep, according to `behavior`."""
    if behavior == "Isolated":
        return [(start, stop) for start, stop, _ in spans]
    if behavior == "Removed":
        return [(start, stop) for start, stop, is_match in spans if not is_match]
    if behavior == "Contiguous":
        pieces = []
        previous_match = False
        for start, stop, is_match in spans:
            if pieces and is_match == previous_match:
                pieces[-1] = (pieces[-1][0], stop)
            else:
                pieces.append((start, stop))
            previous_match = is_match
        return pieces
    if behavior == "MergedWithPrevious":
        pieces = []
        previous_match = False
        for start, stop, is_match in spans:
            if is_match and not previous_match and pieces:
                pieces[-1] = (pieces[-1][0], stop)
            else:
                pieces.append((start, stop))
            previous_match = is_match
        return pieces
    if behavior == "MergedWithNext":
        pieces = []
        previous_match = False
        for start, stop, is_match in reversed(spans):
            if is_match and not previous_match and pieces:
                pieces[-1] = (start, pieces[-1][1])
            else:
                pieces.append((start, stop))
            previous_match = is_match
        pieces.reverse()
        return pieces
    raise FormatError(f"unknown split behavior {behavior!r} (expected one of {BEHAVIORS})")


def cut(text: str, at_origin: bool, pieces: list) -> list:
    """Slice `text` into non-empty pieces; only a piece starting at 0 keeps `at_origin`."""
    return [(text[start:stop], at_origin and start == 0) for start, stop in pieces
            if stop > start]


class PreTokenizer:
    def split(self, text: str, at_origin: bool) -> list:
        raise NotImplementedError

    def pre_tokenize(self, pieces: list) -> list:
        result = []
        for text, at_origin in pieces:
            result.extend(self.split(text, at_origin))
        return result

    def pre_tokenize_str(self, text: str) -> list:
        return [piece for piece, _ in self.pre_tokenize([(text, True)])]


class ByteLevel(PreTokenizer):
    def __init__(self, add_prefix_space: bool = True, use_regex: bool = True):
        self.add_prefix_space = add_prefix_space
        self.use_regex = use_regex
        self.regex = compile_pattern(GPT2_PATTERN) if use_regex else None

    def split(self, text, at_origin):
        if self.add_prefix_space and not text.startswith(" "):
            text = " " + text
        if self.use_regex:
            # Isolated: every span is kept; findall + gaps equals regex_spans here.
            words = cut(text, at_origin, apply_behavior(regex_spans(self.regex, text),
                                                        "Isolated"))
        else:
            words = [(text, at_origin)] if text else []
        return [(bytes_to_unicode_text(word), origin) for word, origin in words]


class Split(PreTokenizer):
    def __init__(self, pattern, behavior: str, invert: bool = False,
                 where: str = "pre_tokenizer"):
        self.regex = compile_split_pattern(pattern, f"{where}.pattern")
        if behavior not in BEHAVIORS:
            raise FormatError(f"{SOURCE} {where}.behavior: unknown value {describe(behavior)}")
        self.behavior = behavior
        self.invert = invert

    def split(self, text, at_origin):
        spans = regex_spans(self.regex, text)
        if self.invert:
            spans = invert_spans(spans)
        return cut(text, at_origin, apply_behavior(spans, self.behavior))


class PredicateSplit(PreTokenizer):
    """Split on characters that satisfy a predicate, with a given behavior."""

    def __init__(self, predicate, behavior: str):
        self.predicate = predicate
        self.behavior = behavior

    def split(self, text, at_origin):
        return cut(text, at_origin, apply_behavior(predicate_spans(self.predicate, text),
                                                   self.behavior))


class Whitespace(PreTokenizer):
    def __init__(self):
        self.regex = compile_pattern(WHITESPACE_PATTERN)

    def split(self, text, at_origin):
        spans = invert_spans(regex_spans(self.regex, text))
        return cut(text, at_origin, apply_behavior(spans, "Removed"))


def whitespace_split() -> PreTokenizer:
    return PredicateSplit(is_whitespace, "Removed")


class BertPreTokenizer(PreTokenizer):
    def __init__(self):
        self.on_space = PredicateSplit(is_whitespace, "Removed")
        self.on_punctuation = PredicateSplit(is_punctuation, "Isolated")

    def split(self, text, at_origin):
        return self.on_punctuation.pre_tokenize(self.on_space.split(text, at_origin))


class Metaspace(PreTokenizer):
    def __init__(self, replacement: str = "\u2581", prepend_scheme: str = "always",
                 split: bool = True):
        self.replacement = replacement
        self.prepend_scheme = prepend_scheme
        self.split_words = split

    def split(self, text, at_origin):
        text = text.replace(" ", self.replacement)
        prepend = (self.prepend_scheme == "always"
                   or (self.prepend_scheme == "first" and at_origin))
        if prepend and not text.startswith(self.replacement):
            text = self.replacement + text
        if not self.split_words:
            return [(text, at_origin)] if text else []
        spans = predicate_spans(lambda char: char == self.replacement, text)
        return cut(text, at_origin, apply_behavior(spans, "MergedWithNext"))


class Sequence(PreTokenizer):
    def __init__(self, pre_tokenizers: list):
        self.pre_tokenizers = pre_tokenizers

    def pre_tokenize(self, pieces):
        for pre_tokenizer in self.pre_tokenizers:
            pieces = pre_tokenizer.pre_tokenize(pieces)
        return pieces

    def split(self, text, at_origin):
        return self.pre_tokenize([(text, at_origin)])


def _metaspace_from_config(config: dict, where: str) -> Metaspace:
    fields = Fields(config, where)
    replacement = fields.string("replacement", "\u2581")
    if len(replacement) != 1:
        raise FormatError(f"{SOURCE} {where}.replacement: expected one character, got "
                          f"{describe(replacement)}")
    scheme = fields.choice("prepend_scheme", ("first", "always", "never"), None)
    add_prefix_space = fields.boolean("add_prefix_space", None)
    if scheme is None:
        # Files from before prepend_scheme existed only had add_prefix_space.
        scheme = "never" if add_prefix_space is False else "always"
    elif add_prefix_space is False and scheme != "never":
        raise FormatError(f"{SOURCE} {where}: add_prefix_space does not match "
                          f"prepend_scheme {scheme!r}")
    return Metaspace(replacement, scheme, fields.boolean("split", True))


def _split(fields: Fields) -> Split:
    return Split(fields.get("pattern"), fields.choice("behavior", BEHAVIORS),
                 fields.boolean("invert", False), fields.where)


def _byte_level(fields: Fields) -> ByteLevel:
    return ByteLevel(fields.boolean("add_prefix_space", True), fields.boolean("use_regex", True))


def _digits(fields: Fields) -> PredicateSplit:
    individual = fields.boolean("individual_digits", False)
    return PredicateSplit(is_numeric, "Isolated" if individual else "Contiguous")


def _punctuation(fields: Fields) -> PredicateSplit:
    return PredicateSplit(is_punctuation, fields.choice("behavior", BEHAVIORS, "Isolated"))


def _sequence(fields: Fields, depth: int) -> Sequence:
    return Sequence(sequence_steps(fields, "pretokenizers", pre_tokenizer_from_config, depth))


# type -> builder(fields); Sequence is handled apart (it recurses).
BUILDERS = {
    "ByteLevel": _byte_level,
    "Split": _split,
    "Whitespace": lambda fields: Whitespace(),
    "WhitespaceSplit": lambda fields: whitespace_split(),
    "BertPreTokenizer": lambda fields: BertPreTokenizer(),
    "Punctuation": _punctuation,
    "Digits": _digits,
    "Metaspace": lambda fields: _metaspace_from_config(fields.config, fields.where),
}


def pre_tokenizer_from_config(config, where: str = "pre_tokenizer", depth: int = 0):
    if config is None:
        return None
    check_nesting(depth, where)
    fields = Fields(config, where)
    kind = fields.string("type")
    if kind == "Sequence":
        return _sequence(fields, depth)
    if kind in BUILDERS:
        return BUILDERS[kind](fields)
    raise UnsupportedError(f"{SOURCE} {where}: unknown pre-tokenizer type {describe(kind)}")
