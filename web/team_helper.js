/*
 * candle-web's second thread: a worker that web/worker.js starts for ?threads=2. It
 * instantiates the threads build of the kernels (kernels-threads.wasm) on the shared
 * WebAssembly.Memory it is given and then stays inside `team_worker`, which waits (in
 * memory.atomic.wait32, no JS event loop needed) for the decode steps the Pyodide worker
 * starts with `team_run` and runs its half of each (see web/kernels/team.h).
 *
 * Message in: {module: WebAssembly.Module, memory: WebAssembly.Memory (shared), ctrl, scratch}
 * (offsets into that memory). Messages out: {type: "ready"} just before it enters the loop,
 * or {type: "error", message} when the module does not instantiate. team_worker returns only
 * for a "stop" job; the worker then says {type: "stopped"}.
 */
self.onmessage = (event) => {
  const { module, memory, ctrl, scratch } = event.data;
  let instance;
  try {
    instance = new WebAssembly.Instance(module, { env: { memory } });
  } catch (error) {
    self.postMessage({ type: "error", message: `kernels-threads.wasm does not instantiate in the helper: ${error.message}` });
    return;
  }
  self.postMessage({ type: "ready" });
  instance.exports.team_worker(ctrl, scratch);
  self.postMessage({ type: "stopped" });
};
