"""`Tokenizer`: the HF tokenizer.json pipeline in pure Python.

encode: added tokens are cut out -> the rest is normalized -> pre-tokenized into words -> each
word tokenized by the model -> truncation -> post-processor (special tokens, type ids) ->
padding. decode: ids -> token strings (special ones optionally skipped) -> decoder.
"""

from __future__ import annotations

import json
import os
import re
import sys

from ..core.errors import CandleError, FormatError, check_text
from ..io.files import open_regular_file
from .added_vocabulary import AddedToken, AddedVocabulary
from .decoders import decoder_from_config
from .encoding import (Encoding, PaddingParams, TruncationParams, pad_encodings,
                       truncate_encodings)
from .fields import Fields, as_list
from .gguf_vocab import tokenizer_parts_from_gguf_metadata
from .models import model_from_config
from .normalizers import normalizer_from_config
from .post_processors import PostProcessor, post_processor_from_config
from .pre_tokenizers import pre_tokenizer_from_config

BACKENDS = ("python", "hf", "auto")


class Tokenizer:
    def __init__(self, model, normalizer=None, pre_tokenizer=None, post_processor=None,
                 decoder=None, added_tokens=(), truncation=None, padding=None):
        self.model = model
        self.normalizer = normalizer
        self.pre_tokenizer = pre_tokenizer
        self.post_processor = post_processor
        self.decoder = decoder
        self.added_vocabulary = AddedVocabulary()
        self.added_vocabulary.add_tokens(list(added_tokens), model, normalizer)
        self.truncation = truncation
        self.padding = padding

    # ---- construction -------------------------------------------------------------------

    @classmethod
    def from_dict(cls, config: dict) -> "Tokenizer":
        return _with_safety_net(cls._from_dict, config)

    @classmethod
    def _from_dict(cls, config: dict) -> "Tokenizer":
        if not isinstance(config, dict):
            raise FormatError(f"tokenizer.json: expected a JSON object at the top level, got "
                              f"{type(config).__name__}")
        fields = Fields(config, "(top level)")
        model = model_from_config(fields.get("model"))
        normalizer = normalizer_from_config(config.get("normalizer"))
        added = as_list(fields.get("added_tokens", []), "added_tokens")
        added_tokens = [AddedToken.from_config(entry, index) for index, entry in enumerate(added)]
        truncation = fields.object("truncation", None)
        padding = fields.object("padding", None)
        return cls(model, normalizer, pre_tokenizer_from_config(config.get("pre_tokenizer")),
                   post_processor_from_config(config.get("post_processor")),
                   decoder_from_config(config.get("decoder")), added_tokens,
                   TruncationParams.from_config(truncation) if truncation is not None else None,
                   PaddingParams.from_config(padding) if padding is not None else None)

    @classmethod
    def from_str(cls, text: str, backend: str = "python"):
        if backend != "python":
            return _with_backend(text, backend)
        config = parse_json(text)
        refuse_lone_surrogates(config, text)
        return cls.from_dict(config)

    @classmethod
    def from_bytes(cls, data: bytes, backend: str = "python"):
        try:
            text = bytes(data).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise FormatError(f"tokenizer.json is not UTF-8: {exc}") from None
        return cls.from_str(text, backend)

    @classmethod
    def from_file(cls, path, backend: str = "python"):
        """backend: "python" (this implementation), "hf" (HF `tokenizers`, must be installed)
        or "auto" (HF `tokenizers` when importable, else this one); all give the same output.
        Errors name the file."""
        path = os.fspath(path)
        with open_regular_file(path, "tokenizer.json") as handle:  # a FIFO would block open()
            data = handle.read()
        try:
            return cls.from_bytes(data, backend)
        except CandleError as exc:
            raise type(exc)(f"{path}: {exc}") from None

    @classmethod
    def from_gguf_metadata(cls, metadata: dict) -> "Tokenizer":
        return cls(*tokenizer_parts_from_gguf_metadata(metadata))

    # ---- vocabulary ---------------------------------------------------------------------

    def token_to_id(self, token: str):
        token_id = self.added_vocabulary.token_ids.get(token)
        return token_id if token_id is not None else self.model.token_to_id(token)

    def id_to_token(self, token_id: int):
        token = self.added_vocabulary.id_to_token(token_id)
        return token if token is not None else self.model.id_to_token(token_id)

    def get_vocab_size(self, with_added_tokens: bool = True) -> int:
        size = self.model.get_vocab_size()
        if with_added_tokens:
            size += sum(1 for content in self.added_vocabulary.token_ids
                        if self.model.token_to_id(content) is None)
        return size

    def get_vocab(self, with_added_tokens: bool = True) -> dict:
        vocab = dict(self.model.vocab)
        if with_added_tokens:
            vocab.update(self.added_vocabulary.token_ids)
        return vocab

    @property
    def special_token_ids(self) -> set:
        return {self.added_vocabulary.token_ids[content]
                for content in self.added_vocabulary.special_contents}

    # ---- truncation and padding ---------------------------------------------------------

    def no_truncation(self) -> None:
        self.truncation = None

    def no_padding(self) -> None:
        self.padding = None

    def enable_truncation(self, max_length: int, stride: int = 0,
                          strategy: str = "longest_first", direction: str = "right") -> None:
        self.truncation = TruncationParams.from_config({
            "max_length": max_length, "stride": stride,
            "strategy": _camel(strategy), "direction": direction.capitalize()})

    def enable_padding(self, direction: str = "right", pad_id: int = 0, pad_type_id: int = 0,
                       pad_token: str = "[PAD]", length=None, pad_to_multiple_of=None) -> None:
        """Same arguments as HF's `Tokenizer.enable_padding`; length None = longest in batch."""
        self.padding = PaddingParams.from_config({
            "strategy": "BatchLongest" if length is None else {"Fixed": length},
            "direction": direction.capitalize(), "pad_to_multiple_of": pad_to_multiple_of,
            "pad_id": pad_id, "pad_type_id": pad_type_id, "pad_token": pad_token})

    # ---- encoding -----------------------------------------------------------------------

    def _encode_sequence(self, text: str, type_id: int) -> Encoding:
        if not isinstance(text, str):
            raise TypeError(f"encode: expected a str, got {type(text).__name__}")
        pieces = self.added_vocabulary.extract_and_normalize(text, self.normalizer)
        tokens = []
        words = []
        for piece, at_origin, token_id in pieces:
            if token_id is not None:
                self._flush_words(words, tokens)
                tokens.append((token_id, piece))
            else:
                words.append((piece, at_origin))
        self._flush_words(words, tokens)
        return Encoding.from_tokens(tokens, type_id)

    def _flush_words(self, pieces: list, tokens: list) -> None:
        if not pieces:
            return
        if self.pre_tokenizer is not None:
            words = self.pre_tokenizer.pre_tokenize(pieces)
        else:
            words = pieces
        tokenize = self.model.tokenize
        for word, _ in words:
            tokens.extend(tokenize(word))
        pieces.clear()

    def _post_process(self, first: Encoding, second, add_special_tokens: bool) -> Encoding:
        if self.truncation is not None:
            max_length = self.truncation.max_length
            added = (self.post_processor.added_tokens(second is not None)
                     if self.post_processor is not None else 0)
            if add_special_tokens and added > 0:
                if added > max_length:
                    raise FormatError(f"truncation max_length {max_length} is smaller than the "
                                      f"{added} special tokens the post-processor adds")
                max_length -= added
            truncate_encodings(first, second, self.truncation, max_length)
        processor = self.post_processor or PostProcessor()
        if self.post_processor is None and second is None:
            encoding = first
        else:
            encoding = processor.process(first, second, add_special_tokens)
        if self.padding is not None:
            pad_encodings([encoding], self.padding)
        return encoding

    def encode(self, text: str, pair: str = None, add_special_tokens: bool = True) -> Encoding:
        # Lone surrogates (non-UTF-8 bytes of argv, JS strings) are refused here, naming the
        # argument, as HF refuses them; the steps below may then encode to UTF-8 freely.
        if isinstance(text, str):
            check_text(text, "encode: text")
        if isinstance(pair, str):
            check_text(pair, "encode: pair")
        first = self._encode_sequence(text, 0)
        second = self._encode_sequence(pair, 1) if pair is not None else None
        return self._post_process(first, second, add_special_tokens)

    def encode_pair(self, text: str, pair: str, add_special_tokens: bool = True) -> Encoding:
        return self.encode(text, pair, add_special_tokens)

    def encode_batch(self, inputs: list, add_special_tokens: bool = True) -> list:
        """Each input is a str or a (str, str) pair; padding then applies across the batch."""
        padding = self.padding
        self.padding = None
        try:
            encodings = []
            for item in inputs:
                if isinstance(item, (tuple, list)):
                    encodings.append(self.encode(item[0], item[1], add_special_tokens))
                else:
                    encodings.append(self.encode(item, None, add_special_tokens))
        finally:
            self.padding = padding
        if padding is not None:
            pad_encodings(encodings, padding)
        return encodings

    # ---- decoding -----------------------------------------------------------------------

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        tokens = []
        for token_id in ids:
            token = self.id_to_token(int(token_id))
            if token is None:
                continue
            if skip_special_tokens and self.added_vocabulary.is_special(token):
                continue
            tokens.append(token)
        if self.decoder is None:
            return " ".join(tokens)
        return self.decoder.decode(tokens)

    def decode_batch(self, batch, skip_special_tokens: bool = True) -> list:
        return [self.decode(ids, skip_special_tokens) for ids in batch]


