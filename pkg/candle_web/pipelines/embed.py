"""Sentences in, vectors out: a BERT model (models/bert.py) with its tokenizer, mean pooling
and L2 normalisation, the way sentence-transformers embeds (all-MiniLM-L6-v2).

    embedder = SentenceEmbedder(BertModel.from_pretrained(folder), Tokenizer.from_file(...))
    embedder.embed(["A man is eating food.", "A man is riding a horse."]).similarity()

The tokenizer.json of all-MiniLM-L6-v2 pads every input to 128 tokens and truncates at 128:
padding is turned off here (each batch is padded to its longest input and masked instead), and
an input longer than the limit is truncated with a warning and a `truncated` flag.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

from ..models.bert import BertModel, l2_normalize, mean_pool

# Sentences embedded per forward pass: padding is to the longest in the batch, so batches are
# formed from inputs sorted by length.
DEFAULT_BATCH_SIZE = 32
# Padded tokens per forward pass: bounds memory (attention is [batch, heads, t, t]) and the
# work wasted on padding when lengths differ.
MAX_BATCH_TOKENS = 2048
PADDING_RATIO = 2


def cosine_similarity(a: np.ndarray, b: np.ndarray = None) -> np.ndarray:
    """Pairwise cosine similarity [n, m] of the rows of a and b (b defaults to a)."""
    a = l2_normalize(np.atleast_2d(np.asarray(a, dtype=np.float32)))
    b = a if b is None else l2_normalize(np.atleast_2d(np.asarray(b, dtype=np.float32)))
    return a @ b.T


@dataclass
class Embeddings:
    vectors: np.ndarray  # [n, d] float32, L2-normalised unless asked otherwise
    token_counts: list  # tokens used per sentence (after truncation, with [CLS]/[SEP])
    truncated: list  # per sentence: was it longer than the limit

    def similarity(self) -> np.ndarray:
        return cosine_similarity(self.vectors)


class SentenceEmbedder:
    """BertModel + tokenizer -> sentence vectors (mean pooling, L2 normalisation)."""

    def __init__(self, model: BertModel, tokenizer, max_tokens: int = None):
        self.model = model
        self.tokenizer = tokenizer
        # The limit: the tokenizer.json truncation length when it has one (what the model was
        # used with), never more than the model's positions.
        limit = model.config.max_position_embeddings
        truncation = getattr(tokenizer, "truncation", None)
        if max_tokens is None and truncation is not None:
            max_tokens = truncation.max_length
        self.max_tokens = min(limit, max_tokens) if max_tokens else limit
        # Tokenize the whole input and cut here, so that a cut can be reported.
        if truncation is not None:
            tokenizer.no_truncation()
        if getattr(tokenizer, "padding", None) is not None:
            tokenizer.no_padding()
        sep = tokenizer.token_to_id("[SEP]")
        self.sep_id = sep

    def tokenize(self, text: str) -> tuple:
        """(ids, truncated): [CLS] ... [SEP], cut to max_tokens keeping the final [SEP]."""
        if not isinstance(text, str):
            raise TypeError(f"embed: expected str sentences, got {type(text).__name__}")
        return self.cut(list(self.tokenizer.encode(text).ids))

    def cut(self, ids: list) -> tuple:
        """(ids, truncated): ids with their special tokens cut to max_tokens, keeping the
        final [SEP]."""
        if len(ids) <= self.max_tokens:
            return ids, False
        if self.sep_id is not None and ids[-1] == self.sep_id:
            return ids[:self.max_tokens - 1] + [self.sep_id], True
        return ids[:self.max_tokens], True

    def embed(self, sentences, normalize: bool = True,
              batch_size: int = DEFAULT_BATCH_SIZE) -> Embeddings:
        if isinstance(sentences, str):
            sentences = [sentences]
        sentences = list(sentences)
        hidden = self.model.config.hidden_size
        if not sentences:
            return Embeddings(np.zeros((0, hidden), np.float32), [], [])
        tokenized = [self.tokenize(text) for text in sentences]
        cut = [index for index, (_, truncated) in enumerate(tokenized) if truncated]
        if cut:
            warnings.warn(f"embed: {len(cut)} input(s) longer than the model's limit of "
                          f"{self.max_tokens} tokens were truncated (inputs {cut[:10]})",
                          stacklevel=2)
        return self.embed_tokenized(tokenized, normalize, batch_size)

    def with_special_tokens(self, ids: list) -> list:
        """Token ids of a text's content (an API's token-array input) with the special tokens
        the tokenizer puts around a text ([CLS] ... [SEP]), unless they are there already."""
        around = list(self.tokenizer.encode("").ids)  # what an empty text becomes
        head, tail = around[:1], around[1:]
        ids = list(ids)
        if ids[:len(head)] == head and (not tail or ids[-len(tail):] == tail):
            return ids
        return head + ids + tail

    def embed_tokenized(self, tokenized: list, normalize: bool = True,
                        batch_size: int = DEFAULT_BATCH_SIZE) -> Embeddings:
        """`embed` of inputs tokenized already: (ids with the special tokens, truncated) each,
        at most max_tokens ids long."""
        hidden = self.model.config.hidden_size
        vectors = np.zeros((len(tokenized), hidden), np.float32)
        for rows in _length_batches([len(ids) for ids, _ in tokenized], batch_size):
            width = max(len(tokenized[row][0]) for row in rows)
            ids = np.full((len(rows), width), self.model.config.pad_token_id, np.int64)
            mask = np.zeros((len(rows), width), np.int64)
            for i, row in enumerate(rows):
                tokens = tokenized[row][0]
                ids[i, :len(tokens)] = tokens
                mask[i, :len(tokens)] = 1
            states = self.model(ids, mask).to_numpy()
            vectors[rows] = mean_pool(states, mask)
        if normalize:
            vectors = l2_normalize(vectors)
        return Embeddings(vectors.astype(np.float32), [len(ids) for ids, _ in tokenized],
                          [truncated for _, truncated in tokenized])


# -- helpers --------------------------------------------------------------------------------
def _length_batches(lengths: list, batch_size: int) -> list:
    """Row indices grouped for batched forwards: sorted by length, and cut where the longest
    input would be more than PADDING_RATIO times the shortest, or the batch would exceed
    MAX_BATCH_TOKENS padded tokens (one long input does not pad many short ones to its length)."""
    order = sorted(range(len(lengths)), key=lambda index: lengths[index])
    batches, current = [], []
    for index in order:
        width = lengths[index]  # the longest so far: the order is ascending
        too_uneven = width > PADDING_RATIO * lengths[current[0]] if current else False
        if current and (len(current) >= batch_size or too_uneven
                        or (len(current) + 1) * width > MAX_BATCH_TOKENS):
            batches.append(current)
            current = []
        current.append(index)
    if current:
        batches.append(current)
    return batches


__all__ = ["SentenceEmbedder", "Embeddings", "cosine_similarity"]
