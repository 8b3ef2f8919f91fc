// The wllama peer of bench/browser.py (llama.cpp compiled to WebAssembly with SIMD and threads),
// in the same headless Chromium as candle-web's page and served by the same `candle-web serve`
// (bench/browser.py maps the folders under /models/local/). Nothing comes from a CDN: wllama's
// module and wasm from the repository's node_modules (package.json pins @wllama/wllama 3.13.0),
// the GGUF file from a local folder: the very file candle-web's page loads.
//
// URL: wllama.html?gguf=<path under /models/local/>&threads=1|2
// window.peer.ready resolves to {phases (ms), threads, multithread, version}; then
//   window.peer.generate(prompt, n) -> {text, promptTokens, tokens, promptMs, decodeMs,
//                                       promptPerSecond, decodePerSecond}
// greedy (temperature 0, top-k 1), EOS ignored so decode runs the whole budget; the prompt is
// the text candle-web's chat template rendered (wllama tokenizes it with the GGUF's
// vocabulary). The CPU kernels only: WebGPU offload is off (n_gpu_layers 0).

const LIBRARY_URL = "/models/local/wllama/index.js";
const WASM_URL = "/models/local/wllama/wasm/wllama.wasm";
const LOCAL_MODELS_URL = "/models/local/";

const params = new URLSearchParams(location.search);
const gguf = params.get("gguf");
const threads = Number(params.get("threads") || "1");
const status = document.getElementById("status");

async function start() {
  if (!gguf) throw new Error("wllama.html: the `gguf` URL parameter is missing");
  if (!Number.isInteger(threads) || threads < 1 || threads > 8) {
    throw new Error(`wllama.html: threads must be 1..8, got ${params.get("threads")}`);
  }
  const phases = {};
  let mark = performance.now();
  const lap = (name) => {
    const now = performance.now();
    phases[name] = now - mark;
    mark = now;
  };
  const { Wllama, LoggerWithoutDebug } = await import(LIBRARY_URL);
  lap("import");
  const wllama = new Wllama({ default: WASM_URL }, { logger: LoggerWithoutDebug, allowOffline: true });
  await wllama.loadModelFromUrl(LOCAL_MODELS_URL + gguf, {
    n_threads: threads, n_ctx: 2048, n_batch: 512, n_gpu_layers: 0, useCache: false,
  });
  lap("load");
  status.textContent = `ready: ${wllama.getNumThreads()} thread(s)`;
  return {
    wllama,
    summary: {
      phases, threads: wllama.getNumThreads(), multithread: wllama.isMultithread(),
      version: Wllama.getLibllamaVersion?.() ?? null, crossOriginIsolated: self.crossOriginIsolated,
    },
  };
}

const started = start();

async function generate(prompt, n) {
  const { wllama } = await started;
  const t0 = performance.now();
  const reply = await wllama.createCompletion({
    prompt, max_tokens: n, temperature: 0, temp: 0, top_k: 1, seed: 299792458, ignore_eos: true,
    cache_prompt: false,
  });
  const wallMs = performance.now() - t0;
  const t = reply.timings || {};
  return {
    text: reply.choices[0].text, promptTokens: t.prompt_n ?? reply.usage?.prompt_tokens,
    tokens: t.predicted_n ?? reply.usage?.completion_tokens, promptMs: t.prompt_ms,
    decodeMs: t.predicted_ms, promptPerSecond: t.prompt_per_second,
    decodePerSecond: t.predicted_per_second, wallMs,
  };
}

window.peer = {
  ready: started.then(({ summary }) => summary),
  generate,
};
started.catch((error) => { status.textContent = `failed: ${error.message}`; });
