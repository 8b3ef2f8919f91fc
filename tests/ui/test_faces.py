"""The Faces view end to end in headless Chromium, and its twin check against native.

Real inputs only: face-api 1.7.15's weights (the registry's `face-api` entry, from its npm
tarball) served by `candle-web serve` and cached by the worker, and face-api's own demo photo
sample1.jpg (three faces), chosen through the view's file input as a person would.

The twin check: the worker decodes the photo with the browser's decoder (createImageBitmap +
OffscreenCanvas) and keeps the RGB bytes the networks read (keepPixels); the same session code
(candle_web.worker.faces) then runs natively on those very bytes. Boxes, scores, landmarks,
expressions and ages must agree to float rounding: the page's products are the wasm kernels'
(or scipy's sgemm) and native ones numpy's BLAS, which add the same float32 products in other
orders, ~1e-7 relative per layer. Measured over the networks' depth that is ~1e-5 on a box
corner of a 1920-pixel photo, so boxes and landmarks within 0.01 px and probabilities / ages
within 1e-4: a wrong padding, resize or decode moves them by a pixel or more.
"""
from __future__ import annotations

import base64

import numpy as np
import pytest
from tests.ui.text_views_testlib import leave_page_as_found, open_view, view_state

PHOTO = "sample1.jpg"
FACES_TIMEOUT_MS = 300_000
BOX_ATOL_PX = 0.01
PROBABILITY_ATOL = 1e-4
AGE_ATOL_YEARS = 1e-3

pytestmark = pytest.mark.ui


@pytest.fixture(scope="module", autouse=True)
def page_left_as_found(ready_page, model_cache_left_as_found):
    yield from leave_page_as_found(ready_page)


def run_in_page(page, photo):
    """The view's reply for the photo file at `photo`, chosen through its file input, with the
    RGB bytes the networks read: (reply, pixels [height, width, 3])."""
    open_view(page, "faces")
    page.evaluate("() => { window.candleWeb.faces.keepPixels = true; }")
    runs_before = view_state(page, "faces", "s.runs")
    page.set_input_files("#faces-file-input", str(photo))
    page.wait_for_function(
        "(before) => { const s = window.candleWeb.faces;"
        " return !s.busy && (s.runs > before || s.lastError !== null); }",
        arg=runs_before, timeout=FACES_TIMEOUT_MS)
    assert view_state(page, "faces", "s.lastError") is None
    result = view_state(page, "faces", "({...s.lastResult, pixels: undefined})")
    # The decoded bytes, as base64 pieces of 768 kB (each decodes on its own).
    encoded = page.evaluate("""() => {
        const bytes = window.candleWeb.faces.lastResult.pixels;
        const pieces = [];
        for (let at = 0; at < bytes.length; at += 3 << 18) {
          const piece = bytes.subarray(at, at + (3 << 18));
          let text = "";
          for (let i = 0; i < piece.length; i += 8192) {
            text += String.fromCharCode.apply(null, piece.subarray(i, i + 8192));
          }
          pieces.push(btoa(text));
        }
        return pieces;
    }""")
    pixels = np.concatenate([np.frombuffer(base64.b64decode(piece), dtype=np.uint8)
                             for piece in encoded])
    page.evaluate("() => { window.candleWeb.faces.keepPixels = false; }")
    return result, pixels.reshape(result["height"], result["width"], 3)


@pytest.fixture(scope="module")
def photo_result(ready_page, model_file):
    """The view's reply for PHOTO (with the RGB bytes it read) and the photo's path."""
    photo = model_file("face-api-demo-photos", PHOTO)
    return (*run_in_page(ready_page, photo), photo)


def test_photo_shows_its_faces(ready_page, photo_result):
    result, _, photo = photo_result
    assert (result["width"], result["height"]) == (1920, 1280)
    assert len(result["faces"]) == 3
    for face in result["faces"]:
        x, y, w, h = face["box"]
        assert 0 <= x and 0 <= y and x + w <= 1920 + 1 and y + h <= 1280 + 1 and w > 50
        assert len(face["landmarks"]) == 68
        assert all(x <= px <= x + w and y <= py <= y + h for px, py in face["landmarks"][27:36])
        assert set(face["expressions"]) == {"neutral", "happy", "sad", "angry", "fearful",
                                            "disgusted", "surprised"}
        assert face["gender"] in ("male", "female") and 0 < face["age"] < 100
    # What a person sees: the photo drawn with its faces, the faces in words, the timings.
    figure = ready_page.locator("#faces-results figure").first
    assert figure.locator("canvas").get_attribute("aria-label") == f"{PHOTO}: 3 faces found"
    assert figure.locator(".faces-list li").count() == 3
    assert "detect" in figure.locator(".faces-timings").inner_text()
    assert set(result["timingsMs"]) >= {"decode", "resize", "detect", "landmarks", "expressions",
                                        "ageGender", "total"}
    canvas_size = ready_page.evaluate(
        "() => { const c = document.querySelector('#faces-results canvas');"
        " return [c.width, c.height]; }")
    assert canvas_size == [1920, 1280]


