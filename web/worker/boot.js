// The start: Pyodide (from the vendored memory snapshot when there is one), the kernels, the
// threads build and the candle_web wheel fetched at the same time, numpy (and scipy for the
// numpy backend) loaded while the wheel is unpacked, then the backend chosen by Python
// (candle_web.worker.boot, the one Python entry point of the start). Every stage has a
// deadline and every request of the start one for its answer (start_watch.js): a stage that
// stalls or fails says so, by name, in its progress message and the start's error.

import { loadPyodide } from "../vendor/pyodide/pyodide.mjs";
import {
  PYODIDE_INDEX_URL, TypedError, VENDOR_URL, WHEEL_DIR_URL, WHEEL_MANIFEST_URL, describeError,
  fetchChecked, fetchVerified, progress,
} from "./common.js";
import { KernelsUnavailable, compileKernels, instantiateKernels, watchForPyodideMemory } from "./kernels.js";
import { ANSWER_DEADLINE_MS, StartStalled, watchStartRequests, withinDeadline } from "./start_watch.js";
import { registerTeam, startTeam } from "./team.js";
import { installWheelFiles, unpackWheel } from "./wheel.js";

// The page's ?backend=: wasm-simd128 forces the plain SIMD build (what browsers without
// relaxed SIMD run), for A/B and for testing that build in a browser that has both.
const BACKEND_CHOICES = ["auto", "wasm", "wasm-simd128", "numpy"];
const FORCED_VARIANTS = { "wasm-simd128": "simd128" };

// The started runtime: Pyodide, and the Python modules every command goes through
// (candle_web.worker: the sessions; candle_web.worker.boot: the start). Null until started.
export const runtime = { pyodide: null, worker: null, boot: null };
let runtimePromise = null;

// Log lines of Pyodide's package loader are chatty; keep them out of the console unless
// something goes wrong.
function quietLoaderOptions(errors = []) {
  return { messageCallback: () => {}, errorCallback: (text) => { errors.push(text); console.warn(text); }, checkIntegrity: true };
}

// Pyodide's loadPackage logs a package it could not load and resolves all the same (the
// import fails later, far from the cause): here it fails, saying what the loader said.
async function loadPackages(names) {
  const errors = [];
  await runtime.pyodide.loadPackage(names, quietLoaderOptions(errors));
  if (errors.length > 0) throw new TypedError("PackageLoadFailed", errors.join(" "));
}

// Requests under Pyodide's folder are Pyodide's own (its runtime files, then the packages):
// the stages that wait on Pyodide fail when one of those stalls.
function isPyodideRequest(url) {
  return url.startsWith(PYODIDE_INDEX_URL);
}

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
      return { pyodide: restored, snapshot: true, snapshotReason: null };
    } catch (error) {
      snapshotReason = describeError(error).message;
      console.warn(`candle-web: the Pyodide snapshot was not used, Python starts the usual way: ${snapshotReason}`);
    }
  }
  return { pyodide: await loadPyodide(options), snapshot: false, snapshotReason };
}

// Runs `work` as the named phase of a start (progress start, then done with ms or failed
// with ms and the error) within its deadline (and, with `watched`, failing when one of the
// requests `watched` owns stalls: `watch` is the start's watchStartRequests) and keeps its
// duration in `phases`; returns what `work` returns. Phases may overlap.
async function startPhase(id, phases, phase, work, { watch = null, watched = null } = {}) {
  progress(id, { phase, state: "start" });
  const start = performance.now();
  try {
    const value = await withinDeadline(work, watched === null ? null : watch.stallFor(watched));
    phases[phase] = performance.now() - start;
    progress(id, { phase, state: "done", ms: phases[phase] });
    return value;
  } catch (error) {
    const failure = error instanceof StartStalled && error.stage === null
      ? new StartStalled(`the ${phase} stage stalled: ${error.message}`, phase) : error;
    // A phase that throws still has its duration (the kernels' may).
    phases[phase] = performance.now() - start;
    // error: what the start fails with; cause: what went wrong in the stage's own words.
    progress(id, { phase, state: "failed", ms: phases[phase], error: describeError(failure), cause: describeError(error).message });
    throw failure;
  }
}

// A promise awaited later; until then a rejection must not count as unhandled.
function later(promise) {
  promise?.catch(() => {});
  return promise;
}

