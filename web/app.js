// candle-web page shell: the tab bar, the runtime status line and the worker client that the
// views (transcribe, generate, ...) use. Loaded as a module by index.html.

import { setUpChat } from "./chat.js";
import { setUpFaces } from "./faces.js";
import { setUpGenerate } from "./generate.js";
import { setUpSimilarity } from "./similarity.js";
import { setUpText2text } from "./text2text.js";
import { setUpTranscribe } from "./transcribe.js";
import { JobBoard, showBusyTabs } from "./job_board.js";
import { formatBytes } from "./view_common.js";

const WORKER_URL = new URL("worker.js", import.meta.url);
const SIGINT = 2;
// Shared with the worker; see the slot layout in worker.js.
const CONTROL_SLOTS = 3;
const SLOT_INTERRUPT = 0;
const SLOT_CANCEL_ID = 1;
const SLOT_RUNNING_ID = 2;
// The worker's start-up phases (they overlap: the bar counts those done).
const INIT_PHASES = ["runtime", "kernels", "wheel", "packages", "backend"];
const PHASE_LABELS = {
  runtime: "Python runtime",
  kernels: "wasm kernels",
  wheel: "candle_web",
  packages: "numpy",
  backend: "backend",
  threads: "second worker thread",
};
const MAX_JOB_ID = 2 ** 31 - 1; // ids live in an int32 slot
// The start's status line: redrawn this often while stages run; a stage running longer than
// SLOW_STAGE_MS shows its time; a worker silent for WORKER_SILENCE_MS after the page opened
// (its module scripts never arrived) is said to be. The worker's own deadlines fail a stage.
const STATUS_TICK_MS = 1000;
const SLOW_STAGE_MS = 10_000;
const WORKER_SILENCE_MS = 60_000;

// Talks to web/worker.js: one promise per command, progress through a callback.
export class WorkerClient {
  constructor(url = WORKER_URL) {
    this.worker = new Worker(url, { type: "module" }); // web/worker.js imports its parts
    this.nextId = 1;
    this.pending = new Map();
    // Without cross-origin isolation there is no SharedArrayBuffer: commands still work,
    // only cancelling a running computation does not.
    this.control = self.crossOriginIsolated ? new SharedArrayBuffer(CONTROL_SLOTS * 4) : null;
    this.slots = this.control ? new Int32Array(this.control) : null;
    // The worker holds one model of each kind (one llama for Chat and Generate): which one,
    // as its load replies said, so a view never assumes the model another view replaced.
    this.heldModels = new Map();
    // Jobs downloading model files now: leaving the page asks first (a download resumes from
    // the pieces it kept, but the last piece's bytes are lost and minutes may be at stake).
    this.downloading = new Set();
    this.board = new JobBoard(); // whose jobs wait for whose (job_board.js)
    addEventListener("beforeunload", (event) => {
      if (this.downloading.size > 0) event.preventDefault();
    });
    this.worker.onmessage = (event) => this.#dispatch(event.data);
    this.worker.onerror = (event) => this.#failAll(new Error(`worker failed: ${event.message || "script error"}`));
  }

  // Starts a command; returns {id, result} where result settles with the worker's reply.
  start(type, fields = {}, { onProgress = null, transfer = [] } = {}) {
    const id = this.nextId;
    this.nextId = this.nextId >= MAX_JOB_ID ? 1 : this.nextId + 1;
    let result = new Promise((resolve, reject) => {
      this.pending.set(id, { resolve, reject, onProgress });
    });
    this.worker.postMessage({ ...fields, type, id }, transfer);
    this.board.started(id, type, fields);
    if (type === "load") result = this.#trackLoad(fields.kind, result);
    return { id, result };
  }

  // Whether the worker holds `model` as its model of `kind` (its last load of that kind).
  holds(kind, model) {
    return this.heldModels.get(kind) === model;
  }

