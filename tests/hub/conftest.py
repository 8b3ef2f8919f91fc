"""A local stand-in for the Hugging Face Hub, and a throw-away cache, for the hub tests."""

from __future__ import annotations

import hashlib
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
    unsized_paths are sent without Content-Length (the body ends when the connection closes).
    head_headers maps a path to the headers its HEAD answers with (and redirects, for the
    Hub's answer on a file kept in LFS storage, to the path GET is redirected to), like the
    Hub announcing a file's content hash (see add_announced)."""

    def __init__(self):
        self.files: dict[str, bytes] = {}
        self.head_headers: dict[str, dict] = {}
        self.redirects: dict[str, str] = {}
        self.slow_paths: set[str] = set()
        self.unsized_paths: set[str] = set()
        self.requests: list[str] = []
        self.release = threading.Event()
        hub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_HEAD(self):
                path = urllib.parse.unquote(self.path)
                hub.requests.append("HEAD " + path)
                headers = hub.head_headers.get(path)
                if headers is None:
                    self.send_error(404, "Not Found")
                    return
                self.send_response(302 if path in hub.redirects else 200)
                if path in hub.redirects:
                    self.send_header("Location", hub.redirects[path])
                for key, value in headers.items():
                    self.send_header(key, value)
                self.end_headers()

            def do_GET(self):
                path = urllib.parse.unquote(self.path)
                hub.requests.append(path)
                if path in hub.redirects:
                    self.send_response(302)
                    self.send_header("Location", hub.redirects[path])
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
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

    def add_announced(self, repo: str, revision: str, filename: str, body: bytes, *,
                      lfs: bool, announced: bytes | None = None) -> str:
        """Serve a file the way the Hub does, announcing the content hash of `announced`
        (default: body): a file in LFS storage answers HEAD with a redirect carrying
        X-Linked-Etag (sha256) and X-Linked-Size, and GET with a redirect to the storage
        path; a file kept in git answers HEAD with its git blob id as ETag."""
        announced = body if announced is None else announced
        path = f"/{repo}/resolve/{revision}/{filename}"
        headers = {"X-Repo-Commit": revision}
        if lfs:
            sha256 = hashlib.sha256(announced).hexdigest()
            storage = f"/storage/{sha256}"
            self.files[storage] = body
            self.redirects[path] = storage
            headers.update({"X-Linked-Etag": f'"{sha256}"', "X-Linked-Size": str(len(announced)),
                            "ETag": f'"{sha256}"'})
        else:
            self.files[path] = body
            blob = hashlib.sha1(b"blob %d\0" % len(announced) + announced).hexdigest()
            headers.update({"ETag": f'"{blob}"', "Content-Length": str(len(announced))})
        self.head_headers[path] = headers
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
