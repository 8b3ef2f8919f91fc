// Model files: fetched with byte-level progress straight into the numpy buffers Python
// allocates, checked against their sha256, and kept in the Cache API under keys made of that
// sha256 (a changed file gets a new key, an unchanged one is never downloaded twice). Files
// without a pinned sha256 (an unknown Hub revision, a folder URL) are not cached. A download
// cut short continues where it stopped (download_parts.js: pieces kept as they arrive, then
// an HTTP Range request for the rest).
//
// Keeping is never needed to run: a browser that cannot keep a file (a private window, the
// origin's quota, a full disk: caches.open, match or put fail, often with a bare
// "UnknownError") still gets the model from the downloaded bytes, and the load's reply says
// what was not kept and why (`notKept`). Before a download that would not fit in what
// navigator.storage.estimate() reports free, caching is skipped up front.

import { BASE_URL, CancelledError, PROGRESS_INTERVAL_MS, TypedError, describeError, hexDigest, progress, timedPhase } from "./common.js";
import { DownloadParts } from "./download_parts.js";

// Bump the version to drop every cached file.
const MODEL_CACHE_NAME = "candle-web-models-v1";
const DOWNLOAD_PROGRESS_BYTES = 1 << 20; // at most one progress message per MiB (and 100 ms)
// A download that gets no byte for this long has stalled: it fails, naming the file, rather
// than leaving the page at "Downloading ..." for ever.
const DOWNLOAD_STALL_MS = 60_000;
// How long the cache may still take to finish writing a file after its last byte arrived (its
// branch of the body arrives at the same pace): past it the file is not kept, the model runs.
const CACHE_WRITE_GRACE_MS = 60_000;

function cacheKeyFor(file) {
  // Content-addressed: the key is the sha256 (an http(s) URL, as the Cache API wants), so the
  // same bytes are found again whichever source (this server, the Hub) delivered them.
  return new URL(`model-cache/sha256/${file.sha256}/${encodeURIComponent(file.name)}`, BASE_URL).href;
}

// "UnknownError: Failed to execute 'put' on 'Cache': ..." (the browser's words, its type first).
function storageErrorText(error) {
  const { name, message } = describeError(error);
  return name && name !== "Error" ? `${name}: ${message}` : message;
}

// {cache, reason}: the model cache, or null and why files will not be kept.
async function openModelCache() {
  // No Cache API (e.g. an insecure context): download every time.
  if (!self.caches) return { cache: null, reason: "this browser offers no Cache API here (an insecure context?)" };
  try {
    return { cache: await caches.open(MODEL_CACHE_NAME), reason: null };
  } catch (error) {
    return { cache: null, reason: storageErrorText(error) };
  }
}

// The cached response of `file`, or undefined (also when the cache cannot be read: then the
// file is downloaded, which is always possible).
async function cachedResponse(cache, file) {
  if (!cache || !file.sha256) return undefined;
  try {
    return await cache.match(cacheKeyFor(file));
  } catch (error) {
    console.warn(`candle-web: could not read ${file.name} from this browser's cache, downloading it: ${storageErrorText(error)}`);
    return undefined;
  }
}

function formatMegabytes(bytes) {
  return `${(bytes / 1e6).toFixed(bytes >= 1e8 ? 0 : 1)} MB`;
}

// Why `bytes` more will not fit in this origin's storage, or null (they fit, or the browser
// cannot say: then caching is tried and its failure, if any, is reported instead).
async function storageShortfall(bytes) {
  if (bytes <= 0 || !self.navigator?.storage?.estimate) return null;
  try {
    const { quota, usage } = await navigator.storage.estimate();
    if (!Number.isFinite(quota) || !Number.isFinite(usage)) return null;
    const free = Math.max(quota - usage, 0);
    if (bytes <= free) return null;
    return `it needs ${formatMegabytes(bytes)} and this browser's storage for this page has ${formatMegabytes(free)} free`;
  } catch (error) {
    console.warn(`candle-web: navigator.storage.estimate() failed: ${storageErrorText(error)}`);
    return null;
  }
}

