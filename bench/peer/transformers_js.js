// The transformers.js peer of bench/browser.py, in the same headless Chromium as candle-web's
// page and served by the same `candle-web serve` (bench/browser.py maps the folders below under
// /models/local/). Nothing is fetched from a CDN or the Hub: transformers.js and
// onnxruntime-web's wasm come from the repository's node_modules (package.json pins
// @huggingface/transformers 4.3.1), the model from the local ONNX export of the same weights
// candle-web runs (scripts/export_onnx.py).
//
// URL: transformers_js.html?task=whisper|generate&model=<local folder name>&dtype=fp32|q8
//      &threads=1|2
// window.peer.ready resolves to the page-ready summary (phases in ms); then
//   window.peer.transcribe(file)          -> {text, ms, audioSeconds, sha256}
//   window.peer.generate(promptIds, n)    -> {tokenIds, promptMs, decodeMs, ...}
// The thread count is fixed per page: onnxruntime-web starts its wasm (and its pthread pool)
// once, at the first session.

const LIBRARY_URL = "/models/local/transformers-js/transformers.js";
const ORT_DIST_URL = "/models/local/onnxruntime-web/";
const LOCAL_MODELS_URL = "/models/local/";
const SAMPLES_URL = "/vendor/samples/";

const params = new URLSearchParams(location.search);
const task = params.get("task") || "whisper";
const modelId = params.get("model");
const dtype = params.get("dtype") || "fp32";
const threads = Number(params.get("threads") || "1");
const status = document.getElementById("status");

async function sha256Hex(floats) {
  const digest = await crypto.subtle.digest("SHA-256", floats.buffer.slice(
    floats.byteOffset, floats.byteOffset + floats.byteLength));
  return Array.from(new Uint8Array(digest), (b) => b.toString(16).padStart(2, "0")).join("");
}

async function start() {
  if (!modelId) throw new Error("transformers_js.html: the `model` URL parameter is missing");
  if (!["whisper", "generate"].includes(task)) {
    throw new Error(`transformers_js.html: task must be whisper or generate, got ${task}`);
  }
  if (!Number.isInteger(threads) || threads < 1 || threads > 8) {
    throw new Error(`transformers_js.html: threads must be 1..8, got ${params.get("threads")}`);
  }
  const phases = {};
  let mark = performance.now();
  const lap = (name) => {
    const now = performance.now();
    phases[name] = now - mark;
    mark = now;
  };
  const library = await import(LIBRARY_URL);
  lap("import");
  const { env } = library;
  env.allowRemoteModels = false;
  env.allowLocalModels = true;
  env.localModelPath = LOCAL_MODELS_URL;
  // The Cache API as a user gets it (bench/browser.py gives each page a fresh profile, so the
  // files are fetched and written to it: a cold load, like candle-web's first load).
  env.useBrowserCache = true;
  const wasm = env.backends.onnx.wasm;
  // The files transformers.js takes from the CDN by default (its asyncify build), locally.
  wasm.wasmPaths = {
    mjs: `${ORT_DIST_URL}ort-wasm-simd-threaded.asyncify.mjs`,
    wasm: `${ORT_DIST_URL}ort-wasm-simd-threaded.asyncify.wasm`,
  };
  wasm.numThreads = threads;
  wasm.proxy = false;
  const options = { dtype, device: "wasm" };
  let runner;
  if (task === "whisper") {
    runner = await library.pipeline("automatic-speech-recognition", modelId, options);
  } else {
    runner = {
      model: await library.AutoModelForCausalLM.from_pretrained(modelId, options),
      Tensor: library.Tensor,
    };
  }
  lap("model");
  const summary = {
    phases,
    totalMs: Object.values(phases).reduce((sum, ms) => sum + ms, 0),
    crossOriginIsolated: self.crossOriginIsolated,
    threads: wasm.numThreads,
    dtype,
    task,
    model: modelId,
    versions: { transformers: env.version, onnxruntimeWeb: env.backends.onnx.versions?.web },
  };
  status.textContent = `ready: ${JSON.stringify(summary)}`;
  return { runner, summary };
}

const started = start();

async function transcribe(file) {
  const { runner } = await started;
  const { decodeToMono16k } = await import("/transcribe.js");  // the candle-web page's decoder
  const bytes = await (await fetch(SAMPLES_URL + file)).arrayBuffer();
  const samples = await decodeToMono16k(bytes, file);
  const sha256 = await sha256Hex(samples);
  const begin = performance.now();
  const output = await runner(samples, { return_timestamps: false });
  const ms = performance.now() - begin;
  return { text: output.text, ms, audioSeconds: samples.length / 16000, sha256 };
}

async function generate(promptIds, maxNewTokens) {
  const { runner } = await started;
  const { model, Tensor } = runner;
  const length = promptIds.length;
  const inputIds = new Tensor("int64", BigInt64Array.from(promptIds, BigInt), [1, length]);
  const attentionMask = new Tensor("int64", new BigInt64Array(length).fill(1n), [1, length]);
  const stamps = [];
  // Duck-typed streamer: put() runs once with the prompt, then once per generated token.
  const streamer = { put() { stamps.push(performance.now()); }, end() {} };
  const output = await model.generate({
    input_ids: inputIds, attention_mask: attentionMask, max_new_tokens: maxNewTokens,
    do_sample: false, num_beams: 1, repetition_penalty: 1.0, streamer,
  });
  const all = Array.from(output.tolist()[0], Number);
  const tokenIds = all.slice(length);
  // stamps[0]: before the prompt pass; stamps[1]: first token; stamps[n]: n-th token.
  const promptMs = stamps[1] - stamps[0];
  const decodeMs = stamps[stamps.length - 1] - stamps[1];
  const steps = Math.max(tokenIds.length - 1, 0);
  return {
    tokenIds, promptMs, decodeMs,
    promptTokensPerSecond: length / (promptMs / 1000),
    tokensPerSecond: decodeMs > 0 ? steps / (decodeMs / 1000) : 0,
  };
}

window.peer = {
  ready: started.then(({ summary }) => summary),
  transcribe,
  generate,
};
started.catch((error) => { status.textContent = `failed: ${error.stack || error}`; });
