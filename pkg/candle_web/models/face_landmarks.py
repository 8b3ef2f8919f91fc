"""face-api's 68-point face landmark net (face-api 1.7.15, `face_landmark_68_model`, MIT; 357 KB
of uint8-quantized TensorFlow.js weights): where the jaw, brows, nose, eyes and mouth are in a
face crop, the 68 points of the iBUG 300-W scheme. Its expression net (`face_expression_model`,
329 KB) is the same network with other weights and a 7-way fc layer, softmaxed over neutral,
happy, sad, angry, fearful, disgusted and surprised.

The network, on a 112x112 face crop (padded to a square around its centre, then resized:
`face_input`), channels first:

    (x - MEAN_RGB) / 255                                   [1, 3, 112, 112]
    dense0: 3x3 conv 3->32 stride 2, + bias, ReLU = a      [1, 32, 56, 56]
            b = sep(a); c = sep(relu(a + b)); d = sep(relu(a + b + c))
            out = relu(a + b + c + d)
    dense1, dense2, dense3: the same block, its first layer a depthwise-separable conv with
            stride 2: 32->64 [28], 64->128 [14], 128->256 [7]
    7x7 average pool                                       [1, 256]
    fc 256 -> 136, + bias: (x, y) of the 68 points, in units of the crop (0..1)

The tiny landmark net (`face_landmark_68_tiny_model`, 77 KB) is the same with three blocks of
three layers (dense0..dense2: 32, 64, 128 channels; out = relu(a + b + c)), the average taken
over its 14x14 map, and fc 128 -> 136.

sep(x) is a 3x3 depthwise conv, a 1x1 pointwise conv and a bias, no activation. A stride-2
convolution pads as TensorFlow's "same" does on an even size: one row/column of zeros at the
bottom/right only. A stride-1 one pads one all round.
"""

from __future__ import annotations

import numpy as np

from ..core.errors import InvalidOption
from ..core.tensor import Tensor
from ..io.image import resize
from ..nn.ops import conv2d_bias_act

MODEL = "face landmark net"
INPUT_SIZE = 112
MEAN_RGB = (122.782, 117.001, 104.298)
POINTS = 68
EXPRESSIONS = ("neutral", "happy", "sad", "angry", "fearful", "disgusted", "surprised")
# (input, output) channels of the four dense blocks.
BLOCKS = ((3, 32), (32, 64), (64, 128), (128, 256))
LAYERS_PER_BLOCK = 4


def face_tensor(face: np.ndarray, size: int, model: str) -> Tensor:
    """What face-api's face nets read from a [size, size, 3] float crop (RGB, 0..255), or from
    [n, size, size, 3] crops: (x - MEAN_RGB) / 255, channels first, [n, 3, size, size]."""
    face = np.asarray(face)
    crops = face[None] if face.ndim == 3 else face
    if crops.ndim != 4 or crops.shape[1:] != (size, size, 3) or not len(crops):
        raise InvalidOption(f"{model}: expected a [{size}, {size}, 3] crop (or [n, {size}, "
                            f"{size}, 3] crops), got {list(face.shape)}")
    normalized = (crops.astype(np.float32, copy=False) - np.float32(MEAN_RGB)) / np.float32(255)
    return Tensor.from_numpy(np.ascontiguousarray(normalized.transpose(0, 3, 1, 2)))


def _kernel(weights, name: str, shape: tuple) -> Tensor:
    return Tensor.from_numpy(weights.conv_kernel(name, shape, MODEL))


def _bias(weights, name: str, channels: int) -> Tensor:
    return Tensor.from_numpy(weights.channel_bias(name, channels, MODEL))


class _Separable:
    """3x3 depthwise conv, 1x1 pointwise conv, + bias (no activation)."""

    def __init__(self, weights, prefix: str, c_in: int, c_out: int):
        # [1, c_in, 3, 3] -> [c_in, 1, 3, 3]: one 3x3 filter per channel (groups = c_in).
        depthwise = _kernel(weights, f"{prefix}/depthwise_filter", (3, 3, c_in, 1))
        self.depthwise = depthwise.transpose(0, 1).contiguous()
        self.pointwise = _kernel(weights, f"{prefix}/pointwise_filter", (1, 1, c_in, c_out))
        self.bias = _bias(weights, f"{prefix}/bias", c_out)

    def __call__(self, x: Tensor, stride: int = 1, activation: str = "none") -> Tensor:
        groups = self.depthwise.dims()[0]
        if stride == 1:  # "same" is 1 all round: the convolution's own zero padding
            x = conv2d_bias_act(x, self.depthwise, padding=1, groups=groups)
        else:
            x = conv2d_bias_act(_same_padding(x, stride), self.depthwise, stride=stride,
                                groups=groups)
        return conv2d_bias_act(x, self.pointwise, self.bias, activation=activation)


class _DenseBlock:
    def __init__(self, weights, prefix: str, c_in: int, c_out: int, first: bool, layers: int):
        self.first = first
        if first:  # a full 3x3 convolution on the RGB input
            self.conv0 = _kernel(weights, f"{prefix}/conv0/filters", (3, 3, c_in, c_out))
            self.conv0_bias = _bias(weights, f"{prefix}/conv0/bias", c_out)
        else:
            self.conv0 = _Separable(weights, f"{prefix}/conv0", c_in, c_out)
        self.rest = [_Separable(weights, f"{prefix}/conv{index}", c_out, c_out)
                     for index in range(1, layers)]

    def __call__(self, x: Tensor) -> Tensor:
        if self.first:
            total = conv2d_bias_act(_same_padding(x, 2), self.conv0, self.conv0_bias, stride=2,
                                    activation="relu")
        else:
            total = self.conv0(x, stride=2, activation="relu")
        for layer in self.rest:  # each layer reads the ReLU of the sum of all outputs so far
            total = total + layer(total.relu())
        return total.relu()


