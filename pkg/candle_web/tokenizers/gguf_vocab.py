"""Build a `Tokenizer` from the vocabulary a GGUF file embeds (`tokenizer.ggml.*` keys).

- model "gpt2": byte-level BPE from `tokens` + `merges`; the pre-tokenizer is chosen by
  `tokenizer.ggml.pre` the way llama.cpp does (its regexes are the HF ones).
- model "llama": SentencePiece BPE from `tokens` + `scores` (merges ordered by the score of the
  merged piece, as HF's SentencePiece converter does), with byte fallback and "▁" spaces.
- model "gemma4": BPE from `tokens` + `merges` on raw UTF-8 with byte fallback, spaces written
  as "▁", the text cut only into runs of newlines and runs of anything else.
- model "bert": WordPiece (llama.cpp stores a word-initial piece as "▁piece" and a
  continuation without HF's "##"), with BERT's lowercasing normalizer and pre-tokenizer.
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
from .decoders import WordPiece as WordPieceDecoder
from .fields import MAX_ID, as_bool, as_int, as_string, describe
from .models import BPE, WordPiece
from .normalizers import BertNormalizer, Prepend, Replace, Sequence as NormalizerSequence
from .post_processors import TemplateProcessing
from .pre_tokenizers import BertPreTokenizer, ByteLevel, PredicateSplit, Sequence, Split
from .sentencepiece_ranks import SentencePieceRanks
from .unicode_classes import is_numeric, is_punctuation

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

QWEN35_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
                  r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# The CJK run of DeepSeek's tokenizers (the ranges as their tokenizer.json writes them).
DEEPSEEK_CJK_PATTERN = "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"
# DeepSeek LLM's letters: cased scripts only (Latin, Greek, Cyrillic, Armenian, Georgian,
# Cherokee, Glagolitic, Coptic, Deseret, Osage, Old Hungarian, Warang Citi, Adlam...).
DEEPSEEK_LLM_LETTERS = (
    "A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293"
    "\u0295-\u02af\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a"
    "\u038c\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f\u0531-\u0556"
    "\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b"
    "\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d"
    "\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe"
    "\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4"
    "\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128"
    "\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184"
    "\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d\ua680-\ua69b"
    "\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17"
    "\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3"
    "\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2"
    "\U000118a0-\U000118df\U0001e900-\U0001e943")
DEEPSEEK_LLM_PUNCTUATION = "!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002"

# tokenizer.ggml.pre values that use plain GPT-2 byte-level splitting.
GPT2_STYLE_PRE = ("default", "gpt2", "gpt-2", "mpt", "olmo", "jais", "phi-2")
# Digits one by one, then GPT-2 splitting (SmolLM's and StarCoder's tokenizer.json).
DIGITS_THEN_GPT2_PRE = ("smollm", "starcoder", "refact", "codeshell", "command-r")
# Pre-tokenizers whose BPE takes a word found whole in the vocabulary as it is (HF's
# ignore_merges): Llama 3's.
IGNORE_MERGES_PRE = ("llama-bpe", "llama3", "llama-v3")


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
        try:
            scores.append(float(value))
        except OverflowError:  # an integer score beyond any float (GGUF's u64/i64 arrays)
            raise FormatError(f"GGUF metadata: {key}[{index}]: an integer of "
                              f"{value.bit_length()} bits is beyond a float's range") from None
    return scores


def _isolated(pattern: str) -> Split:
    return Split({"Regex": pattern}, "Isolated")


def _byte_level_after(*steps) -> Sequence:
    """`steps`, then the byte-level alphabet with no further splitting."""
    return Sequence([*steps, ByteLevel(add_prefix_space=False, use_regex=False)])


def _pre_tokenizer_for(pre: str):
    """The HF pre-tokenizer of the model that `tokenizer.ggml.pre` names."""
    if pre in GPT2_STYLE_PRE:
        return ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in DIGITS_THEN_GPT2_PRE:
        return Sequence([PredicateSplit(is_numeric, "Isolated"),
                         ByteLevel(add_prefix_space=False, use_regex=True)])
    if pre in IGNORE_MERGES_PRE:
        return _byte_level_after(_isolated(LLAMA3_PATTERN))
    if pre in ("qwen2", "deepseek-r1-qwen"):
        return _byte_level_after(_isolated(QWEN2_PATTERN))
    if pre == "qwen35":
        return _byte_level_after(_isolated(QWEN35_PATTERN))
    if pre == "falcon":
        # Punctuation runs, GPT-2 splitting, digit runs, then every three digits apart.
        return Sequence([PredicateSplit(is_punctuation, "Contiguous"),
                         ByteLevel(add_prefix_space=False, use_regex=True),
                         PredicateSplit(is_numeric, "Contiguous"),
                         _isolated("[0-9][0-9][0-9]")])
    if pre == "deepseek-coder":
        return _byte_level_after(_isolated(r"[\r\n]"), _isolated(r"\s?\p{L}+"),
                                 _isolated(r"\s?\p{P}+"), _isolated(DEEPSEEK_CJK_PATTERN),
                                 PredicateSplit(is_numeric, "Isolated"))
    if pre == "deepseek-llm":
        return _byte_level_after(_isolated(r"[\r\n]"),
                                 _isolated(r"\s?[" + DEEPSEEK_LLM_LETTERS + "]+"),
                                 _isolated(r"\s?[" + DEEPSEEK_LLM_PUNCTUATION + "]+"),
                                 _isolated(r"\s+$"), _isolated(DEEPSEEK_CJK_PATTERN),
                                 PredicateSplit(is_numeric, "Isolated"))
    raise UnsupportedError(f"GGUF metadata: tokenizer.ggml.pre = {pre!r} is not supported "
                           f"(known: {', '.join(KNOWN_PRE)})")


KNOWN_PRE = (GPT2_STYLE_PRE + DIGITS_THEN_GPT2_PRE + IGNORE_MERGES_PRE
             + ("qwen2", "deepseek-r1-qwen", "qwen35", "falcon", "deepseek-coder",
                "deepseek-llm"))


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
    pre = _string(metadata, "pre", False, "default")
    pre_tokenizer = _pre_tokenizer_for(pre)
    model = BPE(vocab, merges, ignore_merges=pre in IGNORE_MERGES_PRE)
    return TokenizerParts(model, None, pre_tokenizer,
                          _bos_eos_template(metadata, tokens, add_bos_default=False),
                          ByteLevelDecoder(), _added_tokens(tokens, token_types))


def sentencepiece_merges(tokens: list, scores: list) -> list:
    """Merges for a SentencePiece BPE vocabulary: every split of a piece into two pieces of
    the vocabulary, ordered by the merged piece's score (highest first), then by the ids of
    the two halves, as HF's SentencePieceExtractor produces them. The list has one entry per
    split (N^2 / 2 for 'a', 'aa', ..., 'a' * N): the tokenizer uses SentencePieceRanks, the
    same ranks worked out per pair; this list is the reference the tests compare it with."""
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
    model = BPE(vocab, [], unk_token=unk_token, byte_fallback=True, fuse_unk=True)
    # The ranks sentencepiece_merges would list, worked out per pair: one entry per piece
    # instead of one per split (N^2 / 2 for 'a', 'aa', ..., 'a' * N).
    model.merge_ranks = SentencePieceRanks(tokens, scores, vocab)
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


def _merge_pairs(merges: list) -> list:
    """GGUF merges "left right" as pairs, cut at the first space after the first character
    (as llama.cpp reads them: a left piece may itself be a space)."""
    pairs = []
    for index, merge in enumerate(merges):
        cut = merge.find(" ", 1)
        if cut < 0:
            raise FormatError(f"GGUF metadata: tokenizer.ggml.merges[{index}] = "
                              f"{describe(merge)}: expected two pieces separated by a space")
        pairs.append((merge[:cut], merge[cut + 1:]))
    return pairs


def _gemma4_tokenizer(metadata: dict, tokens: list, token_types: list):
    vocab = {}
    for index, token in enumerate(tokens):
        vocab.setdefault(token, index)
    unk_id = _integer(metadata, "unknown_token_id", False, None)
    unk_token = tokens[unk_id] if unk_id is not None and unk_id < len(tokens) else None
    model = BPE(vocab, _merge_pairs(_strings(metadata, "merges")), unk_token=unk_token,
                byte_fallback=True, fuse_unk=True)
    # No word splitting: BPE runs over each run of newlines and each run of other text.
    pre_tokenizer = _isolated("[^\n]+|[\n]+")
    normalizer = Replace({"String": " "}, SPIECE_SPACE)
    decoder = DecoderSequence([ReplaceDecoder({"String": SPIECE_SPACE}, " "), ByteFallback(),
                               Fuse()])
    return TokenizerParts(model, normalizer, pre_tokenizer,
                          _bos_eos_template(metadata, tokens, add_bos_default=True),
                          decoder, _added_tokens(tokens, token_types))


def _bert_tokenizer(metadata: dict, tokens: list, token_types: list):
    # llama.cpp's converter writes a word-initial piece as "▁piece" and a continuation as
    # the bare piece; HF's WordPiece wants "piece" and "##piece".
    vocab = {}
    for index, (token, token_type) in enumerate(zip(tokens, token_types)):
        if token_type == TOKEN_TYPE_NORMAL:
            token = token[1:] if token.startswith(SPIECE_SPACE) else "##" + token
        vocab.setdefault(token, index)
    unk_id = _integer(metadata, "unknown_token_id", False, None)
    unk_token = tokens[unk_id] if unk_id is not None and unk_id < len(tokens) else "[UNK]"
    model = WordPiece(vocab, unk_token=unk_token)
    special = {}
    cls_sep = []
    for name in ("cls_token_id", "seperator_token_id"):
        token_id, token = _token_for(metadata, tokens, name)
        special[token] = ([token_id], [token])
        cls_sep.append(token)
    cls, sep = cls_sep
    single = [("special", cls, 0), ("sequence", "A", 0), ("special", sep, 0)]
    pair = single + [("sequence", "B", 1), ("special", sep, 1)]
    return TokenizerParts(model, BertNormalizer(lowercase=True), BertPreTokenizer(),
                          TemplateProcessing(single, pair, special), WordPieceDecoder(),
                          _added_tokens(tokens, token_types))


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
    if model_kind == "gemma4":
        return _gemma4_tokenizer(metadata, tokens, token_types)
    if model_kind == "bert":
        return _bert_tokenizer(metadata, tokens, token_types)
    raise UnsupportedError(f"GGUF metadata: tokenizer.ggml.model = {model_kind!r} is not "
                           f"supported (known: 'gpt2', 'llama', 'gemma4', 'bert')")
