// Resumable downloads. While a model file with a pinned sha256 and a known size downloads, its
// bytes are kept in the model cache in pieces (keys model-cache/partial/<sha256>/<offset>), so
// a load cut short (a reload, a closed tab, Stop, a dropped connection) continues next time
// with an HTTP Range request from the end of the last piece kept. Once the whole file is there
// and its sha256 checked, the pieces become the file's one cache entry and are deleted.
//
// Why the Cache API and not OPFS: the finished files already live there; it has no per-file
// lock (an OPFS sync handle of a worker killed by a reload may still be held when the reloaded
// page asks for it); Firefox and Chromium both have it in workers. Why pieces: a cache entry
// cannot be appended to, and a piece is written as soon as it is full, so a reload loses at
// most one piece's bytes.

import { BASE_URL, CancelledError, describeError } from "./common.js";

// The size of a piece: big enough that a 491 MB file is ~60 cache entries, small enough that
// a reload throws away little.
export const PART_BYTES = 8 << 20;
// Pieces written at once before the download waits for the cache (bounds the memory held).
const PARTS_IN_FLIGHT = 3;

function partPrefix(file) {
  return new URL(`model-cache/partial/${file.sha256}/`, BASE_URL).href;
}

function partKey(file, offset) {
  return `${partPrefix(file)}${offset}`;
}

// "UnknownError: ..." (the browser's words, its type first).
function storageErrorText(error) {
  const { name, message } = describeError(error);
  return name && name !== "Error" ? `${name}: ${message}` : message;
}

export class DownloadParts {
  constructor(cache, file) {
    this.cache = cache;
    this.file = file;
    this.offsets = []; // the pieces written (or being written), in order
    this.buffer = new Uint8Array(PART_BYTES);
    this.filled = 0;
    this.pieceStart = 0; // the file offset of the buffer's first byte
    this.writes = Promise.resolve();
    this.inFlight = 0;
    this.failed = null; // why the pieces could not be kept, once a write failed
  }

  // Reads the pieces kept by an earlier load, in order from byte 0, handing each to
  // write(bytes, offset); resolves with how many bytes they hold (0: start over).
  async resume(write, isCancelled) {
    const size = this.file.size;
    let offset = 0;
    while (offset < size) {
      if (isCancelled()) throw new CancelledError(`load cancelled while reading the kept part of ${this.file.name}`);
      let response;
      try {
        response = await this.cache.match(partKey(this.file, offset));
      } catch (error) {
        console.warn(`candle-web: could not read the kept part of ${this.file.name}: ${storageErrorText(error)}`);
        response = undefined;
      }
      if (response === undefined) break;
      const bytes = new Uint8Array(await response.arrayBuffer());
      if (bytes.byteLength === 0 || offset + bytes.byteLength > size) break;
      write(bytes, offset);
      this.offsets.push(offset);
      offset += bytes.byteLength;
    }
    this.pieceStart = offset;
    return offset;
  }

  // The next bytes of the download (in order, right after the last ones).
  async add(bytes) {
    let taken = 0;
    while (taken < bytes.byteLength) {
      const count = Math.min(PART_BYTES - this.filled, bytes.byteLength - taken);
      this.buffer.set(bytes.subarray(taken, taken + count), this.filled);
      this.filled += count;
      taken += count;
      if (this.filled === PART_BYTES) this.#writePiece();
    }
    if (this.inFlight >= PARTS_IN_FLIGHT) await this.writes;
  }

  #writePiece() {
    if (this.filled === 0) return;
    const offset = this.pieceStart;
    const piece = this.buffer.slice(0, this.filled);
    this.offsets.push(offset);
    this.pieceStart += this.filled;
    this.filled = 0;
    this.inFlight += 1;
    this.writes = this.writes.then(async () => {
      try {
        if (this.failed === null) await this.cache.put(partKey(this.file, offset), new Response(piece));
      } catch (error) {
        this.failed = storageErrorText(error);
      } finally {
        this.inFlight -= 1;
      }
    });
  }

  // Writes what is buffered as a (shorter) piece and waits for every write; resolves null when
  // all is kept, else why not. Called when the download ends, however it ends.
  async settle() {
    this.#writePiece();
    await this.writes;
    return this.failed;
  }

  // The pieces as the file's one cache entry under `cacheKey` (streamed from the pieces, not
  // held in memory), then the pieces deleted. Resolves null once kept, else why not.
  async assemble(cacheKey, size) {
    const { cache, file } = this;
    const offsets = [...this.offsets];
    let next = 0;
    const body = new ReadableStream({
      async pull(controller) {
        if (next === offsets.length) {
          controller.close();
          return;
        }
        const response = await cache.match(partKey(file, offsets[next]));
        if (response === undefined) throw new Error(`the kept part at byte ${offsets[next]} of ${file.name} is gone`);
        next += 1;
        controller.enqueue(new Uint8Array(await response.arrayBuffer()));
      },
    });
    let reason = null;
    try {
      await cache.put(cacheKey, new Response(body, { headers: { "Content-Type": "application/octet-stream", "Content-Length": String(size) } }));
    } catch (error) {
      reason = storageErrorText(error);
      await cache.delete(cacheKey).catch(() => {});
    }
    await this.drop();
    return reason;
  }

  // Deletes every kept piece of the file (a finished, failed or mismatched download).
  async drop() {
    const prefix = partPrefix(this.file);
    this.filled = 0;
    await this.writes; // a piece still being written must not land after the delete
    try {
      const keys = await this.cache.keys();
      await Promise.all(keys.filter((request) => request.url.startsWith(prefix)).map((request) => this.cache.delete(request)));
    } catch (error) {
      console.warn(`candle-web: could not delete the kept parts of ${this.file.name}: ${storageErrorText(error)}`);
    }
    this.offsets = [];
    this.pieceStart = 0;
    this.filled = 0;
  }
}
