// The page's grammar engine for structured outputs: web-xgrammar (xgrammar compiled to
// WebAssembly, vendored as web/vendor/xgrammar/web-xgrammar.js), driven from Python by
// candle_web.worker.grammar through `grammarBridge`.
//
// web-xgrammar is loaded only when a request first asks for a schema. Its factories are async
// (each awaits the module's start), and Python runs synchronously inside this worker, so the
// async part happens here before the Python job runs: `prepareGrammar` builds the tokenizer
// info (once per vocabulary), compiles the grammar (once per vocabulary and constraint) and makes
// its matcher. During decoding Python then makes one synchronous call per step and per kind of
// work (fill the mask, accept the token, ask whether it ended) on the prepared matcher.
//
// A grammar web-xgrammar refuses aborts its WebAssembly instance (xgrammar's checks are fatal in
// this build, and print the reason on stderr): the instance is then dropped with everything
// made from it, and the next use loads a fresh one. The reason it printed becomes the error.

import { TypedError, VENDOR_URL } from "./common.js";

const XGRAMMAR_URL = new URL("xgrammar/web-xgrammar.js", VENDOR_URL).href;

let instance = null; // {xgrammar, vocabularies: Map, grammars: Map} of one loaded module
let loads = 0; // how many times the module was evaluated (a new URL each time after an abort)

async function loadXgrammar() {
  if (instance !== null) return instance;
  loads += 1;
  // The bundle is UMD: run as a module it sets globalThis.xgrammar. After an abort the same
  // URL would give the same dead module, so a later load asks for a fresh evaluation.
  await import(loads === 1 ? XGRAMMAR_URL : `${XGRAMMAR_URL}?instance=${loads}`);
  const xgrammar = globalThis.xgrammar;
  if (!xgrammar?.GrammarCompiler) {
    throw new TypedError("GrammarUnavailable", `${XGRAMMAR_URL} did not define xgrammar (run \`make web\`)`);
  }
  // The module binds its stderr to console.error when it starts (at its first call), so it is
  // started here with console.error standing in for `printed`, which guarded() reads. Its
  // WebAssembly memory is noted as it is instantiated (see copyMask).
  const printed = [];
  const memories = [];
  const originalError = console.error;
  const originalInstantiate = WebAssembly.instantiate;
  console.error = (...parts) => {
    printed.push(parts.join(" "));
    originalError.apply(console, parts);
  };
  WebAssembly.instantiate = async (...args) => {
    const made = await originalInstantiate.apply(WebAssembly, args);
    memories.push(...Object.values((made.instance ?? made).exports).filter((value) => value instanceof WebAssembly.Memory));
    return made;
  };
  try {
    (await xgrammar.TokenizerInfo.createTokenizerInfo([])).dispose();
  } finally {
    console.error = originalError;
    WebAssembly.instantiate = originalInstantiate;
  }
  instance = { xgrammar, printed, memories, memory: undefined, vocabularies: new Map(), grammars: new Map() };
  return instance;
}

// The int32 words of a std::vector<int32_t> the binding returned, read in place from `memory`
// (libc++'s vector starts with its begin and end pointers), or null when they do not add up.
function vectorWords(memory, pointer, count) {
  const buffer = memory.buffer;
  if (typeof pointer !== "number" || pointer % 4 !== 0 || pointer + 8 > buffer.byteLength) return null;
  const [begin, end] = new Uint32Array(buffer, pointer, 2);
  if (begin % 4 !== 0 || end - begin !== count * 4 || end > buffer.byteLength) return null;
  return new Int32Array(buffer, begin, count);
}

// Copies the mask words of `words` (the binding's vector) into `mask`. The binding only reads
// them one call per word (2.6 ms for SmolLM2's 1536 words, 20x the mask's own computation), so
// they are read in place from the module's memory (0.01 ms): which memory holds them is found
// at the first mask, checked word by word against the binding's reads; where that fails (another
// build of the bundle) every mask takes the slow way.
function copyMask(loaded, words, count, mask) {
  const pointer = words.$$?.ptr; // embind's handle: where the vector lives
  if (loaded.memory === undefined) {
    const slow = Int32Array.from({ length: count }, (_, i) => words.get(i));
    loaded.memory = loaded.memories.find((memory) => {
      const view = vectorWords(memory, pointer, count);
      return view !== null && view.every((word, i) => word === slow[i]);
    }) ?? null;
    mask.set(slow);
    return;
  }
  const view = loaded.memory === null ? null : vectorWords(loaded.memory, pointer, count);
  if (view !== null) {
    mask.set(view);
  } else {
    for (let i = 0; i < count; i += 1) mask[i] = words.get(i);
  }
}

