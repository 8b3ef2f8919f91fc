/*
 * candle-web worker: Pyodide + numpy + candle_web (+ the wasm SIMD kernels, or scipy's BLAS for
 * the numpy backend) behind one message protocol.
 *
 * The page posts commands {type, id, ...}; every reply carries the same id:
 *   {type: "progress", id, phase, state, ...}  zero or more, while the command runs
 *   {type: "result",   id, ...}                 exactly one on success
 *   {type: "error",    id, error: {name, message, traceback?}}  exactly one on failure
 * Commands: init, eval_twin, models, load, transcribe, embed, generate, text2text, cancel
 * (the COMMANDS table below). `kind` picks the model family and its Python session
 * (candle_web.worker.session_for, in the installed wheel): whisper (the default), bert, llama,
 * t5; each run command belongs to one kind (RUN_COMMANDS).
 *   init {control?: SharedArrayBuffer, backend?: "auto"|"wasm"|"wasm-simd128"|"numpy",
 *         snapshot?: boolean, threads?: "auto"|1|2}
 *       (backend: the page's ?backend=; auto, the default: wasm when the kernels load, else
 *       numpy, saying why; wasm: the kernels or an error; wasm-simd128: the plain SIMD build
 *       even where relaxed SIMD exists; numpy: the reference, for A/B.
 *       snapshot: false (?snapshot=0) starts Python without the vendored memory snapshot;
 *       threads: 2 (?threads=2) runs the wasm backend's encoder and decode steps on two
 *       threads, with a helper worker (web/team_helper.js) on a shared memory; auto, the
 *       default: 2 where the browser reports two or more cores; 1 (?threads=1) one thread. One
 *       thread runs when the second cannot start, saying why in backend.threadsReason)
 *       progress {phase: "runtime"|"kernels"|"wheel"|"packages"|"backend", state, ms} (phases
 *       overlap: the kernels and the wheel are fetched while Pyodide starts)
 *       -> {phases: {phase: ms}, totalMs (wall clock), versions, wheel (its manifest),
 *           snapshot: {used, reason}, backend: {name, requested, variant, label,
 *           kernels: {file, sha256}, reason, threads, threadsReason},
 *           crossOriginIsolated, cancellable}
 *   models {kind?}              -> {models: [{name, description, size}], hint?} (the registry's
 *                                  browser models of that kind; hint: how to get one if none)
 *   load {kind?, model} | {kind?, hf_repo, revision} | {kind, url} (a folder on this origin)
 *       progress {phase: "download", file, loaded, total, cached}, {phase: "verify"},
 *       {phase: "build"} -> {key, cached, downloadedBytes, timingsMs, model: {...}}
 *   transcribe {model, samples: Float32Array (transferred), options, profile?, offset?, prior?}
 *       (offset: seconds added to the segments' times, the samples' place in a longer
 *       recording; prior: segments already final before them, kept in the result and exports)
 *       progress {phase: "transcribe", event: "language"|"window"|"token"|"segment", data,
 *                 heapBytes}
 *       -> {text, segments: [{id, start, end, text, tokens}], exports: {txt, srt, vtt, json},
 *           timings: {elapsedMs, rtf, encodeMs, decodeMs, ...}, input: {samples, sha256},
 *           heap: {startBytes, endBytes}}
 *   Every run command's progress carries heapBytes and its result heap: the size of the
 *   worker's WebAssembly heap (where Python and numpy keep everything) then.
 *   embed {model, sentences: [string]}
 *       -> {vectors: ArrayBuffer (float32 [count, dims], transferred), count, dims, maxTokens,
 *           tokenCounts, inputTokenCounts, truncated, similarity, elapsedMs}
 *   generate {model, prompt, chat, options: {maxTokens, temperature, topK, topP, seed,
 *             repeatPenalty, repeatLastN}}
 *       progress {phase: "generate", event: "prompt"|"token"|"done", data}
 *       -> {text, tokenIds, promptIds, renderedPrompt, stopReason, timings: {tokensPerSecond, ...}}
 *   text2text {model, prompt, options: {maxTokens, temperature, topK, topP, seed}}
 *       progress {phase: "text2text", event: "token"|"done", data}
 *       -> {text, tokenIds, inputTokens, fullInputTokens, truncated, maxInputTokens, stopReason,
 *           timings}
 *
 * Everything is fetched from the serving origin: Pyodide and the wheels from
 * /vendor/pyodide/ (checked by Pyodide against the sha256 in pyodide-lock.json), the
 * candle_web wheel from /vendor/wheels/ and the kernels from /vendor/kernels*.wasm (both
 * checked here against the sha256 in the wheel's manifest).
 *
 * Cancelling: Python runs synchronously inside this worker, so while it computes no message
 * can arrive. The page therefore shares a SharedArrayBuffer (needs crossOriginIsolated) of
 * three int32 slots: [0] is Pyodide's interrupt buffer (the page stores SIGINT there and Python
 * raises KeyboardInterrupt at the next bytecode boundary), [1] is the id the page wants
 * cancelled, [2] the id of the job now in Python. The worker stores [2] and then reads [1];
 * the page stores [1] and then reads [2], raising the interrupt only if the ids match. With
 * sequentially consistent Atomics one side always sees the other, so a cancel that lands
 * just as a job starts is not lost. Ids are therefore positive int32 numbers.
 */
"use strict";

const BASE_URL = new URL("./", self.location.href);
const PYODIDE_INDEX_URL = new URL("vendor/pyodide/", BASE_URL).href;
const WHEEL_DIR_URL = new URL("vendor/wheels/", BASE_URL).href;
const WHEEL_MANIFEST_URL = new URL("manifest.json", WHEEL_DIR_URL).href;
const VENDOR_URL = new URL("vendor/", BASE_URL).href;
const TWIN_ARGUMENTS = ["seed", "m", "k", "n", "repeat"];

const SLOT_INTERRUPT = 0;
const SLOT_CANCEL_ID = 1;
const SLOT_RUNNING_ID = 2;
const NO_JOB = 0;
const PROGRESS_INTERVAL_MS = 100;
// Model files live in the Cache API under keys made of their sha256: a changed file gets a
// new key, an unchanged one is never downloaded twice. Bump the version to drop them all.
// Files without a pinned sha256 (an unknown Hub revision) are not cached.
const MODEL_CACHE_NAME = "candle-web-models-v1";
const DOWNLOAD_PROGRESS_BYTES = 1 << 20; // at most one progress message per MiB (and 100 ms)

importScripts(PYODIDE_INDEX_URL + "pyodide.js");

let pyodide = null;
let pythonWorker = null; // the candle_web.worker module: every Python call goes through it
let runtimePromise = null;
let controlSlots = null; // Int32Array over the page's SharedArrayBuffer, or null
const queuedJobs = new Set(); // ids waiting for their turn in Python
const cancelledBeforeStart = new Set();
// Python calls run one after another: an async step (a download) must not interleave with a
// synchronous computation, and the interrupt slot belongs to one job at a time.
let pythonQueue = Promise.resolve();

