"""Tokenization models of the HF tokenizer.json format: a word -> [(id, token)].

- BPE: byte-level (GPT-2) or SentencePiece-style (byte_fallback, unk/fuse_unk), with the
  continuing_subword_prefix / end_of_word_suffix options and ignore_merges.
- Unigram: Viterbi over the vocabulary scores, unknown pieces fused, byte fallback.
- WordPiece: greedy longest-match-first with a continuing-subword prefix.
- WordLevel: whole-word lookup.
Each model caches the result per word: words repeat a lot in real text.
"""

from __future__ import annotations

import bisect
import heapq

from ..core.errors import FormatError, UnsupportedError
from .fields import MAX_COUNT, MAX_ID, Fields, as_int, as_list, as_number, as_string, describe

# Words longer than this (in characters) are not cached, as in HF (MAX_LENGTH 256 bytes).
CACHE_MAX_WORD_LENGTH = 256
CACHE_MAX_ENTRIES = 100_000
# Score given to an unknown character in Unigram: below every real piece (HF kUnkPenalty).
UNIGRAM_UNK_PENALTY = 10.0


def byte_fallback_token(byte: int) -> str:
    return f"<0x{byte:02X}>"


class WordCache:
    """A bounded dict: past the limit new words are simply not cached (as in HF)."""

    def __init__(self, capacity: int = CACHE_MAX_ENTRIES):
        self.capacity = capacity
        self.entries: dict = {}

    def get(self, word):
        return self.entries.get(word)

    def put(self, word, value):
        if len(word) < CACHE_MAX_WORD_LENGTH and len(self.entries) < self.capacity:
            self.entries[word] = value


class Model:
    vocab: dict
    id_to_token_map: dict

    def tokenize(self, word: str) -> list:
        raise NotImplementedError

    def token_to_id(self, token: str):
        return self.vocab.get(token)

    def id_to_token(self, token_id: int):
        return self.id_to_token_map.get(token_id)

    def get_vocab_size(self) -> int:
        return len(self.vocab)


