"""The page's grammar engine gives native xgrammar's masks (issue 33): web-xgrammar 0.1.27 (the
file the page is served, run by Node with the tokenizer info and compile request the page's
worker builds: tests/worker/web_xgrammar_masks.cjs) against xgrammar 0.2.8 natively
(candle_web.generation.grammar's engine), on SmolLM2's vocabulary, along the tokens of a JSON
answer, at every step.

The two are different builds of xgrammar, and their masks differ in exactly two ways, both
about whitespace between JSON tokens, which this test pins (any further difference fails it):
- 0.2.8 allows a carriage return there ([ \\n\\r\\t]), the core inside web-xgrammar 0.1.27
  only [ \\n\\t]: tokens holding a '\\r' byte are allowed natively and not in the page;
- for json_object (the schema {"type": "object"}, whose other values are any JSON), 0.1.27 does
  not apply the whitespace bound (grammar.MAX_WHITESPACE) after every value: a whitespace
  token that makes the run longer than that is allowed in the page at some steps and not
  natively.
A greedy answer would have to choose such a token for the twins to part (the UI test
tests/ui/test_structured_output.py compares the ids).
"""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
BUNDLE = REPO_ROOT / "node_modules" / "@mlc-ai" / "web-xgrammar" / "lib" / "index.js"
NODE_SCRIPT = Path(__file__).with_name("web_xgrammar_masks.cjs")
MODEL = "smollm2-135m-instruct"
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SCHEMA = {"type": "object",
          "properties": {"name": {"type": "string"}, "country": {"type": "string"},
                         "continent": {"type": "string"}},
          "required": ["name", "country", "continent"]}
# An answer with spaces, a newline and the schema's three fields, as a model writes it.
ANSWER = '{"name": "Paris",\n "country": "France", "continent": "Europe"}'
NODE_TIMEOUT_S = 300


@pytest.fixture(scope="module")
def smollm2(model_file):
    from candle_web.pipelines import load_llama

    return load_llama(str(model_file(MODEL, GGUF)))


def test_web_xgrammar_masks_equal_native_xgrammar_on_smollm2(smollm2, tmp_path):
    pytest.importorskip("xgrammar", reason="the grammar extra is not installed")
    from candle_web.generation.grammar import (MAX_WHITESPACE, Constraint, allowed_tokens,
                                               get_engine)
    from candle_web.worker.grammar import compile_request, page_vocabulary

    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed (the page's npm packages need it: make node-deps)")
    assert BUNDLE.is_file(), f"{BUNDLE} is missing: run `make node-deps`"
    model, tokenizer = smollm2.model, smollm2.tokenizer
    vocabulary = page_vocabulary(model, tokenizer)
    tokens = list(tokenizer.encode(ANSWER, add_special_tokens=False).ids)
    tokens.append(vocabulary.stop_token_ids[0])
    constraints = [Constraint.json_schema(SCHEMA, strict=True), Constraint.json_object()]

    bundle = tmp_path / "web-xgrammar.cjs"  # the UMD bundle, loaded as CommonJS by Node
    shutil.copyfile(BUNDLE, bundle)
    request = tmp_path / "request.json"
    request.write_text(json.dumps({
        "vocabulary": {"encodedVocab": list(vocabulary.encoded_vocab),
                       "vocabType": vocabulary.vocab_type, "vocabSize": vocabulary.vocab_size,
                       "stopTokenIds": list(vocabulary.stop_token_ids),
                       "addPrefixSpace": vocabulary.add_prefix_space},
        "constraints": [compile_request(c) for c in constraints], "tokens": tokens}))
    run = subprocess.run([node, str(NODE_SCRIPT), str(bundle), str(request)],
                         capture_output=True, text=True, timeout=NODE_TIMEOUT_S)
    assert run.returncode == 0, run.stderr[-3000:]
    page_runs = json.loads(run.stdout)

    engine = get_engine("xgrammar")
    texts = {}

    def text(i: int) -> str:
        if i not in texts:
            texts[i] = tokenizer.decode([int(i)], skip_special_tokens=False)
        return texts[i]

    def whitespace_run(ids) -> int:
        decoded = tokenizer.decode(ids)
        return len(decoded) - len(decoded.rstrip(" \n\t"))

    for constraint, page in zip(constraints, page_runs):
        assert "refused" not in page, (constraint.kind, page)
        matcher = engine.matcher(engine.compiled(vocabulary, constraint))
        bitmask = np.empty(vocabulary.bitmask_words, dtype=np.int32)
        for step, token in enumerate(tokens):
            matcher.fill_next_token_bitmask(bitmask)
            native = allowed_tokens(bitmask, vocabulary.vocab_size)
            web = allowed_tokens(np.array(page["masks"][step], dtype=np.int32),
                                 vocabulary.vocab_size)
            assert native[token] and web[token], (constraint.kind, step)
            # Native only: tokens holding a carriage return.
            unexplained = [text(i) for i in np.flatnonzero(native & ~web) if "\r" not in text(i)]
            assert not unexplained, (constraint.kind, step, unexplained[:8])
            # Page only, json_object only: whitespace that makes the run before it too long.
            run = whitespace_run(tokens[:step])
            unexplained = [text(i) for i in np.flatnonzero(web & ~native)
                           if constraint.kind != "json_object" or text(i).strip(" \n\t")
                           or run + len(text(i)) <= MAX_WHITESPACE]
            assert not unexplained, (constraint.kind, step, unexplained[:8])
            assert matcher.accept_token(token)
        assert matcher.is_terminated() and page["terminated"], constraint.kind