class CancelledError extends Error {
  constructor(message) {
    super(message);
    this.name = "Cancelled";
  }
}

// A typed error made in JS (Python's own come through describeError as PythonError).
class TypedError extends Error {
  constructor(name, message) {
    super(message);
    this.name = name;
  }
}

function post(message, transfer = []) {
  self.postMessage(message, transfer);
}

function progress(id, fields) {
  post({ type: "progress", id, ...fields });
}

// Runs `work` as one named phase, reporting start and end with its duration in ms.
async function timedPhase(id, phase, work) {
  progress(id, { phase, state: "start" });
  const start = performance.now();
  const detail = await work();
  const ms = performance.now() - start;
  progress(id, { phase, state: "done", ms, ...(detail || {}) });
  return ms;
}

// Log lines of Pyodide's package loader are chatty; keep them out of the console unless
// something goes wrong.
function quietLoaderOptions() {
  return { messageCallback: () => {}, errorCallback: (text) => console.warn(text), checkIntegrity: true };
}

async function sha256Hex(buffer) {
  const digest = await crypto.subtle.digest("SHA-256", buffer);
  return Array.from(new Uint8Array(digest), (byte) => byte.toString(16).padStart(2, "0")).join("");
}

async function fetchChecked(url, what) {
  const response = await fetch(url, { cache: "no-cache" });
  if (!response.ok) {
    throw new Error(`${what}: ${url} answered ${response.status} ${response.statusText}`);
  }
  return response;
}

// Whether `bytes` have the sha256 a manifest states. crypto.subtle exists only in secure
// contexts (http://127.0.0.1 is one; a LAN address over plain http is not): there the check
// is skipped, the bytes come from the same origin.
async function hasSha256(bytes, expected, what) {
  if (!self.crypto?.subtle) {
    console.warn(`no crypto.subtle: ${what} hash not checked`);
    return true;
  }
  const actual = await sha256Hex(bytes);
  if (actual !== expected) console.warn(`${what}: sha256 ${actual}, the manifest says ${expected}`);
  return actual === expected;
}

// The bytes of a vendored file, checked against the sha256 its manifest states.
async function fetchVerified(url, what, expectedSha256) {
  const bytes = await (await fetchChecked(url, what)).arrayBuffer();
  if (!(await hasSha256(bytes, expectedSha256, what))) {
    throw new Error(`sha256 mismatch for ${what} (${url}): not the file the manifest names (rebuild with scripts/vendor_pyodide.py)`);
  }
  return bytes;
}

// --- the wasm kernels (web/vendor/kernels*.wasm, see candle_web.backend.wasm_abi) -----------

// The smallest module with one function () -> v128 whose body is `body`: WebAssembly has no
// feature query, but validate() on such a module says whether this engine knows its opcodes.
function probeModule(body) {
  const code = [0x00, ...body, 0x0b]; // no locals, the body, end
  return new Uint8Array([
    0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00, // "\0asm", version 1
    0x01, 0x05, 0x01, 0x60, 0x00, 0x01, 0x7b, //       type section: one type, () -> v128
    0x03, 0x02, 0x01, 0x00, //                         function section: one function of type 0
    0x0a, code.length + 2, 0x01, code.length, ...code, // code section: one body
  ]);
}
const V128_CONST_ZERO = [0xfd, 0x0c, ...new Array(16).fill(0)];
// f32x4.relaxed_madd (0xfd 0x105) of three zero vectors: the opcode the relaxed build's FMA uses.
const RELAXED_SIMD_PROBE = probeModule([...V128_CONST_ZERO, ...V128_CONST_ZERO, ...V128_CONST_ZERO, 0xfd, 0x85, 0x02]);
const SIMD128_PROBE = probeModule(V128_CONST_ZERO);
// The kernel builds, best first. `name` is the key in the wheel manifest's `kernels` table
// (scripts/build_wheel.py) and the `variant` Python sees.
const KERNEL_VARIANTS = [
  { name: "relaxed-simd", label: "relaxed SIMD", probe: RELAXED_SIMD_PROBE },
  { name: "simd128", label: "SIMD128", probe: SIMD128_PROBE },
];
const KERNEL_ABI_VERSION = 1;
const KERNEL_JS_MODULE = "candle_kernels"; // `import candle_kernels` in Python
// The page's ?backend=: wasm-simd128 forces the plain SIMD build (what browsers without
// relaxed SIMD run), for A/B and for testing that build in a browser that has both.
const BACKEND_CHOICES = ["auto", "wasm", "wasm-simd128", "numpy"];
const FORCED_VARIANTS = { "wasm-simd128": "simd128" };

// Why the kernels are not used: the start goes on with the numpy backend and says this.
class KernelsUnavailable extends Error {
  constructor(message) {
    super(message);
    this.name = "KernelsUnavailable";
  }
}

// The best build this engine validates, or the one `forced` names (if it validates).
function chooseKernelVariant(forced) {
  const candidates = forced ? KERNEL_VARIANTS.filter((variant) => variant.name === forced) : KERNEL_VARIANTS;
  return candidates.find((variant) => WebAssembly.validate(variant.probe)) ?? null;
}

// Fetches, verifies and compiles the best kernel build this engine runs (or the `forced` one);
// needs no Pyodide, so it runs while Pyodide starts. Resolves {variant, label, file, sha256,
// module}.
async function compileKernels(manifestPromise, forced = null) {
  const variant = chooseKernelVariant(forced);
  if (variant === null) throw new KernelsUnavailable(`this browser has no WebAssembly ${forced ?? "SIMD"}`);
  const manifest = await manifestPromise;
  const entry = manifest.kernels?.[variant.name];
  if (!entry) {
    throw new KernelsUnavailable(`the ${variant.label} kernels are not built (no "${variant.name}" in ${WHEEL_MANIFEST_URL}: run \`make web\`)`);
  }
  let response;
  try {
    response = await fetch(new URL(entry.file, VENDOR_URL).href, { cache: "no-cache" });
  } catch (error) {
    throw new KernelsUnavailable(`${entry.file} could not be fetched: ${error.message}`);
  }
  if (!response.ok) throw new KernelsUnavailable(`${entry.file} answered ${response.status} ${response.statusText}`.trim());
  const bytes = await response.arrayBuffer();
  if (!(await hasSha256(bytes, entry.sha256, entry.file))) {
    throw new KernelsUnavailable(`${entry.file} is not the build the manifest names (sha256 differs: run \`make web\`)`);
  }
  try {
    const module = await WebAssembly.compile(bytes);
    return { variant: variant.name, label: variant.label, file: entry.file, sha256: entry.sha256, module };
  } catch (error) {
    throw new KernelsUnavailable(`${entry.file} does not compile here: ${error.message}`);
  }
}

