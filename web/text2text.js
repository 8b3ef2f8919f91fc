// The Text-to-text view: a T5 (encoder-decoder) turns the input, with a task prefix such as
// "translate English to German: ", into an output streamed token by token. The model comes
// from the registry, a Hub repository at a revision (online), or a folder this server serves
// (`candle-web serve --local-model DIR`): no T5 weights exist offline, so when none is at hand
// the view says how to get one instead of failing. When the server has the demo model that
// `make demo` trains (examples/t5_spell_numbers.py: a tiny T5 that spells out numbers, served
// from <cache>/demo/), it is the offline default, labelled as the demo it is. While `make demo`
// is still training it, the view says how far it got ("demo model still training: 40%") and
// offers the model as soon as it is served, without a reload. Started by app.js.

import { JobStatus, ViewJobs, countOf, describeLoad, describeNotKept, fillModelSelect, formatSeconds, loadModel, runOnCtrlEnter } from "./view_common.js";

const KIND = "t5";
const SOURCE_HUB = "hub";
const SOURCE_FOLDER = "url";
const SOURCE_DEMO = "demo";
// The demo model: where `candle-web serve` serves it, how the view names it, its one task.
const DEMO = {
  folder: "models/local/t5-spell-numbers/",
  // Served only while its trainer runs (examples/t5_spell_numbers.py --progress): JSON with
  // phase ("training" | "evaluating"), step, steps, and checked/held_out while evaluating.
  progress: "models/local/t5-spell-numbers.progress.json",
  label: "demo: spells out numbers (synthetic, trained by candle-web)",
  task: "spell out: ",
  taskLabel: "Spell out a number (the demo model's only task)",
  example: "4821",
  note: "A demo T5 trained in a few minutes by candle-web's own autograd on a synthetic task: it spells out whole numbers from 0 to 9999 and nothing else; it is not a language model.",
  // Listed (not choosable) where this server has not trained it: the offline way to see the
  // view work, and what to do for it.
  notHere: "not trained on this server yet: `make demo` trains it in a minute or two",
};
const HUB_REVISION = /^[0-9a-f]{40}$/;
// How often the view asks how the demo model's training goes: it takes minutes, so a few
// seconds is timely, and the two requests cost nothing.
const TRAINING_POLL_MS = 3000;
const MAX_TOKENS_LIMIT = 512; // candle_web/worker/t5.py refuses more
// What a Hub download failure means here, besides the worker's own message.
const OFFLINE_ERRORS = new Set(["NetworkError", "ModelNotFound"]);

// Shows `text` in `element`, with the `backquoted` parts (commands, paths) as <code>.
function showWithCode(element, text) {
  element.replaceChildren();
  text.split("`").forEach((part, index) => {
    if (index % 2 === 1) {
      const code = document.createElement("code");
      code.textContent = part;
      element.append(code);
    } else {
      element.append(part);
    }
  });
}

const UI_IDS = {
  source: "t2t-source", hubFields: "t2t-hub-fields", repo: "t2t-repo", revision: "t2t-revision",
  folderFields: "t2t-folder-fields", folder: "t2t-folder", hint: "t2t-hint", modelNote: "t2t-model-note",
  task: "t2t-task", input: "t2t-input", maxTokens: "t2t-max-tokens", button: "t2t-button", stop: "t2t-stop",
  notice: "t2t-notice", output: "t2t-output", stats: "t2t-stats", statInput: "t2t-stat-input",
  statSpeed: "t2t-stat-speed",
};

// Is the demo model served here? A HEAD request for its config (404 when it is not).
async function demoServed() {
  try {
    const response = await fetch(DEMO.folder + "config.json", { method: "HEAD", cache: "no-store" });
    return response.ok;
  } catch (error) {
    return false;
  }
}

// The demo model's training progress, or null when no training is going on (404).
async function demoProgress() {
  try {
    const response = await fetch(DEMO.progress, { cache: "no-store" });
    return response.ok ? await response.json() : null;
  } catch (error) {
    return null;
  }
}

// Where the demo model's training progress is shown; only this view needs it, so it is made here.
function makeTrainingNote(after) {
  const note = document.createElement("p");
  note.id = "t2t-demo-training";
  note.className = "note";
  note.setAttribute("role", "status");
  note.hidden = true;
  after.after(note);
  return note;
}

