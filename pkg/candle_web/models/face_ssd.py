"""face-api's SSD MobileNet v1 face detector (face-api 1.7.15, `ssd_mobilenetv1_model`, MIT; 5.6
MB of uint8-quantized TensorFlow.js weights): slower than the tiny detector, and finds smaller
and turned faces.

The network, on the padded and resized photo (io/image.square_input at 512), channels first:

    x / 127.5 - 1                                              [1, 3, 512, 512]
    MobileNet v1 (every layer ends in ReLU6, min(max(x, 0), 6)):
      conv_0: 3x3 conv 3->32 stride 2, + offset                [1, 32, 256, 256]
      conv_1..conv_13: 3x3 depthwise conv (stride 2 at 2, 4, 6 and 12), batch norm, ReLU6,
        then 1x1 conv + offset, ReLU6: 64, 128 [128], 128, 256 [64], 256, 512 [32],
        512 x 5 (conv_11 kept), 1024 [16], 1024                [1, 1024, 16, 16]
    extra layers, 1x1 then 3x3 stride 2 convs + offset, ReLU6: 256, 512 [8]; 128, 256 [4];
      128, 256 [2]; 64, 128 [1]
    six box predictors (1x1 convs, + bias) on conv_11 [32x32, 3 anchors a cell], conv_13 [16,
      6], and the extra 512 [8], 256 [4], 256 [2], 128 [1] maps: 4 box offsets and 3 class
      logits per anchor, 5118 anchors in all

The batch norm after each depthwise conv is folded into that conv at load:
w' = w * gamma / sqrt(variance + 0.001), b' = beta - mean * gamma / sqrt(variance + 0.001).
Convolutions pad as TensorFlow's "same" (at stride 2 on an even size: one row/column at the
bottom/right only).

An anchor's score is sigmoid(its second class logit). Its box: the anchors themselves ship with
the weights (`Output/extra_dim`, [ymin, xmin, ymax, xmax] in units of the input); offsets
(ty, tx, th, tw) move the anchor's centre by (ty / 10, tx / 10) anchor heights/widths and scale
its size by (exp(th / 5), exp(tw / 5)). Boxes scoring above min_confidence go through greedy
NMS (IoU above 0.5 drops a box), at most max_results; the kept boxes are clipped to the input.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..core.errors import InvalidOption
from ..core.tensor import Tensor
from ..nn.ops import conv2d_bias_act
from .face_detector import FaceBox, iou

MODEL = "ssd mobilenet v1"
INPUT_SIZE = 512
BATCH_NORM_EPSILON = 0.001
IOU_THRESHOLD = 0.5
ANCHOR_COUNT = 5118
# (output channels, depthwise stride) of MobileNet's conv_1..conv_13.
MOBILENET_LAYERS = ((64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2), (512, 1),
                    (512, 1), (512, 1), (512, 1), (512, 1), (1024, 2), (1024, 1))
KEPT_LAYER = 11  # conv_11's output feeds the first box predictor
# (kernel, output channels, stride) of the extra layers Prediction/Conv2d_0..7.
EXTRA_LAYERS = ((1, 256, 1), (3, 512, 2), (1, 128, 1), (3, 256, 2), (1, 128, 1), (3, 256, 2),
                (1, 64, 1), (3, 128, 2))
# (input channels, anchors per cell) of the six box predictors.
PREDICTORS = ((512, 3), (1024, 6), (512, 6), (256, 6), (256, 6), (128, 6))
CLASSES = 3  # background, face, and an unused third logit


@dataclass(frozen=True)
class SsdOptions:
    """face-api's SsdMobilenetv1Options."""

    min_confidence: float = 0.5
    max_results: int = 100

    def __post_init__(self):
        if not (isinstance(self.min_confidence, (int, float))
                and not isinstance(self.min_confidence, bool)
                and 0.0 < self.min_confidence < 1.0):
            raise InvalidOption(f"ssd min_confidence must be a number between 0 and 1 "
                                f"(exclusive), got {self.min_confidence!r}")
        if not isinstance(self.max_results, int) or isinstance(self.max_results, bool) \
                or self.max_results < 1:
            raise InvalidOption(f"ssd max_results must be a whole number >= 1, got "
                                f"{self.max_results!r}")


