"""Structured outputs in the page (issue 33): Generate's "Answer as JSON" in headless Chromium,
against the native twin.

The page constrains every token with web-xgrammar (xgrammar in WebAssembly, vendored and
served by this server, loaded only when a schema is first used: web/worker/grammar.js,
candle_web.worker.grammar); natively the same session code (candle_web.worker.llama) runs
with the xgrammar engine of candle_web.generation.grammar. Both build the engine's tokenizer
info from the same TokenVocabulary and compile the schema from the same JSON text with the same
options, so for SmolLM2's greedy answer the masks and therefore the ids must be equal, as they
are without a grammar (tests/ui/test_generate.py: equal greedy ids, the float steps differing
only in the last bits). The answer is short (about 20 tokens, ended by the model) and float32
(the page's default compute type), where the unconstrained twin holds for 24 tokens.
"""
from __future__ import annotations

import json

import pytest
from tests.ui.test_generate import GGUF, MODEL, fill_form
from tests.ui.text_views_testlib import (NativeTextJobs, leave_page_as_found, open_view,
                                         run_and_wait, view_state)

SCHEMA = {"type": "object",
          "properties": {"name": {"type": "string"}, "country": {"type": "string"},
                         "continent": {"type": "string"}},
          "required": ["name", "country", "continent"]}
RESPONSE_FORMAT = {"type": "json_schema",
                   "json_schema": {"name": "answer", "strict": True, "schema": SCHEMA}}
PROMPT = "Describe Paris as JSON: its name, country and continent."
OPTIONS = {"maxTokens": 32, "temperature": 0, "seed": 299792458, "repeatPenalty": 1}
XGRAMMAR_PATH = "/vendor/xgrammar/web-xgrammar.js"
GENERATE_TIMEOUT_MS = 400_000
ERROR_TIMEOUT_MS = 60_000

pytestmark = [pytest.mark.ui, pytest.mark.usefixtures("model_cache_left_as_found")]


@pytest.fixture(scope="module", autouse=True)
def page_left_as_found(ready_page):
    yield from leave_page_as_found(ready_page)


@pytest.fixture(scope="module")
def native_twin(model_file):
    gguf = str(model_file(MODEL, GGUF))
    run = NativeTextJobs([{"task": "generate", "gguf": gguf, "prompt": PROMPT, "chat": True,
                           "options": OPTIONS, "responseFormat": RESPONSE_FORMAT},
                          {"task": "generate", "gguf": gguf, "prompt": PROMPT, "chat": True,
                           "options": OPTIONS, "responseFormat": {"type": "json_object"}}])
    yield run
    run.stop()


def set_json_option(page, schema_text: str | None) -> None:
    """Turn "Answer as JSON" on with `schema_text` (None: any JSON object)."""
    page.evaluate("() => { document.getElementById('generate-json').open = true; }")
    page.set_checked("#generate-json-on", True)
    if schema_text is None:
        page.set_checked("#generate-json-kind-object", True)
        return
    page.set_checked("#generate-json-kind-schema", True)
    page.fill("#generate-json-schema", schema_text)
    page.set_checked("#generate-json-strict", True)


def test_page_json_schema_answer_has_native_ids_and_validates(ready_page, native_twin,
                                                              network_guard, report):
    import jsonschema

    page = ready_page
    open_view(page, "generate")
    page.select_option("#generate-model", MODEL)
    fill_form(page, PROMPT, True, OPTIONS)
    set_json_option(page, json.dumps(SCHEMA, indent=2))
    mark = network_guard.allowed_mark()
    blocked = network_guard.mark()
    state = run_and_wait(page, "generate", "#generate-button", GENERATE_TIMEOUT_MS)
    assert state["error"] is None, state["error"]
    got = state["result"]
    assert got["grammar"]["engine"] == "web-xgrammar" and got["grammar"]["kind"] == "json_schema"
    # The engine came from this server (its wasm is inside the file), and nothing from elsewhere.
    assert any(url.endswith(XGRAMMAR_PATH) for url in network_guard.allowed_since(mark))
    assert network_guard.blocked_since(blocked) == []

    answer = json.loads(got["text"])
    jsonschema.validate(answer, SCHEMA)
    assert got["stopReason"] == "eos"  # the model closed the object and ended by itself
    # The view shows the answer as formatted JSON.
    shown = page.locator("#generate-output pre.json-answer").inner_text()
    assert json.loads(shown) == answer and "\n" in shown

    want = native_twin.result()["results"][0]
    assert got["promptIds"] == want["promptIds"]
    assert got["tokenIds"] == want["tokenIds"], (got["text"], want["text"])
    # Every step was masked by the page's engine: each answer token and the end token.
    grammar = got["grammar"]
    assert grammar["steps"] == len(got["tokenIds"]) + 1
    # Each mask is read in place from web-xgrammar's memory (checked word by word against its
    # binding's own reads at the first mask), not one JS call per word.
    assert grammar["maskInPlace"] is True
    step_ms = got["timings"]["decodeMs"] / len(got["tokenIds"])
    report(f"[ui] Answer as JSON (SmolLM2 Q4_1, greedy, 3-field schema): {len(got['tokenIds'])} "
           f"ids equal native xgrammar's; web-xgrammar load + compile {grammar['compileMs']:.0f} "
           f"ms; per step: mask {grammar['fillMsPerStep']:.2f} ms + accept "
           f"{grammar['acceptMsPerStep']:.2f} ms in JS calls, of a {step_ms:.0f} ms decode step "
           f"({got['timings']['tokensPerSecond']:.2f} tok/s): {got['text']!r}")


