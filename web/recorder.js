// The microphone of the Transcribe view: MediaRecorder records (the recording is decoded to
// 16 kHz mono like any dropped file), an AnalyserNode gives the level meter, and the chunks
// recorded so far can be decoded while recording goes on (live transcription).

import { decodeToMono16k } from "./audio_input.js";

const CHUNK_MS = 1000; // MediaRecorder hands over what it has once a second
const LEVEL_INTERVAL_MS = 100;
const LEVEL_FLOOR_DB = -60; // the meter's zero: quieter than this reads as silence
const PREFERRED_TYPES = ["audio/webm;codecs=opus", "audio/webm", "audio/mp4"];

// The inline message for a microphone that cannot start, by the browser's error name.
export function microphoneMessage(error) {
  const name = error?.name || "Error";
  if (name === "NotAllowedError" || name === "SecurityError" || name === "PermissionDeniedError") {
    return "Microphone access is blocked for this page. Allow it in the browser's site settings (the icon left of the address), then press Record again. Files and sample clips work without it.";
  }
  if (name === "NotFoundError" || name === "OverconstrainedError" || name === "DevicesNotFoundError") {
    return "No microphone was found. Connect one (or pick it in the system's sound settings), then press Record again. Files and sample clips work without it.";
  }
  if (name === "NotReadableError" || name === "AbortError") {
    return `The microphone could not be started: another program may be using it (${error.message || name}).`;
  }
  if (name === "Unsupported") return error.message;
  return `The microphone could not be started: ${name}: ${error.message || "unknown error"}`;
}

function unsupported(message) {
  const error = new Error(message);
  error.name = "Unsupported";
  return error;
}

export class Recorder {
  constructor({ onLevel } = {}) {
    this.onLevel = onLevel;
    this.chunks = [];
    this.active = false;
    this.startedAt = 0;
    this.stoppedAt = 0;
    this.peakLevel = 0;
    this.level = 0;
    this.mimeType = "";
    this.waiters = [];
  }

  get seconds() {
    if (this.startedAt === 0) return 0;
    return ((this.active ? performance.now() : this.stoppedAt) - this.startedAt) / 1000;
  }

  // Asks for the microphone and starts recording; rejects with the browser's error (see
  // microphoneMessage) when there is none or access is refused.
  async start() {
    if (!navigator.mediaDevices?.getUserMedia) {
      throw unsupported("This browser gives this page no microphone access (it needs https or http://localhost, and a browser with getUserMedia).");
    }
    if (typeof MediaRecorder === "undefined") {
      throw unsupported("This browser cannot record audio (no MediaRecorder).");
    }
    // Whisper copes with raw audio; the browser's voice-call processing would only change it.
    this.stream = await navigator.mediaDevices.getUserMedia({
      audio: { channelCount: 1, echoCancellation: false, noiseSuppression: false, autoGainControl: false },
    });
    const mimeType = PREFERRED_TYPES.find((type) => MediaRecorder.isTypeSupported(type));
    this.recorder = new MediaRecorder(this.stream, mimeType ? { mimeType } : {});
    this.mimeType = this.recorder.mimeType || mimeType || "";
    this.recorder.ondataavailable = (event) => {
      if (event.data.size > 0) this.chunks.push(event.data);
      this.#wake();
    };
    this.stopped = new Promise((resolve) => { this.recorder.onstop = resolve; });
    this.#startMeter();
    this.recorder.start(CHUNK_MS);
    this.active = true;
    this.startedAt = performance.now();
  }

  #startMeter() {
    try {
      this.context = new AudioContext();
      const source = this.context.createMediaStreamSource(this.stream);
      const analyser = this.context.createAnalyser();
      analyser.fftSize = 2048;
      source.connect(analyser);
      const frame = new Float32Array(analyser.fftSize);
      this.meter = setInterval(() => {
        analyser.getFloatTimeDomainData(frame);
        let sum = 0;
        for (const value of frame) sum += value * value;
        const rms = Math.sqrt(sum / frame.length);
        const db = rms > 0 ? 20 * Math.log10(rms) : -Infinity;
        this.level = Math.max(0, Math.min(1, (db - LEVEL_FLOOR_DB) / -LEVEL_FLOOR_DB));
        this.peakLevel = Math.max(this.peakLevel, this.level);
        this.onLevel?.(this.level, this.seconds);
      }, LEVEL_INTERVAL_MS);
    } catch (error) {
      console.warn("no level meter:", error); // recording works without it
    }
  }

  #wake() {
    for (const wake of this.waiters.splice(0)) wake();
  }

  // Resolves once at least `seconds` have been recorded and handed over, or recording stopped.
  async waitForSeconds(seconds) {
    while (this.active && (this.seconds < seconds || this.chunks.length === 0)) {
      await new Promise((resolve) => this.waiters.push(resolve));
    }
  }

  // What has been recorded so far, as 16 kHz mono samples (a WebM prefix decodes up to its
  // last complete block).
  async samplesSoFar() {
    const blob = new Blob(this.chunks, { type: this.mimeType });
    return decodeToMono16k(await blob.arrayBuffer(), "the recording");
  }

  // Stops recording and releases the microphone; resolves with the whole recording (a Blob).
  async stop() {
    if (this.recorder) {
      if (this.recorder.state !== "inactive") this.recorder.stop();
      await this.stopped; // the last chunk arrives before the stop event
    }
    if (this.active) this.stoppedAt = performance.now();
    this.active = false;
    this.#release();
    this.#wake();
    return new Blob(this.chunks, { type: this.mimeType });
  }

  // Drops everything (a failed start, a cancel).
  abort() {
    if (this.recorder && this.recorder.state !== "inactive") this.recorder.stop();
    if (this.active) this.stoppedAt = performance.now();
    this.active = false;
    this.#release();
    this.#wake();
  }

  #release() {
    clearInterval(this.meter);
    this.meter = undefined;
    this.stream?.getTracks().forEach((track) => track.stop());
    this.context?.close().catch(() => {});
    this.context = undefined;
    this.level = 0;
    this.onLevel?.(0, this.seconds);
  }
}
