// The Transcribe view's microphone: Record and Stop, the level meter, and a recording becoming
// an entry like a dropped file; in live mode the worker transcribes while recording goes on.
// The live policy (when a pass runs, which window it reads, when a window is final, the
// prompt) is the worker's (candle_web.pipelines.transcribe.LiveTranscriber): this page sends
// the audio heard from the open window's start once the reply's nextPassAt has been heard, and
// shows the kept and partial segments each reply carries.

import { SAMPLE_RATE, decodeToMono16k, encodeWav } from "../audio_input.js";
import { Recorder, microphoneMessage } from "../recorder.js";
import { formatSeconds } from "../view_common.js";
import { formatElapsed } from "./format.js";
import { transcribeProgress } from "./transcript.js";

const plural = (count, one, many) => `${count} ${count === 1 ? one : many}`;

export class Microphone {
  constructor(view) {
    this.view = view; // {client, ui, state, status, jobs, form, transcript, queue}
    this.recorder = null;
    this.recordings = 0;
  }

  showLevel(level, seconds) {
    const { ui, state } = this.view;
    ui.micLevel.value = level;
    ui.micElapsed.textContent = formatElapsed(seconds);
    if (state.recorder) {
      state.recorder.seconds = seconds;
      state.recorder.level = level;
      state.recorder.peakLevel = Math.max(state.recorder.peakLevel, level);
    }
  }

  showError(message) {
    const { ui } = this.view;
    ui.micError.textContent = message;
    ui.micError.hidden = false;
  }