// Pyodide 0.27.7 does not expose its WebAssembly.Memory (DESIGN.md section 10), but its main
// module imports it as env.memory: watch the instantiations while loadPyodide runs and keep
// that import (the last one seen: a start retried without the snapshot makes a new Memory).
// The kernels then import the same Memory and work on numpy's buffers in place (and keep
// seeing them when the memory grows). instantiateKernels checks it is Pyodide's heap.
function watchForPyodideMemory() {
  const original = { instantiate: WebAssembly.instantiate, instantiateStreaming: WebAssembly.instantiateStreaming };
  let memory = null;
  // Pyodide's memory is never shared: a shared one seen here is the threads build's, which
  // startTeam instantiates at the same time (taking it made the kernels fail their heap check
  // and the page fall back to numpy whenever the team started while Pyodide was loading).
  const keep = (imports) => {
    const candidate = imports?.env?.memory;
    if (candidate instanceof WebAssembly.Memory && !(candidate.buffer instanceof SharedArrayBuffer)) {
      memory = candidate;
    }
  };
  WebAssembly.instantiate = function (source, imports, ...rest) {
    keep(imports);
    return original.instantiate.call(this, source, imports, ...rest);
  };
  WebAssembly.instantiateStreaming = function (source, imports, ...rest) {
    keep(imports);
    return original.instantiateStreaming.call(this, source, imports, ...rest);
  };
  return {
    memory: () => memory,
    stop() {
      WebAssembly.instantiate = original.instantiate;
      WebAssembly.instantiateStreaming = original.instantiateStreaming;
    },
  };
}

// Instantiates the compiled kernels on Pyodide's memory and registers them for Python as
// `candle_kernels` ({exports, variant}); the wasm backend's PyodideHost wraps that module.
async function instantiateKernels(kernels, memory) {
  if (memory === null) throw new KernelsUnavailable("Pyodide's WebAssembly.Memory was not seen while it loaded");
  if (memory.buffer !== pyodide._module.HEAPU8.buffer) {
    throw new KernelsUnavailable("the captured WebAssembly.Memory is not the one Pyodide's heap lives in");
  }
  let instance;
  try {
    instance = await WebAssembly.instantiate(kernels.module, { env: { memory } });
  } catch (error) {
    throw new KernelsUnavailable(`${kernels.file} does not link with Pyodide's memory: ${error.message}`);
  }
  const abi = typeof instance.exports.abi_version === "function" ? instance.exports.abi_version() : null;
  if (abi !== KERNEL_ABI_VERSION) {
    throw new KernelsUnavailable(`${kernels.file} has ABI version ${abi}, this worker speaks ${KERNEL_ABI_VERSION} (stale build: run \`make web\`)`);
  }
  pyodide.registerJsModule(KERNEL_JS_MODULE, { exports: instance.exports, variant: kernels.variant });
}

// --- two threads (the default where there are two cores; ?threads=1 turns it off): the threads
// build on a shared memory, a helper worker ------------------------------------------------

// Offsets in the shared memory; candle_web.backend.wasm_team uses the same (CTRL_OFFSET,
// HELPER_SCRATCH_OFFSET) and gets them from `layout`: nothing below 1 MiB (the null pointer,
// wasm-ld's unused stack region), the control block, the helper's scratch, then the arena.
const TEAM_CTRL_OFFSET = 1 << 20;
const TEAM_HELPER_SCRATCH_OFFSET = TEAM_CTRL_OFFSET + 64;
const TEAM_ALIVE_SLOT = 4; // TeamCtrl.alive, in int32 slots (web/kernels/team.h)
const TEAM_MAX_PAGES = 32768; // the module's declared maximum: 2 GiB
const TEAM_INITIAL_PAGES = 1024; // 64 MiB; grown as the weights are copied in
const TEAM_HELPER_TIMEOUT_MS = 10000;
const TEAM_JS_MODULE = "candle_team"; // `import candle_team` in Python (wasm_team.py)

// Why the second thread does not run: the start goes on with one.
class TeamUnavailable extends Error {
  constructor(message) {
    super(message);
    this.name = "TeamUnavailable";
  }
}

// Fetches, verifies and compiles the threads build, makes the shared memory and starts the
// helper in team_worker; needs no Pyodide, so it runs while Pyodide starts. Resolves {file,
// sha256, memory, instance, helper, layout}.
async function startTeam(manifestPromise) {
  if (!self.crossOriginIsolated || typeof SharedArrayBuffer === "undefined") {
    throw new TeamUnavailable("the page is not cross-origin isolated (no SharedArrayBuffer)");
  }
  if (!WebAssembly.validate(RELAXED_SIMD_PROBE)) throw new TeamUnavailable("this browser has no relaxed SIMD (the threads build uses it)");
  const manifest = await manifestPromise;
  const entry = manifest.kernels?.threads;
  if (!entry) throw new TeamUnavailable(`the threads kernels are not built (no "threads" in ${WHEEL_MANIFEST_URL}: run \`make web\`)`);
  const response = await fetch(new URL(entry.file, VENDOR_URL).href, { cache: "no-cache" });
  if (!response.ok) throw new TeamUnavailable(`${entry.file} answered ${response.status} ${response.statusText}`.trim());
  const bytes = await response.arrayBuffer();
  if (!(await hasSha256(bytes, entry.sha256, entry.file))) {
    throw new TeamUnavailable(`${entry.file} is not the build the manifest names (sha256 differs: run \`make web\`)`);
  }
  let module, instance, memory;
  try {
    module = await WebAssembly.compile(bytes);
    memory = new WebAssembly.Memory({ initial: TEAM_INITIAL_PAGES, maximum: TEAM_MAX_PAGES, shared: true });
    instance = await WebAssembly.instantiate(module, { env: { memory } });
  } catch (error) {
    throw new TeamUnavailable(`${entry.file} does not load here: ${error.message}`);
  }
  if (instance.exports.abi_version() !== KERNEL_ABI_VERSION) {
    throw new TeamUnavailable(`${entry.file} has ABI version ${instance.exports.abi_version()}, this worker speaks ${KERNEL_ABI_VERSION} (stale build: run \`make web\`)`);
  }
  const scratchBytes = instance.exports.scratch_bytes();
  const layout = {
    ctrl: TEAM_CTRL_OFFSET,
    helperScratch: TEAM_HELPER_SCRATCH_OFFSET,
    heapStart: TEAM_HELPER_SCRATCH_OFFSET + scratchBytes,
  };
  const helper = new Worker(new URL("team_helper.js", BASE_URL).href);
  await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new TeamUnavailable(`the helper worker did not start in ${TEAM_HELPER_TIMEOUT_MS / 1000} s`)), TEAM_HELPER_TIMEOUT_MS);
    helper.onmessage = (event) => {
      if (event.data?.type === "ready") {
        clearTimeout(timer);
        resolve();
      } else if (event.data?.type === "error") {
        clearTimeout(timer);
        reject(new TeamUnavailable(event.data.message));
      }
    };
    helper.onerror = (event) => {
      clearTimeout(timer);
      reject(new TeamUnavailable(`the helper worker failed: ${event.message ?? "no message"}`));
    };
    helper.postMessage({ module, memory, ctrl: layout.ctrl, scratch: layout.helperScratch });
  }).catch((error) => {
    helper.terminate();
    throw error;
  });
  // "ready" comes just before team_worker; wait (this is a worker: Atomics.wait may block)
  // until it has said it is in.
  const alive = new Int32Array(memory.buffer, layout.ctrl, 8);
  Atomics.wait(alive, TEAM_ALIVE_SLOT, 0, 2000);
  if (Atomics.load(alive, TEAM_ALIVE_SLOT) !== 1) {
    helper.terminate();
    throw new TeamUnavailable("the helper worker did not enter its loop");
  }
  return { file: entry.file, sha256: entry.sha256, memory, instance, helper, layout };
}