// Why Run is disabled, beside it (and the button described by it).
function makeRunNote(button) {
  const note = document.createElement("p");
  note.id = "t2t-run-note";
  note.className = "note";
  note.hidden = true;
  button.closest(".actions").after(note);
  button.setAttribute("aria-describedby", note.id);
  return note;
}

class Text2textView {
  constructor(client) {
    const $ = (id) => document.getElementById(id);
    this.client = client;
    this.ui = Object.fromEntries(Object.entries(UI_IDS).map(([name, id]) => [name, $(id)]));
    this.status = new JobStatus({ job: $("t2t-job"), progress: $("t2t-progress"), phase: $("t2t-phase"), error: $("t2t-error") });
    // What the tests (and the curious) can read: window.candleWeb.text2text.
    this.state = {
      runtimeReady: false,
      busy: false,
      loadedSource: null, // identity of the loaded model's source (see sourceFields)
      loadedKey: null,
      lastLoad: null,
      lastResult: null,
      lastError: null,
      events: [],
      streamed: { tokens: 0, text: "" },
      jobId: null,
      runs: 0,
      hint: null, // how to get a T5, from the worker
      registryModels: [],
      demoServed: null, // whether this server has the demo model (null until asked)
      demoTraining: null, // the demo model's training progress while it is being trained
      userEdited: false, // model, task or input changed by the user: a late demo model must not switch them
    };
    this.trainingNote = makeTrainingNote(this.ui.modelNote);
    this.runNote = makeRunNote(this.ui.button);
    this.jobs = new ViewJobs({ client, status: this.status, state: this.state, refresh: () => this.refreshButtons() });
  }

  // Why Run cannot run the chosen source yet, or null: a folder or a Hub repository and
  // commit still to be given (the registry's models and the served demo are ready to run).
  missingSource() {
    const { ui } = this;
    if (ui.source.value === SOURCE_FOLDER && ui.folder.value.trim() === "") {
      return "Run needs a model: give the folder on this server that holds a T5, or choose another source.";
    }
    if (ui.source.value === SOURCE_HUB && (!ui.repo.value.trim().includes("/") || !HUB_REVISION.test(ui.revision.value.trim()))) {
      return "Run needs a model: give the Hub repository (owner/name) and its 40-character commit, or choose another source.";
    }
    return null;
  }

  refreshButtons() {
    const { ui, state } = this;
    const missing = this.missingSource();
    ui.button.disabled = state.busy || !state.runtimeReady || missing !== null;
    ui.stop.disabled = !state.busy;
    ui.source.disabled = state.busy;
    this.runNote.textContent = state.runtimeReady && !state.busy && missing !== null ? missing : "";
    this.runNote.hidden = this.runNote.textContent === "";
  }

  showSourceFields() {
    const { ui } = this;
    ui.hubFields.hidden = ui.source.value !== SOURCE_HUB;
    ui.folderFields.hidden = ui.source.value !== SOURCE_FOLDER;
  }

  // {fields for the worker's load, label} of the chosen source; throws with a message to show.
  sourceFields() {
    const { ui } = this;
    if (ui.source.value === SOURCE_HUB) {
      const repo = ui.repo.value.trim();
      const revision = ui.revision.value.trim();
      if (!repo || !revision) throw new Error("Give the Hub repository (owner/name) and its revision (a 40-character commit hash).");
      return { fields: { hf_repo: repo, revision }, label: `${repo}@${revision.slice(0, 12)}` };
    }
    if (ui.source.value === SOURCE_FOLDER) {
      let folder = ui.folder.value.trim().replace(/^\/+/, "");
      if (!folder) throw new Error("Give the folder on this server, e.g. models/local/my-t5/.");
      if (!folder.endsWith("/")) folder += "/";
      return { fields: { url: folder }, label: folder };
    }
    if (ui.source.value === SOURCE_DEMO) return { fields: { url: DEMO.folder }, label: DEMO.label };
    return { fields: { model: ui.source.value }, label: ui.source.value };
  }