def _same_padding(x: Tensor, kernel: int, stride: int) -> Tensor:
    """TensorFlow's "same" padding: the total a k x k window at this stride needs, the odd
    row/column at the bottom/right."""
    for dim in (2, 3):
        size = x.dims()[dim]
        total = max((math.ceil(size / stride) - 1) * stride + kernel - size, 0)
        if total:
            x = x.pad_with_zeros(dim, total // 2, total - total // 2)
    return x


class _Conv:
    """A convolution (k x k, stride) + a per-channel offset, in conv2d's layout."""

    def __init__(self, weights, prefix: str, kernel: int, c_in: int, c_out: int, stride: int,
                 bias_name: str):
        self.kernel, self.stride = kernel, stride
        self.weight = Tensor.from_numpy(weights.conv_kernel(f"{prefix}/weights",
                                                            (kernel, kernel, c_in, c_out), MODEL))
        self.bias = Tensor.from_numpy(weights.channel_bias(f"{prefix}/{bias_name}", c_out, MODEL))

    def __call__(self, x: Tensor, activation: str = "none") -> Tensor:
        return conv2d_bias_act(_same_padding(x, self.kernel, self.stride), self.weight,
                               self.bias, stride=self.stride, activation=activation)


class _DepthwiseBatchNorm:
    """3x3 depthwise conv with its batch norm folded in."""

    def __init__(self, weights, prefix: str, channels: int, stride: int):
        self.stride = stride
        kernel = weights.conv_kernel(f"{prefix}/depthwise_weights", (3, 3, channels, 1), MODEL)
        norm = {name: weights.get_shaped(f"{prefix}/BatchNorm/{name}", (channels,), MODEL)
                .astype(np.float64) for name in ("gamma", "beta", "moving_mean",
                                                 "moving_variance")}
        scale = norm["gamma"] / np.sqrt(norm["moving_variance"] + BATCH_NORM_EPSILON)
        # [1, channels, 3, 3] -> [channels, 1, 3, 3], each channel's filter scaled.
        folded = kernel.transpose(1, 0, 2, 3) * scale[:, None, None, None]
        self.weight = Tensor.from_numpy(folded.astype(np.float32))
        bias = norm["beta"] - norm["moving_mean"] * scale
        self.bias = Tensor.from_numpy(bias.astype(np.float32).reshape(1, -1, 1, 1))

    def __call__(self, x: Tensor, activation: str = "none") -> Tensor:
        return conv2d_bias_act(_same_padding(x, 3, self.stride), self.weight, self.bias,
                               stride=self.stride, groups=self.weight.dims()[0],
                               activation=activation)


class SsdMobilenetV1:
    input_size = INPUT_SIZE

    def __init__(self, weights):
        """weights: the TfjsWeights of ssd_mobilenetv1."""
        self.conv0 = _Conv(weights, "MobilenetV1/Conv2d_0_pointwise", 3, 3, 32, 2,
                           "convolution_bn_offset")
        self.mobilenet = []
        c_in = 32
        for index, (c_out, stride) in enumerate(MOBILENET_LAYERS, start=1):
            depthwise = _DepthwiseBatchNorm(weights, f"MobilenetV1/Conv2d_{index}_depthwise",
                                            c_in, stride)
            pointwise = _Conv(weights, f"MobilenetV1/Conv2d_{index}_pointwise", 1, c_in, c_out,
                              1, "convolution_bn_offset")
            self.mobilenet.append((depthwise, pointwise))
            c_in = c_out
        self.extra = []
        for index, (kernel, c_out, stride) in enumerate(EXTRA_LAYERS):
            self.extra.append(_Conv(weights, f"Prediction/Conv2d_{index}_pointwise", kernel,
                                    c_in, c_out, stride, "convolution_bn_offset"))
            c_in = c_out
        self.predictors = []
        for index, (channels, anchors) in enumerate(PREDICTORS):
            prefix = f"Prediction/BoxPredictor_{index}"
            self.predictors.append((
                _Conv(weights, f"{prefix}/BoxEncodingPredictor", 1, channels, anchors * 4, 1,
                      "biases"),
                _Conv(weights, f"{prefix}/ClassPredictor", 1, channels, anchors * CLASSES, 1,
                      "biases")))
        self.anchors = weights.get_shaped("Output/extra_dim", (1, ANCHOR_COUNT, 4), MODEL)[0]

    @staticmethod
    def load(manifest_path) -> "SsdMobilenetV1":
        """From `ssd_mobilenetv1_model-weights_manifest.json` (its .bin next to it)."""
        from ..io.tfjs import TfjsWeights

        return SsdMobilenetV1(TfjsWeights.load(manifest_path))

    def forward(self, image: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(box offsets [5118, 4], face logits [5118]) for one [512, 512, 3] float image (RGB,
        0..255: io/image.square_input)."""
        if image.shape != (INPUT_SIZE, INPUT_SIZE, 3):
            raise InvalidOption(f"ssd mobilenet v1: expected a [{INPUT_SIZE}, {INPUT_SIZE}, 3] "
                                f"image, got {list(image.shape)}")
        scaled = np.asarray(image, dtype=np.float32) / np.float32(127.5) - np.float32(1)
        x = Tensor.from_numpy(np.ascontiguousarray(scaled.transpose(2, 0, 1)[None]))
        x = self.conv0(x, activation="relu6")  # [1, 32, 256, 256]
        maps = []
        for index, (depthwise, pointwise) in enumerate(self.mobilenet, start=1):
            x = pointwise(depthwise(x, activation="relu6"), activation="relu6")
            if index == KEPT_LAYER:
                maps.append(x)  # [1, 512, 32, 32]
        maps.append(x)  # [1, 1024, 16, 16]
        for index, layer in enumerate(self.extra):
            x = layer(x, activation="relu6")
            if index % 2:
                maps.append(x)  # 512 [8], 256 [4], 256 [2], 128 [1]
        offsets, logits = [], []
        for feature, (box_layer, class_layer) in zip(maps, self.predictors):
            # Cell by cell (row, column), then anchor: TensorFlow's channels-last order.
            offsets.append(box_layer(feature).permute((0, 2, 3, 1)).reshape((-1, 4)))
            logits.append(class_layer(feature).permute((0, 2, 3, 1)).reshape((-1, CLASSES)))
        offsets = Tensor.cat(offsets, 0).to_numpy()
        face_logits = Tensor.cat(logits, 0).to_numpy()[:, 1]
        return offsets, face_logits

    def detect(self, image: np.ndarray, options: SsdOptions = SsdOptions()) -> list:
        """The faces in one [512, 512, 3] image, as FaceBox in the input's units, highest
        score first."""
        offsets, logits = self.forward(image)
        return decode_boxes(self.anchors, offsets, logits, options)


def decode_boxes(anchors: np.ndarray, offsets: np.ndarray, logits: np.ndarray,
                 options: SsdOptions) -> list:
    scores = 1.0 / (1.0 + np.exp(-logits.astype(np.float64)))
    anchors = anchors.astype(np.float64)
    offsets = offsets.astype(np.float64)
    sizes = anchors[:, 2:] - anchors[:, :2]  # (height, width)
    centers = anchors[:, :2] + sizes / 2  # (y, x)
    centers = offsets[:, :2] / 10 * sizes + centers
    halves = np.exp(offsets[:, 2:] / 5) * sizes / 2
    corners = np.concatenate([centers - halves, centers + halves], axis=1)  # y0, x0, y1, x1
    candidates = sorted((index for index in np.nonzero(scores > options.min_confidence)[0]),
                        key=lambda index: -scores[index])
    kept = []
    for index in candidates:
        if len(kept) >= options.max_results:
            break
        box = _corner_box(corners[index], scores[index])
        if all(_overlap(box, other) <= IOU_THRESHOLD for other in kept):
            kept.append(box)
    return [_clipped(box) for box in kept]


def _corner_box(corners, score) -> FaceBox:
    # face-api orders each pair with min/max before the IoU, so a box with a negative size
    # still overlaps as the rectangle it spans.
    y0, x0 = min(corners[0], corners[2]), min(corners[1], corners[3])
    y1, x1 = max(corners[0], corners[2]), max(corners[1], corners[3])
    return FaceBox(float(x0), float(y0), float(x1 - x0), float(y1 - y0), float(score))


def _overlap(a: FaceBox, b: FaceBox) -> float:
    """IoU, 0 when either box is empty (as face-api's SSD suppression counts it)."""
    if a.width * a.height <= 0 or b.width * b.height <= 0:
        return 0.0
    return iou(a, b)


def _clipped(box: FaceBox) -> FaceBox:
    left, top = max(box.x, 0.0), max(box.y, 0.0)
    right, bottom = min(box.x + box.width, 1.0), min(box.y + box.height, 1.0)
    return FaceBox(left, top, right - left, bottom - top, box.score)
