"""The Generate view end to end in headless Chromium, and the LLaMA twin check.

Real inputs only: the registry's SmolLM2-135M-Instruct Q4_1 GGUF (tokenizer and ChatML
template inside), served by `candle-web serve` and downloaded by the worker into the Cache API.

Twin check: the greedy tokens of the view for the ChatML prompt "What is the capital of
France?" must equal those of a native run of the same session code (candle_web.worker.llama,
numpy backend, built from the same GGUF bytes) in a subprocess started with the module. Greedy
picks the argmax: the browser's sgemm and native BLAS add in different orders, so the logits
differ in the last bits, but the ids must be equal -- a flip would be a near-tie worth looking
at, not a tolerance question. The same holds for a seeded top-k/top-p sample: both sides draw
from numpy's PCG64 with the same seed, so the sampled ids must be equal too.
"""
from __future__ import annotations

import pytest
from tests.ui.text_views_testlib import (NativeTextJobs, leave_page_as_found, open_view,
                                         run_and_wait, view_state)

MODEL = "smollm2-135m-instruct"
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
QUESTION = "What is the capital of France?"
GREEDY_OPTIONS = {"maxTokens": 24, "temperature": 0, "seed": 299792458, "repeatPenalty": 1}
SAMPLED_PROMPT = "Name three colours."
SAMPLED_OPTIONS = {"maxTokens": 8, "temperature": 0.8, "topK": 40, "topP": 0.9, "seed": 42,
                   "repeatPenalty": 1.1}
STORY_PROMPT = "Write a long story about a dragon who learns to bake bread."
# Loading dequantizes 98 MB of Q4_1 blocks to f32 in wasm; then a few tokens a second on a
# busy 2-core machine. Generous, since other test processes share the cores.
GENERATE_TIMEOUT_MS = 400_000
CANCEL_TIMEOUT_MS = 60_000

pytestmark = pytest.mark.ui


@pytest.fixture(scope="module", autouse=True)
def page_left_as_found(ready_page, saved_choices_left_as_found):
    yield from leave_page_as_found(ready_page)


# "greedy" / "sampled" -> the page's lastResult of that run (filled by the tests, in order).
BROWSER_RUNS: dict[str, dict] = {}

FORM_IDS = {"maxTokens": "#generate-max-tokens", "temperature": "#generate-temperature",
            "topK": "#generate-top-k", "topP": "#generate-top-p", "seed": "#generate-seed",
            "repeatPenalty": "#generate-repeat-penalty"}


@pytest.fixture(scope="module", autouse=True)
def native_twin(model_file):
    gguf = str(model_file(MODEL, GGUF))
    run = NativeTextJobs([
        {"task": "generate", "gguf": gguf, "prompt": QUESTION, "chat": True,
         "options": GREEDY_OPTIONS},
        {"task": "generate", "gguf": gguf, "prompt": SAMPLED_PROMPT, "chat": True,
         "options": SAMPLED_OPTIONS},
    ])
    yield run
    run.stop()


def fill_form(page, prompt: str, chat: bool, options: dict) -> None:
    page.fill("#generate-prompt", prompt)
    page.set_checked("#generate-chat", chat)
    for name, selector in FORM_IDS.items():
        value = options.get(name)
        page.fill(selector, "" if value is None else str(value))