// Registers the team for Python as `candle_team` (wasm_team.PyodideTeamHost reads it): the
// exports, the layout, and copies between Pyodide's heap (numpy's buffers, by pointer) and
// the shared memory.
function registerTeam(team) {
  const { memory, instance, layout } = team;
  const heap = () => pyodide._module.HEAPU8; // re-read: Pyodide's heap may have grown
  pyodide.registerJsModule(TEAM_JS_MODULE, {
    exports: instance.exports,
    layout,
    copyIn(source, offset, n) {
      new Uint8Array(memory.buffer, offset, n).set(heap().subarray(source, source + n));
    },
    copyOut(offset, target, n) {
      heap().set(new Uint8Array(memory.buffer, offset, n), target);
    },
    ensure(end) {
      const have = memory.buffer.byteLength;
      if (end > have) memory.grow(Math.ceil((end - have) / 65536));
    },
  });
}

// --- start-up -------------------------------------------------------------------------------

// --- the candle_web wheel, unpacked in JS -----------------------------------------------------

const ZIP_END_SIGNATURE = 0x06054b50; // end of central directory record
const ZIP_ENTRY_SIGNATURE = 0x02014b50; // central directory file header
const ZIP_LOCAL_SIGNATURE = 0x04034b50; // local file header
const ZIP_STORED = 0;
const ZIP_DEFLATED = 8;
const ZIP_END_MIN_BYTES = 22;

function inflateRaw(raw) {
  const inflated = new Blob([raw]).stream().pipeThrough(new DecompressionStream("deflate-raw"));
  return new Response(inflated).arrayBuffer().then((buffer) => new Uint8Array(buffer));
}

// The files of a zip archive (no zip64, no encryption: scripts/build_wheel.py writes stored or
// deflated entries) as [{name, data: Uint8Array}], inflated with the browser's own
// DecompressionStream, all at once: this runs while Pyodide's start keeps the thread busy, and
// one await per file would wait behind its long tasks one by one. The caller checked the
// archive's sha256, so each entry's CRC is not checked again.
async function unzipEntries(buffer) {
  const bytes = new Uint8Array(buffer);
  const view = new DataView(buffer);
  let end = bytes.length - ZIP_END_MIN_BYTES;
  while (end >= 0 && view.getUint32(end, true) !== ZIP_END_SIGNATURE) end -= 1;
  if (end < 0) throw new Error("not a zip archive (no end of central directory)");
  const count = view.getUint16(end + 10, true);
  let at = view.getUint32(end + 16, true);
  const decoder = new TextDecoder();
  const entries = [];
  for (let i = 0; i < count; i += 1) {
    if (view.getUint32(at, true) !== ZIP_ENTRY_SIGNATURE) throw new Error(`zip entry ${i}: bad central directory header`);
    const method = view.getUint16(at + 10, true);
    const compressedSize = view.getUint32(at + 20, true);
    const nameLength = view.getUint16(at + 28, true);
    const extraLength = view.getUint16(at + 30, true);
    const commentLength = view.getUint16(at + 32, true);
    const localOffset = view.getUint32(at + 42, true);
    const name = decoder.decode(bytes.subarray(at + 46, at + 46 + nameLength));
    at += 46 + nameLength + extraLength + commentLength;
    if (view.getUint32(localOffset, true) !== ZIP_LOCAL_SIGNATURE) throw new Error(`${name}: bad local header`);
    const dataStart = localOffset + 30 + view.getUint16(localOffset + 26, true) + view.getUint16(localOffset + 28, true);
    const raw = bytes.subarray(dataStart, dataStart + compressedSize);
    if (name.endsWith("/")) continue; // a directory entry
    if (method === ZIP_STORED) {
      entries.push({ name, data: Promise.resolve(raw) });
    } else if (method === ZIP_DEFLATED) {
      entries.push({ name, data: inflateRaw(raw) });
    } else {
      throw new Error(`${name}: zip compression method ${method} is not supported`);
    }
  }
  const data = await Promise.all(entries.map((entry) => entry.data));
  return entries.map((entry, i) => ({ name: entry.name, data: data[i] }));
}

// Installs the candle_web wheel by writing its files into site-packages: all an installer does
// for a pure-Python wheel without scripts or data files (build_wheel.py makes exactly that),
// with no micropip and no Python code run. Inflating happens before Pyodide is needed.
async function unpackWheel(bytes) {
  const entries = await unzipEntries(bytes);
  for (const { name } of entries) {
    if (name.startsWith("/") || name.split("/").some((part) => part === ".." || part === "")) {
      throw new Error(`candle_web wheel: unsafe path ${JSON.stringify(name)}`);
    }
  }
  return entries;
}

function installWheelFiles(entries) {
  const sitePackages = pyodide._api.sitepackages ?? pyodide.runPython("import site; site.getsitepackages()[0]");
  for (const { name, data } of entries) {
    const path = `${sitePackages}/${name}`;
    pyodide.FS.mkdirTree(path.slice(0, path.lastIndexOf("/")));
    pyodide.FS.writeFile(path, data);
  }
  // The path finders cache directory listings; new files must be seen at the next import.
  pyodide.runPython("import importlib; importlib.invalidate_caches()");
}

// The Python half of choosing the backend: CANDLE_WEB_BACKEND before candle_web's settings
// are read (reload_settings() in case they were); for wasm, wasm_backend.install() builds the
// host on the registered kernels and registers the backend. Returns the backend Device.cpu()
// then uses, so a choice that did not take is seen here.
const SELECT_BACKEND_PY = `
def _select_backend(name):
    import os
    from candle_web.backend.settings import reload_settings
    os.environ["CANDLE_WEB_BACKEND"] = name
    reload_settings()
    if name == "wasm":
        from candle_web.backend.wasm_backend import install
        install()  # the host on the registered candle_kernels module; raises naming what fails
    from candle_web import Device
    from candle_web.backend import backend_for
    return backend_for(Device.cpu()).name
`;

