"""Malformed tokenizer.json files fail with FormatError / UnsupportedError naming the field."""

from __future__ import annotations

import json

import pytest

from candle_web.core.errors import CandleError, FormatError, UnsupportedError
from candle_web.tokenizers import Tokenizer

MINIMAL = {
    "version": "1.0", "added_tokens": [], "normalizer": None, "pre_tokenizer": None,
    "post_processor": None, "decoder": None,
    "model": {"type": "WordLevel", "vocab": {"a": 0, "<unk>": 1}, "unk_token": "<unk>"},
}


def with_changes(**changes) -> str:
    config = json.loads(json.dumps(MINIMAL))
    config.update(changes)
    return json.dumps(config)


def test_minimal_file_loads():
    tokenizer = Tokenizer.from_str(with_changes())
    assert tokenizer.encode("a").ids == [0]
    assert tokenizer.encode("zzz").ids == [1]


@pytest.mark.parametrize("text, error, field", [
    ("{not json", FormatError, "not valid JSON"),
    ("[1, 2]", FormatError, "top level"),
    (json.dumps({k: v for k, v in MINIMAL.items() if k != "model"}), FormatError, "'model'"),
    (with_changes(model={"type": "Transformer", "vocab": {}}), UnsupportedError, "Transformer"),
    (with_changes(model={"type": "BPE", "vocab": {"a": 0}, "merges": ["a b"]}), FormatError,
     "merges[0]"),
    (with_changes(model={"type": "BPE", "vocab": {"a": "zero"}, "merges": []}), FormatError,
     "vocab['a']"),
    (with_changes(model={"type": "Unigram", "vocab": [["a", 0.0]], "unk_id": 5}), FormatError,
     "unk_id"),
    (with_changes(normalizer={"type": "Fancy"}), UnsupportedError, "normalizer"),
    (with_changes(normalizer={"type": "Sequence", "normalizers": [{"type": "Nope"}]}),
     UnsupportedError, "normalizer.normalizers[0]"),
    (with_changes(pre_tokenizer={"type": "Split", "pattern": {"Regex": "a"}}), FormatError,
     "behavior"),
    (with_changes(pre_tokenizer={"type": "Metaspace", "replacement": "ab"}), FormatError,
     "replacement"),
    (with_changes(decoder={"type": "Mystery"}), UnsupportedError, "decoder"),
    (with_changes(post_processor={"type": "TemplateProcessing", "single": [
        {"SpecialToken": {"id": "[X]", "type_id": 0}}], "pair": [], "special_tokens": {}}),
     FormatError, "[X]"),
    (with_changes(added_tokens=[{"id": 3}]), FormatError, "added_tokens[0]"),
    (with_changes(padding={"strategy": "Sometimes"}), FormatError, "padding.strategy"),
    (with_changes(truncation={"max_length": -1}), FormatError, "truncation.max_length"),
])
def test_malformed_file_is_rejected_with_field(text, error, field):
    with pytest.raises(error) as caught:
        Tokenizer.from_str(text)
    assert field in str(caught.value)
    assert isinstance(caught.value, CandleError)


def test_not_utf8_bytes():
    with pytest.raises(FormatError, match="UTF-8"):
        Tokenizer.from_bytes(b"\xff\xfe{}")


def test_truncated_precompiled_charsmap_is_a_format_error():
    # "AAAA" is 3 bytes: not even the trie size header (test_precompiled.py has the rest).
    text = with_changes(normalizer={"type": "Precompiled", "precompiled_charsmap": "AAAA"})
    with pytest.raises(FormatError, match=r"normalizer.precompiled_charsmap: 3 bytes"):
        Tokenizer.from_str(text)
