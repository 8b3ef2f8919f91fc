"""The Similarity view's session: a BERT sentence embedder (config.json, model.safetensors,
tokenizer.json; mean pooling, L2-normalised) embeds sentences; the reply carries the vectors
(float32, transferred to the page) and their cosine similarity matrix."""
from __future__ import annotations

import time
import warnings

import numpy as np

from candle_web.core.errors import CandleError
from candle_web.worker.session import (CONFIG_FILE, TOKENIZER_FILE, Session, checked_text,
                                       python_value)

WEIGHTS_FILE = "model.safetensors"
# sentence-transformers runs all-MiniLM-L6-v2 with max_seq_length 256 (its
# sentence_bert_config.json), while the tokenizer.json it ships truncates at 128: the page
# follows sentence-transformers, so the embeddings equal what that library computes.
MAX_SEQ_LENGTH = 256
# A request's size: each sentence costs a forward pass of up to MAX_SEQ_LENGTH tokens.
MAX_SENTENCES = 64
MAX_SENTENCE_CHARS = 20_000


class BertSession(Session):
    kind = "bert"
    command = "embed"
    required_files = (CONFIG_FILE, WEIGHTS_FILE, TOKENIZER_FILE)

    def build(self, files: dict):
        from candle_web.pipelines import load_bert
        from candle_web.pipelines.embed import SentenceEmbedder

        loaded = load_bert(files)  # opened as a folder is (io/checkpoint.py)
        return SentenceEmbedder(loaded.model, loaded.tokenizer, max_tokens=MAX_SEQ_LENGTH)

    def describe(self, embedder) -> dict:
        config = embedder.model.config
        return {"dims": config.hidden_size, "layers": config.num_hidden_layers,
                "maxTokens": embedder.max_tokens}

    def compute(self, embedder, sentences=None, on_event=None) -> dict:
        """The summary the page shows, and "vectors" [n, d] float32 L2-normalised."""
        sentences = checked_sentences(sentences)
        started = time.perf_counter()
        # The truncation warning is reported in the summary (per sentence) instead.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            full_counts = [len(embedder.tokenizer.encode(text).ids) for text in sentences]
            result = embedder.embed(sentences)
        elapsed_ms = (time.perf_counter() - started) * 1000.0
        vectors = np.ascontiguousarray(result.vectors, dtype=np.float32)
        return {
            "count": len(sentences), "dims": int(vectors.shape[1]),
            "maxTokens": embedder.max_tokens,
            "tokenCounts": [int(c) for c in result.token_counts],
            "inputTokenCounts": full_counts, "truncated": [bool(t) for t in result.truncated],
            # For display; the vectors themselves travel as float32 bits.
            "similarity": [[float(value) for value in row] for row in result.similarity()],
            "elapsedMs": elapsed_ms,
            "vectors": vectors,
        }


def checked_sentences(sentences) -> list:
    """The sentences as a list of non-empty strings within the request limits."""
    sentences = python_value(sentences)
    if isinstance(sentences, str) or not isinstance(sentences, (list, tuple)):
        raise CandleError(f"embed: expected a list of sentences, got {type(sentences).__name__}")
    if not sentences:
        raise CandleError("embed: no sentences (type at least one, one per line)")
    if len(sentences) > MAX_SENTENCES:
        raise CandleError(f"embed: {len(sentences)} sentences; at most {MAX_SENTENCES} at once")
    return [checked_text(text, f"embed: sentence {index + 1}", MAX_SENTENCE_CHARS, " or not text")
            for index, text in enumerate(sentences)]