// The wasm backend's decode-step parts run on the registered team from now on.
const ATTACH_TEAM_PY = `
from candle_web.backend.wasm_backend import install
from candle_web.backend.wasm_team import PyodideTeamHost, pyodide_team_module
install().attach_team(PyodideTeamHost(pyodide_team_module()))
`;

function attachPythonTeam() {
  pyodide.runPython(ATTACH_TEAM_PY);
}

function selectPythonBackend(name) {
  const select = pyodide.runPython(`${SELECT_BACKEND_PY}\n_select_backend`);
  try {
    return select(name);
  } finally {
    select.destroy();
  }
}

function pythonVersions() {
  const versions = pyodide.runPython(`
import sys, numpy, candle_web
{"python": sys.version.split()[0], "numpy": numpy.__version__,
 "scipy": sys.modules["scipy"].__version__ if "scipy" in sys.modules else None,
 "candle_web": getattr(candle_web, "__version__", "unknown")}
`);
  try {
    return { pyodide: pyodide.version, ...versions.toJs({ dict_converter: Object.fromEntries }) };
  } finally {
    versions.destroy();
  }
}

// Python's own state that every interpreter restored from one snapshot would share: renewed
// from this browser's randomness (os.urandom is crypto.getRandomValues), and the runtime that
// sys._emscripten_info names is this one, not the Node that made the snapshot.
const AFTER_SNAPSHOT_PY = `
import random, sys, tempfile
import js
random.seed()
tempfile._name_sequence = None
_info = sys._emscripten_info
sys._emscripten_info = type(_info)((_info.emscripten_version, js.navigator.userAgent,
                                    _info.pthreads, _info.shared_memory))
del _info
`;

// Starts Pyodide: from the vendored memory snapshot when the manifest has one (the interpreter
// is restored, not started: ~2 s less), else, or when the snapshot fails, the usual way.
// Returns {pyodide, snapshot: whether it was used, snapshotReason: why not, or null}.
async function loadRuntime(manifest) {
  const options = {
    indexURL: PYODIDE_INDEX_URL,
    stdout: (line) => console.log(`[python] ${line}`),
    stderr: (line) => console.warn(`[python] ${line}`),
  };
  let snapshotReason = manifest === null ? "not asked for" : "not vendored";
  const entry = manifest?.snapshot;
  if (entry) {
    // The download and the hash run while loadPyodide fetches and compiles the runtime.
    const bytes = fetchVerified(new URL(entry.file, VENDOR_URL).href, entry.file, entry.sha256)
      .then((buffer) => new Uint8Array(buffer));
    try {
      const restored = await loadPyodide({ ...options, _loadSnapshot: bytes });
      restored.runPython(AFTER_SNAPSHOT_PY);
      return { pyodide: restored, snapshot: true, snapshotReason: null };
    } catch (error) {
      snapshotReason = describeError(error).message;
      console.warn(`candle-web: the Pyodide snapshot was not used, Python starts the usual way: ${snapshotReason}`);
    }
  }
  return { pyodide: await loadPyodide(options), snapshot: false, snapshotReason };
}

// Runs `work` as the named phase of a start (progress start/done with ms, see timedPhase) and
// keeps its duration in `phases`; returns what `work` returns. Phases may overlap.
async function startPhase(id, phases, phase, work) {
  progress(id, { phase, state: "start" });
  const start = performance.now();
  let state = "failed"; // a phase that throws still has its duration (the kernels' may)
  try {
    const value = await work();
    state = "done";
    return value;
  } finally {
    phases[phase] = performance.now() - start;
    progress(id, { phase, state, ms: phases[phase] });
  }
}

// The start: Pyodide, the kernels and the wheel are fetched at the same time; numpy (and
// scipy, only when the numpy backend runs: its BLAS is what makes that backend's matmul fast)
// loads while the wheel is unpacked. `choice`: "auto" (wasm when the kernels load, else numpy
// with the reason), "wasm" or "wasm-simd128" (the kernels or an error) or "numpy" (the
// reference, for A/B). `useSnapshot`: restore the vendored Pyodide snapshot when there is one.
async function startRuntime(id, choice, useSnapshot, threads = "auto") {
  const started = performance.now();
  const phases = {};
  const manifestPromise = fetchChecked(WHEEL_MANIFEST_URL, "wheel manifest").then((response) => response.json());
  manifestPromise.catch(() => {}); // awaited below; this only keeps it from counting as unhandled
  const kernelsPromise = choice === "numpy" ? null
    : startPhase(id, phases, "kernels", () => compileKernels(manifestPromise, FORCED_VARIANTS[choice]));
  kernelsPromise?.catch(() => {});
  const cores = self.navigator?.hardwareConcurrency ?? 1;
  const wantTeam = threads === 2 || (threads === "auto" && cores >= 2);
  const teamPromise = wantTeam && choice !== "numpy" && choice !== "wasm-simd128"
    ? startPhase(id, phases, "threads", () => startTeam(manifestPromise)) : null;
  teamPromise?.catch(() => {});
  const wheelPromise = startPhase(id, phases, "wheel", async () => {
    const manifest = await manifestPromise;
    const bytes = await fetchVerified(new URL(manifest.wheel, WHEEL_DIR_URL).href, manifest.wheel, manifest.sha256);
    return { manifest, entries: await unpackWheel(bytes) };
  });
  wheelPromise.catch(() => {});

  const memoryWatch = watchForPyodideMemory();
  let runtime = null;
  await startPhase(id, phases, "runtime", async () => {
    try {
      runtime = await loadRuntime(useSnapshot ? await manifestPromise : null);
      pyodide = runtime.pyodide;
    } finally {
      memoryWatch.stop();
    }
    if (controlSlots !== null) {
      pyodide.setInterruptBuffer(new Int32Array(controlSlots.buffer, 0, 1));
    }
  });

  let kernels = null;
  let reason = choice === "numpy" ? "?backend=numpy asked for the numpy reference" : null;
  if (kernelsPromise !== null) {
    try {
      kernels = await kernelsPromise;
      await instantiateKernels(kernels, memoryWatch.memory());
    } catch (error) {
      if (!(error instanceof KernelsUnavailable)) throw error;
      kernels = null;
      reason = error.message;
    }
  }
  const fallBack = (why) => {
    if (choice !== "auto") throw new TypedError("KernelsUnavailable", `?backend=${choice} needs the wasm kernels: ${why}`);
    console.warn(`candle-web: the wasm kernels are not used, numpy runs instead: ${why}`);
  };
  if (kernels === null && reason !== null && choice !== "numpy") fallBack(reason);

  const packages = kernels === null ? ["numpy", "scipy"] : ["numpy"];
  const packagesPromise = startPhase(id, phases, "packages", async () => {
    await pyodide.loadPackage(packages, quietLoaderOptions());
  });
  const { manifest, entries } = await wheelPromise;
  installWheelFiles(entries);
  await packagesPromise;

  let backend = null;
  await startPhase(id, phases, "backend", async () => {
    pythonWorker = pyodide.pyimport("candle_web.worker");
    if (kernels !== null) {
      try {
        backend = selectPythonBackend("wasm");
      } catch (error) {
        // The kernels loaded but Python could not use them: numpy (with its BLAS) instead.
        reason = `the wasm backend did not start: ${describeError(error).message}`;
        kernels = null;
        fallBack(reason);
        await pyodide.loadPackage("scipy", quietLoaderOptions());
      }
    }
    if (kernels === null) {
      pyodide.runPython("import scipy.linalg.blas");
      backend = selectPythonBackend("numpy");
    }
  });
  let team = null;
  let threadsReason = null;
  if (threads === 1) threadsReason = "?threads=1 asked for one thread";
  else if (!wantTeam) threadsReason = `the browser reports ${cores} core${cores === 1 ? "" : "s"}`;
  else if (kernels === null) threadsReason = "the two threads need the wasm backend";
  else if (teamPromise === null) threadsReason = `?backend=${choice} runs one thread`;
  else {
    try {
      team = await teamPromise;
      registerTeam(team);
      attachPythonTeam();
    } catch (error) {
      team?.helper.terminate();
      team = null;
      threadsReason = describeError(error).message;
      console.warn(`candle-web: one thread runs, not two: ${threadsReason}`);
    }
  }
  return {
    phases,
    totalMs: performance.now() - started,
    versions: pythonVersions(),
    wheel: manifest,
    snapshot: { used: runtime.snapshot, reason: runtime.snapshotReason },
    backend: {
      name: backend,
      requested: choice,
      variant: kernels?.variant ?? null,
      label: kernels?.label ?? null,
      kernels: kernels === null ? null : { file: kernels.file, sha256: kernels.sha256 },
      reason,
      threads: team === null ? 1 : 2,
      threadsReason,
      threadsKernels: team === null ? null : { file: team.file, sha256: team.sha256 },
    },
    crossOriginIsolated: self.crossOriginIsolated === true,
    cancellable: controlSlots !== null,
  };
}