  // A load replaces the worker's model of its kind: unknown until it answers, then its key.
  #trackLoad(kind, result) {
    this.heldModels.delete(kind);
    return result.then((reply) => {
      this.heldModels.set(kind, reply.key);
      return reply;
    });
  }

  request(type, fields = {}, options = {}) {
    return this.start(type, fields, options).result;
  }

  // backend: the page's ?backend= (numpy: the reference, wasm: the kernels or an error;
  // absent: wasm when the kernels load), passed on as it is: the worker checks it.
  // snapshot: false starts Python without the vendored memory snapshot (?snapshot=0, for A/B).
  // threads: 1 or 2 (?threads=; absent: the worker's default, two where there are two cores).
  // compute: "int8" or "float32" (?compute=; absent: float32), checked by the worker.
  init(backend = null, snapshot = true, threads = null, compute = null, answerDeadline = null) {
    return this.request("init", { control: this.control, backend, compute, snapshot, threads, answerDeadline }, { onProgress: (message) => this.onInitProgress?.(message) });
  }

  // Stops job `id`: interrupts it if it is in Python now, or drops it if still queued.
  cancel(id) {
    if (this.slots) {
      Atomics.store(this.slots, SLOT_CANCEL_ID, id);
      if (Atomics.load(this.slots, SLOT_RUNNING_ID) === id) {
        Atomics.store(this.slots, SLOT_INTERRUPT, SIGINT);
      }
    }
    return this.request("cancel", { target: id });
  }

  #dispatch(message) {
    const entry = this.pending.get(message.id);
    if (entry === undefined) return;
    if (message.type === "progress") {
      if (message.phase === "download" && message.state === "running") {
        if (message.cached || message.loaded >= message.total) this.downloading.delete(message.id);
        else this.downloading.add(message.id);
      }
      this.board.progressed(message.id);
      entry.onProgress?.(message);
      return;
    }
    this.pending.delete(message.id);
    this.downloading.delete(message.id);
    this.board.settled(message.id);
    if (message.type === "result") {
      entry.resolve(message);
    } else {
      const error = new Error(message.error?.message || "worker error");
      error.name = message.error?.name || "Error";
      error.traceback = message.error?.traceback;
      entry.reject(error);
    }
  }

  #failAll(error) {
    for (const [id, entry] of this.pending) {
      this.board.settled(id);
      entry.reject(error);
    }
    this.pending.clear();
  }
}

// --- tabs (WAI-ARIA tabs pattern: arrows, Home and End move between tabs) ------------------

function setUpTabs() {
  const tabs = Array.from(document.querySelectorAll('[role="tab"]'));
  const select = (tab, focus) => {
    for (const other of tabs) {
      const selected = other === tab;
      other.setAttribute("aria-selected", String(selected));
      other.tabIndex = selected ? 0 : -1;
      document.getElementById(other.getAttribute("aria-controls")).hidden = !selected;
    }
    if (focus) tab.focus();
    history.replaceState(null, "", `#${tab.id.replace(/^tab-/, "")}`);
  };
  tabs.forEach((tab, index) => {
    tab.addEventListener("click", () => select(tab, false));
    tab.addEventListener("keydown", (event) => {
      const moves = {
        ArrowRight: (index + 1) % tabs.length,
        ArrowLeft: (index - 1 + tabs.length) % tabs.length,
        Home: 0,
        End: tabs.length - 1,
      };
      if (event.key in moves) {
        event.preventDefault();
        select(tabs[moves[event.key]], true);
      }
    });
  });
  const fromHash = document.getElementById(`tab-${location.hash.slice(1)}`);
  if (fromHash && fromHash.getAttribute("role") === "tab") select(fromHash, false);
}

// --- runtime status line ----------------------------------------------------------------------

function formatSeconds(ms) {
  return `${(ms / 1000).toFixed(1)} s`;
}

