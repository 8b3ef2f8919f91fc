// What the text views (Similarity, Generate, Text-to-text) share: number formatting, the
// job status line (progress bar + phase text) and loading a model into the worker with
// byte-level progress. The Transcribe view keeps its own copies (it came first).

export function formatBytes(bytes) {
  if (bytes >= 1e6) return `${(bytes / 1e6).toFixed(bytes >= 1e8 ? 0 : 1)} MB`;
  if (bytes >= 1e3) return `${(bytes / 1e3).toFixed(0)} kB`;
  return `${bytes} B`;
}

export function formatSeconds(seconds) {
  return `${seconds.toFixed(seconds < 10 ? 2 : 1)} s`;
}

// The progress bar and phase line of one view, plus its inline error box.
export class JobStatus {
  constructor({ job, progress, phase, error }) {
    this.job = job;
    this.progress = progress;
    this.phase = phase;
    this.error = error;
  }

  set(state, text) {
    this.job.dataset.state = state;
    if (text !== undefined) this.phase.textContent = text;
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
  }

  clearError() {
    this.error.textContent = "";
    this.error.hidden = true;
  }
}

// Loads a model of `kind` (fields: {model} | {hf_repo, revision} | {url}) and reports its
// progress on `status`; resolves with the worker's load reply. `track(job)` receives the
// started job (so a Stop button can cancel the load), `events` collects the progress messages.
export async function loadModel(client, kind, fields, status, { label, track, events } = {}) {
  const name = label || fields.model || fields.hf_repo || fields.url;
  status.set("loading", `Loading ${name}…`);
  status.fraction(0);
  const onProgress = (message) => {
    events?.push({ phase: message.phase, state: message.state, file: message.file, cached: message.cached });
    if (message.phase === "download" && message.state === "running") {
      const amount = `${formatBytes(message.loaded)} of ${formatBytes(message.total)}`;
      status.fraction(message.total ? message.loaded / message.total : 0);
      status.phase.textContent = message.cached
        ? `Reading ${message.file} from this browser's cache (no download): ${amount}`
        : `Downloading ${message.file}: ${amount}`;
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

// "(from this browser's cache)" or "(12.3 MB downloaded)", and the build time.
export function describeLoad(reply) {
  const source = reply.cached ? "from this browser's cache, no download" : `${formatBytes(reply.downloadedBytes)} downloaded`;
  return `${source}; built in ${formatSeconds(reply.timingsMs.build / 1000)}`;
}

// Fills a <select> with the registry's browser models of `kind` (sizes included); keeps the
// options it already has when the list is unavailable. Resolves with the worker's reply.
export async function fillModelSelect(client, kind, select, labels = {}) {
  const reply = await client.request("models", { kind });
  for (const model of reply.models) {
    let option = select.querySelector(`option[value="${CSS.escape(model.name)}"]`);
    if (!option) {
      option = document.createElement("option");
      option.value = model.name;
      select.append(option);
    }
    option.textContent = `${labels[model.name] || model.name} · ${formatBytes(model.size)}`;
    option.dataset.size = String(model.size);
    option.dataset.registry = "true";
  }
  return reply;
}
