"""The worker's start-up: Pyodide restored from the vendored memory snapshot (made by
scripts/pyodide_snapshot.mjs with Node), the way back when it is not there, and the state a
restored interpreter must not share with every other one restored from the same file.

Timings are reported, never asserted (the machine is shared); what is asserted is what a user
relies on: the page starts either way, computes the same numbers either way, and two visits do
not draw the same random numbers.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.ui

REPO_ROOT = Path(__file__).resolve().parents[2]
MANIFEST = REPO_ROOT / "web" / "vendor" / "wheels" / "manifest.json"


def page_worker(page):
    workers = [w for w in page.workers if w.url.endswith("/worker.js")]
    assert len(workers) == 1, [w.url for w in page.workers]
    return workers[0]


def python_value(page, expression: str):
    """The value of a Python expression in the page's worker (a str, number or bool)."""
    return page_worker(page).evaluate("(source) => pyodide.runPython(source)", expression)


def twin_output(page) -> str:
    return page.evaluate("""async () => {
        const reply = await window.candleWeb.client.request('eval_twin', {seed: 5, m: 4, k: 8, n: 4});
        return Array.from(new Uint8Array(reply.output)).join(',');
    }""")


def test_the_page_starts_from_the_vendored_snapshot(ready_page, ready_summary, report):
    manifest = json.loads(MANIFEST.read_text())
    assert "snapshot" in manifest, "scripts/vendor_pyodide.py made no snapshot (is node there?)"
    assert ready_summary["snapshot"] == {"used": True, "reason": None}
    footer = ready_page.locator("#runtime-start").inner_text()
    assert footer.startswith("· start ") and "Python runtime" in footer
    assert "(snapshot)" in footer
    phases = ", ".join(f"{name} {ms / 1000:.2f} s" for name, ms in ready_summary["phases"].items())
    report(f"\n[ui] start from the snapshot: ready in {ready_summary['totalMs'] / 1000:.2f} s "
           f"({phases})")


def test_a_start_without_the_snapshot_computes_the_same(ready_page, open_ui_page, page_ready,
                                                        report):
    page = open_ui_page("/?snapshot=0")
    summary = page_ready(page)
    assert summary["snapshot"] == {"used": False, "reason": "not asked for"}
    assert summary["backend"]["name"] == ready_page.ready_summary["backend"]["name"]
    assert twin_output(page) == twin_output(ready_page)
    phases = ", ".join(f"{name} {ms / 1000:.2f} s" for name, ms in summary["phases"].items())
    report(f"\n[ui] start without the snapshot: ready in {summary['totalMs'] / 1000:.2f} s "
           f"({phases})")


def test_a_snapshot_that_fails_its_hash_is_left_out(open_ui_page, page_ready):
    page = open_ui_page("/", routes={"**/vendor/pyodide-snapshot.bin": lambda route: route.fulfill(
        status=200, body=b"\0" * 64, content_type="application/octet-stream")})
    summary = page_ready(page)
    assert summary["snapshot"]["used"] is False
    assert "sha256 mismatch for pyodide-snapshot.bin" in summary["snapshot"]["reason"]
    assert twin_output(page) != ""  # the usual start works
    assert any("snapshot was not used" in line for line in page.page_log.console)


def test_restored_pages_do_not_share_random_state(ready_page, open_ui_page, page_ready):
    other = open_ui_page("/")
    assert page_ready(other)["snapshot"]["used"] is True
    draw = "__import__('random').getrandbits(64)"
    assert python_value(ready_page, draw) != python_value(other, draw)
    names = "__import__('tempfile')._get_candidate_names().__next__()"
    assert python_value(ready_page, names) != python_value(other, names)
    # The runtime Python reports is this browser, not the Node that made the snapshot.
    runtime = python_value(other, "__import__('sys')._emscripten_info.runtime")
    assert runtime == other.evaluate("() => navigator.userAgent")


def test_the_memory_watch_keeps_pyodides_memory_not_the_threads_builds(ready_page):
    """The worker finds Pyodide's WebAssembly.Memory by watching instantiations while Pyodide
    starts; the threads build's shared memory is instantiated at the same time and must not be
    taken for it (it was, when the team started during a long start: the kernels then failed
    their heap check and the page ran numpy). Checked on the worker's own watch function with
    two one-import modules."""
    kept = page_worker(ready_page).evaluate("""async () => {
        const module = (flags) => new Uint8Array([0, 0x61, 0x73, 0x6d, 1, 0, 0, 0,
            2, flags === 3 ? 0x10 : 0x0f, 1, 3, 0x65, 0x6e, 0x76, 6, 0x6d, 0x65, 0x6d, 0x6f,
            0x72, 0x79, 2, flags, 1, ...(flags === 3 ? [1] : [])]);
        const plain = new WebAssembly.Memory({initial: 1});
        const shared = new WebAssembly.Memory({initial: 1, maximum: 1, shared: true});
        const {watchForPyodideMemory} = await import('./worker/kernels.js');
        const watch = watchForPyodideMemory();
        try {
            await WebAssembly.instantiate(module(0), {env: {memory: plain}});
            await WebAssembly.instantiate(module(3), {env: {memory: shared}});
            return watch.memory() === plain ? "plain" : watch.memory() === shared ? "shared" : "none";
        } finally {
            watch.stop();
        }
    }""")
    assert kept == "plain"
