/*
 * candle-web worker: Pyodide + numpy + candle_web (+ the wasm SIMD kernels, or scipy's BLAS for
 * the numpy backend) behind one message protocol.
 *
 * The page posts commands {type, id, ...}; every reply carries the same id:
 *   {type: "progress", id, phase, state, ...}  zero or more, while the command runs
 *   {type: "result",   id, ...}                 exactly one on success
 *   {type: "error",    id, error: {name, message, traceback?}}  exactly one on failure
 * Commands: init, eval_twin, models, load, transcribe, embed, generate, chat, text2text, faces,
 * cancel
 * (the COMMANDS table below). `kind` picks the model family and its Python session
 * (candle_web.worker.session_for, in the installed wheel): whisper (the default), bert, llama,
 * t5; each run command belongs to one kind (RUN_COMMANDS).
 *   init {control?: SharedArrayBuffer, backend?: "auto"|"wasm"|"wasm-simd128"|"numpy",
 *         compute?: "float32"|"int8", snapshot?: boolean, threads?: "auto"|1|2,
 *         answerDeadline?: seconds}
 *       (backend: the page's ?backend=; auto, the default: wasm when the kernels load, else
 *       numpy, saying why; wasm: the kernels or an error; wasm-simd128: the plain SIMD build
 *       even where relaxed SIMD exists; numpy: the reference, for A/B.
 *       compute: the page's ?compute=: float32 (the default, the reference) or int8 (the wasm
 *       backend's GGML products in int8 arithmetic, web/kernels/linear_int8.c);
 *       snapshot: false (?snapshot=0) starts Python without the vendored memory snapshot;
 *       answerDeadline (?answerDeadline=SECONDS, 1-3600, default 30): how long a start request
 *       may go unanswered before the start stalls (worker/start_watch.js);
 *       threads: 2 (?threads=2) runs the wasm backend's encoder and decode steps on two
 *       threads, with a helper worker (web/team_helper.js) on a shared memory; auto, the
 *       default: 2 where the browser reports two or more cores; 1 (?threads=1) one thread. One
 *       thread runs when the second cannot start, saying why in backend.threadsReason)
 *       progress {phase: "runtime"|"kernels"|"wheel"|"packages"|"backend"|"threads",
 *       state: "start"|"done"|"failed", ms, error? ({name, message}: name StartStalled when
 *       a request got no answer or the stage passed its deadline, worker/start_watch.js)}
 *       (phases overlap: the kernels and the wheel are fetched while Pyodide starts; a failed
 *       kernels or threads phase is a reason to go on without them, any other fails the start)
 *       -> {phases: {phase: ms}, totalMs (wall clock), versions, wheel (its manifest),
 *           snapshot: {used, reason}, backend: {name, requested, variant, label,
 *           kernels: {file, sha256}, reason, computeType, threads, threadsReason},
 *           crossOriginIsolated, cancellable}
 *   models {kind?, all?}        -> {models: [{name, description, size, license, offered}],
 *                                  hint?} (the registry's browser models of that kind offered
 *                                  in the pickers, all: also those loaded only when asked for;
 *                                  hint: how to get one if none)
 *   load {kind?, model} | {kind?, hf_repo, revision} | {kind, url} (a folder on this origin)
 *       progress {phase: "download", file, loaded, total, cached, resumedFrom (bytes an
 *       interrupted load had kept), bytesPerSecond (null in the first second), resumable},
 *       {phase: "verify"}, {phase: "build"}, {phase: "download", state: "not-kept", reason,
 *       bytes} (this browser will not keep the files: the model still runs) -> {key, cached,
 *       downloadedBytes, resumedBytes, notKept: null | {reason, bytes}, timingsMs, model}
 *   transcribe {model, samples: Float32Array (transferred), options, profile?, offset?, prior?}
 *       (offset: seconds added to the segments' times, the samples' place in a longer
 *       recording; prior: segments already final before them, kept in the result and exports)
 *       progress {phase: "transcribe", event: "language"|"window"|"token"|"segment", data,
 *                 heapBytes}
 *       -> {text, segments: [{id, start, end, text, tokens}], exports: {txt, srt, vtt, json},
 *           timings: {elapsedMs, rtf, encodeMs, decodeMs, ...}, input: {samples, sha256},
 *           heap: {startBytes, endBytes}}
 *   transcribe {model, kept: {segments, duration, language}}   the transcript and exports of
 *       the segments a cancelled transcription finished (nothing decoded)
 *   transcribe {model, live: {recording, action: "start"|"pass"|"stop"}, options?, samples?,
 *               offset?}   a step of a live recording (the page's live mode; the policy is
 *       candle_web.pipelines.transcribe.LiveTranscriber): "start" (options, no samples) begins
 *       recording `recording`; "pass" sends the audio heard from `offset` seconds on (the
 *       open window's start) and runs a pass when enough is new; "stop" sends the rest and
 *       returns the whole recording's transcript. Every reply carries live: {passes, commits,
 *       windowStart, passEnd, heard, nextPassAt (seconds to wait for before the next pass),
 *       final, partial (segments), ran, history (what this step's pass did, or null)}
 *   Every run command's progress carries heapBytes and its result heap: the size of the
 *   worker's WebAssembly heap (where Python and numpy keep everything) then.
 *   embed {model, sentences: [string]}
 *       -> {vectors: ArrayBuffer (float32 [count, dims], transferred), count, dims, maxTokens,
 *           tokenCounts, inputTokenCounts, truncated, similarity, elapsedMs}
 *   generate {model, prompt, chat, options: {maxTokens, temperature, topK, topP, seed,
 *             repeatPenalty, repeatLastN}}
 *       progress {phase: "generate", event: "prompt"|"token"|"done", data}
 *       -> {text, tokenIds, promptIds, renderedPrompt, stopReason, timings: {tokensPerSecond, ...}}
 *       responseFormat? (generate and chat; OpenAI's response_format: {type: "json_object"} or
 *       {type: "json_schema", json_schema: {name, schema, strict}}): every token is constrained
 *       by web-xgrammar (loaded on first use, worker/grammar.js); progress {event: "grammar",
 *       data: {state}} while it compiles; the result adds grammar: {engine, kind, compileMs,
 *       cached, steps, fillMsPerStep, acceptMsPerStep (the JS calls' cost per decode step),
 *       maskInPlace (masks read from web-xgrammar's memory, not word by word)};
 *       a schema the engine cannot enforce is a GrammarError / UnsupportedSchema
 *       naming its path
 *   chat {model, messages: [{role, content}] (ending with the user message to answer),
 *         context?, options}   one turn of the Chat view; the KV cache carries over
 *       progress {phase: "chat", event: "prompt" (with reused, new_tokens, reuse_note, dropped, notice)
 *                 |"token"|"done", data}
 *       -> {text, tokenIds, promptTokens, reusedTokens, newTokens, reuseNote (why nothing is
 *           reused where the steps do not split a prompt exactly, else null), droppedMessages, notice,
 *           context, stopReason ("cancelled": Stop kept the partial answer), timings}
 *   faces {model, image: Blob | ImageBitmap (transferred), options: {landmarks, expressions,
 *          ageGender, scoreThreshold}, keepPixels?, profile?}   the photo decoded here
 *       (worker/images.js),
 *       the rest in Python (candle_web.worker.faces)
 *       -> {width, height, faces: [{box: [x, y, w, h], score, landmarks?, expressions?, age?,
 *           gender?, genderProbability?}], timingsMs: {decode, detect, landmarks, ...},
 *           pixels? and rgbSha256? (with keepPixels: the RGB bytes the networks read, an
 *           ArrayBuffer, and their sha256), profile? (as
 *           transcribe's: the functions with the most own time, the run under cProfile)}
 *   text2text {model, prompt, options: {maxTokens, temperature, topK, topP, seed}}
 *       progress {phase: "text2text", event: "token"|"done", data}
 *       -> {text, tokenIds, inputTokens, fullInputTokens, truncated, maxInputTokens, stopReason,
 *           timings}
 *
 * The parts by job, under web/worker/: boot.js (the start, and candle_web.worker.boot on the
 * Python side), kernels.js (probe, compile, Pyodide's memory), team.js (the second thread),
 * wheel.js (the ZIP reader), model_files.js (downloads and the model cache; download_parts.js
 * keeps a download's pieces so that it resumes), common.js (what
 * they share), python_jobs.js (the queue of Python jobs and cancelling), replies.js (Python's
 * replies as transferable buffers). This file: the protocol and its commands.
 *
 * Everything is fetched from the serving origin: Pyodide and the wheels from
 * /vendor/pyodide/ (checked by Pyodide against the sha256 in pyodide-lock.json), the
 * candle_web wheel from /vendor/wheels/ and the kernels from /vendor/kernels*.wasm (both
 * checked here against the sha256 in the wheel's manifest).
 *
 * Cancelling: Python runs synchronously inside this worker, so while it computes no message
 * can arrive. The page therefore shares a SharedArrayBuffer (needs crossOriginIsolated) of
 * three int32 slots: [0] is Pyodide's interrupt buffer (the page stores SIGINT there and Python
 * raises KeyboardInterrupt at the next bytecode boundary), [1] is the id the page wants
 * cancelled, [2] the id of the job now in Python. The worker stores [2] and then reads [1];
 * the page stores [1] and then reads [2], raising the interrupt only if the ids match. With
 * sequentially consistent Atomics one side always sees the other, so a cancel that lands
 * just as a job starts is not lost. Ids are therefore positive int32 numbers.
 */