// "wasm (relaxed SIMD)", or "numpy (why the kernels are not used)".
export function describeBackend(backend) {
  if (!backend?.name) return "unknown";
  if (backend.name === "wasm") {
    const threads = backend.threads === 2 ? ", 2 threads" : "";
    const int8 = backend.computeType === "int8" ? ", int8" : "";
    return `wasm (${backend.label ?? backend.variant}${threads}${int8})`;
  }
  return backend.reason ? `${backend.name} (${backend.reason})` : backend.name;
}

// "start 4.6 s: runtime 0.8 s (snapshot), kernels 0.3 s, ..." (the phases overlap).
function describeStart(summary) {
  const phases = Object.entries(summary.phases).map(([phase, ms]) => {
    const note = phase === "runtime" && summary.snapshot?.used ? " (snapshot)" : "";
    const label = phase === "packages" && summary.versions.scipy ? "numpy + scipy" : PHASE_LABELS[phase] || phase;
    return `${label} ${formatSeconds(ms)}${note}`;
  });
  return `· start ${formatSeconds(summary.totalMs)}: ${phases.join(", ")}`;
}

// The start's stages as the status line tells them: the last one that ended, then those still
// running (with their time once it is more than a moment), so a stage that hangs is named on
// the page rather than leaving the last finished one there. The worker fails a stalled stage
// (worker/start_watch.js); until the worker answers at all, the page counts alone.
class StartProgress {
  constructor(text, bar) {
    this.text = text;
    this.bar = bar;
    this.bar.max = INIT_PHASES.length + 1; // the last step: ready
    this.done = new Set();
    this.running = new Map(); // phase -> when it started (performance.now())
    this.failures = []; // [{label, error, cause}] in order
    this.last = null; // "numpy failed: ...": the last stage that failed
    this.bytes = null; // {loaded, since}: what the start's requests received, from when
    this.heardAt = null; // the worker's first message
    this.openedAt = performance.now();
    this.ticker = setInterval(() => this.show(), STATUS_TICK_MS);
  }

  update(message) {
    const label = PHASE_LABELS[message.phase] || message.phase;
    this.heardAt ??= performance.now();
    if (message.phase === "bytes") {
      this.bytes = { loaded: message.loaded, file: message.file, since: this.bytes?.since ?? this.heardAt };
      this.show();
      return;
    }
    if (message.state === "start") {
      this.running.set(message.phase, performance.now());
    } else if (message.state === "done") {
      this.running.delete(message.phase);
      this.done.add(message.phase);
      this.bar.value = Math.min(this.done.size, this.bar.max - 1); // "threads" may be a sixth phase
    } else if (message.state === "failed") {
      this.running.delete(message.phase);
      this.failures.push({ label, error: message.error, cause: message.cause });
      this.last = `${label} ${message.error?.name === "StartStalled" ? "stalled" : "failed"}: ${message.cause}`;
    }
    this.show();
  }

  // "numpy stalled (numpy-....whl got no answer in 30 s)" for the stage whose failure ended
  // the start, or null.
  failedStage(error) {
    const failure = this.failures.find((f) => f.error?.name === error.name && f.error?.message === error.message);
    if (!failure) return null;
    return `${failure.label} ${error.name === "StartStalled" ? "stalled" : "failed"} (${failure.cause})`;
  }

