// The Transcribe view's entries: files (dropped, picked, several at once), sample clips and
// recordings, each decoded to 16 kHz mono in the page, listed, and transcribed in turn by the
// worker (one at a time: the queue waits while the runtime, a model or another entry runs).
//
// An entry's status: "decoding" (its audio is being read), "ready" (waits for Transcribe),
// "queued" (transcribed as soon as the worker is free), "running", "live" (a live recording),
// "done", "cancelled", "error".

import { AudioInputError, SAMPLE_RATE, decodeToMono16k } from "../audio_input.js";
import { formatSeconds } from "../view_common.js";
import { SAMPLES_BASE_URL, SAMPLES_MANIFEST_URL, STATUS_LABELS, describeSpeed, formatAmount } from "./format.js";
import { transcribeProgress } from "./transcript.js";

const BUSY_STATUSES = ["running", "live", "decoding"];

export class EntryQueue {
  constructor(view) {
    this.view = view; // {ui, state, status, jobs, form, transcript, microphone}
    this.nextItemId = 1;
    this.pumping = false;
  }

  waiting() {
    return this.view.state.items.filter((item) => item.status === "queued" || (item.status === "decoding" && item.want === "queued"));
  }

  // The buttons and the form as the state allows.
  refreshButtons() {
    const { ui, state, form } = this.view;
    const queued = this.waiting().length;
    const readyItems = state.items.filter((item) => item.status === "ready").length;
    const runnable = readyItems > 0 || (state.clip !== null && state.clip.samples !== null && !BUSY_STATUSES.includes(state.clip.status));
    ui.transcribeButton.disabled = state.busy || !state.runtimeReady || !runnable;
    let label = "Transcribe";
    if (queued > 0 && !state.runtimeReady) {
      label = queued === 1 ? "Queued: transcribes when ready" : `${queued} queued: transcribed when ready`;
    } else if (queued > 0 && state.busy) {
      label = `${queued} queued: next when this one is done`;
    } else if (readyItems > 1) {
      label = `Transcribe ${readyItems} files`;
    }
    ui.transcribeButton.textContent = label;
    ui.transcribeButton.dataset.queued = String(queued);
    ui.cancelButton.disabled = !state.busy;
    ui.modelSelect.disabled = state.busy;
    ui.recordButton.disabled = state.recording || (ui.liveMode.checked && (state.busy || !state.runtimeReady));
    ui.recordButton.title = ui.recordButton.disabled && !state.recording
      ? "Live transcription needs the worker free: wait for the runtime or the current file, or untick Live." : "";
    ui.stopRecordButton.disabled = !state.recording;
    ui.liveMode.disabled = state.recording;
    form.showLanguageTask();
  }