def parse_json(text: str):
    """json.loads, with every way it can fail on hostile text turned into a FormatError.

    The C parser recurses once per nesting level and stops at the recursion limit; integer
    literals are limited to sys.get_int_max_str_digits() digits."""
    try:
        return json.loads(text)
    except RecursionError:
        raise FormatError(f"tokenizer.json: JSON nested deeper than the parser allows (Python "
                          f"recursion limit {sys.getrecursionlimit()})") from None
    except json.JSONDecodeError as exc:
        raise FormatError(f"tokenizer.json is not valid JSON: {exc}") from None
    except ValueError as exc:
        raise FormatError(f"tokenizer.json: {_long_number_location(text)}{exc}") from None


# A JSON escape of a UTF-16 surrogate half: only then can a parsed string hold a lone one
# (the text itself was decoded from UTF-8, which has no surrogates).
SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def refuse_lone_surrogates(config, text: str) -> None:
    """FormatError naming the field when a string of the parsed file holds a lone surrogate
    (an escape such as "\\ud800" with no partner). HF's JSON parser refuses such a file; here
    it would reach the normalizers and fail while encoding. Nothing is walked unless the text
    has a surrogate escape at all."""
    if SURROGATE_ESCAPE.search(text) is None:
        return
    stack = [(config, "(top level)")]
    while stack:
        value, where = stack.pop()
        if isinstance(value, str):
            if not value.isascii():
                try:
                    check_text(value, where)
                except CandleError as exc:
                    raise FormatError(f"tokenizer.json: {exc}") from None
        elif isinstance(value, dict):
            for key, item in value.items():
                stack.append((key, f"{where} key"))
                stack.append((item, key if where == "(top level)" else f"{where}.{key}"))
        elif isinstance(value, list):
            stack.extend((item, f"{where}[{index}]") for index, item in enumerate(value))


def _long_number_location(text: str) -> str:
    """Where the first integer literal over the digit limit starts (only run on failure)."""
    limit = sys.get_int_max_str_digits()
    if limit == 0:  # 0 means no limit
        return ""
    found = re.search(f"[0-9]{{{limit + 1},}}", text)
    if found is None:
        return ""
    return f"the number at character {found.start()}: "


def _with_safety_net(build, config):
    """Every field is checked where it is read; this net only turns a check that was missed
    into a FormatError (the original error stays chained for debugging)."""
    try:
        return build(config)
    except CandleError:
        raise
    except (TypeError, ValueError, KeyError, IndexError, AttributeError,
            RecursionError) as exc:
        raise FormatError(f"tokenizer.json: unexpected {type(exc).__name__} while loading "
                          f"(a malformed field that is not checked): {exc}") from exc


def _camel(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_"))


def _with_backend(text: str, backend: str):
    if backend not in BACKENDS:
        raise ValueError(f"tokenizer backend {backend!r}: expected one of {BACKENDS}")
    from .hf_backend import HFTokenizer, hf_available
    if backend == "hf" or (backend == "auto" and hf_available()):
        return HFTokenizer.from_str(text)
    return Tokenizer.from_str(text)
