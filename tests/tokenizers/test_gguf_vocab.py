"""Tokenizer built from the real SmolLM2 GGUF's `tokenizer.ggml.*` metadata vs HF `tokenizers`
on a tokenizer.json assembled here from the same vocabulary and merges, following SmolLM2's
published tokenizer.json layout (Digits(individual) + ByteLevel, ByteLevel decoder, the 17
control tokens as special added tokens)."""

from __future__ import annotations

import json

import pytest

from candle_web.core.errors import FormatError, UnsupportedError
from candle_web.io.gguf import read_gguf
from candle_web.tokenizers import Tokenizer
from tests.tokenizers.comparison_testlib import corpus_for, differences, report

hf = pytest.importorskip("tokenizers")

CONTROL_TOKEN_TYPE = 3


@pytest.fixture(scope="module")
def smollm_metadata(model_file):
    path = model_file("smollm2-135m-instruct", "SmolLM2-135M-Instruct.Q4_1.gguf")
    return {key: value for key, value in read_gguf(path).metadata.items()
            if key.startswith("tokenizer.ggml.")}


def reference_tokenizer_json(metadata: dict) -> str:
    tokens = list(metadata["tokenizer.ggml.tokens"])
    types = [int(value) for value in metadata["tokenizer.ggml.token_type"]]
    added = [{"id": index, "content": token, "single_word": False, "lstrip": False,
              "rstrip": False, "normalized": False, "special": True}
             for index, (token, kind) in enumerate(zip(tokens, types))
             if kind == CONTROL_TOKEN_TYPE]
    return json.dumps({
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": True},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
             "use_regex": True}]},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": True,
                           "trim_offsets": False, "use_regex": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False,
                  "vocab": {token: index for index, token in enumerate(tokens)},
                  "merges": list(metadata["tokenizer.ggml.merges"])},
    })


def test_smollm_gguf_vocab_matches_hf(smollm_metadata):
    assert smollm_metadata["tokenizer.ggml.model"] == "gpt2"
    assert smollm_metadata["tokenizer.ggml.pre"] == "smollm"
    mine = Tokenizer.from_gguf_metadata(smollm_metadata)
    reference = hf.Tokenizer.from_str(reference_tokenizer_json(smollm_metadata))
    specials = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<file_sep>"]
    corpus = corpus_for(specials, random_count=600, seed=7)
    corpus.append("<|im_start|>user\nWhat is 2+2? Answer in 12345 words.<|im_end|>\n")
    found = differences(mine, reference, corpus)
    assert not found, report(found)
    # The chat markers are single tokens with the ids the GGUF declares.
    ids = mine.encode("<|im_start|>assistant\n").ids
    assert ids[0] == mine.token_to_id("<|im_start|>") == 1
    eos_id = int(smollm_metadata["tokenizer.ggml.eos_token_id"])
    assert mine.id_to_token(eos_id) == reference.id_to_token(eos_id) == "<|im_end|>"


def test_gguf_metadata_errors_name_the_key(smollm_metadata):
    broken = dict(smollm_metadata)
    del broken["tokenizer.ggml.merges"]
    with pytest.raises(FormatError, match="tokenizer.ggml.merges"):
        Tokenizer.from_gguf_metadata(broken)
    unknown = dict(smollm_metadata, **{"tokenizer.ggml.pre": "no-such-pre"})
    with pytest.raises(UnsupportedError, match="no-such-pre"):
        Tokenizer.from_gguf_metadata(unknown)
    with pytest.raises(UnsupportedError, match="'t5'"):
        Tokenizer.from_gguf_metadata(dict(smollm_metadata, **{"tokenizer.ggml.model": "t5"}))
    short_types = dict(smollm_metadata, **{"tokenizer.ggml.token_type": [1, 1]})
    with pytest.raises(FormatError, match="token types"):
        Tokenizer.from_gguf_metadata(short_types)


def test_a_score_beyond_a_float_is_a_format_error_naming_it():
    """Found by make fuzz (gguf.vocab): GGUF integer arrays can hold a score no float holds."""
    metadata = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": ["<unk>", "<s>", "</s>", "a"],
                "tokenizer.ggml.scores": [0.0, 0.0, 0.0, 2 ** 1100],
                "tokenizer.ggml.token_type": [2, 3, 3, 1]}
    with pytest.raises(FormatError, match=r"tokenizer.ggml.scores\[3\]: an integer of 1101 bits"):
        Tokenizer.from_gguf_metadata(metadata)


def test_sentencepiece_gguf_vocab_matches_hf_converter():
    """A "llama" (SentencePiece BPE) GGUF vocabulary: merges are derived from the scores.
    Reference: HF's own SentencePiece-style BPE built from the same pieces with merges in the
    same score order (the layout of HF's Llama converter)."""
    pieces = ["<unk>", "<s>", "</s>"] + [f"<0x{byte:02X}>" for byte in range(256)]
    words = ["\u2581the", "\u2581t", "he", "\u2581a", "in", "\u2581in", "th", "e", "h", "t",
             "a", "i", "n", "\u2581", "s", "\u2581is", "is"]
    pieces += words
    scores = [0.0, 0.0, 0.0] + [0.0] * 256 + [-float(rank) for rank in range(len(words))]
    types = [2, 3, 3] + [6] * 256 + [1] * len(words)
    metadata = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": pieces,
                "tokenizer.ggml.scores": scores, "tokenizer.ggml.token_type": types,
                "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2,
                "tokenizer.ggml.unknown_token_id": 0, "tokenizer.ggml.add_bos_token": True}
    mine = Tokenizer.from_gguf_metadata(metadata)
    from candle_web.tokenizers.gguf_vocab import sentencepiece_merges
    reference = hf.Tokenizer(hf.models.BPE(
        {piece: index for index, piece in enumerate(pieces)},
        [tuple(merge) for merge in sentencepiece_merges(pieces, scores)],
        unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    reference.normalizer = hf.normalizers.Sequence([hf.normalizers.Prepend("\u2581"),
                                                    hf.normalizers.Replace(" ", "\u2581")])
    reference.decoder = hf.decoders.Sequence([hf.decoders.Replace("\u2581", " "),
                                              hf.decoders.ByteFallback(), hf.decoders.Fuse(),
                                              hf.decoders.Strip(" ", 1, 0)])
    reference.post_processor = hf.processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)])
    reference.add_special_tokens(["<s>", "</s>"])
    found = differences(mine, reference, corpus_for(["<s>", "</s>"], random_count=200, seed=3))
    assert not found, report(found)
    assert mine.encode("the thin is").tokens[:3] == ["<s>", "\u2581the", "\u2581t"]
