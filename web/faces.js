// The Faces view: photos (dropped or chosen) or the camera's picture go to the worker, which
// decodes them (createImageBitmap + OffscreenCanvas) and runs face-api's networks in Python
// (candle_web.worker.faces: tiny face detector, 68 landmarks, expressions, age and gender);
// the boxes and points come back in the photo's pixels and are drawn here on a canvas over the
// photo. Nothing leaves the tab. Started by app.js with its WorkerClient.

import { JobStatus, ViewJobs, countOf, describeLoad, describeNotKept, formatSeconds, loadModel } from "./view_common.js";

const KIND = "faces";
const MODEL = "face-api"; // the registry entry (face-api 1.7.15's weights, from its npm tarball)
const LABEL = "face-api's networks";
const STAGES = [["decode", "decode"], ["resize", "resize"], ["detect", "detect"], ["landmarks", "landmarks"], ["expressions", "expressions"], ["ageGender", "age and gender"], ["descriptor", "descriptor"]];
const BOX_COLOUR = "#e8452c";
const POINT_COLOUR = "#19c37d";

const UI_IDS = {
  drop: "faces-drop", choose: "faces-choose", fileInput: "faces-file-input", landmarks: "faces-landmarks",
  expressions: "faces-expressions", ageGender: "faces-age-gender", camera: "faces-camera",
  stopCamera: "faces-stop-camera", video: "faces-video", results: "faces-results", modelNote: "faces-model-note",
  descriptor: "faces-descriptor", compare: "faces-compare",
};
// Two faces are the same person below this descriptor distance (face-api's and dlib's 0.6).
const SAME_PERSON_DISTANCE = 0.6;

export function descriptorDistance(a, b) {
  return Math.sqrt(a.reduce((sum, value, i) => sum + (value - b[i]) ** 2, 0));
}

// "happy 0.93": the most likely of face-api's seven expressions.
function topExpression(expressions) {
  const [name, value] = Object.entries(expressions).reduce((best, entry) => (entry[1] > best[1] ? entry : best));
  return `${name} ${value.toFixed(2)}`;
}

// One face in words: "Face 1: score 0.82, female (0.97), about 27, sad 0.61".
export function describeFace(face, index) {
  const parts = [`score ${face.score.toFixed(2)}`];
  if (face.gender !== undefined) parts.push(`${face.gender} (${face.genderProbability.toFixed(2)})`, `about ${Math.round(face.age)}`);
  if (face.expressions !== undefined) parts.push(topExpression(face.expressions));
  return `Face ${index + 1}: ${parts.join(", ")}`;
}

// "decode 12 ms · detect 2.51 s · landmarks 0.40 s …" from the result's timingsMs.
export function describeTimings(timings) {
  const text = (ms) => (ms < 1000 ? `${Math.round(ms)} ms` : formatSeconds(ms / 1000));
  return STAGES.filter(([key]) => timings[key] !== undefined).map(([key, name]) => `${name} ${text(timings[key])}`).join(" · ");
}

// Draws `source` (an ImageBitmap or the video) on `canvas` at its own size, then each face's
// box (and landmarks) over it; the canvas's CSS keeps it within the column.
function drawFaces(canvas, source, width, height, faces) {
  canvas.width = width;
  canvas.height = height;
  const context = canvas.getContext("2d");
  context.drawImage(source, 0, 0, width, height);
  const line = Math.max(2, Math.round(Math.max(width, height) / 400));
  context.lineWidth = line;
  context.font = `${line * 8}px system-ui, sans-serif`;
  faces.forEach((face, index) => {
    const [x, y, w, h] = face.box;
    context.strokeStyle = BOX_COLOUR;
    context.strokeRect(x, y, w, h);
    context.fillStyle = BOX_COLOUR;
    context.fillText(String(index + 1), x + line, Math.max(y - line * 2, line * 8));
    if (face.landmarks) {
      context.fillStyle = POINT_COLOUR;
      for (const [px, py] of face.landmarks) context.fillRect(px - line / 2, py - line / 2, line, line);
    }
  });
}

class FacesView {
  constructor(client) {
    const $ = (id) => document.getElementById(id);
    this.client = client;
    this.ui = Object.fromEntries(Object.entries(UI_IDS).map(([name, id]) => [name, $(id)]));
    this.status = new JobStatus({ job: $("faces-job"), progress: $("faces-progress"), phase: $("faces-phase"), error: $("faces-error") });
    // What the tests (and the curious) can read: window.candleWeb.faces.
    this.state = {
      runtimeReady: false,
      busy: false,
      loadedModel: null,
      lastLoad: null,
      lastResult: null, // the worker's reply + {file}; pixels (when asked) as a Uint8Array
      results: [], // every photo's reply of this session, newest last
      lastError: null,
      events: [],
      jobId: null,
      runs: 0,
      keepPixels: false, // the twin test asks for the RGB bytes the networks read
      camera: { running: false, frames: 0, fps: null, seconds: 0, lastFaces: null },
      picked: [], // faces ticked to compare: {box (the checkbox), name, descriptor}
      comparison: null, // {distance, samePerson} of the last two ticked
    };
    this.jobs = new ViewJobs({ client, status: this.status, state: this.state, refresh: () => this.refreshButtons() });
    this.queue = [];
  }

