// What every part of the worker shares: where the vendored files are, the messages to the page,
// typed errors and their description, and fetching a vendored file checked against its sha256.

export const BASE_URL = new URL("../", import.meta.url); // web/, whatever serves it
export const PYODIDE_INDEX_URL = new URL("vendor/pyodide/", BASE_URL).href;
export const WHEEL_DIR_URL = new URL("vendor/wheels/", BASE_URL).href;
export const WHEEL_MANIFEST_URL = new URL("manifest.json", WHEEL_DIR_URL).href;
export const VENDOR_URL = new URL("vendor/", BASE_URL).href;
export const PROGRESS_INTERVAL_MS = 100;

export class CancelledError extends Error {
  constructor(message) {
    super(message);
    this.name = "Cancelled";
  }
}

// A typed error made in JS (Python's own come through describeError as PythonError).
export class TypedError extends Error {
  constructor(name, message) {
    super(message);
    this.name = name;
  }
}

export function post(message, transfer = []) {
  self.postMessage(message, transfer);
}

export function progress(id, fields) {
  post({ type: "progress", id, ...fields });
}

// Runs `work` as one named phase, reporting start and end with its duration in ms.
export async function timedPhase(id, phase, work) {
  progress(id, { phase, state: "start" });
  const start = performance.now();
  const detail = await work();
  const ms = performance.now() - start;
  progress(id, { phase, state: "done", ms, ...(detail || {}) });
  return ms;
}

// A progress callback for Python (done, total) that posts at most every PROGRESS_INTERVAL_MS,
// and always the first and the last step.
export function throttledProgress(id, phase) {
  let lastPost = -Infinity;
  return (done, total) => {
    const now = performance.now();
    if (done === 1 || done === total || now - lastPost >= PROGRESS_INTERVAL_MS) {
      lastPost = now;
      progress(id, { phase, state: "running", done, total });
    }
  };
}

// The error reply's {name, message, traceback?} for anything a command threw.
export function describeError(error) {
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

export function hexDigest(digest) {
  return Array.from(new Uint8Array(digest), (byte) => byte.toString(16).padStart(2, "0")).join("");
}

export async function fetchChecked(url, what) {
  const response = await fetch(url, { cache: "no-cache" });
  if (!response.ok) {
    throw new Error(`${what}: ${url} answered ${response.status} ${response.statusText}`);
  }
  return response;
}

// Whether `bytes` have the sha256 a manifest states. crypto.subtle exists only in secure
// contexts (http://127.0.0.1 is one; a LAN address over plain http is not): there the check
// is skipped, the bytes come from the same origin.
export async function hasSha256(bytes, expected, what) {
  if (!self.crypto?.subtle) {
    console.warn(`no crypto.subtle: ${what} hash not checked`);
    return true;
  }
  const actual = hexDigest(await crypto.subtle.digest("SHA-256", bytes));
  if (actual !== expected) console.warn(`${what}: sha256 ${actual}, the manifest says ${expected}`);
  return actual === expected;
}

// The bytes of a vendored file, checked against the sha256 its manifest states.
export async function fetchVerified(url, what, expectedSha256) {
  const bytes = await (await fetchChecked(url, what)).arrayBuffer();
  if (!(await hasSha256(bytes, expectedSha256, what))) {
    throw new Error(`sha256 mismatch for ${what} (${url}): not the file the manifest names (rebuild with scripts/vendor_pyodide.py)`);
  }
  return bytes;
}

// A vendored kernels build (an entry of the wheel manifest's `kernels` table), fetched and
// checked; failures become `Unavailable` (KernelsUnavailable or TeamUnavailable: the start
// goes on without them and says why).
export async function fetchKernelBuild(entry, Unavailable) {
  let response;
  try {
    response = await fetch(new URL(entry.file, VENDOR_URL).href, { cache: "no-cache" });
  } catch (error) {
    throw new Unavailable(`${entry.file} could not be fetched: ${error.message}`);
  }
  if (!response.ok) throw new Unavailable(`${entry.file} answered ${response.status} ${response.statusText}`.trim());
  const bytes = await response.arrayBuffer();
  if (!(await hasSha256(bytes, entry.sha256, entry.file))) {
    throw new Unavailable(`${entry.file} is not the build the manifest names (sha256 differs: run \`make web\`)`);
  }
  return bytes;
}
