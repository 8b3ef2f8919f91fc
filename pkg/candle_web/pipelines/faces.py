"""Photos in, faces out: face-api's networks (models/face_detector.py) on a photo decoded and
resized by the package (io/image.py), with answers in face-api's names and units.

    detector = load_face_detector()                 # registry "face-api", or a local folder
    result = find_faces("group.jpg", detector)
    result.to_json()  # {"file", "width", "height", "faces": [{"box": [x, y, w, h], "score"}]}
    find_faces("group.jpg", detector, landmark_net=load_landmark_net())  # + "landmarks"
    find_faces("group.jpg", detector, landmark_net=..., descriptor_net=load_descriptor_net(),
               age_gender_net=load_age_gender_net())  # + "descriptor", "age", "gender", ...
    compare_faces("a.jpg", "b.jpg", detector, load_landmark_net(), load_descriptor_net())

Boxes are in the photo's own pixels (top-left corner, width, height), as face-api's
`detection.box`. The photo is padded to a square below/right and resized to the detector's
input size (416 for the tiny detector, face-api's TinyFaceDetectorOptions default; 512 for SSD
MobileNet v1), so a box comes back by one scale factor.
Landmarks (68 [x, y] points, face-api's `landmarks.positions`) come from each face's box cut
from the photo, padded to a square around its centre and resized to 112; they are placed back
where that crop lies in the photo (face-api shifts them by the unfloored box corner instead, up
to a pixel away from the crop it read).
The descriptor (128 floats), age/gender and expressions read the face as face-api's chained
calls do, once landmarks are known: age/gender and expressions the box around the 68 points
grown by a fifth of its size (face-api's `alignedRect`), the descriptor dlib's alignment (a
square set by the eyes' and mouth's centres: `descriptor_box`); without landmarks, the
detector's box. Each is cut and padded as for the landmarks and resized to 150 (descriptor) or
112. Two faces are the same person when their descriptors lie less than 0.6 apart
(models/face_recognition.py).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .. import hub
from ..core.errors import InvalidOption, ModelNotFound
from ..io.image import load_rgb, square_input
from ..models.face_age_gender import AgeGenderNet, gender_of
from ..models.face_detector import DetectorOptions, TinyFaceDetector
from ..models.face_landmarks import (FaceExpressionNet, FaceLandmark68Net,
                                     FaceLandmark68TinyNet, face_input)
from ..models.face_recognition import (INPUT_SIZE as DESCRIPTOR_INPUT_SIZE,
                                       SAME_PERSON_DISTANCE, FaceRecognitionNet, face_distance)
from ..models.face_ssd import SsdMobilenetV1, SsdOptions

DEFAULT_FACE_MODELS = "face-api"
DETECTOR_FILES = {"tiny": ("tiny_face_detector_model-weights_manifest.json",
                           "tiny_face_detector_model.bin"),
                  "ssd": ("ssd_mobilenetv1_model-weights_manifest.json",
                          "ssd_mobilenetv1_model.bin")}
DETECTOR_CLASSES = {"tiny": TinyFaceDetector, "ssd": SsdMobilenetV1}
DETECTORS = tuple(DETECTOR_FILES)
LANDMARK_FILES = ("face_landmark_68_model-weights_manifest.json", "face_landmark_68_model.bin")
TINY_LANDMARK_FILES = ("face_landmark_68_tiny_model-weights_manifest.json",
                       "face_landmark_68_tiny_model.bin")
EXPRESSION_FILES = ("face_expression_model-weights_manifest.json", "face_expression_model.bin")
DESCRIPTOR_FILES = ("face_recognition_model-weights_manifest.json", "face_recognition_model.bin")
AGE_GENDER_FILES = ("age_gender_model-weights_manifest.json", "age_gender_model.bin")
# face-api's FaceLandmarks.align(): the points' bounding box grown by this fraction of its
# width and height (half on each side).
ALIGNED_BOX_PADDING = 0.2
FACES_PER_CALL = 8  # face crops per network call (on_crops)
# face-api's dlib alignment for the descriptor: a square of side (mean eye-to-mouth distance) /
# 0.45, placed so the centre of the eyes' and mouth's centres lies at (0.5, 0.43) of it.
DLIB_SCALE, DLIB_CENTRE_X, DLIB_CENTRE_Y = 0.45, 0.5, 0.43


@dataclass
class Face:
    box: tuple  # (x, y, width, height) in the photo's pixels
    score: float
    landmarks: list | None = None  # 68 (x, y) in the photo's pixels, when asked for
    expressions: dict | None = None  # expression -> probability, when asked for
    descriptor: list | None = None  # 128 floats, when asked for
    age: float | None = None  # years, when asked for (with gender and gender_probability)
    gender: str | None = None  # "male" or "female"
    gender_probability: float | None = None

    def to_json(self) -> dict:
        out = {"box": [round(value, 2) for value in self.box], "score": round(self.score, 6)}
        if self.landmarks is not None:
            out["landmarks"] = [[round(x, 2), round(y, 2)] for x, y in self.landmarks]
        if self.expressions is not None:
            out["expressions"] = {name: round(value, 6)
                                  for name, value in self.expressions.items()}
        if self.descriptor is not None:
            # 6 decimals move a distance by < 1e-5 (128 values of about +-0.2).
            out["descriptor"] = [round(value, 6) for value in self.descriptor]
        if self.age is not None:
            out.update(age=round(self.age, 3), gender=self.gender,
                       gender_probability=round(self.gender_probability, 6))
        return out


@dataclass
class PhotoFaces:
    file: str
    width: int
    height: int
    faces: list = field(default_factory=list)

    def to_json(self) -> dict:
        return {"file": self.file, "width": self.width, "height": self.height,
                "faces": [face.to_json() for face in self.faces]}


def _model_file(source, filename: str, progress) -> Path:
    """A file of the face models: from a local folder, or fetched from the registry."""
    if isinstance(source, os.PathLike) or os.sep in str(source) or Path(source).is_dir():
        path = Path(source) / filename
        if not path.is_file():
            raise ModelNotFound(f"faces: {path} not found (a face-api model folder holds "
                                f"{filename})")
        return path
    return hub.fetch(str(source), filename, progress=progress)


def load_face_detector(source=DEFAULT_FACE_MODELS, detector: str = "tiny", progress=None):
    """The face detector `detector` (tiny or ssd) from a registry name (default: face-api) or
    a folder of face-api's model files."""
    if detector not in DETECTOR_FILES:
        raise InvalidOption(f"faces: detector {detector!r} is not one of {', '.join(DETECTORS)}")
    return _load(DETECTOR_CLASSES[detector], DETECTOR_FILES[detector], source, progress)


