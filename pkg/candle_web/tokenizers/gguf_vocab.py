"""Build a `Tokenizer` from the vocabulary a GGUF file embeds (`tokenizer.ggml.*` keys).

- model "gpt2": byte-level BPE from `tokens` + `merges`; the pre-tokenizer is chosen by
  `tokenizer.ggml.pre` the way llama.cpp does (its regexes are the HF ones).
- model "llama": SentencePiece BPE from `tokens` + `scores` (merges ordered by the score of the
  merged piece, as HF's SentencePiece converter does), with byte fallback and "▁" spaces.
Control tokens (type 3) become special added tokens, user-defined ones (type 4) plain added
tokens, so they are matched whole in text as HF and llama.cpp do.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..core.errors import FormatError, UnsupportedError
from .added_vocabulary import AddedToken
from .decoders import ByteFallback, ByteLevel as ByteLevelDecoder, Fuse
from .decoders import Replace as ReplaceDecoder, Sequence as DecoderSequence, Strip
from .fields import MAX_ID, as_bool, as_int, as_string, describe
from .models import BPE
from .normalizers import Prepend, Replace, Sequence as NormalizerSequence
from .post_processors import TemplateProcessing
from .pre_tokenizers import ByteLevel, PredicateSplit, Sequence, Split
from .unicode_classes import is_numeric

# llama.cpp token types (enum llama_token_type).
TOKEN_TYPE_NORMAL = 1
TOKEN_TYPE_UNKNOWN = 2
TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_USER_DEFINED = 4
TOKEN_TYPE_UNUSED = 5
TOKEN_TYPE_BYTE = 6

SPIECE_SPACE = "\u2581"
GGUF = "GGUF metadata:"

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                  r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

# tokenizer.ggml.pre values that use plain GPT-2 byte-level splitting.
GPT2_STYLE_PRE = ("default", "gpt2", "gpt-2", "mpt", "olmo", "jais")


def _key(metadata: dict, name: str, required: bool = True, default=None):
    key = "tokenizer.ggml." + name
    if key not in metadata:
        if required:
            raise FormatError(f"GGUF metadata: missing key {key!r}")
        return default
    return metadata[key]


# Checked reads of the keys: the GGUF parser gives ints, floats, bools and strings, numeric
# arrays as 1-D numpy arrays and string arrays as lists; anything else is a malformed file.

def _string(metadata: dict, name: str, required: bool = True, default=None) -> str:
    return as_string(_key(metadata, name, required, default), "tokenizer.ggml." + name, GGUF)


def _integer(metadata: dict, name: str, required: bool = True, default=None) -> int:
    value = _key(metadata, name, required, default)
    if isinstance(value, np.integer):
        value = int(value)
    return as_int(value, "tokenizer.ggml." + name, 0, MAX_ID, GGUF)


def _flag(metadata: dict, name: str, default: bool) -> bool:
    value = _key(metadata, name, False, default)
    if isinstance(value, np.bool_):
        value = bool(value)
    return as_bool(value, "tokenizer.ggml." + name, GGUF)


def _as_list(value, key: str) -> list:
    """A GGUF array: a list, or a 1-D numpy array (as Python scalars)."""
    if isinstance(value, np.ndarray) and value.ndim == 1:
        return value.tolist()
    if isinstance(value, (list, tuple)):
        return list(value)
    raise FormatError(f"GGUF metadata: {key} should be an array, got "
                      f"{type(value).__name__}")


def _strings(metadata: dict, name: str) -> list:
    key = "tokenizer.ggml." + name
    values = _as_list(_key(metadata, name), key)
    # Vocabularies have 50k-250k entries: messages are built only for a bad one.
    for index, value in enumerate(values):
        if value.__class__ is not str:
            as_string(value, f"{key}[{index}]", GGUF)
    return values


def _integers(values: list, key: str) -> list:
    for index, value in enumerate(values):
        if value.__class__ is not int or not 0 <= value <= MAX_ID:
            as_int(value, f"{key}[{index}]", 0, MAX_ID, GGUF)
    return values


def _scores(values: list, key: str) -> list:
    scores = []
    for index, value in enumerate(values):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
            raise FormatError(f"GGUF metadata: {key}[{index}]: expected a number, got "
                              f"{describe(value)}")
        scores.append(float(value))
    return scores


def _pre_tokenizer_for(pre: str):
    if pre in GPT2_STYLE_PRE:
        return ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in ("smollm", "starcoder", "refact", "codeshell"):
        # Every digit on its own, then GPT-2 splitting (SmolLM's tokenizer.json).
        return Sequence([PredicateSplit(is_numeric, "Isolated"),
                         ByteLevel(add_prefix_space=False, use_regex=True)])
    if pre in ("llama-bpe", "llama3", "llama-v3"):
        return Sequence([Split({"Regex": LLAMA3_PATTERN}, "Isolated"),
                         ByteLevel(add_prefix_space=False, use_regex=False)])
    if pre == "qwen2":
        return Sequence([Split({"Regex": QWEN2_PATTERN}, "Isolated"),
                         ByteLevel(add_prefix_space=False, use_regex=False)])
    raise UnsupportedError(f"GGUF metadata: tokenizer.ggml.pre = {pre!r} is not supported "
                           f"(known: {GPT2_STYLE_PRE + ('smollm', 'llama-bpe', 'qwen2')})")


def _added_tokens(tokens: list, token_types: list) -> list:
    added = []
    for token, token_type in zip(tokens, token_types):
        if token_type == TOKEN_TYPE_CONTROL:
            added.append(AddedToken(token, normalized=False, special=True))
        elif token_type == TOKEN_TYPE_USER_DEFINED:
            added.append(AddedToken(token, normalized=False, special=False))
    return added


def _token_for(metadata: dict, tokens: list, name: str) -> tuple:
    token_id = _integer(metadata, name)
    if token_id >= len(tokens):
        raise FormatError(f"GGUF metadata: tokenizer.ggml.{name} = {token_id} is outside "
                          f"the vocabulary of {len(tokens)} tokens")
    return token_id, tokens[token_id]


def _bos_eos_template(metadata: dict, tokens: list, add_bos_default: bool):
    add_bos = _flag(metadata, "add_bos_token", add_bos_default)
    add_eos = _flag(metadata, "add_eos_token", False)
    if not add_bos and not add_eos:
        return None
    special_tokens = {}
    bos = eos = None
    if add_bos:
        bos_id, bos = _token_for(metadata, tokens, "bos_token_id")
        special_tokens[bos] = ([bos_id], [bos])
    if add_eos:
        eos_id, eos = _token_for(metadata, tokens, "eos_token_id")
        special_tokens[eos] = ([eos_id], [eos])
    single = []
    pair = []
    for template, sequences in ((single, ("A",)), (pair, ("A", "B"))):
        for sequence in sequences:
            if bos is not None:
                template.append(("special", bos, 0))
            template.append(("sequence", sequence, 0))
            if eos is not None:
                template.append(("special", eos, 0))
    return TemplateProcessing(single, pair, special_tokens)


def _gpt2_tokenizer(metadata: dict, tokens: list, token_types: list):
    merges = _strings(metadata, "merges")
    vocab = {token: index for index, token in enumerate(tokens)}
    model = BPE(vocab, merges)
    pre = _string(metadata, "pre", False, "default")
    return TokenizerParts(model, None, _pre_tokenizer_for(pre),
                          _bos_eos_template(metadata, tokens, add_bos_default=False),
                          ByteLevelDecoder(), _added_tokens(tokens, token_types))


def sentencepiece_merges(tokens: list, scores: list) -> list:
    """Merges for a SentencePiece BPE vocabulary: every split of a piece into two pieces of
    the vocabulary, ordered by the merged piece's score (highest first), then by the ids of
    the two halves, as HF's SentencePieceExtractor produces them."""
    vocab = {token: index for index, token in enumerate(tokens)}
    # The left half is itself a piece, so only cuts at the lengths pieces have can match:
    # a few very long pieces then cost (distinct lengths) slices each, not their length.
    lengths = sorted({len(token) for token in tokens})
    merges = []
    for merged, score in zip(tokens, scores):
        local = []
        for cut in lengths:
            if cut >= len(merged):
                break
            if cut == 0:
                continue
            left, right = merged[:cut], merged[cut:]
            if left in vocab and right in vocab:
                local.append((vocab[left], vocab[right], left, right, score))
        local.sort(key=lambda entry: (entry[0], entry[1]))
        merges.extend(local)
    merges.sort(key=lambda entry: -entry[4])  # stable: ties keep the order above
    return [[left, right] for _, _, left, right, _ in merges]