// What needs no Pyodide, started at once: the manifest, then the kernels, the threads build
// (with its helper worker) and the wheel. Resolves nothing itself: each part is a promise.
function startDownloads(id, phases, choice, threads) {
  const manifest = later(fetchChecked(WHEEL_MANIFEST_URL, "wheel manifest").then((response) => response.json()));
  const kernels = choice === "numpy" ? null
    : later(startPhase(id, phases, "kernels", () => compileKernels(manifest, FORCED_VARIANTS[choice])));
  const cores = self.navigator?.hardwareConcurrency ?? 1;
  const wantTeam = threads === 2 || (threads === "auto" && cores >= 2);
  const team = wantTeam && choice !== "numpy" && choice !== "wasm-simd128"
    ? later(startPhase(id, phases, "threads", () => startTeam(manifest))) : null;
  const wheel = later(startPhase(id, phases, "wheel", async () => {
    const templates = templateWheels(manifest); // at the same time; never throws
    const { wheel: file, sha256 } = await manifest;
    const bytes = await fetchVerified(new URL(file, WHEEL_DIR_URL).href, file, sha256);
    return { manifest: await manifest, entries: await unpackWheel(bytes), templates: await templates };
  }));
  return { manifest, kernels, team, wheel, wantTeam, cores };
}

// Jinja2 + MarkupSafe (the manifest's templateWheels, vendored by scripts/vendor_pyodide.py)
// for models' own chat templates: {entries, reason} (entries [] and why when they cannot be
// used: the page then renders the chat formats it recognises, and says so).
async function templateWheels(manifestPromise) {
  try {
    const wanted = (await manifestPromise).templateWheels ?? [];
    if (wanted.length === 0) return { entries: [], reason: "jinja2 was not vendored (scripts/vendor_pyodide.py could not fetch it)" };
    const unpacked = await Promise.all(wanted.map(async ({ file, sha256 }) => {
      const bytes = await fetchVerified(new URL(file, WHEEL_DIR_URL).href, file, sha256);
      return unpackWheel(bytes, file);
    }));
    return { entries: unpacked.flat(), reason: null };
  } catch (error) {
    return { entries: [], reason: describeError(error).message };
  }
}

// Python run once the runtime is up, before any package or wheel is installed: the importers
// of the runtime's own zip archives (python_stdlib.zip, the one on sys.path; candle-web adds
// none) keep their listing, also those made later for packages inside them. Pyodide's
// loadPackage calls importlib.invalidate_caches(), and so does the wheels' install, and that
// otherwise re-reads the stdlib archive's whole directory each time: 0.2-0.3 s of the start
// for an archive that cannot change while the page runs. Any other zip archive put on
// sys.path is invalidated as usual.
const PIN_RUNTIME_ARCHIVES = `
def _pin_runtime_archives():
    import sys
    import zipimport

    archives = {finder.archive for finder in sys.path_importer_cache.values()
                if type(finder) is zipimport.zipimporter}

    class RuntimeArchiveImporter(zipimport.zipimporter):
        def invalidate_caches(self):
            if self.archive not in archives:
                super().invalidate_caches()

    sys.path_hooks[:] = [RuntimeArchiveImporter if hook is zipimport.zipimporter else hook
                         for hook in sys.path_hooks]
    for name, finder in list(sys.path_importer_cache.items()):
        if type(finder) is zipimport.zipimporter:
            sys.path_importer_cache[name] = RuntimeArchiveImporter(name)

_pin_runtime_archives()
del _pin_runtime_archives
`;

// Pyodide itself, with its memory captured for the kernels; the page's interrupt slot armed.
async function startPython(id, phases, useSnapshot, manifest, controlSlots, watch) {
  const memoryWatch = watchForPyodideMemory();
  let started = null;
  await startPhase(id, phases, "runtime", async () => {
    try {
      started = await loadRuntime(useSnapshot ? await manifest : null);
    } finally {
      memoryWatch.stop();
    }
    started.pyodide.runPython(PIN_RUNTIME_ARCHIVES);
    runtime.pyodide = started.pyodide;
    self.pyodide = started.pyodide; // the console's (and the UI tests') handle on Python
    if (controlSlots !== null) {
      started.pyodide.setInterruptBuffer(new Int32Array(controlSlots.buffer, 0, 1));
    }
  }, { watch, watched: isPyodideRequest });
  return { ...started, memory: memoryWatch.memory() };
}