def _same_padding(x: Tensor, stride: int) -> Tensor:
    """TensorFlow's "same" padding for a 3x3 kernel on an even size: 1 all round at stride 1;
    at stride 2, a single row/column at the bottom/right."""
    if stride == 1:
        return x.pad_with_zeros(2, 1, 1).pad_with_zeros(3, 1, 1)
    return x.pad_with_zeros(2, 0, 1).pad_with_zeros(3, 0, 1)


class _FaceFeatureNet:
    """The dense blocks, the average pool and an fc layer of `outputs` values: the landmark
    net and the expression net differ only in their weights and that layer; the tiny landmark
    net has fewer, smaller blocks."""

    outputs = 0
    model = ""
    blocks = BLOCKS
    layers_per_block = LAYERS_PER_BLOCK

    def __init__(self, weights):
        self.dense_blocks = [_DenseBlock(weights, f"dense{index}", c_in, c_out, index == 0,
                                         self.layers_per_block)
                             for index, (c_in, c_out) in enumerate(self.blocks)]
        self.fc_weights = Tensor.from_numpy(weights.get_shaped(
            "fc/weights", (self.blocks[-1][1], self.outputs), self.model))
        self.fc_bias = Tensor.from_numpy(weights.get_shaped("fc/bias", (self.outputs,),
                                                            self.model))

    @classmethod
    def load(cls, manifest_path):
        """From the model's `*-weights_manifest.json` (its .bin next to it)."""
        from ..io.tfjs import TfjsWeights

        return cls(TfjsWeights.load(manifest_path))

    def features(self, faces: np.ndarray) -> np.ndarray:
        """The fc layer's [n, outputs] for [n, 112, 112, 3] float crops (RGB, 0..255); [outputs]
        for one [112, 112, 3] crop. The crops of a photo's faces go through together: every
        layer is one call for all of them (in the page, Python's cost per layer is most of a
        small net's time)."""
        x = face_tensor(faces, INPUT_SIZE, self.model)
        for block in self.dense_blocks:
            x = block(x)  # ... [n, 256, 7, 7] (the tiny net: [n, 128, 14, 14])
        pooled = x.mean((2, 3))  # [n, channels]: the average pool covers the whole map
        out = pooled.matmul(self.fc_weights).broadcast_add(self.fc_bias).to_numpy()
        return out[0] if np.ndim(faces) == 3 else out


class FaceLandmark68Net(_FaceFeatureNet):
    """weights: the TfjsWeights of face_landmark_68."""

    outputs = 2 * POINTS
    model = MODEL

    def forward(self, face: np.ndarray) -> np.ndarray:
        """[68, 2] (x, y) in units of the crop, for one [112, 112, 3] float crop ([n, 68, 2]
        for [n, 112, 112, 3] crops)."""
        features = self.features(face)
        return features.reshape(features.shape[:-1] + (POINTS, 2))


class FaceLandmark68TinyNet(FaceLandmark68Net):
    """weights: the TfjsWeights of face_landmark_68_tiny: three dense blocks of three layers,
    fc 128 -> 136."""

    model = "tiny face landmark net"
    blocks = BLOCKS[:3]
    layers_per_block = 3


class FaceExpressionNet(_FaceFeatureNet):
    """weights: the TfjsWeights of face_expression: the same trunk, fc 256 -> 7, softmax."""

    outputs = len(EXPRESSIONS)
    model = "face expression net"

    def forward(self, face: np.ndarray):
        """{expression: probability} for one [112, 112, 3] float crop (face-api's labels); a
        list of them for [n, 112, 112, 3] crops."""
        logits = np.atleast_2d(self.features(face)).astype(np.float64)
        probabilities = np.exp(logits - logits.max(axis=1, keepdims=True))
        probabilities /= probabilities.sum(axis=1, keepdims=True)
        answers = [{label: float(value) for label, value in zip(EXPRESSIONS, row)}
                   for row in probabilities]
        return answers[0] if np.ndim(face) == 3 else answers


def face_input(rgb: np.ndarray, box, size: int = INPUT_SIZE) -> tuple[np.ndarray, tuple]:
    """The [size, size, 3] float crop of `box` (x, y, width, height in the photo's pixels;
    size 112 for the landmark, expression and age/gender nets, 150 for the descriptor) and
    (left, top, side): where that crop's square lies in the photo, so that a point (u, v) in
    crop units is at (left + u * side, top + v * side).

    As face-api: the box is cut at the photo's borders, then its corner and size floored; the
    crop is padded with black to a square, centred (the odd pixel goes after), then resized."""
    height, width = rgb.shape[:2]
    x, y, w, h = box
    left, top = max(x, 0.0), max(y, 0.0)
    crop_w = int(np.floor(min(x + w - left, width - left)))
    crop_h = int(np.floor(min(y + h - top, height - top)))
    left, top = int(np.floor(left)), int(np.floor(top))
    if crop_w < 1 or crop_h < 1:
        raise InvalidOption(f"face box {list(box)} lies outside the {width}x{height} photo")
    crop = rgb[top:top + crop_h, left:left + crop_w]
    side = max(crop_h, crop_w)
    # JavaScript's Math.round (halves up), as face-api splits the padding.
    after_y = int(np.floor((side - crop_h) / 2 + 0.5))
    after_x = int(np.floor((side - crop_w) / 2 + 0.5))
    before_y, before_x = side - crop_h - after_y, side - crop_w - after_x
    square = np.zeros((side, side, 3), dtype=np.float32)
    square[before_y:before_y + crop_h, before_x:before_x + crop_w] = crop
    return resize(square, size, size), (left - before_x, top - before_y, side)