import { CancelledError, TypedError, describeError, post, progress, throttledProgress, timedPhase } from "./worker/common.js";
import { ensureRuntime, runtime, wasmHeapBytes } from "./worker/boot.js";
import { downloadModelFiles } from "./worker/model_files.js";
import { grammarBridge, prepareGrammar } from "./worker/grammar.js";
import { checkImage, decodeImage } from "./worker/images.js";
import { adoptControlSlots, cancelQueuedJob, isCancelRequested, runPythonJob } from "./worker/python_jobs.js";
import { destroyAll, takeReply } from "./worker/replies.js";
// The rest of the module graph, named here too: the browser fetches a module's imports only
// once it has parsed that module, so boot.js -> kernels.js -> abi.js was a chain of round trips
// before the start could begin (~0.1-0.15 s of page open -> ready). Named here, every file is
// fetched at once, one round trip after this one.
import "./worker/download_parts.js";
import "./worker/kernels.js";
import "./worker/start_watch.js";
import "./worker/team.js";
import "./worker/wheel.js";
import "./vendor/abi.js";
import "./vendor/pyodide/pyodide.mjs";

const TWIN_ARGUMENTS = ["seed", "m", "k", "n", "repeat"];

// The Python session of a model kind (undefined or null: the default kind); unknown kinds
// raise UnsupportedError there. A PyProxy: destroy it after use.
function sessionFor(kind) {
  return runtime.worker.session_for(kind ?? null);
}

