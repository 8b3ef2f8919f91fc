"""A model download that is stopped or cut by a reload continues from the bytes it kept.

Real inputs: the registry's SmolLM2-135M-Instruct GGUF (98 MB, sha256 pinned), served by
`candle-web serve`'s own site application, here behind a wrapper that logs every model
request with its Range header and paces the body (THROTTLE_BYTES_PER_S, so that a person, or
this test, can stop or reload in the middle). The page runs on this second server's own origin,
so its model cache starts empty and the shared test browser's cache is not touched.

The story, as a person on a slow link meets it: press Generate; Stop during the download (the
status says where it stopped and that the next load continues from there); press Generate
again (the server sees a Range request from exactly the bytes kept); reload the page while it
downloads (the page asks first: beforeunload); press Generate on the reloaded page (another
Range request from the bytes kept, and the model, checked against its sha256 after being put
together from three downloads, generates).
"""
from __future__ import annotations

import asyncio
import re
import socket
import threading
import time

import pytest

from .conftest import ARTIFACTS_DIR, LOOPBACK_HOST, PageLog, wait_until_ready

MODEL = "smollm2-135m-instruct"
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Fast enough that the whole file takes ~6 s, slow enough that the test can act in between
# (the page keeps the download in 8 MiB pieces: download_parts.js).
THROTTLE_BYTES_PER_S = 16e6
PIECE_BYTES = 8 << 20

KEPT_PIECES_JS = """async () => {
    const cache = await caches.open('candle-web-models-v1');
    const pieces = (await cache.keys()).filter((request) => request.url.includes('/model-cache/partial/'));
    let bytes = 0;
    for (const request of pieces) bytes += (await (await cache.match(request)).arrayBuffer()).byteLength;
    return {count: pieces.length, bytes};
}"""
CACHED_FILE_BYTES_JS = """async (name) => {
    const cache = await caches.open('candle-web-models-v1');
    const keys = (await cache.keys()).filter((request) => request.url.endsWith('/' + name)
        && request.url.includes('/model-cache/sha256/'));
    if (keys.length !== 1) return null;
    return (await (await cache.match(keys[0])).arrayBuffer()).byteLength;
}"""


class ThrottledLoggingApp:
    """The site application with a request log ({path, range, status, body_bytes} per model
    request) and model bodies paced to THROTTLE_BYTES_PER_S."""

    def __init__(self, app):
        self.app = app
        self.drain = app.drain
        self.log: list[dict] = []
        self._lock = threading.Lock()

    async def __call__(self, scope, receive, send):
        path = scope.get("path", "")
        if scope["type"] != "http" or not path.startswith("/models/"):
            await self.app(scope, receive, send)
            return
        headers = {name.decode("latin-1").lower(): value.decode("latin-1")
                   for name, value in scope.get("headers", [])}
        entry = {"path": path, "range": headers.get("range"), "status": None, "body_bytes": 0}
        with self._lock:
            self.log.append(entry)
        gone = asyncio.Event()  # the browser closed the connection (Stop, a reload)

        async def watch_disconnect():
            while (await receive())["type"] != "http.disconnect":
                pass
            gone.set()

        async def paced_send(message):
            if message["type"] == "http.response.start":
                entry["status"] = message["status"]
            elif message["type"] == "http.response.body" and not gone.is_set():
                body = message.get("body", b"")
                entry["body_bytes"] += len(body)  # what reached the connection while open
                await asyncio.sleep(len(body) / THROTTLE_BYTES_PER_S)
            await send(message)

        watcher = asyncio.ensure_future(watch_disconnect())
        try:
            await self.app(scope, receive, paced_send)
        finally:
            watcher.cancel()

    def model_requests(self) -> list[dict]:
        with self._lock:
            return [dict(entry) for entry in self.log if entry["path"].endswith("/" + GGUF)]


@pytest.fixture(scope="module")
def throttled_server(ui_site, ui_server_url):
    """A second `candle-web serve` site (same web root and models) on its own port, paced and
    logged; ui_server_url first, so that the runtime is vendored."""
    from candle_web.serve import Server, SiteApp

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((LOOPBACK_HOST, 0))
    sock.listen(64)
    app = ThrottledLoggingApp(SiteApp(ui_site))
    server = Server(sock, app, ui_site)
    server.start_thread()
    host, port = server.server_address[:2]
    yield f"http://{host}:{port}", app
    server.shutdown()
    server.server_close()


def open_guarded(context, origin: str, blocked: list):
    """A page on `origin` whose requests (its worker's included) may go there only: this
    page's route is asked before the session's guard, which knows only the main server."""
    page = context.new_page()

    def guard(route):
        url = route.request.url
        if url.startswith(origin + "/") or url.startswith(("data:", "blob:")):
            route.continue_()
        else:
            blocked.append(url)
            route.abort("blockedbyclient")

    page.route("**/*", guard)
    page.page_log = PageLog(page, _NoWebsockets())
    page.goto(origin + "/#generate")
    return page


