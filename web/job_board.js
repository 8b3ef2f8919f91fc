// Which view's jobs the worker has, and in what order. The worker runs Python jobs one after
// another (a load, a chat turn, a transcription ...), so a job sent while another view's job
// runs waits for it: its view says so ("Waiting for Generate to finish (generating with
// qwen2.5-coder-0.5b-instruct)…") rather than "Loading …" for the seconds or minutes it
// waits, and every tab with a job under way carries a marker, so a person on another tab sees
// where the worker is busy. Used by app.js's WorkerClient (started / progressed / settled) and
// by view_common.js's ViewJobs (own: which view a job belongs to).

// The worker commands that queue for Python (worker.js runPythonJob); init, models and cancel
// never wait.
const QUEUED_COMMANDS = new Set(["load", "transcribe", "embed", "generate", "chat", "text2text", "faces", "eval_twin"]);
// The view of a job no view claimed (the microphone's live passes), by its command or the
// kind of model it loads.
const COMMAND_PANELS = { transcribe: "panel-transcribe", embed: "panel-similarity", text2text: "panel-text2text", generate: "panel-generate", chat: "panel-chat", faces: "panel-faces" };
const KIND_PANELS = { whisper: "panel-transcribe", vad: "panel-transcribe", bert: "panel-similarity", t5: "panel-text2text", faces: "panel-faces" };

// "loading smollm2-135m-instruct", "answering with qwen2.5-coder-0.5b-instruct".
function describeJob(job) {
  const model = job.model ? ` ${job.model}` : "";
  switch (job.type) {
    case "load": return `loading${model || " a model"}`;
    case "generate": return `generating${model && ` with${model}`}`;
    case "chat": return `answering${model && ` with${model}`}`;
    case "transcribe": return "transcribing";
    case "embed": return "comparing sentences";
    case "text2text": return `running${model || " a T5"}`;
    case "faces": return "finding faces";
    default: return job.type;
  }
}

// The tab named by a panel's aria-labelledby: its words, without the busy marker.
function tabOf(panelId) {
  const panel = document.getElementById(panelId);
  return panel ? document.getElementById(panel.getAttribute("aria-labelledby")) : null;
}

function viewName(panelId) {
  const tab = tabOf(panelId);
  return tab ? (tab.dataset.name ?? tab.textContent.trim()) : "another view";
}

export class JobBoard {
  constructor() {
    this.jobs = new Map(); // id -> {type, model, panel, waiting, owner}, in the order sent
    this.onChange = null; // called after any change (the tab markers)
  }

  started(id, type, fields) {
    if (!QUEUED_COMMANDS.has(type)) return;
    const model = fields.model || fields.hf_repo || fields.url || null;
    const panel = COMMAND_PANELS[type] ?? KIND_PANELS[fields.kind] ?? null;
    this.jobs.set(id, { type, model, panel, waiting: false, owner: null });
    this.#update();
  }

  // Job `id` belongs to the view in `panelId`; owner: {onWait(text), onStart()} (its status
  // line while it waits, and when its turn came).
  own(id, panelId, owner) {
    const job = this.jobs.get(id);
    if (!job) return;
    job.panel = panelId;
    job.owner = owner;
    this.#update();
  }

  // A job that sends progress is in Python: its turn came.
  progressed(id) {
    const job = this.jobs.get(id);
    if (job?.waiting) this.#start(job);
  }

  settled(id) {
    if (this.jobs.delete(id)) this.#update();
  }

  // The panels with a job under way: "running" (its turn) or "waiting".
  busyPanels() {
    const panels = new Map();
    for (const job of this.jobs.values()) {
      if (job.panel === null) continue;
      if (!job.waiting || !panels.has(job.panel)) panels.set(job.panel, job.waiting ? "waiting" : "running");
    }
    return panels;
  }

  #start(job) {
    job.waiting = false;
    job.owner?.onStart();
    this.onChange?.();
  }

  // The first job sent is the worker's; each later one waits for it when another view (or no
  // view) owns it. A job of the same view waits too, but its view knows why, so says nothing.
  #update() {
    let first = null;
    for (const job of this.jobs.values()) {
      if (first === null) {
        first = job;
        if (job.waiting) this.#start(job);
        continue;
      }
      if (job.owner === null || job.panel === first.panel) continue;
      const text = `Waiting for ${viewName(first.panel)} to finish (${describeJob(first)})…`;
      if (!job.waiting || job.waitText !== text) {
        job.waiting = true;
        job.waitText = text;
        job.owner.onWait(text);
      }
    }
    this.onChange?.();
  }
}

// Keeps a marker on every tab whose view has a job under way (data-busy="running" or
// "waiting", and words for screen readers), so the tab a person is not on says so.
export function showBusyTabs(board) {
  const tabs = Array.from(document.querySelectorAll('[role="tab"]'));
  for (const tab of tabs) {
    tab.dataset.name = tab.textContent.trim();
    const marker = document.createElement("span");
    marker.className = "tab-busy";
    marker.hidden = true;
    tab.append(marker);
  }
  board.onChange = () => {
    const busy = board.busyPanels();
    for (const tab of tabs) {
      const state = busy.get(tab.getAttribute("aria-controls"));
      const marker = tab.querySelector(".tab-busy");
      if (state) tab.dataset.busy = state;
      else delete tab.dataset.busy;
      marker.hidden = !state;
      marker.textContent = state === "waiting" ? "waiting" : state === "running" ? "working" : "";
    }
  };
}
