"""`candle-web faces` and pipelines/faces.py: the issue's JSON shape (only the keys asked for),
boxes in the photo's own pixels, a table, and clear refusals. (The faces themselves are checked
against face-api in tests/models/test_face_detector.py.)"""

from __future__ import annotations

import json

import numpy as np
import pytest

from candle_web.cli import main
from candle_web.io.image import load_rgb
from candle_web.pipelines.faces import detect_faces, find_faces, load_face_detector


@pytest.fixture(scope="module")
def detector(model_file):
    # A folder of face-api's files, as `--model FOLDER` gives it.
    return load_face_detector(model_file("face-api", "tiny_face_detector_model.bin").parent)


@pytest.fixture(scope="module")
def photo(model_file):
    return model_file("face-api-demo-photos", "sample1.jpg")


def test_json_has_the_issue_keys_and_photo_pixels(detector, photo, capsys):
    assert main(["faces", str(photo), "--format", "json"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1
    result = json.loads(lines[0])
    assert set(result) == {"file", "width", "height", "faces"}
    assert (result["file"], result["width"], result["height"]) == (str(photo), 1920, 1280)
    # sample1.jpg: three people side by side; face-api finds the same three (peer test).
    assert len(result["faces"]) == 3
    for face in result["faces"]:
        assert set(face) == {"box", "score"}  # no landmarks, descriptor... unless asked
        x, y, width, height = face["box"]
        assert 0 <= x and x + width <= 1920 and 0 <= y and y + height <= 1280
        assert 150 < width < 450 and 150 < height < 450  # faces of a group photo at 1920 px
        assert 0.5 < face["score"] <= 1
    expected = find_faces(photo, detector).to_json()
    assert result == expected


def test_boxes_follow_the_photo_when_it_is_scaled(detector, photo):
    """The same photo at half size: the boxes halve (the tensor the model sees is nearly the
    same, so the faces are found at the same relative places)."""
    rgb = load_rgb(photo)
    half = rgb.reshape(640, 2, 960, 2, 3).mean(axis=(1, 3)).astype(np.uint8)
    full = detect_faces(detector, rgb)
    small = detect_faces(detector, half)
    assert len(full) == len(small)
    for a, b in zip(full, small):
        # Both are resized to 416 from 1920 or 960 px: a pixel or two at 416 apart at most.
        np.testing.assert_allclose(np.array(b.box) * 2, a.box, atol=2 * 1920 / 416)


def test_landmarks_only_when_asked_in_the_photo_pixels(photo, capsys):
    assert main(["faces", str(photo), "--landmarks"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert len(result["faces"]) == 3
    for face in result["faces"]:
        assert set(face) == {"box", "score", "landmarks"}
        points = np.array(face["landmarks"])
        assert points.shape == (68, 2)
        x, y, width, height = face["box"]
        # The jaw line runs to the box's edges and the brows sit near its top: every point
        # lies within the box grown by a fifth of its size.
        assert (points[:, 0] > x - width / 5).all() and (points[:, 0] < x + width * 1.2).all()
        assert (points[:, 1] > y - height / 5).all() and (points[:, 1] < y + height * 1.2).all()
        # iBUG 300-W order: point 0 is the jaw's start on the image's left, 16 its end.
        assert points[0, 0] < points[16, 0]


def test_expressions_only_when_asked(photo, capsys):
    assert main(["faces", str(photo), "--expressions"]) == 0
    result = json.loads(capsys.readouterr().out)
    for face in result["faces"]:
        assert set(face) == {"box", "score", "expressions"}
        assert list(face["expressions"]) == ["neutral", "happy", "sad", "angry", "fearful",
                                             "disgusted", "surprised"]
        # Probabilities (rounded to 6 places each, so the sum may miss 1 by 7 * 5e-7).
        assert abs(sum(face["expressions"].values()) - 1) <= 4e-6
    assert main(["faces", str(photo), "--expressions", "--format", "table"]) == 0
    lines = capsys.readouterr().out.splitlines()[1:]
    assert all(line.split()[-2] in ("neutral", "happy", "sad", "angry", "fearful", "disgusted",
                                    "surprised") for line in lines)


def test_ssd_detector_in_the_same_shape(photo, capsys):
    assert main(["faces", str(photo), "--detector", "ssd"]) == 0
    result = json.loads(capsys.readouterr().out)
    # sample1.jpg's three people (face-api's SSD finds the same three: peer test).
    assert len(result["faces"]) == 3
    for face in result["faces"]:
        assert set(face) == {"box", "score"}
        x, y, width, height = face["box"]
        assert 0 <= x and x + width <= 1920 and 0 <= y and y + height <= 1280
        assert 0.5 < face["score"] <= 1


def test_table_and_refusals(photo, tmp_path, capsys):
    assert main(["faces", str(photo), "--format", "table"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith("(1920x1280): 3 faces") and len(out) == 4
    assert "score" in out[1]
    broken = tmp_path / "broken.jpg"
    broken.write_bytes(b"\xff\xd8 not really a JPEG")
    assert main(["faces", str(broken)]) == 2
    assert "broken.jpg: not an image" in capsys.readouterr().err
    assert main(["faces", str(photo), "--score-threshold", "1.5"]) == 2
    assert "score_threshold must be a number between 0 and 1" in capsys.readouterr().err
    assert main(["faces", str(photo), "--model", str(tmp_path)]) == 2
    assert "tiny_face_detector_model" in capsys.readouterr().err