// --- commands -------------------------------------------------------------------------------

async function handleInit(message) {
  const controlSlots = adoptControlSlots(runtime.pyodide === null ? message.control : null);
  const choices = { backend: message.backend ?? undefined, compute: message.compute ?? undefined, snapshot: message.snapshot ?? undefined, threads: message.threads ?? undefined, answerDeadline: message.answerDeadline ?? undefined };
  return { payload: await ensureRuntime(message.id, choices, controlSlots) };
}

async function handleEvalTwin(message) {
  await ensureRuntime(message.id);
  return runPythonJob(message.id, async () => {
    let request = null;
    let reply = null;
    try {
      // Only the fields the page set: run_twin owns the defaults.
      const fields = TWIN_ARGUMENTS.filter((name) => message[name] !== undefined).map((name) => [name, message[name]]);
      request = runtime.pyodide.toPy(Object.fromEntries(fields));
      reply = runtime.worker.eval_twin(request, throttledProgress(message.id, "eval_twin"));
      return takeReply(reply);
    } finally {
      destroyAll(reply, request);
    }
  });
}

async function handleModels(message) {
  await ensureRuntime(message.id);
  const session = sessionFor(message.kind);
  try {
    return { payload: JSON.parse(session.models_json(message.all === true)) };
  } finally {
    session.destroy();
  }
}

