"""Real tokenizer.json files (whisper tiny.en, whisper base, all-MiniLM-L6-v2) against HF
`tokenizers`: ids, tokens, type ids, masks and decoded text must be identical, string by string,
on a varied corpus of ~1,150 strings (x2 add_special_tokens, x2 skip_special_tokens)."""

from __future__ import annotations

import json

import pytest

from candle_web.tokenizers import Tokenizer
from tests.tokenizers.comparison_testlib import corpus_for, differences, encoding_fields, report

hf_tokenizers = pytest.importorskip("tokenizers")

REAL_FILES = [
    ("whisper-tiny.en", "tokenizer.json"),
    ("whisper-base", "tokenizer.json"),
    ("all-minilm-l6-v2", "tokenizer.json"),
]


def special_tokens_of(path, count: int = 8) -> list:
    """Some of the file's own added tokens, to put inside the test strings."""
    added = json.loads(path.read_text(encoding="utf-8"))["added_tokens"]
    return [entry["content"] for entry in added][:count]


@pytest.fixture(scope="module", params=REAL_FILES, ids=lambda spec: spec[0])
def tokenizer_pair(request, model_file):
    path = model_file(*request.param)
    return path, Tokenizer.from_file(path), hf_tokenizers.Tokenizer.from_file(str(path))


def test_identical_to_hf_on_varied_corpus(tokenizer_pair):
    path, mine, reference = tokenizer_pair
    corpus = corpus_for(special_tokens_of(path), random_count=1000, seed=1)
    assert len(corpus) > 1100
    found = differences(mine, reference, corpus)
    assert not found, report(found)


def test_vocabulary_lookups_match_hf(tokenizer_pair):
    _, mine, reference = tokenizer_pair
    assert mine.get_vocab_size() == reference.get_vocab_size(with_added_tokens=True)
    assert mine.get_vocab_size(False) == reference.get_vocab_size(with_added_tokens=False)
    for token_id in range(0, reference.get_vocab_size(), 97):
        token = reference.id_to_token(token_id)
        assert mine.id_to_token(token_id) == token
        assert mine.token_to_id(token) == reference.token_to_id(token)
    assert mine.token_to_id("this token does not exist") is None


def test_pairs_and_batches_match_hf(tokenizer_pair):
    _, mine, reference = tokenizer_pair
    pairs = [("How are you?", "Fine, thanks."), ("", "only second"), ("only first", ""),
             ("日本語 text", "émoji 👍🏽 done")]
    for first, second in pairs:
        for add_special in (True, False):
            ours = mine.encode_pair(first, second, add_special_tokens=add_special)
            theirs = reference.encode(first, second, add_special_tokens=add_special)
            assert encoding_fields(ours) == encoding_fields(theirs), (first, second)
    texts = ["short", "a somewhat longer sentence here", "日本語"]
    ours = mine.encode_batch(texts)
    theirs = reference.encode_batch(texts)
    assert [encoding_fields(e) for e in ours] == [encoding_fields(e) for e in theirs]


def test_minilm_padding_and_truncation_from_file(model_file):
    """all-MiniLM-L6-v2's file pads to 128 and truncates at 128: honoured, and switchable."""
    path = model_file("all-minilm-l6-v2", "tokenizer.json")
    mine = Tokenizer.from_file(path)
    reference = hf_tokenizers.Tokenizer.from_file(str(path))
    short = mine.encode("A short sentence.")
    assert len(short.ids) == 128 and short.attention_mask.count(1) == 6
    assert encoding_fields(short) == encoding_fields(reference.encode("A short sentence."))
    long_text = " ".join(["word"] * 300) + " end"
    assert encoding_fields(mine.encode(long_text)) == encoding_fields(reference.encode(long_text))
    assert len(mine.encode(long_text).ids) == 128
    pair = (" ".join(["alpha"] * 100), " ".join(["beta"] * 70))
    assert encoding_fields(mine.encode_pair(*pair)) == encoding_fields(reference.encode(*pair))

    mine.no_padding()
    reference.no_padding()
    assert len(mine.encode("A short sentence.").ids) == 6
    mine.no_truncation()
    reference.no_truncation()
    assert len(mine.encode(long_text).ids) == 303
    assert encoding_fields(mine.encode(long_text)) == encoding_fields(reference.encode(long_text))

    mine.enable_padding(pad_id=0, pad_token="[PAD]", pad_to_multiple_of=8)
    reference.enable_padding(pad_id=0, pad_token="[PAD]", pad_to_multiple_of=8)
    batch = ["one", "two words here", "three"]
    assert ([encoding_fields(e) for e in mine.encode_batch(batch)]
            == [encoding_fields(e) for e in reference.encode_batch(batch)])
    mine.enable_truncation(7, direction="left")
    reference.enable_truncation(7, direction="left")
    assert encoding_fields(mine.encode(long_text)) == encoding_fields(reference.encode(long_text))


def test_whisper_special_tokens_by_name(model_file):
    """The ids the Whisper decoder prompt needs come from the tokenizer, never hard-coded."""
    path = model_file("whisper-tiny.en", "tokenizer.json")
    mine = Tokenizer.from_file(path)
    reference = hf_tokenizers.Tokenizer.from_file(str(path))
    for name in ("<|startoftranscript|>", "<|notimestamps|>", "<|endoftext|>"):
        assert mine.token_to_id(name) == reference.token_to_id(name) is not None
    text = "<|startoftranscript|><|notimestamps|> Hello world.<|endoftext|>"
    ids = mine.encode(text, add_special_tokens=False).ids
    assert ids[:2] == [mine.token_to_id("<|startoftranscript|>"),
                       mine.token_to_id("<|notimestamps|>")]
    assert mine.decode(ids) == " Hello world."
    assert mine.decode(ids, skip_special_tokens=False) == text


@pytest.mark.parametrize("backend", ["hf", "auto"])
def test_hf_backend_gives_identical_output(model_file, backend):
    path = model_file("whisper-base", "tokenizer.json")
    pure = Tokenizer.from_file(path)
    native = Tokenizer.from_file(path, backend=backend)
    assert type(native).__name__ == "HFTokenizer"
    corpus = corpus_for(special_tokens_of(path, 3), random_count=100, seed=5)
    found = differences(pure, native, corpus)
    assert not found, report(found)
