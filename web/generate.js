// The Generate view: a LLaMA-family model from a GGUF file (SmolLM2-135M-Instruct Q4_1,
// Qwen2.5-Coder-0.5B-Instruct Q4_K_M) writes a continuation of the prompt, or a chat answer
// (the model's own chat template), token by token; sampling settings as in Candle's examples;
// Stop cancels. The picker shows each model's licence; ?models=all also offers the models
// the page loads only when asked for (Gemma-3-270M, whose terms are shown once it is loaded).
// Started by app.js.

import { renderFencedCode, renderMarkdown } from "./chat/markdown.js";
import { JsonOption, JsonOptionError, showJsonAnswer } from "./structured_output.js";
import { JobStatus, ViewJobs, countOf, describeLoad, describeNotKept, fillModelSelect, formatBytes, formatSeconds, loadModel, runOnCtrlEnter } from "./view_common.js";

const KIND = "llama";
export const MODEL_LABELS = {
  "smollm2-135m-instruct": "SmolLM2-135M-Instruct (Q4_1)",
  "qwen2.5-coder-0.5b-instruct": "Qwen2.5-Coder-0.5B-Instruct (Q4_K_M)",
  "gemma3-270m-q4km": "Gemma-3-270M base (Q4_K_M)",
};
const GEMMA_TERMS = "Gemma is provided under and subject to the Gemma Terms of Use found at ai.google.dev/gemma/terms.";
// ?models=all: list every browser model of the registry, not only the offered ones.
const ALL_MODELS = new URLSearchParams(self.location?.search || "").get("models") === "all";

// What the page says about a loaded model's licence (the Gemma terms in full where they apply).
function licenceNote(licence) {
  if (!licence) return "";
  return /gemma/i.test(licence) ? ` Licence: ${licence}. ${GEMMA_TERMS}` : ` Licence: ${licence}.`;
}
// Each control: its element id, the option name the worker takes, and its valid range.
// An empty box means "not set" (top-k, top-p: no mask).
const NUMBER_CONTROLS = [
  { id: "generate-max-tokens", option: "maxTokens", label: "Max tokens", min: 1, max: 2048, integer: true, required: true },
  { id: "generate-temperature", option: "temperature", label: "Temperature", min: 0, max: 10, required: true },
  { id: "generate-top-k", option: "topK", label: "Top-k", min: 1, max: 1_000_000, integer: true },
  { id: "generate-top-p", option: "topP", label: "Top-p", min: 0.01, max: 1 },
  { id: "generate-seed", option: "seed", label: "Seed", min: 0, max: Number.MAX_SAFE_INTEGER, integer: true, required: true },
  { id: "generate-repeat-penalty", option: "repeatPenalty", label: "Repeat penalty", min: 0.01, max: 10, required: true },
];

export class OptionError extends Error {}

// The sampling options from the form (`controls`: this view's, or another text view's list
// of the same shape); throws OptionError naming a bad field.
export function readOptions(doc = document, controls = NUMBER_CONTROLS) {
  const options = {};
  for (const control of controls) {
    const raw = doc.getElementById(control.id).value.trim();
    if (raw === "") {
      if (control.required) throw new OptionError(`${control.label} is empty.`);
      continue;
    }
    const value = Number(raw);
    if (!Number.isFinite(value) || value < control.min || value > control.max || (control.integer && !Number.isInteger(value))) {
      const kind = control.integer ? "a whole number" : "a number";
      throw new OptionError(`${control.label} must be ${kind} from ${control.min} to ${control.max}, got “${raw}”.`);
    }
    options[control.option] = value;
  }
  return options;
}

// Chooses `model` in a model <select> if the select offers it; false (the choice left as it
// was) if not, or if no model is given.
export function selectModel(select, model) {
  if (!model || !select.querySelector(`option[value="${CSS.escape(model)}"]`)) return false;
  select.value = model;
  return true;
}

// The model picked last, kept across reloads: a reload must not quietly move a Qwen user back
// to the first model of the list.
const CHOICE_KEY = "candle-web.generate.v1";

function savedModelChoice() {
  try {
    return JSON.parse(localStorage.getItem(CHOICE_KEY) || "null")?.model ?? null;
  } catch {
    return null; // unreadable or blocked storage: the list's first model
  }
}

