"""Reusing the KV caches of finished requests (prompt caching, as llama-server's slots and
vLLM's prefix caching do): a request whose prompt begins with the tokens an earlier request
held (a shared system prompt, a chat resent with its whole history, a retried request) copies
those positions' keys and values and runs only the rest of its prompt.

The answer does not change: this is used only where the model's decode steps split a prompt
exactly (`FusedCausalSteps.splits_exactly`: on the numba part a prompt's keys, values and
logits are bit for bit those of feeding it token by token, and a batched step's rows those of
the single step), so the copied positions hold the very values the request would have
computed itself.

Memory is bounded for the whole server: every text model's scheduler keeps its entries in the
one pool the ModelPool holds (entries are keyed by the model too), each entry a compact copy of
the cached positions (not the slot's whole buffer), the least recently used dropped first once
the pool holds more than `max_bytes`. No positions are kept twice along one line of tokens: an
entry that a new one extends is dropped, and a new entry that a kept one already extends (the
same prompt asked again with a shorter answer) is not stored. The schedulers' threads share the
pool: its bookkeeping takes a lock, the copies are made outside it.
"""

from __future__ import annotations

import collections
import threading

from ..core.tensor import Tensor

# Shorter shared prefixes are not worth an entry's bookkeeping.
MIN_REUSED_TOKENS = 4
DEFAULT_MAX_BYTES = 256 * 2**20


def _compact(cache):
    """A contiguous copy of the cached positions of one nn.kv_cache.Cache, as a Tensor."""
    data = cache.current_data()
    return Tensor.from_storage(data.storage().copy(), data.dtype, data.device)


def _extends(longer: tuple, shorter: tuple) -> bool:
    return len(longer) >= len(shorter) and longer[:len(shorter)] == shorter


class PrefixPool:
    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES):
        self.max_bytes = max_bytes
        # (model, ids) -> (blocks, bytes), least recently used first
        self.entries: collections.OrderedDict = collections.OrderedDict()
        self.bytes = 0
        self._lock = threading.Lock()

    def keep(self, model: str, ids: list, caches: list) -> None:
        """Remember the positions `caches` (one nn.KvCache per block of `model`) hold, whose
        tokens are the first of `ids` (the request's prompt, then its generated tokens)."""
        length = min(cache.length for cache in caches) if caches else 0
        if length < MIN_REUSED_TOKENS or length > len(ids):
            return
        key = tuple(ids[:length])
        with self._lock:
            covering = self._covering(model, key)
            if covering is not None:  # a kept entry already holds these positions
                self.entries.move_to_end(covering)
                return
        blocks = [(_compact(cache.k), _compact(cache.v)) for cache in caches]
        size = sum(k.storage().nbytes + v.storage().nbytes for k, v in blocks)
        if size > self.max_bytes:
            return
        with self._lock:
            if self._covering(model, key) is not None:  # kept meanwhile by another thread
                return
            # An entry this one extends has nothing left to offer.
            for old in [old for old in self.entries if old[0] == model
                        and _extends(key, old[1])]:
                self._drop(old)
            self.entries[(model, key)] = (blocks, size)
            self.bytes += size
            while self.bytes > self.max_bytes:
                self._drop(next(iter(self.entries)))

    def restore(self, model: str, prompt_ids: list, caches: list) -> int:
        """Fill the empty `caches` with the longest prefix of prompt_ids kept for `model` (all
        but its last token at most: that one's logits start the answer); returns how many
        positions."""
        best, reused = None, 0
        limit = len(prompt_ids) - 1
        with self._lock:
            for entry_model, key in self.entries:
                if entry_model != model:
                    continue
                shared = 0
                bound = min(limit, len(key))
                while shared < bound and key[shared] == prompt_ids[shared]:
                    shared += 1
                if shared > reused:
                    best, reused = (entry_model, key), shared
            if best is None or reused < MIN_REUSED_TOKENS:
                return 0
            self.entries.move_to_end(best)
            blocks, _ = self.entries[best]
        # The blocks are never written once kept: copied from outside the lock.
        for cache, (keys, values) in zip(caches, blocks):
            dim = cache.k.dim
            cache.append(keys.narrow(dim, 0, reused), values.narrow(dim, 0, reused))
        return reused

    def _covering(self, model: str, key: tuple):
        """A kept entry of `model` whose tokens start with `key` (with the lock held)."""
        for entry in self.entries:
            if entry[0] == model and _extends(entry[1], key):
                return entry
        return None

    def _drop(self, entry) -> None:
        _, size = self.entries.pop(entry)
        self.bytes -= size
