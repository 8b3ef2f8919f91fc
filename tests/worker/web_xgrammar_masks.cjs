// The page's grammar engine outside the browser, for tests/worker/test_page_grammar_masks.py:
// web-xgrammar (the very file the page is served, copied to a .cjs path so that Node loads its
// UMD bundle as CommonJS) fills the token bitmask at each step of a token path, with the
// tokenizer info and compile request the page's worker builds (candle_web.worker.grammar,
// web/worker/grammar.js: the same calls, the same arguments).
//   node web_xgrammar_masks.cjs BUNDLE.cjs REQUEST.json > MASKS.json
// REQUEST: {vocabulary: {encodedVocab, vocabType, vocabSize, stopTokenIds, addPrefixSpace},
//           constraints: [compile request...], tokens: [id...]}
// -> [[mask words of step 0, ...] per constraint] (int32 words; a step after each token, the
//    last after the end token), or {refused: index} where a token was not accepted.
const fs = require("fs");

async function main() {
  const xgrammar = require(process.argv[2]);
  const request = JSON.parse(fs.readFileSync(process.argv[3], "utf8"));
  const v = request.vocabulary;
  const info = await xgrammar.TokenizerInfo.createTokenizerInfo(v.encodedVocab, v.vocabType, v.addPrefixSpace, v.vocabSize, v.stopTokenIds);
  const compiler = await xgrammar.GrammarCompiler.createGrammarCompiler(info);
  const out = [];
  for (const c of request.constraints) {
    // As web/worker/grammar.js compiles a JSON constraint (json_object and json_schema).
    const compiled = await compiler.compileJSONSchema(c.schema, c.anyWhitespace, c.indent ?? -1, undefined, c.strict, c.maxWhitespace ?? undefined);
    const matcher = await xgrammar.GrammarMatcher.createGrammarMatcher(compiled);
    const masks = [];
    let refused = null;
    for (const [index, token] of request.tokens.entries()) {
      masks.push(Array.from(await matcher.getNextTokenBitmask()));
      if (!matcher.acceptToken(token)) {
        refused = index;
        break;
      }
    }
    out.push(refused === null ? { masks, terminated: matcher.isTerminated() } : { refused });
  }
  process.stdout.write(JSON.stringify(out));
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});