class BPE(Model):
    def __init__(self, vocab: dict, merges: list, unk_token=None, byte_fallback=False,
                 fuse_unk=False, continuing_subword_prefix=None, end_of_word_suffix=None,
                 ignore_merges=False, dropout=None):
        if dropout not in (None, 0, 0.0):
            raise UnsupportedError(f"BPE dropout={dropout}: only deterministic BPE "
                                   f"(dropout null) is implemented")
        self.vocab = vocab
        self.id_to_token_map = {token_id: token for token, token_id in vocab.items()}
        self.unk_token = unk_token
        self.byte_fallback = byte_fallback
        self.fuse_unk = fuse_unk
        self.prefix = continuing_subword_prefix or ""
        self.suffix = end_of_word_suffix or ""
        self.ignore_merges = ignore_merges
        self.merge_ranks = self._build_merges(merges)
        self.cache = WordCache()

    def _build_merges(self, merges: list) -> dict:
        """(left id, right id) -> (rank, merged id); a later duplicate overrides, as in HF."""
        ranks = {}
        prefix_length = len(self.prefix)
        vocab = self.vocab
        # Loading 50k merges is on the start-up path: a lean loop, checks only on failure.
        for rank, merge in enumerate(merges):
            try:
                if merge.__class__ is str:
                    left, right = merge.split(" ")
                else:
                    left, right = merge
                ranks[(vocab[left], vocab[right])] = (rank, vocab[left + right[prefix_length:]])
            except (ValueError, TypeError, AttributeError, KeyError):
                raise FormatError(f"tokenizer.json model.merges[{rank}] = {describe(merge)}: "
                                  f"expected a pair of vocabulary tokens whose concatenation "
                                  f"is in the vocabulary") from None
        return ranks

    def tokenize(self, word: str) -> list:
        if not word:
            return []
        if self.ignore_merges:
            token_id = self.vocab.get(word)
            if token_id is not None:
                return [(token_id, word)]
        cached = self.cache.get(word)
        if cached is None:
            cached = [(token_id, self.id_to_token_map[token_id])
                      for token_id in self._merge_word(word)]
            self.cache.put(word, cached)
        return cached

    def _initial_symbols(self, word: str) -> list:
        symbols = []
        pending_unk = None  # (unk id, fused) for unknown characters waiting to be emitted
        last_index = len(word) - 1
        for index, char in enumerate(word):
            piece = char
            if index > 0 and self.prefix:
                piece = self.prefix + piece
            if index == last_index and self.suffix:
                piece = piece + self.suffix
            token_id = self.vocab.get(piece)
            if token_id is not None:
                if pending_unk is not None:
                    symbols.append(pending_unk)
                    pending_unk = None
                symbols.append(token_id)
                continue
            if self.byte_fallback:
                byte_ids = [self.vocab.get(byte_fallback_token(byte))
                            for byte in piece.encode("utf-8")]
                if None not in byte_ids:
                    # HF emits the bytes before a still-pending unknown: kept as is.
                    symbols.extend(byte_ids)
                    continue
            if self.unk_token is not None:
                unk_id = self.vocab.get(self.unk_token)
                if unk_id is None:
                    raise FormatError(f"tokenizer.json model.unk_token {self.unk_token!r} is "
                                      f"not in the vocabulary")
                if pending_unk is not None and not self.fuse_unk:
                    symbols.append(pending_unk)
                pending_unk = unk_id
            # Without an unk token an unknown character is dropped, as in HF.
        if pending_unk is not None:
            symbols.append(pending_unk)
        return symbols

    def _merge_word(self, word: str) -> list:
        """Merge the adjacent pair of lowest rank, leftmost first, until none is left: HF's
        order (a priority queue keyed by (rank, position)). A heap of candidate pairs over a
        linked list of symbols makes a word of n symbols cost O(n log n); rescanning every
        pair after each merge cost O(n^2), which a SentencePiece vocabulary (no pre-tokenizer:
        the whole text is one word) turned into minutes for a 32,000-character prompt."""
        symbols = self._initial_symbols(word)
        count = len(symbols)
        if count < 2:
            return symbols
        merge_ranks = self.merge_ranks
        following = list(range(1, count)) + [-1]
        preceding = list(range(-1, count - 1))
        heap = []
        for position in range(count - 1):
            found = merge_ranks.get((symbols[position], symbols[position + 1]))
            if found is not None:
                heap.append((found[0], position, symbols[position], symbols[position + 1],
                             found[1]))
        heapq.heapify(heap)
        while heap:
            _, position, left, right, merged = heapq.heappop(heap)
            after = following[position]
            # An entry is stale once either symbol has merged since: skip it.
            if symbols[position] != left or after < 0 or symbols[after] != right:
                continue
            symbols[position] = merged
            symbols[after] = None  # gone
            after = following[position] = following[after]
            if after >= 0:
                preceding[after] = position
                found = merge_ranks.get((merged, symbols[after]))
                if found is not None:
                    heapq.heappush(heap, (found[0], position, merged, symbols[after],
                                          found[1]))
            before = preceding[position]
            if before >= 0:
                found = merge_ranks.get((symbols[before], merged))
                if found is not None:
                    heapq.heappush(heap, (found[0], before, symbols[before], merged,
                                          found[1]))
        return [symbol for symbol in symbols if symbol is not None]


