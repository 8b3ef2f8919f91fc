"""`candle-web faces --describe / --age-gender / --compare A B` and the pipeline behind them:
the issue's keys only when asked, descriptors of the face aligned by its landmarks (face-api's
alignedRect), and same/different person verdicts. (The nets themselves are checked against
face-api in tests/models/test_face_recognition.py.)"""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from candle_web.cli import main
from candle_web.pipelines import faces as pipeline


@pytest.fixture(scope="module")
def photos(model_file):
    return model_file("face-api-demo-photos", "sample1.jpg").parent


@pytest.fixture(scope="module")
def nets(model_file):
    folder = model_file("face-api", "tiny_face_detector_model.bin").parent
    return {"detector": pipeline.load_face_detector(folder),
            "landmark_net": pipeline.load_landmark_net(folder),
            "descriptor_net": pipeline.load_descriptor_net(folder),
            "age_gender_net": pipeline.load_age_gender_net(folder)}


def test_descriptor_age_and_gender_only_when_asked(photos, nets, capsys):
    photo = photos / "sample1.jpg"
    assert main(["faces", str(photo), "--describe", "--age-gender"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert len(result["faces"]) == 3
    for face in result["faces"]:
        # The landmarks were found (to align the face) but not asked for: not in the answer.
        assert set(face) == {"box", "score", "descriptor", "age", "gender", "gender_probability"}
        assert len(face["descriptor"]) == 128
        # dlib's descriptors are unit-ish vectors: norms near 1 keep 0.6 a meaningful distance.
        assert 0.5 < np.linalg.norm(face["descriptor"]) < 1.5
        assert face["gender"] in ("male", "female")
        assert 0.5 <= face["gender_probability"] <= 1
        assert 10 < face["age"] < 70  # three young adults
    expected = pipeline.find_faces(photo, nets["detector"], **{
        name: net for name, net in nets.items() if name != "detector"})
    for face in expected.faces:
        face.landmarks = None
    assert result == expected.to_json()


def test_the_faces_read_are_aligned_by_the_landmarks(photos, nets):
    from candle_web.io.image import load_rgb
    from candle_web.models.face_landmarks import face_input

    rgb = load_rgb(photos / "sample2.jpg")
    (face,) = pipeline.detect_faces(rgb=rgb, detector=nets["detector"],
                                    landmark_net=nets["landmark_net"],
                                    descriptor_net=nets["descriptor_net"])
    points = np.array(face.landmarks)
    x, y, width, height = pipeline.aligned_box(face.landmarks)
    # face-api's alignedRect: the points' bounds grown by a tenth of their size on each side.
    np.testing.assert_allclose([x, y], points.min(0) - (points.max(0) - points.min(0)) * 0.1)
    np.testing.assert_allclose([x + width, y + height],
                               points.max(0) + (points.max(0) - points.min(0)) * 0.1)
    # The descriptor's face is dlib's square: the centre of the eyes' and mouth's centres at
    # (0.5, 0.43) of it (within the pixel its corner is floored to), its side 1/0.45 of the
    # mean eye-to-mouth distance.
    x, y, side, height = pipeline.descriptor_box(face.landmarks)
    eyes_and_mouth = [points[36:42].mean(0), points[42:48].mean(0), points[48:68].mean(0)]
    centre = np.mean(eyes_and_mouth, axis=0)
    assert side == height and 0 <= centre[0] - (x + 0.5 * side) < 1
    assert 0 <= centre[1] - (y + 0.43 * side) < 1
    eye_to_mouth = np.mean([np.linalg.norm(eyes_and_mouth[2] - eye) for eye in eyes_and_mouth[:2]])
    assert side == int(eye_to_mouth / 0.45)
    crop, _ = face_input(rgb, (x, y, side, side), 150)
    np.testing.assert_array_equal(face.descriptor, nets["descriptor_net"].forward(crop))


def test_compare_a_photo_with_its_mirror_image_is_the_same_person(photos, tmp_path, capsys):
    mirrored = tmp_path / "mirrored.png"
    Image.open(photos / "sample2.jpg").transpose(Image.Transpose.FLIP_LEFT_RIGHT).save(mirrored)
    assert main(["faces", "--compare", str(photos / "sample2.jpg"), str(mirrored)]) == 0
    verdict = json.loads(capsys.readouterr().out)
    assert set(verdict) == {"a", "b", "distance", "same_person", "threshold"}
    assert verdict["b"] == str(mirrored) and verdict["threshold"] == 0.6
    assert verdict["same_person"] is True and 0 < verdict["distance"] < 0.6


def test_compare_two_different_people(photos, capsys):
    # sample5's and sample6's best faces: measured 0.89 apart (face-api agrees: the same net
    # on the same crops, tests/models/test_face_recognition.py).
    assert main(["faces", "--compare", str(photos / "sample5.jpg"), str(photos / "sample6.jpg"),
                 "--format", "table"]) == 0
    line = capsys.readouterr().out.strip()
    assert line.endswith("different people") and ">= 0.6" in line
    assert float(line.split("distance ")[1].split()[0]) > 0.6


def test_compare_refusals(photos, tmp_path, capsys):
    assert main(["faces"]) == 2
    assert "give photos, or --compare A B" in capsys.readouterr().err
    photo = str(photos / "sample1.jpg")
    assert main(["faces", photo, "--compare", photo, photo]) == 2
    assert "not both" in capsys.readouterr().err
    blank = tmp_path / "blank.png"
    Image.new("RGB", (320, 240), (128, 128, 128)).save(blank)
    assert main(["faces", "--compare", photo, str(blank)]) == 2
    assert f"no face found in {blank}" in capsys.readouterr().err


def test_table_shows_gender_and_age(photos, capsys):
    assert main(["faces", str(photos / "sample2.jpg"), "--age-gender", "--format",
                 "table"]) == 0
    rows = capsys.readouterr().out.splitlines()[1:]
    assert len(rows) == 1 and "female" in rows[0] and " age " in rows[0]


def test_tiny_landmarks_when_asked(photos, nets, capsys):
    photo = photos / "sample2.jpg"
    assert main(["faces", str(photo), "--landmarks", "--tiny-landmarks"]) == 0
    (face,) = json.loads(capsys.readouterr().out)["faces"]
    tiny = np.array(face["landmarks"])
    full = np.array(pipeline.find_faces(photo, nets["detector"],
                                        landmark_net=nets["landmark_net"]).faces[0].landmarks)
    assert tiny.shape == full.shape == (68, 2)
    # Two nets trained for the same points: they agree to a few pixels on a 270 px face
    # (measured 3 px here, 2-7 px on the faces of three photos): far less than the face's
    # size, but they are not the same net.
    distances = np.linalg.norm(tiny - full, axis=1)
    assert 0 < distances.mean() < 0.05 * face["box"][2]
