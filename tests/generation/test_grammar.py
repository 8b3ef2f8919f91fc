"""generation/grammar.py against xgrammar itself: the vocabulary candle-web hands the engine
gives the same masks, token by token, as a vocabulary xgrammar builds from the GGUF file's own
token list with its own vocab-type detection; the numpy masking step sets exactly the tokens
xgrammar's own `apply_token_bitmask_inplace` does to -inf; schema keywords the engine would
silently ignore are refused by name; `generate` under a schema answers JSON that validates
(jsonschema) even from random weights, and in a batch a row without a grammar is untouched by
the row beside it that has one."""

from __future__ import annotations

import json

import numpy as np
import pytest

xgrammar = pytest.importorskip("xgrammar", reason="the grammar extra installs xgrammar")
jsonschema = pytest.importorskip("jsonschema", reason="the dev extra installs jsonschema")

from candle_web.generation import GenerationOptions, generate  # noqa: E402
from candle_web.generation import grammar  # noqa: E402
from candle_web.generation.grammar import (Constraint, GrammarError, TokenVocabulary,  # noqa: E402
                                           UnsupportedSchema)

from tests.generation.conftest import SMOLLM2  # noqa: E402

PERSON = {"type": "object", "additionalProperties": False,
          "required": ["name", "age", "city", "languages"],
          "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                         "city": {"type": "string"},
                         "languages": {"type": "array", "items": {"type": "string"}}}}
# Non-ASCII, a newline escape and spaces: byte-level tokens ('Ġ', 'Ã«'), not only ASCII ones.
# Bounded values only: a random-weight model would otherwise fill a free string for ever.
ANSWER = {"type": "object", "additionalProperties": False, "required": ["answer", "sure"],
          "properties": {"answer": {"enum": ["yes", "no"]}, "sure": {"type": "boolean"}}}
PERSON_TEXT = ('{"name": "Zoë Ünal", "age": 36, "city": "Zürich",'
               ' "languages": ["de", "fr\\nit", "日本語"]}')


def _reference_info(gguf_path, vocab_size: int):
    """xgrammar's TokenizerInfo from the GGUF file's token list, with xgrammar's own detection
    of the vocab type from the tokens: independent of candle-web's tokenizer classes."""
    from candle_web.io.gguf import read_gguf

    gguf = read_gguf(gguf_path)
    tokens = list(gguf.metadata["tokenizer.ggml.tokens"])
    vocab_type = xgrammar.TokenizerInfo._detect_vocab_type_from_vocab(
        {token: index for index, token in enumerate(tokens)})
    assert vocab_type is not None, "xgrammar could not tell the vocab type of the GGUF tokens"
    eos = int(gguf.metadata["tokenizer.ggml.eos_token_id"])
    return xgrammar.TokenizerInfo(tokens, vocab_type, vocab_size=vocab_size,
                                  stop_token_ids=[eos]), eos


def test_masks_equal_xgrammar_on_the_gguf_vocabulary_token_by_token(smollm2_tokenizer,
                                                                     model_file):
    vocab_size = smollm2_tokenizer.get_vocab_size()
    info, eos = _reference_info(model_file(*SMOLLM2), vocab_size)
    vocabulary = TokenVocabulary.from_tokenizer(smollm2_tokenizer, vocab_size, [eos])
    assert vocabulary.vocab_type == "byte_level"
    compiled = xgrammar.GrammarCompiler(info).compile_json_schema(
        json.dumps(PERSON), strict_mode=False, max_whitespace_cnt=grammar.MAX_WHITESPACE)
    reference = xgrammar.GrammarMatcher(compiled)
    row = grammar.grammar_row(smollm2_tokenizer, Constraint.json_schema(PERSON), vocab_size, [eos])
    ours = np.empty(grammar.bitmask_words(vocab_size), dtype=np.int32)
    theirs = xgrammar.allocate_token_bitmask(1, vocab_size).numpy()
    ids = smollm2_tokenizer.encode(PERSON_TEXT, add_special_tokens=False).ids
    assert smollm2_tokenizer.decode(ids) == PERSON_TEXT
    for step, token in enumerate(list(ids) + [eos]):
        row.matcher.fill_next_token_bitmask(ours)
        reference.fill_next_token_bitmask(theirs)
        assert np.array_equal(ours, theirs[0]), f"masks differ before token {step}"
        assert grammar.allowed_tokens(ours, vocab_size)[token], f"token {step} ({token}) refused"
        row.accept(token)
        assert reference.accept_token(token)
    assert row.terminated and reference.is_terminated()