async function handleLoad(message) {
  await ensureRuntime(message.id);
  const id = message.id;
  return runPythonJob(id, async () => {
    const session = sessionFor(message.kind);
    let key = null;
    try {
      const manifest = JSON.parse(session.manifest_json(message.model ?? null, message.hf_repo ?? null,
                                                        message.revision ?? null, message.url ?? null));
      key = manifest.key;
      const download = await downloadModelFiles(id, manifest, session, () => isCancelRequested(id));
      if (isCancelRequested(id)) throw new CancelledError("load cancelled before the build");
      const timingsMs = { download: download.ms };
      let summary = null;
      timingsMs.build = await timedPhase(id, "build", async () => { summary = JSON.parse(session.build_model(key)); });
      const verified = manifest.files.every((file) => Boolean(file.sha256));
      return { payload: { key, cached: download.cached, verified, downloadedBytes: download.downloadedBytes,
                          resumedBytes: download.resumedBytes,
                          notKept: download.notKept, source: manifest.source, timingsMs, model: summary } };
    } catch (error) {
      if (key !== null) session.discard_incoming(key);
      throw error;
    } finally {
      session.destroy();
    }
  });
}

// --- run commands: transcribe (Whisper), embed (BERT), generate (LLaMA), text2text (T5) -----

// Copies the page's samples into a float32 numpy array the session allocates: one copy into
// the wasm heap (unavoidable), which Python then reads in place.
function samplesIntoPython(session, samples) {
  const target = session.allocate_samples(samples.length);
  const view = target.getBuffer("u8");
  try {
    view.data.set(new Uint8Array(samples.buffer, samples.byteOffset, samples.byteLength));
  } finally {
    view.release();
  }
  return target;
}

// A decoded image's RGBA bytes into the [height, width, 4] uint8 array the faces session
// allocates (one copy into the wasm heap, read in place by Python).
function pixelsIntoPython(session, { width, height, rgba }) {
  const target = session.allocate_pixels(width, height);
  const view = target.getBuffer("u8");
  try {
    view.data.set(rgba);
  } finally {
    view.release();
  }
  return target;
}

function checkSamples(m) {
  if (!(m.samples instanceof Float32Array)) {
    throw new TypedError("FormatError", `${m.type}: \`samples\` must be a Float32Array of 16 kHz mono audio`);
  }
}

// Each run command: its session's kind, a check of the message's JS types (made before the
// runtime is awaited), and the request: the keyword arguments of the session's compute.
const RUN_COMMANDS = {
  transcribe: {
    kind: "whisper",
    check: (m) => { if (m.live?.action !== "start" && m.kept === undefined) checkSamples(m); },
    request: (m) => ({ options: m.options || null, profile: m.profile === true,
                       offset: m.offset ?? null, prior: m.prior ?? null, live: m.live ?? null,
                       kept: m.kept ?? null }),
    samples: (m) => m.samples !== undefined,
  },
  embed: {
    kind: "bert",
    check: (m) => {
      if (!Array.isArray(m.sentences)) throw new TypedError("FormatError", "embed: `sentences` must be an array of strings");
    },
    request: (m) => ({ sentences: m.sentences }),
  },
  generate: {
    kind: "llama",
    request: (m) => ({ prompt: m.prompt ?? null, chat: m.chat === true, options: m.options || null,
                       response_format: m.responseFormat ?? null }),
  },
  text2text: {
    kind: "t5",
    request: (m) => ({ prompt: m.prompt ?? null, options: m.options || null }),
  },
  faces: {
    kind: "faces",
    check: checkImage,
    request: (m) => ({ options: m.options || null, keep_pixels: m.keepPixels === true,
                       profile: m.profile === true }),
    image: true,
  },
  chat: {
    kind: "llama",
    check: (m) => {
      if (!Array.isArray(m.messages)) throw new TypedError("FormatError", "chat: `messages` must be an array of {role, content}");
    },
    request: (m) => ({ messages: m.messages, context: m.context ?? null, options: m.options || null,
                       response_format: m.responseFormat ?? null }),
  },
};