  refreshButtons() {
    const { ui, state } = this;
    const idle = !state.busy && state.runtimeReady;
    ui.choose.disabled = !idle;
    ui.camera.disabled = !idle;
    ui.stopCamera.disabled = !state.camera.running;
  }

  options() {
    const { ui } = this;
    return { landmarks: ui.landmarks.checked, expressions: ui.expressions.checked, ageGender: ui.ageGender.checked, descriptor: ui.descriptor.checked };
  }

  async ensureModel(track) {
    const { state } = this;
    if (state.loadedModel === MODEL && this.client.holds(KIND, MODEL)) return;
    const reply = await loadModel(this.client, KIND, { model: MODEL }, this.status, { label: LABEL, track, events: state.events });
    state.lastLoad = reply;
    state.loadedModel = reply.key;
    this.ui.modelNote.textContent = `${LABEL} loaded (${describeLoad(reply)}).${describeNotKept(reply, LABEL)}`;
  }

  // A figure for one photo: the canvas (photo + faces) and the faces in words.
  showPhoto(file, bitmap, result) {
    const figure = document.createElement("figure");
    figure.className = "faces-photo";
    const canvas = document.createElement("canvas");
    canvas.className = "faces-canvas";
    canvas.setAttribute("role", "img");
    canvas.setAttribute("aria-label", `${file.name}: ${countOf(result.faces.length, "face")} found`);
    drawFaces(canvas, bitmap, result.width, result.height, result.faces);
    const caption = document.createElement("figcaption");
    const title = document.createElement("p");
    title.className = "faces-title";
    title.textContent = `${file.name}: ${countOf(result.faces.length, "face")} (${result.width}×${result.height})`;
    const list = document.createElement("ul");
    list.className = "faces-list";
    result.faces.forEach((face, index) => {
      const item = document.createElement("li");
      const words = describeFace(face, index);
      if (face.descriptor) {
        const label = document.createElement("label");
        label.className = "check-inline";
        const box = document.createElement("input");
        box.type = "checkbox";
        box.className = "faces-pick";
        const name = `${file.name} face ${index + 1}`;
        box.addEventListener("change", () => this.pick(box, name, face.descriptor));
        label.append(box, ` ${words}`);
        item.append(label);
      } else {
        item.textContent = words;
      }
      list.append(item);
    });
    const timings = document.createElement("p");
    timings.className = "note faces-timings";
    timings.textContent = describeTimings(result.timingsMs);
    caption.append(title, list, timings);
    figure.append(canvas, caption);
    this.ui.results.prepend(figure);
  }

  // A face ticked or unticked for comparing; with two ticked, their distance in words (a third
  // tick lets go of the oldest).
  pick(box, name, descriptor) {
    const { state, ui } = this;
    state.picked = state.picked.filter((entry) => entry.box !== box);
    if (box.checked) state.picked.push({ box, name, descriptor });
    while (state.picked.length > 2) {
      const dropped = state.picked.shift();
      dropped.box.checked = false;
    }
    if (state.picked.length < 2) {
      state.comparison = null;
      ui.compare.textContent = state.picked.length === 1 ? `${state.picked[0].name} ticked: tick one more face.` : "With descriptors on, tick two faces to compare them.";
      return;
    }
    const [a, b] = state.picked;
    const distance = descriptorDistance(a.descriptor, b.descriptor);
    const samePerson = distance < SAME_PERSON_DISTANCE;
    state.comparison = { distance, samePerson, names: [a.name, b.name] };
    ui.compare.textContent = `${a.name} and ${b.name}: distance ${distance.toFixed(3)}, ${samePerson ? "the same person" : "different people"} (the same below ${SAME_PERSON_DISTANCE}).`;
  }

  // One photo as a job for `jobs`.
  prepare(file) {
    const { state } = this;
    const options = this.options();
    let bitmap = null;
    return {
      load: async (track) => {
        // The page's own copy to draw on (the worker decodes its own for the networks).
        try {
          bitmap = await createImageBitmap(file, { imageOrientation: "from-image", colorSpaceConversion: "none" });
        } catch {
          throw Object.assign(new Error(`${file.name} is not a photo this browser can read`), { name: "FormatError" });
        }
        await this.ensureModel(track);
      },
      running: { text: `Finding faces in ${file.name}…` },
      command: "faces",
      fields: () => ({ model: MODEL, image: file, options, keepPixels: state.keepPixels }),
      done: (reply) => {
        const result = { ...reply, file: file.name };
        if (reply.pixels) result.pixels = new Uint8Array(reply.pixels);
        state.lastResult = result;
        state.results.push({ ...result, pixels: undefined });
        this.showPhoto(file, bitmap, reply);
        bitmap.close();
        return `${file.name}: ${countOf(reply.faces.length, "face")} in ${formatSeconds(reply.timingsMs.total / 1000 + (reply.timingsMs.decode || 0) / 1000)}.`;
      },
      cancelled: () => "Cancelled.",
      cleanup: () => bitmap?.close(),
    };
  }

