"""The numba backend's fused Whisper encoder (candle_native/parts/whisper_encoder.py) against the tensor
path of the numpy reference backend.

Tolerance: measured against the same encoder run in float64 on the numpy backend
(assert_near_truth, tests/tolerances.py): the fused features may be MEASURED_FACTOR times as far
from those as the numpy backend's f32 features are. Both do the same f32 products and sums in
other orders (one-threaded BLAS on row blocks, the convolutions' three taps summed separately
instead of one im2col product), numba's GELU uses its own erf fit (5e-7 absolute).

Checked here:
- random small encoders (odd frame counts: the stride-2 conv's last row, row blocks that do not
  divide the frames; batch 2; heads of 16) against the numpy reference;
- the real tiny.en encoder on a LibriVox window, against numpy, and that it took the fused path;
- the fused path stands aside for gradients, f64 weights and CANDLE_WEB_FUSED_WHISPER_ENCODER=0,
  and a mel longer than the positions raises ShapeMismatch as the tensor path does.
Greedy tokens of the real models on the numba backend (tests/models/test_whisper*.py) run
through this path.
"""

from __future__ import annotations

import numpy as np
import pytest
from candle_web.backend.settings import reload_settings

from tolerances import assert_near_truth


def _random_encoder(device, rng, d=64, n_head=4, n_blocks=2, n_mels=12, n_ctx=160, d_ff=256,
                    dtype=np.float32):
    from candle_web import Tensor
    from candle_web.models.whisper import AudioEncoder, Mlp, MultiHeadAttention, ResidualAttentionBlock
    from candle_web.nn.layers import LayerNorm, Linear

    def t(*shape, scale=0.2, offset=0.0):
        values = (rng.standard_normal(shape) * scale + offset).astype(np.float32)
        return Tensor.from_numpy(values.astype(dtype), device=device)  # f64: the same values

    def linear(n_out, n_in):
        return Linear(t(n_out, n_in), t(n_out, scale=0.05))

    def ln():
        return LayerNorm(t(d, scale=0.1, offset=1.0), t(d, scale=0.1), 1e-5)

    blocks = [ResidualAttentionBlock(ln(), MultiHeadAttention(n_head, out=linear(d, d), qkv=linear(3 * d, d)),
                                     ln(), Mlp(linear(d_ff, d), linear(d, d_ff)))
              for _ in range(n_blocks)]
    return AudioEncoder(t(d, n_mels, 3), t(d, scale=0.05), t(d, d, 3, scale=0.1), t(d, scale=0.05),
                        t(n_ctx, d), blocks, ln())


def _encode(encoder, mel, device):
    from candle_web import Tensor

    return encoder(Tensor.from_numpy(mel, device=device)).to_numpy()


def _same_encoders(rng, **kwargs):
    """The same random encoder on the numba backend, on the numpy backend, and on the numpy
    backend in float64 (the truth the other two are measured against)."""
    from candle_web import Device

    seed = int(rng.integers(1 << 30))
    numba_device, numpy_device = Device.cpu(backend="numba"), Device.cpu(backend="numpy")
    return (_random_encoder(numba_device, np.random.default_rng(seed), **kwargs),
            _random_encoder(numpy_device, np.random.default_rng(seed), **kwargs),
            _random_encoder(numpy_device, np.random.default_rng(seed), dtype=np.float64, **kwargs))


def _encoder_in_float64(encoder, device):
    """A loaded encoder's weights as float64 tensors on `device`, in the same modules."""
    from candle_web import Tensor
    from candle_web.models.whisper import AudioEncoder, Mlp, MultiHeadAttention, ResidualAttentionBlock
    from candle_web.nn.layers import LayerNorm, Linear

    def wide(tensor):
        if tensor is None:
            return None
        return Tensor.from_numpy(tensor.to_numpy().astype(np.float64), device=device)

    def linear(layer):
        return Linear(wide(layer.weight), wide(layer.bias))

    def norm(layer):
        return LayerNorm(wide(layer.weight), wide(layer.bias), layer.eps)

    blocks = [ResidualAttentionBlock(
        norm(b.attn_ln),
        MultiHeadAttention(b.attn.n_head, out=linear(b.attn.out), qkv=linear(b.attn.qkv)),
        norm(b.mlp_ln), Mlp(linear(b.mlp.fc1), linear(b.mlp.fc2))) for b in encoder.blocks]
    return AudioEncoder(wide(encoder.conv1_w), wide(encoder.conv1_b).reshape(-1),
                        wide(encoder.conv2_w), wide(encoder.conv2_b).reshape(-1),
                        wide(encoder.positions), blocks, norm(encoder.ln_post))


