"""Character classes and pattern translation: checked over every assigned code point against
`unicodedata`, the `regex` module (which has \\p{..}) and HF `tokenizers` components."""

from __future__ import annotations

import unicodedata

import pytest

from candle_web.tokenizers import normalizers, pre_tokenizers, unicode_classes
from candle_web.tokenizers import _category_table

ASSIGNED = [chr(code_point) for code_point in range(unicode_classes.MAX_CODE_POINT + 1)
            if unicodedata.category(chr(code_point)) not in ("Cn", "Cs")]
BATCH = 2000


@pytest.mark.skipif(_category_table.UNICODE_VERSION != unicodedata.unidata_version,
                    reason="shipped table is for another Unicode version (recomputed at run time)")
def test_shipped_category_table_matches_unicodedata():
    assert _category_table.decode_runs() == unicode_classes.compute_category_runs()


def test_translated_classes_match_regex_module():
    regex = pytest.importorskip("regex")
    sample = "".join(ASSIGNED[::7])
    for pattern in (r"\p{L}+", r"\p{N}", r"[^\s\p{L}\p{N}]+", r"\p{Lu}\p{Ll}*", r"\P{P}+",
                    r"[\p{M}\p{Pc}]", r"\p{Nd}{1,3}"):
        ours = unicode_classes.compile_pattern(pattern).findall(sample)
        # regex's \s is str.isspace; White_Space written out (the pattern has it in a class).
        theirs = regex.findall(pattern.replace(r"\s", r"\t\n\x0b\f\r \x85\xa0\u1680"
                                               r"\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"),
                               sample)
        assert ours == theirs, pattern


def _batched_equal(ours, theirs, wrap):
    """Compare two string functions on every assigned character, in batches."""
    bad = []
    for start in range(0, len(ASSIGNED), BATCH):
        chunk = ASSIGNED[start:start + BATCH]
        text = " ".join(wrap(char) for char in chunk)
        if ours(text) != theirs(text):
            bad += [char for char in chunk if ours(wrap(char)) != theirs(wrap(char))]
    return bad


def test_bert_normalizer_on_every_code_point():
    hf = pytest.importorskip("tokenizers")
    reference = hf.normalizers.BertNormalizer(lowercase=True)
    bad = _batched_equal(normalizers.BertNormalizer().normalize, reference.normalize_str,
                         lambda char: "a" + char + "b")
    assert not bad, [hex(ord(char)) for char in bad[:20]]


def test_nfkc_and_punctuation_on_every_code_point():
    hf = pytest.importorskip("tokenizers")
    bad = _batched_equal(normalizers.UnicodeNormalizer("NFKC").normalize,
                         hf.normalizers.NFKC().normalize_str, lambda char: char)
    assert not bad, [hex(ord(char)) for char in bad[:20]]
    ours = pre_tokenizers.BertPreTokenizer()
    theirs = hf.pre_tokenizers.BertPreTokenizer()
    bad = _batched_equal(ours.pre_tokenize_str,
                         lambda text: [word for word, _ in theirs.pre_tokenize_str(text)],
                         lambda char: "x" + char + "x")
    assert not bad, [hex(ord(char)) for char in bad[:20]]


def test_translate_pattern_keeps_ordinary_syntax():
    translate = unicode_classes.translate_pattern
    assert translate(r"a+(?:b|c)\.") == r"a+(?:b|c)\."
    assert translate(r"[\]a]") == r"[\]a]"
    assert translate(r"\x{41}") == r"\u0041"
    with pytest.raises(unicode_classes.UnsupportedError, match="NoSuchProperty"):
        translate(r"\p{NoSuchProperty}")