def test_apply_token_bitmask_masks_what_xgrammar_masks(smollm2_tokenizer):
    import torch

    vocab_size = smollm2_tokenizer.get_vocab_size()
    row = grammar.grammar_row(smollm2_tokenizer, Constraint.json_object(), vocab_size, [2])
    row.accept(smollm2_tokenizer.token_to_id("{"))
    bitmask = np.empty(grammar.bitmask_words(vocab_size), dtype=np.int32)
    row.matcher.fill_next_token_bitmask(bitmask)
    logits = np.random.default_rng(0).standard_normal(vocab_size).astype(np.float32)
    expected = torch.from_numpy(logits.copy()).reshape(1, -1)
    xgrammar.apply_token_bitmask_inplace(expected, torch.from_numpy(bitmask.reshape(1, -1)))
    masked = grammar.apply_token_bitmask(logits, bitmask)
    assert np.array_equal(masked, expected[0].numpy())  # exact: both copy or write -inf
    assert 0 < np.isfinite(masked).sum() < vocab_size
    # A logits row wider than the mask (a padded lm_head): the extra tokens are never allowed.
    wider = grammar.apply_token_bitmask(np.zeros(vocab_size + 40, np.float32), bitmask)
    assert np.isneginf(wider[vocab_size:]).all()


@pytest.mark.parametrize("schema, feature", [
    ({"type": "object", "properties": {"a": {"oneOf": [{"type": "integer"}]}}}, "oneOf"),
    ({"type": "string", "format": "idn-email"}, "format: idn-email"),
    ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, "uniqueItems"),
    ({"allOf": [{"type": "integer"}, {"minimum": 3}]}, "allOf"),
    ({"type": "object", "if": {"required": ["a"]}, "then": {"required": ["b"]}}, "if"),
    ({"$ref": "https://example.com/person.json"}, "$ref: https://example.com/person.json"),
    ({"type": "number", "not": {"const": 3}}, "not"),
])
def test_schema_features_the_engine_would_ignore_are_refused_by_name(schema, feature):
    with pytest.raises(UnsupportedSchema) as caught:
        Constraint.from_response_format({"type": "json_schema",
                                         "json_schema": {"name": "x", "schema": schema}})
    assert feature in caught.value.features
    assert feature.split(":")[0] in str(caught.value)
    assert caught.value.param == "response_format.json_schema.schema"


def test_each_refused_keyword_really_is_ignored_by_xgrammar():
    """The refusals above are not a guess: xgrammar compiles each of these schemas and then
    accepts a document that breaks the keyword (if this fails, the engine learnt the keyword
    and the refusal can go)."""
    from xgrammar.testing import _is_grammar_accept_string

    cases = [({"oneOf": [{"type": "integer"}, {"type": "number"}]}, "1"),
             ({"type": "array", "uniqueItems": True}, "[1, 1]"),
             ({"allOf": [{"type": "integer"}, {"minimum": 3}]}, "1"),
             ({"not": {"type": "string"}}, '"x"')]
    for schema, breaking in cases:
        compiled = xgrammar.Grammar.from_json_schema(json.dumps(schema), strict_mode=False)
        assert _is_grammar_accept_string(compiled, breaking), schema


