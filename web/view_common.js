// What the views share: number formatting, the job status line (progress bar + phase text),
// the life of a job (ViewJobs), and, for the text views (Similarity, Generate, Text-to-text),
// loading a model into the worker with byte-level progress (Transcribe names its files its
// own way).

export function formatBytes(bytes) {
  if (bytes >= 1e6) return `${(bytes / 1e6).toFixed(bytes >= 1e8 ? 0 : 1)} MB`;
  if (bytes >= 1e3) return `${(bytes / 1e3).toFixed(0)} kB`;
  return `${bytes} B`;
}

// "1 token", "3 tokens": a count with its noun.
export function countOf(count, one, many = `${one}s`) {
  return `${count} ${count === 1 ? one : many}`;
}

export function formatSeconds(seconds) {
  return `${seconds.toFixed(seconds < 10 ? 2 : 1)} s`;
}

// States of a job status line once nothing runs; any other state is a job under way.
const SETTLED_STATES = new Set(["idle", "done", "cancelled", "error"]);

// Scrolls `element` just into view when it is outside the window (a view's status sits in the
// other column, or below the controls on a phone); leaves the page still when it is already
// seen or hidden (another tab's).
export function bringIntoView(element) {
  const box = element.getBoundingClientRect();
  if (box.width === 0 && box.height === 0) return;
  if (box.top >= 0 && box.bottom <= window.innerHeight) return;
  element.scrollIntoView({ block: "nearest" });
}

// The progress bar and phase line of one view, plus its inline error box. A job that starts
// and an error bring themselves into view (once: a later update does not pull back someone
// who scrolled away to read).
export class JobStatus {
  constructor({ job, progress, phase, error }) {
    this.job = job;
    this.progress = progress;
    this.phase = phase;
    this.error = error;
  }

  set(state, text) {
    const starting = !SETTLED_STATES.has(state) && SETTLED_STATES.has(this.job.dataset.state || "idle");
    this.job.dataset.state = state;
    if (text !== undefined) this.phase.textContent = text;
    if (starting) bringIntoView(this.job);
    // A bar left indeterminate would go on moving after a Stop or an error.
    if (SETTLED_STATES.has(state) && !this.progress.hasAttribute("value")) this.progress.value = 0;
  }

  fraction(value) {
    if (value === null) {
      this.progress.removeAttribute("value"); // indeterminate
    } else {
      this.progress.value = Math.min(Math.max(value, 0), 1);
    }
  }

  showError(message) {
    this.error.textContent = message;
    this.error.hidden = false;
    bringIntoView(this.error);
  }

  clearError() {
    this.error.textContent = "";
    this.error.hidden = true;
  }
}

// The life of one view's jobs, the same in every view: while a job runs, `state.busy` is
// true (the view's `refresh` disables its controls), `state.jobId` is the worker job that Stop
// cancels, and the status line says what happens; a typed error goes to the error box, a
// cancel is not an error. The view says what a run does: `jobs.run(prepare)` calls
// prepare(), which checks the form and returns null (after showing what is wrong) or a spec:
//   reset()                  clears the view's output for the new run
//   load(track) -> model     makes sure the model is loaded (track(job): Stop cancels it too)
//   command, fields(model)   the worker command and its fields; transfer(fields)? the
//                            buffers to transfer rather than copy
//   running: {state?, text, fraction?}  the status once the command starts (default state
//                            "running", fraction null: indeterminate)
//   onProgress(message)      the command's partial results
//   done(result, model)      shows the final result; returns the status line's text
//   cancelled()              the status line's text after Stop
//   errorHelp(error)?        text added after the error message; cleanup()? after a failure
export class ViewJobs {
  constructor({ client, status, state, refresh, stoppingText = "Stopping…" }) {
    this.client = client;
    this.status = status;
    this.state = state;
    this.refresh = refresh;
    this.stoppingText = stoppingText;
    // The tab whose view this is: a job of it that waits for another view's job says so
    // (job_board.js), and restores its own words when its turn comes.
    this.panelId = status.job.closest('[role="tabpanel"]')?.id ?? null;
    this.track = (job) => {
      state.jobId = job.id;
      let before = null;
      client.board?.own(job.id, this.panelId, {
        onWait: (text) => {
          before ??= { state: status.job.dataset.state, text: status.phase.textContent };
          status.set("waiting", text);
        },
        onStart: () => {
          if (before !== null && status.job.dataset.state === "waiting") status.set(before.state, before.text);
          before = null;
        },
      });
    };
  }

