// A memory snapshot of a freshly started Pyodide, for the worker to restore instead of starting
// the Python interpreter (loadPyodide's `_loadSnapshot`, Pyodide 0.27.7).
//
//   node scripts/pyodide_snapshot.mjs <pyodide folder> <output file>
//
// The snapshot is the wasm heap right after loadPyodide (the interpreter and Pyodide's own
// ~180 modules initialised, no package loaded: dynamic libraries such as numpy's cannot be in
// a snapshot), with the pure-Python standard modules the page imports next already imported
// (PRELOADED below), plus the JS references Python holds, which Pyodide serialises itself. It depends
// only on the Pyodide build (restoring checks its build id) and is made here with Node from the
// same verified files the page loads; scripts/vendor_pyodide.py caches it by their hashes.
// What a restored interpreter shares with every other one restored from the same file, and the
// worker therefore renews after restoring: the `random` module's state and tempfile's name
// sequence (both seeded at start-up). Python's str hash secret is also the snapshot's (it
// cannot change once dicts exist): hashes, and so set orders, are the same on every visit.
import { renameSync, writeFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { pathToFileURL } from "node:url";

const [folder, output] = process.argv.slice(2);
if (!folder || !output) {
  console.error("usage: node scripts/pyodide_snapshot.mjs <pyodide folder> <output file>");
  process.exit(2);
}
const indexURL = resolve(folder) + "/";
const { loadPyodide } = await import(pathToFileURL(join(indexURL, "pyodide.mjs")).href);
const started = performance.now();
const pyodide = await loadPyodide({ indexURL, _makeSnapshot: true, stdout: () => {}, stderr: () => {} });
// The standard modules that loading numpy (Pyodide's package loader: importlib.metadata, email,
// tarfile), importing it and importing candle_web's worker add to sys.modules, found by
// diffing sys.modules in Node; pure Python or compiled into the runtime, nothing with state
// the worker does not renew after restoring (random and tempfile, imported already). ctypes is
// left out: it opens the main module as a library at import. Measured in Node (3 runs each):
// restored runtime + loadPackage numpy + import numpy + import candle_web 2.12-2.42 s without,
// 1.72-2.01 s with (loadPackage 1.0 -> 0.5-0.66 s).
const PRELOADED = ["__future__", "base64", "calendar", "csv", "dataclasses", "datetime",
  "email.message", "email.utils", "encodings.cp437", "hashlib", "importlib.metadata", "json",
  "numbers", "pickle", "quopri", "tarfile"];
pyodide.runPython(`import ${PRELOADED.join(", ")}`);
const snapshot = pyodide.makeMemorySnapshot();
const temp = `${output}.part`;
writeFileSync(temp, snapshot);
renameSync(temp, output);
console.log(`${snapshot.length} bytes in ${((performance.now() - started) / 1000).toFixed(1)} s`);
