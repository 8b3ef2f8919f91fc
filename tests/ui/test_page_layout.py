"""The page where a person looks (issue 35), at a phone's 390x844 and a laptop's 1280x800:
what a started job says is on screen next to the control that started it, and a dropped file
that is not audio gets its error on screen. No view scrolls sideways from a 360 px phone to a
1920 px monitor (a saved conversation with a long title and a long code line included); that
test leaves a screenshot of every view at each size in test-artifacts/screens/ for a person to
look at. A first visit on a slow line counts the bytes it loads in the header.

One page of its own (its worker started once) is resized between the sizes; the jobs are
small (a 3 s clip on whisper-tiny.en, a few tokens of SmolLM2-135M) and the models it adds to
the browser's cache are removed afterwards (model_cache_left_as_found)."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from tests.ui.conftest import open_page, wait_until_ready
from tests.ui.transcribe_testlib import drop_files

pytestmark = pytest.mark.ui

REPO_ROOT = Path(__file__).resolve().parents[2]
SCREENS_DIR = REPO_ROOT / "test-artifacts" / "screens"
SIZES = {"phone": {"width": 390, "height": 844}, "laptop": {"width": 1280, "height": 800}}
# The layout must hold from the narrowest phones in use to a desktop monitor.
LAYOUT_SIZES = {"small-phone": {"width": 360, "height": 740}, **SIZES,
                "desktop": {"width": 1920, "height": 1080}}
VIEWS = ["transcribe", "generate", "chat", "text2text", "similarity"]
CHAT_STORAGE_KEY = "candle-web.chat.v1"
JOB_TIMEOUT_MS = 240_000  # a model load and a short run on a loaded 2-core machine
# A conversation as the issue met it: a long first question (the list's title) and an answer
# with a code line far wider than a phone.
LONG_CHAT = [
    {"role": "user", "content": "two steps to install numpy in a fresh virtual environment "
                                "on a machine without internet access, please"},
    {"role": "assistant", "content": "1. Download the wheel elsewhere:\n\n```bash\n"
                                     "pip download numpy==2.0.2 --only-binary=:all: "
                                     "--platform manylinux2014_x86_64 --dest ./wheels\n```\n\n"
                                     "2. Install it offline: `pip install --no-index "
                                     "--find-links ./wheels numpy`"},
]

# Where an element is against the window: whether it is shown and wholly inside it (give or
# take the 1 px of a layout in fractions of a pixel: scrolling to "nearest" lines an edge up
# with the window's to the sub-pixel).
IN_VIEWPORT_JS = """(selector) => {
    const element = document.querySelector(selector);
    const box = element.getBoundingClientRect();
    const shown = !element.hidden && box.width > 0 && box.height > 0;
    return {shown, top: Math.round(box.top), bottom: Math.round(box.bottom),
            left: Math.round(box.left), right: Math.round(box.right),
            inside: shown && box.top >= -1 && box.left >= -1
                    && box.bottom <= window.innerHeight + 1 && box.right <= window.innerWidth + 1,
            window: [window.innerWidth, window.innerHeight], scrollY: Math.round(scrollY)};
}"""

# Where the status box was when its line first changed after the run button (the same task
# that changed it; a short run may end before a poll would see it start).
WATCH_FIRST_STATUS_JS = """([phaseSelector, statusSelector]) => {
    const where = %s;
    window.firstStatus = null;
    const phase = document.querySelector(phaseSelector);
    const observer = new MutationObserver(() => {
        observer.disconnect();
        window.firstStatus = {text: phase.textContent, where: where(statusSelector)};
    });
    observer.observe(phase, {childList: true, characterData: true, subtree: true});
}""" % IN_VIEWPORT_JS

# The page's width against the window's, and the first elements that stick out (to say why).
OVERFLOW_JS = """() => {
    const width = document.documentElement.clientWidth;
    const sticking = [...document.querySelectorAll('body *')].filter((element) => {
        const box = element.getBoundingClientRect();
        return box.width > 0 && box.right > width + 0.5;
    }).slice(0, 6).map((element) => element.id ? '#' + element.id
                       : `${element.tagName.toLowerCase()}.${element.className}`);
    return {scrollWidth: document.documentElement.scrollWidth, width, sticking};
}"""

# Each view's job: its status box, phase line, run button and error box.
JOBS = {
    "transcribe": {"status": "#job", "phase": "#job-phase", "run": "#transcribe-button",
                   "error": "#transcribe-error"},
    "generate": {"status": "#generate-job", "phase": "#generate-phase",
                 "run": "#generate-button", "error": "#generate-error"},
    "chat": {"status": "#chat-job", "phase": "#chat-phase", "run": "#chat-send",
             "error": "#chat-error"},
    "text2text": {"status": "#t2t-job", "phase": "#t2t-phase", "run": "#t2t-button",
                  "error": "#t2t-error"},
    "similarity": {"status": "#similarity-job", "phase": "#similarity-phase",
                   "run": "#similarity-button", "error": "#similarity-error"},
}


@pytest.fixture(scope="module")
def layout_page(browser_context, network_guard, ui_server_url, model_cache_left_as_found):
    """A page of this module's own, started; the chats saved in this origin are put back as
    they were afterwards (the other modules' pages share the storage)."""
    page = open_page(browser_context, network_guard, ui_server_url + "/")
    saved_chats = page.evaluate("(key) => localStorage.getItem(key)", CHAT_STORAGE_KEY)
    wait_until_ready(page)
    yield page
    page.evaluate("([key, value]) => value === null ? localStorage.removeItem(key)"
                  " : localStorage.setItem(key, value)", [CHAT_STORAGE_KEY, saved_chats])
    page.close()


def show_view(page, view: str, size: str) -> None:
    page.set_viewport_size(LAYOUT_SIZES[size])
    page.evaluate("() => window.scrollTo(0, 0)")
    page.click(f"#tab-{view}")
    page.wait_for_function(f"() => window.candleWeb.{view}.runtimeReady")


def prepare_job(page, view: str) -> None:
    """What a person does before pressing the view's run button."""
    if view == "transcribe":
        page.locator("#sample-list button", has_text="clip 2").click()
        page.wait_for_function("() => { const s = window.candleWeb.transcribe;"
                               " return s.clip !== null && s.clip.samples !== null; }")
    elif view == "generate":
        page.fill("#generate-max-tokens", "4")
    elif view == "chat":
        if not page.is_visible("#chat-max-tokens"):
            page.click("#chat-settings summary")
        page.fill("#chat-max-tokens", "8")
        page.fill("#chat-input", "Say hello.")
    elif view == "text2text":
        # A folder this server does not have: the run starts (a load) and ends in an error;
        # both must be where the person looks.
        page.select_option("#t2t-source", "url")
        page.fill("#t2t-folder", "models/local/no-such-t5/")
    page.evaluate("() => window.scrollTo(0, 0)")


def finish_job(page, view: str) -> None:
    """Waits for the run's end (the jobs are short), so the screenshots show a result."""
    page.wait_for_function(f"() => !window.candleWeb.{view}.busy", timeout=JOB_TIMEOUT_MS)
    progress = page.evaluate(f"() => document.querySelector('{JOBS[view]['status']} progress')"
                             ".hasAttribute('value')")
    assert progress, (view, "the progress bar still runs after the job ended")
    error = page.evaluate(f"() => window.candleWeb.{view}.lastError")
    if view == "text2text":  # the folder it was given does not exist
        assert error is not None and "no-such-t5" in error["message"], error
    else:
        assert error is None, (view, error, page.text_content(JOBS[view]["phase"]))


@pytest.mark.parametrize("size", list(SIZES))
def test_a_started_job_shows_its_status_on_screen(layout_page, size):
    page = layout_page
    for view in VIEWS:
        show_view(page, view, size)
        prepare_job(page, view)
        job = JOBS[view]
        page.evaluate(WATCH_FIRST_STATUS_JS, [job["phase"], job["status"]])
        page.click(job["run"])  # Playwright scrolls the button into view first, as a person does
        page.wait_for_function("() => window.firstStatus !== null")
        first = page.evaluate("() => window.firstStatus")
        assert first["where"]["inside"], (view, size, first)
        if page.is_visible(job["error"]):  # a run that failed at once: its error too
            assert page.evaluate(IN_VIEWPORT_JS, job["error"])["inside"], (view, size)
        finish_job(page, view)


@pytest.mark.parametrize("size", list(SIZES))
def test_a_dropped_file_that_is_not_audio_says_so_on_screen(layout_page, size):
    page = layout_page
    show_view(page, "transcribe", size)
    page.locator("#drop-zone").scroll_into_view_if_needed()  # where the person drops it
    drop_files(page, [("shopping-list.txt", b"eggs, flour, milk\n", "text/plain")])
    error = page.locator("#transcribe-error")
    error.wait_for(state="visible")
    assert "shopping-list.txt could not be decoded as audio" in error.text_content()
    where = page.evaluate(IN_VIEWPORT_JS, "#transcribe-error")
    assert where["inside"], (size, where)
    # The status line no longer invites a choice as if nothing had happened.
    assert page.text_content("#job-phase") == \
        "Nothing added: shopping-list.txt could not be used as audio."


def test_no_view_scrolls_sideways_from_360_px_to_1920_px(layout_page):
    """Also leaves test-artifacts/screens/<view>-<size>.png for a person to look at."""
    page = layout_page
    page.set_input_files("#chat-import", files=[{
        "name": "numpy-offline.json", "mimeType": "application/json",
        "buffer": json.dumps(LONG_CHAT).encode()}])
    page.wait_for_function("() => document.querySelectorAll('#chat-list li').length > 0")
    SCREENS_DIR.mkdir(parents=True, exist_ok=True)
    ignore_file = SCREENS_DIR.parent / ".gitignore"
    if not ignore_file.exists():
        ignore_file.write_text("*\n")
    for size in LAYOUT_SIZES:
        for view in VIEWS:
            show_view(page, view, size)
            overflow = page.evaluate(OVERFLOW_JS)
            assert overflow["scrollWidth"] <= overflow["width"], (view, size, overflow)
            tabs = page.evaluate("""() => [...document.querySelectorAll('[role=tab]')].map(
                (tab) => { const box = tab.getBoundingClientRect();
                           return box.left >= 0 && box.right <= window.innerWidth; })""")
            assert all(tabs), (size, "a tab lies outside the window", tabs)
            page.screenshot(path=str(SCREENS_DIR / f"{view}-{size}.png"), full_page=True)


VENDOR_DIR = REPO_ROOT / "web" / "vendor"


def page_bytes(count: int) -> str:
    """A size as the page writes it (formatBytes in web/view_common.js)."""
    if count >= 1e6:
        return f"{count / 1e6:.{0 if count >= 1e8 else 1}f} MB"
    return f"{count / 1e3:.0f} kB" if count >= 1e3 else f"{count} B"


# Every start fetches Pyodide's runtime (the largest file of the ~20-35 MB a first visit loads).
RUNTIME_WASM = REPO_ROOT / "web" / "vendor" / "pyodide" / "pyodide.asm.wasm"
SLOW_LINK_BYTES_PER_S = 16_000_000  # slow enough for several counts, quick enough for a test
HEADER_TEXTS_JS = """() => {
    window.headerTexts = [];
    const watch = () => {
        const text = document.getElementById('runtime-text');
        if (!text) return requestAnimationFrame(watch);
        new MutationObserver(() => window.headerTexts.push(text.textContent))
            .observe(text, {childList: true, characterData: true, subtree: true});
    };
    watch();
}"""


def test_a_first_visit_on_a_slow_link_counts_what_it_loads(browser_context, network_guard,
                                                           ui_server_url, report):
    """No HTTP cache and a throttled line (Chromium's own network emulation, which covers the
    worker's requests): the header must count the bytes as they come, not sit on one line."""
    page = browser_context.new_page()
    try:
        cdp = browser_context.new_cdp_session(page)
        cdp.send("Network.enable")
        cdp.send("Network.setCacheDisabled", {"cacheDisabled": True})
        cdp.send("Network.emulateNetworkConditions", {
            "offline": False, "latency": 0, "uploadThroughput": -1,
            "downloadThroughput": SLOW_LINK_BYTES_PER_S})
        page.add_init_script(f"({HEADER_TEXTS_JS})()")
        page.goto(ui_server_url + "/")
        summary = wait_until_ready(page)
        texts = page.evaluate("() => window.headerTexts")
    finally:
        page.close()
    counts = []
    for text in texts:
        match = re.search(r"([\d.]+) (kB|MB) so far(, [\d.]+ (?:kB|MB)/s)?", text)
        if match:
            counts.append(float(match.group(1)) * (1e3 if match.group(2) == "kB" else 1e6))
    assert len(set(counts)) >= 3, texts  # it moved, more than once
    assert counts == sorted(counts), texts  # and never went back
    # Counted to at least the runtime's own file (the count lags by up to a quarter second,
    # and each figure is rounded to 0.1 MB).
    assert max(counts) >= RUNTIME_WASM.stat().st_size * 0.9, (max(counts), texts[-5:])
    assert any("MB/s" in text for text in texts), texts
    # The file a slow line waits on, named with its size as it lies in web/vendor/.
    named = {match.groups() for text in texts
             for match in re.finditer(r"\(([\w.+-]+): [\d.]+ k?M?B of ([\d.]+ k?M?B)\)", text)}
    assert named, texts
    for name, size in named:
        files = list(VENDOR_DIR.rglob(name))
        assert len(files) == 1 and size == page_bytes(files[0].stat().st_size), (name, size, files)
    assert texts[-1].startswith("Ready in "), texts[-3:]
    report(f"[ui] first visit at {SLOW_LINK_BYTES_PER_S / 1e6:.0f} MB/s, no HTTP cache: ready in "
           f"{summary['totalMs'] / 1000:.1f} s, {len(counts)} byte counts shown, up to "
           f"{max(counts) / 1e6:.1f} MB; e.g. {texts[len(texts) // 2]!r}")
