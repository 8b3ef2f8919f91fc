"""Models' own chat templates in the page: the worker installs the vendored Jinja2 and
MarkupSafe wheels (scripts/vendor_pyodide.py: Jinja2 from PyPI, MarkupSafe built pure from its
sdist), so the Generate (chat) and Chat views render a GGUF's `tokenizer.chat_template` with
Jinja2 as `chat_template_for` does natively.

Reference: the native `chat_template_for(model, tokenizer).render(...)` of the same GGUF
(jinja2 in the dev venv), encoded without special tokens: the page's prompt ids must equal
those ids, and its greedy answer (8 tokens) the native run's ids (greedy ids are compared
exactly, as in test_generate.py). Both templates insert a default system prompt ("You are
Qwen, created by Alibaba Cloud...", "...named SmolLM...") when the conversation has none; the
native render is checked to contain it. The built-in ChatML renderer also copies such a literal
default, so the ids alone would not show which engine ran: the load reply's `chatTemplate` and
the worker's own `import jinja2` (3.1.6, MarkupSafe without `_speedups`) do. Then the
fallback: with the Jinja2 wheel answering 404 the page still starts, the Chat view still
answers, and its model note says the built-in format is used.
"""
from __future__ import annotations

import pytest

from tests.ui.text_views_testlib import NativeTextJobs, leave_page_as_found, open_view, run_and_wait

SMOLLM2 = "smollm2-135m-instruct"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
QWEN = "qwen2.5-coder-0.5b-instruct"
QWEN_GGUF = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
DEFAULT_SYSTEM = {SMOLLM2: "You are a helpful AI assistant named SmolLM",
                  QWEN: "You are Qwen, created by Alibaba Cloud."}
PROMPT = "Say hello in French."
MAX_TOKENS = 8
OPTIONS = {"maxTokens": MAX_TOKENS, "temperature": 0, "seed": 299792458, "repeatPenalty": 1}
# A model's first load (download, build) and a few tokens a second on a busy 2-core machine:
# generous, a hang fails; the pace is not tested.
RUN_TIMEOUT_MS = 400_000
FORM = {"maxTokens": "#generate-max-tokens", "temperature": "#generate-temperature",
        "topK": "#generate-top-k", "topP": "#generate-top-p", "seed": "#generate-seed",
        "repeatPenalty": "#generate-repeat-penalty"}

pytestmark = pytest.mark.ui


@pytest.fixture(scope="module", autouse=True)
def _left_as_found(ready_page, model_cache_left_as_found):
    yield from leave_page_as_found(ready_page)


@pytest.fixture(scope="module")
def page(ready_page_at):
    """A page of this module's own: its Generate and Chat views load models, and later modules
    (test_generate) expect the shared ready_page's views as they open, their first load a
    download (the model cache is put back by model_cache_left_as_found)."""
    return ready_page_at("/#generate")


@pytest.fixture(scope="module")
def gguf_paths(model_file) -> dict:
    return {SMOLLM2: str(model_file(SMOLLM2, SMOLLM2_GGUF)),
            QWEN: str(model_file(QWEN, QWEN_GGUF))}


@pytest.fixture(scope="module")
def native_answers(gguf_paths):
    """The Generate view's session code natively (numpy, a subprocess running while the
    browser works): the greedy chat answer to PROMPT on each model."""
    run = NativeTextJobs([{"task": "generate", "gguf": gguf_paths[model], "prompt": PROMPT,
                           "chat": True, "options": OPTIONS} for model in (SMOLLM2, QWEN)])
    yield run
    run.stop()


def native_prompt_ids(gguf: str, model: str, messages: list) -> list:
    """Ids of the native Jinja render of `messages` with the model's own template."""
    from candle_web.generation.chat_templates import JinjaChatTemplate, chat_template_for
    from candle_web.pipelines import load_llama

    loaded = load_llama(gguf)
    template = chat_template_for(loaded.model, loaded.tokenizer)
    assert isinstance(template, JinjaChatTemplate)  # natively jinja2 renders it
    rendered = template.render(messages)
    assert DEFAULT_SYSTEM[model] in rendered, rendered
    return list(loaded.tokenizer.encode(rendered, add_special_tokens=False).ids)


def worker(page):
    workers = [w for w in page.workers if w.url.endswith("/worker.js")]
    assert len(workers) == 1, [w.url for w in page.workers]
    return workers[0]


JINJA_IN_WORKER_JS = """() => JSON.parse(pyodide.runPython(`
import json, sys
try:
    import jinja2, markupsafe
except ImportError as error:
    result = {"error": str(error)}
else:
    result = {"jinja2": jinja2.__version__, "markupsafe": markupsafe.__file__,
              "speedups": "markupsafe._speedups" in sys.modules,
              "escape": str(markupsafe.escape("<a>"))}
json.dumps(result)
`))"""


def test_the_worker_imports_the_vendored_jinja2(ready_page, ready_summary):
    assert ready_summary["chatTemplates"] == {"jinja2": True, "reason": None}
    found = worker(ready_page).evaluate(JINJA_IN_WORKER_JS)
    assert found.get("error") is None, found
    assert found["jinja2"] == "3.1.6"
    assert found["markupsafe"].endswith("site-packages/markupsafe/__init__.py")
    assert found["speedups"] is False
    assert found["escape"] == "&lt;a&gt;"


def generate_chat(page, model: str) -> dict:
    open_view(page, "generate")
    page.wait_for_function(
        f"() => document.querySelector('#generate-model option[value=\"{model}\"]')")
    page.select_option("#generate-model", model)
    page.fill("#generate-prompt", PROMPT)
    page.set_checked("#generate-chat", True)
    for name, selector in FORM.items():
        page.fill(selector, str(OPTIONS.get(name, "")))
    state = run_and_wait(page, "generate", "#generate-button", RUN_TIMEOUT_MS)
    assert state["error"] is None, state["error"]
    return state


