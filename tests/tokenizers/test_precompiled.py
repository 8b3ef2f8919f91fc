"""SentencePiece "Precompiled" normalizer against HF `tokenizers`.

Real data: the tokenizer.json of multilingual-e5-small (XLM-R's SentencePiece Unigram, whose
charsmap is SentencePiece's nmt_nfkc rule set: 224,711 keys). Compared with HF on the whole
tokenizer (ids, tokens, masks, decoding) over the varied corpus, then the normalizer alone on
every assigned code point, on the trie's own keys and on seeded key + combining-mark sequences.
Hand-made charsmaps (tests/tokenizers/charsmap_testlib.py) add what nmt_nfkc lacks: printable
ASCII keys, CR LF as a key, keys whose shorter prefix is also a key, and they probe HF's
grapheme boundaries for every code point. Zero differences allowed everywhere.
"""

from __future__ import annotations

import base64
import json
import random
import struct

import pytest

from candle_web.core.errors import CandleError, FormatError
from candle_web.tokenizers import Tokenizer
from candle_web.tokenizers import _grapheme_table
from candle_web.tokenizers.precompiled import (LABEL_MASK, LEAF_FLAG_SHIFT,
                                               PrecompiledNormalizer, _unit_offset)
from tests.tokenizers.charsmap_testlib import build_charsmap
from tests.tokenizers.comparison_testlib import corpus_for, differences, report

hf = pytest.importorskip("tokenizers")

REAL_FILE = ("multilingual-e5-small", "tokenizer.json")
BATCH = 400
# A control character never joins a grapheme (GB4/GB5): a safe separator for batching.
SEPARATOR = "\n"
MAX_CODE_POINT = 0x10FFFF
SURROGATES = range(0xD800, 0xE000)


# Where every grapheme-extending character lives: the BMP, the SMP and plane 14 (tags,
# variation selectors); planes 2-3 are CJK ideographs, 4-13 unassigned, 15-16 private use.
GRAPHEME_PLANES = [*range(0, 0x20000), *range(0xE0000, 0xE1000)]


def all_code_points():
    return [chr(code) for code in range(MAX_CODE_POINT + 1) if code not in SURROGATES]


def mismatches(ours, theirs, items) -> list:
    """Items on which the two normalizers differ; compared in batches, narrowed on failure."""
    bad = []
    for start in range(0, len(items), BATCH):
        chunk = items[start:start + BATCH]
        text = SEPARATOR.join(chunk)
        if ours.normalize(text) != theirs.normalize_str(text):
            bad += [item for item in chunk if ours.normalize(item) != theirs.normalize_str(item)]
    return bad


def printable(items) -> list:
    return [" ".join(f"U+{ord(char):04X}" for char in item) for item in items[:10]]


LEAD_BYTES = [*range(0x01, 0x80), *range(0xC2, 0xF5)]
CONTINUATION_BYTES = range(0x80, 0xC0)


def _continuations(lead: int) -> int:
    return 0 if lead < 0x80 else 1 if lead < 0xE0 else 2 if lead < 0xF0 else 3


def trie_keys(units, max_chars: int) -> list:
    """The keys of a double-array trie of at most `max_chars` characters, by a depth-first
    walk that probes only bytes valid at each point of UTF-8 (the keys are UTF-8 text)."""
    keys = []
    # (base of the node, key bytes so far, characters completed, continuation bytes due)
    pending = [(_unit_offset(units[0]), b"", 0, 0)]
    while pending:
        base, prefix, chars, due = pending.pop()
        for byte in (CONTINUATION_BYTES if due else LEAD_BYTES):
            position = base ^ byte
            if position >= len(units) or units[position] & LABEL_MASK != byte:
                continue
            unit = units[position]
            left = due - 1 if due else _continuations(byte)
            done = chars + (left == 0)
            if (unit >> LEAF_FLAG_SHIFT) & 1 and left == 0:
                keys.append((prefix + bytes([byte])).decode("utf-8"))
            if done < max_chars or left:
                pending.append((position ^ _unit_offset(unit), prefix + bytes([byte]), done,
                                left))
    return keys


@pytest.fixture(scope="module")
def real_path(model_file):
    return model_file(*REAL_FILE)


@pytest.fixture(scope="module")
def real_normalizers(real_path):
    config = json.loads(real_path.read_text(encoding="utf-8"))["normalizer"]
    precompiled = [entry for entry in config["normalizers"] if entry["type"] == "Precompiled"]
    assert len(precompiled) == 1
    blob = base64.b64decode(precompiled[0]["precompiled_charsmap"])
    return PrecompiledNormalizer(blob), hf.normalizers.Precompiled(blob)


