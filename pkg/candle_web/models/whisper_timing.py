"""Whisper word-level timestamps: which audio frames each word was read from.

The method is openai-whisper's (its `timing.py` is the reference the tests record from):

1. one pass of the window's text tokens, framed by `sot_sequence + <|notimestamps|>` and
   `<|endoftext|>`, through the reference decoder, keeping the cross-attention scores of the
   model's *alignment heads* (the few heads whose attention follows the speech);
2. per head: softmax over the window's real frames, standardised across tokens, then a median
   filter of width 7 along time; the heads averaged into one [tokens, frames] matrix;
3. dynamic time warping through the negated matrix pairs each token with a run of frames;
4. tokens grouped into words (on spaces, or on whole characters for languages written without
   them), each word starting where its first token's run starts; punctuation attached to its
   neighbour; over-long words at sentence and segment edges trimmed by the same heuristics.

Shapes: scores [heads, tokens, frames]; one encoder frame is 20 ms (TOKENS_PER_SECOND 50).
"""

from __future__ import annotations

import string
from dataclasses import dataclass

import numpy as np

from ..core.tensor import Tensor
from ..io.audio import HOP_LENGTH, SAMPLE_RATE

TOKENS_PER_SECOND = 50  # encoder frames per second (a 30 s window has 1500)
MEDIAN_FILTER_WIDTH = 7
PREPEND_PUNCTUATIONS = "\"'“¿([{-"
APPEND_PUNCTUATIONS = "\"'.。,，!！?？:：”)]}、"
SENTENCE_END_MARKS = ".。!！?？"
UNSPACED_LANGUAGES = ("zh", "ja", "th", "lo", "my", "yue")

# Published alignment heads of the OpenAI checkpoints, for a model whose files carry none,
# keyed by (decoder layers, heads per layer, multilingual) where that identifies one model.
# (faster-whisper's config.json carries the same lists as `alignment_heads`.)
PUBLISHED_HEADS = {
    (4, 6, False): ((1, 0), (2, 0), (2, 5), (3, 0), (3, 1), (3, 2), (3, 3), (3, 4)),  # tiny.en
    (4, 6, True): ((2, 2), (3, 0), (3, 2), (3, 3), (3, 4), (3, 5)),  # tiny
    (6, 8, False): ((3, 3), (4, 7), (5, 1), (5, 5), (5, 7)),  # base.en
    (6, 8, True): ((3, 1), (4, 2), (4, 3), (4, 7), (5, 1), (5, 2), (5, 4), (5, 6)),  # base
}


@dataclass
class Word:
    """One word of a segment: its text (with its leading space), times in seconds on the
    recording's timeline and the mean probability of its tokens."""
    word: str
    start: float
    end: float
    probability: float


@dataclass
class WordTiming:
    word: str
    tokens: list
    start: float
    end: float
    probability: float