// The kernels instantiated on Pyodide's memory: {kernels, reason} (kernels null and the reason
// when they cannot be used).
async function kernelsOrReason(kernelsPromise, memory, choice) {
  if (kernelsPromise === null) return { kernels: null, reason: "?backend=numpy asked for the numpy reference" };
  try {
    const kernels = await kernelsPromise;
    await instantiateKernels(runtime.pyodide, kernels, memory);
    return { kernels, reason: null };
  } catch (error) {
    // A stalled kernels file (or manifest) is a reason like any other: numpy runs instead.
    if (!(error instanceof KernelsUnavailable || error instanceof StartStalled)) throw error;
    return { kernels: null, reason: error.message };
  }
}

// Without the kernels, "auto" goes on with numpy (saying why); an explicit wasm choice fails.
function fallBack(choice, why) {
  if (choice !== "auto") throw new TypedError("KernelsUnavailable", `?backend=${choice} needs the wasm kernels: ${why}`);
  console.warn(`candle-web: the wasm kernels are not used, numpy runs instead: ${why}`);
}

// The backend phase: Python renews what a snapshot shares, then chooses the backend (wasm on
// the registered kernels, else numpy with scipy's BLAS). Returns {name, kernels, reason}.
async function chooseBackend(id, phases, started, choice, compute, { kernels, reason }, watch) {
  const { pyodide } = runtime;
  let name = null;
  let computeType = null;
  await startPhase(id, phases, "backend", async () => {
    runtime.worker = pyodide.pyimport("candle_web.worker");
    runtime.boot = pyodide.pyimport("candle_web.worker.boot");
    if (started.snapshot) runtime.boot.after_snapshot();
    if (kernels !== null) {
      try {
        name = runtime.boot.select_backend("wasm");
      } catch (error) {
        // The kernels loaded but Python could not use them: numpy (with its BLAS) instead.
        reason = `the wasm backend did not start: ${describeError(error).message}`;
        kernels = null;
        fallBack(choice, reason);
        await loadPackages("scipy");
      }
    }
    if (kernels === null) name = runtime.boot.select_backend("numpy");
    computeType = runtime.boot.select_compute_type(compute);
  }, { watch, watched: isPyodideRequest });
  return { name, kernels, reason, computeType };
}

// The second thread: {team, threadsReason} (team null and why when one thread runs).
async function startThreads(downloads, backend, choice, threads) {
  const { cores, wantTeam } = downloads;
  if (threads === 1) return { team: null, threadsReason: "?threads=1 asked for one thread" };
  if (!wantTeam) return { team: null, threadsReason: `the browser reports ${cores} core${cores === 1 ? "" : "s"}` };
  if (backend.kernels === null) return { team: null, threadsReason: "the two threads need the wasm backend" };
  if (downloads.team === null) return { team: null, threadsReason: `?backend=${choice} runs one thread` };
  let team = null;
  try {
    team = await downloads.team;
    registerTeam(runtime.pyodide, team);
    runtime.boot.attach_team();
    return { team, threadsReason: null };
  } catch (error) {
    team?.helper.terminate();
    const threadsReason = describeError(error).message;
    console.warn(`candle-web: one thread runs, not two: ${threadsReason}`);
    return { team: null, threadsReason };
  }
}

// The bytes the start's requests have received so far, as progress {phase: "bytes", loaded,
// file} at most every BYTES_REPORT_MS (a chunk arrives every few kB); `file`: the largest
// file still arriving ({name, loaded, total}, or null), the one a slow line waits on.
const BYTES_REPORT_MS = 250;
function reportBytes(id) {
  let loaded = 0;
  let sentAt = -Infinity;
  const arriving = new Map(); // name -> {name, loaded, total}
  return (count, file) => {
    loaded += count;
    if (file.total !== null && file.loaded < file.total) arriving.set(file.name, file);
    else arriving.delete(file.name);
    const now = performance.now();
    if (now - sentAt < BYTES_REPORT_MS) return;
    sentAt = now;
    const largest = [...arriving.values()].reduce((a, b) => (a === null || b.total > a.total ? b : a), null);
    progress(id, { phase: "bytes", loaded, file: largest && { ...largest } });
  };
}

function versions() {
  return { pyodide: runtime.pyodide.version, ...JSON.parse(runtime.boot.versions_json()) };
}

// The start (see the file's head). `choice`: "auto" (wasm when the kernels load, else numpy
// with the reason), "wasm" or "wasm-simd128" (the kernels or an error) or "numpy" (the
// reference, for A/B). `useSnapshot`: restore the vendored Pyodide snapshot when there is one.
async function startRuntime(id, choices) {
  const watch = watchStartRequests(reportBytes(id), choices.answerDeadlineMs);
  try {
    return await startWatched(id, choices, watch);
  } finally {
    watch.stop();
  }
}