def test_controls_are_labelled_and_bad_input_is_refused_inline(ready_page):
    page = ready_page
    open_view(page, "generate")
    for selector in ("#generate-model", "#generate-prompt", *FORM_IDS.values()):
        control_id = selector[1:]
        assert page.locator(f"label[for={control_id}]").count() == 1, control_id
    assert page.locator("#generate-chat").is_checked()  # chat is the default
    assert page.locator("#generate-stop").is_disabled()
    page.wait_for_function("() => document.querySelector('#generate-model option').dataset.size")
    from candle_web import hub

    option = page.locator("#generate-model option").first
    assert option.get_attribute("value") == MODEL
    assert int(option.get_attribute("data-size")) == hub.default_registry()[MODEL].size
    # What the view ran and loaded before (an earlier test may have used this page).
    runs_before, load_before = view_state(page, "generate", "[s.runs, s.lastLoad]")
    error = page.locator("#generate-error")
    fill_form(page, "   ", True, GREEDY_OPTIONS)
    page.click("#generate-button")
    error.wait_for(state="visible")
    assert error.inner_text().startswith("Type a prompt first")
    fill_form(page, QUESTION, True, {**GREEDY_OPTIONS, "topP": 1.5})
    page.click("#generate-button")
    page.wait_for_function("() => document.getElementById('generate-error').textContent"
                           ".startsWith('Top-p must be')")
    # refused inline: nothing ran and no model was loaded for it
    assert view_state(page, "generate", "[s.runs, s.busy, s.lastLoad]") == [runs_before, False,
                                                                            load_before]


def test_greedy_chat_answer_streams_in_with_tokens_per_second(ready_page, report):
    from candle_web import hub

    page = ready_page
    fill_form(page, QUESTION, True, GREEDY_OPTIONS)
    state = run_and_wait(page, "generate", "#generate-button", GENERATE_TIMEOUT_MS)
    assert state["error"] is None, state["error"]
    load = state["load"]
    assert load["key"] == MODEL and load["cached"] is False and load["verified"] is True
    assert load["downloadedBytes"] == hub.default_registry()[MODEL].size
    assert load["model"]["chatFormat"] == "chatml"
    result = state["result"]
    assert "Paris" in result["text"]
    assert result["renderedPrompt"].endswith(f"<|im_start|>user\n{QUESTION}<|im_end|>\n"
                                             "<|im_start|>assistant\n")
    assert result["stopReason"] == "eos"  # a short answer, ended by the model itself
    BROWSER_RUNS["greedy"] = result
    # Streamed token by token, and the streamed pieces add up to the final text.
    assert state["streamed"]["tokens"] == len(result["tokenIds"]) > 3
    assert state["streamed"]["text"] == result["text"]
    assert page.locator("#generate-output").inner_text() == result["text"].strip()
    speed = page.locator("#generate-stat-speed").inner_text()
    assert speed == f"{result['timings']['tokensPerSecond']:.1f} tok/s"
    assert page.locator("#generate-job").get_attribute("data-state") == "done"
    timings = result["timings"]
    report(f"[ui] generate (SmolLM2 Q4_1 in the browser): load {load['timingsMs']['download'] / 1000:.1f} s "
           f"download + {load['timingsMs']['build'] / 1000:.1f} s build (dequantize to f32; "
           f"{load['model']['blockWeightBytes'] / 1e6:.0f} MB of block weights); prompt "
           f"{len(result['promptIds'])} tokens at {timings['promptTokensPerSecond']:.1f} tok/s, "
           f"decode {len(result['tokenIds'])} tokens at {timings['tokensPerSecond']:.2f} tok/s: "
           f"{result['text']!r}")


def test_sampling_settings_reach_the_model(ready_page):
    page = ready_page
    fill_form(page, SAMPLED_PROMPT, True, SAMPLED_OPTIONS)
    state = run_and_wait(page, "generate", "#generate-button", GENERATE_TIMEOUT_MS)
    assert state["error"] is None, state["error"]
    assert state["events"] == []  # the model stayed loaded
    result = state["result"]
    BROWSER_RUNS["sampled"] = result
    assert result["options"] == SAMPLED_OPTIONS
    assert len(result["tokenIds"]) == SAMPLED_OPTIONS["maxTokens"]
    assert result["stopReason"] == "max_tokens"


