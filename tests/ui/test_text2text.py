"""The Text-to-text view end to end in headless Chromium, and the T5 twin check.

No T5 weights can be fetched here, so the view is tested two ways:
  * offline, as a visitor finds it: the registry has no T5, so the view says how to get one,
    and a Hub repo + revision fails with that explanation (the page's request to
    huggingface.co is aborted by the network guard, i.e. offline; the test checks it was that
    exact URL and nothing else);
  * with a small random T5 v1.1 (gated GELU, untied head) written by the reference script's
    method (tests/reference/record_t5.py: numpy-seeded weights, the committed
    t5_tokenizer.json) and served from a local folder under /models/local/<name>/, as
    `candle-web serve --local-model DIR` does.

Twin check: the browser's greedy tokens equal a native run of the same session code
(candle_web.worker.t5, numpy backend, same file bytes) and the tokens transformers generated
for that model and prompt (tests/reference/t5_reference.json, recorded by record_t5.py; the
smallest top-1/top-2 logit margin of that generation is 6e-3, far above f32 rounding noise).
"""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from tests.ui.text_views_testlib import (NativeTextJobs, leave_page_as_found, open_view,
                                         run_and_wait, view_state)

REFERENCE_DIR = Path(__file__).resolve().parents[1] / "reference"
CONFIG = "v1_1"
LOCAL_NAME = "t5-random-v1_1"
FOLDER_URL = f"models/local/{LOCAL_NAME}/"
SUMMARIZE = "summarize: "
# record_t5.PROMPTS[1] without its task prefix: the view adds the "summarize: " preset.
SUMMARIZE_TEXT = "the quick brown fox jumps over the lazy dog again and again"
MAX_TOKENS = 12  # record_t5.MAX_NEW_TOKENS: the reference generation's length
# A pinned t5-small commit (pipelines.DEFAULT_T5): what a visitor would type for the Hub.
HUB_REPO = "google-t5/t5-small"
HUB_REVISION = "df1b051c49625cf57a3d0d8d3863ed4d13564fe4"
RUN_TIMEOUT_MS = 120_000
LONG_REPEATS = 120  # ~1.4k tokens of the small tokenizer: past the 512-token input limit

pytestmark = pytest.mark.ui


@pytest.fixture(scope="module", autouse=True)
def page_left_as_found(ready_page):
    yield from leave_page_as_found(ready_page)


