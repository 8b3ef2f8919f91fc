"""What enforces tool_choice "required" and a named function (api/tool_fields.py): the
structural tag built for each tool format, compiled by xgrammar on SmolLM2's vocabulary, must
let through, token by token, a call as the format writes it (and end there when one call is
allowed), and refuse a call of another tool or arguments outside the tool's schema."""

from __future__ import annotations

import pytest

pytest.importorskip("xgrammar", reason="the grammar extra installs xgrammar")

from candle_web.api import tool_fields  # noqa: E402
from candle_web.generation.grammar import GrammarRow, allowed_tokens  # noqa: E402
from candle_web.generation.tool_calls import HERMES, LLAMA3_JSON, MISTRAL  # noqa: E402

SMOLLM = "smollm2-135m-instruct"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "parameters": {
        "type": "object", "required": ["city"], "additionalProperties": False,
        "properties": {"city": {"type": "string"}}}}}
TIME = {"type": "function", "function": {"name": "get_time"}}  # no parameters: none taken
CALLS = {  # a call of get_weather as each format writes it (and its bare form, where taken)
    HERMES: ['<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
             '</tool_call>', '{"name": "get_weather", "arguments": {"city": "Paris"}}'],
    LLAMA3_JSON: ['{"name": "get_weather", "parameters": {"city": "Paris"}}'],
    MISTRAL: ['[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]',
              '{"name": "get_weather", "arguments": {"city": "Paris"}}'],
}


@pytest.fixture(scope="module")
def smollm():
    from candle_web.pipelines import load_llama

    loaded = load_llama(SMOLLM)
    return loaded.tokenizer, loaded.model.config


def grammar_for(smollm, tool_format, choice, parallel):
    from candle_web.generation.grammar import grammar_row

    tokenizer, config = smollm
    request = tool_fields.ToolRequest([WEATHER, TIME], ("get_weather", "get_time"), choice,
                                      parallel, tool_format)
    constraint = tool_fields.constraint(request)
    return grammar_row(tokenizer, constraint, config.vocab_size, config.eos_token_ids)


def follows(row: GrammarRow, tokenizer, text: str) -> bool:
    """Whether the grammar allows `text`'s tokens one by one (each allowed by the mask before
    it is accepted)."""
    bitmask = row.bitmask
    for token in tokenizer.encode(text, add_special_tokens=False).ids:
        row.matcher.fill_next_token_bitmask(bitmask)
        if not allowed_tokens(bitmask, row.vocab_size)[token]:
            return False
        row.accept(token)
    return True


def only_the_end_is_allowed(row: GrammarRow, eos: int) -> bool:
    row.matcher.fill_next_token_bitmask(row.bitmask)
    return list(allowed_tokens(row.bitmask, row.vocab_size).nonzero()[0]) == [eos]


@pytest.mark.parametrize("tool_format", list(CALLS), ids=lambda f: f.name)
def test_the_formats_own_call_is_let_through(smollm, tool_format):
    tokenizer, config = smollm
    eos = config.eos_token_ids[0]
    for text in CALLS[tool_format]:
        row = grammar_for(smollm, tool_format, "required", parallel=False)
        assert follows(row, tokenizer, text), text
        assert only_the_end_is_allowed(row, eos), text  # one call: then the end
        row.accept(eos)
        assert row.terminated
        # A named function: the same call, and with parallel calls more text may follow.
        row = grammar_for(smollm, tool_format, "get_weather", parallel=True)
        assert follows(row, tokenizer, text) and not only_the_end_is_allowed(row, eos)


@pytest.mark.parametrize("tool_format", list(CALLS), ids=lambda f: f.name)
def test_other_calls_and_free_text_are_refused(smollm, tool_format):
    tokenizer, _ = smollm
    call = CALLS[tool_format][0]
    refused = [call.replace("get_weather", "get_time"),  # another tool than the named one
               call.replace('"city"', '"town"'),  # outside the schema
               "Sure! " + call]  # "required": the answer begins with the call
    for text in refused:
        row = grammar_for(smollm, tool_format, "get_weather", parallel=False)
        assert not follows(row, tokenizer, text), text
    # get_time takes no parameters: "required" lets its call through with {} only.
    row = grammar_for(smollm, tool_format, "required", parallel=False)
    assert follows(row, tokenizer, call.replace("get_weather", "get_time").replace(
        '{"city": "Paris"}', "{}"))
