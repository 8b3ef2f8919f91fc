"""Rotary embeddings against independent PyTorch formulations: `rope` against HF's
rotate_half, `rope_i` against the original LLaMA complex multiply, and the GGUF Q/K
permutation that links the two layouts; forward (fused and tracked) and gradients."""

from __future__ import annotations

import numpy as np
import pytest

from candle_web import ShapeMismatch, Tensor, bf16, nn
from candle_web.nn import rope, rope_frequencies, rope_i
from tests.nn.nn_testlib import assert_close, assert_grads_close, pair, randn

torch = pytest.importorskip("torch")

BATCH, HEADS, SEQ, HEAD_DIM = 2, 3, 6, 8
THETA = 10000.0


@pytest.fixture
def rng():
    return np.random.default_rng(2)


def _torch_angles(seq_len: int, head_dim: int, theta: float = THETA, start: int = 0):
    """[t, d/2] angles position * inv_freq, as HF's LlamaRotaryEmbedding computes them."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    positions = torch.arange(start, start + seq_len, dtype=torch.float64)
    return torch.outer(positions, inv_freq).float()


def _rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def _hf_rope(x, angles):
    """HF apply_rotary_pos_emb: x * cos + rotate_half(x) * sin with cos/sin of [t, d]."""
    full = torch.cat([angles, angles], dim=-1)
    return x * full.cos() + _rotate_half(x) * full.sin()


def _llama_complex_rope(x, angles):
    """The original LLaMA code: adjacent pairs (2i, 2i+1) as complex numbers times e^{i angle}."""
    pairs = x.float().reshape(*x.shape[:-1], -1, 2)
    rotated = torch.view_as_complex(pairs.contiguous()) * torch.polar(torch.ones_like(angles), angles)
    return torch.view_as_real(rotated).flatten(-2)


def _frequencies(seq_len=SEQ, head_dim=HEAD_DIM):
    return rope_frequencies(head_dim, seq_len, THETA)


def test_rope_frequencies_match_hf(rng):
    cos, sin = rope_frequencies(HEAD_DIM, 40, THETA)
    angles = _torch_angles(40, HEAD_DIM)
    assert cos.dims() == (40, HEAD_DIM // 2)
    # Angles up to 39 rad computed in f64 then rounded: cos/sin agree to f32 rounding.
    assert_close(cos, angles.cos(), rtol=0, atol=2e-6)
    assert_close(sin, angles.sin(), rtol=0, atol=2e-6)


def test_rope_matches_hf_rotate_half(rng):
    x_np = randn(rng, BATCH, HEADS, SEQ, HEAD_DIM)
    cos, sin = _frequencies()
    x, tx = pair(x_np)
    theirs = _hf_rope(tx, _torch_angles(SEQ, HEAD_DIM))
    assert_close(rope(Tensor.from_numpy(x_np), cos, sin), theirs, what="rope fused")
    tracked = rope(x, cos, sin)
    assert_close(tracked, theirs, what="rope tracked")
    assert_grads_close(tracked, theirs, [(x, tx)])


def test_rope_i_matches_llama_complex_multiply(rng):
    x_np = randn(rng, BATCH, HEADS, SEQ, HEAD_DIM)
    cos, sin = _frequencies()
    x, tx = pair(x_np)
    theirs = _llama_complex_rope(tx, _torch_angles(SEQ, HEAD_DIM))
    assert_close(rope_i(Tensor.from_numpy(x_np), cos, sin), theirs, what="rope_i fused")
    tracked = rope_i(x, cos, sin)
    assert_close(tracked, theirs, what="rope_i tracked")
    assert_grads_close(tracked, theirs, [(x, tx)])


def test_rope_gradients_reach_cos_and_sin(rng):
    """The composed path is differentiable in cos/sin too (learned or scaled frequencies)."""
    x_np = randn(rng, 1, 2, 4, HEAD_DIM)
    angles_np = _torch_angles(4, HEAD_DIM).numpy()
    for ours_fn, split in ((rope, "half"), (rope_i, "interleaved")):
        x, tx = pair(x_np)
        cos, tcos = pair(np.cos(angles_np))
        sin, tsin = pair(np.sin(angles_np))
        if split == "half":
            full_cos, full_sin = torch.cat([tcos, tcos], -1), torch.cat([tsin, tsin], -1)
            theirs = tx * full_cos + _rotate_half(tx) * full_sin
        else:
            even, odd = tx[..., 0::2], tx[..., 1::2]
            theirs = torch.stack([even * tcos - odd * tsin, even * tsin + odd * tcos], -1).flatten(-2)
        ours = ours_fn(x, cos, sin)
        assert_close(ours, theirs, what=f"{split} forward")
        assert_grads_close(ours, theirs, [(x, tx), (cos, tcos), (sin, tsin)])


def _half_to_interleaved(head_dim: int) -> np.ndarray:
    """Index map of llama.cpp's converter: interleaved position 2i holds half-layout entry i
    and 2i+1 holds entry i + d/2 (per head)."""
    half = head_dim // 2
    order = np.empty(head_dim, dtype=np.int64)
    order[0::2] = np.arange(half)
    order[1::2] = np.arange(half) + half
    return order


def test_rope_i_is_rope_under_the_gguf_permutation(rng):
    """rope_i(x) == un-permute(rope(permute(x))): why GGUF Q/K weights, permuted at
    conversion, need the interleaved rotation to give HF's results."""
    x_np = randn(rng, BATCH, HEADS, SEQ, HEAD_DIM)
    cos, sin = _frequencies()
    interleaved_from_half = _half_to_interleaved(HEAD_DIM)
    half_from_interleaved = np.argsort(interleaved_from_half)
    x_half_layout = x_np[..., half_from_interleaved]
    rotated_half = rope(Tensor.from_numpy(np.ascontiguousarray(x_half_layout)), cos, sin).to_numpy()
    expected = rotated_half[..., interleaved_from_half]
    # Same products and sums in a different order: a few ulps.
    assert_close(rope_i(Tensor.from_numpy(x_np), cos, sin), expected, rtol=1e-6, atol=1e-6)


