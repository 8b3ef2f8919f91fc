"""face-api's tiny face detector: a Tiny-YOLOv2-style network on depthwise-separable convolutions
that finds faces in a 416x416 photo (face-api 1.7.15, `tiny_face_detector_model`, MIT; 193 KB
of uint8-quantized TensorFlow.js weights).

The network, on the padded and resized photo (io/image.square_input), channels first:

    (x - MEAN_RGB) / 255                                      [1, 3, 416, 416]
    conv0: 3x3 conv 3->16, no padding, + bias, leaky ReLU     [1, 16, 414, 414]
    max pool 2x2 stride 2                                     [1, 16, 207, 207]
    conv1..conv5: pad 1, 3x3 depthwise, 1x1 pointwise, + bias, leaky ReLU, each followed by a
      max pool 2x2, stride 2 after conv1..conv4 and stride 1 after conv5:
      16->32 [104], 32->64 [52], 64->128 [26], 128->256 [13], 256->512 [13]
    conv8: 1x1 conv 512->25, + bias                           [1, 25, 13, 13]

Leaky ReLU has slope 0.1. A max pool whose window runs past the edge ("same" padding in
TensorFlow: one extra row/column at the bottom/right when the size is odd, or always with
stride 1) takes the max of the pixels inside. There is no batch norm to fold: the exported
weights already carry it in each bias.

The 25 outputs of a cell are 5 anchors x (tx, ty, tw, th, confidence). A face's score is
sigmoid(confidence); its box, in units of the square input (0..1), is centred at
((col + sigmoid(tx)) / 13, (row + sigmoid(ty)) / 13), with width exp(tw) * anchor_w / 13 and
height exp(th) * anchor_h / 13. Boxes above the score threshold go through greedy non-maximum
suppression (highest score first; a box overlapping a kept one by IoU > 0.4 is dropped).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..core.errors import InvalidOption
from ..core.tensor import Tensor
from ..nn.ops import conv2d_bias_act, max_pool2d

MODEL = "tiny face detector"
INPUT_SIZE = 416
GRID = 13  # INPUT_SIZE / 32
MEAN_RGB = (117.001, 114.697, 97.404)
LEAKY_SLOPE = 0.1
IOU_THRESHOLD = 0.4
# (width, height) of the five anchor boxes, in grid cells.
ANCHORS = ((1.603231, 2.094468), (6.041143, 7.080126), (2.882459, 3.518061),
           (4.266906, 5.178857), (9.041765, 10.66308))
BOX_FIELDS = 5  # tx, ty, tw, th, confidence
SEPARABLE_CHANNELS = ((16, 32), (32, 64), (64, 128), (128, 256), (256, 512))
POOL_STRIDES = (2, 2, 2, 2, 1)  # the max pool after conv1..conv5


@dataclass(frozen=True)
class FaceBox:
    """One face: its box in the square input's units (0..1: x, y of the top-left corner, then
    width and height) and its score."""

    x: float
    y: float
    width: float
    height: float
    score: float


@dataclass(frozen=True)
class DetectorOptions:
    """face-api's TinyFaceDetectorOptions: the score a box needs to count as a face."""

    score_threshold: float = 0.5

    def __post_init__(self):
        if not (isinstance(self.score_threshold, (int, float))
                and not isinstance(self.score_threshold, bool)
                and 0.0 < self.score_threshold < 1.0):
            raise InvalidOption(f"face detector score_threshold must be a number between 0 and "
                                f"1 (exclusive), got {self.score_threshold!r}")


def _kernel(weights, name: str, shape: tuple) -> Tensor:
    return Tensor.from_numpy(weights.conv_kernel(name, shape, MODEL))


def _bias(weights, name: str, channels: int) -> Tensor:
    return Tensor.from_numpy(weights.channel_bias(name, channels, MODEL))


