"""The numba backend's fused Whisper encoder (candle_native/numba/parts/whisper_encoder.py) against the tensor
path of the numpy reference backend.

Tolerance: measured against the same encoder run in float64 on the numpy backend
(assert_near_truth, tests/tolerances_testlib.py): the fused features may be MEASURED_FACTOR times as far
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

from tests.parts_testlib import (encode, encoder_in_float64, random_encoder, same_encoders,
                                 whisper_encoder_part)
from tests.tolerances_testlib import assert_near_truth


@pytest.mark.parametrize("frames", [300, 301, 97, 1])
def test_fused_encoder_matches_the_reference(numba_backend, rng, frames):
    from candle_web import Device

    fused, reference, truth = same_encoders(rng, "numba")
    mel = rng.standard_normal((2, 12, frames)).astype(np.float32)
    got = encode(fused, mel, Device.cpu(backend="numba"))
    assert whisper_encoder_part(fused) is not None, "the numba encoder did not take the fused path"
    numpy_device = Device.cpu(backend="numpy")
    assert_near_truth(got, encode(reference, mel, numpy_device),
                      encode(truth, mel.astype(np.float64), numpy_device), f"{frames} frames")


def test_fused_encoder_stands_aside(numba_backend, rng, monkeypatch):
    from candle_web import Device, Tensor
    from candle_web.backend.parts import encode_audio
    from candle_web.core.errors import ShapeMismatch
    from candle_web.core.tensor import Var

    numba_device = Device.cpu(backend="numba")
    fused, reference, truth = same_encoders(rng, "numba")
    mel = rng.standard_normal((1, 12, 64)).astype(np.float32)
    want = encode(reference, mel, Device.cpu(backend="numpy"))
    # Gradients: a tracked mel goes through the tensor ops (which record the backward).
    tracked = Var.from_tensor(Tensor.from_numpy(mel, device=numba_device))
    assert whisper_encoder_part(fused, tracked) is None
    assert_near_truth(encode_audio(fused, tracked).to_numpy(), want,
                      encode(truth, mel.astype(np.float64), Device.cpu(backend="numpy")), "tracked")
    with pytest.raises(ShapeMismatch, match="exceed the 160 positions"):
        encode(fused, rng.standard_normal((1, 12, 400)).astype(np.float32), numba_device)
    # f64 weights do not fit the kernels; the variable switches the fused path off.
    f64 = random_encoder(numba_device, rng, dtype=np.float64)
    wide_mel = Tensor.from_numpy(mel.astype(np.float64), device=numba_device)
    encode_audio(f64, wide_mel)
    assert whisper_encoder_part(f64, wide_mel) is None
    monkeypatch.setenv("CANDLE_WEB_FUSED_WHISPER_ENCODER", "0")
    reload_settings()  # the switches are read once
    fresh, _, _ = same_encoders(rng, "numba")
    encode(fresh, mel, numba_device)
    assert whisper_encoder_part(fresh, Tensor.from_numpy(mel, device=numba_device)) is None


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
            assert whisper_encoder_part(model.encoder) is not None
    assert features["numba"].shape == (1, 1500, 384)
    truth = encode(encoder_in_float64(model.encoder, device), mel[None].astype(np.float64), device)
    assert_near_truth(features["numba"], features["numpy"], truth, "tiny.en encoder")


def _first_librivox_clip():
    from candle_web import hub
    from candle_web.io.audio import load_audio

    clips = sorted((hub.cache_dir() / "testdata" / "speech" / "librivox").glob("*.wav"))
    if not clips:
        pytest.fail("test speech is missing: run `make test` (scripts/fetch_test_audio.sh)")
    return load_audio(str(clips[0]))
