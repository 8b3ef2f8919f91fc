// The Chat view: a multi-turn conversation with a LLaMA-family model (the Generate view's
// models, labelled as there), a system prompt, streaming answers with tok/s, Stop,
// regenerate, edit an earlier message (what followed is dropped), clear; conversations kept in this tab's storage, listed,
// deletable, exported and imported as OpenAI messages JSON. Clear and delete offer Undo; each
// conversation keeps its model and settings (a reload reopens it on the model it ran on);
// Enter sends, Shift+Enter starts a new line. Each turn sends the whole
// conversation; the worker's session keeps the KV cache of the previous one and processes only
// the new tokens (shown as "Prompt: 326 tokens: 14 new, 312 reused from the cache."; where the
// backend's steps would not split the prompt exactly, as the page's wasm and numpy, none is
// reused and the line says so). Started by app.js.

import { ChatStore, MAX_IMPORT_BYTES, fromOpenAi, toOpenAi } from "./chat/store.js";
import { describeAnswer, describePrompt, renderList, renderTurns, streamingNode } from "./chat/transcript.js";
import { MODEL_LABELS, OptionError, describeStop, readOptions, selectModel } from "./generate.js";
import { JsonOption, JsonOptionError } from "./structured_output.js";
import { JobStatus, ViewJobs, countOf, describeLoad, describeNotKept, fillModelSelect, loadModel } from "./view_common.js";

const KIND = "llama";
const NUMBER_CONTROLS = [
  { id: "chat-max-tokens", option: "maxTokens", label: "Max tokens", min: 1, max: 2048, integer: true, required: true },
  { id: "chat-temperature", option: "temperature", label: "Temperature", min: 0, max: 10, required: true },
  { id: "chat-seed", option: "seed", label: "Seed", min: 0, max: Number.MAX_SAFE_INTEGER, integer: true, required: true },
  { id: "chat-context", option: "context", label: "Context", min: 16, max: 1_000_000, integer: true },
];
const UI_IDS = {
  modelSelect: "chat-model", modelNote: "chat-model-note", system: "chat-system", list: "chat-list",
  turns: "chat-turns", input: "chat-input", send: "chat-send", stop: "chat-stop", clear: "chat-clear",
  newChat: "chat-new", exportButton: "chat-export", importInput: "chat-import", editNote: "chat-edit-note",
  cancelEdit: "chat-cancel-edit", reuse: "chat-reuse", speed: "chat-speed", notice: "chat-notice",
  undo: "chat-undo", undoText: "chat-undo-text", undoButton: "chat-undo-button",
};
const IDLE_TEXT = "Type a message and press Send (or Enter).";

// The form's numbers, as {options, context}; throws OptionError naming a bad field.
function readNumbers() {
  const { context = null, ...options } = readOptions(document, NUMBER_CONTROLS);
  return { options, context };
}

// The settings boxes as typed ({"chat-max-tokens": "256", ...}), what a conversation keeps,
// with "Answer as JSON" (JSON_SETTING: its switch, kind, schema text and strict flag).
function typedSettings() {
  const typed = Object.fromEntries(NUMBER_CONTROLS.map(({ id }) => [id, document.getElementById(id).value]));
  if (jsonOption !== null) typed[JSON_SETTING] = jsonOption.settings();
  return typed;
}
const JSON_SETTING = "chat-json";
let jsonOption = null; // the view's JsonOption, once made

// Enter sends (as llama.cpp's page and WebLLM do); Shift+Enter starts a new line; Ctrl+Enter
// (Cmd+Enter) sends too. A key that ends an IME composition is the composition's, not a send.
function sendOnEnter(input, send) {
  input.addEventListener("keydown", (event) => {
    if (event.key !== "Enter" || event.shiftKey || event.altKey || event.isComposing) return;
    event.preventDefault();
    send();
  });
}

class ChatView {
  constructor(client) {
    const $ = (id) => document.getElementById(id);
    this.client = client;
    this.ui = Object.fromEntries(Object.entries(UI_IDS).map(([name, id]) => [name, $(id)]));
    this.status = new JobStatus({ job: $("chat-job"), progress: $("chat-progress"), phase: $("chat-phase"), error: $("chat-error") });
    this.store = new ChatStore();
    this.json = jsonOption = new JsonOption($("chat-json-slot"), "chat"); // "Answer as JSON"
    this.modelNoteText = this.ui.modelNote.textContent; // what the note says before a load
    this.editing = null; // the index of the user message being edited, or null
    // What Undo brings back: {kind: "clear", id, messages} or {kind: "delete", ...store.remove's answer}.
    this.undo = null;
    // What the tests (and the curious) can read: window.candleWeb.chat.
    this.state = {
      runtimeReady: false, busy: false, loadedModel: null, lastLoad: null, lastResult: null,
      lastError: null, events: [], streamed: { tokens: 0, text: "" }, jobId: null, runs: 0,
      results: [],
    };
    this.jobs = new ViewJobs({ client, status: this.status, state: this.state, refresh: () => this.render() });
  }

