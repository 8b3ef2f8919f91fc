// The candle_web wheel, unpacked in JS: a small ZIP reader (inflating with the browser's own
// DecompressionStream) and the files written into Pyodide's site-packages.

const ZIP_END_SIGNATURE = 0x06054b50; // end of central directory record
const ZIP_ENTRY_SIGNATURE = 0x02014b50; // central directory file header
const ZIP_LOCAL_SIGNATURE = 0x04034b50; // local file header
const ZIP_STORED = 0;
const ZIP_DEFLATED = 8;
const ZIP_END_MIN_BYTES = 22;
const ZIP_ENTRY_BYTES = 46; // a central directory header before its name
const ZIP_LOCAL_BYTES = 30; // a local header before its name

function inflateRaw(raw) {
  const inflated = new Blob([raw]).stream().pipeThrough(new DecompressionStream("deflate-raw"));
  return new Response(inflated).arrayBuffer().then((buffer) => new Uint8Array(buffer));
}

// The offset of the end of central directory record (the archive may end in a comment).
function endRecordOffset(view) {
  let end = view.byteLength - ZIP_END_MIN_BYTES;
  while (end >= 0 && view.getUint32(end, true) !== ZIP_END_SIGNATURE) end -= 1;
  if (end < 0) throw new Error("not a zip archive (no end of central directory)");
  return end;
}

// The files of a zip archive (no zip64, no encryption: scripts/build_wheel.py writes stored or
// deflated entries) as [{name, data: Uint8Array}], inflated all at once: this runs while
// Pyodide's start keeps the thread busy, and one await per file would wait behind its long
// tasks one by one. The caller checked the archive's sha256, so each entry's CRC is not
// checked again.
export async function unzipEntries(buffer) {
  const bytes = new Uint8Array(buffer);
  const view = new DataView(buffer);
  const end = endRecordOffset(view);
  const count = view.getUint16(end + 10, true);
  let at = view.getUint32(end + 16, true);
  const decoder = new TextDecoder();
  const entries = [];
  for (let i = 0; i < count; i += 1) {
    if (view.getUint32(at, true) !== ZIP_ENTRY_SIGNATURE) throw new Error(`zip entry ${i}: bad central directory header`);
    const method = view.getUint16(at + 10, true);
    const compressedSize = view.getUint32(at + 20, true);
    const nameLength = view.getUint16(at + 28, true);
    const extraLength = view.getUint16(at + 30, true);
    const commentLength = view.getUint16(at + 32, true);
    const localOffset = view.getUint32(at + 42, true);
    const name = decoder.decode(bytes.subarray(at + ZIP_ENTRY_BYTES, at + ZIP_ENTRY_BYTES + nameLength));
    at += ZIP_ENTRY_BYTES + nameLength + extraLength + commentLength;
    if (view.getUint32(localOffset, true) !== ZIP_LOCAL_SIGNATURE) throw new Error(`${name}: bad local header`);
    const dataStart = localOffset + ZIP_LOCAL_BYTES + view.getUint16(localOffset + 26, true) + view.getUint16(localOffset + 28, true);
    const raw = bytes.subarray(dataStart, dataStart + compressedSize);
    if (name.endsWith("/")) continue; // a directory entry
    if (method === ZIP_STORED) {
      entries.push({ name, data: Promise.resolve(raw) });
    } else if (method === ZIP_DEFLATED) {
      entries.push({ name, data: inflateRaw(raw) });
    } else {
      throw new Error(`${name}: zip compression method ${method} is not supported`);
    }
  }
  const data = await Promise.all(entries.map((entry) => entry.data));
  return entries.map((entry, i) => ({ name: entry.name, data: data[i] }));
}

// The files of a pure wheel (the candle_web wheel, or Jinja2/MarkupSafe), checked to stay
// inside site-packages. Installing is then writing them there: all an installer does for a
// pure-Python wheel without scripts or data files (build_wheel.py and vendor_pyodide.py make
// or pick exactly those), with no micropip and no Python code run.
export async function unpackWheel(bytes, what = "candle_web wheel") {
  const entries = await unzipEntries(bytes);
  for (const { name } of entries) {
    if (name.startsWith("/") || name.split("/").some((part) => part === ".." || part === "")) {
      throw new Error(`${what}: unsafe path ${JSON.stringify(name)}`);
    }
  }
  return entries;
}

// Writes unpacked wheels' files into site-packages (every wheel of the start in one call: one
// invalidation).
export function installWheelFiles(pyodide, entries) {
  const sitePackages = pyodide._api.sitepackages ?? pyodide.runPython("import site; site.getsitepackages()[0]");
  for (const { name, data } of entries) {
    const path = `${sitePackages}/${name}`;
    pyodide.FS.mkdirTree(path.slice(0, path.lastIndexOf("/")));
    pyodide.FS.writeFile(path, data);
  }
  // The path finders cache directory listings; new files must be seen at the next import
  // (cheap: boot.js keeps the stdlib archive's importer from re-reading its directory).
  pyodide.runPython("import importlib; importlib.invalidate_caches()");
}
