"""Tokenizers built from GGUF vocabularies against llama.cpp's own tokenizer test files.

llama.cpp ships vocabulary-only GGUF files (`models/ggml-vocab-<name>.gguf`) with inputs
(`.gguf.inp`: texts separated by a line `__ggml_vocab_test__`) and the ids HF's tokenizer of
the original model gives for each (`.gguf.out`: one line of ids per input, no special tokens
added). They come from the llama-cpp-python 0.3.36 source distribution (the registry test
input `llama-cpp-test-data`), so the reference is independent of candle-web: the HF
tokenizers of Qwen2, Qwen3.5, Phi-3, Gemma 4, Llama 3, Llama 2, GPT-2, Command-R, DeepSeek
Coder/LLM, Falcon, MPT, StarCoder, Refact and BGE (BERT). Every line must match exactly.

Left out (the sdist has them without .inp/.out, so there is nothing to compare with):
aquila, baichuan, gpt-neox, and nomic-bert-moe, whose tokenizer model `t5` (SentencePiece
Unigram with a precompiled charsmap) candle-web does not build from GGUF metadata.
"""

from __future__ import annotations

import pytest

from candle_web.io.gguf import read_gguf
from candle_web.tokenizers import Tokenizer

MODEL = "llama-cpp-test-data"
SEPARATOR = "\n__ggml_vocab_test__\n"
# name -> (tokenizer.ggml.model, tokenizer.ggml.pre) the file declares.
VOCABS = {
    "bert-bge": ("bert", "bert-bge"),
    "command-r": ("gpt2", "command-r"),
    "deepseek-coder": ("gpt2", "deepseek-coder"),
    "deepseek-llm": ("gpt2", "deepseek-llm"),
    "falcon": ("gpt2", "falcon"),
    "gemma-4": ("gemma4", None),
    "gpt-2": ("gpt2", "gpt-2"),
    "llama-bpe": ("gpt2", "llama-bpe"),
    "llama-spm": ("llama", "default"),
    "mpt": ("gpt2", "mpt"),
    "phi-3": ("llama", "default"),
    "qwen2": ("gpt2", "qwen2"),
    "qwen35": ("gpt2", "qwen35"),
    "refact": ("gpt2", "refact"),
    "starcoder": ("gpt2", "starcoder"),
}
NO_TEST_FILES = "the sdist has no .inp/.out for it: nothing to compare with"
LEFT_OUT = {
    "aquila": NO_TEST_FILES,
    "baichuan": NO_TEST_FILES,
    "gpt-neox": NO_TEST_FILES,
    "nomic-bert-moe": NO_TEST_FILES + "; and its tokenizer model 't5' (Unigram with a "
                      "precompiled charsmap) is not built from GGUF by candle-web",
}


def read_cases(inputs: str, outputs: str) -> list:
    """(text, expected ids) pairs; the last input may or may not end with the separator."""
    texts = inputs.split(SEPARATOR)
    if texts[-1] == "":
        texts.pop()
    lines = outputs.split("\n")
    if lines[-1] == "":
        lines.pop()
    assert len(texts) == len(lines), f"{len(texts)} inputs for {len(lines)} output lines"
    return [(text, [int(value) for value in line.split()]) for text, line in zip(texts, lines)]


def test_read_cases_keeps_blank_and_newline_inputs():
    cases = read_cases("a\n__ggml_vocab_test__\n\n__ggml_vocab_test__\n\n\n__ggml_vocab_test__\n",
                       " 1 2\n\n 3\n")
    assert cases == [("a", [1, 2]), ("", []), ("\n", [3])]


@pytest.mark.parametrize("name", [
    *VOCABS,
    *(pytest.param(name, marks=pytest.mark.skip(reason=f"ggml-vocab-{name}.gguf: {why}"))
      for name, why in LEFT_OUT.items()),
])
def test_vocab_file_gives_llama_cpp_expected_ids(name, model_file):
    vocab = model_file(MODEL, f"vocab/ggml-vocab-{name}.gguf")
    metadata = {key: value for key, value in read_gguf(vocab).metadata.items()
                if key.startswith("tokenizer.ggml.")}
    assert (metadata["tokenizer.ggml.model"], metadata.get("tokenizer.ggml.pre")) == VOCABS[name]
    inputs = model_file(MODEL, f"vocab/ggml-vocab-{name}.gguf.inp").read_text(encoding="utf-8")
    outputs = model_file(MODEL, f"vocab/ggml-vocab-{name}.gguf.out").read_text(encoding="utf-8")
    cases = read_cases(inputs, outputs)
    assert len(cases) >= 46
    tokenizer = Tokenizer.from_gguf_metadata(metadata)
    differences = []
    for text, expected in cases:
        ids = tokenizer.encode(text, add_special_tokens=False).ids
        if ids != expected:
            differences.append(f"{text[:50]!r}: expected {expected[:16]}, got {ids[:16]}")
    assert not differences, (f"{len(differences)} of {len(cases)} inputs differ:\n"
                             + "\n".join(differences[:10]))


def test_new_tokenizer_kinds_name_the_bad_key(model_file):
    from candle_web.core.errors import FormatError, UnsupportedError

    def metadata_of(name):
        path = model_file(MODEL, f"vocab/ggml-vocab-{name}.gguf")
        return {key: value for key, value in read_gguf(path).metadata.items()
                if key.startswith("tokenizer.ggml.")}

    bert = metadata_of("bert-bge")
    del bert["tokenizer.ggml.cls_token_id"]
    with pytest.raises(FormatError, match="tokenizer.ggml.cls_token_id"):
        Tokenizer.from_gguf_metadata(bert)
    gemma = metadata_of("gemma-4")
    merges = list(gemma["tokenizer.ggml.merges"])
    merges[5] = "nospace"
    with pytest.raises(FormatError, match=r"tokenizer.ggml.merges\[5\]"):
        Tokenizer.from_gguf_metadata(dict(gemma, **{"tokenizer.ggml.merges": merges}))
    qwen = metadata_of("qwen2")
    with pytest.raises(UnsupportedError, match="'tekken'.*known: .*qwen35"):
        Tokenizer.from_gguf_metadata(dict(qwen, **{"tokenizer.ggml.pre": "tekken"}))
