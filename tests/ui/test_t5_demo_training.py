"""The Text-to-text view while `make demo` is still training the demo T5.

The server serves a demo folder of the test's own (as `make demo` serves <cache>/demo/); the
test plays the trainer (examples/t5_spell_numbers.py --progress): it writes a progress file,
and the view must say "demo model still training: 40%", follow a newer version by polling,
then, once the model folder is renamed into place and the progress removed, offer the demo
model as its default without a reload. What the demo model then generates is
test_t5_demo.py's job, so the folder here holds just the config the view probes for.
"""
from __future__ import annotations

import json
import os
import urllib.request

import pytest
from tests.ui.text_views_testlib import open_view, view_state

DEMO_NAME = "t5-spell-numbers"
DEMO_TASK = "spell out: "
PROGRESS_FILE = f"{DEMO_NAME}.progress.json"
STEPS = 800
PAGE_READY_TIMEOUT_MS = 120_000
POLL_TIMEOUT_MS = 15_000  # the view polls every 3 s

pytestmark = pytest.mark.ui


def write_atomically(path, text: str) -> None:
    """As the trainer does: the server must never read half a version."""
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(text)
    os.replace(temporary, path)


def write_progress(demo_root, step: int) -> None:
    write_atomically(demo_root / PROGRESS_FILE, json.dumps(
        {"model": DEMO_NAME, "phase": "training", "step": step, "steps": STEPS, "loss": 1.0,
         "seconds": 10.0}))


@pytest.fixture
def demo_root(tmp_path, ui_site):
    assert DEMO_NAME not in ui_site.local_models  # it would win over the demo folder
    ui_site.demo_root = tmp_path
    yield tmp_path
    ui_site.demo_root = None


def training_note(page) -> str:
    return page.locator("#t2t-demo-training").inner_text()


def test_training_progress_then_the_model_without_a_reload(demo_root, ui_server_url,
                                                           fresh_page):
    write_progress(demo_root, 320)
    with urllib.request.urlopen(f"{ui_server_url}/models/local/{PROGRESS_FILE}") as response:
        assert json.loads(response.read())["step"] == 320

    page = fresh_page
    page.wait_for_function("() => window.candleWeb && window.candleWeb.text2text.runtimeReady",
                           timeout=PAGE_READY_TIMEOUT_MS)
    open_view(page, "text2text")
    page.wait_for_function("() => window.candleWeb.text2text.demoTraining !== null")
    assert view_state(page, "text2text", "s.demoServed") is False
    assert "Demo model still training: 40% (step 320 of 800)" in training_note(page)
    # While it trains the demo is listed (issue 35 item 11) but cannot be chosen.
    demo_option = page.locator("#t2t-source option[value='demo']")
    assert demo_option.count() == 1 and demo_option.is_disabled()
    assert page.locator("#t2t-source").input_value() != "demo"

    write_progress(demo_root, 480)
    page.wait_for_function(
        "() => document.getElementById('t2t-demo-training').textContent.includes('60%')",
        timeout=POLL_TIMEOUT_MS)

    # The trainer's order: the finished folder renamed into place, then its progress removed.
    staging = demo_root / f".{DEMO_NAME}-staging"
    staging.mkdir()
    (staging / "config.json").write_text(json.dumps({"model_type": "t5"}))
    staging.rename(demo_root / DEMO_NAME)
    (demo_root / PROGRESS_FILE).unlink()
    page.wait_for_function("() => window.candleWeb.text2text.demoServed === true",
                           timeout=POLL_TIMEOUT_MS)
    assert view_state(page, "text2text", "s.demoTraining") is None
    assert page.locator("#t2t-demo-training").is_hidden()
    # No registry T5 offline: the demo model becomes the selected default, with its task.
    assert page.locator("#t2t-source").input_value() == "demo"
    assert page.locator("#t2t-task").input_value() == DEMO_TASK
    assert "not a language model" in page.locator("#t2t-model-note").inner_text()
