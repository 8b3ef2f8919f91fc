"""The demo page shell in headless Chromium: loads, is cross-origin isolated, is accessible by
keyboard, and its worker starts Pyodide + numpy + candle_web (on the wasm kernels; scipy only
for the numpy backend, see test_page_wasm_ops.py) from 127.0.0.1 only."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import candle_web

REPO_ROOT = Path(__file__).resolve().parents[2]
WHEEL_MANIFEST = REPO_ROOT / "web" / "vendor" / "wheels" / "manifest.json"
TAB_IDS = ["tab-transcribe", "tab-generate", "tab-chat", "tab-text2text", "tab-similarity",
           "tab-faces"]
# The worker's start-up phases (they overlap; the order they end in varies).
INIT_PHASES = {"runtime", "kernels", "wheel", "packages", "backend"}
# What the vendored lock pins (scripts/vendor_pyodide.py); the worker must report exactly these.
# scipy: none on the default (wasm) page; test_page_wasm_ops.py checks 1.14.1 on the numpy one.
EXPECTED_VERSIONS = {"pyodide": "0.27.7", "python": "3.12.7", "numpy": "2.0.2", "scipy": None}

pytestmark = pytest.mark.ui


def selected_tab(page) -> str:
    return page.evaluate(
        "() => document.querySelector('[role=tab][aria-selected=true]').id")


def visible_panels(page) -> list[str]:
    return page.evaluate(
        "() => [...document.querySelectorAll('[role=tabpanel]')].filter(p => !p.hidden)"
        ".map(p => p.id)")


def test_page_loads_with_tabs_and_status(fresh_page):
    page = fresh_page
    assert page.title() == "candle-web"
    tabs = page.get_by_role("tab")
    assert [tabs.nth(i).get_attribute("id") for i in range(tabs.count())] == TAB_IDS
    assert page.get_by_role("tablist").get_attribute("aria-label") == "Demos"
    status = page.get_by_role("banner").get_by_role("status")  # the runtime line in the header
    assert status.count() == 1 and status.get_attribute("aria-live") == "polite"
    assert selected_tab(page) == "tab-transcribe"
    assert visible_panels(page) == ["panel-transcribe"]
    for panel in page.query_selector_all("[role=tabpanel]"):
        labelled_by = panel.get_attribute("aria-labelledby")
        assert page.query_selector(f"#{labelled_by}").get_attribute("aria-controls") == \
            panel.get_attribute("id")
    assert page.page_log.errors == []


def test_tabs_work_from_the_keyboard(fresh_page):
    page = fresh_page
    page.focus("#tab-transcribe")
    page.keyboard.press("ArrowRight")
    assert selected_tab(page) == "tab-generate"
    assert page.evaluate("() => document.activeElement.id") == "tab-generate"
    assert visible_panels(page) == ["panel-generate"]
    page.keyboard.press("End")
    assert selected_tab(page) == "tab-faces"
    page.keyboard.press("ArrowRight")  # wraps around
    assert selected_tab(page) == "tab-transcribe"
    page.keyboard.press("ArrowLeft")
    assert selected_tab(page) == "tab-faces"
    page.keyboard.press("Home")
    assert selected_tab(page) == "tab-transcribe"
    # Only the selected tab is in the Tab order (roving tabindex).
    assert page.evaluate("() => [...document.querySelectorAll('[role=tab]')]"
                         ".filter(t => t.tabIndex === 0).map(t => t.id)") == ["tab-transcribe"]
    page.get_by_role("tab", name="Similarity").click()
    assert visible_panels(page) == ["panel-similarity"]
    assert page.url.endswith("#similarity")


def test_page_and_worker_are_cross_origin_isolated(ready_page, ready_summary):
    assert ready_page.evaluate("() => self.crossOriginIsolated") is True
    assert ready_page.evaluate("() => typeof SharedArrayBuffer") == "function"
    assert ready_summary["crossOriginIsolated"] is True
    assert ready_summary["cancellable"] is True


def test_worker_reaches_ready_with_pinned_versions(ready_page, ready_summary):
    two_threads = ready_summary["backend"]["threads"] == 2  # the default on two cores
    assert set(ready_summary["phases"]) == INIT_PHASES | ({"threads"} if two_threads else set())
    for phase, ms in ready_summary["phases"].items():
        assert 0 < ms <= ready_summary["totalMs"], phase
    versions = ready_summary["versions"]
    for name, expected in EXPECTED_VERSIONS.items():
        assert versions[name] == expected, name
    assert versions["candle_web"] == candle_web.__version__
    manifest = json.loads(WHEEL_MANIFEST.read_text())
    assert ready_summary["wheel"] == manifest  # the wheel the worker checked and installed
    status = ready_page.locator("#runtime-status")
    assert status.get_attribute("data-state") == "ready"
    assert ready_page.locator("#runtime-text").inner_text().startswith("Ready in ")
    assert ready_page.page_log.errors == []


def test_unknown_command_and_bad_arguments_give_typed_errors(ready_page):
    outcome = ready_page.evaluate("""async () => {
        const client = window.candleWeb.client;
        const describe = (p) => p.then(() => null, (e) => ({name: e.name, message: e.message}));
        return {
            unknown: await describe(client.request('no_such_command')),
            badDim: await describe(client.request('eval_twin', {m: 0})),
        };
    }""")
    assert outcome["unknown"]["name"] == "UnknownCommand"
    assert "eval_twin" in outcome["unknown"]["message"]  # lists the known commands
    assert outcome["badDim"]["name"] == "ShapeError"
    assert "m must be an integer" in outcome["badDim"]["message"]


def test_network_guard_sees_page_and_worker_requests(ready_page, network_guard):
    """The guard itself: off-host requests from the page and from a worker are caught."""
    mark = network_guard.mark()
    ready_page.evaluate("""async () => {
        await fetch('http://192.0.2.1/from-page').catch(() => null);
        const source = "fetch('http://192.0.2.1/from-worker').catch(() => null)" +
                       ".then(() => postMessage('done'))";
        const worker = new Worker(URL.createObjectURL(new Blob([source])));
        await new Promise((resolve) => { worker.onmessage = resolve; });
        worker.terminate();
    }""")
    caught = network_guard.forget_since(mark)
    assert sorted(caught) == ["http://192.0.2.1/from-page", "http://192.0.2.1/from-worker"]