  show() {
    const now = performance.now();
    if (this.heardAt === null) {
      const silent = now - this.openedAt;
      if (silent >= WORKER_SILENCE_MS) {
        this.text.textContent = `The worker has not answered in ${formatSeconds(silent)}: its scripts did not load or it is stuck (the console may say why).`;
      }
      return;
    }
    const running = Array.from(this.running, ([phase, since]) => {
      const label = PHASE_LABELS[phase] || phase;
      return now - since >= SLOW_STAGE_MS ? `${label} (${formatSeconds(now - since)})` : label;
    });
    const parts = [this.last, running.length > 0 ? `Loading ${running.join(", ")}…` : "Starting…", this.#amount(now)];
    this.text.textContent = parts.filter((part) => part !== null).join(" · ");
  }

  // "12.4 MB so far (pyodide.asm.wasm: 5.1 of 10.1 MB), 2.1 MB/s": the bytes received (from
  // the network or this browser's HTTP cache) and the largest file still arriving, so a slow
  // first visit shows movement and sizes; the speed once it means something.
  #amount(now) {
    if (this.bytes === null) return null;
    const { loaded, file, since } = this.bytes;
    const seconds = (now - since) / 1000;
    const part = file ? ` (${file.name}: ${formatBytes(file.loaded)} of ${formatBytes(file.total)})` : "";
    const speed = seconds >= 1 ? `, ${formatBytes(loaded / seconds)}/s` : "";
    return `${formatBytes(loaded)} so far${part}${speed}`;
  }

  stop() {
    clearInterval(this.ticker);
  }
}

function setUpStatus(client) {
  const status = document.getElementById("runtime-status");
  const text = document.getElementById("runtime-text");
  const bar = document.getElementById("runtime-progress");
  const start = new StartProgress(text, bar);
  client.onInitProgress = (message) => start.update(message);
  const showFailure = (error) => {
    start.stop();
    status.dataset.state = "error";
    const stage = start.failedStage(error);
    text.textContent = `The Python runtime failed to start: ${stage ?? error.message}`;
    console.error(error.traceback || error);
  };
  const showReady = (summary) => {
    start.stop();
    status.dataset.state = "ready";
    bar.value = bar.max;
    text.textContent = `Ready in ${formatSeconds(summary.totalMs)}`;
    const v = summary.versions;
    const scipy = v.scipy ? ` · scipy ${v.scipy}` : "";
    document.getElementById("runtime-versions").textContent =
      `Python ${v.python} · numpy ${v.numpy}${scipy} · candle_web ${v.candle_web} ·`;
    document.getElementById("runtime-backend").textContent = `backend: ${describeBackend(summary.backend)}`;
    document.getElementById("runtime-start").textContent = describeStart(summary);
    if (summary.backend?.reason && summary.backend.name !== "wasm") {
      console.warn(`candle-web runs the ${summary.backend.name} backend: ${summary.backend.reason}`);
    }
  };
  return { showReady, showFailure };
}

const client = new WorkerClient();
setUpTabs();
showBusyTabs(client.board);
const { showReady, showFailure } = setUpStatus(client);
const pageOptions = new URLSearchParams(location.search);
// ?threads=N: a number for the worker to check (it answers an error naming anything but 1, 2
// or auto).
const threadsOption = pageOptions.get("threads");
// ?compute=int8|float32: the quantized products' compute type (the worker checks it).
// ?answerDeadline=SECONDS: how long a start request may go unanswered (the worker checks it).
const deadlineOption = pageOptions.get("answerDeadline");
const ready = client.init(pageOptions.get("backend"), pageOptions.get("snapshot") !== "0",
  threadsOption === null || threadsOption === "auto" ? null
    : Number.isInteger(Number(threadsOption)) ? Number(threadsOption) : threadsOption,
  pageOptions.get("compute"),
  deadlineOption === null ? null : Number.isFinite(Number(deadlineOption)) ? Number(deadlineOption) : deadlineOption);
ready.then(showReady, showFailure);

const transcribeView = setUpTranscribe(client, ready);
const generateView = setUpGenerate(client, ready);
const chatView = setUpChat(client, ready);
const text2textView = setUpText2text(client, ready);
const similarityView = setUpSimilarity(client, ready);
const facesView = setUpFaces(client, ready);

// For the UI tests and the curious: each view's state.
window.candleWeb = {
  client,
  ready,
  transcribe: transcribeView.state,
  generate: generateView.state,
  chat: chatView.state,
  text2text: text2textView.state,
  similarity: similarityView.state,
  faces: facesView.state,
};