def _llama_tokenizer(metadata: dict, tokens: list, token_types: list):
    scores = _scores(_as_list(_key(metadata, "scores"), "tokenizer.ggml.scores"),
                     "tokenizer.ggml.scores")
    if len(scores) != len(tokens):
        raise FormatError(f"GGUF metadata: {len(scores)} scores for {len(tokens)} tokens")
    vocab = {}
    for index, token in enumerate(tokens):
        vocab.setdefault(token, index)
    unk_id = _integer(metadata, "unknown_token_id", False, 0)
    unk_token = tokens[unk_id] if 0 <= unk_id < len(tokens) else None
    model = BPE(vocab, sentencepiece_merges(tokens, scores), unk_token=unk_token,
                byte_fallback=True, fuse_unk=True)
    normalizers = []
    add_space_prefix = _flag(metadata, "add_space_prefix", True)
    if add_space_prefix:
        normalizers.append(Prepend(SPIECE_SPACE))
    normalizers.append(Replace({"String": " "}, SPIECE_SPACE))
    decoder_steps = [ReplaceDecoder({"String": SPIECE_SPACE}, " "), ByteFallback(), Fuse()]
    if add_space_prefix:
        decoder_steps.append(Strip(" ", 1, 0))
    return TokenizerParts(model, NormalizerSequence(normalizers), None,
                          _bos_eos_template(metadata, tokens, add_bos_default=True),
                          DecoderSequence(decoder_steps), _added_tokens(tokens, token_types))