class TinyFaceDetector:
    input_size = INPUT_SIZE

    def __init__(self, weights):
        """weights: the TfjsWeights of tiny_face_detector."""
        outputs = len(ANCHORS) * BOX_FIELDS
        self.conv0 = _kernel(weights, "conv0/filters", (3, 3, 3, 16))
        self.conv0_bias = _bias(weights, "conv0/bias", 16)
        self.separable = []
        for index, (c_in, c_out) in enumerate(SEPARABLE_CHANNELS, start=1):
            # [1, c_in, 3, 3] -> [c_in, 1, 3, 3]: one 3x3 filter per channel (groups = c_in).
            depthwise = _kernel(weights, f"conv{index}/depthwise_filter", (3, 3, c_in, 1))
            pointwise = _kernel(weights, f"conv{index}/pointwise_filter", (1, 1, c_in, c_out))
            bias = _bias(weights, f"conv{index}/bias", c_out)
            self.separable.append((depthwise.transpose(0, 1).contiguous(), pointwise, bias))
        self.conv8 = _kernel(weights, "conv8/filters", (1, 1, 512, outputs))
        self.conv8_bias = _bias(weights, "conv8/bias", outputs)

    @staticmethod
    def load(manifest_path) -> "TinyFaceDetector":
        """From `tiny_face_detector_model-weights_manifest.json` (its .bin next to it)."""
        from ..io.tfjs import TfjsWeights

        return TinyFaceDetector(TfjsWeights.load(manifest_path))

    def forward(self, image: np.ndarray) -> np.ndarray:
        """[13, 13, 5, 5] raw outputs (row, column, anchor, field) for one [416, 416, 3] float
        image (RGB, 0..255: io/image.square_input)."""
        if image.shape != (INPUT_SIZE, INPUT_SIZE, 3):
            raise InvalidOption(f"tiny face detector: expected a [{INPUT_SIZE}, {INPUT_SIZE}, 3] "
                                f"image, got {list(image.shape)}")
        normalized = (np.asarray(image, dtype=np.float32) - np.float32(MEAN_RGB)) / np.float32(255)
        x = Tensor.from_numpy(np.ascontiguousarray(normalized.transpose(2, 0, 1)[None]))
        x = conv2d_bias_act(x, self.conv0, self.conv0_bias, activation="leaky",
                            slope=LEAKY_SLOPE)  # [1, 16, 414, 414]
        x = _max_pool_2x2(x, stride=2)  # [1, 16, 207, 207]
        for (depthwise, pointwise, bias), stride in zip(self.separable, POOL_STRIDES):
            x = conv2d_bias_act(x, depthwise, padding=1, groups=depthwise.dims()[0])
            x = conv2d_bias_act(x, pointwise, bias, activation="leaky", slope=LEAKY_SLOPE)
            x = _max_pool_2x2(x, stride=stride)
        x = conv2d_bias_act(x, self.conv8, self.conv8_bias)  # [1, 25, 13, 13]
        return x.to_numpy()[0].transpose(1, 2, 0).reshape(GRID, GRID, len(ANCHORS), BOX_FIELDS)

    def detect(self, image: np.ndarray, options: DetectorOptions = DetectorOptions()) -> list:
        """The faces in one [416, 416, 3] image, as FaceBox in the square input's units, highest
        score first."""
        return decode_boxes(self.forward(image), options.score_threshold)


def _max_pool_2x2(x: Tensor, stride: int) -> Tensor:
    """2x2 max pooling with TensorFlow's "same" padding on a square map: one row and column
    after the image when the size is odd at stride 2, and always at stride 1."""
    return max_pool2d(x, 2, stride, pad_end=1 if stride == 1 else x.dims()[2] % 2)


def _sigmoid(value):
    return 1.0 / (1.0 + np.exp(-value))


def decode_boxes(raw: np.ndarray, score_threshold: float) -> list:
    """FaceBoxes from the [13, 13, 5, 5] outputs: score above the threshold, then NMS."""
    scores = _sigmoid(raw[..., 4].astype(np.float64))
    rows, cols, anchors = np.nonzero(scores > score_threshold)
    boxes = []
    for row, col, anchor in zip(rows, cols, anchors):
        tx, ty, tw, th, _ = raw[row, col, anchor].astype(np.float64)
        anchor_w, anchor_h = ANCHORS[anchor]
        width = math.exp(tw) * anchor_w / GRID
        height = math.exp(th) * anchor_h / GRID
        center_x = (col + _sigmoid(tx)) / GRID
        center_y = (row + _sigmoid(ty)) / GRID
        boxes.append(FaceBox(float(center_x - width / 2), float(center_y - height / 2),
                             width, height, float(scores[row, col, anchor])))
    return non_max_suppression(boxes, IOU_THRESHOLD)


def iou(a: FaceBox, b: FaceBox) -> float:
    overlap_w = max(0.0, min(a.x + a.width, b.x + b.width) - max(a.x, b.x))
    overlap_h = max(0.0, min(a.y + a.height, b.y + b.height) - max(a.y, b.y))
    overlap = overlap_w * overlap_h
    return overlap / (a.width * a.height + b.width * b.height - overlap)


def non_max_suppression(boxes: list, iou_threshold: float) -> list:
    """Greedy: keep the best remaining box, drop those overlapping it by more than the
    threshold, repeat. (Ties keep the later box first, as face-api's stable ascending sort
    popped from the end does.)"""
    remaining = sorted(range(len(boxes)), key=lambda index: boxes[index].score)
    kept = []
    while remaining:
        best = boxes[remaining.pop()]
        kept.append(best)
        remaining = [index for index in remaining if iou(best, boxes[index]) <= iou_threshold]
    return kept
