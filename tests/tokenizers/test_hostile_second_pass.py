"""Issue 28, hostile inputs second pass: the tokenizer findings of the outside fuzzer. Each
reproducer runs in a child process capped at 200 MB over the interpreter (tests/bounded_run_testlib.py)
and ends in a typed error naming the argument or field, or in the same result as HF
`tokenizers` (the independent reference)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.bounded_run_testlib import assert_typed_error, run_bounded
from candle_web.core.errors import FormatError, InvalidText, UnsupportedError
from candle_web.tokenizers import Tokenizer

hf = pytest.importorskip("tokenizers")

# ---- 1. lone surrogates -----------------------------------------------------------------------

# The registry's files (`make models` fetches them), found as the package finds them: the
# model_file fixture asks hub.fetch for the cached copy, wherever CANDLE_WEB_CACHE puts the cache,
# and fails naming the fetch command when one is missing (never a skip).
REAL_TOKENIZERS = {
    "whisper": ("whisper-tiny.en", "tokenizer.json"),
    "multilingual-e5": ("multilingual-e5-small", "tokenizer.json"),
    "minilm": ("all-minilm-l6-v2", "tokenizer.json"),
}
SMOLLM2_GGUF = ("smollm2-135m-instruct", "SmolLM2-135M-Instruct.Q4_1.gguf")


@pytest.fixture(scope="module", params=[*REAL_TOKENIZERS, "smollm2"])
def real_tokenizer(request, model_file):
    if request.param == "smollm2":
        from candle_web.io.gguf import GgufFile

        return Tokenizer.from_gguf_metadata(GgufFile(model_file(*SMOLLM2_GGUF)).metadata)
    return Tokenizer.from_file(model_file(*REAL_TOKENIZERS[request.param]))


@pytest.mark.parametrize("text, shown", [
    ("\udcff", "byte 0xFF that is not UTF-8 (U+DCFF) at character 0"),
    ("caf\udce9!", "byte 0xE9 that is not UTF-8 (U+DCE9) at character 3"),
    ("a\ud800b", "a lone surrogate U+D800 at character 1"),
])
def test_lone_surrogates_are_refused_naming_the_argument(real_tokenizer, text, shown):
    """The finding: UnicodeEncodeError from byte_level.py / precompiled.py. HF refuses such a
    str too (TypeError "TextInputSequence must be str"): no replacement, one typed error."""
    with pytest.raises(InvalidText) as caught:
        real_tokenizer.encode(text)
    assert str(caught.value).startswith(f"encode: text: not valid text: {shown}")
    with pytest.raises(InvalidText, match="^encode: pair: "):
        real_tokenizer.encode("fine", text)
    with pytest.raises(InvalidText):
        real_tokenizer.encode_batch(["fine", text])
    assert real_tokenizer.encode("caf\u00e9!").ids  # the same text, valid, still encodes


def test_hf_refuses_them_too_and_the_hf_backend_gives_the_same_error(model_file):
    path = model_file(*REAL_TOKENIZERS["whisper"])
    with pytest.raises(TypeError):
        hf.Tokenizer.from_file(str(path)).encode("\udcff")
    wrapped = Tokenizer.from_file(path, backend="hf")
    with pytest.raises(InvalidText, match="^encode: text: not valid text: byte 0xFF"):
        wrapped.encode("\udcff")
    with pytest.raises(InvalidText):
        wrapped.encode_batch([("ok", "\udcff")])


def test_a_lone_surrogate_inside_tokenizer_json_is_refused_at_load():
    """HF's JSON parser refuses "\\ud800" without its partner; a valid pair still loads."""
    config = {"version": "1.0", "added_tokens": [], "pre_tokenizer": None,
              "post_processor": None, "decoder": None,
              "normalizer": {"type": "Replace", "pattern": {"String": "a"}, "content": "\ud800"},
              "model": {"type": "WordLevel", "vocab": {"a": 0, "<unk>": 1},
                        "unk_token": "<unk>"}}
    text = json.dumps(config)
    assert "\\ud800" in text
    with pytest.raises(Exception):
        hf.Tokenizer.from_str(text)
    with pytest.raises(FormatError, match=r"normalizer\.content: not valid text: a lone "
                                          r"surrogate U\+D800"):
        Tokenizer.from_str(text)
    config["normalizer"]["content"] = "\U0001F600"  # written as the pair \ud83d\ude00
    text = json.dumps(config)
    assert "\\ud83d\\ude00" in text
    assert Tokenizer.from_str(text).encode("a").tokens == hf.Tokenizer.from_str(text).encode(
        "a").tokens


def test_byte_level_called_directly_raises_the_same_error():
    from candle_web.tokenizers.byte_level import bytes_to_unicode_text

    with pytest.raises(InvalidText, match="ByteLevel: text"):
        bytes_to_unicode_text("x\udcff")


