// The Similarity view: sentences (one per line) are embedded in the worker with a BERT
// sentence embedder (all-MiniLM-L6-v2: mean pooling, L2-normalised), and their cosine
// similarity matrix is shown as a coloured grid. Started by app.js with its WorkerClient.

import { JobStatus, ViewJobs, describeLoad, describeNotKept, fillModelSelect, formatSeconds, loadModel, runOnCtrlEnter } from "./view_common.js";

const KIND = "bert";
const MODEL_LABELS = { "all-minilm-l6-v2": "all-MiniLM-L6-v2" };
const MAX_SENTENCES = 64; // candle_web/worker/bert.py refuses more
const LABEL_CHARS = 48; // row labels show the start of each sentence

// Lines of the text box that hold something: the sentences to compare.
export function sentencesFrom(text) {
  return text.split("\n").map((line) => line.trim()).filter((line) => line.length > 0);
}

// Cell colour: the accent colour for similar (cosine -> 1), a blue for opposite (-> -1),
// transparent around 0; the strength is the magnitude.
function cellBackground(value) {
  const strength = Math.round(Math.min(Math.abs(value), 1) * 70);
  const colour = value >= 0 ? "var(--accent)" : "#3b78c3";
  return `color-mix(in srgb, ${colour} ${strength}%, transparent)`;
}

function shortLabel(text) {
  return text.length > LABEL_CHARS ? `${text.slice(0, LABEL_CHARS - 1)}…` : text;
}

const UI_IDS = {
  modelSelect: "similarity-model", modelNote: "similarity-model-note", input: "similarity-input",
  button: "similarity-button", notice: "similarity-notice", matrix: "similarity-matrix",
  summary: "similarity-summary",
};

const plural = (count) => `${count} sentence${count === 1 ? "" : "s"}`;

// The matrix's head row: an empty corner, then the sentences' numbers.
function matrixHead(sentences) {
  const head = document.createElement("tr");
  head.append(document.createElement("td"));
  sentences.forEach((text, index) => {
    const th = document.createElement("th");
    th.scope = "col";
    th.textContent = String(index + 1);
    th.title = text;
    head.append(th);
  });
  const thead = document.createElement("thead");
  thead.append(head);
  return thead;
}

// One row of the matrix: the sentence (shortened), then its similarity to each sentence.
function matrixRow(result, sentences, row, i) {
  const tr = document.createElement("tr");
  const th = document.createElement("th");
  th.scope = "row";
  th.textContent = `${i + 1}. ${shortLabel(sentences[i])}`;
  th.title = sentences[i];
  if (result.truncated[i]) th.classList.add("truncated");
  tr.append(th);
  row.forEach((value, j) => {
    const td = document.createElement("td");
    td.className = "similarity-cell";
    td.dataset.row = String(i);
    td.dataset.col = String(j);
    td.dataset.value = String(value);
    td.textContent = value.toFixed(2);
    td.style.background = cellBackground(value);
    td.setAttribute("aria-label", `sentence ${i + 1} and sentence ${j + 1}: ${value.toFixed(3)}`);
    tr.append(td);
  });
  return tr;
}

// The closest pair of different sentences, said in words.
function closestPair(result, sentences) {
  let best = null;
  for (let i = 0; i < sentences.length; i += 1) {
    for (let j = i + 1; j < sentences.length; j += 1) {
      if (best === null || result.similarity[i][j] > best.value) best = { i, j, value: result.similarity[i][j] };
    }
  }
  return best === null
    ? "Add a second line to compare sentences."
    : `Closest pair: ${best.i + 1} and ${best.j + 1} (${best.value.toFixed(2)}).`;
}