def test_stop_button_cancels_mid_way_then_generates_again(ready_page):
    page = ready_page
    fill_form(page, STORY_PROMPT, True, {**GREEDY_OPTIONS, "maxTokens": 400})
    page.click("#generate-button")
    page.wait_for_function("() => window.candleWeb.generate.streamed.tokens >= 2",
                           timeout=GENERATE_TIMEOUT_MS)
    assert page.locator("#generate-stop").is_enabled()
    page.click("#generate-stop")
    page.wait_for_function("() => !window.candleWeb.generate.busy", timeout=CANCEL_TIMEOUT_MS)
    assert view_state(page, "generate", "s.lastError") == {"name": "Cancelled",
                                                           "message": "cancelled by the page"}
    streamed = view_state(page, "generate", "s.streamed")
    assert 2 <= streamed["tokens"] < 400
    assert page.locator("#generate-job").get_attribute("data-state") == "cancelled"
    assert page.locator("#generate-phase").inner_text() == f"Stopped after {streamed['tokens']} tokens."
    assert page.locator("#generate-output").inner_text() == streamed["text"].strip()
    assert page.locator("#generate-error").is_hidden()  # a stop is not an error
    # The worker stays usable.
    fill_form(page, QUESTION, True, {**GREEDY_OPTIONS, "maxTokens": 2})
    state = run_and_wait(page, "generate", "#generate-button", GENERATE_TIMEOUT_MS)
    assert state["error"] is None and len(state["result"]["tokenIds"]) == 2


def test_twin_browser_tokens_equal_native_numpy(ready_page, native_twin, report):
    page = ready_page
    runs = {"greedy": (QUESTION, GREEDY_OPTIONS), "sampled": (SAMPLED_PROMPT, SAMPLED_OPTIONS)}
    for name, (prompt, options) in runs.items():
        if name not in BROWSER_RUNS:  # not done by a test above (e.g. run alone)
            open_view(page, "generate")
            fill_form(page, prompt, True, options)
            state = run_and_wait(page, "generate", "#generate-button", GENERATE_TIMEOUT_MS)
            assert state["error"] is None, state["error"]
            BROWSER_RUNS[name] = state["result"]
    native = native_twin.result()
    assert native["backend"] == "numpy"
    greedy, sampled = native["results"]
    browser_greedy, browser_sampled = BROWSER_RUNS["greedy"], BROWSER_RUNS["sampled"]
    assert browser_greedy["promptIds"] == greedy["promptIds"]
    assert browser_greedy["tokenIds"] == greedy["tokenIds"]
    assert browser_greedy["text"] == greedy["text"] and "Paris" in greedy["text"]
    assert browser_sampled["promptIds"] == sampled["promptIds"]
    assert browser_sampled["tokenIds"] == sampled["tokenIds"]
    report(f"[ui] twin check (SmolLM2 Q4_1, browser vs native numpy): greedy "
           f"{len(greedy['tokenIds'])} ids equal, seeded top-k/top-p sample "
           f"{len(sampled['tokenIds'])} ids equal; decode browser "
           f"{browser_greedy['timings']['tokensPerSecond']:.2f} tok/s, native "
           f"{greedy['timings']['tokensPerSecond']:.2f} tok/s (sharing the cores with the "
           f"browser here; bench/browser.py --tasks generate measures them apart)")


# -- Qwen2.5-Coder-0.5B-Instruct (issue 23): last, since loading it replaces SmolLM2 ----------
QWEN = "qwen2.5-coder-0.5b-instruct"
QWEN_GGUF = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
QWEN_QUESTION = "What is 2+2?"
QWEN_OPTIONS = {"maxTokens": 12, "temperature": 0, "seed": 299792458, "repeatPenalty": 1}


@pytest.fixture(scope="module")
def native_qwen(model_file):
    run = NativeTextJobs([{"task": "generate", "gguf": str(model_file(QWEN, QWEN_GGUF)),
                           "prompt": QWEN_QUESTION, "chat": True, "options": QWEN_OPTIONS}])
    yield run
    run.stop()


