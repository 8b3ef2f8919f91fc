// The wasm kernels (web/vendor/kernels*.wasm, see candle_web's wasm backend ABI): which build
// this engine runs (probed by validating tiny modules), fetched and compiled while Pyodide
// starts, then instantiated on Pyodide's own memory (captured while it loads) and registered
// for Python as `candle_kernels`.

import { ABI_VERSION, KERNELS_JS_MODULE } from "../vendor/abi.js"; // generated from the ABI table
import { WHEEL_MANIFEST_URL, fetchKernelBuild } from "./common.js";

// The smallest module with one function () -> v128 whose body is `body`: WebAssembly has no
// feature query, but validate() on such a module says whether this engine knows its opcodes.
function probeModule(body) {
  const code = [0x00, ...body, 0x0b]; // no locals, the body, end
  return new Uint8Array([
    0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00, // "\0asm", version 1
    0x01, 0x05, 0x01, 0x60, 0x00, 0x01, 0x7b, //       type section: one type, () -> v128
    0x03, 0x02, 0x01, 0x00, //                         function section: one function of type 0
    0x0a, code.length + 2, 0x01, code.length, ...code, // code section: one body
  ]);
}
const V128_CONST_ZERO = [0xfd, 0x0c, ...new Array(16).fill(0)];
// f32x4.relaxed_madd (0xfd 0x105) of three zero vectors: the opcode the relaxed build's FMA uses.
export const RELAXED_SIMD_PROBE = probeModule([...V128_CONST_ZERO, ...V128_CONST_ZERO, ...V128_CONST_ZERO, 0xfd, 0x85, 0x02]);
const SIMD128_PROBE = probeModule(V128_CONST_ZERO);
// The kernel builds, best first. `name` is the key in the wheel manifest's `kernels` table
// (scripts/build_wheel.py) and the `variant` Python sees.
const KERNEL_VARIANTS = [
  { name: "relaxed-simd", label: "relaxed SIMD", probe: RELAXED_SIMD_PROBE },
  { name: "simd128", label: "SIMD128", probe: SIMD128_PROBE },
];

// Why the kernels are not used: the start goes on with the numpy backend and says this.
export class KernelsUnavailable extends Error {
  constructor(message) {
    super(message);
    this.name = "KernelsUnavailable";
  }
}

// The best build this engine validates, or the one `forced` names (if it validates).
function chooseKernelVariant(forced) {
  const candidates = forced ? KERNEL_VARIANTS.filter((variant) => variant.name === forced) : KERNEL_VARIANTS;
  return candidates.find((variant) => WebAssembly.validate(variant.probe)) ?? null;
}

// Fetches, verifies and compiles the best kernel build this engine runs (or the `forced` one);
// needs no Pyodide, so it runs while Pyodide starts. Resolves {variant, label, file, sha256,
// module}.
export async function compileKernels(manifestPromise, forced = null) {
  const variant = chooseKernelVariant(forced);
  if (variant === null) throw new KernelsUnavailable(`this browser has no WebAssembly ${forced ?? "SIMD"}`);
  const manifest = await manifestPromise;
  const entry = manifest.kernels?.[variant.name];
  if (!entry) {
    throw new KernelsUnavailable(`the ${variant.label} kernels are not built (no "${variant.name}" in ${WHEEL_MANIFEST_URL}: run \`make web\`)`);
  }
  const bytes = await fetchKernelBuild(entry, KernelsUnavailable);
  try {
    const module = await WebAssembly.compile(bytes);
    return { variant: variant.name, label: variant.label, file: entry.file, sha256: entry.sha256, module };
  } catch (error) {
    throw new KernelsUnavailable(`${entry.file} does not compile here: ${error.message}`);
  }
}

// Pyodide 0.27.7 does not expose its WebAssembly.Memory (DESIGN.md section 10), but its main
// module imports it as env.memory: watch the instantiations while loadPyodide runs and keep
// that import (the last one seen: a start retried without the snapshot makes a new Memory).
// The kernels then import the same Memory and work on numpy's buffers in place (and keep
// seeing them when the memory grows). instantiateKernels checks it is Pyodide's heap.
export function watchForPyodideMemory() {
  const original = { instantiate: WebAssembly.instantiate, instantiateStreaming: WebAssembly.instantiateStreaming };
  let memory = null;
  // Pyodide's memory is never shared: a shared one seen here is the threads build's, which
  // startTeam instantiates at the same time (taking it made the kernels fail their heap check
  // and the page fall back to numpy whenever the team started while Pyodide was loading).
  const keep = (imports) => {
    const candidate = imports?.env?.memory;
    if (candidate instanceof WebAssembly.Memory && !(candidate.buffer instanceof SharedArrayBuffer)) {
      memory = candidate;
    }
  };
  WebAssembly.instantiate = function (source, imports, ...rest) {
    keep(imports);
    return original.instantiate.call(this, source, imports, ...rest);
  };
  WebAssembly.instantiateStreaming = function (source, imports, ...rest) {
    keep(imports);
    return original.instantiateStreaming.call(this, source, imports, ...rest);
  };
  return {
    memory: () => memory,
    stop() {
      WebAssembly.instantiate = original.instantiate;
      WebAssembly.instantiateStreaming = original.instantiateStreaming;
    },
  };
}

// Instantiates the compiled kernels on Pyodide's memory and registers them for Python as
// `candle_kernels` ({exports, variant}); the wasm backend's PyodideHost wraps that module.
export async function instantiateKernels(pyodide, kernels, memory) {
  if (memory === null) throw new KernelsUnavailable("Pyodide's WebAssembly.Memory was not seen while it loaded");
  if (memory.buffer !== pyodide._module.HEAPU8.buffer) {
    throw new KernelsUnavailable("the captured WebAssembly.Memory is not the one Pyodide's heap lives in");
  }
  let instance;
  try {
    instance = await WebAssembly.instantiate(kernels.module, { env: { memory } });
  } catch (error) {
    throw new KernelsUnavailable(`${kernels.file} does not link with Pyodide's memory: ${error.message}`);
  }
  const abi = typeof instance.exports.abi_version === "function" ? instance.exports.abi_version() : null;
  if (abi !== ABI_VERSION) {
    throw new KernelsUnavailable(`${kernels.file} has ABI version ${abi}, this worker speaks ${ABI_VERSION} (stale build: run \`make web\`)`);
  }
  pyodide.registerJsModule(KERNELS_JS_MODULE, { exports: instance.exports, variant: kernels.variant });
}