def detector_options(detector, score_threshold: float = 0.5):
    """The detector's own options with the score a face needs (face-api's scoreThreshold of
    the tiny detector, minConfidence of SSD)."""
    if isinstance(detector, SsdMobilenetV1):
        return SsdOptions(min_confidence=score_threshold)
    return DetectorOptions(score_threshold=score_threshold)


def _load(model_class, files, source, progress):
    manifest, shard = files
    _model_file(source, shard, progress)  # fetched (and verified) next to its manifest
    return model_class.load(_model_file(source, manifest, progress))


def load_landmark_net(source=DEFAULT_FACE_MODELS, progress=None,
                      tiny: bool = False) -> FaceLandmark68Net:
    """face-api's 68-point landmark net (or its tiny one: 77 KB of weights against 357 KB)
    from a registry name or a folder."""
    if tiny:
        return _load(FaceLandmark68TinyNet, TINY_LANDMARK_FILES, source, progress)
    return _load(FaceLandmark68Net, LANDMARK_FILES, source, progress)


def load_expression_net(source=DEFAULT_FACE_MODELS, progress=None) -> FaceExpressionNet:
    """face-api's expression net from a registry name or a folder."""
    return _load(FaceExpressionNet, EXPRESSION_FILES, source, progress)


def load_descriptor_net(source=DEFAULT_FACE_MODELS, progress=None) -> FaceRecognitionNet:
    """face-api's face recognition net (the 128-d descriptor) from a registry name or a
    folder."""
    return _load(FaceRecognitionNet, DESCRIPTOR_FILES, source, progress)


def load_age_gender_net(source=DEFAULT_FACE_MODELS, progress=None) -> AgeGenderNet:
    """face-api's age and gender net from a registry name or a folder."""
    return _load(AgeGenderNet, AGE_GENDER_FILES, source, progress)


def aligned_box(landmarks) -> tuple:
    """The box the descriptor, age/gender and expression nets read when landmarks are known:
    the 68 points' bounding box grown by a fifth of its width and height (face-api's
    alignedRect)."""
    xs = [x for x, _ in landmarks]
    ys = [y for _, y in landmarks]
    width, height = max(xs) - min(xs), max(ys) - min(ys)
    return (min(xs) - width * ALIGNED_BOX_PADDING / 2, min(ys) - height * ALIGNED_BOX_PADDING / 2,
            width * (1 + ALIGNED_BOX_PADDING), height * (1 + ALIGNED_BOX_PADDING))


def descriptor_box(landmarks) -> tuple:
    """The square the descriptor net reads (face-api's `align(null, {useDlibAlignment: true})`,
    the crop dlib's ResNet was trained on): from the centres of the left eye (points 36-41),
    the right eye (42-47) and the mouth (48-67)."""
    def centre(points):
        return (sum(x for x, _ in points) / len(points), sum(y for _, y in points) / len(points))

    eyes_and_mouth = [centre(landmarks[36:42]), centre(landmarks[42:48]), centre(landmarks[48:68])]
    mouth = eyes_and_mouth[2]
    eye_to_mouth = sum(((mouth[0] - x) ** 2 + (mouth[1] - y) ** 2) ** 0.5
                       for x, y in eyes_and_mouth[:2]) / 2
    size = math.floor(eye_to_mouth / DLIB_SCALE)
    middle_x, middle_y = centre(eyes_and_mouth)
    return (math.floor(max(0.0, middle_x - DLIB_CENTRE_X * size)),
            math.floor(max(0.0, middle_y - DLIB_CENTRE_Y * size)), size, size)


