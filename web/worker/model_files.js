// Model files: fetched with byte-level progress straight into the numpy buffers Python
// allocates, checked against their sha256, and kept in the Cache API under keys made of that
// sha256 (a changed file gets a new key, an unchanged one is never downloaded twice). Files
// without a pinned sha256 (an unknown Hub revision, a folder URL) are not cached.

import { BASE_URL, CancelledError, PROGRESS_INTERVAL_MS, TypedError, hexDigest, progress, timedPhase } from "./common.js";

// Bump the version to drop every cached file.
const MODEL_CACHE_NAME = "candle-web-models-v1";
const DOWNLOAD_PROGRESS_BYTES = 1 << 20; // at most one progress message per MiB (and 100 ms)

function cacheKeyFor(file) {
  // Content-addressed: the key is the sha256 (an http(s) URL, as the Cache API wants), so the
  // same bytes are found again whichever source (this server, the Hub) delivered them.
  return new URL(`model-cache/sha256/${file.sha256}/${encodeURIComponent(file.name)}`, BASE_URL).href;
}

async function openModelCache() {
  // No Cache API (e.g. an insecure context): download every time, say so once.
  if (!self.caches) {
    console.warn("no Cache API here: model files will be downloaded on every visit");
    return null;
  }
  return caches.open(MODEL_CACHE_NAME);
}

// Posts download progress: always when forced, else at most once per MiB and 100 ms.
function downloadReporter(id, fileName, size, cached) {
  let lastPostBytes = -Infinity;
  let lastPostTime = -Infinity;
  return (loaded, force) => {
    const now = performance.now();
    if (force || (loaded - lastPostBytes >= DOWNLOAD_PROGRESS_BYTES && now - lastPostTime >= PROGRESS_INTERVAL_MS)) {
      lastPostBytes = loaded;
      lastPostTime = now;
      progress(id, { phase: "download", state: "running", file: fileName, loaded, total: size, cached });
    }
  };
}

// Streams one response body into the numpy buffer `target` (a PyProxy of a uint8 array of
// exactly `size` bytes), posting byte-level progress. Checks for a cancel between chunks.
async function streamInto(id, response, target, size, fileName, cached, { abort, isCancelled }) {
  const reader = response.body.getReader();
  const report = downloadReporter(id, fileName, size, cached);
  let loaded = 0;
  report(loaded, true);
  for (;;) {
    if (isCancelled()) {
      abort();
      await reader.cancel().catch(() => {});
      throw new CancelledError(`load cancelled while reading ${fileName}`);
    }
    const { done, value } = await reader.read();
    if (done) break;
    if (loaded + value.byteLength > size) {
      await reader.cancel().catch(() => {});
      throw new TypedError("FormatError", `${fileName}: more than the expected ${size} bytes arrived`);
    }
    // A fresh view per chunk: the wasm memory may have grown (and moved) since the last one.
    const view = target.getBuffer("u8");
    try {
      view.data.set(value, loaded);
    } finally {
      view.release();
    }
    loaded += value.byteLength;
    report(loaded, false);
  }
  if (loaded !== size) {
    throw new TypedError("FormatError", `${fileName}: got ${loaded} bytes, expected ${size}`);
  }
  report(loaded, true);
}

async function digestOf(target) {
  const view = target.getBuffer("u8");
  try {
    // digest() copies the bytes before it returns its promise, so the view can go at once.
    const pending = crypto.subtle.digest("SHA-256", view.data);
    view.release();
    return hexDigest(await pending);
  } catch (error) {
    view.release();
    throw error;
  }
}

function expectedSize(file, response) {
  const header = response.headers.get("Content-Length");
  const announced = header === null ? null : Number(header);
  if (file.size !== null && announced !== null && announced !== file.size) {
    throw new TypedError("FormatError", `${file.name}: the server announces ${announced} bytes, the registry ${file.size}`);
  }
  const size = file.size ?? announced;
  if (!Number.isSafeInteger(size) || size <= 0) {
    throw new TypedError("FormatError", `${file.name}: unknown or empty size (Content-Length ${header})`);
  }
  return size;
}

// The file's response from the network; with a cache, one branch of the body is written to
// the cache as it streams (dropped again if the hash fails). Resolves {response, cacheWrite}.
async function fetchFromNetwork(id, file, cache, cacheKey, signal, isCancelled) {
  let response;
  try {
    response = await fetch(new URL(file.url, BASE_URL).href, { signal, cache: "no-store" });
  } catch (error) {
    if (isCancelled()) throw new CancelledError(`load cancelled before ${file.name}`);
    throw new TypedError("NetworkError", `could not fetch ${file.url}: ${error.message} (offline, or the host is blocked)`);
  }
  if (!response.ok) {
    const hint = response.status === 404 ? " (is the model fetched into the server's cache? `make models`)" : "";
    throw new TypedError("ModelNotFound", `${file.url} answered ${response.status} ${response.statusText}${hint}`);
  }
  if (!cache || !file.sha256) return { response, cacheWrite: null };
  const [forBuffer, forCache] = response.body.tee();
  const cacheWrite = cache.put(cacheKey, new Response(forCache, { headers: { "Content-Type": "application/octet-stream" } }));
  cacheWrite.catch(() => {});
  return { response: new Response(forBuffer, { headers: response.headers }), cacheWrite };
}

// One file into the session's buffer for model `key`, from the cache or the network, checked.
async function fetchModelFile(id, key, file, cache, session, isCancelled) {
  const cacheKey = cacheKeyFor(file);
  const controller = new AbortController();
  let response = cache && file.sha256 ? await cache.match(cacheKey) : undefined;
  const cached = response !== undefined;
  let cacheWrite = null;
  if (!cached) {
    ({ response, cacheWrite } = await fetchFromNetwork(id, file, cache, cacheKey, controller.signal, isCancelled));
  }
  const size = expectedSize(file, response);
  const target = session.allocate_file(key, file.name, size);
  try {
    await streamInto(id, response, target, size, file.name, cached, { abort: () => controller.abort(), isCancelled });
    if (cacheWrite !== null) await cacheWrite;
    if (file.sha256) {
      progress(id, { phase: "verify", state: "running", file: file.name });
      const actual = await digestOf(target);
      if (actual !== file.sha256) {
        if (cache) await cache.delete(cacheKey);
        throw new TypedError("HashMismatch", `${file.name}: sha256 ${actual}, expected ${file.sha256}${cached ? " (cached copy dropped: load again)" : ""}`);
      }
    }
  } finally {
    target.destroy();
  }
  return { cached, bytes: size };
}

// Every file of a load manifest into the session's buffers, as the "download" phase. Resolves
// {ms, cached: whether all came from the cache, downloadedBytes}.
export async function downloadModelFiles(id, manifest, session, isCancelled) {
  const cache = await openModelCache();
  let downloadedBytes = 0;
  let allCached = true;
  const ms = await timedPhase(id, "download", async () => {
    for (const file of manifest.files) {
      const { cached, bytes } = await fetchModelFile(id, manifest.key, file, cache, session, isCancelled);
      allCached = allCached && cached;
      if (!cached) downloadedBytes += bytes;
    }
    return { cached: allCached };
  });
  return { ms, cached: allCached, downloadedBytes };
}