async function startWatched(id, { choice, compute, useSnapshot, threads, controlSlots }, watch) {
  const startedAt = performance.now();
  const phases = {};
  const downloads = startDownloads(id, phases, choice, threads);
  const started = await startPython(id, phases, useSnapshot, downloads.manifest, controlSlots, watch);
  const loaded = await kernelsOrReason(downloads.kernels, started.memory, choice);
  if (loaded.kernels === null && choice !== "numpy") fallBack(choice, loaded.reason);
  const packages = later(startPhase(id, phases, "packages",
    () => loadPackages(loaded.kernels === null ? ["numpy", "scipy"] : ["numpy"]), { watch, watched: isPyodideRequest }));
  const { manifest, entries, templates } = await downloads.wheel;
  // One install for all (the template wheels are imported when a model has a template), while
  // numpy downloads.
  installWheelFiles(runtime.pyodide, [...entries, ...templates.entries]);
  if (templates.entries.length === 0) {
    console.warn(`candle-web: models' own chat templates are not rendered, the recognised chat formats (ChatML, Llama) are: ${templates.reason}`);
  }
  await packages;
  const backend = await chooseBackend(id, phases, started, choice, compute, loaded, watch);
  const { team, threadsReason } = await startThreads(downloads, backend, choice, threads);
  return {
    phases,
    totalMs: performance.now() - startedAt,
    versions: versions(),
    wheel: manifest,
    chatTemplates: { jinja2: templates.entries.length > 0, reason: templates.reason },
    snapshot: { used: started.snapshot, reason: started.snapshotReason },
    backend: {
      name: backend.name,
      requested: choice,
      variant: backend.kernels?.variant ?? null,
      label: backend.kernels?.label ?? null,
      kernels: backend.kernels === null ? null : { file: backend.kernels.file, sha256: backend.kernels.sha256 },
      reason: backend.reason,
      computeType: backend.computeType,
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

// The page's ?compute=: the compute type of the quantized products (float32, the default and
// the reference; int8: int8 activations times the weights' integer levels, web/kernels/
// linear_int8.c).
const COMPUTE_CHOICES = ["float32", "int8"];

function checkComputeChoice(value) {
  const choice = value ?? "float32";
  if (!COMPUTE_CHOICES.includes(choice)) {
    throw new TypedError("FormatError", `init: \`compute\` (the page's ?compute=) must be one of ${COMPUTE_CHOICES.join(", ")}, got ${JSON.stringify(value)}`);
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

// The page's ?answerDeadline=SECONDS: how long a start request may go unanswered before the
// start calls it stalled (start_watch.js; default 30 s).
function checkAnswerDeadline(value) {
  if (value === undefined || value === null) return ANSWER_DEADLINE_MS;
  if (typeof value !== "number" || !Number.isFinite(value) || value < 1 || value > 3600) {
    throw new TypedError("FormatError", `init: \`answerDeadline\` (the page's ?answerDeadline=) must be a number of seconds from 1 to 3600, got ${JSON.stringify(value)}`);
  }
  return value * 1000;
}

function checkSnapshotChoice(value) {
  if (value === undefined || value === null) return true;
  if (typeof value !== "boolean") {
    throw new TypedError("FormatError", `init: \`snapshot\` (the page's ?snapshot=0) must be true or false, got ${JSON.stringify(value)}`);
  }
  return value;
}

// The runtime, started by the first caller (whose choices win: it starts once per worker);
// resolves the init summary. `controlSlots`: the page's shared slots, or null.
export function ensureRuntime(id, { backend, compute, snapshot, threads, answerDeadline } = {},
                              controlSlots = null) {
  if (runtimePromise === null) {
    runtimePromise = startRuntime(id, {
      choice: checkBackendChoice(backend), compute: checkComputeChoice(compute),
      useSnapshot: checkSnapshotChoice(snapshot),
      answerDeadlineMs: checkAnswerDeadline(answerDeadline),
      threads: checkThreadsChoice(threads), controlSlots,
    });
    // A failed start may be retried by a later init.
    runtimePromise.catch(() => { runtimePromise = null; });
  }
  return runtimePromise;
}

// The wasm heap's size in bytes (it grows, never shrinks: the high-water mark of a job).
export function wasmHeapBytes() {
  return runtime.pyodide?._module?.HEAP8?.buffer?.byteLength ?? null;
}
