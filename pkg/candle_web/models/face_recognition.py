"""face-api's face recognition net (face-api 1.7.15, `face_recognition_model`, MIT; 6.4 MB of
mostly uint8-quantized TensorFlow.js weights): dlib's ResNet-34-style face descriptor, ported.
A face crop becomes 128 numbers; two crops of the same person lie less than 0.6 apart
(Euclidean distance), as dlib trained it and face-api's FaceMatcher uses it.

The network, on a 150x150 face crop (padded to a square around its centre, then resized:
models/face_landmarks.face_input at size 150), channels first:

    (x - MEAN_RGB) / 255                                    [1, 3, 150, 150]
    conv 7x7 3->32 stride 2 "valid", ReLU                   [1, 32, 72, 72]
    max pool 3x3 stride 2 "valid"                           [1, 32, 35, 35]
    3 residual blocks, 32 channels
    down block 32->64, 3 residual blocks                    [1, 64, 17, 17]
    down block 64->128, 2 residual blocks                   [1, 128, 8, 8]
    down block 128->256, 2 residual blocks                  [1, 256, 4, 4]
    down block 256->256                                     [1, 256, 2, 2]
    mean over the map, times fc [256, 128] (no bias)        [1, 128]

Every conv is followed by dlib's affine "scale" layer (a per-channel weight and bias: batch
norm as dlib exports it); both are folded into the conv's kernel and bias at load.
residual(x) = relu(x + conv(relu(conv(x)))), 3x3 "same" convolutions.
down(x) = relu(avg_pool_2x2(x) + conv(relu(conv_3x3_stride2_valid(x)))): the shortcut's
channels are doubled with zeros, and where the strided conv's map comes out one smaller than
the pool's (8 -> 3 against 4, 4 -> 1 against 2) it gets a row and column of zeros below/right.
"""

from __future__ import annotations

import math

import numpy as np

from ..core.errors import InvalidOption
from ..core.tensor import Tensor
from ..nn.ops import avg_pool2d, conv2d_bias_act, max_pool2d
from .face_landmarks import face_tensor

MODEL = "face recognition net"
INPUT_SIZE = 150
DESCRIPTOR_SIZE = 128
# dlib's threshold for its ResNet descriptor ("same person" below it), also face-api's
# FaceMatcher default.
SAME_PERSON_DISTANCE = 0.6
# (name, input channels, output channels, residual blocks): a stage that widens starts with
# a down block (conv32 follows the stem, at the width it gives).
STAGES = (("conv32", 32, 32, 3), ("conv64", 32, 64, 3), ("conv128", 64, 128, 2),
          ("conv256", 128, 256, 2))


class _ScaledConv:
    """A conv + bias followed by dlib's per-channel scale layer, folded: one conv + bias."""

    def __init__(self, weights, prefix: str, c_in: int, c_out: int, size: int = 3):
        kernel = weights.conv_kernel(f"{prefix}/conv/filters", (size, size, c_in, c_out), MODEL)
        bias = weights.get_shaped(f"{prefix}/conv/bias", (c_out,), MODEL)
        scale = weights.get_shaped(f"{prefix}/scale/weights", (c_out,), MODEL)
        shift = weights.get_shaped(f"{prefix}/scale/biases", (c_out,), MODEL)
        # (conv(x) + b) * s + t = conv_with(kernel * s)(x) + (b * s + t), per output channel.
        self.kernel = Tensor.from_numpy(np.ascontiguousarray(kernel * scale[:, None, None, None]))
        self.bias = Tensor.from_numpy((bias * scale + shift).reshape(1, -1, 1, 1))

    def __call__(self, x: Tensor, stride: int = 1, padding: int = 1,
                 activation: str = "none") -> Tensor:
        return conv2d_bias_act(x, self.kernel, self.bias, padding=padding, stride=stride,
                               activation=activation)


class _Residual:
    def __init__(self, weights, prefix: str, c_in: int, c_out: int, down: bool):
        self.down = down
        self.conv1 = _ScaledConv(weights, f"{prefix}/conv1", c_in, c_out)
        self.conv2 = _ScaledConv(weights, f"{prefix}/conv2", c_out, c_out)

    def __call__(self, x: Tensor) -> Tensor:
        if not self.down:
            return (x + self.conv2(self.conv1(x, activation="relu"))).relu()
        out = self.conv2(self.conv1(x, stride=2, padding=0, activation="relu"))
        shortcut = avg_pool2d(x, 2)
        extra_channels = out.dims()[1] - shortcut.dims()[1]
        if extra_channels:
            shortcut = shortcut.pad_with_zeros(1, 0, extra_channels)
        missing_rows = shortcut.dims()[2] - out.dims()[2]
        missing_cols = shortcut.dims()[3] - out.dims()[3]
        if missing_rows or missing_cols:
            out = out.pad_with_zeros(2, 0, missing_rows).pad_with_zeros(3, 0, missing_cols)
        return (shortcut + out).relu()


class FaceRecognitionNet:
    def __init__(self, weights):
        """weights: the TfjsWeights of face_recognition."""
        self.stem = _ScaledConv(weights, "conv32_down", 3, 32, size=7)
        self.blocks = []
        for name, c_in, c_out, repeats in STAGES:
            if c_in != c_out:
                self.blocks.append(_Residual(weights, f"{name}_down", c_in, c_out, down=True))
            self.blocks += [_Residual(weights, f"{name}_{index}", c_out, c_out, down=False)
                            for index in range(1, repeats + 1)]
        self.blocks.append(_Residual(weights, "conv256_down_out", 256, 256, down=True))
        self.fc = Tensor.from_numpy(weights.get_shaped("fc", (256, DESCRIPTOR_SIZE), MODEL))

    @staticmethod
    def load(manifest_path) -> "FaceRecognitionNet":
        """From `face_recognition_model-weights_manifest.json` (its .bin next to it)."""
        from ..io.tfjs import TfjsWeights

        return FaceRecognitionNet(TfjsWeights.load(manifest_path))

    def forward(self, face: np.ndarray) -> np.ndarray:
        """The [128] float32 descriptor of one [150, 150, 3] float crop (RGB, 0..255); [n, 128]
        for [n, 150, 150, 3] crops (a photo's faces together: one call per layer)."""
        x = face_tensor(face, INPUT_SIZE, MODEL)
        x = self.stem(x, stride=2, padding=0, activation="relu")  # [n, 32, 72, 72]
        x = max_pool2d(x, 3, 2)  # [n, 32, 35, 35]
        for block in self.blocks:
            x = block(x)  # ... [n, 256, 2, 2]
        out = x.mean((2, 3)).matmul(self.fc).to_numpy()
        return out[0] if np.ndim(face) == 3 else out


def face_distance(a, b) -> float:
    """The Euclidean distance between two descriptors (face-api's euclideanDistance)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape != (DESCRIPTOR_SIZE,) or b.shape != (DESCRIPTOR_SIZE,):
        raise InvalidOption(f"face distance: descriptors must have {DESCRIPTOR_SIZE} values, got "
                            f"{list(a.shape)} and {list(b.shape)}")
    return math.sqrt(float(np.sum((a - b) ** 2)))


def same_person(a, b, threshold: float = SAME_PERSON_DISTANCE) -> bool:
    return face_distance(a, b) < threshold
