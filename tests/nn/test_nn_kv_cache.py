"""KvCache: appends along the sequence dim equal a concatenation of the pieces, the buffer
grows past its initial capacity, views handed out earlier stay valid, and bad appends raise."""

from __future__ import annotations

import numpy as np
import pytest

from candle_web import ShapeMismatch, Tensor, bf16, f16, nn

torch = pytest.importorskip("torch")

BATCH, HEADS, HEAD_DIM = 1, 2, 4


def _pieces(rng, lengths):
    return [(rng.standard_normal((BATCH, HEADS, n, HEAD_DIM)).astype(np.float32),
             rng.standard_normal((BATCH, HEADS, n, HEAD_DIM)).astype(np.float32)) for n in lengths]


def test_appends_equal_torch_cat_and_grow_past_capacity():
    rng = np.random.default_rng(3)
    # Prompt of 3, then single tokens and a chunk: crosses capacity 4 -> 8 -> 16.
    pieces = _pieces(rng, [3, 1, 1, 5, 1, 6])
    cache = nn.KvCache(dim=2, initial_capacity=4)
    for step, (k_np, v_np) in enumerate(pieces, start=1):
        k, v = cache.append(Tensor.from_numpy(k_np), Tensor.from_numpy(v_np))
        expected_k = torch.cat([torch.from_numpy(p[0]) for p in pieces[:step]], dim=2)
        expected_v = torch.cat([torch.from_numpy(p[1]) for p in pieces[:step]], dim=2)
        np.testing.assert_array_equal(k.to_numpy(), expected_k.numpy())
        np.testing.assert_array_equal(v.to_numpy(), expected_v.numpy())
        assert cache.current_seq_len() == expected_k.shape[2]
    assert cache.current_seq_len() == 17
    assert cache.k.capacity >= 4  # the constructor's value is kept for reset


def test_earlier_views_are_unchanged_by_later_appends():
    rng = np.random.default_rng(4)
    pieces = _pieces(rng, [2, 1, 3, 4])
    cache = nn.KvCache(dim=2, initial_capacity=2)
    snapshots = []
    for k_np, v_np in pieces:
        k, v = cache.append(Tensor.from_numpy(k_np), Tensor.from_numpy(v_np))
        snapshots.append((k, v, k.to_numpy().copy(), v.to_numpy().copy()))
    for k, v, k_then, v_then in snapshots:
        np.testing.assert_array_equal(k.to_numpy(), k_then)
        np.testing.assert_array_equal(v.to_numpy(), v_then)


def test_returned_views_are_usable_in_attention():
    """The cached k/v feed matmul like any tensor (views of the buffer, possibly strided)."""
    rng = np.random.default_rng(5)
    cache = nn.KvCache(dim=2, initial_capacity=8)
    (k_np, v_np), = _pieces(rng, [3])
    k, v = cache.append(Tensor.from_numpy(k_np), Tensor.from_numpy(v_np))
    q_np = rng.standard_normal((BATCH, HEADS, 1, HEAD_DIM)).astype(np.float32)
    ours = nn.ops.scaled_dot_product_attention(Tensor.from_numpy(q_np), k, v)
    theirs = torch.nn.functional.scaled_dot_product_attention(
        torch.from_numpy(q_np), torch.from_numpy(k_np), torch.from_numpy(v_np))
    np.testing.assert_allclose(ours.to_numpy(), theirs.numpy(), rtol=1e-5, atol=1e-6)


def test_other_dims_and_half_dtypes():
    rng = np.random.default_rng(6)
    cache = nn.Cache(dim=1, initial_capacity=1)
    first = rng.standard_normal((2, 3, 5)).astype(np.float32)
    second = rng.standard_normal((2, 4, 5)).astype(np.float32)
    for dtype in (f16, bf16):
        cache.reset()
        cache.append(Tensor.from_numpy(first).to_dtype(dtype))
        cache.append(Tensor.from_numpy(second).to_dtype(dtype))
        data = cache.current_data()
        assert data.dtype is dtype and data.dims() == (2, 7, 5)
        expected = np.concatenate([Tensor.from_numpy(a).to_dtype(dtype).to_numpy()
                                   for a in (first, second)], axis=1)
        np.testing.assert_array_equal(data.to_numpy(), expected)


