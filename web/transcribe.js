// The Transcribe view: pick a clip (drop, file picker or sample), decode it to 16 kHz mono in
// the page, load the Whisper model in the worker (downloaded once into the Cache API), then
// stream the transcript in segment by segment. Started by app.js with its WorkerClient.

import { JobStatus, ViewJobs, describeLoad, fillModelSelect, formatBytes, formatSeconds } from "./view_common.js";

const SAMPLE_RATE = 16000;
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

// --- formatting -----------------------------------------------------------------------------

function formatClock(seconds) {
  const minutes = Math.floor(seconds / 60);
  const rest = seconds - minutes * 60;
  return `${minutes}:${rest.toFixed(2).padStart(5, "0")}`;
}

// --- audio ------------------------------------------------------------------------------------

class AudioInputError extends Error {
  constructor(message) {
    super(message);
    this.name = "AudioInputError";
  }
}

// Any format the browser decodes, resampled to 16 kHz by decoding through a 16 kHz context;
// several channels are averaged to mono (as ffmpeg's -ac 1 does).
export async function decodeToMono16k(arrayBuffer, name) {
  if (arrayBuffer.byteLength === 0) {
    throw new AudioInputError(`${name} is empty (0 bytes): choose an audio file.`);
  }
  const context = new OfflineAudioContext(1, 1, SAMPLE_RATE);
  let decoded;
  try {
    decoded = await context.decodeAudioData(arrayBuffer);
  } catch (error) {
    throw new AudioInputError(`${name} could not be decoded as audio (${error.message || error.name}). Choose a WAV, MP3, OGG, FLAC or M4A file.`);
  }
  if (decoded.length === 0) {
    throw new AudioInputError(`${name} holds no audio samples.`);
  }
  if (decoded.numberOfChannels === 1) {
    return decoded.getChannelData(0);
  }
  const mono = new Float32Array(decoded.length);
  for (let channel = 0; channel < decoded.numberOfChannels; channel += 1) {
    const data = decoded.getChannelData(channel);
    for (let i = 0; i < data.length; i += 1) mono[i] += data[i];
  }
  const scale = 1 / decoded.numberOfChannels;
  for (let i = 0; i < mono.length; i += 1) mono[i] *= scale;
  return mono;
}

// --- the view ---------------------------------------------------------------------------------