def alignment_heads(config) -> list:
    """(layer, head) pairs: the model's own, else the published ones for its shape, else every
    head of the upper half of the decoder (openai-whisper's default)."""
    if config.alignment_heads:
        return [tuple(int(v) for v in pair) for pair in config.alignment_heads]
    key = (config.n_text_layer, config.n_text_head, config.is_multilingual)
    if key in PUBLISHED_HEADS:
        return list(PUBLISHED_HEADS[key])
    return [(layer, head) for layer in range(config.n_text_layer // 2, config.n_text_layer)
            for head in range(config.n_text_head)]


def median_filter(x: np.ndarray, width: int) -> np.ndarray:
    """Median over a sliding window of odd `width` along the last axis, reflect-padded."""
    pad = width // 2
    if x.shape[-1] <= pad:
        return x
    padded = np.pad(x, [(0, 0)] * (x.ndim - 1) + [(pad, pad)], mode="reflect")
    windows = np.lib.stride_tricks.sliding_window_view(padded, width, axis=-1)
    return np.sort(windows, axis=-1)[..., pad]


def dtw(x: np.ndarray):
    """Cheapest monotonic path through the cost matrix x [n, m] (steps down, right or
    diagonal); returns (row indices, column indices) along it. The cells of one anti-diagonal
    depend only on the two before it, so each diagonal is computed at once. Ties go
    diagonal < down < right in that order of preference, costs are kept in float32."""
    n, m = x.shape
    x = np.asarray(x, dtype=np.float64)
    cost = np.full((n + 1, m + 1), np.inf, dtype=np.float32)
    cost[0, 0] = 0.0
    trace = np.full((n + 1, m + 1), -1, dtype=np.int8)
    for diagonal in range(2, n + m + 1):
        i = np.arange(max(1, diagonal - m), min(n, diagonal - 1) + 1)
        j = diagonal - i
        c0, c1, c2 = cost[i - 1, j - 1], cost[i - 1, j], cost[i, j - 1]
        step = np.full(i.shape, 2, dtype=np.int8)
        step[(c1 < c0) & (c1 < c2)] = 1
        step[(c0 < c1) & (c0 < c2)] = 0
        best = np.where(step == 0, c0, np.where(step == 1, c1, c2)).astype(np.float64)
        cost[i, j] = (x[i - 1, j - 1] + best).astype(np.float32)
        trace[i, j] = step
    trace[0, :] = 2
    trace[:, 0] = 1
    i, j = n, m
    path = []
    while i > 0 or j > 0:
        path.append((i - 1, j - 1))
        step = trace[i, j]
        if step == 0:
            i, j = i - 1, j - 1
        elif step == 1:
            i -= 1
        else:
            j -= 1
    path = np.array(path[::-1], dtype=np.int64).reshape(-1, 2)
    return path[:, 0], path[:, 1]


def split_words(tk, tokens: list, language: str = None):
    """(words, token lists) of text tokens ending with <|endoftext|>: first into pieces that
    decode to whole characters, then (for languages written with spaces) pieces joined into
    words that start at a space or a punctuation mark."""
    pieces, piece_tokens = _split_on_unicode(tk, tokens)
    if language in UNSPACED_LANGUAGES:
        return pieces, piece_tokens
    words, word_tokens = [], []
    for piece, ids in zip(pieces, piece_tokens):
        starts_word = ids[0] >= tk.eot or piece.startswith(" ") or piece.strip() in string.punctuation
        if starts_word or not words:
            words.append(piece)
            word_tokens.append(list(ids))
        else:
            words[-1] += piece
            word_tokens[-1].extend(ids)
    return words, word_tokens


def _split_on_unicode(tk, tokens: list):
    """Cut where the tokens so far decode without a broken character (a replacement character
    that the whole text also has there is part of the text, not a cut byte sequence)."""
    text_ids = [t for t in tokens if t < tk.eot]
    full = tk.decode(text_ids)
    pieces, piece_tokens, current, offset = [], [], [], 0
    for token in tokens:
        if token >= tk.eot:  # a special token is a piece of its own
            if current:
                pieces.append(tk.decode(current))
                piece_tokens.append(current)
                offset += len(pieces[-1])
                current = []
            pieces.append(tk.tokenizer.id_to_token(token) or "")
            piece_tokens.append([token])
            continue
        current.append(token)
        decoded = tk.decode(current)
        broken = decoded.find("\ufffd")
        if broken < 0 or (offset + broken < len(full) and full[offset + broken] == "\ufffd"):
            pieces.append(decoded)
            piece_tokens.append(current)
            current = []
            offset += len(decoded)
    return pieces, piece_tokens


def find_alignment(model, tk, text_tokens: list, audio_features: Tensor, num_frames: int,
                   language: str = None, medfilt_width: int = MEDIAN_FILTER_WIDTH,
                   qk_scale: float = 1.0) -> list:
    """WordTiming per word of `text_tokens` (times relative to the window start)."""
    if not text_tokens:
        return []
    prefix = list(tk.sot_sequence) + [tk.no_timestamps]
    tokens = prefix + list(text_tokens) + [tk.eot]
    ids = Tensor.from_numpy(np.array([tokens], dtype=np.int64), device=model.device)
    logits, scores = model.cross_attention_scores(ids, audio_features)
    sampled = logits.to_numpy()[0, len(prefix) - 1:-1, :tk.eot].astype(np.float64)
    sampled = np.exp(sampled - sampled.max(axis=-1, keepdims=True))
    probs = sampled / sampled.sum(axis=-1, keepdims=True)
    token_probs = probs[np.arange(len(text_tokens)), text_tokens]

    heads = alignment_heads(model.config)
    per_layer = {}
    for layer, _ in heads:
        if layer not in per_layer:
            per_layer[layer] = scores[layer].to_numpy()[0]  # [h, t, frames]
    weights = np.stack([per_layer[layer][head] for layer, head in heads]).astype(np.float32)
    weights = weights[:, :, :num_frames // 2] * np.float32(qk_scale)
    weights = np.exp(weights - weights.max(axis=-1, keepdims=True))
    weights /= weights.sum(axis=-1, keepdims=True)
    mean = weights.mean(axis=-2, keepdims=True)
    std = weights.std(axis=-2, keepdims=True)
    weights = median_filter((weights - mean) / std, medfilt_width)
    matrix = weights.mean(axis=0)[len(prefix) - 1:-1]  # rows: <|notimestamps|>, text tokens
    text_indices, time_indices = dtw(-matrix)

    words, word_tokens = split_words(tk, list(text_tokens) + [tk.eot], language)
    if len(word_tokens) <= 1:
        return []
    boundaries = np.pad(np.cumsum([len(t) for t in word_tokens[:-1]]), (1, 0))
    jumps = np.pad(np.diff(text_indices), (1, 0), constant_values=1).astype(bool)
    jump_times = time_indices[jumps] / TOKENS_PER_SECOND
    starts = jump_times[boundaries[:-1]]
    ends = jump_times[boundaries[1:]]
    return [WordTiming(word, ids, float(start), float(end), float(np.mean(token_probs[i:j])))
            for word, ids, start, end, i, j in zip(words, word_tokens, starts, ends,
                                                    boundaries[:-1], boundaries[1:])]


def merge_punctuations(alignment: list, prepended: str, appended: str) -> None:
    """Attach opening punctuation to the word after it and closing punctuation to the word
    before it (the emptied entries keep their place with no text and no tokens)."""
    i, j = len(alignment) - 2, len(alignment) - 1
    while i >= 0:
        previous, following = alignment[i], alignment[j]
        if previous.word.startswith(" ") and previous.word.strip() in prepended:
            following.word = previous.word + following.word
            following.tokens = previous.tokens + following.tokens
            previous.word, previous.tokens = "", []
        else:
            j = i
        i -= 1
    i, j = 0, 1
    while j < len(alignment):
        previous, following = alignment[i], alignment[j]
        if not previous.word.endswith(" ") and following.word in appended:
            previous.word = previous.word + following.word
            previous.tokens = previous.tokens + following.tokens
            following.word, following.tokens = "", []
        else:
            i = j
        j += 1


def add_word_timestamps(segments: list, model, tk, audio_features: Tensor, num_frames: int,
                        last_speech_timestamp: float, language: str = None,
                        prepend_punctuations: str = PREPEND_PUNCTUATIONS,
                        append_punctuations: str = APPEND_PUNCTUATIONS) -> None:
    """Set `words` on each of one window's segments (and pull the segment's start and end to
    its words', as openai-whisper does)."""
    if not segments:
        return
    tokens_per_segment = [[t for t in s.tokens if t < tk.eot] for s in segments]
    text_tokens = [t for tokens in tokens_per_segment for t in tokens]
    alignment = find_alignment(model, tk, text_tokens, audio_features, num_frames, language)
    durations = np.array([t.end - t.start for t in alignment])
    durations = durations[durations.nonzero()]
    median_duration = min(0.7, float(np.median(durations))) if len(durations) else 0.0
    max_duration = median_duration * 2
    if len(durations):  # sentence-edge words at most twice the median long
        for i in range(1, len(alignment)):
            if alignment[i].end - alignment[i].start > max_duration:
                if alignment[i].word in SENTENCE_END_MARKS:
                    alignment[i].end = alignment[i].start + max_duration
                elif alignment[i - 1].word in SENTENCE_END_MARKS:
                    alignment[i].start = alignment[i].end - max_duration
    merge_punctuations(alignment, prepend_punctuations, append_punctuations)

    time_offset = segments[0].seek * HOP_LENGTH / SAMPLE_RATE
    index = 0
    for segment, tokens in zip(segments, tokens_per_segment):
        saved, words = 0, []
        while index < len(alignment) and saved < len(tokens):
            timing = alignment[index]
            if timing.word:
                words.append(Word(timing.word, round(float(time_offset + timing.start), 2),
                                  round(float(time_offset + timing.end), 2), timing.probability))
            saved += len(timing.tokens)
            index += 1
        if words:
            _trim_edges(segment, words, last_speech_timestamp, median_duration, max_duration)
            last_speech_timestamp = segment.end
        segment.words = words


def _trim_edges(segment, words, last_speech_timestamp, median_duration, max_duration):
    """The first word after a pause and the words at the segment's edges no longer than the
    heuristics allow; the segment's times follow its words unless a word overruns by 0.5 s."""
    first, last = words[0], words[-1]
    if first.end - last_speech_timestamp > median_duration * 4 and (
            first.end - first.start > max_duration
            or (len(words) > 1 and words[1].end - first.start > max_duration * 2)):
        if len(words) > 1 and words[1].end - words[1].start > max_duration:
            boundary = max(words[1].end / 2, words[1].end - max_duration)
            first.end = words[1].start = boundary
        first.start = max(0, first.end - max_duration)
    if segment.start < first.end and segment.start - 0.5 > first.start:
        first.start = max(0, min(first.end - median_duration, segment.start))
    else:
        segment.start = first.start
    if segment.end > last.start and segment.end + 0.5 < last.end:
        last.end = max(last.start + median_duration, segment.end)
    else:
        segment.end = last.end


def last_word_end(segments: list):
    """End of the last word of the last segment that has words, else the last segment's end
    (None without segments)."""
    for segment in reversed(segments):
        for word in reversed(segment.words or []):
            return word.end
    return segments[-1].end if segments else None