def test_rope_on_a_position_offset_window(rng):
    """Decoding uses cos/sin rows narrowed at the current position."""
    x_np = randn(rng, 1, HEADS, 2, HEAD_DIM)
    cos, sin = rope_frequencies(HEAD_DIM, 32, THETA)
    start = 17
    ours = rope(Tensor.from_numpy(x_np), cos.narrow(0, start, 2), sin.narrow(0, start, 2))
    theirs = _hf_rope(torch.from_numpy(x_np), _torch_angles(2, HEAD_DIM, start=start))
    assert_close(ours, theirs, what="rope at offset")


def test_rope_bf16_input_stays_bf16_and_close(rng):
    x_np = randn(rng, 1, 2, SEQ, HEAD_DIM)
    cos, sin = _frequencies()
    x_bf16 = Tensor.from_numpy(x_np).to_dtype(bf16)
    out = rope(x_bf16, cos.to_dtype(bf16), sin.to_dtype(bf16))
    assert out.dtype is bf16
    reference = _hf_rope(torch.from_numpy(x_np), _torch_angles(SEQ, HEAD_DIM))
    # bf16 keeps 8 significant bits: relative error up to ~2^-8 per rounding, three roundings.
    assert_close(out, reference, rtol=0, atol=0.03 * float(np.abs(x_np).max()))


@pytest.mark.parametrize("fn", [rope, rope_i], ids=["rope", "rope_i"])
def test_rope_shape_errors_name_the_shapes(fn):
    cos, sin = _frequencies()
    with pytest.raises(ShapeMismatch, match=r"\[6, 8\]"):
        fn(Tensor.zeros((SEQ, HEAD_DIM)), cos, sin)  # not rank 4
    with pytest.raises(ShapeMismatch, match=r"cos \[6, 4\]"):
        fn(Tensor.zeros((1, 1, SEQ + 1, HEAD_DIM)), cos, sin)  # cos for the wrong length
    with pytest.raises(ShapeMismatch):
        fn(Tensor.zeros((1, 1, SEQ, 7)), cos, sin)  # odd head dim


def test_rope_exported_from_nn():
    assert nn.rope is rope and nn.rope_i is rope_i
