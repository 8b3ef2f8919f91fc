"""The worker's sentence-embedding commands on the Python side (the Similarity view): build a
BERT sentence embedder from the streamed files, embed sentences, return the vectors and their
cosine similarity matrix.

Imported by web/worker.js inside Pyodide; importable natively too (tests/ui/native_text_models.py
builds the embedder from the same bytes through `build_embedder` for the twin check).
"""
from __future__ import annotations

import json
import time
import warnings

import numpy as np

import model_files

BERT_KIND = "bert"
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
TOKENIZER_FILE = "tokenizer.json"
REQUIRED_FILES = (CONFIG_FILE, WEIGHTS_FILE, TOKENIZER_FILE)
# sentence-transformers runs all-MiniLM-L6-v2 with max_seq_length 256 (its
# sentence_bert_config.json), while the tokenizer.json it ships truncates at 128: the page
# follows sentence-transformers, so the embeddings equal what that library computes.
MAX_SEQ_LENGTH = 256
# A request's size: each sentence costs a forward pass of up to MAX_SEQ_LENGTH tokens.
MAX_SENTENCES = 64
MAX_SENTENCE_CHARS = 20_000

# The one embedder kept in memory: key -> SentenceEmbedder.
_loaded: dict = {}


def browser_models() -> str:
    return json.dumps(model_files.browser_models(BERT_KIND))


def manifest_json(model=None, hf_repo=None, revision=None, url=None) -> str:
    return json.dumps(model_files.manifest(BERT_KIND, REQUIRED_FILES, model, hf_repo,
                                           revision, url))


def allocate_file(key: str, file_name: str, size) -> np.ndarray:
    return model_files.allocate_file(key, file_name, size)


def discard_incoming(key: str) -> None:
    model_files.discard_incoming(key)


def build_embedder(files: dict):
    """A SentenceEmbedder from {file name: bytes-like} (config, safetensors, tokenizer)."""
    from candle_web.errors import FormatError
    from candle_web.models.bert import BertModel, SentenceEmbedder
    from candle_web.tokenizers import Tokenizer

    try:
        config = json.loads(bytes(files[CONFIG_FILE]).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise FormatError(f"load: {CONFIG_FILE} is not JSON: {error}") from None
    model = BertModel.from_safetensors(memoryview(files[WEIGHTS_FILE]), config)
    tokenizer = Tokenizer.from_bytes(memoryview(files[TOKENIZER_FILE]))
    return SentenceEmbedder(model, tokenizer, max_tokens=MAX_SEQ_LENGTH)


def build_model(key: str) -> str:
    """Build the embedder from the staged buffers; JSON summary of the model."""
    staged = model_files.take_staged(key, REQUIRED_FILES)
    _loaded.clear()  # free the previous model before building the next one
    started = time.perf_counter()
    embedder = build_embedder(staged)
    build_ms = (time.perf_counter() - started) * 1000.0
    _loaded[key] = embedder
    config = embedder.model.config
    return json.dumps({"key": key, "buildMs": build_ms, "dims": config.hidden_size,
                       "layers": config.num_hidden_layers, "maxTokens": embedder.max_tokens})


def loaded_embedder(key: str):
    from candle_web.errors import ModelNotFound

    if key not in _loaded:
        have = ", ".join(_loaded) or "none"
        raise ModelNotFound(f"embed: model {key!r} is not loaded (loaded: {have}); send "
                            "`load` with kind 'bert' first")
    return _loaded[key]


def checked_sentences(sentences) -> list:
    """The sentences as a list of non-empty strings within the request limits."""
    from candle_web.errors import CandleError

    if hasattr(sentences, "to_py"):
        sentences = sentences.to_py()  # a JS array from the worker
    if isinstance(sentences, str) or not isinstance(sentences, (list, tuple)):
        raise CandleError(f"embed: expected a list of sentences, got {type(sentences).__name__}")
    sentences = list(sentences)
    if not sentences:
        raise CandleError("embed: no sentences (type at least one, one per line)")
    if len(sentences) > MAX_SENTENCES:
        raise CandleError(f"embed: {len(sentences)} sentences; at most {MAX_SENTENCES} at once")
    for index, text in enumerate(sentences):
        if not isinstance(text, str) or not text.strip():
            raise CandleError(f"embed: sentence {index + 1} is empty or not text")
        if len(text) > MAX_SENTENCE_CHARS:
            raise CandleError(f"embed: sentence {index + 1} has {len(text)} characters; at most "
                              f"{MAX_SENTENCE_CHARS}")
    return sentences


def embed_sentences(embedder, sentences) -> tuple:
    """(vectors [n, d] float32 L2-normalised, summary dict) for the checked sentences."""
    sentences = checked_sentences(sentences)
    started = time.perf_counter()
    # The truncation warning is reported in the summary (per sentence) instead.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        full_counts = [len(embedder.tokenizer.encode(text).ids) for text in sentences]
        result = embedder.embed(sentences)
    elapsed_ms = (time.perf_counter() - started) * 1000.0
    vectors = np.ascontiguousarray(result.vectors, dtype=np.float32)
    similarity = result.similarity()
    summary = {
        "count": len(sentences), "dims": int(vectors.shape[1]),
        "maxTokens": embedder.max_tokens, "tokenCounts": [int(c) for c in result.token_counts],
        "inputTokenCounts": full_counts, "truncated": [bool(t) for t in result.truncated],
        # For display; the vectors themselves travel as float32 bits.
        "similarity": [[float(value) for value in row] for row in similarity],
        "elapsedMs": elapsed_ms,
    }
    return vectors, summary


def embed(key: str, sentences) -> tuple:
    """For the worker: (vectors ndarray, JSON summary)."""
    vectors, summary = embed_sentences(loaded_embedder(key), sentences)
    return vectors, json.dumps(summary)
