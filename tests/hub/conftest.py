"""A local stand-in for the Hugging Face Hub, and a throw-away cache, for the hub tests."""

from __future__ import annotations

import http.server
import threading
import urllib.parse

import pytest

# Long enough to outlast the client's timeout in the tests; the event cuts it short at teardown.
SLOW_RESPONSE_MAX_S = 10.0
# How often the server loop checks for shutdown (the default 0.5 s slows every teardown).
SHUTDOWN_POLL_S = 0.02


class FakeHub:
    """Serves /<repo>/resolve/<revision>/<file> from a dict; records every request path.

    files maps the URL path to bytes; slow_paths never answer before the client gives up;
    unsized_paths are sent without Content-Length (the body ends when the connection closes)."""

    def __init__(self):
        self.files: dict[str, bytes] = {}
        self.slow_paths: set[str] = set()
        self.unsized_paths: set[str] = set()
        self.requests: list[str] = []
        self.release = threading.Event()
        hub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                path = urllib.parse.unquote(self.path)
                hub.requests.append(path)
                if path in hub.slow_paths:
                    hub.release.wait(SLOW_RESPONSE_MAX_S)
                    return
                body = hub.files.get(path)
                if body is None:
                    self.send_error(404, "Not Found")
                    return
                self.send_response(200)
                if path not in hub.unsized_paths:
                    self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):  # keep test output clean
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever,
                                       kwargs={"poll_interval": SHUTDOWN_POLL_S}, daemon=True)

    def add(self, repo: str, revision: str, filename: str, body: bytes) -> str:
        path = f"/{repo}/resolve/{revision}/{filename}"
        self.files[path] = body
        return path


@pytest.fixture
def fake_hub(monkeypatch):
    hub = FakeHub()
    hub.thread.start()
    monkeypatch.setenv("CANDLE_WEB_HF_ENDPOINT", hub.url)
    yield hub
    hub.release.set()
    hub.server.shutdown()
    hub.server.server_close()


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty model cache, online mode, no pip options inherited from the caller."""
    folder = tmp_path / "cache"
    monkeypatch.setenv("CANDLE_WEB_CACHE", str(folder))
    monkeypatch.delenv("CANDLE_WEB_OFFLINE", raising=False)
    monkeypatch.delenv("CANDLE_WEB_PIP_ARGS", raising=False)
    monkeypatch.delenv("CANDLE_WEB_HF_TIMEOUT", raising=False)
    return folder