# ---- 2. a vocabulary built to blow up the merges ------------------------------------------------

def repeated_a_metadata(count: int) -> dict:
    """The finding's GGUF vocabulary: 'a', 'aa', ..., 'a' * count, SentencePiece ("llama")."""
    tokens = ["<unk>", "<s>", "</s>"] + ["a" * length for length in range(1, count + 1)]
    return {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.scores": np.array([0.0, 0.0, 0.0] + [-float(length) for length
                                                                 in range(1, count + 1)],
                                              np.float32),
            "tokenizer.ggml.token_type": np.array([2, 3, 3] + [1] * count, np.int32),
            "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2,
            "tokenizer.ggml.add_bos_token": False, "tokenizer.ggml.add_space_prefix": False}


def test_repeated_a_vocabulary_gives_hfs_ids():
    """Small enough for the full merge list: HF's BPE on the merges HF's converter would make
    (gguf_vocab.sentencepiece_merges) against the per-pair ranks."""
    from candle_web.tokenizers.gguf_vocab import sentencepiece_merges

    metadata = repeated_a_metadata(60)
    tokens = metadata["tokenizer.ggml.tokens"]
    scores = metadata["tokenizer.ggml.scores"].tolist()
    reference = hf.Tokenizer(hf.models.BPE({t: i for i, t in enumerate(tokens)},
                                           [tuple(m) for m in sentencepiece_merges(tokens, scores)],
                                           unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    mine = Tokenizer.from_gguf_metadata(metadata)
    for length in (1, 2, 7, 59, 60, 61, 150, 1000):
        assert mine.encode("a" * length).ids == reference.encode("a" * length).ids, length


def test_repeated_a_vocabulary_of_1800_pieces_builds_within_200_mb(tmp_path):
    """The finding: N = 1,800 (a 1.65 MB GGUF) exhausted 2 GiB building ~N^2/2 merges."""
    from candle_web.io.gguf import write_gguf

    path = tmp_path / "vocab.gguf"
    write_gguf(path, repeated_a_metadata(1800), {})
    assert path.stat().st_size < 2_000_000  # the finding's file: 1.65 MB
    result = run_bounded("""
        tokenizer = Tokenizer.from_gguf_metadata(GgufFile(path).metadata)
        _result["value"] = [tokenizer.encode("a" * 1000).ids, tokenizer.encode("a" * 300).ids]
        """, setup=f"from candle_web.io.gguf import GgufFile\n"
                   f"from candle_web.tokenizers import Tokenizer\npath = {str(path)!r}")
    assert result["outcome"] == "ok", result
    long_ids, short_ids = result["value"]
    assert sum(token_id - 2 for token_id in long_ids) == 1000  # id 2 + k is 'a' * k
    assert short_ids == [2 + length for length in naive_sentencepiece_bpe(300, 1800)]


def naive_sentencepiece_bpe(count: int, vocabulary: int) -> list:
    """SentencePiece BPE on 'a' * count by its definition, written out (no rank table): merge
    the adjacent pair whose merged piece scores best (-length here; the shorter left half
    first among equal pieces, as the merge list orders them), leftmost among equal pairs."""
    pieces = [1] * count
    while True:
        best = None
        for index in range(len(pieces) - 1):
            merged = pieces[index] + pieces[index + 1]
            if merged <= vocabulary and (best is None
                                         or (merged, pieces[index]) < best[0]):
                best = ((merged, pieces[index]), index)
        if best is None:
            return pieces
        index = best[1]
        pieces[index:index + 2] = [best[0][0]]


# ---- 3. polynomial regexes -------------------------------------------------------------------

def regex_tokenizer(where: str, pattern: str) -> str:
    config = {"version": "1.0", "added_tokens": [], "normalizer": None, "pre_tokenizer": None,
              "post_processor": None, "decoder": None,
              "model": {"type": "WordLevel", "vocab": {"a": 0, "<unk>": 1}, "unk_token": "<unk>"}}
    if where == "normalizer":
        config["normalizer"] = {"type": "Replace", "pattern": {"Regex": pattern}, "content": "x"}
    else:
        config["pre_tokenizer"] = {"type": "Split", "pattern": {"Regex": pattern},
                                   "behavior": "Isolated", "invert": False}
    return json.dumps(config)


POLYNOMIAL = [(".*.*.*.*.*=", "a" * 3000), ("\\s*\\s*\\s*\\s*\\s*\\s*\\s*x", " " * 3000),
              ("a*a*b", "a" * 3000)]


@pytest.mark.parametrize("where", ["normalizer", "pre_tokenizer"])
@pytest.mark.parametrize("pattern, text", POLYNOMIAL)
def test_polynomial_regexes_are_refused_at_load(where, pattern, text):
    """The finding: these loaded, then encode ran 5 s to past 20 s (a*a*b on 3,000 'a': 31 s
    in CPython's re here)."""
    result = run_bounded("Tokenizer.from_str(config).encode(text)",
                         setup=f"from candle_web.tokenizers import Tokenizer\n"
                               f"config = {regex_tokenizer(where, pattern)!r}\ntext = {text!r}")
    assert_typed_error(result, f"{where}.pattern", repr(pattern), "polynomially")
    with pytest.raises(UnsupportedError):
        Tokenizer.from_str(regex_tokenizer(where, pattern))


@pytest.mark.parametrize("pattern", [
    ".*=.*=", "(a*)(a*)b", "\\s*,?\\s*x", "a+a+$", "(?:a*|b)a*c", "a*a*(?=b)", "[ab]*[bc]+d",
])
def test_other_polynomial_shapes_are_refused(pattern):
    from candle_web.tokenizers.unicode_classes import compile_pattern

    with pytest.raises(UnsupportedError, match="polynomially"):
        compile_pattern(pattern, "field")


@pytest.mark.parametrize("pattern, work", [
    ("(?:){99999}", 99999), ("(?:(?:){300}){300}", 90300), ("(?:\\b){2000}", 2000),
    ("(?:(?:){99999})*a", 100000),  # the outer * still tries one iteration
])
def test_required_empty_iterations_are_refused(pattern, work):
    """Found by the fuzz target tokenizer.regex: a part that matches nothing, repeated a
    required number of times, runs that count at every position (19 s on 3,000 characters);
    it has no backtracking at all, so neither rule above saw it."""
    from candle_web.tokenizers.unicode_classes import compile_pattern

    with pytest.raises(UnsupportedError, match=rf"\({work} iterations at every position"):
        compile_pattern(pattern, "field")
    if not pattern.endswith("*a"):
        compile_pattern(pattern.replace("{", "{0,"), "field")  # optional counts stop at once


@pytest.mark.parametrize("pattern", [
    "a*a*", "a*b*c", "a*ba*c", ".*", "\\s*[\\r\\n]+", "a*+a*b", "\\p{N}{1,3}\\p{N}{1,3}x",
    "(?i:'s|'t)|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{M}]*[\\p{Ll}\\p{M}]+(?i:'s|'t)?",
])
def test_repeats_in_a_row_that_cannot_be_made_to_fail_are_accepted(pattern):
    """Nothing after them can fail (or they share no character, or one is possessive or
    bounded): the first split tried matches, so the search stays O(n^2)."""
    from candle_web.tokenizers.unicode_classes import compile_pattern

    assert compile_pattern(pattern, "field").pattern


def test_the_real_pre_tokenizer_patterns_still_load(model_file):
    """The patterns llama.cpp's GGUF vocabularies name (Llama 3, Qwen 2, DeepSeek...) and
    every tokenizer.json in the cache (the registry's at least)."""
    from candle_web import hub
    from candle_web.tokenizers import gguf_vocab
    from candle_web.tokenizers.unicode_classes import compile_pattern

    patterns = [value for name, value in vars(gguf_vocab).items()
                if name.endswith("_PATTERN") and isinstance(value, str)]
    assert len(patterns) >= 2
    for pattern in patterns:
        compile_pattern(pattern, "field")
    for model in REAL_TOKENIZERS.values():
        model_file(*model)  # the cache holds these, or the test fails saying how to fetch them
    for found in hub.cache_dir().glob("**/tokenizer.json"):
        Tokenizer.from_file(found)


# ---- 4. WordPiece's max_input_chars_per_word ------------------------------------------------------

def test_wordpiece_long_words_are_linear_and_match_hf(model_file):
    """The finding: with max_input_chars_per_word at 1e9 (accepted at load), a 3,000-character
    word took 3.2 s and a 10,000-character one over 20 s (cubic). Now: the same ids as HF."""
    config = json.loads(model_file(*REAL_TOKENIZERS["minilm"]).read_text(encoding="utf-8"))
    config["model"]["max_input_chars_per_word"] = 10**9
    config["padding"] = config["truncation"] = None
    text = json.dumps(config)
    rng = np.random.default_rng(0)
    words = ["".join(rng.choice(list("abcdefghijklmnopqrstuvwxyz"), 10_000)),
             "\u00e9t\u00e9" * 3000, "unaffable" * 1000]
    result = run_bounded("""
        tokenizer = Tokenizer.from_str(text)
        _result["value"] = [tokenizer.encode(word).ids for word in words]
        """, setup=f"from candle_web.tokenizers import Tokenizer\ntext = {text!r}\n"
                   f"words = {words!r}")
    assert result["outcome"] == "ok", result
    reference = hf.Tokenizer.from_str(text)
    assert result["value"] == [reference.encode(word).ids for word in words]
