"""Decoders of the HF tokenizer.json format: a list of token strings -> text.

Like HF, each decoder is a `decode_chain(tokens) -> tokens` step; the final text is the
concatenation of what the last step returns.
"""

from __future__ import annotations

import re

from ..errors import FormatError, UnsupportedError
from .normalizers import compile_split_pattern
from .pre_tokenizers import unicode_to_byte

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
    def __init__(self, pattern, content: str):
        self.regex = compile_split_pattern(pattern, "decoder Replace.pattern")
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


def decoder_from_config(config, where: str = "decoder"):
    if config is None:
        return None
    if not isinstance(config, dict):
        raise FormatError(f"tokenizer.json {where}: expected an object, got {config!r}")
    kind = config.get("type")
    if kind == "ByteLevel":
        return ByteLevel()
    if kind == "Metaspace":
        from .pre_tokenizers import _metaspace_from_config
        metaspace = _metaspace_from_config(config, where)
        return Metaspace(metaspace.replacement, metaspace.prepend_scheme)
    if kind == "WordPiece":
        return WordPiece(config.get("prefix", "##"), config.get("cleanup", True))
    if kind == "ByteFallback":
        return ByteFallback()
    if kind == "Fuse":
        return Fuse()
    if kind == "Strip":
        return Strip(config.get("content", " "), config.get("start", 0), config.get("stop", 0))
    if kind == "Replace":
        for key in ("pattern", "content"):
            if key not in config:
                raise FormatError(f"tokenizer.json {where}: missing field {key!r}")
        return Replace(config["pattern"], config["content"])
    if kind == "BPEDecoder":
        return BPEDecoder(config.get("suffix", "</w>"))
    if kind == "CTC":
        return CTC(config.get("pad_token", "<pad>"), config.get("word_delimiter_token", "|"),
                   config.get("cleanup", True))
    if kind == "Sequence":
        children = config.get("decoders")
        if children is None:
            raise FormatError(f"tokenizer.json {where}: missing field 'decoders'")
        return Sequence([decoder_from_config(child, f"{where}.decoders[{index}]")
                         for index, child in enumerate(children)])
    if kind is None:
        raise FormatError(f"tokenizer.json {where}: missing field 'type'")
    raise UnsupportedError(f"tokenizer.json {where}: unknown decoder type {kind!r}")