  get conversation() {
    return this.store.current();
  }

  render() {
    const { ui, state, store } = this;
    const busy = state.busy;
    ui.send.disabled = busy || !state.runtimeReady;
    ui.stop.disabled = !busy;
    for (const control of [ui.modelSelect, ui.clear, ui.newChat, ui.importInput, ui.system]) control.disabled = busy;
    this.json.setDisabled(busy);
    ui.system.value = this.conversation.system;
    renderList(ui.list, store, {
      disabled: busy, onOpen: (id) => this.open(id), onDelete: (id) => this.remove(id),
      removed: this.undo?.kind === "delete" ? this.undo : null, onUndo: () => this.undoLast(),
    });
    ui.undo.hidden = this.undo?.kind !== "clear";
    ui.undoButton.disabled = busy;
    if (!busy) {
      renderTurns(ui.turns, this.conversation, { busy, onEdit: (i) => this.startEdit(i), onRegenerate: () => this.regenerate() });
    }
    ui.editNote.hidden = this.editing === null;
    if (this.editing !== null) ui.editNote.querySelector("span").textContent = `Editing message ${this.editing + 1}: sending replaces it and drops what followed. `;
  }

  open(id) {
    this.store.open(id);
    this.showConversation();
  }

  // After the open conversation changed (opened, new, deleted, brought back): its model and
  // settings in the form, a fresh status line, no edit or undo pending.
  showConversation() {
    this.editing = null;
    this.undo = null;
    this.applySettings();
    this.resetStatus();
    this.render();
  }

  // The status of the previous conversation's last turn does not describe this one.
  resetStatus() {
    const { ui, status } = this;
    status.set("idle", IDLE_TEXT);
    status.fraction(0);
    status.clearError();
    ui.reuse.textContent = "";
    ui.reuse.title = "";
    ui.speed.textContent = "";
    ui.notice.hidden = true;
  }

  // The open conversation's model and settings into the form. A chat whose model this page
  // does not offer (e.g. one opened with ?models=all before) says which model it goes on with.
  applySettings() {
    const { ui } = this;
    const conversation = this.conversation;
    for (const [id, value] of Object.entries(conversation.settings || {})) {
      const input = document.getElementById(id);
      if (input && typeof value === "string") input.value = value;
    }
    this.json.restore(conversation.settings?.[JSON_SETTING]); // off for a chat kept without it
    if (!conversation.model) return;
    if (selectModel(ui.modelSelect, conversation.model)) {
      if (ui.modelNote.dataset.notOffered) ui.modelNote.textContent = this.modelNoteText;
      delete ui.modelNote.dataset.notOffered;
    } else if (ui.modelSelect.querySelector("option[data-registry]")) { // the list is the registry's, not the page's first guess
      const wanted = MODEL_LABELS[conversation.model] || conversation.model;
      const current = MODEL_LABELS[ui.modelSelect.value] || ui.modelSelect.value;
      ui.modelNote.textContent = `This chat ran on ${wanted}, which this page does not offer; the next turn runs on ${current}.`;
      ui.modelNote.dataset.notOffered = "true";
    }
  }

  // The form changed: the open conversation keeps the new model and settings.
  keepSettings() {
    const conversation = this.conversation;
    conversation.model = this.ui.modelSelect.value;
    conversation.settings = typedSettings();
    this.store.save();
  }

  remove(id) {
    const removed = this.store.remove(id);
    this.showConversation();
    this.undo = removed && { kind: "delete", ...removed };
    this.render();
    this.ui.list.querySelector(".chat-undo-delete")?.focus();
  }

  undoLast() {
    const undo = this.undo;
    if (undo === null || this.state.busy) return;
    if (undo.kind === "delete") {
      this.store.restore(undo);
      this.showConversation();
      this.ui.list.querySelector("li[aria-current='true'] .chat-open")?.focus();
      return;
    }
    const conversation = this.store.conversations.find((c) => c.id === undo.id);
    this.undo = null;
    if (conversation) {
      conversation.messages = undo.messages;
      this.store.touch(conversation);
    }
    this.render();
    this.ui.input.focus();
  }

