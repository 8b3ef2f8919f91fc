"""Key/value cache for autoregressive decoding.

Appends along one dim into a preallocated buffer that doubles when full, so a decode step
costs O(new tokens) instead of re-concatenating the whole history (O(n^2) over a sequence).
"""

from __future__ import annotations

from ..core.errors import ShapeMismatch
from ..core.tensor import Tensor


class Cache:
    """One growable tensor along `dim`."""

    def __init__(self, dim: int, initial_capacity: int = 64):
        self.dim = dim
        self.capacity = initial_capacity
        self._buffer = None
        self._dtype = None
        self._device = None
        self.current_seq_len = 0

    def reset(self) -> None:
        self._buffer = None
        self.current_seq_len = 0

    def current_data(self):
        if self._buffer is None:
            return None
        index = [slice(None)] * self._buffer.ndim
        index[self.dim] = slice(0, self.current_seq_len)
        return Tensor.from_storage(self._buffer[tuple(index)], self._dtype, self._device)

    def check(self, src: Tensor) -> int:
        """Validate `src` for `append` without changing anything; returns the normalised dim."""
        dim = self.dim if self.dim >= 0 else src.rank + self.dim
        if not 0 <= dim < src.rank:
            raise ShapeMismatch(f"kv cache append: dim {self.dim} is out of range for "
                                f"{list(src.shape)}")
        if self._buffer is not None:
            expected = list(self._buffer.shape)
            got = list(src.dims())
            if len(got) == len(expected):
                expected[dim] = got[dim]
            if expected != got or src.dtype is not self._dtype:
                raise ShapeMismatch(f"kv cache append: got {got} {src.dtype.name}, expected "
                                    f"{expected} {self._dtype.name}")
        return dim

    def append(self, src: Tensor) -> None:
        dim = self.check(src)
        added = src.dims()[dim]
        self.reserve(added, src.dims(), src.dtype, src.device, dim)
        needed = self.current_seq_len + added
        index = [slice(None)] * self._buffer.ndim
        index[dim] = slice(self.current_seq_len, needed)
        self._buffer[tuple(index)] = src.storage()
        self.current_seq_len = needed

    def reserve(self, added: int, shape, dtype, device, dim: int = None) -> None:
        """Room for `added` more positions of entries shaped like `shape` (its length along
        the cache dim does not matter), allocating or growing the buffer."""
        if self._buffer is None:
            dim = self.dim if dim is None else dim
            dim = dim if dim >= 0 else len(shape) + dim
            full = list(shape)
            full[dim] = max(self.capacity, added)
            self._buffer = device.backend.xp.empty(tuple(full), dtype=dtype.np_storage)
            self._dtype, self._device = dtype, device
            self.dim = dim
        else:
            expected = list(self._buffer.shape)
            got = list(shape)
            if len(got) == len(expected):
                got[self.dim] = expected[self.dim]
            if got != expected or dtype is not self._dtype:
                raise ShapeMismatch(f"kv cache: entries {list(shape)} {dtype.name} do not "
                                    f"match the cached {expected} {self._dtype.name}")
        needed = self.current_seq_len + added
        if needed > self._buffer.shape[self.dim]:
            self._grow(needed)

    def buffer(self):
        """The whole backend buffer (capacity >= length) for in-place writes, or None."""
        return self._buffer

    def truncate(self, length: int) -> None:
        """Keep the first `length` positions (a chat rolled back to where a conversation
        diverged). Dropping positions moves the cache to a copy of its buffer, as a reset or
        a growth does: a mirror of the buffer elsewhere (the wasm team's shared-memory copy,
        backend/wasm/team_parts.py) trusts that one buffer only grows by appending, and so
        sees a new array and copies it afresh instead of keeping the dropped positions."""
        if not 0 <= length <= self.current_seq_len:
            raise ShapeMismatch(f"kv cache truncate: {length} is outside 0..{self.current_seq_len} "
                                "(the cached positions)")
        if length < self.current_seq_len and self._buffer is not None:
            self._buffer = self._buffer.copy()
        self.current_seq_len = length

    def reorder(self, indices) -> None:
        """Keep rows `indices` of dim 0 (beam search: each row follows its beam)."""
        if self._buffer is not None:
            xp = self._device.backend.xp
            self._buffer = self._buffer[xp.asarray(indices)]

    def _grow(self, needed: int) -> None:
        xp = self._device.backend.xp
        new_size = max(needed, 2 * self._buffer.shape[self.dim])
        shape = list(self._buffer.shape)
        shape[self.dim] = new_size
        grown = xp.empty(tuple(shape), dtype=self._buffer.dtype)
        index = [slice(None)] * self._buffer.ndim
        index[self.dim] = slice(0, self.current_seq_len)
        grown[tuple(index)] = self._buffer[tuple(index)]
        self._buffer = grown


class KvCache:
    """Keys and values appended together; `append` returns the full (k, v) so far. The one KV
    cache of the package: the generic tensor path appends, and an accelerated part writes the
    same buffers in place (`buffers` / `advance`), so the two paths can take turns."""

    def __init__(self, dim: int = 2, initial_capacity: int = 64):
        self.k = Cache(dim, initial_capacity)
        self.v = Cache(dim, initial_capacity)

    def append(self, k: Tensor, v: Tensor):
        # Check both first so that a bad `v` cannot leave `k` one step ahead.
        k_dim, v_dim = self.k.check(k), self.v.check(v)
        if k.dims()[k_dim] != v.dims()[v_dim]:
            raise ShapeMismatch(f"kv cache append: k {list(k.shape)} and v {list(v.shape)} add "
                                f"different lengths along dim {self.k.dim}")
        self.k.append(k)
        self.v.append(v)
        return self.k.current_data(), self.v.current_data()

    def current_seq_len(self) -> int:
        return self.k.current_seq_len

    @property
    def length(self) -> int:
        return self.k.current_seq_len

    def reset(self) -> None:
        self.k.reset()
        self.v.reset()

    def truncate(self, length: int) -> None:
        """Keep the first `length` positions of keys and values (both checked first)."""
        if not 0 <= length <= min(self.k.current_seq_len, self.v.current_seq_len):
            raise ShapeMismatch(f"kv cache truncate: {length} is outside 0..{self.length} "
                                "(the cached positions)")
        self.k.truncate(length)
        self.v.truncate(length)

    def reorder(self, indices) -> None:
        """Keep batch rows `indices` (beam search), in both caches."""
        self.k.reorder(indices)
        self.v.reorder(indices)

    # -- in place, for the accelerated parts that write a step's keys and values themselves --
    def buffers(self, extra: int, shape, dtype, device):
        """The (keys, values) backend buffers with room for `extra` more positions of entries
        shaped like `shape`; a part writes positions length .. length+extra-1, then calls
        `advance(extra)`."""
        self.k.reserve(extra, shape, dtype, device)
        self.v.reserve(extra, shape, dtype, device)
        return self.k.buffer(), self.v.buffer()

    def advance(self, n: int) -> None:
        """Count `n` positions written in place into `buffers()` as cached."""
        if self.k.buffer() is None or self.length + n > self.k.buffer().shape[self.k.dim]:
            raise ShapeMismatch(f"kv cache advance: {n} positions do not fit the buffers "
                                "(reserve them with buffers() first)")
        self.k.current_seq_len += n
        self.v.current_seq_len += n
