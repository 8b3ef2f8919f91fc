"""The face descriptor (models/face_recognition.py), the age/gender net
(models/face_age_gender.py) and the tiny 68-point landmark net (models/face_landmarks.py)
against face-api itself, in headless Chromium (one browser for the module), on the same face
crops.

The crops are the faces the tiny detector finds in face-api's six demo photos (20 faces), cut
by models/face_landmarks.face_input: 150x150 for the descriptor, 112x112 for the others. Each
crop is one float32 tensor handed to both sides; face-api (TensorFlow.js 4.22 on its wasm
backend) neither pads nor resizes a square tensor at its net's input size, so the comparison is
of the networks alone. (face-api's own pipeline cuts the face from a canvas and resizes it with
the browser's resampling, 8-bit pixels: a different tensor.)
"""

from __future__ import annotations

import base64

import numpy as np
import pytest

from candle_web.io.image import load_rgb, resize
from candle_web.models.face_landmarks import face_input
from tests.models.face_api_peer_testlib import FACE_API_DIST, FaceApiPeer

PHOTOS = [f"sample{index}.jpg" for index in range(1, 7)]
FILES = ("tiny_face_detector_model", "face_recognition_model", "age_gender_model",
         "face_landmark_68_tiny_model", "face_landmark_68_model")
# The same float32 networks on the same crops; the two sides differ only in summation order
# (im2col + GEMM here, XNNPACK there). Measured on the 20 faces: descriptors within 3.9e-7 of
# each other per value (cosine 1 - 1e-7), ages within 1e-4 years, P(male) within 1e-6. The
# bounds leave >= 100x of room for that rounding and are far tighter than the (cosine
# >= 0.999, age within 0.5 years).
MIN_COSINE = 0.99999
MAX_DESCRIPTOR_DISTANCE = 1e-4
MAX_AGE_YEARS = 0.01
MAX_PROBABILITY_DIFFERENCE = 1e-4
# As for the 68-point net (tests/models/test_face_detector.py): measured within 2e-5 px at 112
# on the 20 crops; 1e-3 px is 1000x tighter than the 1 px.
MAX_LANDMARK_PX = 1e-3


def _on_crop_js(call: str, answer: str) -> str:
    """A page function taking a crop as _as_data sends it: `found` = await faceapi.nets.<call>
    on the crop's tensor, then it returns `answer`."""
    return ("""async ([data, shape]) => {
        const bytes = Uint8Array.from(atob(data), (c) => c.charCodeAt(0));
        const tensor = faceapi.tf.tensor3d(new Float32Array(bytes.buffer), shape, 'float32');
        const found = await faceapi.nets.""" + call + """;
        tensor.dispose();
        return """ + answer + """;
    }""")


DESCRIBE_JS = _on_crop_js("faceRecognitionNet.computeFaceDescriptor(tensor)", "Array.from(found)")
AGE_GENDER_JS = _on_crop_js("ageGenderNet.predictAgeAndGender(tensor)",
                            "[found.age, found.gender, found.genderProbability]")
TINY_LANDMARKS_JS = _on_crop_js("faceLandmark68TinyNet.detectLandmarks(tensor)",
                                "found.relativePositions.map((p) => [p.x, p.y])")

# face-api's own chain on the photo itself: its canvas resize for the detector, landmarks, the
# aligned faces (dlib's square for the descriptor) cut from the image and resized on a canvas.
OWN_CHAIN_JS = """async (name) => {
    const image = new Image();
    image.src = '/photos/' + name;
    await image.decode();
    const options = new faceapi.TinyFaceDetectorOptions({ inputSize: 416, scoreThreshold: 0.5 });
    const found = await faceapi.detectAllFaces(image, options).withFaceLandmarks()
        .withFaceDescriptors().withAgeAndGender();
    return found.map((f) => [[f.detection.box.x, f.detection.box.y, f.detection.box.width,
                              f.detection.box.height], Array.from(f.descriptor), f.age]);
}"""


