"""A job that waits for another view's job says so, and the tabs show where the worker is busy.

The worker runs one Python job at a time. Real models: Generate writes with
SmolLM2-135M-Instruct while Similarity is asked to compare with all-MiniLM-L6-v2; Similarity's
status must name what it waits for (not "Loading all-MiniLM-L6-v2…" for as long as the other
job takes), both tabs carry a marker while their jobs are under way, and Similarity's own words
come back and its job finishes once Generate's is done.
"""
from __future__ import annotations

import pytest

from .conftest import ARTIFACTS_DIR

PROMPT = "Count from 1 to 200, one number per line."


@pytest.fixture
def page(module_page, model_cache_left_as_found):
    module_page.click("#tab-generate")
    return module_page


def tab_marker(page, name: str) -> dict:
    return page.evaluate("""(name) => {
        const tab = document.getElementById('tab-' + name);
        const marker = tab.querySelector('.tab-busy');
        return {busy: tab.dataset.busy ?? null, shown: marker !== null && !marker.hidden,
                words: marker ? marker.textContent : null};
    }""", name)


def test_a_job_waiting_for_another_views_job_names_it(page, report):
    page.fill("#generate-prompt", PROMPT)
    page.fill("#generate-max-tokens", "400")
    page.click("#generate-button")
    # Generate is writing (its model loaded, tokens coming): the worker is Generate's.
    page.wait_for_function(
        "() => window.candleWeb.generate.busy && window.candleWeb.generate.streamed?.tokens >= 3",
        timeout=120_000)
    page.click("#tab-similarity")
    page.click("#similarity-button")
    page.wait_for_function(
        "() => document.getElementById('similarity-job').dataset.state === 'waiting'")
    generating = page.evaluate("() => window.candleWeb.generate.busy")
    waiting_text = page.text_content("#similarity-phase")
    generate_tab = tab_marker(page, "generate")
    similarity_tab = tab_marker(page, "similarity")
    transcribe_tab = tab_marker(page, "transcribe")
    ARTIFACTS_DIR.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS_DIR / "job-waiting-for-another-view.png"))
    assert generating, "Generate finished before the check: make its answer longer"
    assert waiting_text == ("Waiting for Generate to finish "
                            "(generating with smollm2-135m-instruct)…"), waiting_text
    assert generate_tab == {"busy": "running", "shown": True, "words": "working"}
    assert similarity_tab == {"busy": "waiting", "shown": True, "words": "waiting"}
    assert transcribe_tab == {"busy": None, "shown": False, "words": ""}

    # Once Generate is done, Similarity's turn comes: its own words, then its result.
    page.wait_for_function(
        "() => document.getElementById('similarity-job').dataset.state === 'done'",
        timeout=120_000)
    assert not page.evaluate("() => window.candleWeb.generate.busy")
    assert page.evaluate("() => window.candleWeb.similarity.lastResult.count") == 4
    for name in ("generate", "similarity"):
        assert tab_marker(page, name)["busy"] is None
    report(f"[ui] while Generate wrote, Similarity said: {waiting_text!r}")
