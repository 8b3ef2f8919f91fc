// The Transcribe view's form: the model (loaded into the worker with byte-level progress),
// language and task (multilingual models only), beam size and timestamps.

import { describeDownloadAmount, describeLoad, describeNotKept, fillModelSelect, notKeptNote } from "../view_common.js";
import { FILE_PHASES, KIND, MAX_BEAM_SIZE, MODEL_LABELS, WHISPER_LANGUAGES, isMultilingual, languageName } from "./format.js";

export class ModelForm {
  constructor({ client, ui, state, status, jobs }) {
    this.client = client;
    this.ui = ui;
    this.state = state;
    this.status = status;
    this.jobs = jobs;
    this.multilingualModels = {}; // model name -> true/false once a load reply said so
  }

  get model() {
    return this.ui.modelSelect.value;
  }

  isMultilingual(model = this.model) {
    return isMultilingual(model, this.multilingualModels);
  }

  // The registry's Whisper models with their sizes; options it does not list go.
  async showModelSizes() {
    const { ui } = this;
    const { models } = await fillModelSelect(this.client, KIND, ui.modelSelect, MODEL_LABELS);
    const known = new Set(models.map((model) => model.name));
    for (const option of [...ui.modelSelect.options]) {
      if (!known.has(option.value)) option.remove();
    }
    this.showLanguageTask();
  }

  fillLanguages() {
    const names = WHISPER_LANGUAGES.map((code) => [code, languageName(code)]);
    names.sort((a, b) => a[1].localeCompare(b[1], "en"));
    for (const [code, name] of names) {
      const option = document.createElement("option");
      option.value = code;
      option.textContent = name === code ? code : `${name} (${code})`;
      this.ui.languageSelect.append(option);
    }
  }

  // Language and task apply to multilingual models only; an English-only one says so.
  showLanguageTask() {
    const { ui } = this;
    const model = this.model;
    const multilingual = this.isMultilingual(model);
    ui.languageTask.disabled = !multilingual || this.state.busy;
    ui.languageTask.dataset.multilingual = String(multilingual);
    ui.languageTask.querySelector(".settings-grid").hidden = !multilingual;
    ui.languageNote.textContent = multilingual
      ? "Detects the spoken language unless you pick one; Translate gives English text from any of them."
      : `${model} is English-only: it transcribes English and does not translate. Pick Whisper base for other languages.`;
  }

  // The model note after the choice changed.
  showModelNote() {
    this.ui.modelNote.textContent = this.state.loadedModel === this.model
      ? `${this.model} is loaded.`
      : "Downloaded once when you transcribe, then kept in this browser's cache.";
    this.showLanguageTask();
  }

  onLoadProgress(message) {
    const { ui } = this;
    this.state.events.push({ phase: message.phase, state: message.state, cached: message.cached, file: message.file });
    if (message.phase === "download" && message.state === "not-kept") {
      this.notKept = ` · ${notKeptNote(this.model, message.reason)}`; // said with the download's progress
    } else if (message.phase === "download" && message.state === "running") {
      const what = FILE_PHASES[message.file] || message.file;
      const amount = describeDownloadAmount(message);
      this.status.lastDownload = message;
      ui.progress.value = message.total ? message.loaded / message.total : 0;
      ui.phase.textContent = message.cached
        ? `Reading the model ${what} from this browser's cache (no download): ${amount}`
        : `Downloading the model ${what} (${message.file}): ${amount}${this.notKept ?? ""}`;
      ui.phase.dataset.cached = String(Boolean(message.cached));
    } else if (message.phase === "verify") {
      ui.phase.textContent = `Checking the sha256 of ${message.file}…`;
    } else if (message.phase === "build" && message.state === "start") {
      ui.progress.removeAttribute("value"); // indeterminate while Python builds the model
      ui.phase.textContent = "Building the model in Python…";
    }
  }

  async ensureModel(model, track = this.jobs.track) {
    const { state } = this;
    if (state.loadedModel === model) return;
    this.status.set("loading", `Loading ${model}…`);
    this.notKept = null;
    const job = this.client.start("load", { model }, { onProgress: (message) => this.onLoadProgress(message) });
    track(job);
    const reply = await job.result;
    state.lastLoad = reply;
    state.loadedModel = reply.key;
    if (typeof reply.model?.multilingual === "boolean") this.multilingualModels[model] = reply.model.multilingual;
    this.ui.modelNote.textContent = `${model} loaded (${describeLoad(reply)}).${describeNotKept(reply, model)}`;
    this.showLanguageTask();
  }

  // Silero VAD beside Whisper, once a worker (the "Skip silence" option needs it).
  async ensureVad(track = this.jobs.track) {
    const { state } = this;
    if (state.vadLoaded) return;
    this.status.set("loading", "Loading Silero VAD…");
    const job = this.client.start("load", { kind: "vad", model: "silero-vad" },
      { onProgress: (message) => this.onLoadProgress(message) });
    track(job);
    await job.result;
    state.vadLoaded = true;
  }

  // The worker's transcribe options from the form (the command line's defaults when
  // untouched), or null after showing what is wrong.
  options(model) {
    const { ui } = this;
    const options = {};
    const beamText = ui.beamSize.value.trim();
    if (beamText !== "") {
      const beam = Number(beamText);
      if (!Number.isInteger(beam) || beam < 1 || beam > MAX_BEAM_SIZE) {
        this.status.showError(`Beam size must be a whole number from 1 to ${MAX_BEAM_SIZE} (leave it empty for greedy decoding); got ${beamText}.`);
        ui.beamSize.focus();
        return null;
      }
      options.beam_size = beam;
    }
    if (!ui.timestamps.checked) options.without_timestamps = true;
    else if (ui.wordTimestamps.checked) options.word_timestamps = true;
    if (ui.vad.checked) options.vad = true;
    if (this.isMultilingual(model)) {
      if (ui.languageSelect.value) options.language = ui.languageSelect.value;
      options.task = ui.taskTranslate.checked ? "translate" : "transcribe";
    }
    return options;
  }
}
