"""face-api's age and gender net (face-api 1.7.15, `age_gender_model`, MIT; 430 KB of
uint8-quantized TensorFlow.js weights): a small Xception on a face crop, with two heads: the age
in years (a regression) and the probability that the face is a man's (softmax over male,
female).

The network, on a 112x112 face crop (models/face_landmarks.face_input), channels first:

    (x - MEAN_RGB) / 255                                     [1, 3, 112, 112]
    conv 3x3 3->32 stride 2, + bias, ReLU                    [1, 32, 56, 56]
    reduction block 32->64 (its input not ReLU'd)            [1, 64, 28, 28]
    reduction block 64->128                                  [1, 128, 14, 14]
    2 main blocks, 128 channels
    reduction block 128->256                                 [1, 256, 7, 7]
    separable conv 256->512, ReLU                            [1, 512, 7, 7]
    7x7 average pool                                         [1, 512]
    age = fc 512 -> 1; gender = softmax(fc 512 -> 2): P(male), P(female)

reduction(x) = maxpool_3x3_stride2(sep(relu(sep(relu(x))))) + conv_1x1_stride2(x) + bias
main(x) = x + sep(relu(sep(relu(sep(relu(x))))))
sep is a 3x3 depthwise conv, a 1x1 pointwise conv and a bias (models/face_landmarks). Strided
convolutions and the max pool pad as TensorFlow's "same" does on an even size: after the image
only (one row/column for 3x3, none for 1x1).
"""

from __future__ import annotations

import numpy as np

from ..core.tensor import Tensor
from ..nn.ops import conv2d_bias_act, max_pool2d
from .face_landmarks import INPUT_SIZE, _same_padding, _Separable, face_tensor

MODEL = "age and gender net"
MAIN_BLOCKS = 2
FEATURES = 512


def _conv(weights, prefix: str, size: int, c_in: int, c_out: int) -> tuple:
    kernel = weights.conv_kernel(f"{prefix}/filters", (size, size, c_in, c_out), MODEL)
    bias = weights.channel_bias(f"{prefix}/bias", c_out, MODEL)
    return Tensor.from_numpy(kernel), Tensor.from_numpy(bias)


class _ReductionBlock:
    def __init__(self, weights, prefix: str, c_in: int, c_out: int, relu_input: bool):
        self.relu_input = relu_input
        self.sep0 = _Separable(weights, f"{prefix}/separable_conv0", c_in, c_out)
        self.sep1 = _Separable(weights, f"{prefix}/separable_conv1", c_out, c_out)
        self.expansion, self.expansion_bias = _conv(weights, f"{prefix}/expansion_conv", 1,
                                                    c_in, c_out)

    def __call__(self, x: Tensor) -> Tensor:
        out = self.sep0(x.relu() if self.relu_input else x, activation="relu")
        out = max_pool2d(self.sep1(out), 3, 2, pad_end=1)
        # A 1x1 kernel at stride 2 reads every other pixel: TensorFlow's "same" adds nothing.
        shortcut = conv2d_bias_act(x, self.expansion, self.expansion_bias, stride=2)
        return out + shortcut


class _MainBlock:
    def __init__(self, weights, prefix: str, channels: int):
        self.layers = [_Separable(weights, f"{prefix}/separable_conv{index}", channels, channels)
                       for index in range(3)]

    def __call__(self, x: Tensor) -> Tensor:
        out = x
        for layer in self.layers:
            out = layer(out.relu())
        return x + out


class AgeGenderNet:
    def __init__(self, weights):
        """weights: the TfjsWeights of age_gender."""
        self.conv_in, self.conv_in_bias = _conv(weights, "entry_flow/conv_in", 3, 3, 32)
        self.entry = [_ReductionBlock(weights, "entry_flow/reduction_block_0", 32, 64, False),
                      _ReductionBlock(weights, "entry_flow/reduction_block_1", 64, 128, True)]
        self.middle = [_MainBlock(weights, f"middle_flow/main_block_{index}", 128)
                       for index in range(MAIN_BLOCKS)]
        self.exit = _ReductionBlock(weights, "exit_flow/reduction_block", 128, 256, True)
        self.exit_sep = _Separable(weights, "exit_flow/separable_conv", 256, FEATURES)
        self.age_weights = Tensor.from_numpy(weights.get_shaped("fc/age/weights", (FEATURES, 1),
                                                                MODEL))
        self.age_bias = Tensor.from_numpy(weights.get_shaped("fc/age/bias", (1,), MODEL))
        self.gender_weights = Tensor.from_numpy(weights.get_shaped("fc/gender/weights",
                                                                   (FEATURES, 2), MODEL))
        self.gender_bias = Tensor.from_numpy(weights.get_shaped("fc/gender/bias", (2,), MODEL))

    @staticmethod
    def load(manifest_path) -> "AgeGenderNet":
        """From `age_gender_model-weights_manifest.json` (its .bin next to it)."""
        from ..io.tfjs import TfjsWeights

        return AgeGenderNet(TfjsWeights.load(manifest_path))

    def forward(self, face: np.ndarray):
        """(age in years, probability of male) for one [112, 112, 3] float crop (RGB, 0..255); a
        list of them for [n, 112, 112, 3] crops (a photo's faces together)."""
        x = face_tensor(face, INPUT_SIZE, MODEL)
        x = conv2d_bias_act(_same_padding(x, 2), self.conv_in, self.conv_in_bias, stride=2,
                            activation="relu")  # [n, 32, 56, 56]
        for block in self.entry + self.middle:
            x = block(x)  # ... [n, 128, 14, 14]
        x = self.exit_sep(self.exit(x), activation="relu")  # [n, 512, 7, 7]
        pooled = x.mean((2, 3))  # the 7x7 average pool covers the whole map
        ages = pooled.matmul(self.age_weights).broadcast_add(self.age_bias).to_numpy()[:, 0]
        logits = pooled.matmul(self.gender_weights).broadcast_add(self.gender_bias)
        logits = logits.to_numpy().astype(np.float64)
        males = 1.0 / (1.0 + np.exp(logits[:, 1] - logits[:, 0]))  # softmax's first of two
        answers = [(float(age), float(male)) for age, male in zip(ages, males)]
        return answers[0] if np.ndim(face) == 3 else answers


def gender_of(male_probability: float) -> tuple[str, float]:
    """face-api's reading: ("male", p) when p > 0.5, else ("female", 1 - p)."""
    if male_probability > 0.5:
        return "male", male_probability
    return "female", 1.0 - male_probability