// Posts download progress: always when forced, else at most once per MiB and 100 ms. Each
// message says where this download started (`resumedFrom`: the bytes kept by an earlier one)
// and its speed so far (`bytesPerSecond`, measured over this download's own bytes; null until
// a second has passed, as the first chunks arrive in a burst) and whether a cut would be
// resumed (`resumable`: its pieces are being kept).
function downloadReporter(id, fileName, size, cached, start = 0, resumable = false) {
  let lastPostBytes = -Infinity;
  let lastPostTime = -Infinity;
  const startedAt = performance.now();
  return (loaded, force) => {
    const now = performance.now();
    if (force || (loaded - lastPostBytes >= DOWNLOAD_PROGRESS_BYTES && now - lastPostTime >= PROGRESS_INTERVAL_MS)) {
      lastPostBytes = loaded;
      lastPostTime = now;
      const seconds = (now - startedAt) / 1000;
      const bytesPerSecond = seconds >= 1 ? (loaded - start) / seconds : null;
      progress(id, { phase: "download", state: "running", file: fileName, loaded, total: size, cached, resumedFrom: start, bytesPerSecond, resumable });
    }
  };
}

// The next chunk of `reader`, or a NetworkError once no byte came for DOWNLOAD_STALL_MS.
async function readOrStall(reader, fileName, loaded, size) {
  let timer = null;
  const stalled = new Promise((resolve, reject) => {
    timer = setTimeout(() => reject(new TypedError("NetworkError",
      `${fileName}: the download stalled (no byte for ${DOWNLOAD_STALL_MS / 1000} s at ${loaded} of ${size} bytes)`)), DOWNLOAD_STALL_MS);
  });
  try {
    return await Promise.race([reader.read(), stalled]);
  } finally {
    clearTimeout(timer);
  }
}

// Copies `bytes` into the numpy buffer `target` at `offset`.
function copyInto(target, bytes, offset) {
  // A fresh view each time: the wasm memory may have grown (and moved) since the last one.
  const view = target.getBuffer("u8");
  try {
    view.data.set(bytes, offset);
  } finally {
    view.release();
  }
}

