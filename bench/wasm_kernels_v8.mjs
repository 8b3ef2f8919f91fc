// The kernel module under V8 (Node), the browser's engine: the same shapes as
// bench/wasm_kernels.py, without numpy. Run through `python bench/wasm_kernels.py --v8`, or:
//   node --experimental-wasm-relaxed-simd bench/wasm_kernels_v8.mjs web/vendor/kernels.wasm
// Times are process CPU time (process.cpuUsage), the fastest of 5 samples of >= 20 ms each:
// on a shared machine wall time mostly measures the scheduler. Weights are synthetic (random
// quants with sane scales); GB/s counts the weight bytes read per call.
import fs from "fs";

const file = process.argv[2] || "web/vendor/kernels.wasm";
const memory = new WebAssembly.Memory({ initial: 8192 }); // 512 MiB
const { instance } = await WebAssembly.instantiate(fs.readFileSync(file), { env: { memory } });
const E = instance.exports;
let top = 1 << 20;
const alloc = (n) => { top = Math.ceil(top / 64) * 64; const at = top; top += n; return at; };
const scratch = alloc(E.scratch_bytes());
let seed = 12345;
const random = () => ((seed = (seed * 1103515245 + 12345) >>> 0) / 2 ** 32) * 2 - 1;
const fill = (at, n, scale = 1) => {
  const f = new Float32Array(memory.buffer, at, n);
  for (let i = 0; i < n; i++) f[i] = random() * scale;
};

function seconds(fn, samples = 5) {
  fn();
  let best = Infinity;
  for (let s = 0; s < samples; s++) {
    for (let calls = 1; ; calls *= 2) {
      const start = process.cpuUsage();
      for (let i = 0; i < calls; i++) fn();
      const used = process.cpuUsage(start);
      const elapsed = (used.user + used.system) / 1e6;
      if (elapsed >= 0.02) { best = Math.min(best, elapsed / calls); break; }
    }
  }
  return best;
}

const row = (label, value, unit, t) =>
  console.log(`${label.padEnd(44)} ${value.toFixed(2).padStart(9)} ${unit.padEnd(8)} (${(t * 1e3).toFixed(3)} ms)`);

console.log(`${file} under V8 ${process.versions.v8} (Node ${process.version}), CPU time`);
for (const [m, n, k, transposed] of [[1500, 1536, 384, false], [1500, 384, 1536, false],
                                      [1500, 1536, 384, true], [64, 1536, 576, true]]) {
  const A = alloc(m * k * 4), B = alloc(n * k * 4), C = alloc(m * n * 4);
  fill(A, m * k); fill(B, n * k);
  const t = seconds(() => transposed
    ? E.gemm_f32(1, m, n, k, A, 0, k, 1, B, 0, 1, k, C, 0, n, 0, scratch)
    : E.gemm_f32(1, m, n, k, A, 0, k, 1, B, 0, n, 1, C, 0, n, 0, scratch));
  row(`gemm ${m}x${k} @ ${transposed ? `(${n}x${k})^T` : `${k}x${n}`}`, 2 * m * n * k / t / 1e9, "GFLOP/s", t);
}
for (const [bh, tq, tk, d] of [[6, 1500, 1500, 64], [6, 1, 448, 64], [6, 1, 1500, 64], [9, 1, 2048, 64]]) {
  const Q = alloc(bh * tq * d * 4), K = alloc(bh * tk * d * 4), V = alloc(bh * tk * d * 4);
  const O = alloc(bh * tq * d * 4);
  fill(Q, bh * tq * d); fill(K, bh * tk * d); fill(V, bh * tk * d);
  const t = seconds(() => E.attention_f32(bh, tq, tk, d, Q, tq * d, K, tk * d, V, tk * d, 0, 0,
                                          0.125, O, tq * d, scratch));
  row(`attention ${bh}x${tq}x${tk}x${d}`, 4 * bh * tq * tk * d / t / 1e9, "GFLOP/s", t);
}
{
  const n = 51864, k = 384;
  const X = alloc(k * 4), W = alloc(n * k * 4), Y = alloc(n * 4), H = alloc(n * k * 2);
  fill(X, k); fill(W, n * k, 0.05);
  const w = new Float32Array(memory.buffer, W, n * k), h = new Uint16Array(memory.buffer, H, n * k);
  const f32 = new Float32Array(1), u32 = new Uint32Array(f32.buffer);
  for (let i = 0; i < n * k; i++) { // round to f16 (truncating is fine for a benchmark)
    f32[0] = w[i];
    const b = u32[0], e = ((b >>> 23) & 255) - 112;
    h[i] = ((b >>> 16) & 0x8000) | (e > 0 ? (e << 10) | ((b >>> 13) & 0x3ff) : 0);
  }
  let t = seconds(() => E.gemm_f32(1, 1, n, k, X, 0, k, 1, W, 0, 1, k, Y, 0, n, 0, scratch));
  row("gemm f32 1x384 @ (51864x384)^T", n * k * 4 / t / 1e9, "GB/s", t);
  t = seconds(() => E.linear_f16(1, n, k, X, k, H, Y, n, scratch));
  row("linear_f16 1x384 @ (51864x384)^T", n * k * 2 / t / 1e9, "GB/s", t);
}
const TYPES = [["Q4_0", 2, 32, 18, [0]], ["Q4_1", 3, 32, 20, [0, 2]], ["Q8_0", 8, 32, 34, [0]],
               ["Q5_0", 6, 32, 22, [0]], ["Q4_K", 12, 256, 144, [0, 2]], ["Q6_K", 14, 256, 210, [208]]];
for (const [name, id, elems, bytes, scaleFields] of TYPES) {
  const [n, k] = elems === 32 ? [1536, 576] : [640, 2048]; // SmolLM2 MLP / Gemma 3 ffn_down
  const size = n * k / elems * bytes, W = alloc(size);
  const raw = new Uint8Array(memory.buffer, W, size), view = new DataView(memory.buffer);
  for (let i = 0; i < size; i++) raw[i] = (random() * 128 + 128) & 255;
  for (let b = 0; b < n * k / elems; b++)
    for (const at of scaleFields) view.setUint16(W + b * bytes + at, 0x2400 + (b & 0x3ff), true);
  for (const m of [1, 4, 64]) {
    const X = alloc(m * k * 4), Y = alloc(m * n * 4);
    fill(X, m * k);
    const t = seconds(() => E.linear_q(id, m, n, k, X, k, W, Y, n, scratch));
    if (m === 1) row(`linear_q ${name} 1x${k} @ (${n}x${k})^T`, size / t / 1e9, "GB/s", t);
    else row(`linear_q ${name} ${m}x${k} @ (${n}x${k})^T`, 2 * m * n * k / t / 1e9, "GFLOP/s", t);
  }
}
{
  const n = 1500 * 1536, X = alloc(n * 4), Y = alloc(n * 4);
  fill(X, n, 3);
  for (const [name, op] of [["gelu", 0], ["gelu_erf", 1], ["silu", 2], ["exp", 3], ["tanh", 4]]) {
    const t = seconds(() => E.unary_f32(op, n, X, Y));
    row(`unary ${name} 1500x1536`, n / t / 1e9, "Gelem/s", t);
  }
  let t = seconds(() => E.softmax_rows(1, 51864, X, Y));
  row("softmax 1x51864", 51864 / t / 1e9, "Gelem/s", t);
  t = seconds(() => E.layer_norm_rows(1500, 384, X, 0, 0, 1e-5, Y));
  row("layer_norm 1500x384", 1500 * 384 / t / 1e9, "Gelem/s", t);
}
