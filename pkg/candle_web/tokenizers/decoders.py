"""Decoders of the HF tokenizer.json format: a list of token strings -> text.

Like HF, each decoder is a `decode_chain(tokens) -> tokens` step; the final text is the
concatenation of what the last step returns.
"""

from __future__ import annotations

import re

from ..core.errors import FormatError, UnsupportedError
from .fields import MAX_COUNT, SOURCE, Fields, check_nesting, describe, sequence_steps
from .normalizers import compile_split_pattern
from .byte_level import unicode_to_byte

BYTE_TOKEN = re.compile(r"<0x\+?[0-9A-Fa-f]{1,2}>")
REPLACEMENT_CHARACTER = "\ufffd"

# WordPiece's "cleanup": undo the spaces BERT-style tokenization put before punctuation.
CLEANUP_REPLACEMENTS = (
    (" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
    (" 'm", "'m"), (" do not", " don't"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re"),
)


def cleanup(text: str) -> str:
    for old, new in CLEANUP_REPLACEMENTS:
        text = text.replace(old, new)
    return text


class Decoder:
    def decode_chain(self, tokens: list) -> list:
        raise NotImplementedError

    def decode(self, tokens: list) -> str:
        return "".join(self.decode_chain(list(tokens)))


class ByteLevel(Decoder):
    def decode_chain(self, tokens):
        table = unicode_to_byte()
        data = bytearray()
        for token in tokens:
            try:
                data.extend([table[char] for char in token])
            except KeyError:
                # A token outside the byte alphabet (an added token) is taken as UTF-8.
                data.extend(token.encode("utf-8"))
        return [data.decode("utf-8", errors="replace")]


class Metaspace(Decoder):
    def __init__(self, replacement="\u2581", prepend_scheme="always"):
        self.replacement = replacement
        self.prepend_scheme = prepend_scheme

    def decode_chain(self, tokens):
        result = []
        for index, token in enumerate(tokens):
            if index == 0 and self.prepend_scheme != "never":
                token = token.replace(self.replacement, "")
            else:
                token = token.replace(self.replacement, " ")
            result.append(token)
        return result


class WordPiece(Decoder):
    def __init__(self, prefix="##", cleanup_text=True):
        self.prefix = prefix
        self.cleanup_text = cleanup_text

    def decode_chain(self, tokens):
        result = []
        for index, token in enumerate(tokens):
            if index != 0:
                if token.startswith(self.prefix):
                    token = token[len(self.prefix):]
                else:
                    token = " " + token
            if self.cleanup_text:
                token = cleanup(token)
            result.append(token)
        return result


class ByteFallback(Decoder):
    def decode_chain(self, tokens):
        result = []
        pending = bytearray()

        def flush():
            try:
                result.append(pending.decode("utf-8"))
            except UnicodeDecodeError:
                # HF emits one replacement character per byte of an invalid run.
                result.extend([REPLACEMENT_CHARACTER] * len(pending))
            pending.clear()

        for token in tokens:
            if len(token.encode("utf-8")) == 6 and BYTE_TOKEN.fullmatch(token):
                pending.append(int(token[3:5], 16))
                continue
            if pending:
                flush()
            result.append(token)
        if pending:
            flush()
        return result


class Fuse(Decoder):
    def decode_chain(self, tokens):
        return ["".join(tokens)]


class Strip(Decoder):
    def __init__(self, content: str, start: int, stop: int):
        self.content = content
        self.start = start
        self.stop = stop

    def decode_chain(self, tokens):
        result = []
        for token in tokens:
            start_cut = 0
            for index in range(min(self.start, len(token))):
                if token[index] != self.content:
                    break
                start_cut = index + 1
            stop_cut = len(token)
            for offset in range(min(self.stop, len(token))):
                index = len(token) - offset - 1
                if token[index] != self.content:
                    break
                stop_cut = index
            result.append(token[start_cut:stop_cut] if start_cut < stop_cut else "")
        return result


class Replace(Decoder):
    def __init__(self, pattern, content: str, where: str = "decoder.pattern"):
        self.regex = compile_split_pattern(pattern, where)
        self.content = content

    def decode_chain(self, tokens):
        return [self.regex.sub(lambda _match: self.content, token) for token in tokens]


class BPEDecoder(Decoder):
    def __init__(self, suffix="</w>"):
        self.suffix = suffix

    def decode_chain(self, tokens):
        last = len(tokens) - 1
        return [token.replace(self.suffix, "" if index == last else " ")
                for index, token in enumerate(tokens)]


class CTC(Decoder):
    def __init__(self, pad_token="<pad>", word_delimiter_token="|", cleanup_text=True):
        self.pad_token = pad_token
        self.word_delimiter_token = word_delimiter_token
        self.cleanup_text = cleanup_text

    def decode_chain(self, tokens):
        result = []
        previous = None
        for token in tokens:
            if token == previous:
                continue
            previous = token
            text = token.replace(self.pad_token, "")
            if self.cleanup_text:
                text = cleanup(text).replace(self.word_delimiter_token, " ")
            if text:
                result.append(text)
        return result


class Sequence(Decoder):
    def __init__(self, decoders: list):
        self.decoders = decoders

    def decode_chain(self, tokens):
        for decoder in self.decoders:
            tokens = decoder.decode_chain(tokens)
        return tokens


def _metaspace(fields: Fields) -> Metaspace:
    from .pre_tokenizers import _metaspace_from_config
    metaspace = _metaspace_from_config(fields.config, fields.where)
    return Metaspace(metaspace.replacement, metaspace.prepend_scheme)


def _strip(fields: Fields) -> Strip:
    content = fields.string("content", " ")
    if len(content) != 1:
        raise FormatError(f"{SOURCE} {fields.path('content')}: expected one character, got "
                          f"{describe(content)}")
    return Strip(content, fields.integer("start", 0, maximum=MAX_COUNT),
                 fields.integer("stop", 0, maximum=MAX_COUNT))


def _replace(fields: Fields) -> Replace:
    return Replace(fields.get("pattern"), fields.string("content"), fields.path("pattern"))


def _ctc(fields: Fields) -> CTC:
    return CTC(fields.string("pad_token", "<pad>"), fields.string("word_delimiter_token", "|"),
               fields.boolean("cleanup", True))


def _sequence(fields: Fields, depth: int) -> Sequence:
    return Sequence(sequence_steps(fields, "decoders", decoder_from_config, depth))


# type -> builder(fields); Sequence is handled apart (it recurses).
BUILDERS = {
    "ByteLevel": lambda fields: ByteLevel(),
    "Metaspace": _metaspace,
    "WordPiece": lambda fields: WordPiece(fields.string("prefix", "##"),
                                          fields.boolean("cleanup", True)),
    "ByteFallback": lambda fields: ByteFallback(),
    "Fuse": lambda fields: Fuse(),
    "Strip": _strip,
    "Replace": _replace,
    "BPEDecoder": lambda fields: BPEDecoder(fields.string("suffix", "</w>")),
    "CTC": _ctc,
}


def decoder_from_config(config, where: str = "decoder", depth: int = 0):
    if config is None:
        return None
    check_nesting(depth, where)
    fields = Fields(config, where)
    kind = fields.string("type")
    if kind == "Sequence":
        return _sequence(fields, depth)
    if kind in BUILDERS:
        return BUILDERS[kind](fields)
    raise UnsupportedError(f"{SOURCE} {where}: unknown decoder type {describe(kind)}")
