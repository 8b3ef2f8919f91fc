"""axe-core (npm, node_modules/axe-core: a test dependency in package.json) on every view of the
page at a phone's 390x844 and a laptop's 1280x800: no serious or critical violation, all of its
default rules (WCAG 2.0-2.2 A/AA and best practices). Plus what axe cannot see: the words of a
transcript with word timestamps are reachable and playable by keyboard (one tab stop for the
transcript, arrow keys between words, Enter plays from the word), as a mouse click on one is.

The shared ready page is used as the earlier tests left it (a transcript, a chat, results:
more of the page to check than a blank one); its size is put back afterwards.
"""
from __future__ import annotations

from pathlib import Path

import pytest
from tests.ui.transcribe_testlib import (MODEL_TINY, choose_model, run_to_end, sample_file,
                                         drop_files, wait_idle_with_clip)

REPO_ROOT = Path(__file__).resolve().parents[2]
AXE = REPO_ROOT / "node_modules" / "axe-core" / "axe.min.js"
# Every view the page's tab list has (a view added later is checked too).
VIEWS_JS = "() => Array.from(document.querySelectorAll('[role=tab]'), (tab) => tab.id.replace(/^tab-/, ''))"
SIZES = {"phone": (390, 844), "laptop": (1280, 800)}
BLOCKING = ("serious", "critical")
CLIP = "sense_and_sensibility_01_austen_64kb-0880.wav"


@pytest.fixture(scope="module")
def page(module_page):
    # A page of the module's own: the keyboard test loads whisper-tiny.en and ticks word
    # timestamps, which later modules' tests on the shared page must not inherit.
    if not AXE.is_file():
        pytest.fail(f"{AXE} missing: run `make node-deps` (npm ci)", pytrace=False)
    module_page.add_script_tag(content=AXE.read_text())
    return module_page


def violations(page) -> list[dict]:
    return page.evaluate("""async (blocking) => {
        const report = await axe.run(document, {resultTypes: ['violations']});
        return report.violations.filter((v) => blocking.includes(v.impact)).map((v) => ({
            id: v.id, impact: v.impact, help: v.help,
            nodes: v.nodes.slice(0, 5).map((n) => n.target.join(' ')),
        }));
    }""", list(BLOCKING))


def on_each_view(page, size: str, check) -> dict:
    """{view: check(page)} with each view open in turn at SIZES[size] (Playwright's page, or
    tests/ui_firefox's, which has the same methods)."""
    page.set_viewport_size(dict(zip(("width", "height"), SIZES[size])))
    found = {}
    for view in page.evaluate(VIEWS_JS):
        page.click(f"#tab-{view}")
        page.wait_for_function(f"() => !document.getElementById('panel-{view}').hidden")
        found[view] = check(page)
    return found


@pytest.mark.parametrize("size", SIZES)
def test_no_serious_or_critical_axe_violation_on_any_view(page, size, report):
    found = on_each_view(page, size, violations)
    assert len(found) >= 5 and found == {view: [] for view in found}
    report(f"[ui] axe-core {page.evaluate('() => axe.version')}: no serious or critical "
           f"violation on {len(found)} views at {SIZES[size][0]}x{SIZES[size][1]}")


def test_transcript_words_are_reachable_and_playable_by_keyboard(page, model_cache_left_as_found):
    page.set_viewport_size({"width": 1280, "height": 800})
    page.click("#tab-transcribe")
    choose_model(page, MODEL_TINY)
    if not page.is_checked("#word-timestamps"):
        page.click("#advanced-options summary")
        page.check("#word-timestamps")
    drop_files(page, [sample_file(CLIP)])
    wait_idle_with_clip(page, CLIP)
    run_to_end(page)
    words = page.locator("#segments span.word")
    assert words.count() >= 5
    # One tab stop for the words: the first; the rest are reached with the arrow keys.
    assert page.evaluate("""() => Array.from(document.querySelectorAll('#segments span.word'),
        (w) => w.tabIndex)""") == [0] + [-1] * (words.count() - 1)
    words.nth(0).focus()
    page.keyboard.press("ArrowRight")
    page.keyboard.press("ArrowRight")
    focused = page.evaluate("() => document.activeElement.textContent")
    assert focused == words.nth(2).text_content()
    page.keyboard.press("End")
    assert page.evaluate("() => document.activeElement.textContent") == \
        words.nth(words.count() - 1).text_content()
    page.keyboard.press("Home")
    page.keyboard.press("ArrowRight")
    page.keyboard.press("ArrowRight")
    page.keyboard.press("Enter")  # plays from the focused word, as a click does
    start = float(words.nth(2).get_attribute("data-start"))
    position = page.evaluate("() => document.getElementById('clip-player').currentTime")
    assert position == pytest.approx(start, abs=0.05)  # the player's seek granularity
    # The focused word keeps the one tab stop (Tab leaves the transcript and comes back to it).
    assert page.evaluate("() => document.activeElement.tabIndex") == 0
