"""Shape ops, indexing and index ops against numpy/torch; views stay views."""
from __future__ import annotations

import numpy as np
import pytest

from candle_web import Tensor, u8, u32


def _t(array, device):
    return Tensor.from_numpy(np.asarray(array), device=device)


def test_reshape_squeeze_unsqueeze_flatten(device):
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    t = _t(x, device)
    assert t.reshape(4, -1).shape == (4, 6) and t.reshape((-1, 2)).shape == (12, 2)
    np.testing.assert_array_equal(t.reshape(6, 4).to_numpy(), x.reshape(6, 4))
    assert _t(np.array([5.0]), device).reshape(()).shape == ()
    assert t.unsqueeze(0).shape == (1, 2, 3, 4) and t.unsqueeze(-1).shape == (2, 3, 4, 1)
    assert t.unsqueeze(1).squeeze(1).shape == (2, 3, 4)
    assert t.squeeze(0).shape == (2, 3, 4)  # Candle: squeezing a non-1 dim is a no-op
    assert t.flatten_all().shape == (24,) and t.flatten(1, 2).shape == (2, 12)
    assert t.flatten_to(1).shape == (6, 4) and t.flatten_from(1).shape == (2, 12)
    np.testing.assert_array_equal(t.flatten_from(1).to_numpy(), x.reshape(2, 12))


def test_transpose_permute_t_are_views(device):
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    t = _t(x, device)
    for view, expected in [(t.transpose(0, 2), x.transpose(2, 1, 0)), (t.permute(1, 2, 0), x.transpose(1, 2, 0)),
                           (t.t(), x.swapaxes(-1, -2)), (t.narrow(1, 1, 2), x[:, 1:3]),
                           (t.i(slice(None), 1), x[:, 1]), (t.broadcast_left(5), np.broadcast_to(x, (5, 2, 3, 4)))]:
        np.testing.assert_array_equal(view.to_numpy(), expected)
        assert np.shares_memory(view._data, t._data), "a view must not copy"
    transposed = t.transpose(1, 2)
    assert not transposed.is_contiguous()
    copied = transposed.contiguous()
    assert copied.is_contiguous() and not np.shares_memory(copied._data, t._data)
    np.testing.assert_array_equal(copied.to_numpy(), x.transpose(0, 2, 1))
    assert t.contiguous() is t, "contiguous() copies only when needed"
    assert t.narrow(0, 1, 1).contiguous()._data.base is not None  # leading-dim narrow is already contiguous


def test_narrow_chunk_follow_candle(device, torch):
    x = np.arange(30, dtype=np.float32).reshape(6, 5)
    t = _t(x, device)
    np.testing.assert_array_equal(t.narrow(1, 2, 3).to_numpy(), x[:, 2:5])
    np.testing.assert_array_equal(t.narrow(-1, 0, 0).to_numpy(), x[:, :0])
    # Candle: sizes differ by at most one, larger first; torch's ceil rule gives 3 pieces here.
    assert [c.dims()[0] for c in t.chunk(4, 0)] == [2, 2, 1, 1]
    assert [c.shape[0] for c in torch.from_numpy(x).chunk(4, 0)] == [2, 2, 2]
    assert [c.dims()[1] for c in t.chunk(2, 1)] == [3, 2]
    assert [c.dims()[0] for c in t.chunk(8, 0)] == [1] * 6  # fewer pieces than asked
    np.testing.assert_array_equal(np.concatenate([c.to_numpy() for c in t.chunk(4, 0)]), x)


def test_broadcast_as_and_pad(device, torch):
    x = np.arange(3, dtype=np.float32).reshape(3, 1)
    t = _t(x, device)
    np.testing.assert_array_equal(t.broadcast_as((2, 3, 4)).to_numpy(), np.broadcast_to(x, (2, 3, 4)))
    np.testing.assert_array_equal(t.broadcast_left(2, 2).to_numpy(), np.broadcast_to(x, (2, 2, 3, 1)))
    y = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(_t(y, device).pad_with_zeros(1, 2, 1).to_numpy(),
                                  torch.nn.functional.pad(torch.from_numpy(y), (2, 1)).numpy())
    np.testing.assert_array_equal(_t(y, device).pad_with_zeros(0, 1, 0).to_numpy(),
                                  torch.nn.functional.pad(torch.from_numpy(y), (0, 0, 1, 0)).numpy())
    np.testing.assert_array_equal(_t(y, device).pad_with_same(1, 1, 2).to_numpy(),
                                  np.pad(y, ((0, 0), (1, 2)), mode="edge"))


