"""Browser fixtures for the UI tests: the demo server, headless Chromium, a network guard.

- `ui_server_url` (session): `candle-web serve` (the serve module) on a free port, in a
  thread, over the checkout's web/; the vendored runtime is brought up to date first
  (scripts/vendor_pyodide.py: fast when done) and the candle_web wheel rebuilt, so the browser
  always runs the current sources. `ui_site` is its SiteConfig (tests add local model folders).
- `browser_context` (session): Debian's chromium through Playwright's sync API, launched with
  playwright.config.py's settings and a fresh user-data folder, and a fake microphone that
  plays `fake_microphone` (real LibriVox speech, see FAKE_MICROPHONE) from its start each time
  a page opens it; a page may use it once a test grants the permission
  (browser_context.grant_permissions(["microphone"])), until then the browser refuses it.
- `network_guard` (session): every request the pages or their workers make goes through a
  route; anything not to 127.0.0.1 is aborted, recorded, and fails the running test.
- `ready_page` (session): the demo page with its worker started (Pyodide + numpy + candle_web
  on the wasm kernels by default), shared because a cold start costs seconds; `ready_summary`
  is the init result.
- `fresh_page` (function): a new page in the same browser, for tests that need clean state;
  `open_ui_page` opens such pages at any path (a ?backend= query) with routes set before they
  load, and `page_ready(page)` waits for a page's worker like ready_page's; `ready_page_at(path)`
  is a shared started page at another path.
After each test a screenshot of its page lands in test-artifacts/ui/ (git-ignored).
"""
from __future__ import annotations

import importlib.util
import json
import re
import shutil
import sys
import tempfile
import threading
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS_DIR = REPO_ROOT / "test-artifacts" / "ui"
LOOPBACK_HOST = "127.0.0.1"
# Schemes that never leave the browser.
LOCAL_SCHEMES = ("data:", "blob:", "about:", "chrome-extension:", "chrome:")
SAMPLES_DIR = REPO_ROOT / "web" / "vendor" / "samples"
# What the fake microphone plays: seconds of silence and vendored LibriVox clips, in order.
FAKE_MICROPHONE = (1.0, "sense_and_sensibility_01_austen_64kb-0870.wav", 1.0,
                   "sense_and_sensibility_01_austen_64kb-0920.wav", 1.0,
                   "sense_and_sensibility_01_austen_64kb-0890.wav", 2.0)
MICROPHONE_RATE = 16_000


