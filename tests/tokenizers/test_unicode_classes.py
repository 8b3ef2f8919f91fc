"""Character classes and pattern translation: checked over every code point against HF
`tokenizers` (whose Oniguruma classes the shipped table copies), against the `regex` module
(which has \\p{..}) where both know the character, and normalizers against HF components."""

from __future__ import annotations

import unicodedata

import pytest

from candle_web.tokenizers import normalizers, pre_tokenizers, unicode_classes
from candle_web.tokenizers import _category_table, _category_table_generator

ASSIGNED = [chr(code_point) for code_point in range(unicode_classes.MAX_CODE_POINT + 1)
            if unicodedata.category(chr(code_point)) not in ("Cn", "Cs")]
# Every code point a Rust string (so HF) can hold.
ALL_BUT_SURROGATES = "".join(chr(code_point)
                             for code_point in range(unicode_classes.MAX_CODE_POINT + 1)
                             if not 0xD800 <= code_point <= 0xDFFF)
BATCH = 2000
# Every 7th code point: all categories and blocks, at a seventh of the cost.
SAMPLE_STEP = 7


def test_shipped_category_table_matches_hf():
    """The shipped table is what HF's regex engine says today, for all 1.1 M code points."""
    tokenizers = pytest.importorskip("tokenizers")
    # A failure after upgrading tokenizers means its Unicode tables moved: regenerate the table
    # with `python -m candle_web.tokenizers._category_table_generator`.
    assert _category_table.decode_runs() == _category_table_generator.probe_hf_category_runs(), (
        f"table probed with {_category_table.PROBED_WITH}, HF is {tokenizers.__version__}")


@pytest.mark.parametrize("class_escape, negated_escape", [
    (r"\w", r"\W"), (r"\d", r"\D"), (r"\s", r"\S"), (r"\p{N}", r"\P{N}"), (r"\p{P}", r"\P{P}"),
])
def test_translated_classes_match_hf_on_every_code_point(class_escape, negated_escape):
    """End to end through the translation, derived classes too (Oniguruma's \\w is not only
    categories). Plain categories are covered by the table test above."""
    tokenizers = pytest.importorskip("tokenizers")
    ours = "".join(unicode_classes.compile_pattern(class_escape).findall(ALL_BUT_SURROGATES))
    # Removing every run of the negated class leaves exactly HF's members, in order.
    keep_members = tokenizers.normalizers.Replace(tokenizers.Regex(negated_escape + "+"), "")
    theirs = keep_members.normalize_str(ALL_BUT_SURROGATES)
    assert ours == theirs, sorted(set(ours).symmetric_difference(theirs))[:20]


def test_translated_classes_match_regex_module():
    """Pattern translation against an independent engine. `regex` has its own Unicode version
    (17 in 2026.11), so the sample keeps characters both tables assign to the same category
    (this drops the ones added after Unicode 16 and the rare recategorised ones, e.g. U+0295)."""
    regex = pytest.importorskip("regex")
    sample_chars = []
    for code_point in range(0, unicode_classes.MAX_CODE_POINT + 1, SAMPLE_STEP):
        category = unicode_classes.category_of(code_point)
        if category not in ("Cn", "Cs") and regex.fullmatch(rf"\p{{{category}}}", chr(code_point)):
            sample_chars.append(chr(code_point))
    sample = "".join(sample_chars)
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
