"""Tokenizers trained with HF `tokenizers` inside the test (Unigram, WordPiece, SentencePiece
BPE with byte fallback + Metaspace, byte-level BPE), saved to tokenizer.json, loaded by both
implementations and compared on the varied corpus: zero differences allowed."""

from __future__ import annotations

import json

import pytest

from candle_web.tokenizers import Tokenizer
from tests.tokenizers.comparison_testlib import corpus_for, differences, report

hf = pytest.importorskip("tokenizers")
from tokenizers import decoders, models, normalizers, pre_tokenizers, processors, trainers  # noqa: E402

SPECIALS = ["<unk>", "<s>", "</s>", "<pad>", "<mask>"]


def training_text() -> list:
    # The hand-written samples and their variants, repeated, plus seeded random strings:
    # enough for a few hundred merges / pieces.
    return corpus_for(random_count=300, seed=11) * 3


def unigram_sentencepiece():
    tokenizer = hf.Tokenizer(models.Unigram())
    tokenizer.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Replace(
        hf.Regex(r" {2,}"), " ")])
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="always")
    tokenizer.decoder = decoders.Metaspace(prepend_scheme="always")
    trainer = trainers.UnigramTrainer(vocab_size=3000, special_tokens=SPECIALS,
                                      unk_token="<unk>")
    # Train on the hand-written samples only: the random strings would need a piece per
    # character; unseen characters then go through byte fallback or <unk>.
    tokenizer.train_from_iterator(corpus_for(random_count=0) * 3, trainer)
    # Byte fallback pieces for half of the bytes: the rest of the unknowns stay <unk>.
    config = json.loads(tokenizer.to_str())
    config["model"]["byte_fallback"] = True
    lowest = min(score for _, score in config["model"]["vocab"])
    config["model"]["vocab"] += [[f"<0x{byte:02X}>", lowest - 1.0] for byte in range(0, 256, 2)]
    tokenizer = hf.Tokenizer.from_str(json.dumps(config))
    tokenizer.post_processor = processors.TemplateProcessing(
        single="$A </s>", pair="$A </s> $B:1 </s>:1",
        special_tokens=[("</s>", tokenizer.token_to_id("</s>"))])
    tokenizer.decoder = decoders.Sequence([decoders.ByteFallback(),
                                           decoders.Metaspace(prepend_scheme="always")])
    return tokenizer


def wordpiece_bert():
    tokenizer = hf.Tokenizer(models.WordPiece(unk_token="[UNK]", max_input_chars_per_word=20))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=False, strip_accents=True)
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Whitespace(),
                                                       pre_tokenizers.Digits(False)])
    trainer = trainers.WordPieceTrainer(vocab_size=800, special_tokens=["[UNK]", "[CLS]",
                                                                        "[SEP]", "[PAD]"])
    tokenizer.train_from_iterator(training_text(), trainer)
    tokenizer.post_processor = processors.BertProcessing(
        ("[SEP]", tokenizer.token_to_id("[SEP]")), ("[CLS]", tokenizer.token_to_id("[CLS]")))
    tokenizer.decoder = decoders.WordPiece()
    tokenizer.add_tokens([hf.AddedToken("[ctx]", single_word=True, lstrip=True, rstrip=True)])
    return tokenizer


def sentencepiece_bpe():
    tokenizer = hf.Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tokenizer.normalizer = normalizers.Sequence([normalizers.NFC(), normalizers.Strip(True,
                                                                                      False)])
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first")
    alphabet = [f"<0x{byte:02X}>" for byte in range(256)]
    trainer = trainers.BpeTrainer(vocab_size=900, special_tokens=SPECIALS + alphabet,
                                  limit_alphabet=150)
    tokenizer.train_from_iterator(training_text(), trainer)
    tokenizer.decoder = decoders.Sequence([decoders.Metaspace(prepend_scheme="first"),
                                           decoders.ByteFallback(), decoders.Fuse(),
                                           decoders.Strip(" ", 1, 0)])
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B:1", special_tokens=[("<s>", 1)])
    return tokenizer


def byte_level_bpe():
    tokenizer = hf.Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(hf.Regex(r"\p{N}{1,3}"), "isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=True)])
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1000, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(training_text(), trainer)
    tokenizer.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 1))
    tokenizer.add_tokens([hf.AddedToken("<extra>", normalized=True),
                          hf.AddedToken(" spaced", lstrip=False)])
    return tokenizer


TRAINERS = {"unigram": unigram_sentencepiece, "wordpiece": wordpiece_bert,
            "sentencepiece-bpe": sentencepiece_bpe, "byte-level-bpe": byte_level_bpe}


@pytest.fixture(scope="module", params=sorted(TRAINERS))
def trained(request):
    reference = TRAINERS[request.param]()
    mine = Tokenizer.from_str(reference.to_str())
    return request.param, mine, reference


def test_trained_tokenizer_identical_to_hf(trained):
    name, mine, reference = trained
    specials = ["<s>", "</s>", "<mask>", "[CLS]", "[SEP]", "[ctx]", "<extra>", " spaced"]
    corpus = corpus_for(specials, random_count=700, seed=23)
    found = differences(mine, reference, corpus)
    assert not found, f"{name}: " + report(found)


def test_trained_tokenizer_pairs(trained):
    _, mine, reference = trained
    for first, second in [("first part", "second part"), ("x", "日本語 👍")]:
        for add_special in (True, False):
            ours = mine.encode_pair(first, second, add_special_tokens=add_special)
            theirs = reference.encode(first, second, add_special_tokens=add_special)
            assert (ours.ids, ours.type_ids) == (theirs.ids, theirs.type_ids)
