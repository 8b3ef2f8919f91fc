"""The API's prefix pool (api/prefixes.py) on small caches of known values: one byte budget for
every model of the server, entries that never answer another model's prompt, and no positions
kept twice along one line of tokens, whichever of the two requests ends first."""

from __future__ import annotations

import numpy as np

from candle_web.api.prefixes import PrefixPool
from candle_web.core.tensor import Tensor
from candle_web.nn.kv_cache import KvCache

BLOCKS = 2
HEADS, HEAD_DIM = 2, 4
SYSTEM = list(range(100, 112))  # a shared system prompt's 12 tokens


def caches_for(ids: list) -> list:
    """One KvCache per block holding a position for each token: keys and values are functions
    of (block, token), so a restored position can be checked for the token it belongs to."""
    caches = []
    for block in range(BLOCKS):
        tokens = np.asarray(ids, dtype=np.float32)[None, None, :, None]
        keys = np.broadcast_to(tokens + 1000 * block, (1, HEADS, len(ids), HEAD_DIM))
        cache = KvCache(dim=2)
        cache.append(Tensor.from_numpy(np.ascontiguousarray(keys)),
                     Tensor.from_numpy(np.ascontiguousarray(-keys)))
        caches.append(cache)
    return caches


def entry_bytes(n_positions: int) -> int:
    return BLOCKS * 2 * HEADS * n_positions * HEAD_DIM * 4


def restored(pool, model: str, prompt: list) -> tuple[int, list]:
    caches = [KvCache(dim=2) for _ in range(BLOCKS)]
    return pool.restore(model, prompt, caches), caches


def test_a_prompt_asked_again_with_a_shorter_answer_is_not_kept_twice():
    pool = PrefixPool()
    long_answer = SYSTEM + [1, 2, 3, 4, 5, 6]
    short_answer = SYSTEM + [1, 2]
    pool.keep("m", long_answer, caches_for(long_answer))
    pool.keep("m", short_answer, caches_for(short_answer))
    assert [ids for _, ids in pool.entries] == [tuple(long_answer)]
    assert pool.bytes == entry_bytes(len(long_answer))
    # and the other way round: the longer one replaces the shorter
    other = PrefixPool()
    other.keep("m", short_answer, caches_for(short_answer))
    other.keep("m", long_answer, caches_for(long_answer))
    assert [ids for _, ids in other.entries] == [tuple(long_answer)]
    assert other.bytes == entry_bytes(len(long_answer))


def test_a_restored_prefix_holds_the_kept_positions():
    pool = PrefixPool()
    first = SYSTEM + [1, 2, 3]
    pool.keep("m", first, caches_for(first))
    reused, caches = restored(pool, "m", SYSTEM + [7, 8])
    assert reused == len(SYSTEM)
    expected = caches_for(SYSTEM)
    for cache, want in zip(caches, expected):
        np.testing.assert_array_equal(cache.k.current_data().to_numpy(),
                                      want.k.current_data().to_numpy())
        np.testing.assert_array_equal(cache.v.current_data().to_numpy(),
                                      want.v.current_data().to_numpy())


def test_every_model_shares_one_budget_and_keeps_its_own_entries():
    n = len(SYSTEM) + 2
    pool = PrefixPool(max_bytes=2 * entry_bytes(n))
    for model, tail in (("a", [1, 2]), ("b", [1, 2]), ("a", [3, 4])):
        ids = SYSTEM + tail
        pool.keep(model, ids, caches_for(ids))
        assert pool.bytes <= pool.max_bytes
    # Three entries of one size in a budget of two: the least recently used (a's first) went.
    assert list(pool.entries) == [("b", tuple(SYSTEM + [1, 2])), ("a", tuple(SYSTEM + [3, 4]))]
    # b's entry answers b's prompts only, though a's prompt has the same tokens.
    assert restored(pool, "b", SYSTEM + [1, 2, 9])[0] == len(SYSTEM) + 2
    assert restored(pool, "c", SYSTEM + [1, 2, 9])[0] == 0