// Streams one response body into the numpy buffer `target` (a PyProxy of a uint8 array of
// exactly `size` bytes) from byte `start` on (the bytes before it came from kept pieces),
// posting byte-level progress and handing each chunk to `keep` (or null). Checks for a cancel
// between chunks.
async function streamInto(id, response, target, size, fileName, cached, { abort, isCancelled, start = 0, keep = null }) {
  const reader = response.body.getReader();
  const report = downloadReporter(id, fileName, size, cached, start, keep !== null);
  let loaded = start;
  report(loaded, true);
  for (;;) {
    if (isCancelled()) {
      abort();
      await reader.cancel().catch(() => {});
      throw new CancelledError(`load cancelled while reading ${fileName}`);
    }
    let chunk;
    try {
      chunk = await readOrStall(reader, fileName, loaded, size);
    } catch (error) {
      abort();
      reader.cancel().catch(() => {});
      throw error;
    }
    const { done, value } = chunk;
    if (done) break;
    if (loaded + value.byteLength > size) {
      await reader.cancel().catch(() => {});
      throw new TypedError("FormatError", `${fileName}: more than the expected ${size} bytes arrived`);
    }
    copyInto(target, value, loaded);
    loaded += value.byteLength;
    if (keep !== null) await keep(value);
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

// Writes `body` (a branch of a tee) to the cache under `cacheKey`. Resolves null once kept, or
// the reason it was not (never rejects); a failed write's branch is cancelled so the tee
// stops holding its chunks, and whatever part was written is deleted.
function writeToCache(cache, cacheKey, body) {
  const reader = body.getReader();
  const source = new ReadableStream({
    async pull(controller) {
      const { done, value } = await reader.read();
      if (done) controller.close();
      else controller.enqueue(value);
    },
    cancel(reason) {
      return reader.cancel(reason);
    },
  });
  let settled = false;
  const give = (reason) => {
    if (settled) return null;
    settled = true;
    reader.cancel().catch(() => {});
    cache.delete(cacheKey).catch(() => {});
    return reason;
  };
  let write;
  try {
    write = cache.put(cacheKey, new Response(source, { headers: { "Content-Type": "application/octet-stream" } }));
  } catch (error) { // put may throw at once rather than reject
    write = Promise.reject(error);
  }
  const result = write.then(() => { settled = true; return null; }, (error) => give(storageErrorText(error)));
  // The caller stops waiting for a write that has not settled within the grace period after
  // the file's last byte: give(...) then drops it.
  result.giveUp = (why) => give(why);
  return result;
}

// The file's response from the network, from byte `from` on (a Range request) when it is not
// 0; with a cache, one branch of the body is written to the cache as it streams (dropped again
// if the hash fails). Resolves {response, cacheWrite} (cacheWrite: writeToCache's promise, or
// null when the file is not to be kept).
async function fetchFromNetwork(id, file, cache, cacheKey, signal, isCancelled, from = 0) {
  let response;
  try {
    const headers = from > 0 ? { Range: `bytes=${from}-` } : {};
    response = await fetch(new URL(file.url, BASE_URL).href, { signal, cache: "no-store", headers });
  } catch (error) {
    if (isCancelled()) throw new CancelledError(`load cancelled before ${file.name}`);
    throw new TypedError("NetworkError", `could not fetch ${file.url}: ${error.message} (offline, or the host is blocked)`);
  }
  if (!response.ok) {
    const hint = response.status === 404 ? " (is the model fetched into the server's cache? `make models`)" : "";
    throw new TypedError("ModelNotFound", `${file.url} answered ${response.status} ${response.statusText}${hint}`);
  }
  if (!cache || !file.sha256) return { response, cacheWrite: null };
  if (from > 0) throw new Error("a resumed download is kept by its pieces, not by a cache write");
  const [forBuffer, forCache] = response.body.tee();
  const cacheWrite = writeToCache(cache, cacheKey, forCache);
  return { response: new Response(forBuffer, { headers: response.headers }), cacheWrite };
}

// Waits for a file's cache write: null once kept, else why not. A write still going
// CACHE_WRITE_GRACE_MS after the file's last byte is given up (the model does not wait on it).
async function settleCacheWrite(cacheWrite) {
  let timer = null;
  const late = new Promise((resolve) => {
    timer = setTimeout(() => resolve(cacheWrite.giveUp(`the browser's storage had not finished writing it ${CACHE_WRITE_GRACE_MS / 1000} s after the download`)), CACHE_WRITE_GRACE_MS);
  });
  try {
    return await Promise.race([cacheWrite, late]);
  } finally {
    clearTimeout(timer);
  }
}

// Whether a reply to `Range: bytes=<from>-` is the rest of a file of `size` bytes: a 206 whose
// Content-Range starts at `from` and names that size (a 200 is the whole file: the server
// ignores ranges, or the file changed).
function continuesAt(response, from, size) {
  if (response.status !== 206) return false;
  const match = /^bytes (\d+)-(\d+)\/(\d+)$/.exec(response.headers.get("Content-Range") || "");
  return match !== null && Number(match[1]) === from && Number(match[2]) === size - 1 && Number(match[3]) === size;
}

// A download cut short (Stop, a stall, offline, an interrupt) keeps its pieces for the next
// load: they are checked against the sha256 with the rest once it is there. One whose bytes
// went wrong (a size other than the registry's, a wrong hash) drops them.
function keepsPieces(error) {
  return !["FormatError", "HashMismatch"].includes(error?.name);
}

// One file into the session's buffer for model `key`, from the cache (`response`, when it
// was found there) or the network, checked; kept in `cache` when one is given. A file with a
// sha256 and a known size is kept piece by piece as it arrives and continues from the pieces
// an earlier load kept (download_parts.js). Resolves {cached, bytes: those downloaded now,
// resumedFrom: those an earlier load had kept, notKept: why a downloaded file was not kept,
// or null}.
async function fetchModelFile(id, key, file, { cache, response }, session, isCancelled) {
  const cacheKey = cacheKeyFor(file);
  const controller = new AbortController();
  const cached = response !== undefined;
  const parts = !cached && cache && file.sha256 && Number.isSafeInteger(file.size) && file.size > 0
    ? new DownloadParts(cache, file) : null;
  let cacheWrite = null;
  let notKept = null;
  let target = null;
  let from = 0;
  try {
    if (parts !== null) {
      target = session.allocate_file(key, file.name, file.size);
      from = await parts.resume((bytes, offset) => copyInto(target, bytes, offset), isCancelled);
    }
    let size = file.size;
    if (!cached && (parts === null || from < file.size)) {
      ({ response, cacheWrite } = await fetchFromNetwork(id, file, parts === null ? cache : null, cacheKey, controller.signal, isCancelled, from));
      if (from > 0 && !continuesAt(response, from, file.size)) {
        // Not the rest of this file: start over with the whole of it, if that is what came.
        await parts.drop();
        from = 0;
        if (response.status !== 200) {
          await response.body?.cancel().catch(() => {});
          ({ response } = await fetchFromNetwork(id, file, null, cacheKey, controller.signal, isCancelled, 0));
        }
      }
    }
    if (from === 0 || cached) {
      size = expectedSize(file, response);
      target ??= session.allocate_file(key, file.name, size);
    }
    if (cached || from < size) {
      await streamInto(id, response, target, size, file.name, cached, {
        abort: () => controller.abort(), isCancelled, start: from, keep: parts && ((bytes) => parts.add(bytes)),
      });
    } else {
      downloadReporter(id, file.name, size, false, from)(size, true); // every byte was kept
    }
    if (cacheWrite !== null) notKept = await settleCacheWrite(cacheWrite);
    if (parts !== null) notKept = await parts.settle();
    if (file.sha256) {
      progress(id, { phase: "verify", state: "running", file: file.name });
      const actual = await digestOf(target);
      if (actual !== file.sha256) {
        if (cache) await cache.delete(cacheKey).catch(() => {});
        await parts?.drop();
        throw new TypedError("HashMismatch", `${file.name}: sha256 ${actual}, expected ${file.sha256}${cached ? " (cached copy dropped: load again)" : ""}`);
      }
    }
    if (parts !== null) notKept = notKept === null ? await parts.assemble(cacheKey, size) : (await parts.drop(), notKept);
    return { cached, bytes: size - from, resumedFrom: from, notKept };
  } catch (error) {
    cacheWrite?.giveUp("the load failed");
    if (parts !== null) {
      if (keepsPieces(error)) await parts.settle();
      else await parts.drop();
    }
    throw error;
  } finally {
    target?.destroy();
  }
}

// The registry's bytes of `files` (a file of unknown size counts 0).
function sizeOf(files) {
  return files.reduce((sum, file) => sum + (file.size ?? 0), 0);
}

// Every file of a load manifest into the session's buffers, as the "download" phase. Resolves
// {ms, cached: whether all came from the cache, downloadedBytes, resumedBytes (kept by an
// earlier, interrupted load, so not downloaded again), notKept: null when every
// downloaded file was kept (or was not meant to be: no pinned sha256), else {reason, bytes}:
// why and how much this browser could not keep (it will be downloaded again next time)}.
// A reason known before the download (no cache, too little storage) is posted at once as
// progress {phase: "download", state: "not-kept", reason, bytes}.
export async function downloadModelFiles(id, manifest, session, isCancelled) {
  let downloadedBytes = 0;
  let resumedBytes = 0;
  let allCached = true;
  let notKept = null;
  const ms = await timedPhase(id, "download", async () => {
    const opened = await openModelCache();
    let cache = opened.cache;
    const found = [];
    for (const file of manifest.files) found.push(await cachedResponse(cache, file));
    const toKeep = manifest.files.filter((file, i) => file.sha256 && found[i] === undefined);
    const keepBytes = sizeOf(toKeep);
    const upFront = toKeep.length === 0 ? null : opened.reason ?? (await storageShortfall(keepBytes));
    if (upFront !== null) {
      cache = null; // download and run, do not try to keep
      notKept = { reason: upFront, bytes: keepBytes };
      progress(id, { phase: "download", state: "not-kept", ...notKept });
    }
    for (const [i, file] of manifest.files.entries()) {
      const { cached, bytes, resumedFrom, notKept: why } = await fetchModelFile(id, manifest.key, file, { cache, response: found[i] }, session, isCancelled);
      allCached = allCached && cached;
      if (!cached) downloadedBytes += bytes;
      resumedBytes += resumedFrom ?? 0;
      if (why !== null) {
        // One failed write is the storage's answer for this load: the rest is not tried.
        cache = null;
        notKept = { reason: why, bytes: sizeOf(toKeep.slice(toKeep.indexOf(file))) };
        progress(id, { phase: "download", state: "not-kept", ...notKept });
      }
    }
    return { cached: allCached, notKept };
  });
  return { ms, cached: allCached, downloadedBytes, resumedBytes, notKept };
}