def test_page_any_json_object_answer_has_native_ids(ready_page, native_twin, report):
    page = ready_page
    open_view(page, "generate")
    page.select_option("#generate-model", MODEL)
    fill_form(page, PROMPT, True, OPTIONS)
    set_json_option(page, None)
    state = run_and_wait(page, "generate", "#generate-button", GENERATE_TIMEOUT_MS)
    assert state["error"] is None, state["error"]
    got = state["result"]
    assert got["grammar"]["kind"] == "json_schema"  # json_object compiles as {"type": "object"}
    assert state["result"]["responseFormat"] == {"type": "json_object"}
    want = native_twin.result()["results"][1]
    assert got["tokenIds"] == want["tokenIds"], (got["text"], want["text"])
    if got["stopReason"] == "eos":  # closed within maxTokens: a JSON object
        assert isinstance(json.loads(got["text"]), dict)
    report(f"[ui] Answer as JSON, any object: {len(got['tokenIds'])} ids equal native's "
           f"({got['stopReason']}): {got['text']!r}")


def test_bad_schema_is_shown_by_the_field_naming_the_bad_part(ready_page):
    page = ready_page
    open_view(page, "generate")
    page.select_option("#generate-model", MODEL)
    fill_form(page, PROMPT, True, OPTIONS)
    field_error = page.locator("#generate-json-error")
    runs_before = view_state(page, "generate", "s.runs")

    # Not JSON: refused in the page, with the line and column, before anything runs.
    set_json_option(page, '{\n  "type": "object",\n  "properties": {"name": {"type": "string"},}\n}')
    page.click("#generate-button")
    field_error.wait_for(state="visible")
    assert "not valid JSON at line 3" in field_error.inner_text()
    assert page.get_attribute("#generate-json-schema", "aria-invalid") == "true"

    # A wrong type name and a keyword the engine would not enforce: the worker's check names
    # the path of each, shown by the field.
    for schema, fragments in [
        ({"type": "object", "properties": {"age": {"type": "intger"}}},
         ["#/properties/age/type", "intger"]),
        ({"type": "object", "properties": {"pet": {"oneOf": [{"type": "string"}]}}},
         ["oneOf", "#/properties/pet"]),
        # Past that check, refused by web-xgrammar itself, which aborts its WebAssembly
        # instance: the error says what it said, and the next schema gets a fresh instance
        # (the Chat test below runs on it).
        ({"type": "object", "properties": {"code": {"type": "string", "pattern": "(?<=a)b"}}},
         ["web-xgrammar refused it", "Lookbehind is not supported"]),
    ]:
        page.fill("#generate-json-schema", json.dumps(schema))
        assert field_error.is_hidden()  # editing the schema clears the old error
        state = run_and_wait(page, "generate", "#generate-button", ERROR_TIMEOUT_MS)
        assert state["error"] is not None and state["error"]["name"] in (
            "GrammarError", "UnsupportedSchema"), state["error"]
        field_error.wait_for(state="visible")
        text = field_error.inner_text()
        assert all(fragment in text for fragment in fragments), text
    assert view_state(page, "generate", "s.runs") == runs_before  # nothing was generated
    page.set_checked("#generate-json-on", False)  # the page as the other tests expect it


def test_chat_json_option_answers_json_and_stays_with_its_chat(ready_page, native_twin):
    """Chat: the same option on a one-message chat gives the same ids (the same ChatML prompt),
    and each chat keeps its own JSON setting, schema included, as it keeps its numbers. (After
    the bad-schema test, this runs on a fresh web-xgrammar instance.)"""
    import jsonschema

    page = ready_page
    open_view(page, "chat")
    page.click("#chat-new")
    page.select_option("#chat-model", MODEL)
    page.evaluate("() => { document.getElementById('chat-settings').open = true;"
                  " document.getElementById('chat-json').open = true; }")
    for selector, value in (("#chat-max-tokens", OPTIONS["maxTokens"]), ("#chat-temperature", 0),
                            ("#chat-seed", OPTIONS["seed"])):
        page.fill(selector, str(value))
    schema_text = json.dumps(SCHEMA, indent=2)
    page.set_checked("#chat-json-on", True)
    page.set_checked("#chat-json-kind-schema", True)
    page.fill("#chat-json-schema", schema_text)
    page.set_checked("#chat-json-strict", True)
    page.fill("#chat-input", PROMPT)
    state = run_and_wait(page, "chat", "#chat-send", GENERATE_TIMEOUT_MS)
    assert state["error"] is None, state["error"]
    got = state["result"]
    assert got["grammar"]["engine"] == "web-xgrammar"
    jsonschema.validate(json.loads(got["text"]), SCHEMA)
    assert got["tokenIds"] == native_twin.result()["results"][0]["tokenIds"]
    shown = page.locator("#chat-turns .chat-assistant").last.locator("pre.json-answer")
    assert json.loads(shown.inner_text()) == json.loads(got["text"])  # shown formatted

    # A new chat starts with the open one's settings; turned off there, it stays off there,
    # and the first chat opens again with its schema on.
    page.click("#chat-new")
    assert page.is_checked("#chat-json-on")
    page.set_checked("#chat-json-on", False)
    page.locator("#chat-list .chat-open", has_text="Describe Paris").first.click()
    assert page.is_checked("#chat-json-on") and page.is_checked("#chat-json-kind-schema")
    assert json.loads(page.input_value("#chat-json-schema")) == SCHEMA
    page.locator("#chat-list .chat-open", has_text="New chat").first.click()
    assert not page.is_checked("#chat-json-on")