def test_page_decodes_as_pillow(photo_result):
    """The browser's decoder gives the bytes Pillow gives natively (same JPEG, no colour
    profile applied on either side); printed, and bounded by one JPEG rounding step."""
    from candle_web.io.image import load_rgb

    _, pixels, photo = photo_result
    native = load_rgb(photo)
    difference = np.abs(native.astype(np.int16) - pixels.astype(np.int16))
    print(f"page decode vs Pillow: max |diff| {difference.max()}, "
          f"{(difference > 0).mean():.4%} of values differ")
    assert native.shape == pixels.shape
    assert difference.max() <= 2


def assert_native_twin(result, pixels) -> dict:
    """The same session natively on the bytes the page read gives the page's faces."""
    from candle_web import hub
    from candle_web.worker.faces import FaceSession
    from candle_web.worker.session import files_from_folder

    session = FaceSession()
    folder = hub.fetch("face-api", session.required_files[0], cache_only=True).parent
    nets = session.build(files_from_folder(folder, session.required_files))
    native = session.compute(nets, pixels=pixels, options={"landmarks": True, "expressions": True,
                                                           "ageGender": True}, keep_pixels=True)
    assert native["rgbSha256"] == result["rgbSha256"]
    assert len(native["faces"]) == len(result["faces"]) >= 1
    worst = {"box": 0.0, "landmarks": 0.0, "probability": 0.0, "age": 0.0}
    for ours, theirs in zip(native["faces"], result["faces"]):
        worst["box"] = max(worst["box"], np.abs(np.subtract(ours["box"], theirs["box"])).max())
        worst["landmarks"] = max(worst["landmarks"], np.abs(
            np.subtract(ours["landmarks"], theirs["landmarks"])).max())
        worst["probability"] = max(worst["probability"], abs(ours["score"] - theirs["score"]),
                                   abs(ours["genderProbability"] - theirs["genderProbability"]),
                                   *(abs(ours["expressions"][k] - theirs["expressions"][k])
                                     for k in ours["expressions"]))
        worst["age"] = max(worst["age"], abs(ours["age"] - theirs["age"]))
        assert ours["gender"] == theirs["gender"]
    assert worst["box"] <= BOX_ATOL_PX and worst["landmarks"] <= BOX_ATOL_PX
    assert worst["probability"] <= PROBABILITY_ATOL and worst["age"] <= AGE_ATOL_YEARS
    return worst


def test_twin_native_equals_page(photo_result):
    result, pixels, _ = photo_result
    print(f"faces twin, page vs native: {assert_native_twin(result, pixels)}")


def test_twin_on_a_mirrored_canvas_of_two_photos(ready_page, photo_result, model_file, tmp_path):
    """A transformed copy through the page: sample1 mirrored, and the band of sample3 that
    holds its faces below it, on one canvas saved as PNG (lossless: the page decodes it to
    Pillow's bytes exactly); native on the bytes the page read gives the page's faces."""
    from PIL import Image

    from candle_web.io.image import load_rgb

    first = load_rgb(model_file("face-api-demo-photos", PHOTO))[:, ::-1]
    second = load_rgb(model_file("face-api-demo-photos", "sample3.jpg"))[200:700]
    canvas = np.zeros((first.shape[0] + second.shape[0], max(first.shape[1], second.shape[1]),
                       3), dtype=np.uint8)
    canvas[:first.shape[0], :first.shape[1]] = first
    canvas[first.shape[0]:, :second.shape[1]] = second
    path = tmp_path / "two-photos.png"
    Image.fromarray(canvas).save(path)
    result, pixels = run_in_page(ready_page, path)
    np.testing.assert_array_equal(pixels, canvas)
    assert len(result["faces"]) >= 4  # sample1's three and sample3's
    print(f"faces twin on a mirrored two-photo canvas: {len(result['faces'])} faces, "
          f"{assert_native_twin(result, pixels)}")


def test_camera_frames(ready_page, browser_context, ui_server_url, photo_result):
    """Chromium's fake camera (a 640x480 test pattern, no face in it): the view takes frames
    one after another, draws each on its canvas and says the frame rate it holds; Stop camera
    ends it and lets go of the camera."""
    page = ready_page
    browser_context.grant_permissions(["camera"], origin=ui_server_url)
    try:
        page.click("#faces-camera")
        page.wait_for_function("() => window.candleWeb.faces.camera.frames >= 3",
                               timeout=FACES_TIMEOUT_MS)
        assert page.locator("#faces-phase").inner_text().startswith("Camera on:")
        page.click("#faces-stop-camera")
        page.wait_for_function("() => !window.candleWeb.faces.busy", timeout=FACES_TIMEOUT_MS)
    finally:
        browser_context.clear_permissions()
    camera = view_state(page, "faces", "s.camera")
    print(f"camera: {camera['frames']} frames, {camera['fps']:.2f} frames a second")
    assert camera["fps"] > 0 and camera["lastFaces"] == []
    assert page.locator("#faces-phase").inner_text().startswith(
        f"Camera off after {camera['frames']} frames")
    assert view_state(page, "faces", "s.lastError") is None
    assert page.evaluate("() => document.getElementById('faces-video').srcObject") is None
    size = page.evaluate("() => { const c = document.querySelector('#faces-results canvas');"
                         " return [c.width, c.height]; }")
    assert size == [640, 480]