export function setUpTranscribe(client, ready) {
  const $ = (id) => document.getElementById(id);
  const ui = {
    modelSelect: $("model-select"),
    modelNote: $("model-note"),
    dropZone: $("drop-zone"),
    fileInput: $("file-input"),
    sampleList: $("sample-list"),
    error: $("transcribe-error"),
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
    clip: null, // {name, samples: Float32Array, seconds, url, objectUrl}
    runtimeReady: false,
    busy: false,
    loadedModel: null,
    lastLoad: null,
    lastResult: null,
    lastError: null,
    events: [],
    streamed: { windows: 0, tokens: 0, segments: 0 }, // progress events of the last run
    jobId: null,
    runs: 0,
  };
  const exportUrls = [];
  const status = new JobStatus({ job: ui.job, progress: ui.progress, phase: ui.phase, error: ui.error });

  function refreshButtons() {
    ui.transcribeButton.disabled = state.busy || !state.runtimeReady || state.clip === null;
    ui.cancelButton.disabled = !state.busy;
    ui.modelSelect.disabled = state.busy;
  }

  const jobs = new ViewJobs({ client, status, state, refresh: refreshButtons, stoppingText: "Cancelling…" });

  // -- choosing a clip -------------------------------------------------------------------------

  async function useClip(name, arrayBufferPromise, playbackUrl, ownsUrl) {
    status.clearError();
    let samples;
    try {
      samples = await decodeToMono16k(await arrayBufferPromise, name);
    } catch (error) {
      if (ownsUrl) URL.revokeObjectURL(playbackUrl);
      status.showError(error instanceof AudioInputError ? error.message : `${name}: ${error.message}`);
      return false;
    }
    if (state.clip?.objectUrl) URL.revokeObjectURL(state.clip.objectUrl);
    state.clip = { name, samples, seconds: samples.length / SAMPLE_RATE, url: playbackUrl, objectUrl: ownsUrl ? playbackUrl : null };
    ui.clipName.textContent = name;
    ui.clipDuration.textContent = `(${formatSeconds(state.clip.seconds)})`;
    ui.player.src = playbackUrl;
    ui.clip.hidden = false;
    if (!state.busy) status.set("idle", `Ready to transcribe ${name}.`);
    refreshButtons();
    return true;
  }

  function useFile(file) {
    if (!file) return Promise.resolve(false);
    const url = URL.createObjectURL(file);
    return useClip(file.name, file.arrayBuffer(), url, true);
  }

  async function useSample(entry) {
    const url = new URL(entry.file, SAMPLES_BASE_URL).href;
    const bytes = fetch(url).then((response) => {
      if (!response.ok) throw new Error(`${url} answered ${response.status}`);
      return response.arrayBuffer();
    });
    return useClip(entry.title, bytes, url, false);
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
    const [file] = ui.fileInput.files;
    useFile(file).finally(() => { ui.fileInput.value = ""; });
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
    useFile(files[0]);
  });
  // A file dropped beside the zone must not make the browser navigate away from the page.
  for (const type of ["dragover", "drop"]) {
    window.addEventListener(type, (event) => event.preventDefault());
  }

  // -- models -----------------------------------------------------------------------------------

  // The registry's Whisper models with their sizes; options it does not list go.
  async function showModelSizes() {
    const { models } = await fillModelSelect(client, KIND, ui.modelSelect, MODEL_LABELS);
    const known = new Set(models.map((model) => model.name));
    for (const option of [...ui.modelSelect.options]) {
      if (!known.has(option.value)) option.remove();
    }
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
    ui.modelNote.textContent = `${model} loaded (${describeLoad(reply)}).`;
  }

  // -- transcribing -----------------------------------------------------------------------------

  function resetTranscript() {
    ui.segments.replaceChildren();
    ui.liveText.textContent = "";
    ui.stats.hidden = true;
    ui.exports.hidden = true;
    ui.copyStatus.textContent = "";
    for (const url of exportUrls.splice(0)) URL.revokeObjectURL(url);
  }

  function addSegment(segment) {
    if (!segment.text.trim()) return;
    const item = document.createElement("li");
    item.className = "segment";
    item.dataset.start = String(segment.start);
    item.dataset.end = String(segment.end);
    const time = document.createElement("span");
    time.className = "segment-time";
    time.textContent = `${formatClock(segment.start)} → ${formatClock(segment.end)}`;
    const text = document.createElement("span");
    text.className = "segment-text";
    text.textContent = segment.text.trim();
    item.append(time, text);
    ui.segments.append(item);
  }

  function onTranscribeProgress(clipSeconds) {
    let reached = 0;
    let tokens = 0;
    return (message) => {
      if (message.phase !== "transcribe") return;
      const data = message.data;
      if (message.event === "window") state.streamed.windows += 1;
      if (message.event === "token") state.streamed.tokens += 1;
      if (message.event === "segment") state.streamed.segments += 1;
      if (message.event === "language") {
        ui.phase.textContent = `Detected language: ${data.language} (${(data.probability * 100).toFixed(0)}%)`;
      } else if (message.event === "window") {
        const start = data.seek_seconds;
        reached = Math.max(reached, start);
        const end = Math.min(start + 30, clipSeconds);
        ui.phase.textContent = `Transcribing ${formatClock(start)}–${formatClock(end)} of ${formatClock(clipSeconds)}: encoding the audio…`;
        ui.liveText.textContent = "";
      } else if (message.event === "token") {
        tokens += 1;
        if (data.step === 0) ui.liveText.textContent = ""; // a new (or retried) window
        ui.liveText.textContent += data.text;
        ui.phase.textContent = `Decoding: ${tokens} tokens so far…`;
      } else if (message.event === "segment") {
        addSegment(data);
        reached = Math.max(reached, data.end);
        ui.liveText.textContent = "";
      }
      ui.progress.value = clipSeconds > 0 ? Math.min(reached / clipSeconds, 1) : 0;
    };
  }

  function showResult(result) {
    ui.liveText.textContent = "";
    const timings = result.timings;
    $("stat-elapsed").textContent = formatSeconds(timings.elapsedMs / 1000);
    $("stat-audio").textContent = formatSeconds(timings.audioSeconds);
    $("stat-rtf").textContent = timings.rtf === null ? "–" : `${timings.rtf.toFixed(2)}×`;
    $("stat-rtf").title = "processing time ÷ audio duration (below 1 is faster than real time)";
    ui.stats.hidden = false;
    for (const format of EXPORT_FORMATS) {
      const link = $(`download-${format}`);
      const url = URL.createObjectURL(new Blob([result.exports[format]], { type: EXPORT_TYPES[format] }));
      exportUrls.push(url);
      link.href = url;
      const base = (state.clip?.name || "transcript").replace(/\.[^.]+$/, "").replace(/[^\w.-]+/g, "_");
      link.download = `${base}.${format}`;
      link.setAttribute("aria-label", `Download the transcript as ${format.toUpperCase()}`);
    }
    ui.exports.hidden = false;
  }

  // The chosen clip and model as a job for `jobs`, or null when there is no clip yet.
  function prepare() {
    const clip = state.clip;
    if (clip === null) return null;
    const model = ui.modelSelect.value;
    return {
      reset: () => {
        state.streamed = { windows: 0, tokens: 0, segments: 0 };
        resetTranscript();
        status.fraction(0);
      },
      load: (track) => ensureModel(model, track),
      running: { state: "transcribing", text: `Transcribing ${clip.name}…`, fraction: 0 },
      command: "transcribe",
      // The worker gets its own copy (transferred, not cloned): the clip stays playable and
      // can be transcribed again.
      fields: () => ({ model, samples: clip.samples.slice(), options: {} }),
      transfer: (fields) => [fields.samples.buffer],
      onProgress: onTranscribeProgress(clip.seconds),
      done: (result) => {
        state.lastResult = { ...result, clip: clip.name, model };
        showResult(result);
        return `Done: ${clip.name} in ${formatSeconds(result.timings.elapsedMs / 1000)} (${result.timings.rtf.toFixed(2)}× real time).`;
      },
      cancelled: () => "Cancelled. Choose a clip or press Transcribe to start again.",
      cleanup: () => { ui.liveText.textContent = ""; },
    };
  }

  const transcribe = () => jobs.run(prepare);
  const cancel = () => jobs.stop();

  async function copyText() {
    const text = state.lastResult?.exports?.txt ?? "";
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
  ui.modelSelect.addEventListener("change", () => {
    ui.modelNote.textContent = state.loadedModel === ui.modelSelect.value
      ? `${ui.modelSelect.value} is loaded.`
      : "Downloaded once when you transcribe, then kept in this browser's cache.";
  });

  showSamples();
  jobs.whenReady(ready, "transcribed", showModelSizes);
  return { state, transcribe, cancel, useFile, ensureModel };
}
