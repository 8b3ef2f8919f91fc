// The Transcribe view's constants and formatting: labels, Whisper's languages, clock times.

export const SAMPLES_MANIFEST_URL = new URL("../vendor/samples/manifest.json", import.meta.url);
export const SAMPLES_BASE_URL = new URL("../vendor/samples/", import.meta.url);
export const EXPORT_FORMATS = ["txt", "srt", "vtt", "json"];
export const EXPORT_TYPES = {
  txt: "text/plain;charset=utf-8",
  srt: "application/x-subrip;charset=utf-8",
  vtt: "text/vtt;charset=utf-8",
  json: "application/json;charset=utf-8",
};
export const MODEL_LABELS = {
  "whisper-tiny.en": "Whisper tiny.en (English)",
  "whisper-base": "Whisper base (multilingual)",
};
export const KIND = "whisper";
export const FILE_PHASES = { "model.bin": "weights", "config.json": "config", "tokenizer.json": "tokenizer" };
export const WINDOW_SECONDS = 30; // Whisper reads its audio in 30 s windows
export const MAX_BEAM_SIZE = 32; // candle_web.generation.option_limits.MAX_BEAM_SIZE
export const STATUS_LABELS = {
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
export const WHISPER_LANGUAGES = (
  "en zh de es ru ko fr ja pt tr pl ca nl ar sv it id hi fi vi he uk el ms cs ro da hu ta no th ur " +
  "hr bg lt la mi ml cy sk te fa lv bn sr az sl kn et mk br eu is hy ne mn bs kk sq sw gl mr pa si " +
  "km sn yo so af oc ka be tg sd gu am yi lo uz fo ht ps tk nn mt sa lb my bo tl mg as tt haw ln ha " +
  "ba jw su"
).split(" ");

// --- formatting -----------------------------------------------------------------------------

export function formatClock(seconds) {
  const minutes = Math.floor(seconds / 60);
  const rest = seconds - minutes * 60;
  return `${minutes}:${rest.toFixed(2).padStart(5, "0")}`;
}

export function formatElapsed(seconds) {
  const whole = Math.floor(seconds);
  return `${Math.floor(whole / 60)}:${String(whole % 60).padStart(2, "0")}`;
}

// "2.5 of 10.0 min" for long audio, "3.0 of 7.1 s" for short.
export function formatAmount(done, total) {
  return total >= 60 ? `${(done / 60).toFixed(1)} of ${(total / 60).toFixed(1)} min` : `${done.toFixed(1)} of ${total.toFixed(1)} s`;
}

// How fast a transcription ran against the audio's own length, from the real-time factor
// (processing time ÷ audio duration): "3.5× faster than real time", "2.8× slower than real
// time" (a bare "2.83× real time" read as fast when it meant slow).
export function describeSpeed(rtf) {
  if (rtf === null || !(rtf > 0)) return "–";
  if (Math.abs(rtf - 1) < 0.05) return "about real time";
  return rtf < 1 ? `${(1 / rtf).toFixed(1)}× faster than real time` : `${rtf.toFixed(1)}× slower than real time`;
}

export function formatLeft(seconds) {
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

export function languageName(code) {
  try {
    const name = languageNames?.of(code);
    if (name && name !== code) return name;
  } catch {
    // a code Intl does not know (Whisper's "jw"): the code itself
  }
  return code;
}

export function isMultilingual(model, known) {
  return known[model] ?? !model.endsWith(".en"); // faster-whisper's naming: *.en is English-only
}

export function fileBase(name) {
  return (name || "transcript").replace(/\.[^.]+$/, "").replace(/[^\w.-]+/g, "_");
}