def test_qwen_is_offered_with_its_licence_and_its_greedy_answer_equals_native(
        ready_page, native_qwen, report):
    """The picker offers Qwen2.5-Coder (491 MB, Apache-2.0) next to SmolLM2; its greedy chat
    answer in the page (the model's own ChatML template from the GGUF, the wasm fused step
    with the q|k|v bias) has the ids of the native numpy run of the same session code."""
    page = ready_page
    open_view(page, "generate")
    page.wait_for_function(
        f"() => document.querySelector('#generate-model option[value=\"{QWEN}\"]')")
    labels = page.eval_on_selector_all("#generate-model option", "os => os.map(o => o.textContent)")
    assert any("Qwen2.5-Coder-0.5B-Instruct" in t and "Apache-2.0" in t for t in labels), labels
    assert any("SmolLM2" in t and "Apache-2.0" in t for t in labels), labels
    assert not any("Gemma" in t for t in labels), "Gemma is offered only with ?models=all"
    page.select_option("#generate-model", QWEN)
    fill_form(page, QWEN_QUESTION, True, QWEN_OPTIONS)
    state = run_and_wait(page, "generate", "#generate-button", GENERATE_TIMEOUT_MS)
    assert state["error"] is None, state["error"]
    browser = state["result"]
    native = native_qwen.result()["results"][0]
    assert browser["promptIds"] == native["promptIds"]
    assert browser["tokenIds"] == native["tokenIds"]
    assert "4" in browser["text"]
    note = page.text_content("#generate-model-note")
    assert "Licence: Apache-2.0" in note
    assert browser["heap"]["endBytes"] <= 1.5 * 491_400_064 + 400 * 2**20
    report(f"[ui] Qwen2.5-Coder-0.5B Q4_K_M in the page: greedy {len(native['tokenIds'])} ids "
           f"equal native numpy; decode {browser['timings']['tokensPerSecond']:.2f} tok/s; "
           f"worker heap {browser['heap']['endBytes'] / 2**20:.0f} MiB after the run")


GEMMA = "gemma3-270m-q4km"
GEMMA_PROMPT = "The capital of France is"
GEMMA_OPTIONS = {"maxTokens": 6, "temperature": 0, "seed": 299792458, "repeatPenalty": 1}


def test_gemma_loads_only_with_the_url_option_shows_its_terms_and_equals_native(
        ready_page_at, model_file):
    """Gemma-3-270M (base model, Gemma terms) is not offered by default (the test above saw
    the plain picker); with ?models=all it is, loads, and its greedy continuation (gemma3 runs
    the reference path: the fused step lacks its q/k norms) has the native run's ids; the
    Gemma terms are shown once it is loaded."""
    native = NativeTextJobs([{"task": "generate",
                              "gguf": str(model_file(GEMMA, "gemma-3-270m-Q4_K_M.gguf")),
                              "prompt": GEMMA_PROMPT, "chat": False, "options": GEMMA_OPTIONS}])
    try:
        page = ready_page_at("/?models=all")
        open_view(page, "generate")
        page.wait_for_function(
            f"() => document.querySelector('#generate-model option[value=\"{GEMMA}\"]')")
        label = page.text_content(f"#generate-model option[value=\"{GEMMA}\"]")
        assert "Gemma Terms of Use" in label, label
        page.select_option("#generate-model", GEMMA)
        fill_form(page, GEMMA_PROMPT, False, GEMMA_OPTIONS)
        state = run_and_wait(page, "generate", "#generate-button", GENERATE_TIMEOUT_MS)
        assert state["error"] is None, state["error"]
        note = page.text_content("#generate-model-note")
        assert "Gemma Terms of Use" in note and "ai.google.dev/gemma/terms" in note, note
        want = native.result()["results"][0]
        assert state["result"]["promptIds"] == want["promptIds"]
        assert state["result"]["tokenIds"] == want["tokenIds"]
    finally:
        native.stop()
