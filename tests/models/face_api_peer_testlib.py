"""face-api itself (npm @vladmandic/face-api 1.7.15, its bundled TensorFlow.js on the cpu
backend) in headless Chromium, launched as tests/ui launches it, as the peer of our face models.

`FaceApiPeer` serves face-api's dist/ and the registry's face-api weights from a local server
on 127.0.0.1 (every other request is aborted), opens one page, and runs face-api on tensors we
hand it, so both sides read exactly the same input."""

from __future__ import annotations

import base64
import http.server
import importlib.util
import shutil
import tempfile
import threading
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[2]
FACE_API_DIST = REPO_ROOT / "node_modules/@vladmandic/face-api/dist"
TFJS_WASM_DIST = REPO_ROOT / "node_modules/@tensorflow/tfjs-backend-wasm/dist"
# The backend is the page's query (?backend=cpu or wasm). wasm: TensorFlow.js's own SIMD
# kernels (one thread: the page is not cross-origin isolated), binaries from the npm package
# of the same version (4.22.0) as the TensorFlow.js face-api bundles.
PAGE = b"""<!doctype html><meta charset="utf-8"><title>face-api peer</title>
<script type="module">
import * as faceapi from "/dist/face-api.esm.js";
const backend = new URLSearchParams(location.search).get("backend");
if (backend === "wasm") faceapi.tf.setWasmPaths("/wasm/");
if (!(await faceapi.tf.setBackend(backend))) throw new Error("no backend " + backend);
await faceapi.tf.ready();
window.faceapi = faceapi;
window.peerReady = true;
</script>"""
MIME = {".js": "text/javascript", ".json": "application/json", ".bin": "application/octet-stream",
        ".html": "text/html; charset=utf-8", ".wasm": "application/wasm"}


def _playwright_config():
    spec = importlib.util.spec_from_file_location("candle_web_playwright_config",
                                                  REPO_ROOT / "playwright.config.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _Server:
    """GET /peer.html, /dist/<file> (face-api's bundles), /model/<file> (the weights),
    /wasm/<file> (TensorFlow.js's wasm binaries), /photos/<file>."""

    def __init__(self, model_dir: Path, photo_dir: Path | None):
        roots = {"dist": FACE_API_DIST, "model": model_dir, "wasm": TFJS_WASM_DIST,
                 "photos": photo_dir or model_dir}

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                path = self.path.split("?")[0]
                body = None
                if path == "/peer.html":
                    body = PAGE
                else:
                    _, root, *rest = path.split("/")
                    if root in roots and len(rest) == 1 and rest[0] and ".." not in rest[0]:
                        file = roots[root] / rest[0]
                        body = file.read_bytes() if file.is_file() else None
                if body is None:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Type", MIME.get(Path(path).suffix,
                                                          "application/octet-stream"))
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


