"""Reusing the KV caches of finished requests (prompt caching, as llama-server's slots and
vLLM's prefix caching do): a request whose prompt begins with the tokens an earlier request
held (a shared system prompt, a chat resent with its whole history, a retried request) copies
those positions' keys and values and runs only the rest of its prompt.

The answer does not change: this is used only where the model's decode steps split a prompt
exactly (`FusedCausalSteps.splits_exactly`: on the numba part a prompt's keys, values and
logits are bit for bit those of feeding it token by token, and a batched step's rows those of
the single step), so the copied positions hold the very values the request would have
computed itself.

Memory is bounded: each kept entry is a compact copy of the cached positions (not the slot's
whole buffer), and the oldest entries go first once the pool holds more than `max_bytes`.
Only the scheduler thread uses a pool.
"""

from __future__ import annotations

import collections

from ..core.tensor import Tensor

# Shorter shared prefixes are not worth an entry's bookkeeping.
MIN_REUSED_TOKENS = 4
DEFAULT_MAX_BYTES = 256 * 2**20


def _compact(cache):
    """A contiguous copy of the cached positions of one nn.kv_cache.Cache, as a Tensor."""
    data = cache.current_data()
    return Tensor.from_storage(data.storage().copy(), data.dtype, data.device)


class PrefixPool:
    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES):
        self.max_bytes = max_bytes
        self.entries: collections.OrderedDict = collections.OrderedDict()  # ids -> (blocks, bytes)
        self.bytes = 0
        self.reused_tokens = 0  # what tests and the bench read

    def keep(self, ids: list, caches: list) -> None:
        """Remember the positions `caches` (one nn.KvCache per block) hold, whose tokens are
        the first of `ids` (the request's prompt, then its generated tokens)."""
        length = min(cache.length for cache in caches) if caches else 0
        if length < MIN_REUSED_TOKENS or length > len(ids):
            return
        key = tuple(ids[:length])
        if key in self.entries:
            self.entries.move_to_end(key)
            return
        blocks = [(_compact(cache.k), _compact(cache.v)) for cache in caches]
        size = sum(k.storage().nbytes + v.storage().nbytes for k, v in blocks)
        if size > self.max_bytes:
            return
        # An entry this one extends has nothing left to offer.
        for old in [old for old in self.entries if key[:len(old)] == old]:
            self._drop(old)
        self.entries[key] = (blocks, size)
        self.bytes += size
        while self.bytes > self.max_bytes:
            self._drop(next(iter(self.entries)))

    def restore(self, prompt_ids: list, caches: list) -> int:
        """Fill the empty `caches` with the longest kept prefix of prompt_ids (all but its last
        token at most: that one's logits start the answer); returns how many positions."""
        best, reused = None, 0
        limit = len(prompt_ids) - 1
        for key in self.entries:
            shared = 0
            bound = min(limit, len(key))
            while shared < bound and key[shared] == prompt_ids[shared]:
                shared += 1
            if shared > reused:
                best, reused = key, shared
        if best is None or reused < MIN_REUSED_TOKENS:
            return 0
        self.entries.move_to_end(best)
        blocks, _ = self.entries[best]
        for cache, (keys, values) in zip(caches, blocks):
            dim = cache.k.dim
            cache.append(keys.narrow(dim, 0, reused), values.narrow(dim, 0, reused))
        self.reused_tokens += reused
        return reused

    def _drop(self, key) -> None:
        _, size = self.entries.pop(key)
        self.bytes -= size
