"""The Faces view's session: face-api's networks (the registry's `face-api` files, from its npm
tarball) on a photo or a camera frame the page decoded.

Pixels arrive like audio does: the worker decodes the photo (createImageBitmap, then an
OffscreenCanvas's RGBA bytes, web/worker.js), `allocate_pixels` hands it a [height, width, 4]
uint8 array to copy them into, and `compute` reads it in place. From there on everything is the
package's, the same code as `candle-web faces`: io/image's numpy resize, the tiny detector, the
68-point landmarks, expressions and age/gender (pipelines/faces, models/face_*).

Of the registry entry's seven networks the page fetches the five it runs (7.8 MB of the
13.5 MB, 6.4 MB of it the descriptor): SSD and the tiny landmarks stay native-only for now.
"""
from __future__ import annotations

import hashlib
import time

import numpy as np

from candle_web.core.errors import FormatError, InvalidOption
from candle_web.worker.session import Profiler, Session, python_value

DETECTOR = ("tiny_face_detector_model-weights_manifest.json", "tiny_face_detector_model.bin")
LANDMARKS = ("face_landmark_68_model-weights_manifest.json", "face_landmark_68_model.bin")
EXPRESSIONS = ("face_expression_model-weights_manifest.json", "face_expression_model.bin")
AGE_GENDER = ("age_gender_model-weights_manifest.json", "age_gender_model.bin")
DESCRIPTOR = ("face_recognition_model-weights_manifest.json", "face_recognition_model.bin")
NETWORKS = {"detector": DETECTOR, "landmarks": LANDMARKS, "expressions": EXPRESSIONS,
            "ageGender": AGE_GENDER, "descriptor": DESCRIPTOR}
# The same bound as io/image.load_rgb's: a frame larger than any phone photo is refused before
# its bytes are copied into the heap.
MAX_PIXELS = 64_000_000
# The page's options: which heads to run on each face (the detector always runs).
HEADS = ("landmarks", "expressions", "ageGender", "descriptor")