  startEdit(index) {
    this.editing = index;
    this.ui.input.value = this.conversation.messages[index].content;
    this.ui.input.focus();
    this.render();
  }

  async ensureModel(model, track) {
    const { state } = this;
    if (state.loadedModel === model && this.client.holds(KIND, model)) return;
    const label = MODEL_LABELS[model] || model;
    const reply = await loadModel(this.client, KIND, { model }, this.status, { label, track, events: state.events });
    state.lastLoad = reply;
    state.loadedModel = reply.key;
    delete this.ui.modelNote.dataset.notOffered;
    // Without the vendored jinja2 the prompts use a built-in format: say so (chatTemplateNote).
    const templateNote = reply.model.chatTemplateNote ? ` Note: ${reply.model.chatTemplateNote}.` : "";
    this.ui.modelNote.textContent = `${label} loaded (${describeLoad(reply)}); context ${reply.model.context} tokens.${templateNote}${describeNotKept(reply, label)}`;
  }

  // The prompt pass: tokens run and reused; the worker's reason, where none can be, on hover.
  showPrompt(prompt) {
    this.ui.reuse.textContent = describePrompt(prompt);
    this.ui.reuse.title = prompt.reuseNote || "";
  }

  // Streaming: the prompt pass (with what the cache reused), then one event per token.
  onProgress(show) {
    const { ui, state } = this;
    let firstTokenAt = null;
    return (message) => {
      if (message.phase !== "chat") return;
      const data = message.data;
      if (message.event === "prompt") {
        this.showPrompt({ newTokens: data.new_tokens, reusedTokens: data.reused, reuseNote: data.reuse_note });
        ui.notice.textContent = data.notice || "";
        ui.notice.hidden = !data.notice;
        this.status.set("generating", "Writing…");
      } else if (message.event === "token") {
        if (data.id !== null) state.streamed.tokens += 1;
        state.streamed.text += data.text;
        show(state.streamed.text);
        const now = performance.now();
        if (firstTokenAt === null) firstTokenAt = now;
        const seconds = (now - firstTokenAt) / 1000;
        ui.speed.textContent = describeAnswer(state.streamed.tokens, seconds > 0 ? (state.streamed.tokens - 1) / seconds : 0);
      }
    };
  }

  // A turn answering the last (user) message of `messages`, as a job for `jobs`.
  turn(messages, { restoreInput = "" } = {}) {
    const { ui, state } = this;
    let numbers;
    let responseFormat;
    try {
      numbers = readNumbers();
      responseFormat = this.json.responseFormat();
    } catch (error) {
      if (!(error instanceof OptionError || error instanceof JsonOptionError)) throw error;
      this.status.showError(error.message);
      return null;
    }
    const conversation = this.conversation;
    const before = conversation.messages;
    const model = ui.modelSelect.value;
    let show = null;
    return {
      reset: () => {
        state.streamed = { tokens: 0, text: "" };
        conversation.messages = messages;
        conversation.model = model;
        conversation.settings = typedSettings();
        this.editing = null;
        this.undo = null;
        this.store.touch(conversation);
        renderTurns(ui.turns, conversation, { busy: true });
        show = streamingNode(ui.turns);
        ui.input.value = "";
      },
      load: (track) => this.ensureModel(model, track),
      running: { text: "Reading the conversation…" },
      command: "chat",
      fields: () => ({ model, messages: toOpenAi({ system: conversation.system, messages }), context: numbers.context, options: numbers.options, ...(responseFormat ? { responseFormat } : {}) }),
      onProgress: this.onProgress((text) => show(text)),
      done: (result) => this.finish(conversation, messages, result),
      cancelled: () => {
        conversation.messages = before; // stopped before any answer: nothing to keep
        this.store.touch(conversation);
        ui.input.value = restoreInput;
        return "Stopped before the answer began.";
      },
      // The worker keeps one llama model: another view may have loaded a different one.
      errorHelp: (error) => (error.name === "ModelNotFound" ? " Send again to load the model." : this.json.showWorkerError(error)),
      cleanup: () => {
        if (state.lastError?.name === "ModelNotFound") state.loadedModel = null;
        conversation.messages = before;
        this.store.touch(conversation);
        ui.input.value = restoreInput;
      },
    };
  }

