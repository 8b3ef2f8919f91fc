// The Transcribe view: files (dropped, picked, several at once), sample clips and the
// microphone become entries of one list, each decoded to 16 kHz mono in the page and
// transcribed in turn by the Whisper model in the worker (downloaded once into the Cache API),
// each with its own streamed transcript, player and exports. Started by app.js with its
// WorkerClient.
//
// An entry's status: "decoding" (its audio is being read), "ready" (waits for Transcribe),
// "queued" (transcribed as soon as the worker is free: files dropped while the runtime or a
// model loads, or several at once after one press), "running", "live" (a live recording),
// "done", "cancelled", "error".

import { AudioInputError, SAMPLE_RATE, decodeToMono16k, encodeWav } from "./audio_input.js";
import { Recorder, microphoneMessage } from "./recorder.js";
import { JobStatus, ViewJobs, describeLoad, fillModelSelect, formatBytes, formatSeconds } from "./view_common.js";

export { decodeToMono16k } from "./audio_input.js";

const SAMPLES_MANIFEST_URL = new URL("vendor/samples/manifest.json", import.meta.url);
const SAMPLES_BASE_URL = new URL("vendor/samples/", import.meta.url);
const EXPORT_FORMATS = ["txt", "srt", "vtt", "json"];
const EXPORT_TYPES = {
  txt: "text/plain;charset=utf-8",
  srt: "application/x-subrip;charset=utf-8",
  vtt: "text/vtt;charset=utf-8",
  json: "application/json;charset=utf-8",
};
const MODEL_LABELS = {
  "whisper-tiny.en": "Whisper tiny.en (English)",
  "whisper-base": "Whisper base (multilingual)",
};
const KIND = "whisper";
const FILE_PHASES = { "model.bin": "weights", "config.json": "config", "tokenizer.json": "tokenizer" };
const WINDOW_SECONDS = 30; // Whisper reads its audio in 30 s windows
const MAX_BEAM_SIZE = 32; // candle_web.option_limits.MAX_BEAM_SIZE
// Live mode: a pass over the open window whenever this much new audio has arrived (and the
// previous pass is done); a window this long is final: its segments but the last are kept,
// and the next window starts where that last one began, so no word is cut in two.
const LIVE_STEP_SECONDS = 3;
const LIVE_WINDOW_SECONDS = 12;
const PROMPT_CHARACTERS = 200; // the end of the kept text, given to the next window as prompt
const STATUS_LABELS = {
  decoding: "Reading the audio…",
  ready: "Ready",
  queued: "Queued",
  running: "Transcribing…",
  live: "Recording (live)…",
  done: "Done",
  cancelled: "Cancelled",
  error: "Failed",
};
// Whisper's language codes, in its tokenizer's order (a model's own list is checked in the
// worker: an unknown code is refused there by name).
const WHISPER_LANGUAGES = (
  "en zh de es ru ko fr ja pt tr pl ca nl ar sv it id hi fi vi he uk el ms cs ro da hu ta no th ur " +
  "hr bg lt la mi ml cy sk te fa lv bn sr az sl kn et mk br eu is hy ne mn bs kk sq sw gl mr pa si " +
  "km sn yo so af oc ka be tg sd gu am yi lo uz fo ht ps tk nn mt sa lb my bo tl mg as tt haw ln ha " +
  "ba jw su"
).split(" ");

// --- formatting -----------------------------------------------------------------------------

function formatClock(seconds) {
  const minutes = Math.floor(seconds / 60);
  const rest = seconds - minutes * 60;
  return `${minutes}:${rest.toFixed(2).padStart(5, "0")}`;
}

function formatElapsed(seconds) {
  const whole = Math.floor(seconds);
  return `${Math.floor(whole / 60)}:${String(whole % 60).padStart(2, "0")}`;
}

// "2.5 of 10.0 min" for long audio, "3.0 of 7.1 s" for short.
function formatAmount(done, total) {
  return total >= 60 ? `${(done / 60).toFixed(1)} of ${(total / 60).toFixed(1)} min` : `${done.toFixed(1)} of ${total.toFixed(1)} s`;
}

function formatLeft(seconds) {
  if (seconds < 60) return `about ${Math.max(1, Math.round(seconds))} s left`;
  return `about ${Math.round(seconds / 60)} min left`;
}

const languageNames = (() => {
  try {
    return new Intl.DisplayNames(["en"], { type: "language" });
  } catch {
    return null;
  }
})();

function languageName(code) {
  try {
    const name = languageNames?.of(code);
    if (name && name !== code) return name;
  } catch {
    // a code Intl does not know (Whisper's "jw"): the code itself
  }
  return code;
}

function isMultilingual(model, known) {
  return known[model] ?? !model.endsWith(".en"); // faster-whisper's naming: *.en is English-only
}

function fileBase(name) {
  return (name || "transcript").replace(/\.[^.]+$/, "").replace(/[^\w.-]+/g, "_");
}

// --- the view ---------------------------------------------------------------------------------