def _load_by_path(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# "playwright.config" would resolve inside the playwright package, so load the file by path.
PLAYWRIGHT_CONFIG = _load_by_path("candle_web_playwright_config",
                                   REPO_ROOT / "playwright.config.py")


def report_line(config, text: str) -> None:
    """Print a line in the test output even while pytest captures the test's stdout."""
    capture = config.pluginmanager.getplugin("capturemanager")
    terminal = config.pluginmanager.getplugin("terminalreporter")
    if capture is None or terminal is None:
        print(text)
        return
    with capture.global_and_fixture_disabled():
        terminal.write_line(text)


# --- network guard ------------------------------------------------------------------------------

class NetworkGuard:
    """Lets requests to the test server through; aborts and records every other one."""

    def __init__(self, allowed_origin: str):
        self.allowed_origin = allowed_origin.rstrip("/")
        self._lock = threading.Lock()
        self.blocked: list[str] = []
        self.allowed_count = 0
        self.allowed: list[str] = []  # every URL let through, in order (for cache checks)

    def is_allowed(self, url: str) -> bool:
        if url.startswith(LOCAL_SCHEMES):
            return True
        return url == self.allowed_origin or url.startswith(self.allowed_origin + "/")

    def handle_route(self, route) -> None:
        url = route.request.url
        if self.is_allowed(url):
            with self._lock:
                self.allowed_count += 1
                self.allowed.append(url)
            route.continue_()
        else:
            with self._lock:
                self.blocked.append(url)
            route.abort("blockedbyclient")

    def record_websocket(self, websocket) -> None:
        if not self.is_allowed(websocket.url):
            with self._lock:
                self.blocked.append(websocket.url)

    def mark(self) -> int:
        with self._lock:
            return len(self.blocked)

    def blocked_since(self, mark: int) -> list[str]:
        with self._lock:
            return list(self.blocked[mark:])

    def allowed_mark(self) -> int:
        with self._lock:
            return len(self.allowed)

    def allowed_since(self, mark: int) -> list[str]:
        with self._lock:
            return list(self.allowed[mark:])

    def forget_since(self, mark: int) -> list[str]:
        """Drop (and return) the records after mark: for the guard's own self-test."""
        with self._lock:
            dropped = self.blocked[mark:]
            del self.blocked[mark:]
            return dropped


_ACTIVE_GUARD: NetworkGuard | None = None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """After each test body, while its fixtures are alive: screenshot the page it drove, and
    fail the test (not just its teardown) if it made a request off 127.0.0.1."""
    guard = _ACTIVE_GUARD
    start = guard.mark() if guard is not None else 0
    try:
        return (yield)
    finally:
        save_screenshot(item)
        if guard is not None:
            blocked = guard.blocked_since(start)
            if blocked:
                raise AssertionError(f"{len(blocked)} request(s) left 127.0.0.1 "
                                     f"(blocked by the guard): {blocked[:5]}")


def _artifact_name(nodeid: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", nodeid.split("::", 1)[-1]).strip("_")


def save_screenshot(item) -> None:
    """A PNG of the page the test used (fresh_page first, else ready_page) in ARTIFACTS_DIR."""
    funcargs = getattr(item, "funcargs", {})
    page = funcargs.get("fresh_page") or funcargs.get("ready_page")
    if page is None or page.is_closed():
        return
    ARTIFACTS_DIR.mkdir(parents=True, exist_ok=True)
    # Keeps the generated folder out of git without touching the repository's .gitignore.
    ignore_file = ARTIFACTS_DIR.parent / ".gitignore"
    if not ignore_file.exists():
        ignore_file.write_text("*\n")
    try:
        page.screenshot(path=str(ARTIFACTS_DIR / f"{_artifact_name(item.nodeid)}.png"),
                        full_page=True)
    except Exception as error:  # a screenshot must never mask the test's own result
        report_line(item.config, f"[ui] screenshot failed: {error}")


# --- server -------------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def ui_site():
    """The served site's configuration. Tests may serve a model folder outside the registry
    (e.g. a small T5 they wrote) by adding it: ui_site.local_models[name] = folder, then
    /models/local/<name>/<file> serves it."""
    from candle_web.serve import make_site_config

    return make_site_config(REPO_ROOT / "web")


@pytest.fixture(scope="session")
def ui_server_url(ui_site):
    sys.path.insert(0, str(REPO_ROOT / "scripts"))
    try:
        vendor_pyodide = _load_by_path("candle_web_vendor_pyodide",
                                       REPO_ROOT / "scripts" / "vendor_pyodide.py")
    finally:
        sys.path.remove(str(REPO_ROOT / "scripts"))
    try:
        vendor_pyodide.vendor(offline=vendor_pyodide.offline_requested(), build_candle_wheel=True)
    except vendor_pyodide.VendorError as error:
        pytest.fail(f"cannot vendor the browser runtime: {error}", pytrace=False)

    from candle_web.serve import start_in_thread

    server, url = start_in_thread(LOOPBACK_HOST, 0, ui_site)
    yield url.rstrip("/")
    server.shutdown()
    server.server_close()


# --- browser ------------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def network_guard(ui_server_url):
    global _ACTIVE_GUARD
    guard = NetworkGuard(ui_server_url)
    _ACTIVE_GUARD = guard
    yield guard
    _ACTIVE_GUARD = None


def write_fake_microphone(path: Path) -> dict:
    """FAKE_MICROPHONE as one 16 kHz mono 16-bit WAV; {path, seconds, clips: [{file, start,
    end}]} with each clip's place in it."""
    import wave

    frames, clips, position = [], [], 0
    for part in FAKE_MICROPHONE:
        if isinstance(part, float):
            data = b"\0\0" * int(part * MICROPHONE_RATE)
        else:
            with wave.open(str(SAMPLES_DIR / part), "rb") as clip:
                if (clip.getnchannels(), clip.getsampwidth(), clip.getframerate()) != \
                        (1, 2, MICROPHONE_RATE):
                    raise ValueError(f"{part}: expected 16 kHz mono 16-bit PCM")
                data = clip.readframes(clip.getnframes())
            clips.append({"file": part, "start": position / MICROPHONE_RATE,
                          "end": (position + len(data) // 2) / MICROPHONE_RATE})
        frames.append(data)
        position += len(data) // 2
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(MICROPHONE_RATE)
        out.writeframes(b"".join(frames))
    return {"path": str(path), "seconds": position / MICROPHONE_RATE, "clips": clips}


@pytest.fixture(scope="session")
def fake_microphone(tmp_path_factory) -> dict:
    """The fake microphone's recording (write_fake_microphone's description)."""
    missing = [part for part in FAKE_MICROPHONE if isinstance(part, str)
               and not (SAMPLES_DIR / part).is_file()]
    if missing:
        pytest.fail(f"{missing} missing from {SAMPLES_DIR}: run scripts/fetch_test_audio.sh, "
                    "then scripts/vendor_pyodide.py", pytrace=False)
    return write_fake_microphone(tmp_path_factory.mktemp("microphone") / "speech.wav")


@pytest.fixture(scope="session")
def browser_context(network_guard, fake_microphone):
    executable = Path(PLAYWRIGHT_CONFIG.CHROMIUM_EXECUTABLE)
    if not executable.is_file():
        pytest.fail(f"{executable} not found: install Debian's chromium "
                    "(apt-get install -y chromium); never `playwright install`", pytrace=False)
    from playwright.sync_api import sync_playwright

    profile_dir = tempfile.mkdtemp(prefix="candle-web-chromium-")
    with sync_playwright() as playwright:
        options = dict(PLAYWRIGHT_CONFIG.LAUNCH_OPTIONS)
        options["args"] = [*options["args"], "--use-fake-device-for-media-stream",
                           f"--use-file-for-fake-audio-capture={fake_microphone['path']}"]
        context = playwright.chromium.launch_persistent_context(profile_dir, **options)
        context.set_default_timeout(PLAYWRIGHT_CONFIG.ACTION_TIMEOUT_MS)
        context.route("**/*", network_guard.handle_route)
        # For a test that needs a second, differently launched browser (no fake microphone).
        context.chromium = playwright.chromium
        try:
            yield context
        finally:
            context.close()
            shutil.rmtree(profile_dir, ignore_errors=True)


class PageLog:
    """Console messages and uncaught errors of one page (workers' console included)."""

    def __init__(self, page, guard: NetworkGuard):
        self.console: list[str] = []
        self.errors: list[str] = []
        page.on("console", lambda message: self.console.append(f"{message.type}: {message.text}"))
        page.on("pageerror", lambda error: self.errors.append(str(error)))
        page.on("websocket", guard.record_websocket)


def open_page(context, guard: NetworkGuard, url: str):
    page = context.new_page()
    page.page_log = PageLog(page, guard)
    page.goto(url)
    return page


def wait_until_ready(page) -> dict:
    """The worker's init result, or a failure that shows the page's last words."""
    page.wait_for_function("() => window.candleWeb !== undefined")
    summary = page.evaluate(
        """() => Promise.race([
            window.candleWeb.ready.then(
                (r) => r,
                (e) => ({failed: true, name: e.name, message: e.message, traceback: e.traceback})),
            new Promise((resolve) => setTimeout(
                () => resolve({failed: true, name: 'Timeout', message: 'worker not ready'}),
                %d)),
        ])""" % PLAYWRIGHT_CONFIG.PAGE_READY_TIMEOUT_MS)
    if summary.get("failed"):
        log = page.page_log
        pytest.fail(f"worker did not start: {summary['name']}: {summary['message']}\n"
                    f"{summary.get('traceback') or ''}\nconsole: {log.console[-10:]}\n"
                    f"errors: {log.errors}", pytrace=False)
    return summary


@pytest.fixture(scope="session")
def ready_page(browser_context, network_guard, ui_server_url, pytestconfig):
    page = open_page(browser_context, network_guard, ui_server_url + "/")
    summary = wait_until_ready(page)
    page.ready_summary = summary
    phases = ", ".join(f"{name} {ms / 1000:.2f} s" for name, ms in summary["phases"].items())
    report_line(pytestconfig, f"\n[ui] worker ready in {summary['totalMs'] / 1000:.2f} s "
                              f"({phases}); versions {summary['versions']}")
    ARTIFACTS_DIR.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS_DIR / "worker-start.json").write_text(json.dumps(summary, indent=2) + "\n")
    yield page
    page.close()


@pytest.fixture(scope="session")
def report(pytestconfig):
    """report(text): a line in the test output (timings, measured differences)."""
    return lambda text: report_line(pytestconfig, text)


@pytest.fixture(scope="session")
def ready_summary(ready_page) -> dict:
    return ready_page.ready_summary


@pytest.fixture
def fresh_page(browser_context, network_guard, ui_server_url):
    page = open_page(browser_context, network_guard, ui_server_url + "/")
    yield page
    page.close()


@pytest.fixture(scope="module")
def module_page(browser_context, network_guard, ui_server_url):
    """A started page of the module's own (its own worker), closed at the module's end: for a
    module that loads models or changes a view's options, so that the shared ready_page's worker
    does not hold them when later modules expect a first load (a download with its progress
    events, then a cached second visit) or a view as it opens."""
    page = open_page(browser_context, network_guard, ui_server_url + "/")
    wait_until_ready(page)
    yield page
    page.close()


@pytest.fixture
def open_ui_page(browser_context, network_guard, ui_server_url):
    """open_ui_page(path="/", routes={glob: handler}) -> a new page (with its own worker) on the
    test server, its routes set before it loads (e.g. a file answering 404); closed after the
    test."""
    pages = []

    def open_(path: str = "/", routes: dict | None = None):
        page = browser_context.new_page()
        for pattern, handler in (routes or {}).items():
            page.route(pattern, handler)
        page.page_log = PageLog(page, network_guard)
        page.goto(ui_server_url + path)
        pages.append(page)
        return page

    yield open_
    for page in pages:
        page.close()


@pytest.fixture(scope="session")
def page_ready():
    """page_ready(page) -> the worker's init result (wait_until_ready)."""
    return wait_until_ready


@pytest.fixture(scope="session")
def ready_page_at(browser_context, network_guard, ui_server_url):
    """ready_page_at(path) -> a page at `path` (e.g. "/?backend=wasm-simd128") with its worker
    started (its init result as page.ready_summary): opened once a session, shared like
    ready_page."""
    pages = {}

    def get(path: str):
        if path not in pages:
            page = open_page(browser_context, network_guard, ui_server_url + path)
            page.ready_summary = wait_until_ready(page)
            pages[path] = page
        return pages[path]

    yield get
    for page in pages.values():
        page.close()


# The pages of the UI tests share one browser profile, and later tests (test_generate,
# test_transcribe) expect the first load of a model in the session to download it: a module
# that loads models asks for this fixture and leaves the model cache as it found it.
CACHED_MODEL_URLS_JS = """async () => {
    const cache = await caches.open('candle-web-models-v1');
    return (await cache.keys()).map((request) => request.url);
}"""
FORGET_MODEL_URLS_JS = """async (urls) => {
    const cache = await caches.open('candle-web-models-v1');
    for (const url of urls) await cache.delete(url);
}"""


# What the page keeps in localStorage about models: the chats (each with its model and
# settings) and Generate's last choice. A module that picks models puts them back as it found
# them, or every page opened after it would start on its last model (Qwen's 491 MB, say).
SAVED_CHOICE_KEYS = ["candle-web.chat.v1", "candle-web.generate.v1"]
READ_STORAGE_JS = "(keys) => keys.map((key) => localStorage.getItem(key))"
WRITE_STORAGE_JS = """([keys, values]) => keys.forEach((key, index) => values[index] === null
    ? localStorage.removeItem(key) : localStorage.setItem(key, values[index]))"""


@pytest.fixture(scope="module")
def saved_choices_left_as_found(ready_page):
    before = ready_page.evaluate(READ_STORAGE_JS, SAVED_CHOICE_KEYS)
    yield
    if not ready_page.is_closed():
        ready_page.evaluate(WRITE_STORAGE_JS, [SAVED_CHOICE_KEYS, before])


@pytest.fixture(scope="module")
def model_cache_left_as_found(ready_page, saved_choices_left_as_found):
    before = set(ready_page.evaluate(CACHED_MODEL_URLS_JS))
    yield
    added = sorted(set(ready_page.evaluate(CACHED_MODEL_URLS_JS)) - before)
    ready_page.evaluate(FORGET_MODEL_URLS_JS, added)


# --- artifacts ----------------------------------------------------------------------------------

def _artifact_name(nodeid: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", nodeid.split("::", 1)[-1]).strip("_")
