// Replies from Python to the page: numpy arrays copied out of the wasm heap as transferable
// ArrayBuffers, and the PyProxies a job made destroyed.

// Copies a numpy array out of the wasm heap into a standalone ArrayBuffer for transfer.
export function numpyToArrayBuffer(arrayProxy) {
  const view = arrayProxy.getBuffer();
  try {
    if (!view.c_contiguous) {
      throw new Error("expected a C-contiguous array from Python");
    }
    const bytes = new Uint8Array(view.data.buffer, view.data.byteOffset, view.data.byteLength);
    return bytes.slice().buffer;
  } finally {
    view.release();
  }
}

// A Python reply (result JSON, {name: numpy array}) as {payload, transfer}: each array becomes
// an ArrayBuffer under its name in the payload, transferred to the page rather than copied.
export function takeReply(reply) {
  const payload = JSON.parse(reply.get(0));
  const arrays = reply.get(1);
  const transfer = [];
  try {
    for (const name of arrays) {
      const array = arrays.get(name);
      try {
        payload[name] = numpyToArrayBuffer(array);
      } finally {
        array.destroy();
      }
      transfer.push(payload[name]);
    }
  } finally {
    arrays.destroy();
  }
  return { payload, transfer };
}

// Destroys the PyProxies a job made (null where it never got that far).
export function destroyAll(...proxies) {
  for (const proxy of proxies) {
    if (proxy !== null && proxy !== undefined && typeof proxy.destroy === "function") proxy.destroy();
  }
}