def _as_data(crop: np.ndarray) -> list:
    data = base64.b64encode(np.ascontiguousarray(crop, dtype="<f4").tobytes()).decode()
    return [data, list(crop.shape)]


@pytest.fixture(scope="module")
def weights_dir(model_file):
    for name in FILES:
        model_file("face-api", f"{name}.bin")
    return model_file("face-api", f"{FILES[0]}-weights_manifest.json").parent


@pytest.fixture(scope="module")
def peer(weights_dir, model_file):
    if not (FACE_API_DIST / "face-api.esm.js").is_file():
        pytest.skip("node_modules/@vladmandic/face-api is not installed: run `make test` "
                    "(npm ci)")
    face_api = FaceApiPeer(weights_dir, "wasm", model_file("face-api-demo-photos",
                                                           PHOTOS[0]).parent)
    face_api.page.evaluate("""async () => {
        await faceapi.nets.faceRecognitionNet.loadFromUri('/model');
        await faceapi.nets.ageGenderNet.loadFromUri('/model');
        await faceapi.nets.faceLandmark68TinyNet.loadFromUri('/model');
    }""")
    yield face_api
    assert not face_api.errors, face_api.errors
    assert not face_api.blocked, face_api.blocked
    face_api.close()


@pytest.fixture(scope="module")
def nets(weights_dir):
    from candle_web.models.face_age_gender import AgeGenderNet
    from candle_web.models.face_recognition import FaceRecognitionNet
    from candle_web.pipelines.faces import load_face_detector

    return (load_face_detector(weights_dir),
            FaceRecognitionNet.load(weights_dir / f"{FILES[1]}-weights_manifest.json"),
            AgeGenderNet.load(weights_dir / f"{FILES[2]}-weights_manifest.json"))


@pytest.fixture(scope="module")
def faces(nets, model_file):
    """photo -> [(rgb, box)] for every face the tiny detector finds."""
    from candle_web.pipelines.faces import detect_faces

    found = {}
    for photo in PHOTOS:
        rgb = load_rgb(model_file("face-api-demo-photos", photo))
        found[photo] = [(rgb, face.box) for face in detect_faces(nets[0], rgb)]
        assert found[photo], f"no face found in {photo}: the comparison would be empty"
    return found


@pytest.fixture(scope="module")
def descriptors(nets, faces, peer):
    """photo -> [(ours, face-api's)] descriptors of its faces, on the same 150x150 crops."""
    out = {}
    for photo, photo_faces in faces.items():
        out[photo] = []
        for rgb, box in photo_faces:
            crop, _ = face_input(rgb, box, 150)
            theirs = np.array(peer.page.evaluate(DESCRIBE_JS, _as_data(crop)))
            out[photo].append((nets[1].forward(crop), theirs))
    return out


@pytest.mark.parametrize("photo", PHOTOS)
def test_descriptors_match_face_api_on_the_same_crop(descriptors, photo):
    from candle_web.models.face_recognition import face_distance

    for ours, theirs in descriptors[photo]:
        assert ours.shape == theirs.shape == (128,)
        cosine = float(ours @ theirs / np.linalg.norm(ours) / np.linalg.norm(theirs))
        assert cosine >= MIN_COSINE, photo
        assert face_distance(ours, theirs) <= MAX_DESCRIPTOR_DISTANCE, photo


def test_same_and_different_people_as_face_api_decides(descriptors):
    """Every pair of the 20 faces is 'the same person' (distance < 0.6) for us exactly when it
    is for face-api, where face-api's distance is not within rounding of the threshold."""
    from candle_web.models.face_recognition import SAME_PERSON_DISTANCE, face_distance, same_person

    pairs = [pair for photo in PHOTOS for pair in descriptors[photo]]
    decided = 0
    for i, (ours_a, theirs_a) in enumerate(pairs):
        for ours_b, theirs_b in pairs[i + 1:]:
            theirs = face_distance(theirs_a, theirs_b)
            if abs(theirs - SAME_PERSON_DISTANCE) > MAX_DESCRIPTOR_DISTANCE:
                assert same_person(ours_a, ours_b) == (theirs < SAME_PERSON_DISTANCE)
                decided += 1
    assert decided >= len(pairs) * (len(pairs) - 1) // 2 - 1