class Unigram(Model):
    def __init__(self, vocab: list, unk_id=None, byte_fallback=False):
        self.pieces = []
        self.scores = []
        self.vocab = {}
        # 250k pieces in real files: a lean loop whose checks build messages only on failure.
        for index, entry in enumerate(vocab):
            if entry.__class__ not in (list, tuple) or len(entry) != 2:
                raise FormatError(f"tokenizer.json model.vocab[{index}]: expected "
                                  f"[piece, score], got {describe(entry)}")
            piece, score = entry
            if piece.__class__ is not str:
                as_string(piece, f"model.vocab[{index}][0]")
            # x - x is 0.0 exactly for finite floats, NaN for inf and NaN.
            if score.__class__ is not float or score - score != 0.0:
                score = as_number(score, f"model.vocab[{index}][1]")
            self.pieces.append(piece)
            self.scores.append(score)
            self.vocab[piece] = index
        if unk_id is not None and not 0 <= unk_id < len(self.pieces):
            raise FormatError(f"tokenizer.json model.unk_id {unk_id} is outside the "
                              f"vocabulary of {len(self.pieces)} pieces")
        self.id_to_token_map = dict(enumerate(self.pieces))
        self.unk_id = unk_id
        self.byte_fallback = byte_fallback
        self.min_score = min(self.scores) if self.scores else 0.0
        self.max_piece_length = max((len(piece) for piece in self.pieces), default=0)
        # First characters of pieces: lets the lattice skip lookups that cannot match.
        self.lengths_by_first_char: dict = {}
        for piece in self.vocab:
            if piece:
                self.lengths_by_first_char.setdefault(piece[0], set()).add(len(piece))
        self.lengths_by_first_char = {char: sorted(lengths)
                                      for char, lengths in self.lengths_by_first_char.items()}
        self.cache = WordCache()

    def get_vocab_size(self) -> int:
        return len(self.pieces)

    def tokenize(self, word: str) -> list:
        if not word:
            return []
        cached = self.cache.get(word)
        if cached is None:
            cached = self._pieces_to_tokens(self._viterbi(word))
            self.cache.put(word, cached)
        return cached

    def _viterbi(self, text: str) -> list:
        """Best segmentation; ties keep the first candidate found, as HF does."""
        length = len(text)
        unk_score = self.min_score - UNIGRAM_UNK_PENALTY
        best_score = [0.0] * (length + 1)
        best_start = [-1] * (length + 1)
        best_id = [0] * (length + 1)
        vocab = self.vocab
        scores = self.scores
        for start in range(length):
            score_here = best_score[start]
            has_single_char = False
            for piece_length in self.lengths_by_first_char.get(text[start], ()):
                stop = start + piece_length
                if stop > length:
                    break
                piece_id = vocab.get(text[start:stop])
                if piece_id is None:
                    continue
                candidate = scores[piece_id] + score_here
                if best_start[stop] < 0 or candidate > best_score[stop]:
                    best_score[stop] = candidate
                    best_start[stop] = start
                    best_id[stop] = piece_id
                if piece_length == 1:
                    has_single_char = True
            if not has_single_char:
                if self.unk_id is None:
                    raise FormatError("Unigram model: text needs the unknown piece but the "
                                      "tokenizer.json model has no unk_id")
                stop = start + 1
                candidate = unk_score + score_here
                if best_start[stop] < 0 or candidate > best_score[stop]:
                    best_score[stop] = candidate
                    best_start[stop] = start
                    best_id[stop] = self.unk_id
        # Walk back; consecutive unknown pieces are fused into one (HF fuse_unk is always on).
        pieces = []
        unknown_run = []
        stop = length
        while stop > 0:
            start = best_start[stop]
            if best_id[stop] == self.unk_id:
                unknown_run.append(text[start:stop])
            else:
                if unknown_run:
                    pieces.append("".join(reversed(unknown_run)))
                    unknown_run = []
                pieces.append(text[start:stop])
            stop = start
        if unknown_run:
            pieces.append("".join(reversed(unknown_run)))
        pieces.reverse()
        return pieces

    def _pieces_to_tokens(self, pieces: list) -> list:
        tokens = []
        for piece in pieces:
            piece_id = self.vocab.get(piece)
            if piece_id is not None:
                tokens.append((piece_id, piece))
                continue
            if self.byte_fallback:
                byte_tokens = [byte_fallback_token(byte) for byte in piece.encode("utf-8")]
                byte_ids = [self.vocab.get(token) for token in byte_tokens]
                if None not in byte_ids:
                    tokens.extend(zip(byte_ids, byte_tokens))
                    continue
            if self.unk_id is None:
                raise FormatError("Unigram model: unknown piece but no unk_id")
            tokens.append((self.unk_id, piece))
        return tokens


class WordPiece(Model):
    def __init__(self, vocab: dict, unk_token="[UNK]", continuing_subword_prefix="##",
                 max_input_chars_per_word=100):
        self.vocab = vocab
        self.id_to_token_map = {token_id: token for token, token_id in vocab.items()}
        self.unk_token = unk_token
        self.prefix = continuing_subword_prefix
        self.max_input_chars_per_word = max_input_chars_per_word
        # Only lengths some token has can match: at each position the greedy search tries
        # those (longest first) instead of every end, so a word costs (its length) x (distinct
        # token lengths) lookups, whatever max_input_chars_per_word says. Trying every end
        # made it cubic in the word: 3.2 s for 3,000 characters with the field at 1e9.
        prefix_length = len(self.prefix or "")
        self._first_lengths = sorted({len(token) for token in vocab if token})
        self._next_lengths = sorted({len(token) - prefix_length for token in vocab
                                     if len(token) > prefix_length
                                     and token.startswith(self.prefix or "")})
        self.cache = WordCache()

    def _unknown(self, word: str) -> list:
        unk_id = self.vocab.get(self.unk_token)
        if unk_id is None:
            raise FormatError(f"tokenizer.json model.unk_token {self.unk_token!r} is not in "
                              f"the vocabulary")
        return [(unk_id, self.unk_token)]

    def tokenize(self, word: str) -> list:
        cached = self.cache.get(word)
        if cached is None:
            cached = self._greedy(word)
            self.cache.put(word, cached)
        return cached

    def _greedy(self, word: str) -> list:
        if len(word) > self.max_input_chars_per_word:
            return self._unknown(word)
        tokens = []
        start = 0
        vocab = self.vocab
        prefix = self.prefix or ""
        while start < len(word):
            remaining = len(word) - start
            found = None
            # Longest match first, as HF: the same result as trying every end, since no
            # token has the lengths skipped.
            lengths = self._first_lengths if start == 0 else self._next_lengths
            for index in range(bisect.bisect_right(lengths, remaining) - 1, -1, -1):
                length = lengths[index]
                piece = word[start:start + length]
                if start > 0:
                    piece = prefix + piece
                piece_id = vocab.get(piece)
                if piece_id is not None:
                    found = (piece_id, piece)
                    start += length
                    break
            if found is None:
                return self._unknown(word)
            tokens.append(found)
        return tokens


