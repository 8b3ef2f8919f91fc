// The start's deadlines, so that a page start never waits for ever: a request the start makes
// (its own, and Pyodide's for its runtime and packages, which Pyodide may log and forget, or
// wait on for ever once its wasm failed to instantiate) that gets no answer within
// ANSWER_DEADLINE_MS is aborted and reported as stalled; a stage still running after
// STAGE_DEADLINE_MS has stalled too. Either way the stage fails with StartStalled, saying what
// it waited for, and the page says which stage stalled.

import { TypedError } from "./common.js";

// The start's files come from the serving origin (`candle-web serve` on this machine): an
// answer (its headers; the body may take longer) comes in milliseconds, so half a minute
// without one is a stall, not a slow line. The page's ?answerDeadline=SECONDS sets another
// (a slow proxy may need more; the stall tests take 5).
export const ANSWER_DEADLINE_MS = 30_000;
// A stage that computes (compiling the runtime, unpacking numpy) takes seconds, or a minute
// on a machine shared with many other processes: three minutes is a stall.
export const STAGE_DEADLINE_MS = 180_000;

// `stage`: the start stage that stalled, once known (the request watch does not know it).
export class StartStalled extends TypedError {
  constructor(message, stage = null) {
    super("StartStalled", message);
    this.stage = stage;
  }
}

function urlOf(input) {
  if (typeof input === "string") return input;
  return input instanceof URL ? input.href : input?.url ?? String(input);
}

export function fileName(url) {
  return decodeURIComponent(new URL(url, self.location.href).pathname.split("/").pop() || url);
}

// Wraps the worker's fetch while the start runs. Returns {stallFor(owns), stop()}:
// stallFor(owns) is a promise that rejects with the StartStalled of the first request whose
// URL `owns(url)` accepts that stalls from now on (and never resolves), with cancel() to stop
// listening; stop() puts the original fetch back. `onBytes(count, file)`, when given, hears
// the bytes of every answer's body as they arrive ({name, loaded, total} of the file they
// belong to; total null without a Content-Length) (read from a clone, so the caller's reading is
// untouched): on a slow line the page counts the runtime's ~35 MB rather than look stuck.
export function watchStartRequests(onBytes = null, answerDeadlineMs = ANSWER_DEADLINE_MS) {
  const original = self.fetch;
  const listeners = new Set();
  self.fetch = (input, init = {}) => {
    const url = new URL(urlOf(input), self.location.href).href;
    const controller = new AbortController();
    const callerSignal = init.signal;
    if (callerSignal?.aborted) controller.abort(callerSignal.reason);
    callerSignal?.addEventListener("abort", () => controller.abort(callerSignal.reason), { once: true });
    const timer = setTimeout(() => {
      const stall = new StartStalled(`${fileName(url)} got no answer in ${answerDeadlineMs / 1000} s`);
      console.warn(`candle-web: the start stalled: ${url} got no answer in ${answerDeadlineMs / 1000} s`);
      for (const listener of listeners) listener(url, stall);
      controller.abort(stall);
    }, answerDeadlineMs);
    const answered = Reflect.apply(original, self, [input, { ...init, signal: controller.signal }]);
    // Registered before the caller's own handlers, so the clone is made before its body is read.
    answered.then((response) => {
      clearTimeout(timer);
      if (onBytes !== null) countBody(response, fileName(url), onBytes);
    }, () => clearTimeout(timer));
    return answered;
  };
  return {
    stallFor(owns) {
      let listener = null;
      const stalled = new Promise((resolve, reject) => {
        listener = (url, stall) => { if (owns(url)) reject(stall); };
        listeners.add(listener);
      });
      stalled.catch(() => {}); // raced, never awaited alone
      stalled.cancel = () => listeners.delete(listener);
      return stalled;
    },
    stop() {
      self.fetch = original;
      listeners.clear();
    },
  };
}

// Reads a clone of `response`'s body to its end, telling `onBytes` each chunk's size; a body
// that fails or is cancelled simply stops counting (the caller's copy says why).
async function countBody(response, name, onBytes) {
  if (!response.body) return;
  const file = { name, loaded: 0, total: Number(response.headers.get("content-length")) || null };
  try {
    const reader = response.clone().body.getReader();
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      file.loaded += value.byteLength;
      onBytes(value.byteLength, file);
    }
  } catch {
    // the caller sees the same failure on its own copy
  } finally {
    onBytes(0, { ...file, total: file.loaded }); // ended (or failed): no longer arriving
  }
}

// Runs `work` against the stage's deadline and, when `stalled` is given, the stall of one of
// its requests; rejects with StartStalled (the cause) when either comes first.
export async function withinDeadline(work, stalled = null) {
  let timer = null;
  const late = new Promise((resolve, reject) => {
    timer = setTimeout(() => reject(new StartStalled(`not done after ${STAGE_DEADLINE_MS / 1000} s`)), STAGE_DEADLINE_MS);
  });
  try {
    return await Promise.race([work(), late, ...(stalled ? [stalled] : [])]);
  } finally {
    clearTimeout(timer);
    stalled?.cancel();
  }
}
