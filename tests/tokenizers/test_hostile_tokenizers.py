"""Hostile tokenizer.json files and GGUF vocabularies (issue 17): each input an outside fuzzing
pass found raising an untyped exception, hanging or exhausting memory now fails at load with a
CandleError naming the field and, where there is one, the limit."""

from __future__ import annotations

import json

import numpy as np
import pytest

from candle_web.core.errors import CandleError, FormatError, UnsupportedError
from candle_web.tokenizers import Tokenizer
from candle_web.tokenizers.fields import MAX_PADDED_LENGTH, MAX_SEQUENCE_NESTING

WORD_LEVEL = {"type": "WordLevel", "vocab": {"a": 0, "<unk>": 1, "[CLS]": 2},
              "unk_token": "<unk>"}
TEMPLATE = {"type": "TemplateProcessing", "single": "[CLS] $A", "pair": "[CLS] $A $B:1",
            "special_tokens": {"[CLS]": {"id": "[CLS]", "ids": [2], "tokens": ["[CLS]"]}}}


def tokenizer_json(**changes) -> str:
    config = {"version": "1.0", "added_tokens": [], "normalizer": None, "pre_tokenizer": None,
              "post_processor": None, "decoder": None, "model": WORD_LEVEL}
    config.update(changes)
    return json.dumps(config)


def rejected(text: str, error=FormatError) -> str:
    with pytest.raises(error) as caught:
        Tokenizer.from_str(text)
    assert isinstance(caught.value, CandleError)
    return str(caught.value)


def test_the_base_file_loads_and_encodes():
    tokenizer = Tokenizer.from_str(tokenizer_json(post_processor=TEMPLATE))
    assert tokenizer.encode("a").ids == [2, 0]
    assert tokenizer.encode("a", "a").type_ids == [0, 0, 1]


# ---- the JSON text -----------------------------------------------------------------------

def test_json_nested_1000_deep_is_a_format_error():
    message = rejected(tokenizer_json(normalizer="@").replace('"@"', "[" * 1000 + "]" * 1000))
    assert "nested deeper" in message and "recursion limit" in message


def test_integer_literal_over_4300_digits_is_a_format_error():
    message = rejected(tokenizer_json(padding={"pad_id": "@"}).replace('"@"', "7" * 5000))
    assert "4300" in message and "the number at character" in message


# ---- fields of the wrong type or out of range ----------------------------------------------

WORD_PIECE = {"type": "WordPiece", "vocab": {"[UNK]": 0, "a": 1}, "unk_token": "[UNK]",
              "continuing_subword_prefix": "##", "max_input_chars_per_word": "x"}


@pytest.mark.parametrize("text, field", [
    (tokenizer_json(post_processor=dict(TEMPLATE, single=[5])), "post_processor.single[0]"),
    (tokenizer_json(post_processor=dict(TEMPLATE, single="[CLS] $B")),
     "post_processor.single[1]"),
    (tokenizer_json(post_processor=dict(TEMPLATE, single=[{"Sequence": {"id": "B"}}])),
     "post_processor.single[0]"),
    (tokenizer_json(model={"type": "Unigram", "vocab": [["a", "high"]], "unk_id": 0}),
     "model.vocab[0][1]"),
    (tokenizer_json(model={"type": "Unigram", "vocab": [["a", None]], "unk_id": 0}),
     "model.vocab[0][1]"),
    (tokenizer_json(model=WORD_PIECE), "model.max_input_chars_per_word"),
    (tokenizer_json(padding={"pad_id": "0"}), "padding.pad_id"),
    (tokenizer_json(normalizer={"type": "Sequence", "normalizers": [None]}),
     "normalizer.normalizers[0]"),
    (tokenizer_json(normalizer={"type": "Prepend", "prepend": 3}), "normalizer.prepend"),
    (tokenizer_json(decoder={"type": "Strip", "content": " ", "start": "1", "stop": 0}),
     "decoder.start"),
    (tokenizer_json(added_tokens=[{"id": 3, "content": "x", "special": "yes"}]),
     "added_tokens[0].special"),
])
def test_field_of_wrong_type_is_rejected_at_load(text, field):
    assert field in rejected(text)


@pytest.mark.parametrize("padding, field", [
    ({"strategy": {"Fixed": 1_000_000_000}}, "padding.strategy.Fixed"),
    ({"strategy": "BatchLongest", "pad_to_multiple_of": 1_000_000_000},
     "padding.pad_to_multiple_of"),
])
def test_padding_length_is_bounded_at_load(padding, field):
    message = rejected(tokenizer_json(padding=padding))
    assert field in message and str(MAX_PADDED_LENGTH) in message


def test_padding_at_the_limit_still_works():
    tokenizer = Tokenizer.from_str(tokenizer_json(padding={"strategy": {"Fixed": 8}}))
    assert tokenizer.encode("a").ids == [0] + [0] * 7
    with pytest.raises(FormatError, match=str(MAX_PADDED_LENGTH)):
        tokenizer.enable_padding(length=MAX_PADDED_LENGTH + 1)


def test_sequences_nested_past_the_limit_are_refused():
    normalizer = {"type": "Lowercase"}
    for _ in range(MAX_SEQUENCE_NESTING + 2):
        normalizer = {"type": "Sequence", "normalizers": [normalizer]}
    message = rejected(tokenizer_json(normalizer=normalizer))
    assert f"more than {MAX_SEQUENCE_NESTING} levels" in message


