// The queue of Python jobs and their cancelling (the protocol is in ../worker.js's header):
// Python calls run one after another, each with the shared interrupt slot armed for it, and a
// job still waiting for its turn can be cancelled before it reaches Python.

import { CancelledError } from "./common.js";

const SLOT_INTERRUPT = 0;
const SLOT_CANCEL_ID = 1;
const SLOT_RUNNING_ID = 2;
const NO_JOB = 0;

let controlSlots = null; // Int32Array over the page's SharedArrayBuffer, or null
const queuedJobs = new Set(); // ids waiting for their turn in Python
const cancelledBeforeStart = new Set();
// Python calls run one after another: an async step (a download) must not interleave with a
// synchronous computation, and the interrupt slot belongs to one job at a time.
let pythonQueue = Promise.resolve();

export function isCancelRequested(id) {
  return controlSlots !== null && Atomics.load(controlSlots, SLOT_CANCEL_ID) === id;
}

// Runs one Python job with the interrupt slot armed for it; see the header comment.
export function runPythonJob(id, job) {
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


// Adopts the page's control slots (once, at init, before the runtime starts); returns them.
export function adoptControlSlots(buffer) {
  if (buffer instanceof SharedArrayBuffer && controlSlots === null) controlSlots = new Int32Array(buffer);
  return controlSlots;
}

// Marks a job that has not reached Python yet as cancelled; whether it was waiting.
export function cancelQueuedJob(id) {
  const queued = queuedJobs.has(id);
  if (queued) cancelledBeforeStart.add(id);
  return queued;
}