def load_recorder():
    spec = importlib.util.spec_from_file_location("record_t5", REFERENCE_DIR / "record_t5.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def t5_folder(tmp_path_factory, ui_site):
    folder = load_recorder().write_model(CONFIG, tmp_path_factory.mktemp("t5") / LOCAL_NAME)
    ui_site.local_models[LOCAL_NAME] = folder
    yield folder
    ui_site.local_models.pop(LOCAL_NAME, None)


@pytest.fixture(scope="module", autouse=True)
def native_twin(t5_folder):
    run = NativeTextJobs([{"task": "text2text", "folder": str(t5_folder),
                           "prompt": SUMMARIZE + SUMMARIZE_TEXT,
                           "options": {"maxTokens": MAX_TOKENS}}])
    yield run
    run.stop()


def reference_greedy() -> list[int]:
    reference = json.loads((REFERENCE_DIR / "t5_reference.json").read_text())
    prompts = reference["models"][CONFIG]["prompts"]
    return next(p["greedy"] for p in prompts if p["text"] == SUMMARIZE + SUMMARIZE_TEXT)


def choose_folder(page) -> None:
    page.select_option("#t2t-source", "url")
    page.fill("#t2t-folder", FOLDER_URL)


# "summarize" -> the page's lastResult (filled by the tests, in order).
BROWSER_RUNS: dict[str, dict] = {}


def test_offline_the_view_says_how_to_get_a_t5(ready_page, network_guard):
    page = ready_page
    open_view(page, "text2text")
    page.wait_for_function("() => window.candleWeb.text2text.hint !== null")
    hint = page.locator("#t2t-hint")
    assert hint.is_visible()  # the registry lists no T5
    text = hint.inner_text()
    assert "No T5 weights are available offline" in text
    assert "candle-web serve --local-model DIR" in text and "candle-web text2text --model DIR" in text
    assert page.locator("#t2t-source").input_value() == "url"
    assert page.locator("#t2t-folder").is_visible() and page.locator("#t2t-repo").is_hidden()

    page.select_option("#t2t-source", "hub")
    assert page.locator("#t2t-repo").is_visible() and page.locator("#t2t-folder").is_hidden()
    page.fill("#t2t-repo", HUB_REPO)
    page.fill("#t2t-revision", HUB_REVISION)
    mark = network_guard.mark()
    state = run_and_wait(page, "text2text", "#t2t-button", RUN_TIMEOUT_MS)
    # The request off 127.0.0.1 was the expected one (and it is forgotten, so it does not fail
    # this test): the page asked the Hub for the first file and stopped there.
    blocked = network_guard.forget_since(mark)
    assert blocked == [f"https://huggingface.co/{HUB_REPO}/resolve/{HUB_REVISION}/config.json"]
    assert state["error"]["name"] == "NetworkError"
    error = page.locator("#t2t-error")
    assert error.is_visible()
    shown = error.inner_text()
    assert shown.startswith(f"NetworkError: could not fetch https://huggingface.co/{HUB_REPO}/")
    assert shown.endswith("The note above says how to get a T5 here.")
    assert page.locator("#t2t-hint code").first.inner_text() == "candle-web serve --local-model DIR"
    assert page.locator("#t2t-job").get_attribute("data-state") == "error"


def test_empty_input_gets_an_inline_message(ready_page):
    page = ready_page
    choose_folder(page)
    runs_before = view_state(page, "text2text", "s.runs")
    page.fill("#t2t-input", " \n ")
    page.click("#t2t-button")
    page.wait_for_function("() => document.getElementById('t2t-error').textContent"
                           ".startsWith('Type a text first')")
    assert page.locator("#t2t-error").get_attribute("role") == "alert"
    assert view_state(page, "text2text", "[s.runs, s.busy]") == [runs_before, False]


def test_local_t5_summarizes_with_streamed_output(ready_page, report):
    page = ready_page
    choose_folder(page)
    page.select_option("#t2t-task", SUMMARIZE)
    page.fill("#t2t-input", SUMMARIZE_TEXT)
    page.fill("#t2t-max-tokens", str(MAX_TOKENS))
    state = run_and_wait(page, "text2text", "#t2t-button", RUN_TIMEOUT_MS)
    assert state["error"] is None, state["error"]
    load = state["load"]
    assert load["key"] == f"url:{FOLDER_URL}" and load["source"] == "url"
    assert load["verified"] is False and load["cached"] is False  # no sha256 for a folder
    assert load["model"]["gated"] is True and load["model"]["decoderLayers"] == 3
    result = state["result"]
    BROWSER_RUNS["summarize"] = result
    assert result["prompt"] == SUMMARIZE + SUMMARIZE_TEXT
    assert result["truncated"] is False and page.locator("#t2t-notice").is_hidden()
    assert len(result["tokenIds"]) == MAX_TOKENS and result["stopReason"] == "max_tokens"
    # Streamed piece by piece; the pieces add up to the text shown.
    assert state["streamed"]["tokens"] == MAX_TOKENS
    assert state["streamed"]["text"] == result["text"]
    assert page.locator("#t2t-output").inner_text() == result["text"].strip()
    assert page.locator("#t2t-error").is_hidden()  # the earlier message is gone
    report(f"[ui] text2text (random T5 v1.1 from /models/local/): {MAX_TOKENS} tokens in "
           f"{result['timings']['elapsedMs'] / 1000:.2f} s; build "
           f"{load['timingsMs']['build'] / 1000:.2f} s")


def test_over_long_input_is_truncated_with_a_visible_notice(ready_page):
    page = ready_page
    page.select_option("#t2t-task", "translate English to German: ")
    page.fill("#t2t-input", " ".join([SUMMARIZE_TEXT] * LONG_REPEATS))
    page.fill("#t2t-max-tokens", "3")
    state = run_and_wait(page, "text2text", "#t2t-button", RUN_TIMEOUT_MS)
    assert state["error"] is None, state["error"]
    assert state["events"] == []  # the model stayed loaded
    result = state["result"]
    assert result["truncated"] is True
    assert result["inputTokens"] == result["maxInputTokens"] == 512
    assert result["fullInputTokens"] > 512
    notice = page.locator("#t2t-notice")
    assert notice.is_visible()
    assert notice.inner_text() == (f"Truncated: the input has {result['fullInputTokens']} "
                                   "tokens; only the first 512 (the model's limit of 512) "
                                   "were used.")
    assert len(result["tokenIds"]) == 3


def test_twin_browser_tokens_equal_native_numpy_and_transformers(ready_page, native_twin,
                                                                 report):
    page = ready_page
    if "summarize" not in BROWSER_RUNS:  # when run alone
        test_local_t5_summarizes_with_streamed_output(ready_page, report)
    browser = BROWSER_RUNS["summarize"]
    native = native_twin.result()
    assert native["backend"] == "numpy"
    twin = native["results"][0]
    assert browser["inputTokens"] == twin["inputTokens"]
    assert browser["tokenIds"] == twin["tokenIds"]
    assert browser["text"] == twin["text"]
    assert browser["tokenIds"] == reference_greedy()  # what transformers generated
    assert len(set(browser["tokenIds"])) > 3  # a varied sequence, not one repeated token
    assert view_state(page, "text2text", "s.lastError") is None
    report(f"[ui] twin check (random T5 v1.1, browser vs native numpy vs transformers): "
           f"{len(browser['tokenIds'])} ids equal")


def test_worker_commands_refuse_bad_requests_with_typed_errors(ready_page):
    """The text commands straight through the worker protocol, without the views' checks."""
    outcome = ready_page.evaluate("""async () => {
        const client = window.candleWeb.client;
        const describe = (promise) => promise.then(
            () => ({name: 'no error'}), (e) => ({name: e.name, message: e.message}));
        return {
            kind: await describe(client.request('load', {kind: 'nope', model: 'x'})),
            wrongKind: await describe(client.request('load',
                {kind: 'bert', model: 'smollm2-135m-instruct'})),
            climbing: await describe(client.request('load', {kind: 't5', url: '../secret/'})),
            twoNames: await describe(client.request('load',
                {kind: 't5', url: 'models/local/x/', model: 'y'})),
            llamaFolder: await describe(client.request('load',
                {kind: 'llama', url: 'models/local/x/'})),
            notAList: await describe(client.request('embed', {model: 'x', sentences: 'text'})),
            notLoaded: await describe(client.request('embed',
                {model: 'all-minilm-l6-v2-not-loaded', sentences: ['a']})),
            generateNotLoaded: await describe(client.request('generate',
                {model: 'nope', prompt: 'hi', chat: false})),
            t5NotLoaded: await describe(client.request('text2text', {model: 'nope', prompt: 'hi'})),
        };
    }""")
    assert outcome["kind"]["name"] == "UnsupportedError"
    assert "known: whisper, bert, llama, t5" in outcome["kind"]["message"]
    assert outcome["wrongKind"] == {
        "name": "ModelNotFound",
        "message": "load: registry model 'smollm2-135m-instruct' is a llama "
                   "model; browser bert models: all-minilm-l6-v2"}
    assert outcome["climbing"]["name"] == "ModelNotFound"
    assert "must be a path on this server ending in '/'" in outcome["climbing"]["message"]
    assert "name exactly one of" in outcome["twoNames"]["message"]
    # A LLaMA folder on the server is taken now (its model.gguf: bench/browser_llm.py serves
    # requantized files so); a folder that does not hold one is named with the missing file.
    assert outcome["llamaFolder"]["name"] == "ModelNotFound", outcome["llamaFolder"]
    assert "models/local/x/model.gguf answered 404" in outcome["llamaFolder"]["message"]
    assert outcome["notAList"] == {"name": "FormatError",
                                   "message": "embed: `sentences` must be an array of strings"}
    for name in ("notLoaded", "generateNotLoaded", "t5NotLoaded"):
        assert outcome[name]["name"] == "ModelNotFound", outcome[name]
        assert "is not loaded" in outcome[name]["message"]