class FaceApiPeer:
    def __init__(self, model_dir: Path, backend: str = "wasm", photo_dir: Path | None = None):
        from playwright.sync_api import sync_playwright

        config = _playwright_config()
        self.blocked = []
        self._server = _Server(model_dir, photo_dir)
        self._profile = tempfile.mkdtemp(prefix="candle-web-face-api-")
        self._playwright = sync_playwright().start()
        self.context = self._playwright.chromium.launch_persistent_context(
            self._profile, **config.LAUNCH_OPTIONS)
        self.context.route("**/*", self._guard)
        self.page = self.context.new_page()
        self.errors = []
        self.page.on("pageerror", lambda error: self.errors.append(str(error)))
        self.page.goto(f"{self._server.url}/peer.html?backend={backend}")
        self.page.wait_for_function("window.peerReady === true", timeout=60_000)
        self.page.evaluate("""async () => {
            await faceapi.nets.tinyFaceDetector.loadFromUri('/model');
            await faceapi.nets.faceLandmark68Net.loadFromUri('/model');
            await faceapi.nets.ssdMobilenetv1.loadFromUri('/model');
            await faceapi.nets.faceExpressionNet.loadFromUri('/model');
        }""")

    def _guard(self, route):
        if route.request.url.startswith(self._server.url + "/"):
            route.continue_()
        else:
            self.blocked.append(route.request.url)
            route.abort()

    def close(self):
        try:
            self.context.close()
            self._playwright.stop()
        finally:
            self._server.close()
            shutil.rmtree(self._profile, ignore_errors=True)

    def tiny_face_detector(self, image: np.ndarray, score_threshold: float = 0.5) -> list:
        """face-api's tiny detector on one [416, 416, 3] float32 tensor: [(x, y, w, h, score)]
        in the tensor's pixels. With a tensor already square and at the input size, face-api
        neither pads nor resizes it."""
        data = base64.b64encode(np.ascontiguousarray(image, dtype="<f4").tobytes()).decode()
        return self.page.evaluate("""async ([data, shape, threshold]) => {
            const bytes = Uint8Array.from(atob(data), (c) => c.charCodeAt(0));
            const tensor = faceapi.tf.tensor3d(new Float32Array(bytes.buffer), shape, 'float32');
            const options = new faceapi.TinyFaceDetectorOptions({ inputSize: shape[0],
                                                                  scoreThreshold: threshold });
            const faces = await faceapi.detectAllFaces(tensor, options);
            tensor.dispose();
            return faces.map((f) => [f.box.x, f.box.y, f.box.width, f.box.height, f.score]);
        }""", [data, list(image.shape), score_threshold])

    def ssd_mobilenetv1(self, image: np.ndarray, min_confidence: float = 0.5) -> list:
        """face-api's SSD MobileNet v1 on one [512, 512, 3] float32 tensor: [(x, y, w, h,
        score)] in the tensor's pixels (not padded nor resized: square, at the input size)."""
        data = base64.b64encode(np.ascontiguousarray(image, dtype="<f4").tobytes()).decode()
        return self.page.evaluate("""async ([data, shape, confidence]) => {
            const bytes = Uint8Array.from(atob(data), (c) => c.charCodeAt(0));
            const tensor = faceapi.tf.tensor3d(new Float32Array(bytes.buffer), shape, 'float32');
            const options = new faceapi.SsdMobilenetv1Options({ minConfidence: confidence,
                                                                maxResults: 100 });
            const faces = await faceapi.detectAllFaces(tensor, options);
            tensor.dispose();
            return faces.map((f) => [f.box.x, f.box.y, f.box.width, f.box.height, f.score]);
        }""", [data, list(image.shape), min_confidence])

    def landmarks_68(self, face: np.ndarray) -> np.ndarray:
        """face-api's 68-point landmark net on one [112, 112, 3] float32 crop: [68, 2] in the
        crop's units (face-api neither pads nor resizes a square tensor at 112)."""
        data = base64.b64encode(np.ascontiguousarray(face, dtype="<f4").tobytes()).decode()
        points = self.page.evaluate("""async ([data, shape]) => {
            const bytes = Uint8Array.from(atob(data), (c) => c.charCodeAt(0));
            const tensor = faceapi.tf.tensor3d(new Float32Array(bytes.buffer), shape, 'float32');
            const landmarks = await faceapi.nets.faceLandmark68Net.detectLandmarks(tensor);
            tensor.dispose();
            return landmarks.relativePositions.map((p) => [p.x, p.y]);
        }""", [data, list(face.shape)])
        return np.array(points, dtype=np.float64)

    def expressions(self, face: np.ndarray) -> dict:
        """face-api's expression net on one [112, 112, 3] float32 crop: {label: probability}."""
        data = base64.b64encode(np.ascontiguousarray(face, dtype="<f4").tobytes()).decode()
        return self.page.evaluate("""async ([data, shape]) => {
            const bytes = Uint8Array.from(atob(data), (c) => c.charCodeAt(0));
            const tensor = faceapi.tf.tensor3d(new Float32Array(bytes.buffer), shape, 'float32');
            const found = await faceapi.nets.faceExpressionNet.predictExpressions(tensor);
            tensor.dispose();
            return Object.fromEntries(found.asSortedArray().map((e) => [e.expression,
                                                                        e.probability]));
        }""", [data, list(face.shape)])

    def tiny_face_detector_on_photo(self, name: str, score_threshold: float = 0.5) -> list:
        """face-api's tiny detector given the photo itself (an <img>: face-api's own canvas
        resize): [(x, y, w, h, score)] in the photo's pixels."""
        return self.page.evaluate("""async ([name, threshold]) => {
            const image = new Image();
            image.src = '/photos/' + name;
            await image.decode();
            const options = new faceapi.TinyFaceDetectorOptions({ inputSize: 416,
                                                                  scoreThreshold: threshold });
            const faces = await faceapi.detectAllFaces(image, options);
            return faces.map((f) => [f.box.x, f.box.y, f.box.width, f.box.height, f.score]);
        }""", [name, score_threshold])

    def decoded_weights(self, manifest_name: str) -> dict:
        """name -> float32 array, decoded by TensorFlow.js's own tf.io.decodeWeights."""
        result = self.page.evaluate("""async (name) => {
            const manifest = await (await fetch('/model/' + name)).json();
            const out = {};
            for (const group of manifest) {
                const parts = await Promise.all(group.paths.map(
                    async (p) => new Uint8Array(await (await fetch('/model/' + p)).arrayBuffer())));
                const total = parts.reduce((n, p) => n + p.length, 0);
                const joined = new Uint8Array(total);
                let at = 0;
                for (const p of parts) { joined.set(p, at); at += p.length; }
                const map = faceapi.tf.io.decodeWeights(joined.buffer, group.weights);
                for (const [key, tensor] of Object.entries(map)) {
                    const values = new Float32Array(tensor.dataSync());
                    let binary = '';
                    const view = new Uint8Array(values.buffer);
                    for (let i = 0; i < view.length; i += 8192)
                        binary += String.fromCharCode.apply(null, view.subarray(i, i + 8192));
                    out[key] = [btoa(binary), tensor.shape];
                    tensor.dispose();
                }
            }
            return out;
        }""", manifest_name)
        return {name: np.frombuffer(base64.b64decode(data), dtype="<f4").reshape(shape)
                for name, (data, shape) in result.items()}
