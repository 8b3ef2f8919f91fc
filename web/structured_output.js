// "Answer as JSON" in Generate and Chat: a folded section with a switch, the choice between a
// JSON schema and any JSON object, the schema itself and OpenAI's strict flag. When on, the run
// sends `responseFormat` (OpenAI's response_format shape) and the worker constrains every token
// with web-xgrammar (web/worker/grammar.js, candle_web.worker.grammar): the model can only
// write what keeps the answer valid JSON (matching the schema). The answer is shown formatted.
// Errors name the bad part next to the schema box: JSON syntax (line and column) here, the
// schema's meaning (a feature the engine cannot enforce, a wrong type name, with its path) from
// the worker's check, which the page shows here as well.

// Three fields, small enough for a 135M model to fill in a few dozen tokens.
export const EXAMPLE_SCHEMA = {
  type: "object",
  properties: { name: { type: "string" }, capital: { type: "string" }, population_millions: { type: "number" } },
  required: ["name", "capital", "population_millions"],
};
// The worker's errors about a schema (candle_web.generation.grammar): shown by the field.
const SCHEMA_ERRORS = new Set(["GrammarError", "UnsupportedSchema"]);

export class JsonOptionError extends Error {}

// The markup, made here so that Generate and Chat share one definition; `p` is the id prefix.
function markup(p) {
  return `
    <summary>Answer as JSON</summary>
    <label class="check"><input type="checkbox" id="${p}-json-on"> On: the model can only write valid JSON</label>
    <fieldset class="json-kind">
      <legend>The answer must be</legend>
      <label class="check"><input type="radio" name="${p}-json-kind" id="${p}-json-kind-schema" value="json_schema" checked> JSON matching the schema below</label>
      <label class="check"><input type="radio" name="${p}-json-kind" id="${p}-json-kind-object" value="json_object"> any JSON object</label>
    </fieldset>
    <div class="field">
      <label for="${p}-json-schema">JSON schema</label>
      <textarea id="${p}-json-schema" rows="8" spellcheck="false" autocomplete="off" aria-describedby="${p}-json-error ${p}-json-note"></textarea>
      <p id="${p}-json-error" class="error" role="alert" hidden></p>
    </div>
    <label class="check"><input type="checkbox" id="${p}-json-strict" checked> Strict: no properties beyond the schema's</label>
    <p id="${p}-json-note" class="note">Constrained decoding with xgrammar (web-xgrammar, running in this page), as <code>candle-web serve</code> does for <code>response_format</code>. A schema feature the engine cannot enforce is refused by name.</p>`;
}

// Line and column of character `position` in `text` (1-based), for JSON syntax errors.
function lineAndColumn(text, position) {
  const before = text.slice(0, position);
  const line = before.split("\n").length;
  return { line, column: position - before.lastIndexOf("\n") };
}

export class JsonOption {
  // Fills `slot` (an element of the view, replaced) with the section; `prefix` names its ids.
  constructor(slot, prefix) {
    const details = document.createElement("details");
    details.className = "settings json-option";
    details.id = `${prefix}-json`;
    details.innerHTML = markup(prefix);
    slot.replaceWith(details);
    const $ = (suffix) => document.getElementById(`${prefix}-json-${suffix}`);
    this.details = details;
    this.ui = { on: $("on"), schemaKind: $("kind-schema"), objectKind: $("kind-object"), schema: $("schema"), strict: $("strict"), error: $("error") };
    this.ui.schema.value = JSON.stringify(EXAMPLE_SCHEMA, null, 2);
    for (const input of [this.ui.on, this.ui.schemaKind, this.ui.objectKind]) input.addEventListener("change", () => this.refresh());
    this.ui.schema.addEventListener("input", () => this.clearError());
    this.refresh();
  }