@pytest.mark.parametrize("model", [SMOLLM2, QWEN])  # Qwen last: its load replaces SmolLM2
def test_generate_chat_renders_the_models_own_template(page, gguf_paths, native_answers,
                                                       model, report):
    state = generate_chat(page, model)
    assert state["load"]["model"]["chatTemplate"] == "jinja"
    assert state["load"]["model"]["chatTemplateNote"] is None
    browser = state["result"]
    messages = [{"role": "user", "content": PROMPT}]
    assert browser["promptIds"] == native_prompt_ids(gguf_paths[model], model, messages)
    assert DEFAULT_SYSTEM[model] in browser["renderedPrompt"]
    native = native_answers.result()["results"][(SMOLLM2, QWEN).index(model)]
    assert browser["tokenIds"] == native["tokenIds"]
    assert len(browser["tokenIds"]) <= MAX_TOKENS
    report(f"[ui] {model}: the page's Jinja render gives {len(browser['promptIds'])} prompt ids "
           f"and {len(browser['tokenIds'])} greedy ids, equal to native")


def chat_state(page, expression: str):
    return page.evaluate(f"() => {{ const s = window.candleWeb.chat; return {expression}; }}")


def chat_turn(page, model: str, text: str) -> dict:
    """One fresh conversation on `model` in the Chat view (no system prompt): the turn's
    result."""
    page.click("#tab-chat")
    page.wait_for_function("() => window.candleWeb.chat.runtimeReady")
    page.click("#chat-new")
    page.select_option("#chat-model", model)
    if not page.locator("#chat-settings").evaluate("(node) => node.open"):
        page.click("#chat-settings summary")  # folded below the conversation
    page.fill("#chat-system", "")
    page.dispatch_event("#chat-system", "change")
    page.fill("#chat-max-tokens", str(MAX_TOKENS))
    page.fill("#chat-temperature", "0")
    page.fill("#chat-context", "")
    before = chat_state(page, "s.runs")
    page.fill("#chat-input", text)
    page.click("#chat-send")
    page.wait_for_function("(before) => { const s = window.candleWeb.chat;"
                           " return !s.busy && (s.runs > before || s.lastError !== null); }",
                           arg=before, timeout=RUN_TIMEOUT_MS)
    error = chat_state(page, "s.lastError")
    assert error is None, error
    return chat_state(page, "s.lastResult")


def native_chat_answer(gguf: str, text: str) -> list:
    """Greedy ids of a fresh native Conversation's answer to `text` (what `candle-web chat`
    runs)."""
    from candle_web.generation import GenerationOptions
    from candle_web.generation.conversation import Conversation
    from candle_web.pipelines import load_llama

    loaded = load_llama(gguf)
    turn = Conversation(loaded.model, loaded.tokenizer).send(
        text, GenerationOptions(max_new_tokens=MAX_TOKENS))
    return list(turn.token_ids)


def test_chat_view_renders_the_models_own_template(page, gguf_paths):
    result = chat_turn(page, SMOLLM2, PROMPT)
    assert chat_state(page, "s.lastLoad.model.chatTemplate") == "jinja"
    assert "Note:" not in page.text_content("#chat-model-note")
    messages = [{"role": "user", "content": PROMPT}]
    assert result["promptTokens"] == len(native_prompt_ids(gguf_paths[SMOLLM2], SMOLLM2,
                                                           messages))
    assert result["tokenIds"] == native_chat_answer(gguf_paths[SMOLLM2], PROMPT)


def test_generate_loads_its_model_again_after_chat_replaced_it(page, native_answers):
    """The worker holds one llama model: Generate ran Qwen, then the Chat turn above loaded
    SmolLM2 in its place. Generate's next Qwen run loads Qwen again (from the browser's cache)
    and answers as before, instead of failing with ModelNotFound (WorkerClient.holds)."""
    state = generate_chat(page, QWEN)
    assert state["load"]["key"] == QWEN and state["load"]["cached"] is True
    native = native_answers.result()["results"][1]
    assert state["result"]["tokenIds"] == native["tokenIds"]


def test_without_the_jinja2_wheel_the_page_falls_back_and_says_so(open_ui_page, page_ready,
                                                                  gguf_paths):
    page = open_ui_page("/", routes={"**/vendor/wheels/jinja2-*.whl":
                                     lambda route: route.fulfill(status=404, body="gone")})
    summary = page_ready(page)
    assert summary["chatTemplates"]["jinja2"] is False
    assert "404" in summary["chatTemplates"]["reason"], summary["chatTemplates"]
    assert "No module named 'jinja2'" in worker(page).evaluate(JINJA_IN_WORKER_JS)["error"]
    result = chat_turn(page, SMOLLM2, PROMPT)
    assert chat_state(page, "s.lastLoad.model.chatTemplate") == "builtin"
    note = page.text_content("#chat-model-note")
    assert "built-in chatml format, not the model's own template" in note, note
    assert "jinja2 is not loaded in this page" in note, note
    # SmolLM2's template is plain ChatML with a literal default system prompt, which the
    # built-in renderer reproduces: the same prompt and answer as Jinja's.
    messages = [{"role": "user", "content": PROMPT}]
    assert result["promptTokens"] == len(native_prompt_ids(gguf_paths[SMOLLM2], SMOLLM2,
                                                           messages))
    assert result["tokenIds"] == native_chat_answer(gguf_paths[SMOLLM2], PROMPT)
