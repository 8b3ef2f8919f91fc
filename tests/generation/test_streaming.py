"""UTF-8-safe streaming: pieces never hold a broken character and concatenate to the full
decode, for byte-level BPE (the real SmolLM2 vocabulary) and SentencePiece byte fallback (a
GGUF 'llama' vocabulary)."""

from __future__ import annotations

import pytest

from candle_web.generation import TokenOutputStream
from candle_web.generation.streaming import REPLACEMENT_CHAR

MULTIBYTE_TEXTS = [
    "Smile 😀 and wave 👋🏽, then 家族 👨‍👩‍👧 go!",
    "東京タワーは高い。日本語のテキスト",
    "naïve café — “quotes” ½ ∑ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
    "emoji at the end 🎉",
]


def stream_pieces(tokenizer, ids):
    stream = TokenOutputStream(tokenizer)
    pieces = [stream.next_token(i) for i in ids]
    pieces.append(stream.finish())
    return pieces


def assert_streams_cleanly(tokenizer, text):
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    # The test only means something if some token ends inside a character.
    assert any(REPLACEMENT_CHAR in tokenizer.decode([i]) for i in ids), text
    pieces = stream_pieces(tokenizer, ids)
    assert all(REPLACEMENT_CHAR not in piece for piece in pieces), pieces
    assert "".join(pieces) == tokenizer.decode(ids)
    assert "".join(pieces) == text


@pytest.mark.parametrize("text", MULTIBYTE_TEXTS)
def test_byte_level_bpe_stream(smollm2_tokenizer, text):
    assert_streams_cleanly(smollm2_tokenizer, text)


@pytest.fixture(scope="module")
def byte_fallback_tokenizer():
    """A SentencePiece vocabulary as GGUF stores it: a few word pieces, the 256 byte pieces
    <0x00>..<0xFF>; anything else is spelled in UTF-8 bytes."""
    from candle_web.tokenizers import Tokenizer

    words = ["\u2581", "\u2581the", "\u2581and", "\u2581go", "e", "t", "h", "a", "n", "d", "o",
             "g", "!", "\u2581a", "\u2581t", "\u2581g", "th", "an"]
    pieces = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + words
    metadata = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": pieces,
                "tokenizer.ggml.scores": [0.0] * 259 + [-float(r) for r in range(len(words))],
                "tokenizer.ggml.token_type": [2, 3, 3] + [6] * 256 + [1] * len(words),
                "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2,
                "tokenizer.ggml.unknown_token_id": 0, "tokenizer.ggml.add_bos_token": True}
    return Tokenizer.from_gguf_metadata(metadata)


BYTE_FALLBACK_TEXTS = ["the 😀 and 家 go!", "and 👨‍👩‍👧 the ½ go", "go 東京"]


@pytest.mark.parametrize("text", BYTE_FALLBACK_TEXTS)
def test_sentencepiece_byte_fallback_stream(byte_fallback_tokenizer, text):
    ids = byte_fallback_tokenizer.encode(text, add_special_tokens=False).ids
    assert any(byte_fallback_tokenizer.id_to_token(i).startswith("<0x") for i in ids)
    assert_streams_cleanly(byte_fallback_tokenizer, text)


def test_unfinished_character_is_held_then_flushed(smollm2_tokenizer):
    ids = smollm2_tokenizer.encode("ok 😀", add_special_tokens=False).ids
    incomplete = ids[:-1]  # the emoji's last byte never arrives
    stream = TokenOutputStream(smollm2_tokenizer)
    shown = "".join(stream.next_token(i) for i in incomplete)
    assert REPLACEMENT_CHAR not in shown and shown.startswith("ok")
    assert REPLACEMENT_CHAR in stream.finish()  # flushed as the decoder renders it