# A face and its mirror image, or the photo at half its size, are the same person: measured on
# the 20 faces, 0.20-0.46 for the mirror (the descriptor is not mirror-symmetric) and 0.03-0.10
# for the half-size photo, against 0.45-0.86 between the different people of the photos.
def test_a_mirrored_or_rescaled_face_is_the_same_person(nets, faces):
    from candle_web.models.face_recognition import face_distance, same_person

    detector, net, _ = nets
    for photo in ("sample1.jpg",):  # 3 faces (the whole photo is resized: ~2 s a photo)
        for rgb, (x, y, w, h) in faces[photo]:
            own = net.forward(face_input(rgb, (x, y, w, h), 150)[0])
            mirrored = rgb[:, ::-1]
            mirrored_box = (rgb.shape[1] - x - w, y, w, h)
            other = net.forward(face_input(mirrored, mirrored_box, 150)[0])
            assert same_person(own, other), (photo, face_distance(own, other))
            half = resize(rgb.astype(np.float32), rgb.shape[0] // 2, rgb.shape[1] // 2)
            other = net.forward(face_input(half, (x / 2, y / 2, w / 2, h / 2), 150)[0])
            assert same_person(own, other), (photo, face_distance(own, other))


@pytest.mark.parametrize("photo", PHOTOS)
def test_age_and_gender_match_face_api_on_the_same_crop(nets, faces, peer, photo):
    from candle_web.models.face_age_gender import gender_of

    for rgb, box in faces[photo]:
        crop, _ = face_input(rgb, box)
        age, male = nets[2].forward(crop)
        their_age, their_gender, their_probability = peer.page.evaluate(AGE_GENDER_JS,
                                                                         _as_data(crop))
        gender, probability = gender_of(male)
        assert gender == their_gender, (photo, box)
        assert abs(probability - their_probability) <= MAX_PROBABILITY_DIFFERENCE
        assert abs(age - their_age) <= MAX_AGE_YEARS, (photo, box)
        assert 1 < age < 100


@pytest.mark.parametrize("photo", PHOTOS)
def test_tiny_landmarks_match_face_api_on_the_same_crop(weights_dir, faces, peer, photo):
    from candle_web.models.face_landmarks import INPUT_SIZE, FaceLandmark68TinyNet

    net = FaceLandmark68TinyNet.load(weights_dir / f"{FILES[3]}-weights_manifest.json")
    for rgb, box in faces[photo]:
        crop, _ = face_input(rgb, box)
        ours = net.forward(crop)
        theirs = np.array(peer.page.evaluate(TINY_LANDMARKS_JS, _as_data(crop)))
        assert ours.shape == theirs.shape == (68, 2)
        assert np.abs(ours - theirs).max() * INPUT_SIZE <= MAX_LANDMARK_PX, (photo, box)


# With face-api's own preprocessing (the browser's canvas resampling to 8-bit pixels, where we
# resample floats) the tensors differ, so the answers move, but the faces and people stay:
# measured on the six photos, IoU 0.88-0.99, our descriptor 0.04-0.15 from face-api's for the
# same face (0.41 for one whose landmarks moved most; the same person: < 0.6), ages 0.1-4.6
# years apart (the issue saw ~6 moving the input alone). Between the 190 pairs of different
# faces, our distance and face-api's fall on the same side of 0.6 for 185 (mean 0.74 and
# 0.73). Two photos here (8 faces), to keep the module short.
MIN_IOU_OWN_PREPROCESSING = 0.85
MAX_AGE_YEARS_OWN_PREPROCESSING = 6


OWN_CHAIN_PHOTOS = ("sample1.jpg", "sample6.jpg")
# Different people whose distance face-api puts this far from 0.6 are on the same side for us
# (the one pair that is not, of 190, lies 0.083 below for face-api and 0.08 above for us).
DECIDED_MARGIN = 0.1


@pytest.fixture(scope="module")
def own_chain(nets, peer, weights_dir, model_file):
    """photo -> [(our Face, face-api's (box, descriptor, age))], matched by IoU."""
    from candle_web.models.face_detector import FaceBox, iou
    from candle_web.pipelines.faces import find_faces, load_landmark_net

    detector, descriptor_net, age_gender_net = nets
    landmark_net = load_landmark_net(weights_dir)
    out = {}
    for photo in OWN_CHAIN_PHOTOS:
        ours = find_faces(model_file("face-api-demo-photos", photo), detector,
                          landmark_net=landmark_net, descriptor_net=descriptor_net,
                          age_gender_net=age_gender_net).faces
        theirs = peer.page.evaluate(OWN_CHAIN_JS, photo)
        assert len(ours) == len(theirs), photo
        out[photo] = [(max(ours, key=lambda face: iou(FaceBox(*face.box, 1.0),
                                                       FaceBox(*found[0], 1.0))), found)
                      for found in theirs]
    return out


@pytest.mark.parametrize("photo", OWN_CHAIN_PHOTOS)
def test_face_api_given_the_photo_finds_the_same_people(own_chain, photo):
    from candle_web.models.face_detector import FaceBox, iou
    from candle_web.models.face_recognition import same_person

    for own, (box, descriptor, age) in own_chain[photo]:
        assert iou(FaceBox(*own.box, 1.0), FaceBox(*box, 1.0)) >= MIN_IOU_OWN_PREPROCESSING
        assert same_person(own.descriptor, descriptor), (photo, box)
        assert abs(own.age - age) <= MAX_AGE_YEARS_OWN_PREPROCESSING, (photo, box)


def test_face_api_given_the_photos_tells_the_same_people_apart(own_chain):
    from candle_web.models.face_recognition import SAME_PERSON_DISTANCE, face_distance, same_person

    faces = [pair for photo in OWN_CHAIN_PHOTOS for pair in own_chain[photo]]
    decided = 0
    for index, (own_a, theirs_a) in enumerate(faces):
        for own_b, theirs_b in faces[index + 1:]:
            theirs = face_distance(theirs_a[1], theirs_b[1])
            if abs(theirs - SAME_PERSON_DISTANCE) > DECIDED_MARGIN:
                assert same_person(own_a.descriptor, own_b.descriptor) == (
                    theirs < SAME_PERSON_DISTANCE), (theirs_a[0], theirs_b[0], theirs)
                decided += 1
    assert decided >= 15  # measured 17 of the 28 pairs, all of different people


def test_bad_inputs_are_refused(nets):
    from candle_web.core.errors import InvalidOption
    from candle_web.models.face_recognition import face_distance

    _, descriptor_net, age_gender_net = nets
    with pytest.raises(InvalidOption, match=r"face recognition net: expected a \[150, 150, 3\]"):
        descriptor_net.forward(np.zeros((112, 112, 3), dtype=np.float32))
    with pytest.raises(InvalidOption, match=r"age and gender net: expected a \[112, 112, 3\]"):
        age_gender_net.forward(np.zeros((150, 150, 3), dtype=np.float32))
    with pytest.raises(InvalidOption, match="128 values"):
        face_distance(np.zeros(128), np.zeros(127))


def test_the_wrong_weights_are_refused_by_name(weights_dir):
    """Another net's manifest: a FormatError naming the net and the first weight it lacks."""
    from candle_web.core.errors import FormatError
    from candle_web.io.tfjs import TfjsWeights
    from candle_web.models.face_age_gender import AgeGenderNet
    from candle_web.models.face_recognition import FaceRecognitionNet

    age_gender = TfjsWeights.load(weights_dir / f"{FILES[2]}-weights_manifest.json")
    with pytest.raises(FormatError, match="face recognition net: weight 'conv32_down/conv/"):
        FaceRecognitionNet(age_gender)
    descriptor = TfjsWeights.load(weights_dir / f"{FILES[1]}-weights_manifest.json")
    with pytest.raises(FormatError, match="age and gender net: weight 'entry_flow/conv_in/"):
        AgeGenderNet(descriptor)