class TokenizerParts(NamedTuple):
    """What a Tokenizer is built from (Tokenizer.from_gguf_metadata builds it: this module
    does not import the Tokenizer, which imports this module)."""
    model: object
    normalizer: object
    pre_tokenizer: object
    post_processor: object
    decoder: object
    added_tokens: list


def tokenizer_parts_from_gguf_metadata(metadata: dict) -> TokenizerParts:
    """`metadata`: GGUF key -> value (strings, numbers, lists or numpy arrays)."""
    model_kind = _string(metadata, "model")
    tokens = _strings(metadata, "tokens")
    token_types = _key(metadata, "token_type", False, None)
    if token_types is None:
        token_types = [TOKEN_TYPE_NORMAL] * len(tokens)
    token_types = _integers(_as_list(token_types, "tokenizer.ggml.token_type"),
                            "tokenizer.ggml.token_type")
    if len(token_types) != len(tokens):
        raise FormatError(f"GGUF metadata: {len(token_types)} token types for {len(tokens)} "
                          f"tokens")
    if model_kind == "gpt2":
        return _gpt2_tokenizer(metadata, tokens, token_types)
    if model_kind == "llama":
        return _llama_tokenizer(metadata, tokens, token_types)
    raise UnsupportedError(f"GGUF metadata: tokenizer.ggml.model = {model_kind!r} is not "
                           f"supported (known: 'gpt2', 'llama')")