function keepModelChoice(model) {
  try {
    localStorage.setItem(CHOICE_KEY, JSON.stringify({ model }));
  } catch (error) {
    console.warn("model choice not saved (storage full or blocked):", error);
  }
}

// Why a generation ended, as the end of the status line says it (Chat says the same).
const STOP_REASONS = {
  eos: "the model finished its answer",
  stop_string: "a stop string ended it",
  max_tokens: "it reached Max tokens",
  context_length: "it reached the model's context length",
};

export function describeStop(reason) {
  return STOP_REASONS[reason] || `it ended (${reason})`;
}

const UI_IDS = {
  modelSelect: "generate-model", modelNote: "generate-model-note", prompt: "generate-prompt",
  chat: "generate-chat", button: "generate-button", stop: "generate-stop", output: "generate-output",
  stats: "generate-stats", statTokens: "generate-stat-tokens", statSpeed: "generate-stat-speed",
  statPrompt: "generate-stat-prompt",
};

class GenerateView {
  constructor(client) {
    const $ = (id) => document.getElementById(id);
    this.client = client;
    this.ui = Object.fromEntries(Object.entries(UI_IDS).map(([name, id]) => [name, $(id)]));
    this.status = new JobStatus({ job: $("generate-job"), progress: $("generate-progress"), phase: $("generate-phase"), error: $("generate-error") });
    // What the tests (and the curious) can read: window.candleWeb.generate.
    this.state = {
      runtimeReady: false,
      busy: false,
      loadedModel: null,
      lastLoad: null,
      lastResult: null,
      lastError: null,
      events: [],
      streamed: { tokens: 0, text: "" }, // the token events of the last run
      jobId: null,
      runs: 0,
    };
    this.json = new JsonOption($("generate-json-slot"), "generate"); // "Answer as JSON"
    this.jobs = new ViewJobs({ client, status: this.status, state: this.state, refresh: () => this.refreshButtons() });
  }

  refreshButtons() {
    const { ui, state } = this;
    ui.button.disabled = state.busy || !state.runtimeReady;
    ui.stop.disabled = !state.busy;
    ui.modelSelect.disabled = state.busy;
    this.json.setDisabled(state.busy);
  }

  async ensureModel(model, track) {
    const { state } = this;
    if (state.loadedModel === model && this.client.holds(KIND, model)) return;
    const reply = await loadModel(this.client, KIND, { model }, this.status, { label: MODEL_LABELS[model] || model, track, events: state.events });
    state.lastLoad = reply;
    state.loadedModel = reply.key;
    const option = this.ui.modelSelect.selectedOptions[0];
    // Without the vendored jinja2, --chat prompts use a built-in format: say so, as Chat does.
    const templateNote = reply.model?.chatTemplateNote ? ` Note: ${reply.model.chatTemplateNote}.` : "";
    this.ui.modelNote.textContent = `${MODEL_LABELS[model] || model} loaded (${describeLoad(reply)}).${licenceNote(option?.dataset.license)}${templateNote}${describeNotKept(reply, MODEL_LABELS[model] || model)}`;
  }

  showSpeed(tokens, tokensPerSecond) {
    const { ui } = this;
    ui.statTokens.textContent = String(tokens);
    ui.statSpeed.textContent = tokensPerSecond > 0 ? `${tokensPerSecond.toFixed(1)} tok/s` : "–";
    ui.stats.hidden = false;
  }

  // The output: a chat answer is Markdown (lists, code blocks, as in Chat); a continuation is
  // shown as written, only its ``` fences as code blocks.
  showOutput(text, chat) {
    const { output } = this.ui;
    output.classList.toggle("markdown", chat);
    (chat ? renderMarkdown : renderFencedCode)(output, text);
  }