  async ensureModel({ fields, label }, track) {
    const { state } = this;
    const identity = JSON.stringify(fields);
    if (state.loadedSource === identity) return state.loadedKey;
    const reply = await loadModel(this.client, KIND, fields, this.status, { label, track, events: state.events });
    state.lastLoad = reply;
    state.loadedSource = identity;
    state.loadedKey = reply.key;
    const m = reply.model;
    this.ui.modelNote.textContent = `${label} loaded: T5 with ${m.encoderLayers}+${m.decoderLayers} layers, d_model ${m.dModel}${m.gated ? ", gated FF (v1.1)" : ""} (${describeLoad(reply)}).${describeNotKept(reply, label)}`;
    return reply.key;
  }

  showNotice(result) {
    const { ui } = this;
    if (!result.truncated) {
      ui.notice.hidden = true;
      ui.notice.textContent = "";
      return;
    }
    ui.notice.textContent = `Truncated: the input has ${result.fullInputTokens} tokens; only the first ${result.inputTokens} (the model's limit of ${result.maxInputTokens}) were used.`;
    ui.notice.hidden = false;
  }

  onProgress(maxTokens) {
    const { ui, state, status } = this;
    return (message) => {
      if (message.phase !== "text2text" || message.event !== "token") return;
      const data = message.data;
      if (data.id !== null) state.streamed.tokens += 1;
      state.streamed.text += data.text;
      ui.output.textContent += data.text;
      status.fraction(state.streamed.tokens / maxTokens);
      status.phase.textContent = `Writing: ${countOf(state.streamed.tokens, "token")} so far…`;
    };
  }

  readMaxTokens() {
    const { ui } = this;
    const value = Number(ui.maxTokens.value);
    if (!Number.isInteger(value) || value < 1 || value > MAX_TOKENS_LIMIT) {
      throw new Error(`Max tokens must be a whole number from 1 to ${MAX_TOKENS_LIMIT}, got “${ui.maxTokens.value}”.`);
    }
    return value;
  }

  // What an error means here, besides the worker's own message: offline, where to get a T5.
  errorHelp(error) {
    const { ui, state } = this;
    if (!OFFLINE_ERRORS.has(error.name) || !state.hint) return "";
    return ui.hint.hidden ? `\n${state.hint.replaceAll("`", "")}` : "\nThe note above says how to get a T5 here.";
  }

  // The form's model, task and input as a job for `jobs`, or null after saying what is wrong.
  prepare() {
    const { ui, state, status } = this;
    const text = ui.input.value;
    if (text.trim() === "") {
      status.showError("Type a text first: it is sent with the task prefix chosen above.");
      ui.input.focus();
      return null;
    }
    let source;
    let maxTokens;
    try {
      source = this.sourceFields();
      maxTokens = this.readMaxTokens();
    } catch (error) {
      status.showError(error.message);
      return null;
    }
    const prompt = ui.task.value + text.trim();
    return {
      reset: () => {
        state.streamed = { tokens: 0, text: "" };
        ui.output.textContent = "";
        ui.stats.hidden = true;
      },
      load: (track) => this.ensureModel(source, track),
      running: { text: "Encoding the input…" },
      command: "text2text",
      fields: (model) => ({ model, prompt, options: { maxTokens } }),
      onProgress: this.onProgress(maxTokens),
      done: (result, model) => {
        state.lastResult = { ...result, model, prompt };
        ui.output.textContent = result.text;
        this.showNotice(result);
        ui.statInput.textContent = countOf(result.inputTokens, "token");
        ui.statSpeed.textContent = `${result.timings.tokensPerSecond.toFixed(1)} tok/s`;
        ui.stats.hidden = false;
        return `Done: ${countOf(result.tokenIds.length, "token")} in ${formatSeconds(result.timings.elapsedMs / 1000)}.`;
      },
      cancelled: () => `Stopped after ${countOf(state.streamed.tokens, "token")}.`,
      errorHelp: (error) => this.errorHelp(error),
    };
  }

  showTraining(progress) {
    this.state.demoTraining = progress;
    const percent = Math.floor((100 * progress.step) / progress.steps);
    const detail = progress.phase === "evaluating"
      ? `measuring its held-out accuracy: ${progress.checked} of ${progress.held_out} numbers`
      : `step ${progress.step} of ${progress.steps}`;
    this.trainingNote.textContent = `Demo model still training: ${percent}% (${detail}); it will be offered in the Model list when done.`;
    this.trainingNote.hidden = false;
  }