export function setUpTranscribe(client, ready) {
  const $ = (id) => document.getElementById(id);
  const ui = {
    modelSelect: $("model-select"),
    modelNote: $("model-note"),
    languageTask: $("language-task"),
    languageSelect: $("language-select"),
    languageNote: $("language-note"),
    taskTranscribe: $("task-transcribe"),
    taskTranslate: $("task-translate"),
    beamSize: $("beam-size"),
    timestamps: $("timestamps"),
    dropZone: $("drop-zone"),
    fileInput: $("file-input"),
    recorder: $("recorder"),
    recordButton: $("record-button"),
    stopRecordButton: $("stop-record-button"),
    liveMode: $("live-mode"),
    micLevel: $("mic-level"),
    micElapsed: $("mic-elapsed"),
    micError: $("mic-error"),
    sampleList: $("sample-list"),
    error: $("transcribe-error"),
    queue: $("queue"),
    queueList: $("clip-queue"),
    clip: $("clip"),
    clipName: $("clip-name"),
    clipDuration: $("clip-duration"),
    player: $("clip-player"),
    transcribeButton: $("transcribe-button"),
    cancelButton: $("cancel-button"),
    job: $("job"),
    progress: $("job-progress"),
    phase: $("job-phase"),
    segments: $("segments"),
    liveText: $("live-text"),
    stats: $("stats"),
    exports: $("exports"),
    copyButton: $("copy-button"),
    copyStatus: $("copy-status"),
  };

  // What the tests (and the curious) can read: window.candleWeb.transcribe.
  const state = {
    clip: null, // the entry shown: {id, name, samples, seconds, url, status, segments, result, ...}
    items: [], // every entry, in the order it came
    runtimeReady: false,
    busy: false,
    recording: false,
    loadedModel: null,
    lastLoad: null,
    lastResult: null,
    lastError: null,
    events: [],
    streamed: { windows: 0, tokens: 0, segments: 0 }, // progress events of the last run
    progress: null, // {doneSeconds, totalSeconds, leftSeconds} of the running transcription
    heap: null, // {startBytes, firstWindowBytes, lastBytes, endBytes, windows}: the worker's wasm heap
    live: null, // the live session: passes, commits, windowStart, final and partial segments
    recorder: null, // {seconds, level, peakLevel, mimeType} while or after recording
    jobId: null,
    runs: 0,
  };
  const multilingualModels = {}; // model name -> true/false once a load reply said so
  let exportUrls = [];
  let nextItemId = 1;
  let recordings = 0;
  let recorder = null;
  const status = new JobStatus({ job: ui.job, progress: ui.progress, phase: ui.phase, error: ui.error });

  const waiting = () => state.items.filter((item) => item.status === "queued" || (item.status === "decoding" && item.want === "queued"));

  function refreshButtons() {
    const queued = waiting().length;
    const readyItems = state.items.filter((item) => item.status === "ready").length;
    const runnable = readyItems > 0 || (state.clip !== null && state.clip.samples !== null && !["running", "live", "decoding"].includes(state.clip.status));
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
    showLanguageTask();
  }

  const jobs = new ViewJobs({ client, status, state, refresh: refreshButtons, stoppingText: "Cancelling…" });

  // -- the list of entries ---------------------------------------------------------------------

  function renderQueue() {
    ui.queue.hidden = state.items.length < 2;
    // The list is rebuilt: a keyboard user keeps the focus on the entry they were on.
    const focused = ui.queueList.contains(document.activeElement)
      ? document.activeElement.closest(".queue-item")?.dataset.id : undefined;
    ui.queueList.replaceChildren();
    for (const item of state.items) {
      const row = document.createElement("li");
      row.className = "queue-item";
      row.dataset.status = item.status;
      row.dataset.id = String(item.id);
      const button = document.createElement("button");
      button.type = "button";
      button.className = "queue-select";
      if (item === state.clip) button.setAttribute("aria-current", "true");
      button.addEventListener("click", () => select(item));
      const name = document.createElement("span");
      name.className = "queue-name";
      name.textContent = item.name;
      const label = document.createElement("span");
      label.className = "queue-status";
      let text = STATUS_LABELS[item.status] || item.status;
      if (item.status === "done") {
        const count = item.segments.filter((s) => s.text.trim()).length;
        text = `Done · ${count} ${count === 1 ? "segment" : "segments"}`;
      }
      label.textContent = item.seconds ? `${formatSeconds(item.seconds)} · ${text}` : text;
      button.append(name, label);
      row.append(button);
      ui.queueList.append(row);
      if (focused === String(item.id)) button.focus();
    }
    refreshButtons();
  }

  function addItem(name, want) {
    const item = {
      id: nextItemId, name, want, status: "decoding", samples: null, seconds: 0, url: null,
      objectUrl: null, segments: [], partial: [], result: null, detected: null, error: null,
    };
    nextItemId += 1;
    state.items.push(item);
    renderQueue();
    return item;
  }

  function removeItem(item) {
    state.items = state.items.filter((other) => other !== item);
    if (item.objectUrl) URL.revokeObjectURL(item.objectUrl);
    if (state.clip === item) state.clip = null;
  }

  // Shows an entry: its name, its player and its transcript (what it has so far).
  function select(item) {
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
      renderTranscript(item);
    }
    renderQueue();
  }

  // What the user chose: files, a sample or a recording. Entries come in the order chosen;
  // decoding runs at once (it needs no runtime). While the runtime or a model is loading, or
  // another file is transcribing, they queue and start on their own; otherwise they wait for
  // Transcribe. A single choice replaces a chosen clip nobody transcribed yet.
  async function useSources(sources, { queue = false } = {}) {
    status.clearError();
    const autoQueue = queue || !state.runtimeReady || state.busy;
    const lone = state.items.filter((item) => item.status === "ready");
    if (sources.length === 1 && !autoQueue && lone.length === 1 && lone[0] === state.clip) removeItem(lone[0]);
    const items = sources.map((source) => [source, addItem(source.name, autoQueue ? "queued" : "ready")]);
    const shown = state.busy && state.clip !== null; // keep showing the file being transcribed
    const decoded = await Promise.all(items.map(async ([source, item]) => {
      try {
        item.samples = source.samples ?? await decodeToMono16k(await source.bytes, source.name);
      } catch (error) {
        if (source.ownsUrl) URL.revokeObjectURL(source.url);
        removeItem(item);
        status.showError(error instanceof AudioInputError ? error.message : `${source.name}: ${error.message}`);
        return false;
      }
      item.seconds = item.samples.length / SAMPLE_RATE;
      item.url = source.url;
      item.objectUrl = source.ownsUrl ? source.url : null;
      item.status = item.want;
      return true;
    }));
    const first = items.find(([, item], index) => decoded[index] && state.items.includes(item));
    if (first && !shown) {
      state.clip = null; // re-show even if it was the selected entry while decoding
      select(first[1]);
      if (!state.busy) {
        const names = items.filter((_, index) => decoded[index]).length;
        status.set("idle", autoQueue ? "Queued: transcription starts as soon as the runtime is ready." : `Ready to transcribe ${names > 1 ? `${names} files` : first[1].name}.`);
      }
    }
    renderQueue();
    pump();
    return decoded.every(Boolean);
  }

  function fileSource(file) {
    const url = URL.createObjectURL(file);
    return { name: file.name, bytes: file.arrayBuffer(), url, ownsUrl: true };
  }

  function useFiles(files) {
    const list = [...(files || [])];
    if (list.length === 0) return Promise.resolve(false);
    return useSources(list.map(fileSource));
  }

  const useFile = (file) => useFiles(file ? [file] : []);

  async function useSample(entry) {
    const url = new URL(entry.file, SAMPLES_BASE_URL).href;
    const bytes = fetch(url).then((response) => {
      if (!response.ok) throw new Error(`${url} answered ${response.status}`);
      return response.arrayBuffer();
    });
    return useSources([{ name: entry.title, bytes, url, ownsUrl: false }]);
  }

  async function showSamples() {
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
      button.setAttribute("aria-label", `Use the sample clip ${entry.title}, ${entry.seconds.toFixed(1)} seconds`);
      if (entry.reference) button.title = `“${entry.reference}”`;
      button.addEventListener("click", () => useSample(entry));
      item.append(button);
      ui.sampleList.append(item);
    }
  }

  ui.fileInput.addEventListener("change", () => {
    useFiles(ui.fileInput.files).finally(() => { ui.fileInput.value = ""; });
  });
  ui.dropZone.addEventListener("keydown", (event) => {
    if (event.key === "Enter" || event.key === " ") {
      event.preventDefault();
      ui.fileInput.click();
    }
  });
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
    useFiles(files);
  });
  // A file dropped beside the zone must not make the browser navigate away from the page.
  for (const type of ["dragover", "drop"]) {
    window.addEventListener(type, (event) => event.preventDefault());
  }

  // -- models, language and task --------------------------------------------------------------

  // The registry's Whisper models with their sizes; options it does not list go.
  async function showModelSizes() {
    const { models } = await fillModelSelect(client, KIND, ui.modelSelect, MODEL_LABELS);
    const known = new Set(models.map((model) => model.name));
    for (const option of [...ui.modelSelect.options]) {
      if (!known.has(option.value)) option.remove();
    }
    showLanguageTask();
  }

  function fillLanguages() {
    const names = WHISPER_LANGUAGES.map((code) => [code, languageName(code)]);
    names.sort((a, b) => a[1].localeCompare(b[1], "en"));
    for (const [code, name] of names) {
      const option = document.createElement("option");
      option.value = code;
      option.textContent = name === code ? code : `${name} (${code})`;
      ui.languageSelect.append(option);
    }
  }

  // Language and task apply to multilingual models only; an English-only one says so.
  function showLanguageTask() {
    const model = ui.modelSelect.value;
    const multilingual = isMultilingual(model, multilingualModels);
    ui.languageTask.disabled = !multilingual || state.busy;
    ui.languageTask.dataset.multilingual = String(multilingual);
    ui.languageTask.querySelector(".settings-grid").hidden = !multilingual;
    ui.languageNote.textContent = multilingual
      ? "Detects the spoken language unless you pick one; Translate gives English text from any of them."
      : `${model} is English-only: it transcribes English and does not translate. Pick Whisper base for other languages.`;
  }

  function onLoadProgress(message) {
    state.events.push({ phase: message.phase, state: message.state, cached: message.cached, file: message.file });
    if (message.phase === "download" && message.state === "running") {
      const what = FILE_PHASES[message.file] || message.file;
      const amount = `${formatBytes(message.loaded)} of ${formatBytes(message.total)}`;
      ui.progress.value = message.total ? message.loaded / message.total : 0;
      ui.phase.textContent = message.cached
        ? `Reading the model ${what} from this browser's cache (no download): ${amount}`
        : `Downloading the model ${what} (${message.file}): ${amount}`;
      ui.phase.dataset.cached = String(Boolean(message.cached));
    } else if (message.phase === "verify") {
      ui.phase.textContent = `Checking the sha256 of ${message.file}…`;
    } else if (message.phase === "build" && message.state === "start") {
      ui.progress.removeAttribute("value"); // indeterminate while Python builds the model
      ui.phase.textContent = "Building the model in Python…";
    }
  }

  async function ensureModel(model, track = jobs.track) {
    if (state.loadedModel === model) return;
    status.set("loading", `Loading ${model}…`);
    const job = client.start("load", { model }, { onProgress: onLoadProgress });
    track(job);
    const reply = await job.result;
    state.lastLoad = reply;
    state.loadedModel = reply.key;
    if (typeof reply.model?.multilingual === "boolean") multilingualModels[model] = reply.model.multilingual;
    ui.modelNote.textContent = `${model} loaded (${describeLoad(reply)}).`;
    showLanguageTask();
  }

  // The worker's transcribe options from the form (the command line's defaults when untouched),
  // or null after showing what is wrong.
  function transcribeOptions(model) {
    const options = {};
    const beamText = ui.beamSize.value.trim();
    if (beamText !== "") {
      const beam = Number(beamText);
      if (!Number.isInteger(beam) || beam < 1 || beam > MAX_BEAM_SIZE) {
        status.showError(`Beam size must be a whole number from 1 to ${MAX_BEAM_SIZE} (leave it empty for greedy decoding); got ${beamText}.`);
        ui.beamSize.focus();
        return null;
      }
      options.beam_size = beam;
    }
    if (!ui.timestamps.checked) options.without_timestamps = true;
    if (isMultilingual(model, multilingualModels)) {
      if (ui.languageSelect.value) options.language = ui.languageSelect.value;
      options.task = ui.taskTranslate.checked ? "translate" : "transcribe";
    }
    return options;
  }

  // -- the transcript ---------------------------------------------------------------------------

  function clearExports() {
    for (const url of exportUrls) URL.revokeObjectURL(url);
    exportUrls = [];
  }

  function segmentElement(segment, partial) {
    const row = document.createElement("li");
    row.className = partial ? "segment partial" : "segment";
    row.dataset.start = String(segment.start);
    row.dataset.end = String(segment.end);
    const time = document.createElement("button");
    time.type = "button";
    time.className = "segment-time";
    time.textContent = `${formatClock(segment.start)} → ${formatClock(segment.end)}`;
    time.setAttribute("aria-label", `Play from ${formatClock(segment.start)}`);
    const text = document.createElement("span");
    text.className = "segment-text";
    text.textContent = segment.text.trim();
    row.append(time, text);
    return row;
  }

  function renderSegments(item) {
    const rows = item.segments.filter((s) => s.text.trim()).map((s) => segmentElement(s, false));
    rows.push(...item.partial.filter((s) => s.text.trim()).map((s) => segmentElement(s, true)));
    ui.segments.replaceChildren(...rows);
    highlightPlaying();
  }

  function renderTranscript(item) {
    renderSegments(item);
    ui.liveText.textContent = "";
    ui.copyStatus.textContent = "";
    clearExports();
    if (item.result) {
      showResult(item);
    } else {
      ui.stats.hidden = true;
      ui.exports.hidden = true;
    }
  }

  function appendSegment(item, segment) {
    item.segments.push(segment);
    if (state.clip === item && segment.text.trim()) {
      ui.segments.append(segmentElement(segment, false));
      highlightPlaying();
    }
  }

  function describeLanguage(item) {
    const language = item.result?.language;
    if (!language || item.result.multilingual === false) return null;
    const name = `${languageName(language)} (${language})`;
    if (item.detected && item.detected.language === language) {
      return `${name}, detected ${(item.detected.probability * 100).toFixed(0)}%`;
    }
    return item.result.task === "translate" ? `${name} → English` : name;
  }

  function showResult(item) {
    const result = item.result;
    const timings = result.timings;
    $("stat-elapsed").textContent = formatSeconds(timings.elapsedMs / 1000);
    $("stat-audio").textContent = formatSeconds(timings.audioSeconds);
    $("stat-rtf").textContent = timings.rtf === null ? "–" : `${timings.rtf.toFixed(2)}×`;
    $("stat-rtf").title = "processing time ÷ audio duration (below 1 is faster than real time)";
    const language = describeLanguage(item);
    $("stat-language-box").hidden = language === null;
    $("stat-language").textContent = language || "";
    $("stat-memory").textContent = result.heap ? formatBytes(result.heap.endBytes) : "–";
    $("stat-memory").title = "the worker's WebAssembly heap when the transcription ended";
    ui.stats.hidden = false;
    clearExports();
    for (const format of EXPORT_FORMATS) {
      const link = $(`download-${format}`);
      const url = URL.createObjectURL(new Blob([result.exports[format]], { type: EXPORT_TYPES[format] }));
      exportUrls.push(url);
      link.href = url;
      link.download = `${fileBase(item.name)}.${format}`;
      link.setAttribute("aria-label", `Download the transcript of ${item.name} as ${format.toUpperCase()}`);
    }
    ui.exports.hidden = false;
  }

  // -- audio you can follow: click a segment to play from it; the playing one is highlighted ----

  // Highlights the segment at the player's position once the audio has been played or sought
  // (a player that was never started points at no line).
  let following = false;
  function highlightPlaying() {
    const time = ui.player.currentTime;
    const playable = following && state.clip !== null && state.clip.url !== null && ui.player.src !== "";
    let current = null;
    for (const row of ui.segments.children) {
      const inside = playable && !row.classList.contains("partial")
        && Number(row.dataset.start) <= time && time < Number(row.dataset.end);
      row.classList.toggle("playing", inside);
      if (inside) {
        row.setAttribute("aria-current", "true");
        current = row;
      } else {
        row.removeAttribute("aria-current");
      }
    }
    state.playingSegment = current === null ? null : [...ui.segments.children].indexOf(current);
  }

  ui.segments.addEventListener("click", (event) => {
    const row = event.target.closest("li.segment");
    if (!row || row.classList.contains("partial") || !state.clip?.url) return;
    following = true;
    ui.player.currentTime = Number(row.dataset.start);
    highlightPlaying();
    ui.player.play().catch(() => {}); // a browser may refuse to start sound; the seek stands
  });
  for (const type of ["play", "seeking"]) {
    ui.player.addEventListener(type, () => { following = true; });
  }
  ui.player.addEventListener("emptied", () => { following = false; });
  for (const type of ["timeupdate", "seeked", "play", "pause", "emptied"]) {
    ui.player.addEventListener(type, highlightPlaying);
  }

  // -- transcribing -----------------------------------------------------------------------------

  // Progress of one transcription: "2.5 of 10.0 min · about 6 min left", then what the current
  // window is doing. `offset` places the samples in a longer recording (live mode).
  function onTranscribeProgress(item, totalSeconds, offset = 0) {
    let reached = 0;
    let tokens = 0;
    let windowText = "";
    let firstWindowAt = null;
    state.progress = { doneSeconds: 0, totalSeconds, leftSeconds: null };
    const line = (what) => {
      let left = "";
      if (firstWindowAt !== null && reached > 0 && reached < totalSeconds) {
        const rate = (performance.now() - firstWindowAt) / 1000 / reached;
        state.progress.leftSeconds = rate * (totalSeconds - reached);
        left = ` · ${formatLeft(state.progress.leftSeconds)}`;
      }
      state.progress.doneSeconds = reached;
      ui.phase.textContent = `${formatAmount(reached, totalSeconds)} transcribed${left} — ${windowText}: ${what}`;
      ui.progress.value = totalSeconds > 0 ? Math.min(reached / totalSeconds, 1) : 0;
    };
    return (message) => {
      if (message.phase !== "transcribe") return;
      const data = message.data;
      if (typeof message.heapBytes === "number" && state.heap !== null) {
        state.heap.lastBytes = message.heapBytes;
        if (message.event === "window") {
          if (state.heap.firstWindowBytes === null) state.heap.firstWindowBytes = message.heapBytes;
          state.heap.windows.push(message.heapBytes); // at each window's start
        }
      }
      if (message.event === "window") state.streamed.windows += 1;
      if (message.event === "token") state.streamed.tokens += 1;
      if (message.event === "segment") state.streamed.segments += 1;
      if (message.event === "language") {
        item.detected = { language: data.language, probability: data.probability };
        ui.phase.textContent = `Detected language: ${languageName(data.language)} (${data.language}, ${(data.probability * 100).toFixed(0)}%)`;
      } else if (message.event === "window") {
        if (firstWindowAt === null) firstWindowAt = performance.now();
        const start = data.seek_seconds;
        reached = Math.max(reached, start);
        const end = Math.min(start + WINDOW_SECONDS, totalSeconds);
        windowText = `window ${formatClock(offset + start)}–${formatClock(offset + end)}`;
        tokens = 0;
        if (state.clip === item) ui.liveText.textContent = "";
        line("encoding the audio…");
      } else if (message.event === "token") {
        tokens += 1;
        if (state.clip === item) {
          if (data.step === 0) ui.liveText.textContent = ""; // a new (or retried) window
          ui.liveText.textContent += data.text;
        }
        line(`decoding, ${tokens} tokens`);
      } else if (message.event === "segment") {
        if (item.status !== "live") appendSegment(item, data);
        reached = Math.max(reached, data.end - offset);
        if (state.clip === item) ui.liveText.textContent = "";
        line(`decoding, ${tokens} tokens`);
      }
    };
  }

  // The job of one entry for `jobs` (or null, when the form is wrong: it waits again).
  function prepareItem(item) {
    return () => {
      const model = ui.modelSelect.value;
      const options = transcribeOptions(model);
      if (options === null) {
        item.status = "ready";
        renderQueue();
        return null;
      }
      const more = () => {
        const queued = waiting().length;
        return queued > 0 ? ` ${queued} more queued.` : "";
      };
      return {
        reset: () => {
          state.streamed = { windows: 0, tokens: 0, segments: 0 };
          state.heap = { startBytes: null, firstWindowBytes: null, lastBytes: null, endBytes: null, windows: [] };
          item.status = "running";
          item.segments = [];
          item.partial = [];
          item.result = null;
          item.detected = null;
          item.error = null;
          if (state.clip === item) renderTranscript(item);
          renderQueue();
          status.fraction(0);
        },
        load: (track) => ensureModel(model, track),
        running: { state: "transcribing", text: `Transcribing ${item.name}…`, fraction: 0 },
        command: "transcribe",
        // The worker gets its own copy (transferred, not cloned): the entry stays playable and
        // can be transcribed again.
        fields: () => ({ model, samples: item.samples.slice(), options }),
        transfer: (fields) => [fields.samples.buffer],
        onProgress: onTranscribeProgress(item, item.seconds),
        done: (result) => finish(item, result, model, options, more()),
        cancelled: () => {
          item.status = "cancelled";
          const kept = item.segments.filter((s) => s.text.trim()).length;
          const so = kept > 0 ? ` The ${kept} segments before it are kept.` : "";
          return `Cancelled ${item.name} at ${formatAmount(state.progress?.doneSeconds ?? 0, item.seconds)}.${so} Press Transcribe to start again.`;
        },
        cleanup: () => {
          if (item.status !== "cancelled") {
            item.status = "error";
            item.error = state.lastError;
          }
          ui.liveText.textContent = "";
          renderQueue();
        },
      };
    };
  }

  // A finished transcription: the entry keeps the result; the status line's text.
  function finish(item, result, model, options, after = "") {
    item.status = "done";
    item.result = { ...result, multilingual: isMultilingual(model, multilingualModels), task: options.task || "transcribe" };
    item.segments = result.segments;
    item.partial = [];
    if (state.heap !== null && result.heap) {
      state.heap.startBytes = result.heap.startBytes;
      state.heap.endBytes = result.heap.endBytes;
    }
    state.lastResult = { ...item.result, clip: item.name, model, options, detected: item.detected };
    if (state.clip === item) renderTranscript(item);
    renderQueue();
    return `Done: ${item.name} in ${formatSeconds(result.timings.elapsedMs / 1000)} (${result.timings.rtf.toFixed(2)}× real time).${after}`;
  }

  // Transcribes the waiting entries one after another while the worker is free.
  let pumping = false;
  async function pump() {
    if (pumping) return;
    pumping = true;
    try {
      for (;;) {
        if (!state.runtimeReady || state.busy) break;
        const next = state.items.find((item) => item.status === "queued");
        if (!next) break;
        select(next);
        await jobs.run(prepareItem(next));
        if (next.status === "ready") break; // the form was wrong: it says so, the queue waits
      }
    } finally {
      pumping = false;
      refreshButtons();
    }
  }

  // Transcribe: every entry that waits for it (in the list's order), or the shown one again.
  function transcribe() {
    const readyItems = state.items.filter((item) => item.status === "ready");
    if (readyItems.length > 0) {
      for (const item of readyItems) item.status = "queued";
    } else if (state.clip && state.clip.samples && !["running", "live", "decoding", "queued"].includes(state.clip.status)) {
      state.clip.status = "queued";
    }
    renderQueue();
    return pump();
  }

  // Cancel stops the running file; the ones queued behind it wait for Transcribe again.
  async function cancel() {
    for (const item of state.items) {
      if (item.status === "queued") item.status = "ready";
      if (item.status === "decoding") item.want = "ready";
    }
    renderQueue();
    if (state.live !== null && state.recording) {
      state.live.cancelled = true;
      recorder?.abort();
    }
    return jobs.stop();
  }

  // -- the microphone ---------------------------------------------------------------------------

  function showLevel(level, seconds) {
    ui.micLevel.value = level;
    ui.micElapsed.textContent = formatElapsed(seconds);
    if (state.recorder) {
      state.recorder.seconds = seconds;
      state.recorder.level = level;
      state.recorder.peakLevel = Math.max(state.recorder.peakLevel, level);
    }
  }

  function showMicError(message) {
    ui.micError.textContent = message;
    ui.micError.hidden = false;
  }

  async function startRecording() {
    if (state.recording) return;
    ui.micError.hidden = true;
    const live = ui.liveMode.checked;
    recorder = new Recorder({ onLevel: showLevel });
    state.recorder = { seconds: 0, level: 0, peakLevel: 0, mimeType: "", live };
    state.recording = true;
    ui.recorder.dataset.state = "starting";
    refreshButtons();
    try {
      await recorder.start();
    } catch (error) {
      recorder.abort();
      recorder = null;
      state.recording = false;
      state.recorder.error = { name: error.name, message: error.message };
      ui.recorder.dataset.state = "error";
      showMicError(microphoneMessage(error));
      refreshButtons();
      return;
    }
    state.recorder.mimeType = recorder.mimeType;
    ui.recorder.dataset.state = "recording";
    recordings += 1;
    const name = `Recording ${recordings}`;
    if (live) {
      liveSession(recorder, name);
    } else {
      status.set("recording", `Recording from the microphone… press Stop to transcribe.`);
    }
  }

  async function stopRecording() {
    if (!state.recording || recorder === null) return;
    const current = recorder;
    ui.recorder.dataset.state = "stopping";
    ui.stopRecordButton.disabled = true;
    const blob = await current.stop();
    if (state.live !== null && state.live.recorder === current) return; // liveSession finishes
    state.recording = false;
    recorder = null;
    ui.recorder.dataset.state = "idle";
    await useRecording(blob, current, `Recording ${recordings}`, true);
  }

  // A recording becomes an entry like a dropped file (decoded the same way), with a WAV copy
  // for the player; after Stop it is transcribed without another press.
  async function useRecording(blob, source, name, queue) {
    let samples;
    try {
      samples = await decodeToMono16k(await blob.arrayBuffer(), name);
    } catch (error) {
      showMicError(error.message);
      refreshButtons();
      return null;
    }
    const url = URL.createObjectURL(encodeWav(samples));
    await useSources([{ name, samples, url, ownsUrl: true }], { queue });
    return state.items.find((item) => item.url === url) || null;
  }

  // Live: passes over the open window while recording (words appear a pass later), then, after
  // Stop, one last pass over what is left, which returns the whole transcript and its exports.
  async function liveSession(current, name) {
    const model = ui.modelSelect.value;
    const options = transcribeOptions(model);
    if (options === null) {
      current.abort();
      state.recording = false;
      recorder = null;
      ui.recorder.dataset.state = "idle";
      refreshButtons();
      return;
    }
    const item = addItem(name, "live");
    item.status = "live";
    state.clip = null;
    select(item);
    const live = {
      recorder: current, item: item.id, passes: 0, commits: 0, windowStart: 0, heard: 0, passEnd: 0,
      passMs: 0, final: [], partial: [], history: [], cancelled: false,
    };
    state.live = live;
    state.busy = true;
    state.lastError = null;
    state.streamed = { windows: 0, tokens: 0, segments: 0 };
    state.heap = { startBytes: null, firstWindowBytes: null, lastBytes: null, endBytes: null, windows: [] };
    status.clearError();
    refreshButtons();
    const prompt = () => {
      const text = live.final.map((s) => s.text).join("").trim();
      return text ? { initial_prompt: text.slice(-PROMPT_CHARACTERS) } : {};
    };
    const pass = async (samples, extra = {}) => {
      const fields = {
        model, samples, options: { ...options, ...prompt() }, offset: live.windowStart, ...extra,
      };
      const job = client.start("transcribe", fields, {
        onProgress: onTranscribeProgress(item, samples.length / SAMPLE_RATE, live.windowStart),
        transfer: [samples.buffer],
      });
      jobs.track(job);
      try {
        return await job.result;
      } finally {
        state.jobId = null;
      }
    };
    try {
      status.set("loading", `Recording; loading ${model}…`);
      await ensureModel(model, jobs.track);
      state.jobId = null;
      while (current.active && !live.cancelled) {
        status.set("live", live.passes === 0 ? "Listening… the first words appear after a few seconds." : `Listening… ${live.passes} ${live.passes === 1 ? "pass" : "passes"}, ${live.final.length} ${live.final.length === 1 ? "segment" : "segments"} kept.`);
        // The next pass once LIVE_STEP_SECONDS more have come since the last one's end (at
        // once when passes fall behind the speaker).
        await current.waitForSeconds(live.passEnd + LIVE_STEP_SECONDS);
        if (!current.active || live.cancelled) break;
        const heard = await current.samplesSoFar();
        live.heard = heard.length / SAMPLE_RATE;
        // One Whisper window at most: a longer one would cost a second encoder pass.
        const from = Math.round(live.windowStart * SAMPLE_RATE);
        const to = Math.min(heard.length, from + WINDOW_SECONDS * SAMPLE_RATE);
        if (to - from < SAMPLE_RATE / 2) continue; // not even half a second new
        const windowEnd = to / SAMPLE_RATE;
        const result = await pass(heard.slice(from, to));
        live.passes += 1;
        live.passMs += result.timings.elapsedMs;
        live.passEnd = windowEnd;
        const segments = result.segments.filter((s) => s.text.trim());
        if (windowEnd - live.windowStart >= LIVE_WINDOW_SECONDS) {
          // The window is final: keep its segments but the last, which the next window redoes
          // from its start (it may end in a word cut by the window's end).
          const last = segments[segments.length - 1];
          const redo = segments.length >= 2 && last.start > live.windowStart + 1;
          live.final.push(...(redo ? segments.slice(0, -1) : segments));
          live.partial = redo ? [last] : [];
          live.windowStart = redo ? last.start : windowEnd;
          live.commits += 1;
        } else {
          live.partial = segments;
        }
        live.history.push({ pass: live.passes, heard: live.heard, windowEnd, final: live.final.map((s) => s.text), partial: live.partial.map((s) => s.text) });
        item.segments = [...live.final];
        item.partial = [...live.partial];
        if (state.clip === item) {
          renderSegments(item);
          ui.liveText.textContent = "";
        }
      }
      if (live.cancelled) throw Object.assign(new Error("cancelled by the page"), { name: "Cancelled" });
      // Stop: the complete recording, decoded like a file, and the last pass over its open window.
      status.set("transcribing", "Finishing the live transcript…");
      const blob = await current.stop();
      const samples = await decodeToMono16k(await blob.arrayBuffer(), name);
      item.samples = samples;
      item.seconds = samples.length / SAMPLE_RATE;
      item.url = URL.createObjectURL(encodeWav(samples));
      item.objectUrl = item.url;
      ui.player.src = item.url;
      ui.clipDuration.textContent = `(${formatSeconds(item.seconds)})`;
      state.recording = false;
      recorder = null;
      ui.recorder.dataset.state = "idle";
      refreshButtons();
      const from = Math.min(Math.round(live.windowStart * SAMPLE_RATE), Math.max(samples.length - 1, 0));
      const stoppedAt = performance.now();
      const result = await pass(samples.slice(from), { prior: live.final });
      const afterStopMs = performance.now() - stoppedAt;
      live.passes += 1;
      live.passMs += result.timings.elapsedMs;
      // The stats of the whole recording: all passes' time over its length.
      result.timings = {
        ...result.timings, elapsedMs: live.passMs, audioSeconds: item.seconds,
        rtf: live.passMs / 1000 / item.seconds, lastPassMs: result.timings.elapsedMs, afterStopMs,
      };
      state.runs += 1;
      status.fraction(1);
      finish(item, result, model, options);
      status.set("done", `Done: ${item.name}, live in ${live.passes} passes; the whole transcript ${formatSeconds(afterStopMs / 1000)} after Stop.`);
    } catch (error) {
      state.lastError = { name: error.name, message: error.message };
      if (error.name === "Cancelled") {
        item.status = "cancelled";
        status.set("cancelled", "Live transcription cancelled; the text so far is kept.");
      } else {
        item.status = "error";
        status.set("error", "Stopped by an error.");
        status.showError(`${error.name}: ${error.message}`);
        console.error(error.traceback || error);
      }
      item.partial = [];
      if (state.clip === item) renderSegments(item);
      current.abort();
    } finally {
      state.recording = false;
      recorder = null;
      ui.recorder.dataset.state = "idle";
      state.busy = false;
      state.jobId = null;
      live.recorder = null;
      renderQueue();
      pump();
    }
  }

  async function copyText() {
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

  ui.transcribeButton.addEventListener("click", transcribe);
  ui.cancelButton.addEventListener("click", cancel);
  ui.copyButton.addEventListener("click", copyText);
  ui.recordButton.addEventListener("click", startRecording);
  ui.stopRecordButton.addEventListener("click", stopRecording);
  ui.liveMode.addEventListener("change", refreshButtons);
  ui.modelSelect.addEventListener("change", () => {
    ui.modelNote.textContent = state.loadedModel === ui.modelSelect.value
      ? `${ui.modelSelect.value} is loaded.`
      : "Downloaded once when you transcribe, then kept in this browser's cache.";
    showLanguageTask();
  });

  fillLanguages();
  showSamples();
  jobs.whenReady(ready, "transcribed", showModelSizes);
  ready.then(() => pump(), () => {});
  return { state, transcribe, cancel, useFile, useFiles, ensureModel };
}