  // Progress events of one generation: the prompt pass, then one event per token.
  onProgress(maxTokens, chat) {
    const { ui, state, status } = this;
    let firstTokenAt = null;
    return (message) => {
      if (message.phase !== "generate") return;
      const data = message.data;
      if (message.event === "prompt") {
        ui.statPrompt.textContent = `${countOf(data.n_tokens, "token")} in ${formatSeconds(data.seconds)}`;
        status.set("generating", "Writing…");
        status.fraction(0);
      } else if (message.event === "token") {
        // The last event may carry only held-back text (id null), not a new token.
        if (data.id !== null) state.streamed.tokens += 1;
        state.streamed.text += data.text;
        this.showOutput(state.streamed.text, chat);
        const now = performance.now();
        if (firstTokenAt === null) firstTokenAt = now;
        // Decode speed: tokens after the first, over the time since the first arrived.
        const seconds = (now - firstTokenAt) / 1000;
        this.showSpeed(state.streamed.tokens, seconds > 0 ? (state.streamed.tokens - 1) / seconds : 0);
        status.fraction(state.streamed.tokens / maxTokens);
        const memory = message.heapBytes ? `; ${formatBytes(message.heapBytes)} of memory in use` : "";
        status.phase.textContent = `Writing: ${countOf(state.streamed.tokens, "token")} so far${memory}…`;
      }
    };
  }

  // The form's prompt and options, or null after saying what is wrong.
  #readForm() {
    const { ui, status } = this;
    const prompt = ui.prompt.value;
    if (prompt.trim() === "") {
      status.showError("Type a prompt first: a question (chat) or a text to continue.");
      ui.prompt.focus();
      return null;
    }
    try {
      return { prompt, options: readOptions(), model: ui.modelSelect.value, chat: ui.chat.checked, responseFormat: this.json.responseFormat() };
    } catch (error) {
      if (!(error instanceof OptionError || error instanceof JsonOptionError)) throw error;
      status.showError(error.message);
      return null;
    }
  }

  // The form as a job for `jobs`, or null after saying what is wrong.
  prepare() {
    const { ui, state } = this;
    const form = this.#readForm();
    if (form === null) return null;
    const { prompt, options, model, chat, responseFormat } = form;
    return {
      reset: () => {
        state.streamed = { tokens: 0, text: "" };
        ui.output.textContent = "";
        ui.stats.hidden = true;
        ui.statPrompt.textContent = "–";
      },
      load: (track) => this.ensureModel(model, track),
      running: { text: "Reading the prompt…" },
      command: "generate",
      fields: () => ({ model, prompt, chat, options, ...(responseFormat ? { responseFormat } : {}) }),
      onProgress: this.onProgress(options.maxTokens, chat),
      done: (result) => {
        state.lastResult = { ...result, model, prompt, chat, options, responseFormat };
        if (responseFormat) showJsonAnswer(ui.output, result.text); // formatted JSON
        else this.showOutput(result.text, chat); // the final text (a held-back stop string removed)
        this.showSpeed(result.tokenIds.length, result.timings.tokensPerSecond);
        const memory = result.heap ? ` Memory in use: ${formatBytes(result.heap.endBytes)}.` : "";
        return `Done: ${countOf(result.tokenIds.length, "token")} at ${result.timings.tokensPerSecond.toFixed(1)} tokens/s; ${describeStop(result.stopReason)}.${memory}`;
      },
      cancelled: () => `Stopped after ${countOf(state.streamed.tokens, "token")}.`,
      errorHelp: (error) => this.json.showWorkerError(error), // a bad schema: shown by its field too
    };
  }
}

export function setUpGenerate(client, ready) {
  const view = new GenerateView(client);
  const { ui, jobs } = view;
  const run = () => jobs.run(() => view.prepare());
  const stop = () => jobs.stop();
  ui.button.addEventListener("click", run);
  ui.stop.addEventListener("click", stop);
  runOnCtrlEnter(ui.prompt, run);
  ui.modelSelect.addEventListener("change", () => keepModelChoice(ui.modelSelect.value));
  jobs.whenReady(ready, "generated", async () => {
    await fillModelSelect(client, KIND, ui.modelSelect, MODEL_LABELS, { all: ALL_MODELS });
    const saved = savedModelChoice();
    if (!view.state.busy && !selectModel(ui.modelSelect, saved) && saved) {
      const label = MODEL_LABELS[saved] || saved;
      ui.modelNote.textContent = `${label}, chosen last time, is not offered on this page${ALL_MODELS ? "" : " (?models=all lists every model)"}; ${MODEL_LABELS[ui.modelSelect.value] || ui.modelSelect.value} is selected.`;
    }
  });
  return { state: view.state, run, stop };
}