// Runs `work` (a web-xgrammar call) on `loaded`; an abort drops the module, and the error says
// what xgrammar printed before it aborted.
async function guarded(loaded, what, work) {
  loaded.printed.length = 0;
  try {
    return await work();
  } catch (error) {
    if (instance === loaded) instance = null;
    const fatal = loaded.printed.map((line) => /\[FATAL\][^:]*:\d+: (.*)/.exec(line)?.[1]).filter(Boolean);
    const reason = fatal.length ? fatal.join("; ") : String(error?.message || error);
    throw new TypedError("GrammarError", `${what}: web-xgrammar refused it: ${reason}`);
  }
}

// Whether the loaded module already holds the tokenizer info of vocabulary `key`.
export function hasVocabulary(key) {
  return instance !== null && instance.vocabularies.has(key);
}

// Prepares the grammar `plan` describes ({vocabularyKey, grammarKey, constraint: {kind, schema
// (JSON text), anyWhitespace, indent, strict, maxWhitespace; ebnf, rootRule; structuralTag}});
// `vocabulary()` gives {encodedVocab, vocabType, vocabSize, stopTokenIds, addPrefixSpace} when it has
// not seen that vocabulary yet. Returns {compileMs, cached}.
export async function prepareGrammar(plan, vocabulary) {
  const started = performance.now();
  const loaded = await loadXgrammar();
  const { xgrammar, vocabularies, grammars } = loaded;
  const held = grammars.get(plan.grammarKey);
  if (held !== undefined) return { compileMs: 0, cached: true };
  let tokenizer = vocabularies.get(plan.vocabularyKey);
  if (tokenizer === undefined) {
    const v = vocabulary();
    tokenizer = await guarded(loaded, "the model's vocabulary", async () => {
      const info = await xgrammar.TokenizerInfo.createTokenizerInfo(v.encodedVocab, v.vocabType, v.addPrefixSpace, v.vocabSize, v.stopTokenIds);
      return { info, compiler: await xgrammar.GrammarCompiler.createGrammarCompiler(info), vocabSize: v.vocabSize };
    });
    vocabularies.set(plan.vocabularyKey, tokenizer);
  }
  const entry = await guarded(loaded, `the ${plan.constraint.kind} constraint`, async () => {
    const compiled = await compile(tokenizer.compiler, plan.constraint);
    const matcher = await xgrammar.GrammarMatcher.createGrammarMatcher(compiled);
    return { compiled, matcher, mask: new Int32Array(Math.ceil(tokenizer.vocabSize / 32)), vocabSize: tokenizer.vocabSize };
  });
  grammars.set(plan.grammarKey, entry);
  return { compileMs: performance.now() - started, cached: false };
}

function compile(compiler, c) {
  switch (c.kind) {
    case "json_schema": // json_object too: as the schema of any object (worker/grammar.py)
      // indent -1: none; separators undefined: xgrammar's own defaults.
      return compiler.compileJSONSchema(c.schema, c.anyWhitespace, c.indent ?? -1, c.separators ?? undefined, c.strict, c.maxWhitespace ?? undefined);
    case "ebnf":
      return compiler.compileGrammar(c.ebnf, c.rootRule ?? "root");
    case "structural_tag":
      return compiler.compileStructuralTag(c.structuralTag);
    default:
      throw new TypedError("GrammarError", `unknown constraint kind ${JSON.stringify(c.kind)}`);
  }
}

function prepared(key) {
  const entry = instance?.grammars.get(key);
  if (entry === undefined) {
    throw new TypedError("GrammarError", `grammar ${key} was not prepared in this worker (prepareGrammar runs before the job)`);
  }
  return entry;
}

// What Python calls during decoding (candle_web.worker.grammar.PageGrammarEngine): each a
// synchronous call on the prepared matcher of `key`.
export const grammarBridge = {
  // Whether the masks are read in place from the module's memory (see copyMask).
  maskInPlace() {
    return Boolean(instance?.memory);
  },
  has(key) {
    return instance !== null && instance.grammars.has(key);
  },
  // Starts a request: the prepared matcher back at its first state.
  reset(key) {
    prepared(key).matcher.reset();
  },
  // The allowed-token bitmask of the next step as an Int32Array of ceil(vocab / 32) words (bit i
  // of word w: token 32 * w + i), the same layout as native xgrammar's. The matcher's own
  // async getNextTokenBitmask cannot be awaited from Python, so its binding call is used
  // directly and the words are copied here (copyMask), one JS call per step for Python.
  fill(key) {
    const entry = prepared(key);
    const words = entry.matcher.handle.GetNextTokenBitmask(entry.vocabSize);
    try {
      const count = words.size();
      if (count !== entry.mask.length) {
        throw new TypedError("GrammarError", `web-xgrammar gave ${count} mask words, expected ${entry.mask.length}`);
      }
      copyMask(instance, words, count, entry.mask);
    } finally {
      words.delete();
    }
    return entry.mask;
  },
  accept(key, tokenId) {
    return prepared(key).matcher.acceptToken(tokenId);
  },
  isTerminated(key) {
    return prepared(key).matcher.isTerminated();
  },
  rollback(key, count) {
    prepared(key).matcher.rollBack(count);
  },
};