def test_response_format_types():
    assert Constraint.from_response_format(None) is None
    assert Constraint.from_response_format({"type": "text"}) is None
    assert Constraint.from_response_format({"type": "json_object"}).kind == "json_object"
    strict = Constraint.from_response_format(
        {"type": "json_schema", "json_schema": {"name": "p", "strict": True, "schema": PERSON}})
    assert (strict.kind, strict.strict, strict.schema) == ("json_schema", True, PERSON)
    assert strict == Constraint.json_schema(json.loads(json.dumps(PERSON)), True)
    assert hash(strict) == hash(Constraint.json_schema(PERSON, True))
    for bad, param in [({"type": "xml"}, "response_format.type"),
                       ("json", "response_format"),
                       ({"type": "json_schema"}, "response_format.json_schema"),
                       ({"type": "json_schema", "json_schema": {"schema": PERSON}},
                        "response_format.json_schema.name"),
                       ({"type": "json_schema", "json_schema": {"name": "p", "strict": "yes"}},
                        "response_format.json_schema.strict"),
                       ({"type": "json_schema", "json_schema": {"name": "p", "schema": {
                           "type": "blob"}}}, "response_format.json_schema.schema")]:
        with pytest.raises(GrammarError) as caught:
            Constraint.from_response_format(bad)
        assert caught.value.param == param
        assert param in str(caught.value)


def test_a_pattern_the_engine_cannot_read_is_a_grammar_error_naming_it(smollm2_tokenizer):
    schema = {"type": "object", "properties": {"a": {"type": "string", "pattern": "(?<=x)y"}}}
    with pytest.raises(GrammarError, match="Lookbehind"):
        grammar.grammar_row(smollm2_tokenizer, Constraint.json_schema(schema), 49152, [2])


def test_generate_under_a_schema_ends_in_valid_json(tiny_llama, smollm2_tokenizer):
    """Random weights prefer no JSON at all: whatever the model wants, the answer validates
    and ends with the end token the grammar allows once the object is complete."""
    options = GenerationOptions(max_new_tokens=60, constraint=Constraint.json_schema(
        ANSWER, strict=True))
    result = generate(tiny_llama, smollm2_tokenizer, "Is the sky blue?", options)
    assert result.stop_reason == "eos", result.text
    jsonschema.validate(json.loads(result.text), ANSWER)
    free = generate(tiny_llama, smollm2_tokenizer, "Is the sky blue?",
                    GenerationOptions(max_new_tokens=8))
    with pytest.raises(ValueError):  # the same model, unconstrained: no JSON
        json.loads(free.text)


def test_rows_with_and_without_a_grammar_share_each_step(tiny_llama, smollm2_tokenizer):
    """sample_steps with two rows of one batch, row 0 under a grammar and row 1 free: row 1's
    tokens are those of the prompt generated alone, row 0's validate."""
    from candle_web.generation import CausalLM, sample_steps

    prompt = smollm2_tokenizer.encode("Is the sky blue?").ids
    alone = generate(tiny_llama, smollm2_tokenizer, prompt, GenerationOptions(max_new_tokens=12))
    lm = CausalLM(tiny_llama)
    eos = set(tiny_llama.config.eos_token_ids)
    lm.reset(len(prompt) + 40)
    logits = lm.start([prompt, prompt])
    rows = [grammar.grammar_row(smollm2_tokenizer, Constraint.json_schema(ANSWER, True),
                                logits.shape[-1], eos), None]
    produced = [[], []]
    finished = np.zeros(2, dtype=bool)
    for next_ids, done in sample_steps(lm, logits, GenerationOptions(), eos, 40,
                                       [list(prompt), list(prompt)], rows):
        for row in (0, 1):
            if not finished[row] and next_ids[row] not in eos:
                produced[row].append(int(next_ids[row]))
        finished = done.copy()
        if finished[0] and len(produced[1]) >= len(alone.token_ids):
            break
    assert produced[1][:len(alone.token_ids)] == alone.token_ids
    assert finished[0] and rows[0].terminated
    jsonschema.validate(json.loads(smollm2_tokenizer.decode(produced[0])), ANSWER)


def test_a_missing_engine_names_the_extra(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_xgrammar(name, *args, **kwargs):
        if name == "xgrammar":
            raise ImportError("No module named 'xgrammar'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_xgrammar)
    monkeypatch.setitem(grammar._ENGINES, "xgrammar", [grammar.XGrammarEngine, None])
    from candle_web.core.errors import BackendUnavailable

    with pytest.raises(BackendUnavailable, match=r"pip install 'candle-web\[grammar\]'"):
        grammar.get_engine("xgrammar")