def test_real_tokenizer_identical_to_hf_on_varied_corpus(real_path):
    mine = Tokenizer.from_file(real_path)
    reference = hf.Tokenizer.from_file(str(real_path))
    specials = [entry["content"] for entry in
                json.loads(real_path.read_text(encoding="utf-8"))["added_tokens"]]
    corpus = corpus_for(specials, random_count=250, seed=3)
    found = differences(mine, reference, corpus)
    assert not found, report(found)
    pairs = [("query: how are you?", "passage: très bien, ｆｕｌｌｗｉｄｔｈ ①"), ("", "x")]
    for first, second in pairs:
        assert mine.encode_pair(first, second).ids == reference.encode(first, second).ids


def test_real_charsmap_on_every_assigned_code_point(real_normalizers):
    ours, theirs = real_normalizers
    import unicodedata
    assigned = [char for char in all_code_points()
                if unicodedata.category(char) not in ("Cn", "Co")]
    bad = mismatches(ours, theirs, assigned)
    assert not bad, printable(bad)


def test_real_charsmap_keys_and_combining_sequences(real_normalizers):
    ours, theirs = real_normalizers
    keys = trie_keys(ours.trie.units, max_chars=2)
    # nmt_nfkc: NFKC mappings and removals (one character), compositions (two or more).
    assert len(keys) > 15_000
    rng = random.Random(7)
    bad = mismatches(ours, theirs, keys)
    assert not bad, printable(bad)
    # Graphemes of under 6 bytes are looked up whole: a key's first character followed by
    # marks, joiners and spacing marks, before or after, is where that rule shows.
    firsts = sorted({key[0] for key in keys})
    joining = [chr(code) for first, last, _ in _grapheme_table.decode_ranges()
               for code in range(first, last + 1) if code not in SURROGATES]
    sequences = []
    for _ in range(15_000):
        sequences.append(rng.choice(firsts) + rng.choice(joining))
        sequences.append(rng.choice(firsts) + rng.choice(joining) + rng.choice(joining))
        sequences.append(rng.choice(joining) + rng.choice(firsts) + rng.choice(joining))
    bad = mismatches(ours, theirs, sequences)
    assert not bad, printable(bad)


HANDMADE_RULES = {
    "a": "<a>", "ab": "<ab>", "x": "ks", "\t": " ", "\x01": "", "\r\n": "<crlf>",
    "e\u0301": "\u00e9", "\uff21": "A", "\uff21\u0301": "\u00c1", "\U0001d400": "A",
    "\U0001f600": ":)", "\u0600": "<prepend>", "\u00a0": " ", "\u3000\u3000": "<2 ideo>",
    "\u1100\u1161": "\uac00", "\u0915\u094d": "<ka-virama>", "\U0001f1eb\U0001f1f7": "<fr>",
}


@pytest.fixture(scope="module")
def handmade():
    blob = build_charsmap(HANDMADE_RULES)
    return PrecompiledNormalizer(blob), hf.normalizers.Precompiled(blob), blob


def test_handmade_rules_match_hf(handmade):
    ours, theirs, _ = handmade
    rng = random.Random(5)
    alphabet = sorted({char for key in HANDMADE_RULES for char in key}
                      | set("bcy \r\n\u0301\u0308\u200d\u094d\u0915\U0001f3fb\ufe0f"))
    strings = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 8)))
               for _ in range(4000)]
    strings += corpus_for(random_count=300, seed=9)
    bad = mismatches(ours, theirs, strings)
    assert not bad, printable(bad)
    # The shortest key prefix wins, and the whole grapheme is replaced by it.
    assert ours.normalize("\uff21\u0301b") == "Ab"
    assert ours.normalize("a\r\nx") == "<a><crlf>ks"


def test_grapheme_boundaries_match_hf_for_every_code_point(handmade):
    """'a' is a key: HF turns "a" + X into "<a>" alone exactly when X joins a's grapheme
    (GB9/9a, and never for controls); "\u0600" (Prepend) + X joins unless X is a control.
    Unassigned code points are included: HF's tables are newer than this Python's."""
    ours, theirs, _ = handmade
    characters = [chr(code) for code in GRAPHEME_PLANES if code not in SURROGATES]
    bad = mismatches(ours, theirs, ["a" + char for char in characters])
    assert not bad, printable(bad)
    bad = mismatches(ours, theirs, ["\u0600" + char for char in characters[::5]
                                    if len(char.encode("utf-8")) < 4])
    assert not bad, printable(bad)


