"""Text-to-text offline, as a person first meets it: the demo model is in the list (choosable
once this server has trained it, otherwise listed with what trains it), and Run stays disabled,
saying why beside it, until the chosen source can run: a folder given, or a Hub repository
with a 40-character commit. No model is loaded here (test_text2text.py and test_t5_demo.py
run them)."""
from __future__ import annotations

import pytest
from tests.ui.text_views_testlib import FIRST_TAB, open_view

pytestmark = pytest.mark.ui

DEMO_LABEL = "demo: spells out numbers (synthetic, trained by candle-web)"
COMMIT = "df1b051c49625cf57a3d0d8d3863ed4d13564fe4"


@pytest.fixture(scope="module")
def page(ready_page):
    yield from _opened(ready_page)


def _opened(page):
    open_view(page, "text2text")
    page.wait_for_function("() => window.candleWeb.text2text.demoServed !== null")
    before = page.evaluate("""() => ({source: document.getElementById('t2t-source').value,
        folder: document.getElementById('t2t-folder').value})""")
    yield page
    page.evaluate("""(before) => {
        for (const id of ['t2t-repo', 't2t-revision']) document.getElementById(id).value = '';
        document.getElementById('t2t-folder').value = before.folder;
        const source = document.getElementById('t2t-source');
        source.value = before.source;
        source.dispatchEvent(new Event('change'));
    }""", before)
    page.click(FIRST_TAB)  # the other modules expect the page as it opens


def run_state(page) -> dict:
    return page.evaluate("""() => {
        const button = document.getElementById('t2t-button');
        const note = document.getElementById('t2t-run-note');
        return {disabled: button.disabled, note: note.hidden ? null : note.textContent,
                describedBy: button.getAttribute('aria-describedby')};
    }""")


def test_the_demo_is_offered_and_run_waits_for_a_runnable_source(page):
    options = page.evaluate("""() => Array.from(document.getElementById('t2t-source').options,
        (o) => ({value: o.value, text: o.textContent, disabled: o.disabled}))""")
    demo = next(option for option in options if option["value"] == "demo")
    if page.evaluate("() => window.candleWeb.text2text.demoServed"):
        assert demo == {"value": "demo", "text": DEMO_LABEL, "disabled": False}
        page.select_option("#t2t-source", "demo")
        assert run_state(page)["disabled"] is False
    else:
        assert demo == {"value": "demo", "disabled": True, "text": DEMO_LABEL
                        + ": not trained on this server yet: make demo trains it in a minute or two"}
        assert page.locator("#t2t-hint").is_visible()  # and what a real T5 needs
        assert "No T5 weights are available offline" in page.inner_text("#t2t-hint")

    page.select_option("#t2t-source", "url")
    page.fill("#t2t-folder", "")
    state = run_state(page)
    assert state == {"disabled": True, "describedBy": "t2t-run-note", "note": (
        "Run needs a model: give the folder on this server that holds a T5, "
        "or choose another source.")}
    page.fill("#t2t-folder", "models/local/my-t5/")
    assert run_state(page) == {"disabled": False, "note": None, "describedBy": "t2t-run-note"}

    page.select_option("#t2t-source", "hub")
    page.fill("#t2t-repo", "google-t5/t5-small")
    page.fill("#t2t-revision", "main")  # a branch moves: a commit is needed
    state = run_state(page)
    assert state["disabled"] and state["note"].startswith(
        "Run needs a model: give the Hub repository (owner/name) and its 40-character commit")
    page.fill("#t2t-revision", COMMIT)
    assert run_state(page)["disabled"] is False