def test_negative_dim_counts_from_the_end():
    cache = nn.Cache(dim=-2, initial_capacity=2)
    cache.append(Tensor.ones((1, 2, 3, 4)))
    cache.append(Tensor.zeros((1, 2, 2, 4)))
    assert cache.current_data().dims() == (1, 2, 5, 4)


def test_reset_starts_over():
    cache = nn.KvCache(initial_capacity=2)
    cache.append(Tensor.ones((1, 1, 3, 2)), Tensor.ones((1, 1, 3, 2)))
    cache.reset()
    assert cache.current_seq_len() == 0 and cache.k.current_data() is None
    k, _ = cache.append(Tensor.zeros((1, 1, 1, 5)), Tensor.zeros((1, 1, 1, 5)))
    assert k.dims() == (1, 1, 1, 5)  # a new head size is fine after reset


def test_bad_appends_raise_naming_the_shapes():
    cache = nn.KvCache(dim=2)
    cache.append(Tensor.zeros((1, 2, 3, 4)), Tensor.zeros((1, 2, 3, 4)))
    with pytest.raises(ShapeMismatch, match=r"\[1, 2, 1, 5\].*\[1, 2, 1, 4\]"):
        cache.append(Tensor.zeros((1, 2, 1, 5)), Tensor.zeros((1, 2, 1, 5)))
    with pytest.raises(ShapeMismatch, match="f16"):
        cache.append(Tensor.zeros((1, 2, 1, 4), f16), Tensor.zeros((1, 2, 1, 4), f16))
    with pytest.raises(ShapeMismatch):
        cache.append(Tensor.zeros((2, 4)), Tensor.zeros((2, 4)))  # wrong rank
    # A failed append leaves the cache as it was.
    assert cache.current_seq_len() == 3


def test_a_bad_value_leaves_keys_untouched():
    cache = nn.KvCache(dim=2)
    cache.append(Tensor.zeros((1, 2, 3, 4)), Tensor.zeros((1, 2, 3, 4)))
    with pytest.raises(ShapeMismatch):
        cache.append(Tensor.zeros((1, 2, 1, 4)), Tensor.zeros((1, 3, 1, 4)))
    with pytest.raises(ShapeMismatch, match="different lengths"):
        cache.append(Tensor.zeros((1, 2, 1, 4)), Tensor.zeros((1, 2, 2, 4)))
    assert cache.k.current_seq_len == cache.v.current_seq_len == 3
    k, v = cache.append(Tensor.ones((1, 2, 1, 4)), Tensor.ones((1, 2, 1, 4)))
    assert k.dims() == v.dims() == (1, 2, 4, 4)


def test_in_place_buffers_and_appends_take_turns_and_reorder_follows_beams():
    """What the accelerated parts rely on: they write a step into `buffers()` and `advance`;
    the generic path then appends after it and reads everything back."""
    from candle_web import Device, Tensor, f32
    from candle_web.nn import KvCache

    cache = KvCache(dim=2, initial_capacity=2)
    device = Device.cpu(backend="numpy")
    first = np.arange(2 * 3 * 1 * 4, dtype=np.float32).reshape(2, 3, 1, 4)
    keys, values = cache.buffers(1, first.shape, f32, device)
    keys[:, :, 0] = first[:, :, 0]
    values[:, :, 0] = -first[:, :, 0]
    cache.advance(1)
    assert cache.length == 1
    more = Tensor.from_numpy(np.ones((2, 3, 2, 4), np.float32), device=device)
    k, v = cache.append(more, more)  # grows past the initial capacity of 2
    assert k.dims() == (2, 3, 3, 4) and cache.length == 3
    np.testing.assert_array_equal(k.to_numpy()[:, :, 0], first[:, :, 0])
    np.testing.assert_array_equal(v.to_numpy()[:, :, 1:], np.ones((2, 3, 2, 4)))
    cache.reorder([1, 1])
    k_now = cache.k.current_data().to_numpy()
    np.testing.assert_array_equal(k_now[0], k_now[1])
    np.testing.assert_array_equal(k_now[0, :, 0], first[1, :, 0])
    with pytest.raises(ShapeMismatch, match="do not fit"):
        cache.advance(100)
    with pytest.raises(ShapeMismatch, match="do not match"):
        cache.buffers(1, (2, 5, 1, 4), f32, device)