class SimilarityView {
  constructor(client) {
    const $ = (id) => document.getElementById(id);
    this.client = client;
    this.ui = Object.fromEntries(Object.entries(UI_IDS).map(([name, id]) => [name, $(id)]));
    this.status = new JobStatus({ job: $("similarity-job"), progress: $("similarity-progress"), phase: $("similarity-phase"), error: $("similarity-error") });
    // What the tests (and the curious) can read: window.candleWeb.similarity.
    this.state = {
      runtimeReady: false,
      busy: false,
      loadedModel: null,
      lastLoad: null,
      lastResult: null, // the worker's reply + {sentences, model}; vectors as a Float32Array
      lastError: null,
      events: [],
      jobId: null,
      runs: 0,
    };
    this.jobs = new ViewJobs({ client, status: this.status, state: this.state, refresh: () => this.refreshButtons() });
  }

  refreshButtons() {
    this.ui.button.disabled = this.state.busy || !this.state.runtimeReady;
    this.ui.modelSelect.disabled = this.state.busy;
  }

  async ensureModel(model, track) {
    const { state } = this;
    if (state.loadedModel === model && this.client.holds(KIND, model)) return;
    const reply = await loadModel(this.client, KIND, { model }, this.status, { label: MODEL_LABELS[model] || model, track, events: state.events });
    state.lastLoad = reply;
    state.loadedModel = reply.key;
    this.ui.modelNote.textContent = `${MODEL_LABELS[model] || model} loaded (${describeLoad(reply)}).${describeNotKept(reply, MODEL_LABELS[model] || model)}`;
  }

  showNotice(result) {
    const { ui } = this;
    const cut = [];
    result.truncated.forEach((truncated, index) => {
      if (truncated) cut.push(`sentence ${index + 1} has ${result.inputTokenCounts[index]} tokens`);
    });
    if (cut.length === 0) {
      ui.notice.hidden = true;
      ui.notice.textContent = "";
      return;
    }
    ui.notice.textContent = `Truncated: ${cut.join(", ")}; only the first ${result.maxTokens} tokens (the model's limit) were embedded.`;
    ui.notice.hidden = false;
  }

  showMatrix(result, sentences) {
    const table = document.createElement("table");
    table.className = "similarity-table";
    const caption = document.createElement("caption");
    caption.textContent = "Cosine similarity of the sentence embeddings (1 = same meaning)";
    const tbody = document.createElement("tbody");
    result.similarity.forEach((row, i) => tbody.append(matrixRow(result, sentences, row, i)));
    table.append(caption, matrixHead(sentences), tbody);
    this.ui.matrix.replaceChildren(table);
    this.ui.summary.textContent = closestPair(result, sentences);
  }

  // The sentences and model as a job for `jobs`, or null after saying what is wrong.
  prepare() {
    const { ui, state, status } = this;
    const sentences = sentencesFrom(ui.input.value);
    if (sentences.length === 0) {
      status.showError("Type at least one sentence to embed, one per line.");
      ui.input.focus();
      return null;
    }
    if (sentences.length > MAX_SENTENCES) {
      status.showError(`${sentences.length} sentences: at most ${MAX_SENTENCES} at once.`);
      return null;
    }
    const model = ui.modelSelect.value;
    return {
      load: (track) => this.ensureModel(model, track),
      running: { text: `Embedding ${plural(sentences.length)}…` },
      command: "embed",
      fields: () => ({ model, sentences }),
      done: (reply) => {
        const vectors = new Float32Array(reply.vectors);
        state.lastResult = { ...reply, vectors, sentences, model };
        this.showNotice(reply);
        this.showMatrix(reply, sentences);
        return `Embedded ${plural(reply.count)} (${reply.dims} dimensions) in ${formatSeconds(reply.elapsedMs / 1000)}.`;
      },
      // Nothing stops an embedding (no Stop button), but the worker may still say Cancelled.
      cancelled: () => "Cancelled.",
    };
  }
}

export function setUpSimilarity(client, ready) {
  const view = new SimilarityView(client);
  const { ui, jobs } = view;
  const compare = () => jobs.run(() => view.prepare());
  ui.button.addEventListener("click", compare);
  runOnCtrlEnter(ui.input, compare);
  jobs.whenReady(ready, "embedded", () => fillModelSelect(client, KIND, ui.modelSelect, MODEL_LABELS));
  return { state: view.state, compare };
}