  async run(prepare) {
    const { state, status } = this;
    if (state.busy) return;
    status.clearError();
    const spec = prepare();
    if (spec === null) return;
    state.busy = true;
    state.lastError = null;
    state.events = [];
    spec.reset?.();
    this.refresh();
    let loading = true; // a Stop now stops the model's load (its download), not the command
    status.lastDownload = null;
    try {
      const model = await spec.load(this.track);
      loading = false;
      status.set(spec.running.state || "running", spec.running.text);
      status.fraction(spec.running.fraction ?? null);
      const fields = spec.fields(model);
      const job = this.client.start(spec.command, fields, { onProgress: spec.onProgress, transfer: spec.transfer?.(fields) || [] });
      this.track(job);
      const result = await job.result;
      const text = spec.done(result, model);
      state.runs += 1;
      status.fraction(1);
      status.set("done", text);
    } catch (error) {
      state.lastError = { name: error.name, message: error.message };
      if (error.name === "Cancelled") {
        const text = spec.cancelled(); // called either way: a view may tidy up there
        status.set("cancelled", loading ? describeStoppedLoad(status.lastDownload) : text);
      } else {
        status.set("error", "Stopped by an error.");
        status.showError(`${error.name}: ${error.message}${spec.errorHelp?.(error) || ""}`);
        console.error(error.traceback || error);
      }
      spec.cleanup?.();
    } finally {
      state.busy = false;
      state.jobId = null;
      this.refresh();
    }
  }

  async stop() {
    if (this.state.jobId === null) return;
    this.status.phase.textContent = this.stoppingText;
    await this.client.cancel(this.state.jobId);
  }

  // Once the runtime is up the view's controls work and fillModels() asks for the model list
  // (the view keeps the options it has when that fails); if the runtime never starts, the
  // error box says so: "... so nothing can be <what>".
  whenReady(ready, what, fillModels) {
    ready.then(async () => {
      this.state.runtimeReady = true;
      this.refresh();
      try {
        await fillModels?.();
      } catch (error) {
        console.warn("model list unavailable:", error);
      }
    }, (error) => {
      this.status.showError(`The Python runtime failed to start, so nothing can be ${what}: ${error.message}`);
    });
    this.refresh();
  }
}

// Ctrl+Enter (Cmd+Enter) in a text box runs the view, like submitting a form.
export function runOnCtrlEnter(element, run) {
  element.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) {
      event.preventDefault();
      run();
    }
  });
}

// Loads a model of `kind` (fields: {model} | {hf_repo, revision} | {url}) and reports its
// progress on `status`; resolves with the worker's load reply. `track(job)` receives the
// started job (so a Stop button can cancel the load), `events` collects the progress messages.
export async function loadModel(client, kind, fields, status, { label, track, events } = {}) {
  const name = label || fields.model || fields.hf_repo || fields.url;
  status.set("loading", `Loading ${name}…`);
  status.fraction(0);
  let notKept = ""; // said up front when this browser will not keep the download
  const onProgress = (message) => {
    events?.push({ phase: message.phase, state: message.state, file: message.file, cached: message.cached });
    if (message.phase === "download" && message.state === "not-kept") {
      notKept = ` · ${notKeptNote(name, message.reason)}`;
    } else if (message.phase === "download" && message.state === "running") {
      const amount = describeDownloadAmount(message);
      status.lastDownload = message;
      status.fraction(message.total ? message.loaded / message.total : 0);
      status.phase.textContent = message.cached
        ? `Reading ${message.file} from this browser's cache (no download): ${amount}`
        : `Downloading ${message.file}: ${amount}${notKept}`;
      status.phase.dataset.cached = String(Boolean(message.cached));
    } else if (message.phase === "verify") {
      status.phase.textContent = `Checking the sha256 of ${message.file}…`;
    } else if (message.phase === "build" && message.state === "start") {
      status.fraction(null);
      status.phase.textContent = `Building ${name} in Python…`;
    }
  };
  const job = client.start("load", { kind, ...fields }, { onProgress });
  track?.(job);
  return job.result;
}

