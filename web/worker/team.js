// Two threads (the default where there are two cores; ?threads=1 turns it off): the threads
// build of the kernels on a shared memory, a helper worker (web/team_helper.js) that runs its
// half of every team job, and the `candle_team` module Python's team host reads.

import { BASE_URL, WHEEL_MANIFEST_URL, fetchKernelBuild } from "./common.js";
import { KERNEL_ABI_VERSION, RELAXED_SIMD_PROBE } from "./kernels.js";

// Offsets in the shared memory; candle_web's wasm team uses the same (CTRL_OFFSET,
// HELPER_SCRATCH_OFFSET) and gets them from `layout`: nothing below 1 MiB (the null pointer,
// wasm-ld's unused stack region), the control block, the helper's scratch, then the arena.
const TEAM_CTRL_OFFSET = 1 << 20;
const TEAM_HELPER_SCRATCH_OFFSET = TEAM_CTRL_OFFSET + 64;
const TEAM_ALIVE_SLOT = 4; // TeamCtrl.alive, in int32 slots (web/kernels/team.h)
const TEAM_MAX_PAGES = 32768; // the module's declared maximum: 2 GiB
const TEAM_INITIAL_PAGES = 1024; // 64 MiB; grown as the weights are copied in
const TEAM_HELPER_TIMEOUT_MS = 10000;
const TEAM_ENTER_TIMEOUT_MS = 2000;
const TEAM_JS_MODULE = "candle_team"; // `import candle_team` in Python (the wasm team host)

// Why the second thread does not run: the start goes on with one.
export class TeamUnavailable extends Error {
  constructor(message) {
    super(message);
    this.name = "TeamUnavailable";
  }
}

// Fetches, verifies and compiles the threads build, makes the shared memory and starts the
// helper in team_worker; needs no Pyodide, so it runs while Pyodide starts. Resolves {file,
// sha256, memory, instance, helper, layout}.
export async function startTeam(manifestPromise) {
  if (!self.crossOriginIsolated || typeof SharedArrayBuffer === "undefined") {
    throw new TeamUnavailable("the page is not cross-origin isolated (no SharedArrayBuffer)");
  }
  if (!WebAssembly.validate(RELAXED_SIMD_PROBE)) throw new TeamUnavailable("this browser has no relaxed SIMD (the threads build uses it)");
  const manifest = await manifestPromise;
  const entry = manifest.kernels?.threads;
  if (!entry) throw new TeamUnavailable(`the threads kernels are not built (no "threads" in ${WHEEL_MANIFEST_URL}: run \`make web\`)`);
  const bytes = await fetchKernelBuild(entry, TeamUnavailable);
  let module, instance, memory;
  try {
    module = await WebAssembly.compile(bytes);
    memory = new WebAssembly.Memory({ initial: TEAM_INITIAL_PAGES, maximum: TEAM_MAX_PAGES, shared: true });
    instance = await WebAssembly.instantiate(module, { env: { memory } });
  } catch (error) {
    throw new TeamUnavailable(`${entry.file} does not load here: ${error.message}`);
  }
  if (instance.exports.abi_version() !== KERNEL_ABI_VERSION) {
    throw new TeamUnavailable(`${entry.file} has ABI version ${instance.exports.abi_version()}, this worker speaks ${KERNEL_ABI_VERSION} (stale build: run \`make web\`)`);
  }
  const layout = {
    ctrl: TEAM_CTRL_OFFSET,
    helperScratch: TEAM_HELPER_SCRATCH_OFFSET,
    heapStart: TEAM_HELPER_SCRATCH_OFFSET + instance.exports.scratch_bytes(),
  };
  const helper = await startHelper(module, memory, layout);
  return { file: entry.file, sha256: entry.sha256, memory, instance, helper, layout };
}

// The helper worker, inside team_worker on `memory`; terminated again if it does not get there.
async function startHelper(module, memory, layout) {
  const helper = new Worker(new URL("team_helper.js", BASE_URL).href);
  await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new TeamUnavailable(`the helper worker did not start in ${TEAM_HELPER_TIMEOUT_MS / 1000} s`)), TEAM_HELPER_TIMEOUT_MS);
    helper.onmessage = (event) => {
      if (event.data?.type === "ready") {
        clearTimeout(timer);
        resolve();
      } else if (event.data?.type === "error") {
        clearTimeout(timer);
        reject(new TeamUnavailable(event.data.message));
      }
    };
    helper.onerror = (event) => {
      clearTimeout(timer);
      reject(new TeamUnavailable(`the helper worker failed: ${event.message ?? "no message"}`));
    };
    helper.postMessage({ module, memory, ctrl: layout.ctrl, scratch: layout.helperScratch });
  }).catch((error) => {
    helper.terminate();
    throw error;
  });
  // "ready" comes just before team_worker; wait (this is a worker: Atomics.wait may block)
  // until it has said it is in.
  const alive = new Int32Array(memory.buffer, layout.ctrl, 8);
  Atomics.wait(alive, TEAM_ALIVE_SLOT, 0, TEAM_ENTER_TIMEOUT_MS);
  if (Atomics.load(alive, TEAM_ALIVE_SLOT) !== 1) {
    helper.terminate();
    throw new TeamUnavailable("the helper worker did not enter its loop");
  }
  return helper;
}

// Registers the team for Python as `candle_team` (the wasm team's PyodideTeamHost reads it):
// the exports, the layout, and copies between Pyodide's heap (numpy's buffers, by pointer) and
// the shared memory.
export function registerTeam(pyodide, team) {
  const { memory, instance, layout } = team;
  const heap = () => pyodide._module.HEAPU8; // re-read: Pyodide's heap may have grown
  pyodide.registerJsModule(TEAM_JS_MODULE, {
    exports: instance.exports,
    layout,
    copyIn(source, offset, n) {
      new Uint8Array(memory.buffer, offset, n).set(heap().subarray(source, source + n));
    },
    copyOut(offset, target, n) {
      heap().set(new Uint8Array(memory.buffer, offset, n), target);
    },
    ensure(end) {
      const have = memory.buffer.byteLength;
      if (end > have) memory.grow(Math.ceil((end - have) / 65536));
    },
  });
}