class WordLevel(Model):
    def __init__(self, vocab: dict, unk_token="<unk>"):
        self.vocab = vocab
        self.id_to_token_map = {token_id: token for token, token_id in vocab.items()}
        self.unk_token = unk_token

    def tokenize(self, word: str) -> list:
        token_id = self.vocab.get(word)
        if token_id is not None:
            return [(token_id, word)]
        unk_id = self.vocab.get(self.unk_token)
        if unk_id is None:
            raise FormatError(f"WordLevel: {word!r} is unknown and unk_token "
                              f"{self.unk_token!r} is not in the vocabulary")
        return [(unk_id, self.unk_token)]


def _vocab_dict(fields: Fields) -> dict:
    vocab = fields.object("vocab")
    # On the start-up path (50k+ entries): the message is only built for a bad id.
    for token, token_id in vocab.items():
        if token_id.__class__ is not int or not 0 <= token_id <= MAX_ID:
            as_int(token_id, f"{fields.where}.vocab[{describe(token)}]")
    return vocab


def _infer_kind(config: dict, where: str) -> str:
    """Old files omit the model type: infer it from the fields, as HF does."""
    if "merges" in config:
        return "BPE"
    if "continuing_subword_prefix" in config or "max_input_chars_per_word" in config:
        return "WordPiece"
    if isinstance(config.get("vocab"), list):
        return "Unigram"
    if "vocab" in config:
        return "WordLevel"
    raise FormatError(f"tokenizer.json {where}: missing field 'type'")


def _bpe_from_config(fields: Fields) -> BPE:
    dropout = fields.number("dropout", None)
    return BPE(_vocab_dict(fields), fields.list("merges"), fields.string("unk_token", None),
               fields.boolean("byte_fallback", False), fields.boolean("fuse_unk", False),
               fields.string("continuing_subword_prefix", None),
               fields.string("end_of_word_suffix", None),
               fields.boolean("ignore_merges", False), dropout)


def _unigram_from_config(fields: Fields) -> Unigram:
    vocab = as_list(fields.get("vocab"), fields.path("vocab"))
    return Unigram(vocab, fields.integer("unk_id", None), fields.boolean("byte_fallback", False))


def _wordpiece_from_config(fields: Fields) -> WordPiece:
    return WordPiece(_vocab_dict(fields), fields.string("unk_token", "[UNK]"),
                     fields.string("continuing_subword_prefix", "##"),
                     fields.integer("max_input_chars_per_word", 100, maximum=MAX_COUNT))


def _wordlevel_from_config(fields: Fields) -> WordLevel:
    return WordLevel(_vocab_dict(fields), fields.string("unk_token", "<unk>"))


MODEL_BUILDERS = {"BPE": _bpe_from_config, "Unigram": _unigram_from_config,
                  "WordPiece": _wordpiece_from_config, "WordLevel": _wordlevel_from_config}


def model_from_config(config, where: str = "model"):
    fields = Fields(config, where)
    kind = fields.get("type", None)
    if kind is None:
        kind = _infer_kind(config, where)
    as_string(kind, fields.path("type"))
    if kind not in MODEL_BUILDERS:
        raise UnsupportedError(f"tokenizer.json {where}.type: unknown model type {kind!r}")
    return MODEL_BUILDERS[kind](fields)
