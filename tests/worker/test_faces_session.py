"""The Faces view's worker session natively: on the same photo it gives what `candle-web faces`
(pipelines.faces) gives, value for value (the same code runs; the page's twin check in
tests/ui/test_faces.py then ties the page to this), and it refuses bad requests by the field."""
from __future__ import annotations

import numpy as np
import pytest

from candle_web.core.errors import FormatError, InvalidOption


@pytest.fixture(scope="module")
def session_and_nets(model_file):
    from candle_web.worker.faces import FaceSession
    from candle_web.worker.session import files_from_folder

    session = FaceSession()
    folder = model_file("face-api", session.required_files[0]).parent
    for name in session.required_files:
        model_file("face-api", name)
    return session, session.build(files_from_folder(folder, session.required_files))


def test_session_equals_pipeline(session_and_nets, model_file):
    from candle_web.io.image import load_rgb
    from candle_web.pipelines import faces as pipeline

    session, nets = session_and_nets
    rgb = load_rgb(model_file("face-api-demo-photos", "sample2.jpg"))
    rgba = np.concatenate([rgb, np.full(rgb.shape[:2] + (1,), 255, np.uint8)], axis=2)
    ours = session.compute(nets, pixels=rgba, options={"landmarks": True, "expressions": True,
                                                       "ageGender": True, "descriptor": True})
    theirs = pipeline.detect_faces(nets["detector"], rgb, landmark_net=nets["landmarks"],
                                   expression_net=nets["expressions"],
                                   age_gender_net=nets["ageGender"],
                                   descriptor_net=nets["descriptor"])
    assert len(ours["faces"]) == len(theirs) >= 1
    for face, expected in zip(ours["faces"], theirs):
        assert face["box"] == list(expected.box) and face["score"] == expected.score
        assert face["landmarks"] == [list(point) for point in expected.landmarks]
        assert face["expressions"] == expected.expressions
        assert (face["age"], face["gender"], face["genderProbability"]) == (
            expected.age, expected.gender, expected.gender_probability)
        assert face["descriptor"] == expected.descriptor
    assert set(ours["timingsMs"]) == {"resize", "detect", "landmarks", "expressions",
                                      "ageGender", "descriptor", "total"}


def test_session_refuses_bad_requests(session_and_nets):
    session, nets = session_and_nets
    pixels = np.zeros((8, 8, 4), np.uint8)
    with pytest.raises(InvalidOption, match="unknown option.*ssd"):
        session.compute(nets, pixels=pixels, options={"ssd": True})
    with pytest.raises(InvalidOption, match="scoreThreshold"):
        session.compute(nets, pixels=pixels, options={"scoreThreshold": 1.5})
    with pytest.raises(InvalidOption, match="landmarks must be true or false"):
        session.compute(nets, pixels=pixels, options={"landmarks": "yes"})
    with pytest.raises(FormatError, match="height"):
        session.allocate_pixels(640, 0)
    with pytest.raises(FormatError, match="pixels a photo may have"):
        session.allocate_pixels(100_000, 100_000)
    with pytest.raises(FormatError, match="`pixels`"):
        session.compute(nets, pixels=np.zeros((8, 8), np.uint8))


def test_manifest_fetches_only_the_networks_the_page_runs():
    from candle_web.worker.faces import FaceSession

    manifest = FaceSession().manifest(model="face-api")
    names = {file["name"] for file in manifest["files"]}
    assert names == set(FaceSession.required_files)
    assert all(file["sha256"] and file["url"] == f"models/face-api/{file['name']}"
               for file in manifest["files"])
    assert sum(file["size"] for file in manifest["files"]) < 7_900_000