@pytest.mark.parametrize("size", [(390, 844), (1280, 800)])
def test_layout_and_axe_with_results(ready_page, photo_result, size):
    """With a photo and the camera's frame drawn: no sideways scroll (the canvases shrink to
    the column), the status line right above the results, and axe-core clean (no serious or
    critical violation; issue 35's rules for every view)."""
    from tests.ui.test_page_accessibility import AXE, violations

    page = ready_page
    before = page.viewport_size
    page.set_viewport_size({"width": size[0], "height": size[1]})
    try:
        page.click("#tab-faces")
        assert page.evaluate("() => document.documentElement.scrollWidth") <= size[0]
        canvas = page.locator("#faces-results figure canvas").first.bounding_box()
        assert canvas["x"] >= 0 and canvas["x"] + canvas["width"] <= size[0]
        status = page.locator("#faces-job").bounding_box()
        assert status["y"] + status["height"] <= page.locator("#faces-results").bounding_box()["y"]
        if not page.evaluate("() => typeof axe !== 'undefined'"):
            page.add_script_tag(content=AXE.read_text())
        assert violations(page) == []
    finally:
        page.set_viewport_size(before)


def test_a_file_that_is_not_a_photo_is_named(ready_page, photo_result, tmp_path):
    """A file named .jpg that holds text: the error box names the file, nothing is drawn for
    it, and the view stays usable."""
    page = ready_page
    page.click("#tab-faces")
    fake = tmp_path / "notes.jpg"
    fake.write_text("not a photo\n")
    figures = page.locator("#faces-results figure").count()
    page.set_input_files("#faces-file-input", str(fake))
    page.wait_for_function("() => { const s = window.candleWeb.faces;"
                           " return !s.busy && s.lastError !== null; }", timeout=FACES_TIMEOUT_MS)
    assert "notes.jpg is not a photo" in page.locator("#faces-error").inner_text()
    assert page.locator("#faces-results figure").count() == figures
    assert page.locator("#faces-choose").is_enabled()


def test_two_faces_compared_by_descriptor(ready_page, photo_result, model_file):
    """With descriptors on, ticking two faces says their distance and whether they are the
    same person (below 0.6). The page's descriptors equal native's on the same bytes (the
    decode is Pillow's byte for byte, test_page_decodes_as_pillow): cosine >= 0.99999, a
    bound float rounding through ResNet-34's 29 layers stays far inside (measured: printed)."""
    from candle_web import hub
    from candle_web.io.image import load_rgb
    from candle_web.worker.faces import FaceSession
    from candle_web.worker.session import files_from_folder

    page = ready_page
    page.click("#tab-faces")
    page.check("#faces-descriptor")
    runs_before = view_state(page, "faces", "s.runs")
    page.set_input_files("#faces-file-input", str(model_file("face-api-demo-photos", PHOTO)))
    page.wait_for_function(
        "(before) => { const s = window.candleWeb.faces;"
        " return !s.busy && (s.runs > before || s.lastError !== null); }",
        arg=runs_before, timeout=FACES_TIMEOUT_MS)
    page.uncheck("#faces-descriptor")
    assert view_state(page, "faces", "s.lastError") is None
    faces = view_state(page, "faces", "s.lastResult.faces")
    picks = page.locator("#faces-results figure").first.locator(".faces-pick")
    assert picks.count() == len(faces) == 3
    picks.nth(0).check()
    picks.nth(1).check()
    comparison = view_state(page, "faces", "s.comparison")
    expected = float(np.linalg.norm(np.subtract(faces[0]["descriptor"], faces[1]["descriptor"])))
    assert abs(comparison["distance"] - expected) < 1e-9
    assert comparison["samePerson"] == (expected < 0.6)
    words = "the same person" if expected < 0.6 else "different people"
    assert f"distance {expected:.3f}, {words}" in page.locator("#faces-compare").inner_text()

    session = FaceSession()
    folder = hub.fetch("face-api", session.required_files[0], cache_only=True).parent
    nets = session.build(files_from_folder(folder, session.required_files))
    rgb = load_rgb(model_file("face-api-demo-photos", PHOTO))
    native = session.compute(nets, pixels=rgb, options={"landmarks": True, "descriptor": True})
    cosines = [float(np.dot(a["descriptor"], b["descriptor"])
                     / np.linalg.norm(a["descriptor"]) / np.linalg.norm(b["descriptor"]))
               for a, b in zip(native["faces"], faces)]
    print(f"descriptors, page vs native: cosine >= {min(cosines):.9f}")
    assert len(native["faces"]) == 3 and min(cosines) >= 0.99999