function checkBackendChoice(value) {
  const choice = value ?? "auto";
  if (!BACKEND_CHOICES.includes(choice)) {
    throw new TypedError("FormatError", `init: \`backend\` (the page's ?backend=) must be one of ${BACKEND_CHOICES.join(", ")}, got ${JSON.stringify(value)}`);
  }
  return choice;
}

function checkThreadsChoice(value) {
  if (value === undefined || value === null) return "auto";
  if (value !== 1 && value !== 2 && value !== "auto") {
    throw new TypedError("FormatError", `init: \`threads\` (the page's ?threads=) must be 1, 2 or auto, got ${JSON.stringify(value)}`);
  }
  return value;
}

function checkSnapshotChoice(value) {
  if (value === undefined || value === null) return true;
  if (typeof value !== "boolean") {
    throw new TypedError("FormatError", `init: \`snapshot\` (the page's ?snapshot=0) must be true or false, got ${JSON.stringify(value)}`);
  }
  return value;
}

// The first caller's choices win: the runtime starts once per worker.
function ensureRuntime(id, backend = undefined, snapshot = undefined, threads = undefined) {
  if (runtimePromise === null) {
    runtimePromise = startRuntime(id, checkBackendChoice(backend), checkSnapshotChoice(snapshot), checkThreadsChoice(threads));
    // A failed start may be retried by a later init.
    runtimePromise.catch(() => { runtimePromise = null; });
  }
  return runtimePromise;
}

// Runs one Python job with the interrupt slot armed for it; see the header comment.
function runPythonJob(id, job) {
  queuedJobs.add(id);
  const run = async () => {
    queuedJobs.delete(id);
    if (cancelledBeforeStart.delete(id)) {
      throw new CancelledError(`job ${id} was cancelled before it started`);
    }
    if (controlSlots !== null) {
      Atomics.store(controlSlots, SLOT_RUNNING_ID, Number.isInteger(id) ? id : NO_JOB);
    }
    try {
      if (controlSlots !== null) {
        if (Atomics.load(controlSlots, SLOT_CANCEL_ID) === id) {
          throw new CancelledError(`job ${id} was cancelled before it started`);
        }
        Atomics.store(controlSlots, SLOT_INTERRUPT, 0); // drop a stale signal for another job
      }
      return await job();
    } finally {
      if (controlSlots !== null) {
        Atomics.store(controlSlots, SLOT_RUNNING_ID, NO_JOB);
        Atomics.store(controlSlots, SLOT_INTERRUPT, 0);
      }
    }
  };
  const result = pythonQueue.then(run, run);
  pythonQueue = result.catch(() => {});
  return result;
}

function throttledProgress(id, phase) {
  let lastPost = -Infinity;
  return (done, total) => {
    const now = performance.now();
    if (done === 1 || done === total || now - lastPost >= PROGRESS_INTERVAL_MS) {
      lastPost = now;
      progress(id, { phase, state: "running", done, total });
    }
  };
}

// Copies a numpy array out of the wasm heap into a standalone ArrayBuffer for transfer.
function numpyToArrayBuffer(arrayProxy) {
  const view = arrayProxy.getBuffer();
  try {
    if (!view.c_contiguous) {
      throw new Error("expected a C-contiguous array from Python");
    }
    const bytes = new Uint8Array(view.data.buffer, view.data.byteOffset, view.data.byteLength);
    return bytes.slice().buffer;
  } finally {
    view.release();
  }
}

// A Python reply (result JSON, {name: numpy array}) as {payload, transfer}: each array becomes
// an ArrayBuffer under its name in the payload, transferred to the page rather than copied.
function takeReply(reply) {
  const payload = JSON.parse(reply.get(0));
  const arrays = reply.get(1);
  const transfer = [];
  try {
    for (const name of arrays) {
      const array = arrays.get(name);
      try {
        payload[name] = numpyToArrayBuffer(array);
      } finally {
        array.destroy();
      }
      transfer.push(payload[name]);
    }
  } finally {
    arrays.destroy();
  }
  return { payload, transfer };
}

// Destroys the PyProxies a job made (null where it never got that far).
function destroyAll(...proxies) {
  for (const proxy of proxies) {
    if (proxy !== null && proxy !== undefined && typeof proxy.destroy === "function") proxy.destroy();
  }
}