// Runs a model with its session: Python calls onEvent(kind, json) per streamed event, which
// becomes a progress message {phase: the command, event, data, heapBytes}; the reply is the
// result, with the heap's size before and after.
async function handleRun(message) {
  const command = RUN_COMMANDS[message.type];
  command.check?.(message);
  await ensureRuntime(message.id);
  const id = message.id;
  return runPythonJob(id, async () => {
    const session = sessionFor(command.kind);
    let request = null;
    let samples = null;
    let reply = null;
    // The event's own fields go under `data`: a segment has an `id` of its own.
    const onEvent = (event, json) => progress(id, { phase: message.type, event, data: JSON.parse(json), heapBytes: wasmHeapBytes() });
    const startBytes = wasmHeapBytes();
    try {
      request = runtime.pyodide.toPy(command.request(message));
      if (command.samples?.(message)) {
        samples = samplesIntoPython(session, message.samples);
        request.set("samples", samples);
      }
      let decodeMs = null;
      if (command.image) {
        const decoded = await decodeImage(message.image);
        decodeMs = decoded.ms;
        samples = pixelsIntoPython(session, decoded);
        request.set("pixels", samples);
      }
      const grammar = message.responseFormat != null ? await prepareResponseFormat(id, session, message) : null;
      reply = session.run(message.model ?? null, request, onEvent);
      const taken = takeReply(reply);
      if (decodeMs !== null) taken.payload.timingsMs = { decode: decodeMs, ...taken.payload.timingsMs };
      if (grammar !== null) taken.payload.grammar = { ...grammar, ...JSON.parse(session.grammar_stats_json()), maskInPlace: grammarBridge.maskInPlace() };
      taken.payload.heap = { startBytes, endBytes: wasmHeapBytes() };
      return taken;
    } finally {
      destroyAll(reply, samples, request, session);
    }
  });
}

// A generate or chat request's responseFormat (OpenAI's json_object / json_schema): Python checks
// it and plans the grammar, web-xgrammar compiles it here (async, so before the synchronous
// Python job; worker/grammar.js), and the session's decode loop then masks each step with it.
// -> {engine, compileMs, cached} for the result, or null when the format is plain text.
async function prepareResponseFormat(id, session, message) {
  const plan = JSON.parse(session.grammar_plan_json(message.model ?? null, message.responseFormat, grammarBridge));
  if (plan === null) return null;
  progress(id, { phase: message.type, event: "grammar", data: { state: "start", kind: plan.constraint.kind } });
  const prepared = await prepareGrammar(plan, () => JSON.parse(session.grammar_vocabulary_json(message.model ?? null)));
  progress(id, { phase: message.type, event: "grammar", data: { state: "done", ...prepared } });
  return { engine: "web-xgrammar", kind: plan.constraint.kind, ...prepared };
}

// Cancels a job that has not reached Python yet (the running one is stopped by the page
// through the shared interrupt slot, since this handler cannot run while Python does).
async function handleCancel(message) {
  const target = message.target;
  const queued = cancelQueuedJob(target);
  return { payload: { target, queued } };
}

// The dispatch table: add a command by adding an entry. A handler gets the message and
// returns {payload, transfer?}; throwing produces the error reply.
const COMMANDS = {
  init: handleInit,
  eval_twin: handleEvalTwin,
  models: handleModels,
  load: handleLoad,
  transcribe: handleRun,
  embed: handleRun,
  generate: handleRun,
  chat: handleRun,
  text2text: handleRun,
  faces: handleRun,
  cancel: handleCancel,
};

self.onmessage = async (event) => {
  const message = event.data || {};
  const id = message.id;
  const handler = COMMANDS[message.type];
  if (handler === undefined) {
    post({ type: "error", id, error: { name: "UnknownCommand", message: `unknown command type ${JSON.stringify(message.type)}; known: ${Object.keys(COMMANDS).join(", ")}` } });
    return;
  }
  try {
    const { payload, transfer } = await handler(message);
    post({ type: "result", id, ...payload }, transfer || []);
  } catch (error) {
    post({ type: "error", id, error: describeError(error) });
  }
};
