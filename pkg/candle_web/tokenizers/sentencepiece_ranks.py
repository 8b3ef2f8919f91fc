"""The merge ranks of a SentencePiece BPE vocabulary, worked out per pair when BPE asks.

HF's SentencePiece converter (and `gguf_vocab.sentencepiece_merges`) lists a merge for every
split of every piece into two pieces of the vocabulary, ordered by the merged piece's score
(highest first), then the piece's position, then the ids of the two halves. That list has one
entry per split: a vocabulary of 'a', 'aa', ..., 'a' * N (1.65 MB of GGUF at N = 1,800) holds
N^2 / 2 of them and took over 2 GiB to build. BPE only ever asks "what is the rank of this
adjacent pair, and what does it merge into": the answer follows from the merged piece alone, so
this table stores one entry per distinct piece (memory and load time linear in the vocabulary)
and answers in O(length of the pair) per question, with the same order as the list:

    rank(left, right) = (-score of left+right, its position, id of left, id of right)

compared as tuples. Where a piece occurs twice, the list holds its merges twice and the later
(lower) entry wins, as `BPE._build_merges` lets a later duplicate override: here the larger key
of the two occurrences. The ids in the tie-break are those of the list's vocabulary, in which a
duplicated piece has its last position.
"""

from __future__ import annotations

# Answers are remembered (words repeat); past this many pairs new ones are not.
MEMO_LIMIT = 1 << 18


class SentencePieceRanks:
    """Stands in for `BPE.merge_ranks` (a dict (left id, right id) -> (rank, merged id)):
    only `get` is used by BPE."""

    def __init__(self, tokens: list, scores: list, vocab: dict):
        self.vocab = vocab  # the model's: token -> first id
        self.id_to_token = {token_id: token for token, token_id in vocab.items()}
        self.last_ids = {token: index for index, token in enumerate(tokens)}
        order = {}
        for position, (piece, score) in enumerate(zip(tokens, scores)):
            key = (-score, position)
            previous = order.get(piece)
            if previous is None or key > previous:
                order[piece] = key
        self.order = order
        self._memo = {}

    def get(self, pair, default=None):
        found = self._memo.get(pair, self)
        if found is self:
            found = self._look_up(pair)
        if len(self._memo) < MEMO_LIMIT:
            self._memo[pair] = found
        return default if found is None else found

    def _look_up(self, pair):
        left = self.id_to_token.get(pair[0])
        right = self.id_to_token.get(pair[1])
        if not left or not right:
            return None
        merged = left + right
        key = self.order.get(merged)
        if key is None:
            return None
        return ((key[0], key[1], self.last_ids[left], self.last_ids[right]), self.vocab[merged])

    def __len__(self) -> int:
        return len(self.order)
