"""Helpers of the Transcribe view's browser tests (test_transcribe*.py): reading the view's
state, dropping files, waiting for its entries, comparing words with a reference, and naming
screenshots of a test's intermediate states."""
from __future__ import annotations

import base64
import importlib.util
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
SAMPLES_DIR = REPO_ROOT / "web" / "vendor" / "samples"
ARTIFACTS_DIR = REPO_ROOT / "test-artifacts" / "ui"
# A few seconds of audio take tens of seconds in Pyodide on a busy 2-core machine (the encoder
# is ~35 GFLOP per 30 s window; 17-30 s per window measured here under load); generous margins.
TRANSCRIBE_TIMEOUT_MS = 300_000
MODEL_TINY = "whisper-tiny.en"


def playwright_config():
    """playwright.config.py (loaded by path: the name is the Playwright package's)."""
    spec = importlib.util.spec_from_file_location("candle_web_playwright_config_ui",
                                                  REPO_ROOT / "playwright.config.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def view_state(page, expression: str):
    return page.evaluate(f"() => {{ const s = window.candleWeb.transcribe; return {expression}; }}")


def items(page) -> list[dict]:
    """The view's entries without their samples: name, status, seconds, segment texts."""
    return view_state(page, """s.items.map((i) => ({id: i.id, name: i.name, status: i.status,
        seconds: i.seconds, text: i.result ? i.result.text : null, url: i.url,
        segments: i.segments.filter((g) => g.text.trim()).map((g) => ({start: g.start,
            end: g.end, text: g.text}))}))""")


def samples_manifest() -> list[dict]:
    manifest = SAMPLES_DIR / "manifest.json"
    if not manifest.is_file():
        pytest.fail(f"{manifest} is missing: run scripts/fetch_test_audio.sh, then "
                    "scripts/vendor_pyodide.py", pytrace=False)
    return json.loads(manifest.read_text())["clips"]


def reference_text(file_name: str) -> str:
    return next(c["reference"] for c in samples_manifest() if c["file"] == file_name)


def words(text: str) -> list[str]:
    """Lower-case words without punctuation, for comparing with reference transcripts."""
    return re.findall(r"[a-záéíóúñü0-9']+", text.lower())


def words_found_in_order(expected: list[str], got: list[str]) -> int:
    """How many of the expected words appear in `got` in the same order: the longest common
    subsequence. (A greedy scan undercounted: where the reference repeats a word, "a more a
    amiable", it matched the second "a" far ahead in a live transcript that said the sentence
    again, and skipped the rest of the sentence before it.)"""
    previous = [0] * (len(got) + 1)
    for word in expected:
        current = [0]
        for j, other in enumerate(got):
            current.append(previous[j] + 1 if word == other else max(previous[j + 1], current[j]))
        previous = current
    return previous[-1]


def assert_matches_reference(file_name: str, text: str) -> None:
    """Whisper's words against the LibriVox reference: tiny.en spells numbers and some words
    its own way, so most (not all) reference words must appear, in order."""
    expected = words(reference_text(file_name))
    assert words_found_in_order(expected, words(text)) >= 0.75 * len(expected), \
        (expected, words(text))


def drop_files(page, files: list[tuple[str, bytes, str]]) -> None:
    """One real drop holding several files, as the browser delivers it: dragenter, dragover,
    drop with a DataTransfer of Files built from (name, bytes, mime)."""
    page.evaluate("""(files) => {
        const transfer = new DataTransfer();
        for (const [name, b64, mime] of files) {
            const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
            transfer.items.add(new File([bytes], name, {type: mime}));
        }
        const zone = document.getElementById('drop-zone');
        for (const type of ['dragenter', 'dragover', 'drop']) {
            zone.dispatchEvent(new DragEvent(type, {dataTransfer: transfer, bubbles: true,
                                                    cancelable: true}));
        }
    }""", [[name, base64.b64encode(data).decode("ascii"), mime] for name, data, mime in files])


def sample_file(name: str) -> tuple[str, bytes, str]:
    return name, (SAMPLES_DIR / name).read_bytes(), "audio/wav"


def wait_idle_with_clip(page, name: str) -> None:
    """The entry `name` is shown, decoded, and the view is free to transcribe it."""
    page.wait_for_function(
        "(name) => { const s = window.candleWeb.transcribe;"
        " return s.clip !== null && s.clip.name === name && s.clip.samples !== null"
        " && s.runtimeReady && !s.busy; }", arg=name)


def run_to_end(page, timeout_ms: int = TRANSCRIBE_TIMEOUT_MS) -> dict:
    """Click Transcribe and wait until the view is free again; its state afterwards."""
    runs_before = view_state(page, "s.runs")
    page.click("#transcribe-button")
    page.wait_for_function(
        "(before) => { const s = window.candleWeb.transcribe;"
        " return !s.busy && (s.runs > before || s.lastError !== null); }",
        arg=runs_before, timeout=timeout_ms)
    state = view_state(page, "({result: s.lastResult, error: s.lastError, load: s.lastLoad,"
                             " events: s.events, streamed: s.streamed, heap: s.heap})")
    assert state["error"] is None, state["error"]
    return state


def choose_model(page, model: str) -> None:
    page.wait_for_function("() => !window.candleWeb.transcribe.busy", timeout=TRANSCRIBE_TIMEOUT_MS)
    page.select_option("#model-select", model)


def screenshot(page, name: str) -> Path:
    """A PNG of the page's current state next to the automatic end-of-test ones."""
    ARTIFACTS_DIR.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS_DIR / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


def tool(name: str) -> str:
    """A system tool the test needs (`make test` installs it: Makefile APT_PACKAGES)."""
    found = shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed: run `make system-deps`", pytrace=False)
    return found


def run_tool(*command: str) -> None:
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        pytest.fail(f"{' '.join(command)} failed ({done.returncode}): {done.stderr}", pytrace=False)