def test_indexing_with_ints_slices_lists_and_tensors(device):
    x = np.arange(60, dtype=np.float32).reshape(3, 4, 5)
    t = _t(x, device)
    np.testing.assert_array_equal(t.i(1).to_numpy(), x[1])
    np.testing.assert_array_equal(t.i(-1, 2).to_numpy(), x[-1, 2])
    np.testing.assert_array_equal(t.i(slice(0, 2), slice(1, None), 3).to_numpy(), x[0:2, 1:, 3])
    np.testing.assert_array_equal(t.i(Ellipsis, 4).to_numpy(), x[..., 4])
    np.testing.assert_array_equal(t.i(None, 0).to_numpy(), x[None, 0])
    np.testing.assert_array_equal(t[1:, ::2].to_numpy(), x[1:, ::2])
    np.testing.assert_array_equal(t.i((0, slice(1, 3))).to_numpy(), x[0, 1:3])
    # Index lists and integer tensors select along their dim (outer indexing, one dim each).
    np.testing.assert_array_equal(t.i(slice(None), [3, 0]).to_numpy(), x[:, [3, 0]])
    ids = _t(np.array([2, 2, 0], dtype=np.uint32), device)
    np.testing.assert_array_equal(t.i(ids, 1).to_numpy(), x[[2, 2, 0], 1])
    np.testing.assert_array_equal(t.i(ids, slice(None), [4, 1]).to_numpy(), x[[2, 2, 0]][:, :, [4, 1]])
    assert t.i(2, 3, 4).to_scalar() == 59.0


def test_index_select_gather_scatter_add_index_add_embedding(device, torch):
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    t = _t(x, device)
    tx = torch.from_numpy(x)
    for dtype in (np.int64, np.uint32, np.uint8):
        ids = np.array([2, 0, 2], dtype=dtype)
        np.testing.assert_array_equal(t.index_select(_t(ids, device), 0).to_numpy(), x[[2, 0, 2]])
        np.testing.assert_array_equal(t.index_select(_t(ids, device), 1).to_numpy(), x[:, [2, 0, 2]])
    gather_ids = np.array([[0, 3], [1, 1], [3, 2]])
    np.testing.assert_array_equal(t.gather(_t(gather_ids, device), 1).to_numpy(),
                                  tx.gather(1, torch.from_numpy(gather_ids)).numpy())
    src = np.ones((3, 2), dtype=np.float32) * np.array([[1], [10], [100]], dtype=np.float32)
    np.testing.assert_array_equal(
        t.scatter_add(_t(gather_ids, device), _t(src, device), 1).to_numpy(),
        tx.scatter_add(1, torch.from_numpy(gather_ids), torch.from_numpy(src)).numpy())
    rows = np.array([1, 1, 0])
    add_src = np.arange(12, dtype=np.float32).reshape(3, 4)
    np.testing.assert_array_equal(
        t.index_add(_t(rows, device), _t(add_src, device), 0).to_numpy(),
        tx.index_add(0, torch.from_numpy(rows), torch.from_numpy(add_src)).numpy())
    table = np.arange(15, dtype=np.float32).reshape(5, 3)
    token_ids = np.array([[4, 0], [1, 4]])
    np.testing.assert_array_equal(
        _t(table, device).embedding(_t(token_ids, device)).to_numpy(),
        torch.nn.functional.embedding(torch.from_numpy(token_ids), torch.from_numpy(table)).numpy())


def test_where_cond_cat_stack(device, torch):
    mask = np.array([[1, 0, 1], [0, 0, 1]], dtype=np.uint8)
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = -a
    got = _t(mask, device).where_cond(_t(a, device), _t(b, device))
    np.testing.assert_array_equal(got.to_numpy(), np.where(mask != 0, a, b))
    assert _t(mask.astype(np.uint32), device).where_cond(_t(a, device), _t(b, device)).dtype.name == "f32"
    for dim in (0, 1, -1):
        np.testing.assert_array_equal(Tensor.cat([_t(a, device), _t(b, device)], dim).to_numpy(),
                                      np.concatenate([a, b], axis=dim))
    for dim in (0, 1, 2, -1):
        np.testing.assert_array_equal(Tensor.stack([_t(a, device), _t(b, device)], dim).to_numpy(),
                                      torch.stack([torch.from_numpy(a), torch.from_numpy(b)], dim).numpy())
    assert Tensor.cat([_t(a, device)], 0).shape == (2, 3)


def test_comparisons_make_u8_masks_usable_by_where(device):
    x = _t(np.array([-1.0, 0.5, 2.0], dtype=np.float32), device)
    mask = x.gt(0.0)
    assert mask.dtype is u8 and mask.to_list() == [0, 1, 1]
    assert mask.where_cond(x, x.zeros_like()).to_list() == [0.0, 0.5, 2.0]
    assert x.argmax(0).dtype is u32