@pytest.mark.parametrize("frames", [300, 301, 97, 1])
def test_fused_encoder_matches_the_reference(numba_backend, rng, frames):
    from candle_web import Device

    fused, reference, truth = _same_encoders(rng)
    mel = rng.standard_normal((2, 12, frames)).astype(np.float32)
    got = _encode(fused, mel, Device.cpu(backend="numba"))
    assert fused._fused_encoder is not None, "the numba encoder did not take the fused path"
    numpy_device = Device.cpu(backend="numpy")
    assert_near_truth(got, _encode(reference, mel, numpy_device),
                      _encode(truth, mel.astype(np.float64), numpy_device), f"{frames} frames")


def test_fused_encoder_stands_aside(numba_backend, rng, monkeypatch):
    from candle_web import Device, Tensor
    from candle_web.core.errors import ShapeMismatch
    from candle_web.core.tensor import Var

    numba_device = Device.cpu(backend="numba")
    fused, reference, truth = _same_encoders(rng)
    mel = rng.standard_normal((1, 12, 64)).astype(np.float32)
    want = _encode(reference, mel, Device.cpu(backend="numpy"))
    # Gradients: a tracked mel goes through the tensor ops (which record the backward).
    tracked = Var.from_tensor(Tensor.from_numpy(mel, device=numba_device))
    assert fused._fused(tracked) is None
    assert_near_truth(fused(tracked).to_numpy(), want,
                      _encode(truth, mel.astype(np.float64), Device.cpu(backend="numpy")), "tracked")
    with pytest.raises(ShapeMismatch, match="exceed the 160 positions"):
        _encode(fused, rng.standard_normal((1, 12, 400)).astype(np.float32), numba_device)
    # f64 weights do not fit the kernels; the variable switches the fused path off.
    f64 = _random_encoder(numba_device, rng, dtype=np.float64)
    f64(Tensor.from_numpy(mel.astype(np.float64), device=numba_device))
    assert f64._fused_encoder is None
    monkeypatch.setenv("CANDLE_WEB_FUSED_WHISPER_ENCODER", "0")
    reload_settings()  # the switches are read once
    fresh, _, _ = _same_encoders(rng)
    _encode(fresh, mel, numba_device)
    assert fresh._fused_encoder is None


def test_real_tiny_encoder_matches_numpy(numba_backend, model_file):
    from candle_web import Device, Tensor
    from candle_web.io import audio
    from candle_web.models.whisper import Whisper

    model_dir = model_file("whisper-tiny.en", "model.bin").parent
    samples = _first_librivox_clip()
    mel = audio.pad_or_trim(audio.log_mel_spectrogram(samples, 80), audio.N_FRAMES).astype(np.float32)
    features = {}
    for backend in ("numba", "numpy"):
        device = Device.cpu(backend=backend)
        model = Whisper.from_pretrained(model_dir, device=device)
        features[backend] = model.encode(Tensor.from_numpy(mel[None], device=device)).to_numpy()
        if backend == "numba":
            assert model.encoder._fused_encoder is not None
    assert features["numba"].shape == (1, 1500, 384)
    truth = _encode(_encoder_in_float64(model.encoder, device), mel[None].astype(np.float64), device)
    assert_near_truth(features["numba"], features["numpy"], truth, "tiny.en encoder")


def _first_librivox_clip():
    from candle_web import hub
    from candle_web.io.audio import load_audio

    clips = sorted((hub.cache_dir() / "testdata" / "speech" / "librivox").glob("*.wav"))
    if not clips:
        pytest.fail("test speech is missing: run `make test` (scripts/fetch_test_audio.sh)")
    return load_audio(str(clips[0]))