# ---- regexes that backtrack catastrophically ----------------------------------------------

CATASTROPHIC = "(a+)+c"


@pytest.mark.timeout(10)
@pytest.mark.parametrize("changes, field", [
    ({"pre_tokenizer": {"type": "Split", "pattern": {"Regex": CATASTROPHIC},
                        "behavior": "Isolated", "invert": False}}, "pre_tokenizer.pattern"),
    ({"normalizer": {"type": "Replace", "pattern": {"Regex": CATASTROPHIC}, "content": "x"}},
     "normalizer.pattern"),
    ({"decoder": {"type": "Replace", "pattern": {"Regex": CATASTROPHIC}, "content": "x"}},
     "decoder.pattern"),
])
def test_catastrophic_regex_is_refused_at_load(changes, field):
    # Refused by Tokenizer.from_str itself: encode("a" * 28) would run for minutes.
    message = rejected(tokenizer_json(**changes), UnsupportedError)
    assert field in message and CATASTROPHIC in message and "backtrack" in message


@pytest.mark.timeout(10)
@pytest.mark.parametrize("pattern", [
    "(a*)*b", "(a|aa)+b", r"(\s*\w+)*!", "(a?){30}a{30}", "(?:a+){2}b", "(?i:(?:ab|AB)+)c",
])
def test_other_exponential_shapes_are_refused(pattern):
    from candle_web.tokenizers.unicode_classes import compile_pattern
    with pytest.raises(UnsupportedError, match="backtrack"):
        compile_pattern(pattern, "field")


@pytest.mark.parametrize("pattern", [
    # The patterns of real files (GPT-2, Llama 3, Qwen 2, o200k-style, T5 spaces) and
    # repeats that are only polynomial or delimited.
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+",
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}"
    "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+"
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*",
    " {2,}", "(?:\\d{1,3},)+", "(\\w|\\d)+x",
])
def test_real_and_polynomial_patterns_are_accepted(pattern):
    text = tokenizer_json(pre_tokenizer={"type": "Split", "pattern": {"Regex": pattern},
                                         "behavior": "Isolated", "invert": False})
    assert Tokenizer.from_str(text).encode("a aa").ids


@pytest.mark.parametrize("pattern, message", [
    ("\\x{zz}", "bad escape"),
    ("(" * 40 + ")" * 40, "levels deep"),
    ("(" * 5000 + ")" * 5000, "cannot be run"),
    ("a{99999999999}", "cannot be run"),
])
def test_unusable_regexes_are_typed_errors(pattern, message):
    text = tokenizer_json(normalizer={"type": "Replace", "pattern": {"Regex": pattern},
                                      "content": ""})
    assert message in rejected(text, UnsupportedError)


# ---- messages name the file -------------------------------------------------------------

def test_errors_from_a_file_name_the_file(tmp_path):
    path = tmp_path / "hostile-tokenizer.json"
    path.write_text(tokenizer_json(padding={"pad_id": "0"}), encoding="utf-8")
    with pytest.raises(FormatError) as caught:
        Tokenizer.from_file(path)
    assert str(path) in str(caught.value) and "padding.pad_id" in str(caught.value)


# ---- GGUF vocabularies ------------------------------------------------------------------

def sentencepiece_metadata(**changes) -> dict:
    pieces = ["<unk>", "<s>", "</s>", "\u2581a", "a", "\u2581"]
    metadata = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": pieces,
                "tokenizer.ggml.scores": np.array([0.0, 0.0, 0.0, -1.0, -2.0, -3.0], np.float32),
                "tokenizer.ggml.token_type": np.array([2, 3, 3, 1, 1, 1], np.int32),
                "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2,
                "tokenizer.ggml.add_bos_token": True}
    metadata.update({"tokenizer.ggml." + key: value for key, value in changes.items()})
    return metadata


def test_gguf_base_vocabulary_loads():
    assert Tokenizer.from_gguf_metadata(sentencepiece_metadata()).encode("a").ids == [1, 3]


@pytest.mark.parametrize("changes, field", [
    ({"tokens": ["<unk>", 5, "</s>", "\u2581a", "a", "\u2581"]}, "tokenizer.ggml.tokens[1]"),
    ({"tokens": "not an array"}, "tokenizer.ggml.tokens"),
    ({"bos_token_id": "1"}, "tokenizer.ggml.bos_token_id"),
    ({"bos_token_id": 99}, "tokenizer.ggml.bos_token_id"),
    ({"add_bos_token": np.array([True, False])}, "tokenizer.ggml.add_bos_token"),
    ({"scores": np.array([0.0, 0.0, 0.0, np.nan, 0.0, 0.0])}, "tokenizer.ggml.scores[3]"),
    ({"token_type": [2, 3, 3, "x", 1, 1]}, "tokenizer.ggml.token_type[3]"),
    ({"model": ["llama"]}, "tokenizer.ggml.model"),
])
def test_gguf_vocabulary_of_wrong_type_is_rejected(changes, field):
    with pytest.raises(FormatError) as caught:
        Tokenizer.from_gguf_metadata(sentencepiece_metadata(**changes))
    assert field in str(caught.value)