def test_tokenizer_json_with_handmade_charsmap(handmade):
    _, _, blob = handmade
    config = {
        "version": "1.0", "added_tokens": [], "post_processor": None,
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Precompiled", "precompiled_charsmap": base64.b64encode(blob).decode()},
            {"type": "Replace", "pattern": {"Regex": " {2,}"}, "content": " "}]},
        "pre_tokenizer": {"type": "Metaspace", "replacement": "\u2581",
                          "prepend_scheme": "first", "split": True},
        "decoder": {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first",
                    "split": True},
        "model": {"type": "Unigram", "unk_id": 0, "byte_fallback": False, "vocab": [
            ["<unk>", 0.0], ["\u2581", -2.0], ["<a>", -1.0], ["ks", -1.5], ["\u2581<a>", -1.0],
            ["b", -3.0], ["c", -3.0], ["y", -3.0], ["\u00e9", -3.0], ["A", -2.5]]},
    }
    text = json.dumps(config)
    mine = Tokenizer.from_str(text)
    reference = hf.Tokenizer.from_str(text)
    corpus = ["\x01abc", "\x01", "x a b", "a\u0301\u0301", "\t\tab", "e\u0301 \uff21\u0301"]
    found = differences(mine, reference, corpus + corpus_for(random_count=100, seed=2))
    assert not found, report(found)


def _blob_with(trie_size: int, units: list, pool: bytes) -> str:
    raw = struct.pack("<I", trie_size) + struct.pack(f"<{len(units)}I", *units) + pool
    return base64.b64encode(raw).decode()


@pytest.mark.parametrize("charsmap, message", [
    ("not base64!", "invalid base64"),
    (12, "expected a base64 string"),
    (base64.b64encode(b"\x01\x00").decode(), "too short"),
    (_blob_with(4000, [0, 0], b""), "header says the trie has 4000 bytes"),
    (_blob_with(6, [0, 0], b""), "not a multiple of 4"),
    (_blob_with(0, [], b"a\0"), "trie is empty"),
    (_blob_with(8, [0, 0], b"\xff\xfe\0"), "not UTF-8"),
])
def test_malformed_charsmap_is_a_format_error(charsmap, message):
    config = {"type": "Precompiled", "precompiled_charsmap": charsmap}
    with pytest.raises(FormatError, match=message) as caught:
        Tokenizer.from_dict({"model": {"type": "WordLevel", "vocab": {"a": 0},
                                       "unk_token": "a"}, "normalizer": config})
    assert "normalizer.precompiled_charsmap" in str(caught.value)


def test_lying_trie_and_pool_offsets_are_format_errors():
    blob = bytearray(build_charsmap({"\u00e0": "x", "\u00e1": "yyyy", "\u00e2": "zz"}))
    # The root's child offset pointing far outside the array: the walk is checked (the
    # ASCII lookups done at load already walk it).
    corrupted = bytearray(blob)
    struct.pack_into("<I", corrupted, 4, 0x3FFFFF << 10)
    with pytest.raises(FormatError, match="past the end of the"):
        PrecompiledNormalizer(bytes(corrupted))
    # Pool "x\0yyyy\0zz\0" cut to "x\0": the third key (offset 7) points past its end;
    # the second (offset 2, the pool's length) reads an empty string, as HF does.
    cut = PrecompiledNormalizer(bytes(blob[:-len("yyyy\0zz\0")]))
    assert cut.normalize("\u00e0") == "x"
    assert cut.normalize("\u00e1") == ""
    with pytest.raises(FormatError, match="replacement offset 7 is past the end") as caught:
        cut.normalize("\u00e2")
    assert isinstance(caught.value, CandleError)


def test_grapheme_regex_agrees_with_rule_by_rule_segmentation():
    """The fast path (one regex over category codes) against the rules applied one by one,
    on seeded strings dense in every break class (Hangul, RI, emoji ZWJ, Indic conjuncts)."""
    from candle_web.tokenizers.graphemes import graphemes, segment_by_rules
    special = [chr(code) for first, last, _ in _grapheme_table.decode_ranges()
               for code in range(first, last + 1) if code not in SURROGATES]
    pool = special + list("ab \r\n\u1100\u1161\u11a8\uac00\uac01\u0915\u094d\u200d")
    rng = random.Random(11)
    for _ in range(5000):
        text = "".join(rng.choice(pool) for _ in range(rng.randint(1, 8)))
        assert graphemes(text) == segment_by_rules(text), [hex(ord(char)) for char in text]
