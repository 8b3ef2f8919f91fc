// The Transcribe view: files (dropped, picked, several at once), sample clips and the
// microphone become entries of one list, each decoded to 16 kHz mono in the page and
// transcribed in turn by the Whisper model in the worker (downloaded once into the Cache API),
// each with its own streamed transcript, player and exports. Started by app.js with its
// WorkerClient.
//
// The parts, under web/transcribe/: queue.js (the entries and their turns), transcript.js
// (rendering what the worker sends: segments, progress, stats, exports, the player),
// live.js (the microphone and live mode, whose policy is the worker's), form.js (model,
// language, options), format.js (constants and formatting).

import { JobStatus, ViewJobs } from "./view_common.js";
import { ModelForm } from "./transcribe/form.js";
import { Microphone } from "./transcribe/live.js";
import { EntryQueue } from "./transcribe/queue.js";
import { TranscriptView } from "./transcribe/transcript.js";

export { decodeToMono16k } from "./audio_input.js";

const UI_IDS = {
  modelSelect: "model-select", modelNote: "model-note", languageTask: "language-task",
  languageSelect: "language-select", languageNote: "language-note", taskTranscribe: "task-transcribe",
  taskTranslate: "task-translate", beamSize: "beam-size", timestamps: "timestamps", wordTimestamps: "word-timestamps", vad: "vad", dropZone: "drop-zone",
  fileInput: "file-input", chooseFiles: "choose-files", recorder: "recorder", recordButton: "record-button",
  stopRecordButton: "stop-record-button", liveMode: "live-mode", micLevel: "mic-level",
  micElapsed: "mic-elapsed", micError: "mic-error", sampleList: "sample-list", error: "transcribe-error",
  queue: "queue", queueList: "clip-queue", clip: "clip", clipName: "clip-name",
  clipDuration: "clip-duration", player: "clip-player", transcribeButton: "transcribe-button",
  cancelButton: "cancel-button", job: "job", progress: "job-progress", phase: "job-phase",
  segments: "segments", liveText: "live-text", stats: "stats", exports: "exports",
  copyButton: "copy-button", copyStatus: "copy-status",
};

// What the tests (and the curious) can read: window.candleWeb.transcribe.
function initialState() {
  return {
    clip: null, // the entry shown: {id, name, samples, seconds, url, status, segments, result, ...}
    items: [], // every entry, in the order it came
    runtimeReady: false,
    busy: false,
    recording: false,
    loadedModel: null,
    vadLoaded: false, // Silero VAD loaded beside Whisper (the Skip silence option)
    lastLoad: null,
    lastResult: null,
    lastError: null,
    events: [],
    streamed: { windows: 0, tokens: 0, segments: 0 }, // progress events of the last run
    progress: null, // {doneSeconds, totalSeconds, leftSeconds} of the running transcription
    heap: null, // {startBytes, firstWindowBytes, lastBytes, endBytes, windows}: the worker's wasm heap
    live: null, // the live session: passes, commits, windowStart, final and partial segments, history
    recorder: null, // {seconds, level, peakLevel, mimeType} while or after recording
    jobId: null,
    runs: 0,
  };
}

async function copyText({ ui, state }) {
  const text = state.clip?.result?.exports?.txt ?? state.lastResult?.exports?.txt ?? "";
  try {
    await navigator.clipboard.writeText(text);
    ui.copyStatus.textContent = "Copied.";
  } catch {
    // No clipboard permission (e.g. a headless browser): fall back to a selection copy.
    const area = document.createElement("textarea");
    area.value = text;
    document.body.append(area);
    area.select();
    const copied = document.execCommand("copy");
    area.remove();
    ui.copyStatus.textContent = copied ? "Copied." : "Copy failed: select the text instead.";
  }
}

// Files in: the picker (its button, or a click on the drop zone), the drop zone (a drop adds).
// The zone is a labelled group, not a button: a button may not hold the file input and the
// Choose button (axe: nested-interactive), and the keyboard reaches the real button.
function wireFileInputs({ ui, status, queue }) {
  ui.fileInput.addEventListener("change", () => {
    queue.useFiles(ui.fileInput.files).finally(() => { ui.fileInput.value = ""; });
  });
  ui.chooseFiles.addEventListener("click", () => ui.fileInput.click());
  ui.dropZone.addEventListener("click", (event) => {
    if (event.target === ui.dropZone || event.target.classList.contains("drop-title")) ui.fileInput.click();
  });
  for (const type of ["dragenter", "dragover"]) {
    ui.dropZone.addEventListener(type, (event) => {
      event.preventDefault();
      ui.dropZone.classList.add("dragging");
    });
  }
  ui.dropZone.addEventListener("dragleave", () => ui.dropZone.classList.remove("dragging"));
  ui.dropZone.addEventListener("drop", (event) => {
    event.preventDefault();
    ui.dropZone.classList.remove("dragging");
    const files = event.dataTransfer?.files;
    if (!files || files.length === 0) {
      status.showError("Nothing to use in that drop: drop an audio file.");
      return;
    }
    queue.useFiles(files);
  });
  // A file dropped beside the zone must not make the browser navigate away from the page.
  for (const type of ["dragover", "drop"]) {
    window.addEventListener(type, (event) => event.preventDefault());
  }
}

function wireButtons(view) {
  const { ui, queue, microphone, form } = view;
  ui.transcribeButton.addEventListener("click", () => queue.transcribe());
  ui.cancelButton.addEventListener("click", () => queue.cancel());
  ui.copyButton.addEventListener("click", () => copyText(view));
  ui.recordButton.addEventListener("click", () => microphone.start());
  ui.stopRecordButton.addEventListener("click", () => microphone.stop());
  ui.liveMode.addEventListener("change", () => queue.refreshButtons());
  ui.modelSelect.addEventListener("change", () => form.showModelNote());
}

export function setUpTranscribe(client, ready) {
  const ui = Object.fromEntries(Object.entries(UI_IDS).map(([name, id]) => [name, document.getElementById(id)]));
  const state = initialState();
  const status = new JobStatus({ job: ui.job, progress: ui.progress, phase: ui.phase, error: ui.error });
  const view = { client, ui, state, status, $: (id) => document.getElementById(id) };
  view.queue = new EntryQueue(view);
  view.jobs = new ViewJobs({ client, status, state, refresh: () => view.queue.refreshButtons(), stoppingText: "Cancelling…" });
  view.form = new ModelForm(view);
  view.transcript = new TranscriptView(view);
  view.microphone = new Microphone(view);
  wireFileInputs(view);
  wireButtons(view);
  view.form.fillLanguages();
  view.queue.showSamples();
  view.jobs.whenReady(ready, "transcribed", () => view.form.showModelSizes());
  ready.then(() => view.queue.pump(), () => {});
  const { queue, form } = view;
  return {
    state,
    transcribe: () => queue.transcribe(),
    cancel: () => queue.cancel(),
    useFile: (file) => queue.useFiles(file ? [file] : []),
    useFiles: (files) => queue.useFiles(files),
    ensureModel: (model, track) => form.ensureModel(model, track),
  };
}