  refresh() {
    const { ui } = this;
    const schemaUsed = ui.on.checked && ui.schemaKind.checked;
    ui.schema.disabled = !schemaUsed;
    ui.strict.disabled = !schemaUsed;
    ui.schemaKind.disabled = ui.objectKind.disabled = !ui.on.checked;
  }

  setDisabled(disabled) {
    this.details.querySelectorAll("input, textarea").forEach((input) => { input.disabled = disabled; });
    if (!disabled) this.refresh();
  }

  get enabled() {
    return this.ui.on.checked;
  }

  // The settings as plain data (kept with a chat's settings), and back.
  settings() {
    const { ui } = this;
    return { on: ui.on.checked, kind: ui.objectKind.checked ? "json_object" : "json_schema", schema: ui.schema.value, strict: ui.strict.checked };
  }

  restore(settings) {
    const { ui } = this;
    if (!settings || typeof settings !== "object") settings = { on: false };
    ui.on.checked = settings.on === true;
    ui.objectKind.checked = settings.kind === "json_object";
    ui.schemaKind.checked = !ui.objectKind.checked;
    if (typeof settings.schema === "string") ui.schema.value = settings.schema;
    ui.strict.checked = settings.strict !== false;
    this.clearError();
    this.refresh();
  }

  // The request's responseFormat (null when off); throws JsonOptionError naming the bad part,
  // after showing it by the field.
  responseFormat() {
    const { ui } = this;
    this.clearError();
    if (!ui.on.checked) return null;
    if (ui.objectKind.checked) return { type: "json_object" };
    const text = ui.schema.value;
    if (text.trim() === "") this.fail("JSON schema is empty: write a schema, or choose “any JSON object”.");
    let schema;
    try {
      schema = JSON.parse(text);
    } catch (error) {
      const position = /position (\d+)/.exec(error.message);
      const where = position ? (({ line, column }) => ` at line ${line}, column ${column}`)(lineAndColumn(text, Number(position[1]))) : "";
      this.fail(`JSON schema is not valid JSON${where}: ${error.message}`);
    }
    if (schema === null || typeof schema !== "object" || Array.isArray(schema)) {
      this.fail(`JSON schema must be a JSON object ({"type": "object", ...}), got ${Array.isArray(schema) ? "an array" : JSON.stringify(schema)}.`);
    }
    return { type: "json_schema", json_schema: { name: "answer", schema, strict: ui.strict.checked } };
  }

  fail(message) {
    this.showError(message);
    throw new JsonOptionError(message);
  }

  showError(message) {
    const { ui } = this;
    this.details.open = true;
    ui.error.textContent = message;
    ui.error.hidden = false;
    ui.schema.setAttribute("aria-invalid", "true");
  }

  clearError() {
    const { ui } = this;
    ui.error.textContent = "";
    ui.error.hidden = true;
    ui.schema.removeAttribute("aria-invalid");
  }

  // A run's error: one about the schema (the worker's check names the path) goes by the field
  // too. Returns the note the view's error line adds.
  showWorkerError(error) {
    if (!this.enabled || !SCHEMA_ERRORS.has(error.name)) return "";
    this.showError(error.message);
    return " (see Answer as JSON)";
  }
}

// `text` as indented JSON, or null when it does not parse (a run stopped at its token limit
// before the JSON closed).
export function formattedJson(text) {
  try {
    return JSON.stringify(JSON.parse(text), null, 2);
  } catch {
    return null;
  }
}

// Shows a constrained answer in `output`: formatted when it parses, else as written with a note.
export function showJsonAnswer(output, text) {
  const formatted = formattedJson(text);
  output.replaceChildren();
  const pre = document.createElement("pre");
  pre.className = "json-answer";
  const code = document.createElement("code");
  code.textContent = formatted ?? text;
  pre.append(code);
  output.append(pre);
  if (formatted === null) {
    const note = document.createElement("p");
    note.className = "note";
    note.textContent = "Not complete JSON: the answer stopped before it closed (raise Max tokens).";
    output.append(note);
  }
}
