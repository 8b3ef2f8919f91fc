// Before/after for a proposed change to candle_web's numpy backend, measured in Pyodide under
// Node (the same wasm, numpy 2.0.2 and scipy 1.14.1 as the browser worker, no browser needed).
//
//   node bench/pyodide_sgemm_experiment.mjs [MODEL_DIR] [CLIP.wav]
//
// NumpyBackend._sgemm_matmul (pkg/candle_web/backend/numpy_backend.py) calls
// sgemm(1, ascontiguousarray(b).T, ascontiguousarray(a).T): for a transposed operand -- every
// Linear weight (x @ W.t()) and Whisper's tied output projection (x @ E.t(), 51864 x 384) --
// ascontiguousarray makes a strided transpose copy on every call, ~110 MB per decoded token
// for tiny.en. The candidate passes each operand in whichever order it already has and tells
// BLAS through trans_a / trans_b instead. This script transcribes one clip with the current
// code, then with the candidate patched in, and prints both timings and whether the token ids
// are identical. Nothing in the package is changed.
import path from "node:path";
import { fileURLToPath } from "node:url";
import os from "node:os";

const repo = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const cache = process.env.CANDLE_WEB_CACHE || path.join(os.homedir(), ".cache", "candle-web");
const modelDir = process.argv[2] ||
  path.join(cache, "models--Systran--faster-whisper-tiny.en", "snapshots", "0d3d19a32d3338f10357c0889762bd8d64bbdeba");
const clip = process.argv[3] ||
  path.join(repo, "web", "vendor", "samples", "sense_and_sensibility_01_austen_64kb-0880.wav");

const { loadPyodide } = await import(path.join(repo, "node_modules", "pyodide", "pyodide.mjs"));
const pyodide = await loadPyodide({ indexURL: path.join(repo, "web", "vendor", "pyodide") + "/" });
await pyodide.loadPackage(["numpy", "scipy"], { messageCallback: () => {} });
const mounts = { "/repo_pkg": path.join(repo, "pkg"), "/model": modelDir, "/clip": path.dirname(clip) };
for (const [target, source] of Object.entries(mounts)) {
  pyodide.FS.mkdirTree(target);
  pyodide.FS.mount(pyodide.FS.filesystems.NODEFS, { root: source }, target);
}
const report = pyodide.runPython(`
import sys, time, json
sys.path.insert(0, "/repo_pkg")
import numpy as np
from candle_web.io.audio import load_audio
from candle_web.models.whisper import Whisper
from candle_web.pipelines.transcribe import transcribe, TranscribeOptions
from candle_web.tokenizers import Tokenizer
from candle_web.backend import numpy_backend

with open("/model/model.bin", "rb") as handle:
    model_bytes = handle.read()
model = Whisper.from_ct2(memoryview(model_bytes), json.load(open("/model/config.json")))
tokenizer = Tokenizer.from_file("/model/tokenizer.json")
samples = load_audio("/clip/${path.basename(clip)}")

def fortran_operand(x):
    """(array, trans) with op(array) == x.T and array Fortran-contiguous, copying only when
    x is neither C- nor F-contiguous."""
    if x.flags.c_contiguous:
        return x.T, 0
    if x.flags.f_contiguous:
        return x, 1
    return np.ascontiguousarray(x).T, 0

def sgemm_2d(sgemm, a, b):
    # (a @ b).T = b.T @ a.T: Fortran writes it column-major, which is a @ b in C order.
    bt, trans_b = fortran_operand(b)
    at, trans_a = fortran_operand(a)
    return sgemm(1.0, bt, at, trans_a=trans_b, trans_b=trans_a).T

def candidate_sgemm_matmul(self, a, b):
    if a.ndim == 2 and b.ndim == 2:
        return sgemm_2d(self._sgemm, a, b)
    batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    a_full = np.broadcast_to(a, batch + a.shape[-2:]).reshape(-1, *a.shape[-2:])
    b_full = np.broadcast_to(b, batch + b.shape[-2:]).reshape(-1, *b.shape[-2:])
    out = np.empty((a_full.shape[0], a.shape[-2], b.shape[-1]), dtype=np.float32)
    for i in range(a_full.shape[0]):
        out[i] = sgemm_2d(self._sgemm, a_full[i], b_full[i])
    return out.reshape(batch + out.shape[-2:])

def timed_run():
    encode, logits = model.encode, model.logits
    spent = {"encode": 0.0, "decode": 0.0, "calls": 0}
    def timed_encode(mel):
        t = time.perf_counter(); out = encode(mel); spent["encode"] += time.perf_counter() - t; return out
    def timed_logits(tokens, state):
        t = time.perf_counter(); out = logits(tokens, state); spent["decode"] += time.perf_counter() - t
        spent["calls"] += 1; return out
    model.encode, model.logits = timed_encode, timed_logits
    try:
        t = time.perf_counter()
        result = transcribe(model, tokenizer, samples, TranscribeOptions())
        spent["total"] = time.perf_counter() - t
    finally:
        del model.encode, model.logits
    spent["ids"] = [s.tokens for s in result.segments]
    spent["text"] = result.text
    return spent

backend = numpy_backend.NumpyBackend
assert numpy_backend._find_pyodide_sgemm() is not None, "scipy sgemm not found"
before = timed_run()
original = backend._sgemm_matmul
backend._sgemm_matmul = candidate_sgemm_matmul
try:
    after = timed_run()
finally:
    backend._sgemm_matmul = original

# The logits product alone: x [1, 384] @ E.t() with E [51864, 384].
E = np.ascontiguousarray(model.decoder.token_embedding.to_numpy())
x = np.random.default_rng(0).standard_normal((1, E.shape[1])).astype(np.float32)
instance = numpy_backend.get_backend("numpy") if hasattr(numpy_backend, "get_backend") else backend()
def per_call(fn, repeat=5):
    t = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - t) / repeat * 1000
logits_before = per_call(lambda: original(instance, x, E.T))
logits_after = per_call(lambda: candidate_sgemm_matmul(instance, x, E.T))
same = np.array_equal(original(instance, x, E.T), candidate_sgemm_matmul(instance, x, E.T))
json.dumps({"before": before, "after": after, "logitsMs": [logits_before, logits_after],
            "logitsIdentical": bool(same), "audioSeconds": len(samples) / 16000})
`);
const figures = JSON.parse(report);
const line = (label, f) => `${label}: total ${f.total.toFixed(2)} s (encoder ${f.encode.toFixed(2)} s, decoder ${f.decode.toFixed(2)} s over ${f.calls} calls = ${(1000 * f.decode / f.calls).toFixed(0)} ms/call)`;
console.log(`clip ${path.basename(clip)} (${figures.audioSeconds.toFixed(2)} s audio), Pyodide ${pyodide.version} under Node ${process.version}`);
console.log(line("current  ", figures.before));
console.log(line("candidate", figures.after));
console.log(`x[1,384] @ E.t() alone: ${figures.logitsMs[0].toFixed(1)} ms -> ${figures.logitsMs[1].toFixed(1)} ms (outputs bit-identical: ${figures.logitsIdentical})`);
console.log(`token ids identical: ${JSON.stringify(figures.before.ids) === JSON.stringify(figures.after.ids)}; text: ${figures.before.text}`);