function isCancelRequested(id) {
  return controlSlots !== null && Atomics.load(controlSlots, SLOT_CANCEL_ID) === id;
}

// The Python session of a model kind (undefined or null: the default kind); unknown kinds
// raise UnsupportedError there. A PyProxy: destroy it after use.
function sessionFor(kind) {
  return pythonWorker.session_for(kind ?? null);
}

// --- commands -------------------------------------------------------------------------------

async function handleInit(message) {
  if (message.control instanceof SharedArrayBuffer && controlSlots === null && pyodide === null) {
    controlSlots = new Int32Array(message.control);
  }
  const summary = await ensureRuntime(message.id, message.backend ?? undefined, message.snapshot ?? undefined, message.threads ?? undefined);
  return { payload: summary };
}

async function handleEvalTwin(message) {
  await ensureRuntime(message.id);
  return runPythonJob(message.id, async () => {
    let request = null;
    let reply = null;
    try {
      // Only the fields the page set: run_twin owns the defaults.
      const fields = TWIN_ARGUMENTS.filter((name) => message[name] !== undefined).map((name) => [name, message[name]]);
      request = pyodide.toPy(Object.fromEntries(fields));
      reply = pythonWorker.eval_twin(request, throttledProgress(message.id, "eval_twin"));
      return takeReply(reply);
    } finally {
      destroyAll(reply, request);
    }
  });
}

// --- models and load (every kind) -----------------------------------------------------------

async function handleModels(message) {
  await ensureRuntime(message.id);
  const session = sessionFor(message.kind);
  try {
    return { payload: JSON.parse(session.models_json()) };
  } finally {
    session.destroy();
  }
}

function cacheKeyFor(file) {
  // Content-addressed: the key is the sha256 (an http(s) URL, as the Cache API wants), so the
  // same bytes are found again whichever source (this server, the Hub) delivered them.
  return new URL(`model-cache/sha256/${file.sha256}/${encodeURIComponent(file.name)}`, BASE_URL).href;
}

async function openModelCache() {
  // No Cache API (e.g. an insecure context): download every time, say so once.
  if (!self.caches) {
    console.warn("no Cache API here: model files will be downloaded on every visit");
    return null;
  }
  return caches.open(MODEL_CACHE_NAME);
}

// Streams one response body into the numpy buffer `target` (a PyProxy of a uint8 array of
// exactly `size` bytes), posting byte-level progress. Checks the cancel slot between chunks.
async function streamInto(id, response, target, size, fileName, cached, abort) {
  const reader = response.body.getReader();
  let loaded = 0;
  let lastPostBytes = -Infinity;
  let lastPostTime = -Infinity;
  const report = (force) => {
    const now = performance.now();
    if (force || (loaded - lastPostBytes >= DOWNLOAD_PROGRESS_BYTES && now - lastPostTime >= PROGRESS_INTERVAL_MS)) {
      lastPostBytes = loaded;
      lastPostTime = now;
      progress(id, { phase: "download", state: "running", file: fileName, loaded, total: size, cached });
    }
  };
  report(true);
  for (;;) {
    if (isCancelRequested(id)) {
      abort();
      await reader.cancel().catch(() => {});
      throw new CancelledError(`load cancelled while reading ${fileName}`);
    }
    const { done, value } = await reader.read();
    if (done) break;
    if (loaded + value.byteLength > size) {
      await reader.cancel().catch(() => {});
      throw new TypedError("FormatError", `${fileName}: more than the expected ${size} bytes arrived`);
    }
    // A fresh view per chunk: the wasm memory may have grown (and moved) since the last one.
    const view = target.getBuffer("u8");
    try {
      view.data.set(value, loaded);
    } finally {
      view.release();
    }
    loaded += value.byteLength;
    report(false);
  }
  if (loaded !== size) {
    throw new TypedError("FormatError", `${fileName}: got ${loaded} bytes, expected ${size}`);
  }
  report(true);
}

async function digestOf(target) {
  const view = target.getBuffer("u8");
  try {
    // digest() copies the bytes before it returns its promise, so the view can go at once.
    const pending = crypto.subtle.digest("SHA-256", view.data);
    view.release();
    const digest = await pending;
    return Array.from(new Uint8Array(digest), (byte) => byte.toString(16).padStart(2, "0")).join("");
  } catch (error) {
    view.release();
    throw error;
  }
}

function expectedSize(file, response) {
  const header = response.headers.get("Content-Length");
  const announced = header === null ? null : Number(header);
  if (file.size !== null && announced !== null && announced !== file.size) {
    throw new TypedError("FormatError", `${file.name}: the server announces ${announced} bytes, the registry ${file.size}`);
  }
  const size = file.size ?? announced;
  if (!Number.isSafeInteger(size) || size <= 0) {
    throw new TypedError("FormatError", `${file.name}: unknown or empty size (Content-Length ${header})`);
  }
  return size;
}

async function fetchModelFile(id, key, file, cache, session) {
  const cacheKey = cacheKeyFor(file);
  const controller = new AbortController();
  const abort = () => controller.abort();
  let response = cache && file.sha256 ? await cache.match(cacheKey) : undefined;
  const cached = response !== undefined;
  let cacheWrite = null;
  if (!cached) {
    try {
      response = await fetch(new URL(file.url, BASE_URL).href, { signal: controller.signal, cache: "no-store" });
    } catch (error) {
      if (isCancelRequested(id)) throw new CancelledError(`load cancelled before ${file.name}`);
      throw new TypedError("NetworkError", `could not fetch ${file.url}: ${error.message} (offline, or the host is blocked)`);
    }
    if (!response.ok) {
      const hint = response.status === 404 ? " (is the model fetched into the server's cache? `make models`)" : "";
      throw new TypedError("ModelNotFound", `${file.url} answered ${response.status} ${response.statusText}${hint}`);
    }
    if (cache && file.sha256) {
      // One branch fills the buffer, the other goes to the cache; dropped again if the hash fails.
      const [forBuffer, forCache] = response.body.tee();
      cacheWrite = cache.put(cacheKey, new Response(forCache, { headers: { "Content-Type": "application/octet-stream" } }));
      cacheWrite.catch(() => {});
      response = new Response(forBuffer, { headers: response.headers });
    }
  }
  const size = expectedSize(file, response);
  const target = session.allocate_file(key, file.name, size);
  try {
    await streamInto(id, response, target, size, file.name, cached, abort);
    if (cacheWrite !== null) await cacheWrite;
    if (file.sha256) {
      progress(id, { phase: "verify", state: "running", file: file.name });
      const actual = await digestOf(target);
      if (actual !== file.sha256) {
        if (cache) await cache.delete(cacheKey);
        throw new TypedError("HashMismatch", `${file.name}: sha256 ${actual}, expected ${file.sha256}${cached ? " (cached copy dropped: load again)" : ""}`);
      }
    }
  } finally {
    target.destroy();
  }
  return { cached, bytes: size };
}

