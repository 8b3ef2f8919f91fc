// The Similarity view: sentences (one per line) are embedded in the worker with a BERT
// sentence embedder (all-MiniLM-L6-v2: mean pooling, L2-normalised), and their cosine
// similarity matrix is shown as a coloured grid. Started by app.js with its WorkerClient.

import { JobStatus, describeLoad, fillModelSelect, formatSeconds, loadModel } from "./view_common.js";

const KIND = "bert";
const MODEL_LABELS = { "all-minilm-l6-v2": "all-MiniLM-L6-v2" };
const MAX_SENTENCES = 64; // web/py/bert_session.py refuses more
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

export function setUpSimilarity(client, ready) {
  const $ = (id) => document.getElementById(id);
  const ui = {
    modelSelect: $("similarity-model"),
    modelNote: $("similarity-model-note"),
    input: $("similarity-input"),
    button: $("similarity-button"),
    notice: $("similarity-notice"),
    matrix: $("similarity-matrix"),
    summary: $("similarity-summary"),
  };
  const status = new JobStatus({ job: $("similarity-job"), progress: $("similarity-progress"), phase: $("similarity-phase"), error: $("similarity-error") });

  // What the tests (and the curious) can read: window.candleWeb.similarity.
  const state = {
    runtimeReady: false,
    busy: false,
    loadedModel: null,
    lastLoad: null,
    lastResult: null, // the worker's reply + {sentences, model}; vectors as a Float32Array
    lastError: null,
    events: [],
    runs: 0,
  };

  function refreshButtons() {
    ui.button.disabled = state.busy || !state.runtimeReady;
    ui.modelSelect.disabled = state.busy;
  }

  async function ensureModel(model) {
    if (state.loadedModel === model) return;
    const reply = await loadModel(client, KIND, { model }, status, { label: MODEL_LABELS[model] || model, events: state.events });
    state.lastLoad = reply;
    state.loadedModel = reply.key;
    ui.modelNote.textContent = `${MODEL_LABELS[model] || model} loaded (${describeLoad(reply)}).`;
  }

  function showNotice(result) {
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

  function showMatrix(result, sentences) {
    const table = document.createElement("table");
    table.className = "similarity-table";
    const caption = document.createElement("caption");
    caption.textContent = "Cosine similarity of the sentence embeddings (1 = same meaning)";
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
    const tbody = document.createElement("tbody");
    result.similarity.forEach((row, i) => {
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
      tbody.append(tr);
    });
    table.append(caption, thead, tbody);
    ui.matrix.replaceChildren(table);

    // The closest pair of different sentences, said in words.
    let best = null;
    for (let i = 0; i < sentences.length; i += 1) {
      for (let j = i + 1; j < sentences.length; j += 1) {
        if (best === null || result.similarity[i][j] > best.value) best = { i, j, value: result.similarity[i][j] };
      }
    }
    ui.summary.textContent = best === null
      ? "Add a second line to compare sentences."
      : `Closest pair: ${best.i + 1} and ${best.j + 1} (${best.value.toFixed(2)}).`;
  }

  async function compare() {
    if (state.busy) return;
    status.clearError();
    const sentences = sentencesFrom(ui.input.value);
    if (sentences.length === 0) {
      status.showError("Type at least one sentence to embed, one per line.");
      ui.input.focus();
      return;
    }
    if (sentences.length > MAX_SENTENCES) {
      status.showError(`${sentences.length} sentences: at most ${MAX_SENTENCES} at once.`);
      return;
    }
    const model = ui.modelSelect.value;
    state.busy = true;
    state.lastError = null;
    state.events = [];
    refreshButtons();
    try {
      await ensureModel(model);
      status.set("running", `Embedding ${sentences.length} sentence${sentences.length === 1 ? "" : "s"}…`);
      status.fraction(null);
      const reply = await client.request("embed", { model, sentences });
      const vectors = new Float32Array(reply.vectors);
      state.lastResult = { ...reply, vectors, sentences, model };
      state.runs += 1;
      showNotice(reply);
      showMatrix(reply, sentences);
      status.fraction(1);
      status.set("done", `Embedded ${reply.count} sentence${reply.count === 1 ? "" : "s"} (${reply.dims} dimensions) in ${formatSeconds(reply.elapsedMs / 1000)}.`);
    } catch (error) {
      state.lastError = { name: error.name, message: error.message };
      status.set("error", "Stopped by an error.");
      status.showError(`${error.name}: ${error.message}`);
      console.error(error.traceback || error);
    } finally {
      state.busy = false;
      refreshButtons();
    }
  }

  ui.button.addEventListener("click", compare);
  // Ctrl+Enter in the text box compares, like submitting a form.
  ui.input.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) {
      event.preventDefault();
      compare();
    }
  });
  ready.then(() => {
    state.runtimeReady = true;
    refreshButtons();
    return fillModelSelect(client, KIND, ui.modelSelect, MODEL_LABELS).catch((error) => console.warn("model list unavailable:", error));
  }, (error) => {
    status.showError(`The Python runtime failed to start, so nothing can be embedded: ${error.message}`);
  });
  refreshButtons();
  return { state, compare };
}