// "about 40 s left", "about 3 min left".
export function formatTimeLeft(seconds) {
  if (seconds < 60) return `about ${Math.max(1, Math.round(seconds))} s left`;
  return `about ${Math.round(seconds / 60)} min left`;
}

// A download's progress line: "41.9 of 98.4 MB · 5.2 MB/s · about 11 s left", and where an
// interrupted download was continued: "· continued from the 33.6 MB kept earlier". Speed and
// time left are measured on this download's bytes (the worker sends them after a second).
export function describeDownloadAmount(message) {
  const parts = [`${formatBytes(message.loaded)} of ${formatBytes(message.total)}`];
  const rate = message.bytesPerSecond;
  if (!message.cached && rate > 0) {
    parts.push(`${formatBytes(rate)}/s`);
    if (message.total > message.loaded) parts.push(formatTimeLeft((message.total - message.loaded) / rate));
  }
  if (message.resumedFrom > 0) parts.push(`continued from the ${formatBytes(message.resumedFrom)} kept earlier`);
  return parts.join(" · ");
}

// What Stop said during a model download (`download`: the last download progress, or null).
export function describeStoppedLoad(download) {
  if (!download || download.cached) return "Stopped before the model was loaded.";
  const next = download.resumable ? "the next load continues from there" : "this file is downloaded again next time";
  return `Stopped downloading ${download.file} at ${formatBytes(download.loaded)} of ${formatBytes(download.total)}; ${next}.`;
}

// Why a download was not kept, in the words a model note uses.
export function notKeptNote(label, reason) {
  return `Could not keep ${label} in this browser's storage (${reason}); it will be downloaded again next time.`;
}

// " Could not keep ... next time." after a load this browser could not keep (a private
// window, its quota, a full disk: the model ran from the downloaded bytes), else "".
export function describeNotKept(reply, label) {
  return reply.notKept ? ` ${notKeptNote(label, reply.notKept.reason)}` : "";
}

// "(from this browser's cache)" or "(12.3 MB downloaded)", and the build time.
export function describeLoad(reply) {
  const source = reply.cached ? "from this browser's cache, no download" : `${formatBytes(reply.downloadedBytes)} downloaded`;
  return `${source}; built in ${formatSeconds(reply.timingsMs.build / 1000)}`;
}

// Fills a <select> with the registry's browser models of `kind` (size and licence shown, as
// the Hub's model cards do); keeps the options it already has when the list is unavailable.
// `all`: also the models the page loads only when asked for. Resolves with the worker's reply.
export async function fillModelSelect(client, kind, select, labels = {}, { all = false } = {}) {
  const reply = await client.request("models", { kind, all });
  for (const model of reply.models) {
    let option = select.querySelector(`option[value="${CSS.escape(model.name)}"]`);
    if (!option) {
      option = document.createElement("option");
      option.value = model.name;
      select.append(option);
    }
    const licence = model.license ? ` · ${model.license}` : "";
    option.textContent = `${labels[model.name] || model.name} · ${formatBytes(model.size)}${licence}`;
    option.dataset.size = String(model.size);
    option.dataset.license = model.license || "";
    option.dataset.registry = "true";
  }
  return reply;
}
