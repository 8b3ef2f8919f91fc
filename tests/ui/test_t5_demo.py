"""The Text-to-text view's offline default: the demo T5 of examples/t5_spell_numbers.py.

`make demo` trains it into <cache>/demo/t5-spell-numbers/ and `candle-web serve` serves that
folder as /models/local/t5-spell-numbers/. Here a short run of the same script (a few seconds
of training, same files) is served the same way, and a new page (whose view probes the server
when it starts) must pick it as the labelled default with the "spell out: " task. Twin check:
the browser's greedy ids and text equal a native run of the same session code
(candle_web.worker.t5, numpy backend, same file bytes). That the files themselves generate
the same ids in transformers is tests/examples/test_t5_spell_numbers.py's job.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from tests.ui.text_views_testlib import NativeTextJobs, open_view, run_and_wait, view_state

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "t5_spell_numbers.py"
DEMO_NAME = "t5-spell-numbers"
DEMO_LABEL = "demo: spells out numbers (synthetic, trained by candle-web)"
DEMO_TASK = "spell out: "
DEMO_EXAMPLE = "4821"  # the view's example input for the demo
TRAIN_STEPS = 60  # enough for a varied output, not for a right one: the twin check needs ids
TRAIN_BATCH = 32
MAX_TOKENS = 64  # the view's default Max tokens
PAGE_READY_TIMEOUT_MS = 120_000
RUN_TIMEOUT_MS = 120_000

pytestmark = pytest.mark.ui


def load_example():
    spec = importlib.util.spec_from_file_location("t5_spell_numbers_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def demo_folder(tmp_path_factory, ui_site):
    example = load_example()
    with example.one_blas_thread():
        varmap = example.train(TRAIN_STEPS, TRAIN_BATCH, log=None)[0]
    folder = tmp_path_factory.mktemp("demo") / DEMO_NAME
    example.save_model(folder, varmap, TRAIN_STEPS, TRAIN_BATCH, accuracy=0.0)
    ui_site.local_models[DEMO_NAME] = folder
    yield folder
    ui_site.local_models.pop(DEMO_NAME, None)


@pytest.fixture(scope="module")
def native_twin(demo_folder):
    run = NativeTextJobs([{"task": "text2text", "folder": str(demo_folder),
                           "prompt": DEMO_TASK + DEMO_EXAMPLE,
                           "options": {"maxTokens": MAX_TOKENS}}])
    yield run
    run.stop()


def test_demo_is_the_labelled_default_and_the_browser_twins_native(demo_folder, native_twin,
                                                                   fresh_page, report):
    page = fresh_page
    page.wait_for_function("() => window.candleWeb && window.candleWeb.text2text.runtimeReady",
                           timeout=PAGE_READY_TIMEOUT_MS)
    open_view(page, "text2text")
    page.wait_for_function("() => window.candleWeb.text2text.demoServed !== null")
    assert view_state(page, "text2text", "s.demoServed") is True
    assert page.locator("#t2t-source").input_value() == "demo"
    assert page.locator("#t2t-source option:checked").inner_text() == DEMO_LABEL
    assert page.locator("#t2t-task").input_value() == DEMO_TASK
    assert page.locator("#t2t-input").input_value() == DEMO_EXAMPLE
    assert "not a language model" in page.locator("#t2t-model-note").inner_text()
    assert page.locator("#t2t-folder").is_hidden() and page.locator("#t2t-repo").is_hidden()
    # The how-to for real T5s stays: the demo is no substitute for one.
    assert "No T5 weights are available offline" in page.locator("#t2t-hint").inner_text()

    state = run_and_wait(page, "text2text", "#t2t-button", RUN_TIMEOUT_MS)
    assert state["error"] is None, state["error"]
    assert state["load"]["key"] == f"url:models/local/{DEMO_NAME}/"
    result = state["result"]
    assert result["prompt"] == DEMO_TASK + DEMO_EXAMPLE
    twin = native_twin.result()["results"][0]
    assert result["inputTokens"] == twin["inputTokens"] == 9  # ▁spell ▁out : ▁ 4 8 2 1 </s>
    assert result["tokenIds"] == twin["tokenIds"]
    assert result["text"] == twin["text"]
    assert len(set(result["tokenIds"])) > 1  # a varied sequence, not one repeated token
    assert page.locator("#t2t-output").inner_text() == result["text"].strip()
    report(f"[ui] demo T5 ({TRAIN_STEPS}-step run, browser vs native numpy): "
           f"{len(result['tokenIds'])} ids equal; output {result['text']!r}")