def on_crops(forward, crops: list) -> list:
    """`forward` (a face net's) on a photo's face crops, FACES_PER_CALL at a time: one answer
    per crop. Every layer runs once for the crops of a call (in the page, Python's cost per
    layer is most of a small net's time); the chunks bound the memory a crowd would take."""
    answers = []
    for start in range(0, len(crops), FACES_PER_CALL):
        answers.extend(list(forward(np.stack(crops[start:start + FACES_PER_CALL]))))
    return answers


def face_landmarks(net: FaceLandmark68Net, rgb, boxes: list) -> list:
    """The 68 landmarks of the face in each box, as (x, y) in the photo's pixels."""
    cuts = [face_input(rgb, box) for box in boxes]
    return [[(left + u * side, top + v * side) for u, v in points.tolist()]
            for (_, (left, top, side)), points in zip(cuts, on_crops(net.forward,
                                                                     [c for c, _ in cuts]))]


def detect_faces(detector, rgb, options=None, landmark_net: FaceLandmark68Net | None = None,
                 expression_net: FaceExpressionNet | None = None,
                 descriptor_net: FaceRecognitionNet | None = None,
                 age_gender_net: AgeGenderNet | None = None) -> list:
    """The faces in an [h, w, 3] RGB photo, highest score first, boxes in its pixels, with
    what the nets given add. `options`: the detector's own (default: detector_options(
    detector))."""
    tensor, factor = square_input(rgb, detector.input_size)
    side = factor * detector.input_size  # the padded square's side, in the photo's pixels
    options = detector_options(detector) if options is None else options
    faces = [Face((box.x * side, box.y * side, box.width * side, box.height * side), box.score)
             for box in detector.detect(tensor, options)]
    if landmark_net is not None:
        for face, points in zip(faces, face_landmarks(landmark_net, rgb,
                                                      [face.box for face in faces])):
            face.landmarks = points
    aligned = [] if expression_net is None and age_gender_net is None else [
        face_input(rgb, face.box if face.landmarks is None else aligned_box(face.landmarks))[0]
        for face in faces]
    if expression_net is not None:
        for face, expressions in zip(faces, on_crops(expression_net.forward, aligned)):
            face.expressions = expressions
    if descriptor_net is not None:
        crops = [face_input(rgb, face.box if face.landmarks is None
                            else descriptor_box(face.landmarks), DESCRIPTOR_INPUT_SIZE)[0]
                 for face in faces]
        for face, descriptor in zip(faces, on_crops(descriptor_net.forward, crops)):
            face.descriptor = descriptor.tolist()
    if age_gender_net is not None:
        for face, (age, male) in zip(faces, on_crops(age_gender_net.forward, aligned)):
            face.age = age
            face.gender, face.gender_probability = gender_of(male)
    return faces


def find_faces(photo, detector, options=None, landmark_net: FaceLandmark68Net | None = None,
               expression_net: FaceExpressionNet | None = None,
               descriptor_net: FaceRecognitionNet | None = None,
               age_gender_net: AgeGenderNet | None = None) -> PhotoFaces:
    """Decode one photo (path or bytes) and find its faces (with their landmarks,
    expressions, descriptors, age and gender when given those nets)."""
    rgb = load_rgb(photo)
    name = "<bytes>" if isinstance(photo, (bytes, bytearray, memoryview)) else os.fspath(photo)
    return PhotoFaces(name, int(rgb.shape[1]), int(rgb.shape[0]),
                      detect_faces(detector, rgb, options, landmark_net, expression_net,
                                   descriptor_net, age_gender_net))


def compare_faces(photo_a, photo_b, detector, landmark_net: FaceLandmark68Net,
                  descriptor_net: FaceRecognitionNet, options=None) -> dict:
    """Whether the best-scoring face of each photo is the same person (face-api's
    detectSingleFace + descriptor + euclideanDistance): {"a", "b", "distance", "same_person",
    "threshold"}."""
    found = []
    for photo in (photo_a, photo_b):
        result = find_faces(photo, detector, options, landmark_net,
                            descriptor_net=descriptor_net)
        if not result.faces:
            raise InvalidOption(f"faces --compare: no face found in {result.file}")
        found.append(result)
    distance = face_distance(found[0].faces[0].descriptor, found[1].faces[0].descriptor)
    return {"a": found[0].file, "b": found[1].file, "distance": round(distance, 6),
            "same_person": distance < SAME_PERSON_DISTANCE, "threshold": SAME_PERSON_DISTANCE}
