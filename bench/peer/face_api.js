// The face-api peer of bench/browser.py --tasks faces: face-api 1.7.15 (npm @vladmandic/face-api,
// its bundled TensorFlow.js 4.22) on TensorFlow.js's wasm backend (binaries from npm
// @tensorflow/tfjs-backend-wasm 4.22.0: SIMD, and threads where the page is cross-origin
// isolated, which `candle-web serve` makes it), in the same Chromium as candle-web's page and
// served by the same server (bench/browser_faces.py maps the folders under /models/local/).
//
// URL: face_api.html?threads=1|2
// window.peer.ready resolves to {backend, threads, simd, multithread, crossOriginIsolated};
// window.peer.run(photoUrl, repeats) -> {ms: [per run], faces}: the tiny face detector at 416,
// the 68-point landmarks and the 128-d descriptor of every face, from a canvas holding the
// decoded photo (face-api's own resize), after one warm-up run.

const LIBRARY_URL = "/models/local/face-api-dist/face-api.esm.js";
const WASM_URL = "/models/local/tfjs-wasm/";
const MODEL_URL = "/models/local/face-api-model";

const threads = Number(new URLSearchParams(location.search).get("threads") || "1");
let faceapi = null;

async function start() {
  // TensorFlow.js's threaded wasm sizes its pool of workers at hardwareConcurrency / 2 when it
  // loads: on a 2-core machine one worker, and then setThreadsCount(2) still runs on 1 thread
  // (getThreadsCount says 1). Reported as the browser's count times two, so that the pool
  // holds the threads asked for.
  if (threads > 1) Object.defineProperty(navigator, "hardwareConcurrency", { value: 2 * threads });
  faceapi = await import(LIBRARY_URL);
  const { tf } = faceapi;
  tf.setWasmPaths(WASM_URL);
  tf.setThreadsCount(threads);
  if (!(await tf.setBackend("wasm"))) throw new Error("TensorFlow.js's wasm backend did not start");
  await tf.ready();
  await faceapi.nets.tinyFaceDetector.loadFromUri(MODEL_URL);
  await faceapi.nets.faceLandmark68Net.loadFromUri(MODEL_URL);
  await faceapi.nets.faceRecognitionNet.loadFromUri(MODEL_URL);
  const ready = {
    backend: tf.getBackend(), threads: tf.getThreadsCount(), crossOriginIsolated: self.crossOriginIsolated,
    simd: await tf.env().getAsync("WASM_HAS_SIMD_SUPPORT"),
    multithread: await tf.env().getAsync("WASM_HAS_MULTITHREAD_SUPPORT"),
  };
  document.getElementById("status").textContent = JSON.stringify(ready);
  return ready;
}

async function run(photoUrl, repeats) {
  const bitmap = await createImageBitmap(await (await fetch(photoUrl)).blob());
  const canvas = document.createElement("canvas");
  canvas.width = bitmap.width;
  canvas.height = bitmap.height;
  canvas.getContext("2d").drawImage(bitmap, 0, 0);
  const options = new faceapi.TinyFaceDetectorOptions({ inputSize: 416, scoreThreshold: 0.5 });
  const detect = () => faceapi.detectAllFaces(canvas, options).withFaceLandmarks().withFaceDescriptors();
  await detect(); // warm-up: shaders of the first call, wasm tiers
  const ms = [];
  let faces = [];
  for (let i = 0; i < repeats; i += 1) {
    const started = performance.now();
    faces = await detect();
    ms.push(performance.now() - started);
  }
  return { ms, faces: faces.length };
}

window.peer = { ready: start(), run };