async function handleLoad(message) {
  await ensureRuntime(message.id);
  const id = message.id;
  return runPythonJob(id, async () => {
    const session = sessionFor(message.kind);
    let key = null;
    try {
      const manifest = JSON.parse(session.manifest_json(message.model ?? null, message.hf_repo ?? null,
                                                        message.revision ?? null, message.url ?? null));
      key = manifest.key;
      const cache = await openModelCache();
      const timingsMs = {};
      let downloadedBytes = 0;
      let allCached = true;
      timingsMs.download = await timedPhase(id, "download", async () => {
        for (const file of manifest.files) {
          const { cached, bytes } = await fetchModelFile(id, key, file, cache, session);
          allCached = allCached && cached;
          if (!cached) downloadedBytes += bytes;
        }
        return { cached: allCached };
      });
      if (isCancelRequested(id)) throw new CancelledError("load cancelled before the build");
      let summary = null;
      timingsMs.build = await timedPhase(id, "build", async () => {
        summary = JSON.parse(session.build_model(key));
      });
      const verified = manifest.files.every((file) => Boolean(file.sha256));
      return { payload: { key, cached: allCached, verified, downloadedBytes, source: manifest.source, timingsMs, model: summary } };
    } catch (error) {
      if (key !== null) session.discard_incoming(key);
      throw error;
    } finally {
      session.destroy();
    }
  });
}

// --- run commands: transcribe (Whisper), embed (BERT), generate (LLaMA), text2text (T5) -----

// Copies the page's samples into a float32 numpy array the session allocates: one copy into
// the wasm heap (unavoidable), which Python then reads in place.
function samplesIntoPython(session, samples) {
  const target = session.allocate_samples(samples.length);
  const view = target.getBuffer("u8");
  try {
    view.data.set(new Uint8Array(samples.buffer, samples.byteOffset, samples.byteLength));
  } finally {
    view.release();
  }
  return target;
}

// Each run command: its session's kind, a check of the message's JS types (made before the
// runtime is awaited), and the request: the keyword arguments of the session's compute.
const RUN_COMMANDS = {
  transcribe: {
    kind: "whisper",
    check: (m) => {
      if (!(m.samples instanceof Float32Array)) {
        throw new TypedError("FormatError", "transcribe: `samples` must be a Float32Array of 16 kHz mono audio");
      }
    },
    request: (m) => ({ options: m.options || null, profile: m.profile === true,
                       offset: m.offset ?? null, prior: m.prior ?? null }),
    samples: true,
  },
  embed: {
    kind: "bert",
    check: (m) => {
      if (!Array.isArray(m.sentences)) throw new TypedError("FormatError", "embed: `sentences` must be an array of strings");
    },
    request: (m) => ({ sentences: m.sentences }),
  },
  generate: {
    kind: "llama",
    request: (m) => ({ prompt: m.prompt ?? null, chat: m.chat === true, options: m.options || null }),
  },
  text2text: {
    kind: "t5",
    request: (m) => ({ prompt: m.prompt ?? null, options: m.options || null }),
  },
};

// The wasm heap's size in bytes (it grows, never shrinks: the high-water mark of the job).
function wasmHeapBytes() {
  return pyodide?._module?.HEAP8?.buffer?.byteLength ?? null;
}

// Runs a model with its session: Python calls onEvent(kind, json) per streamed event, which
// becomes a progress message {phase: the command, event, data, heapBytes}; the reply is the
// result, with the heap's size before and after.
async function handleRun(message) {
  const command = RUN_COMMANDS[message.type];
  command.check?.(message);
  await ensureRuntime(message.id);
  const id = message.id;
  return runPythonJob(id, async () => {
    const session = sessionFor(command.kind);
    let request = null;
    let samples = null;
    let reply = null;
    // The event's own fields go under `data`: a segment has an `id` of its own.
    const onEvent = (event, json) => progress(id, { phase: message.type, event, data: JSON.parse(json), heapBytes: wasmHeapBytes() });
    const startBytes = wasmHeapBytes();
    try {
      request = pyodide.toPy(command.request(message));
      if (command.samples) {
        samples = samplesIntoPython(session, message.samples);
        request.set("samples", samples);
      }
      reply = session.run(message.model ?? null, request, onEvent);
      const taken = takeReply(reply);
      taken.payload.heap = { startBytes, endBytes: wasmHeapBytes() };
      return taken;
    } finally {
      destroyAll(reply, samples, request, session);
    }
  });
}

// Cancels a job that has not reached Python yet (the running one is stopped by the page
// through the shared interrupt slot, since this handler cannot run while Python does).
async function handleCancel(message) {
  const target = message.target;
  const queued = queuedJobs.has(target);
  if (queued) cancelledBeforeStart.add(target);
  return { payload: { target, queued } };
}

// The dispatch table: add a command by adding an entry. A handler gets the message and
// returns {payload, transfer?}; throwing produces the error reply.
const COMMANDS = {
  init: handleInit,
  eval_twin: handleEvalTwin,
  models: handleModels,
  load: handleLoad,
  transcribe: handleRun,
  embed: handleRun,
  generate: handleRun,
  text2text: handleRun,
  cancel: handleCancel,
};

function describeError(error) {
  if (error instanceof CancelledError) {
    return { name: "Cancelled", message: error.message };
  }
  if (error instanceof TypedError) {
    return { name: error.name, message: error.message };
  }
  // Pyodide's PythonError: `type` is the Python exception class name, the message is the
  // formatted traceback whose last line is "Type: message".
  if (error && error.constructor && error.constructor.name === "PythonError") {
    const lines = String(error.message).trim().split("\n");
    const lastLine = lines[lines.length - 1];
    if (error.type === "KeyboardInterrupt") {
      return { name: "Cancelled", message: "cancelled by the page", traceback: error.message };
    }
    // "candle_web.core.errors.ModelNotFound: text" -> "text": the type is already in `name`.
    const qualified = /^([\w.]+): ([\s\S]*)$/.exec(lastLine);
    const message = qualified && qualified[1].split(".").pop() === error.type ? qualified[2] : lastLine;
    return { name: error.type, message, traceback: error.message };
  }
  return { name: (error && error.name) || "Error", message: String((error && error.message) || error) };
}

self.onmessage = async (event) => {
  const message = event.data || {};
  const id = message.id;
  const handler = COMMANDS[message.type];
  if (handler === undefined) {
    post({ type: "error", id, error: { name: "UnknownCommand", message: `unknown command type ${JSON.stringify(message.type)}; known: ${Object.keys(COMMANDS).join(", ")}` } });
    return;
  }
  try {
    const { payload, transfer } = await handler(message);
    post({ type: "result", id, ...payload }, transfer || []);
  } catch (error) {
    post({ type: "error", id, error: describeError(error) });
  }
};