  // Back to no recording: the state, the recorder's place and its look.
  #released() {
    const { ui, state } = this.view;
    state.recording = false;
    this.recorder = null;
    ui.recorder.dataset.state = "idle";
  }

  async start() {
    const { ui, state, status, queue } = this.view;
    if (state.recording) return;
    ui.micError.hidden = true;
    const live = ui.liveMode.checked;
    const recorder = new Recorder({ onLevel: (level, seconds) => this.showLevel(level, seconds) });
    this.recorder = recorder;
    state.recorder = { seconds: 0, level: 0, peakLevel: 0, mimeType: "", live };
    state.recording = true;
    ui.recorder.dataset.state = "starting";
    queue.refreshButtons();
    try {
      await recorder.start();
    } catch (error) {
      recorder.abort();
      this.#released();
      state.recorder.error = { name: error.name, message: error.message };
      ui.recorder.dataset.state = "error";
      this.showError(microphoneMessage(error));
      queue.refreshButtons();
      return;
    }
    state.recorder.mimeType = recorder.mimeType;
    ui.recorder.dataset.state = "recording";
    this.recordings += 1;
    const name = `Recording ${this.recordings}`;
    if (live) {
      this.#live(recorder, name);
    } else {
      status.set("recording", `Recording from the microphone… press Stop to transcribe.`);
    }
  }

  async stop() {
    const { ui, state } = this.view;
    if (!state.recording || this.recorder === null) return;
    const current = this.recorder;
    ui.recorder.dataset.state = "stopping";
    ui.stopRecordButton.disabled = true;
    const blob = await current.stop();
    if (state.live !== null && state.live.recorder === current) return; // the live session finishes
    this.#released();
    await this.useRecording(blob, `Recording ${this.recordings}`, true);
  }

  // A recording becomes an entry like a dropped file (decoded the same way), with a WAV copy
  // for the player; after Stop it is transcribed without another press.
  async useRecording(blob, name, queue) {
    let samples;
    try {
      samples = await decodeToMono16k(await blob.arrayBuffer(), name);
    } catch (error) {
      this.showError(error.message);
      this.view.queue.refreshButtons();
      return null;
    }
    const url = URL.createObjectURL(encodeWav(samples));
    await this.view.queue.useSources([{ name, samples, url, ownsUrl: true }], { queue });
    return this.view.state.items.find((item) => item.url === url) || null;
  }

  // Cancel pressed during a live recording: the recording stops, the text so far stays.
  cancelLive() {
    const { state } = this.view;
    if (state.live !== null && state.recording) {
      state.live.cancelled = true;
      this.recorder?.abort();
    }
  }

  // One step of the live recording in the worker (the transcribe command with `live`):
  // "start" (no samples), "pass" or "stop" with the samples from `offset` seconds on.
  async #step(live, action, samples = null, offset = null) {
    const { client, jobs, state } = this.view;
    const fields = { model: live.model, options: live.options, live: { recording: live.recording, action } };
    const handlers = {};
    if (samples !== null) {
      Object.assign(fields, { samples, offset });
      handlers.transfer = [samples.buffer];
      handlers.onProgress = transcribeProgress(this.view, live.itemRef, samples.length / SAMPLE_RATE, offset);
    }
    const job = client.start("transcribe", fields, handlers);
    jobs.track(job);
    try {
      return await job.result;
    } finally {
      state.jobId = null;
    }
  }

  // Shows what the worker's reply says of the recording: its passes, kept and partial segments.
  #show(live, reply) {
    const { ui, state, transcript } = this.view;
    const { passes, commits, windowStart, passEnd, heard, passMs, nextPassAt, final, partial } = reply.live;
    Object.assign(live, { passes, commits, windowStart, passEnd, heard, passMs, nextPassAt, final, partial });
    if (!reply.live.ran) return;
    live.history.push(reply.live.history);
    const item = live.itemRef;
    item.segments = [...final];
    item.partial = [...partial];
    if (state.clip === item) {
      transcript.renderSegments(item);
      ui.liveText.textContent = "";
    }
  }

  // The live state (state.live) and its entry, shown at once.
  #begin(current, name, model, options) {
    const { state, status, queue } = this.view;
    const item = queue.add(name, "live");
    item.status = "live";
    state.clip = null;
    queue.select(item);
    const live = {
      recorder: current, item: item.id, itemRef: item, recording: item.id, model, options,
      passes: 0, commits: 0, windowStart: 0, heard: 0, passEnd: 0, passMs: 0, nextPassAt: 0,
      final: [], partial: [], history: [], cancelled: false,
    };
    state.live = live;
    state.busy = true;
    state.lastError = null;
    state.streamed = { windows: 0, tokens: 0, segments: 0 };
    state.heap = { startBytes: null, firstWindowBytes: null, lastBytes: null, endBytes: null, windows: [] };
    status.clearError();
    queue.refreshButtons();
    return live;
  }

  // The passes while recording: wait until the worker's nextPassAt has been heard (at once
  // when passes fall behind the speaker), then send what was heard from the open window on.
  async #passes(current, live) {
    const { status } = this.view;
    while (current.active && !live.cancelled) {
      status.set("live", live.passes === 0 ? "Listening… the first words appear after a few seconds."
        : `Listening… ${live.final.length === 0 ? "the words so far may still change" : `${plural(live.final.length, "line", "lines")} written for good; the newest words may still change`}.`);
      await current.waitForSeconds(live.nextPassAt);
      if (!current.active || live.cancelled) break;
      const heard = await current.samplesSoFar();
      const from = Math.round(live.windowStart * SAMPLE_RATE);
      if (heard.length <= from) continue;
      this.#show(live, await this.#step(live, "pass", heard.slice(from), from / SAMPLE_RATE));
    }
    if (live.cancelled) throw Object.assign(new Error("cancelled by the page"), { name: "Cancelled" });
  }

  // After Stop: the complete recording, decoded like a file, and the worker's last pass over
  // what is left of it, which returns the whole transcript and its exports.
  async #finish(current, live) {
    const { ui, state, status, queue } = this.view;
    const item = live.itemRef;
    status.set("transcribing", "Finishing the live transcript…");
    const blob = await current.stop();
    const samples = await decodeToMono16k(await blob.arrayBuffer(), item.name);
    Object.assign(item, { samples, seconds: samples.length / SAMPLE_RATE });
    item.url = URL.createObjectURL(encodeWav(samples));
    item.objectUrl = item.url;
    ui.player.src = item.url;
    ui.clipDuration.textContent = `(${formatSeconds(item.seconds)})`;
    this.#released();
    queue.refreshButtons();
    const from = Math.min(Math.round(live.windowStart * SAMPLE_RATE), Math.max(samples.length - 1, 0));
    const stoppedAt = performance.now();
    const result = await this.#step(live, "stop", samples.slice(from), from / SAMPLE_RATE);
    const afterStopMs = performance.now() - stoppedAt;
    this.#show(live, result);
    result.timings = { ...result.timings, afterStopMs };
    state.runs += 1;
    status.fraction(1);
    queue.finish(item, result, live.model, live.options);
    status.set("done", `Done: ${item.name}, transcribed while you spoke; the whole transcript ${formatSeconds(afterStopMs / 1000)} after Stop.`);
  }

  #failed(live, error) {
    const { state, status, transcript } = this.view;
    const item = live.itemRef;
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
    if (state.clip === item) transcript.renderSegments(item);
    live.recorder?.abort();
  }

  // Live: the model, then passes while recording (words appear a pass later), then, after
  // Stop, the last pass and the whole transcript.
  async #live(current, name) {
    const { state, status, form, queue } = this.view;
    const model = form.model;
    const options = form.options(model);
    if (options === null) {
      current.abort();
      this.#released();
      queue.refreshButtons();
      return;
    }
    const live = this.#begin(current, name, model, options);
    try {
      status.set("loading", `Recording; loading ${model}…`);
      await form.ensureModel(model, this.view.jobs.track);
      state.jobId = null;
      this.#show(live, await this.#step(live, "start"));
      await this.#passes(current, live);
      await this.#finish(current, live);
    } catch (error) {
      this.#failed(live, error);
    } finally {
      this.#released();
      state.busy = false;
      state.jobId = null;
      live.recorder = null;
      queue.render();
      queue.pump();
    }
  }
}