  // Polls while the demo model trains, until it is served (then offers it) or the training
  // stops without it. The progress is asked first: the trainer renames the finished folder
  // into place before it removes its progress, so no progress and no folder after it means
  // the run ended without a model.
  async followTraining(progress) {
    const { state } = this;
    while (progress) {
      this.showTraining(progress);
      await new Promise((resolve) => setTimeout(resolve, TRAINING_POLL_MS));
      progress = await demoProgress();
      if (await demoServed()) {
        state.demoServed = true;
        state.demoTraining = null;
        this.trainingNote.hidden = true;
        this.offerDemo(state.registryModels.length === 0 && !state.busy && !state.userEdited);
        this.showSourceFields();
        return;
      }
    }
    state.demoTraining = null;
    showWithCode(this.trainingNote, "The demo model's training stopped before it finished: the terminal that runs `make demo` says why.");
  }

  // The demo model as a source option, selected with its task when nothing better is there.
  offerDemo(selectIt) {
    const { ui } = this;
    const option = this.demoOption();
    option.textContent = DEMO.label;
    option.disabled = false;
    const task = document.createElement("option");
    task.value = DEMO.task;
    task.textContent = DEMO.taskLabel;
    ui.task.prepend(task);
    if (!selectIt) return;
    ui.source.value = SOURCE_DEMO;
    ui.task.value = DEMO.task;
    if (ui.input.value === ui.input.defaultValue) ui.input.value = DEMO.example;
    ui.modelNote.textContent = DEMO.note;
    this.refreshButtons();
  }

  // The demo's option, made (first in the list) if it is not there yet.
  demoOption() {
    const { ui } = this;
    let option = ui.source.querySelector(`option[value="${SOURCE_DEMO}"]`);
    if (option === null) {
      option = document.createElement("option");
      option.value = SOURCE_DEMO;
      ui.source.prepend(option);
    }
    return option;
  }

  // The demo listed but not choosable where this server has not trained it.
  listUnservedDemo() {
    const option = this.demoOption();
    option.textContent = `${DEMO.label}: ${DEMO.notHere.replaceAll("`", "")}`;
    option.disabled = true;
  }

  async showModels() {
    const { ui, state } = this;
    // All asked at once; the page changes only when all answered, in one go.
    const [reply, demo, progress] = await Promise.all(
      [fillModelSelect(this.client, KIND, ui.source), demoServed(), demoProgress()]);
    state.registryModels = reply.models.map((model) => model.name);
    state.hint = reply.hint || null;
    state.demoServed = demo;
    // The registry's models come first; the default is the first one, else the demo model
    // when served, else the folder.
    for (const name of [...state.registryModels].reverse()) {
      ui.source.prepend(ui.source.querySelector(`option[value="${CSS.escape(name)}"]`));
    }
    if (demo) this.offerDemo(state.registryModels.length === 0);
    else this.listUnservedDemo();
    if (state.registryModels.length > 0) {
      ui.source.value = state.registryModels[0];
    } else {
      showWithCode(ui.hint, state.hint);
      ui.hint.hidden = false;
    }
    this.showSourceFields();
    this.refreshButtons();
    if (!demo && progress) this.followTraining(progress);
  }
}

export function setUpText2text(client, ready) {
  const view = new Text2textView(client);
  const { ui, state, jobs } = view;
  const run = () => jobs.run(() => view.prepare());
  const stop = () => jobs.stop();
  ui.source.addEventListener("change", () => view.showSourceFields());
  for (const field of [ui.source, ui.folder, ui.repo, ui.revision]) {
    field.addEventListener(field === ui.source ? "change" : "input", () => view.refreshButtons());
  }
  for (const [element, event] of [[ui.source, "change"], [ui.task, "change"], [ui.input, "input"]]) {
    element.addEventListener(event, () => { state.userEdited = true; });
  }
  ui.button.addEventListener("click", run);
  ui.stop.addEventListener("click", stop);
  runOnCtrlEnter(ui.input, run);
  view.showSourceFields();
  jobs.whenReady(ready, "generated", () => view.showModels());
  return { state, run, stop };
}