class _NoWebsockets:
    def record_websocket(self, websocket):
        raise AssertionError(f"unexpected websocket {websocket.url}")


def kept_bytes_when(page, at_least: int) -> dict:
    """The pieces kept, once there are `at_least` of them (the download goes on meanwhile)."""
    deadline = time.monotonic() + 60
    while True:
        kept = page.evaluate(KEPT_PIECES_JS)
        if kept["count"] >= at_least:
            return kept
        assert time.monotonic() < deadline, f"only {kept} kept after 60 s"
        page.wait_for_timeout(100)


def start_generate(page):
    page.fill("#generate-max-tokens", "4")
    page.click("#generate-button")
    page.wait_for_function(
        "() => document.getElementById('generate-phase').textContent.startsWith('Downloading')",
        timeout=60_000)


def test_a_stopped_or_reloaded_download_resumes_from_the_bytes_it_kept(
        browser_context, throttled_server, report):
    origin, server = throttled_server
    blocked: list = []
    page = open_guarded(browser_context, origin, blocked)
    try:
        wait_until_ready(page)
        size = page.evaluate("""async () => (await window.candleWeb.client.request('models',
            {kind: 'llama'})).models.find((m) => m.name === '%s').size""" % MODEL)

        # 1. Stop in the middle of the download: the status says where, and that it continues.
        start_generate(page)
        kept_bytes_when(page, 2)
        page.click("#generate-stop")
        page.wait_for_function(
            "() => document.getElementById('generate-job').dataset.state === 'cancelled'")
        stopped = page.text_content("#generate-phase")
        assert re.fullmatch(rf"Stopped downloading {re.escape(GGUF)} at [\d.]+ MB of 98\.4 MB; "
                            r"the next load continues from there\.", stopped), stopped
        after_stop = page.evaluate(KEPT_PIECES_JS)
        assert after_stop["bytes"] >= 2 * PIECE_BYTES

        # 2. Generate again: one Range request from exactly the bytes kept.
        requests_before = len(server.model_requests())
        start_generate(page)
        phase = page.text_content("#generate-phase")
        assert "continued from the" in phase and "kept earlier" in phase, phase
        resumed = server.model_requests()[requests_before]
        assert resumed["range"] == f"bytes={after_stop['bytes']}-", resumed
        assert resumed["status"] == 206, resumed

        # 3. Reload in the middle of it: the page asks first (beforeunload), then the pieces
        # kept before the reload are still there.
        kept_bytes_when(page, after_stop["count"] + 2)
        # Size, measured speed and time left, and what was kept before (a second in, the speed
        # is known).
        page.wait_for_function("() => document.getElementById('generate-phase').textContent"
                               ".includes(' MB/s · ')")
        line = page.text_content("#generate-phase")
        assert re.fullmatch(rf"Downloading {re.escape(GGUF)}: [\d.]+ MB of 98\.4 MB · [\d.]+ MB/s"
                            r" · about \d+ (s|min) left · continued from the [\d.]+ MB kept earlier",
                            line), line
        ARTIFACTS_DIR.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS_DIR / "download-resumed.png"))
        dialogs = []

        def accept(dialog):
            dialogs.append(dialog.type)
            dialog.accept()

        page.on("dialog", accept)
        page.reload()
        assert dialogs == ["beforeunload"]
        wait_until_ready(page)
        after_reload = page.evaluate(KEPT_PIECES_JS)
        assert after_stop["bytes"] + 2 * PIECE_BYTES <= after_reload["bytes"] < size

        # 4. Generate on the reloaded page: a Range request from the bytes kept, the rest
        # downloaded, the whole checked against the registry's sha256 and run.
        requests_before = len(server.model_requests())
        page.fill("#generate-max-tokens", "4")
        page.click("#generate-button")
        page.wait_for_function(
            "() => ['done', 'error'].includes(document.getElementById('generate-job').dataset.state)",
            timeout=120_000)
        assert page.get_attribute("#generate-job", "data-state") == "done", \
            page.text_content("#generate-error")
        resumed = server.model_requests()[requests_before:]
        assert [(r["range"], r["status"]) for r in resumed] == \
            [(f"bytes={after_reload['bytes']}-", 206)], resumed
        assert resumed[0]["body_bytes"] <= size - after_reload["bytes"]
        load = page.evaluate("() => window.candleWeb.generate.lastLoad")
        assert load["resumedBytes"] == after_reload["bytes"]
        assert load["downloadedBytes"] == size - after_reload["bytes"]
        assert page.evaluate("() => window.candleWeb.generate.lastResult.tokenIds.length") > 0
        # Kept as one file of the right size; the pieces are gone.
        assert page.evaluate(CACHED_FILE_BYTES_JS, GGUF) == size
        assert page.evaluate(KEPT_PIECES_JS)["count"] == 0
        assert blocked == []
        log = [(r["range"], r["status"], r["body_bytes"]) for r in server.model_requests()]
        report(f"[ui] {GGUF} requests (range, status, bytes sent): {log}")
    finally:
        page.close()