  #row(item) {
    const row = document.createElement("li");
    row.className = "queue-item";
    row.dataset.status = item.status;
    row.dataset.id = String(item.id);
    const button = document.createElement("button");
    button.type = "button";
    button.className = "queue-select";
    if (item === this.view.state.clip) button.setAttribute("aria-current", "true");
    button.addEventListener("click", () => this.select(item));
    const name = document.createElement("span");
    name.className = "queue-name";
    name.textContent = item.name;
    const label = document.createElement("span");
    label.className = "queue-status";
    let text = STATUS_LABELS[item.status] || item.status;
    const count = item.segments.filter((s) => s.text.trim()).length;
    if (item.status === "done") {
      text = count === 0 ? "Done · no speech heard" : `Done · ${count} ${count === 1 ? "segment" : "segments"}`;
    } else if (item.status === "cancelled" && count > 0) {
      text = `Cancelled · ${count} ${count === 1 ? "segment" : "segments"} kept`;
    }
    label.textContent = item.seconds ? `${formatSeconds(item.seconds)} · ${text}` : text;
    button.append(name, label);
    row.append(button);
    return row;
  }

  render() {
    const { ui, state } = this.view;
    ui.queue.hidden = state.items.length < 2;
    // The list is rebuilt: a keyboard user keeps the focus on the entry they were on.
    const focused = ui.queueList.contains(document.activeElement)
      ? document.activeElement.closest(".queue-item")?.dataset.id : undefined;
    ui.queueList.replaceChildren();
    for (const item of state.items) {
      const row = this.#row(item);
      ui.queueList.append(row);
      if (focused === String(item.id)) row.querySelector("button").focus();
    }
    this.refreshButtons();
  }

  add(name, want) {
    const item = {
      id: this.nextItemId, name, want, status: "decoding", samples: null, seconds: 0, url: null,
      objectUrl: null, segments: [], partial: [], result: null, detected: null, error: null,
    };
    this.nextItemId += 1;
    this.view.state.items.push(item);
    this.render();
    return item;
  }

  remove(item) {
    const { state } = this.view;
    state.items = state.items.filter((other) => other !== item);
    if (item.objectUrl) URL.revokeObjectURL(item.objectUrl);
    if (state.clip === item) state.clip = null;
  }

  // Shows an entry: its name, its player and its transcript (what it has so far).
  select(item) {
    const { ui, state, transcript } = this.view;
    if (state.clip !== item) {
      state.clip = item;
      ui.clipName.textContent = item.name;
      ui.clipDuration.textContent = item.seconds ? `(${formatSeconds(item.seconds)})` : "";
      if (item.url) {
        ui.player.src = item.url;
      } else {
        ui.player.removeAttribute("src");
        ui.player.load(); // drop the previous entry's audio
      }
      ui.clip.hidden = false;
      transcript.render(item);
    }
    this.render();
  }

  // Decodes one source into its entry; false (the entry gone, the error shown) when it fails.
  async #decode(source, item) {
    try {
      item.samples = source.samples ?? await decodeToMono16k(await source.bytes, source.name);
    } catch (error) {
      if (source.ownsUrl) URL.revokeObjectURL(source.url);
      this.remove(item);
      this.view.status.showError(error instanceof AudioInputError ? error.message : `${source.name}: ${error.message}`);
      return false;
    }
    item.seconds = item.samples.length / SAMPLE_RATE;
    item.url = source.url;
    item.objectUrl = source.ownsUrl ? source.url : null;
    item.status = item.want;
    return true;
  }

  // What the user chose: files, a sample or a recording. Entries come in the order chosen;
  // decoding runs at once (it needs no runtime). While the runtime or a model is loading, or
  // another file is transcribing, they queue and start on their own; otherwise they wait for
  // Transcribe. A single choice replaces a chosen clip nobody transcribed yet.
  async useSources(sources, { queue = false } = {}) {
    const { state, status } = this.view;
    status.clearError();
    const autoQueue = queue || !state.runtimeReady || state.busy;
    const lone = state.items.filter((item) => item.status === "ready");
    if (sources.length === 1 && !autoQueue && lone.length === 1 && lone[0] === state.clip) this.remove(lone[0]);
    const items = sources.map((source) => [source, this.add(source.name, autoQueue ? "queued" : "ready")]);
    const shown = state.busy && state.clip !== null; // keep showing the file being transcribed
    const decoded = await Promise.all(items.map(([source, item]) => this.#decode(source, item)));
    const first = items.find(([, item], index) => decoded[index] && state.items.includes(item));
    if (first && !shown) {
      state.clip = null; // re-show even if it was the selected entry while decoding
      this.select(first[1]);
      if (!state.busy) {
        const names = items.filter((_, index) => decoded[index]).length;
        status.set("idle", autoQueue ? "Queued: transcription starts as soon as the runtime is ready." : `Ready to transcribe ${names > 1 ? `${names} files` : first[1].name}.`);
      }
    } else if (!first && !state.busy) {
      // The status line must not go on inviting a choice as if the drop did nothing.
      const what = items.length === 1 ? items[0][0].name : `None of the ${items.length} files`;
      status.set("error", `Nothing added: ${what} could not be used as audio.`);
    }
    this.render();
    this.pump();
    return decoded.every(Boolean);
  }

  useFiles(files) {
    const list = [...(files || [])];
    if (list.length === 0) return Promise.resolve(false);
    return this.useSources(list.map((file) => {
      const url = URL.createObjectURL(file);
      return { name: file.name, bytes: file.arrayBuffer(), url, ownsUrl: true };
    }));
  }

  useSample(entry) {
    const url = new URL(entry.file, SAMPLES_BASE_URL).href;
    const bytes = fetch(url).then((response) => {
      if (!response.ok) throw new Error(`${url} answered ${response.status}`);
      return response.arrayBuffer();
    });
    return this.useSources([{ name: entry.title, bytes, url, ownsUrl: false }]);
  }

  async showSamples() {
    const { ui } = this.view;
    let clips = [];
    try {
      const response = await fetch(SAMPLES_MANIFEST_URL);
      if (response.ok) clips = (await response.json()).clips || [];
    } catch (error) {
      console.warn("no sample clips:", error);
    }
    ui.sampleList.replaceChildren();
    if (clips.length === 0) {
      const item = document.createElement("li");
      item.className = "note";
      item.textContent = "No sample clips on this server (run scripts/fetch_test_audio.sh, then vendor again).";
      ui.sampleList.append(item);
      return;
    }
    for (const entry of clips) {
      const item = document.createElement("li");
      const button = document.createElement("button");
      button.type = "button";
      button.className = "sample";
      button.dataset.file = entry.file;
      button.textContent = `${entry.title} · ${formatSeconds(entry.seconds)}`;
      if (entry.reference) button.title = `“${entry.reference}”`;
      button.addEventListener("click", () => this.useSample(entry));
      item.append(button);
      ui.sampleList.append(item);
    }
  }

  // The job of one entry for `jobs` (or null, when the form is wrong: it waits again).
  prepare(item) {
    const { state, status, form, transcript } = this.view;
    const model = form.model;
    const options = form.options(model);
    if (options === null) {
      item.status = "ready";
      this.render();
      return null;
    }
    const more = () => {
      const queued = this.waiting().length;
      return queued > 0 ? ` ${queued} more queued.` : "";
    };
    return {
      reset: () => {
        state.streamed = { windows: 0, tokens: 0, segments: 0 };
        state.heap = { startBytes: null, firstWindowBytes: null, lastBytes: null, endBytes: null, windows: [] };
        Object.assign(item, { status: "running", segments: [], partial: [], result: null, detected: null, error: null });
        if (state.clip === item) transcript.render(item);
        this.render();
        status.fraction(0);
      },
      load: async (track) => {
        await form.ensureModel(model, track);
        if (options.vad) await form.ensureVad(track);
      },
      running: { state: "transcribing", text: `Transcribing ${item.name}…`, fraction: 0 },
      command: "transcribe",
      // The worker gets its own copy (transferred, not cloned): the entry stays playable and
      // can be transcribed again.
      fields: () => ({ model, samples: item.samples.slice(), options }),
      transfer: (fields) => [fields.samples.buffer],
      onProgress: transcribeProgress(this.view, item, item.seconds),
      done: (result) => this.finish(item, result, model, options, more()),
      cancelled: () => this.#cancelled(item),
      cleanup: () => {
        if (item.status !== "cancelled") {
          item.status = "error";
          item.error = state.lastError;
        }
        this.view.ui.liveText.textContent = "";
        this.render();
      },
    };
  }

  #cancelled(item) {
    item.status = "cancelled";
    const kept = item.segments.filter((s) => s.text.trim()).length;
    const so = kept === 0 ? "" : kept === 1 ? " The segment before it is kept: export it below." : ` The ${kept} segments before it are kept: export them below.`;
    const at = formatAmount(this.view.state.progress?.doneSeconds ?? 0, item.seconds);
    if (kept > 0) this.#exportKept(item);
    return `Cancelled ${item.name} at ${at}.${so} Press Transcribe to start again.`;
  }

  // The kept segments of a cancelled transcription as a result of their own (the worker
  // writes their exports, as for a whole one; nothing is decoded again).
  async #exportKept(item) {
    const { client, state, form, transcript } = this.view;
    const segments = item.segments.filter((s) => s.text.trim()).map((s) => ({
      start: s.start, end: s.end, text: s.text, tokens: s.tokens,
      temperature: s.temperature, avgLogprob: s.avgLogprob, noSpeechProb: s.noSpeechProb,
    }));
    const model = state.loadedModel;
    try {
      const reply = await client.request("transcribe", { model, kept: { segments, duration: item.seconds, language: item.detected?.language ?? null } });
      if (item.status !== "cancelled") return; // transcribed again meanwhile
      item.result = { ...reply, partial: true, multilingual: form.isMultilingual(model), task: "transcribe" };
      if (state.clip === item) transcript.render(item);
      this.render();
    } catch (error) {
      console.warn(`candle-web: the kept segments of ${item.name} could not be exported:`, error);
    }
  }

  // A finished transcription: the entry keeps the result; the status line's text.
  finish(item, result, model, options, after = "") {
    const { state, form, transcript } = this.view;
    item.status = "done";
    item.result = { ...result, multilingual: form.isMultilingual(model), task: options.task || "transcribe" };
    item.segments = result.segments;
    item.partial = [];
    if (state.heap !== null && result.heap) {
      state.heap.startBytes = result.heap.startBytes;
      state.heap.endBytes = result.heap.endBytes;
    }
    state.lastResult = { ...item.result, clip: item.name, model, options, detected: item.detected };
    if (state.clip === item) transcript.render(item);
    this.render();
    if (!result.segments.some((segment) => segment.text.trim())) {
      return `Done: no speech heard in ${item.name} (${formatSeconds(item.seconds)} of audio).${after}`;
    }
    return `Done: ${item.name} in ${formatSeconds(result.timings.elapsedMs / 1000)} (${describeSpeed(result.timings.rtf)}).${after}`;
  }

  // Transcribes the waiting entries one after another while the worker is free.
  async pump() {
    const { state, jobs } = this.view;
    if (this.pumping) return;
    this.pumping = true;
    try {
      for (;;) {
        if (!state.runtimeReady || state.busy) break;
        const next = state.items.find((item) => item.status === "queued");
        if (!next) break;
        this.select(next);
        await jobs.run(() => this.prepare(next));
        if (next.status === "ready") break; // the form was wrong: it says so, the queue waits
      }
    } finally {
      this.pumping = false;
      this.refreshButtons();
    }
  }

  // Transcribe: every entry that waits for it (in the list's order), or the shown one again.
  transcribe() {
    const { state } = this.view;
    const readyItems = state.items.filter((item) => item.status === "ready");
    if (readyItems.length > 0) {
      for (const item of readyItems) item.status = "queued";
    } else if (state.clip && state.clip.samples && ![...BUSY_STATUSES, "queued"].includes(state.clip.status)) {
      state.clip.status = "queued";
    }
    this.render();
    return this.pump();
  }

  // Cancel stops the running file (or the live recording); the ones queued behind it wait for
  // Transcribe again.
  cancel() {
    const { state, jobs, microphone } = this.view;
    for (const item of state.items) {
      if (item.status === "queued") item.status = "ready";
      if (item.status === "decoding") item.want = "ready";
    }
    this.render();
    microphone.cancelLive();
    return jobs.stop();
  }
}