  // Photos one after another (the worker runs one job at a time anyway).
  async addPhotos(files) {
    const photos = Array.from(files);
    if (photos.length === 0) return;
    this.queue.push(...photos);
    if (this.draining) return;
    this.draining = true;
    try {
      while (this.queue.length > 0) {
        const file = this.queue.shift();
        await this.jobs.run(() => this.prepare(file));
      }
    } finally {
      this.draining = false;
    }
  }

  // The camera: frames are taken one after another, each as soon as the last one's faces are
  // back, so the rate is the one the page can hold; the canvas shows the frame the faces were
  // found in.
  async startCamera() {
    const { ui, state, status } = this;
    if (state.busy || state.camera.running) return;
    status.clearError();
    let stream;
    try {
      stream = await navigator.mediaDevices.getUserMedia({ video: { width: { ideal: 640 }, height: { ideal: 480 } }, audio: false });
    } catch (error) {
      status.showError(`The camera could not start: ${error.name}: ${error.message}`);
      return;
    }
    state.busy = true;
    state.camera = { running: true, frames: 0, fps: null, seconds: 0, lastFaces: null };
    this.refreshButtons();
    ui.video.srcObject = stream;
    const canvas = document.createElement("canvas");
    canvas.className = "faces-canvas";
    canvas.setAttribute("role", "img");
    canvas.setAttribute("aria-label", "Camera: faces found in the latest frame");
    ui.results.prepend(canvas);
    try {
      await ui.video.play();
      await this.ensureModel(this.jobs.track);
      status.set("running", "Camera on: finding faces in each frame…");
      status.fraction(null);
      const started = performance.now();
      while (state.camera.running) {
        const bitmap = await createImageBitmap(ui.video);
        const { videoWidth: width, videoHeight: height } = ui.video;
        const shown = await createImageBitmap(bitmap);
        // No descriptors for the camera: nothing there to compare, and they cost the most.
        const options = { ...this.options(), descriptor: false };
        const job = this.client.start("faces", { model: MODEL, image: bitmap, options }, { transfer: [bitmap] });
        this.jobs.track(job);
        const reply = await job.result;
        drawFaces(canvas, shown, width, height, reply.faces);
        shown.close();
        state.camera.frames += 1;
        state.camera.seconds = (performance.now() - started) / 1000;
        state.camera.fps = state.camera.frames / state.camera.seconds;
        state.camera.lastFaces = reply.faces;
        status.phase.textContent = `Camera on: ${countOf(reply.faces.length, "face")} · ${state.camera.fps.toFixed(2)} frames a second · ${describeTimings(reply.timingsMs)}`;
      }
      status.set("done", `Camera off after ${countOf(state.camera.frames, "frame")} (${(state.camera.fps ?? 0).toFixed(2)} frames a second).`);
    } catch (error) {
      state.lastError = { name: error.name, message: error.message };
      status.set("error", "Stopped by an error.");
      status.showError(`${error.name}: ${error.message}`);
    } finally {
      stream.getTracks().forEach((track) => track.stop());
      ui.video.srcObject = null;
      state.camera.running = false;
      state.busy = false;
      state.jobId = null;
      this.refreshButtons();
    }
  }

  stopCamera() {
    this.state.camera.running = false; // the loop ends after the frame under way
    this.refreshButtons();
  }
}

export function setUpFaces(client, ready) {
  const view = new FacesView(client);
  const { ui, jobs } = view;
  ui.choose.addEventListener("click", () => ui.fileInput.click());
  ui.fileInput.addEventListener("change", () => {
    view.addPhotos(ui.fileInput.files);
    ui.fileInput.value = "";
  });
  ui.drop.addEventListener("dragover", (event) => {
    event.preventDefault();
    ui.drop.classList.add("dragging");
  });
  ui.drop.addEventListener("dragleave", () => ui.drop.classList.remove("dragging"));
  ui.drop.addEventListener("drop", (event) => {
    event.preventDefault();
    ui.drop.classList.remove("dragging");
    const photos = Array.from(event.dataTransfer.files).filter((file) => file.type.startsWith("image/"));
    if (photos.length === 0) {
      view.status.showError("Drop photos (JPEG, PNG, WebP …): nothing dropped was an image.");
      return;
    }
    view.addPhotos(photos);
  });
  ui.camera.addEventListener("click", () => view.startCamera());
  ui.stopCamera.addEventListener("click", () => view.stopCamera());
  jobs.whenReady(ready, "found");
  return { state: view.state, addPhotos: (files) => view.addPhotos(files) };
}
