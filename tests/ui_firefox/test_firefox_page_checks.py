"""The Chromium suite's page checks that cost little here, in Firefox ESR: on every view, at a
phone's 390x844 and a laptop's 1280x800, axe-core finds no serious or critical violation
(tests/ui/test_page_accessibility.py) and nothing makes the page scroll sideways (the layout
holds at both sizes). Run on the suite's shared started page, its size put back afterwards."""
from __future__ import annotations

import pytest
from tests.ui.test_page_accessibility import AXE, BLOCKING, SIZES, on_each_view

pytestmark = pytest.mark.ui

CHECK_JS = """async (blocking) => {
    const report = await axe.run(document, {resultTypes: ['violations']});
    const root = document.documentElement;
    return {
        violations: report.violations.filter((v) => blocking.includes(v.impact))
            .map((v) => `${v.id} (${v.impact}): ${v.nodes.slice(0, 5).map((n) => n.target.join(' ')).join(', ')}`),
        overflow: root.scrollWidth - root.clientWidth,
    };
}"""


@pytest.fixture(scope="module")
def page(firefox_page):
    if not AXE.is_file():
        pytest.fail(f"{AXE} missing: run `make node-deps` (npm ci)", pytrace=False)
    firefox_page.evaluate("""(source) => {
        const script = document.createElement('script');
        script.textContent = source;
        document.head.append(script);
        return typeof axe;
    }""", AXE.read_text())
    yield firefox_page
    firefox_page.set_viewport_size({"width": 1280, "height": 800})  # the driver's own size
    firefox_page.click("#tab-transcribe")


@pytest.mark.parametrize("size", SIZES)
def test_every_view_is_axe_clean_and_does_not_scroll_sideways(page, size, report):
    found = on_each_view(page, size, lambda page: page.evaluate(CHECK_JS, list(BLOCKING)))
    assert len(found) >= 5 and found == {view: {"violations": [], "overflow": 0} for view in found}
    report(f"[firefox] axe-core {page.evaluate('() => axe.version')}: every view clean and "
           f"no sideways scroll at {SIZES[size][0]}x{SIZES[size][1]}")