class FaceSession(Session):
    kind = "faces"
    command = "faces"
    required_files = tuple(name for files in NETWORKS.values() for name in files)
    memory_factor = 4.0  # decoded float32 weights from uint8-quantized files

    def _registry_manifest(self, model: str) -> dict:
        """The registry entry's files that the page runs (see the module doc)."""
        manifest = super()._registry_manifest(model)
        manifest["files"] = [f for f in manifest["files"] if f["name"] in self.required_files]
        return manifest

    def build(self, files: dict) -> dict:
        from candle_web.io.tfjs import TfjsWeights
        from candle_web.models.face_age_gender import AgeGenderNet
        from candle_web.models.face_detector import TinyFaceDetector
        from candle_web.models.face_landmarks import FaceExpressionNet, FaceLandmark68Net
        from candle_web.models.face_recognition import FaceRecognitionNet

        def weights(network):
            manifest, shard = NETWORKS[network]
            return TfjsWeights(bytes(files[manifest]), {shard: files[shard]}, manifest)

        return {"detector": TinyFaceDetector(weights("detector")),
                "landmarks": FaceLandmark68Net(weights("landmarks")),
                "expressions": FaceExpressionNet(weights("expressions")),
                "ageGender": AgeGenderNet(weights("ageGender")),
                "descriptor": FaceRecognitionNet(weights("descriptor"))}

    def describe(self, nets) -> dict:
        return {"detector": "tiny", "inputSize": nets["detector"].input_size,
                "networks": list(nets)}

    @staticmethod
    def allocate_pixels(width, height) -> np.ndarray:
        """A [height, width, 4] uint8 buffer (RGBA, as a canvas gives them) for the worker."""
        for name, value in (("width", width), ("height", height)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or value != int(value) or not 0 < int(value) <= MAX_PIXELS:
                raise FormatError(f"faces: image {name} {value!r} is not a positive pixel count")
        if int(width) * int(height) > MAX_PIXELS:
            raise FormatError(f"faces: a {int(width)}x{int(height)} image is more than the "
                              f"{MAX_PIXELS} pixels a photo may have")
        return np.empty((int(height), int(width), 4), dtype=np.uint8)

    def compute(self, nets, pixels=None, options=None, keep_pixels=False, profile=False,
                on_event=None) -> dict:
        """{width, height, faces: [...] in face-api's names, the photo's pixels, timings (ms
        per stage)}; with keep_pixels also "pixels", the RGB bytes the networks read, and their
        "rgbSha256" (the twin check runs native on them; hashing a 1920x1280 photo took 24 ms
        in the page, so only then); with profile, "profile": the functions with the most own
        time (the run under cProfile, slower)."""
        profiler = Profiler(profile)
        with profiler:
            result = self._faces(nets, pixels, options)
        rgb = result.pop("rgb")
        if keep_pixels is True:
            rgb = result["pixels"] = np.ascontiguousarray(rgb)
            result["rgbSha256"] = hashlib.sha256(rgb.tobytes()).hexdigest()
        if profile:
            result["profile"] = profiler.report()
        return result

    @staticmethod
    def _faces(nets, pixels, options) -> dict:
        from candle_web.io.image import square_input
        from candle_web.models.face_age_gender import gender_of
        from candle_web.models.face_detector import DetectorOptions
        from candle_web.models.face_landmarks import face_input
        from candle_web.models.face_recognition import INPUT_SIZE as DESCRIPTOR_INPUT_SIZE
        from candle_web.pipelines.faces import (aligned_box, descriptor_box, face_landmarks,
                                                on_crops)

        if not isinstance(pixels, np.ndarray) or pixels.ndim != 3 or pixels.shape[2] not in (3, 4):
            raise FormatError("faces: `pixels` must be an [height, width, 3 or 4] uint8 image")
        heads, threshold = checked_options(options)
        # The page's RGBA frame as it lies: the networks read its first three channels through
        # a view (a contiguous RGB copy of a 1920x1280 photo cost the page ~10 ms), and the
        # resize reads every channel, dropping alpha from its small result.
        rgb = pixels[:, :, :3]
        timings = {}
        # pipelines.faces.detect_faces's steps, timed apart: the resize, then the network.
        started = time.perf_counter()
        detector = nets["detector"]
        tensor, factor = square_input(pixels, detector.input_size)
        tensor = np.ascontiguousarray(tensor[:, :, :3])
        side = factor * detector.input_size  # the padded square's side, in the photo's pixels
        timings["resize"] = (time.perf_counter() - started) * 1000.0
        started = time.perf_counter()
        found = detector.detect(tensor, DetectorOptions(score_threshold=threshold))
        timings["detect"] = (time.perf_counter() - started) * 1000.0
        out = [{"box": [box.x * side, box.y * side, box.width * side, box.height * side],
                "score": float(box.score)} for box in found]
        for head in heads:
            started = time.perf_counter()
            if head == "landmarks":
                for entry, points in zip(out, face_landmarks(nets[head], rgb,
                                                             [entry["box"] for entry in out])):
                    entry["landmarks"] = [[float(x), float(y)] for x, y in points]
            elif head == "descriptor":
                # As pipelines.faces: dlib's alignment when the landmarks were found.
                crops = [face_input(rgb, face_box(entry, descriptor_box),
                                    DESCRIPTOR_INPUT_SIZE)[0] for entry in out]
                for entry, descriptor in zip(out, on_crops(nets[head].forward, crops)):
                    entry["descriptor"] = [float(v) for v in descriptor]
            else:
                # The box the landmarks align when they were found (face-api's alignedRect).
                crops = [face_input(rgb, face_box(entry, aligned_box))[0] for entry in out]
                for entry, answer in zip(out, on_crops(nets[head].forward, crops)):
                    if head == "expressions":
                        entry["expressions"] = answer
                    else:
                        gender, probability = gender_of(answer[1])
                        entry.update(age=answer[0], gender=gender,
                                     genderProbability=probability)
            timings[head] = (time.perf_counter() - started) * 1000.0
        timings["total"] = sum(timings.values())
        return {"width": int(rgb.shape[1]), "height": int(rgb.shape[0]), "faces": out,
                "timingsMs": timings, "rgb": rgb}


def face_box(entry: dict, align) -> list:
    """The box a head reads: align(landmarks) when the landmarks were found, else the
    detector's box."""
    return align(entry["landmarks"]) if "landmarks" in entry else entry["box"]


def checked_options(options) -> tuple[list, float]:
    """The heads asked for, in HEADS order, and the detector's score threshold."""
    options = dict(python_value(options) or {})
    unknown = sorted(set(options) - set(HEADS) - {"scoreThreshold"})
    if unknown:
        raise InvalidOption(f"faces: unknown option(s) {', '.join(unknown)}; known: "
                            f"{', '.join(HEADS)}, scoreThreshold")
    for head in HEADS:
        if not isinstance(options.get(head, False), bool):
            raise InvalidOption(f"faces: option {head} must be true or false, got "
                                f"{options[head]!r}")
    threshold = options.get("scoreThreshold", 0.5)
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) \
            or not 0.0 < threshold < 1.0:
        raise InvalidOption(f"faces: option scoreThreshold must be a number between 0 and 1, "
                            f"got {threshold!r}")
    return [head for head in HEADS if options.get(head)], float(threshold)