  finish(conversation, messages, result) {
    const { ui, state } = this;
    conversation.messages = [...messages, { role: "assistant", content: result.text }];
    this.store.touch(conversation);
    state.lastResult = result;
    state.results.push(result);
    this.showPrompt(result);
    ui.notice.textContent = result.notice || "";
    ui.notice.hidden = !result.notice;
    const speed = result.timings.tokensPerSecond;
    if (speed !== undefined) ui.speed.textContent = describeAnswer(result.tokenIds.length, speed);
    const tokens = countOf(result.tokenIds.length, "token");
    if (result.stopReason === "cancelled") return `Stopped after ${tokens}; the partial answer is kept.`;
    return `Done: ${tokens}; ${describeStop(result.stopReason)}.`;
  }

  send() {
    const text = this.ui.input.value;
    if (text.trim() === "") {
      this.status.showError("Type a message first.");
      this.ui.input.focus();
      return null;
    }
    let base = this.conversation.messages;
    if (this.editing !== null) base = base.slice(0, this.editing);
    if (base.at(-1)?.role === "user") base = base.slice(0, -1); // an unanswered message is replaced
    return this.turn([...base, { role: "user", content: text }], { restoreInput: text });
  }

  regenerate() {
    const messages = this.conversation.messages;
    if (messages.at(-1)?.role !== "assistant") return;
    this.jobs.run(() => this.turn(messages.slice(0, -1)));
  }

  // Clear empties the conversation at once and offers Undo in its place until the next change.
  clear() {
    const conversation = this.conversation;
    if (conversation.messages.length === 0) return;
    const undo = { kind: "clear", id: conversation.id, messages: conversation.messages };
    conversation.messages = [];
    this.store.touch();
    this.showConversation();
    this.undo = undo;
    const count = undo.messages.length;
    this.ui.undoText.textContent = `Cleared ${count} message${count === 1 ? "" : "s"}.`;
    this.render();
    this.ui.undoButton.focus();
  }

  // A new chat starts with the open one's system prompt, model and settings.
  newChat() {
    const { system } = this.conversation;
    this.store.create({ system, model: this.ui.modelSelect.value, settings: typedSettings() });
    this.showConversation();
  }

  exportJson() {
    const conversation = this.conversation;
    const blob = new Blob([`${JSON.stringify(toOpenAi(conversation), null, 2)}\n`], { type: "application/json" });
    const link = document.createElement("a");
    link.href = URL.createObjectURL(blob);
    link.download = `${(conversation.title || "chat").replace(/[^\w.-]+/g, "_").slice(0, 40)}.json`;
    link.click();
    setTimeout(() => URL.revokeObjectURL(link.href), 0);
  }

  async importJson(file) {
    this.status.clearError();
    try {
      if (file.size > MAX_IMPORT_BYTES) throw new Error(`larger than ${MAX_IMPORT_BYTES} bytes`);
      this.store.create({ ...fromOpenAi(JSON.parse(await file.text())), model: this.ui.modelSelect.value, settings: typedSettings() });
      this.showConversation();
      this.status.set("done", `Imported ${file.name}.`);
    } catch (error) {
      this.status.showError(`Import of ${file.name} failed: ${error.message}`);
    }
    this.editing = null;
    this.render();
  }
}

export function setUpChat(client, ready) {
  const view = new ChatView(client);
  const { ui, jobs } = view;
  const send = () => jobs.run(() => view.send());
  ui.send.addEventListener("click", send);
  ui.stop.addEventListener("click", () => jobs.stop());
  ui.clear.addEventListener("click", () => view.clear());
  ui.undoButton.addEventListener("click", () => view.undoLast());
  ui.modelSelect.addEventListener("change", () => view.keepSettings());
  for (const { id } of NUMBER_CONTROLS) document.getElementById(id).addEventListener("change", () => view.keepSettings());
  view.json.details.addEventListener("change", () => view.keepSettings());
  ui.newChat.addEventListener("click", () => view.newChat());
  ui.exportButton.addEventListener("click", () => view.exportJson());
  ui.cancelEdit.addEventListener("click", () => { view.editing = null; ui.input.value = ""; view.render(); });
  ui.importInput.addEventListener("change", () => {
    const file = ui.importInput.files[0];
    if (file) view.importJson(file).finally(() => { ui.importInput.value = ""; });
  });
  ui.system.addEventListener("change", () => {
    view.conversation.system = ui.system.value;
    view.store.touch();
  });
  sendOnEnter(ui.input, () => { if (!ui.send.disabled) send(); }); // as the button: not while busy or starting
  view.showConversation();
  // The saved chat's model can be chosen once the registry's models are listed.
  jobs.whenReady(ready, "chatted with", async () => {
    await fillModelSelect(client, KIND, ui.modelSelect, MODEL_LABELS);
    if (!view.state.busy) view.applySettings();
  });
  return { state: view.state, view, send, stop: () => jobs.stop() };
}
