"""The static site of `candle-web serve`: the page (web/), the registry's verified model files
from the hub's cache, and local model folders, as a small ASGI handler of its own rather than
Starlette's StaticFiles, because its guarantees are exact: explicit MIME types (browsers refuse
module scripts and streaming wasm compilation otherwise), single byte ranges only (several
ranges, or a reversed one, get the whole file, as RFC 9110 allows; 206/416 for resumable model
downloads), weak ETag comparison, If-Range, Last-Modified (304) and Cache-Control, and the
path checks before any file is opened: `..` segments, percent-encoded or not, dotfiles and
symlinks pointing elsewhere get 404/403."""
from __future__ import annotations

import asyncio
import email.utils
import os
import re
import time
import urllib.parse
from dataclasses import dataclass, field
from http import HTTPStatus
from pathlib import Path
from typing import Optional

from .drain import DEFAULT_DRAIN_S
from .hosts import IDLE_TIMEOUT_S, MAX_CONNECTIONS
from .replies import encode_headers, refuse, request_headers, respond

CACHE_ENV_VAR = "CANDLE_WEB_CACHE"
WEB_ROOT_ENV_VAR = "CANDLE_WEB_ROOT"
MODELS_URL_PREFIX = "/models/"
# /models/local/<name>/<file>: the folders given with --local-model (no registry model may be
# named "local", so the two never collide).
LOCAL_MODELS_SEGMENT = "local"
# <cache>/demo/<name>/: model folders trained on this machine for the demo page.
DEMO_MODELS_FOLDER = "demo"
# <cache>/demo/<name>.progress.json: a trainer's progress while <name>/ does not exist yet.
DEMO_PROGRESS_SUFFIX = ".progress.json"
# A live trainer rewrites its progress file every few seconds at most (each training step, each
# evaluation batch); one this old belongs to a run that was killed without removing it, and
# must not make the page say "still training" for ever.
STALE_PROGRESS_S = 120.0
VENDOR_PYODIDE_URL_PREFIX = "/vendor/pyodide/"
INDEX_FILE = "index.html"
COPY_CHUNK_BYTES = 1 << 20
# Registry models of this kind are test inputs only (e.g. Gemma, whose terms forbid shipping).
UNSERVED_MODEL_KIND = "test-input"

# Pinned by version in web/vendor/pyodide (the vendor script verifies every byte), so a day
# of caching is safe; everything else may change between builds and is revalidated (ETag).
PINNED_CACHE_CONTROL = "public, max-age=86400"
REVALIDATE_CACHE_CONTROL = "no-cache"

# Explicit table rather than the `mimetypes` module, whose answers depend on the host's
# /etc/mime.types (some map .js to application/x-javascript; few know .wasm).
MIME_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".mjs": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".json": "application/json",
    ".map": "application/json",
    ".wasm": "application/wasm",
    ".py": "text/x-python; charset=utf-8",
    ".txt": "text/plain; charset=utf-8",
    ".md": "text/markdown; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
    ".ico": "image/x-icon",
    ".zip": "application/zip",
    ".whl": "application/zip",
    ".wav": "audio/wav",
    ".mp3": "audio/mpeg",
    ".ogg": "audio/ogg",
    ".flac": "audio/flac",
    ".webm": "audio/webm",
    ".m4a": "audio/mp4",
}
DEFAULT_MIME_TYPE = "application/octet-stream"  # .bin, .gguf, .safetensors, .npz ...


def mime_type_for(path: Path) -> str:
    return MIME_TYPES.get(path.suffix.lower(), DEFAULT_MIME_TYPE)


def default_web_root() -> Path:
    """web/ next to pkg/ in a source checkout (pkg/candle_web/serve/site.py -> repo/web)."""
    override = os.environ.get(WEB_ROOT_ENV_VAR)
    if override:
        return Path(override)
    return Path(__file__).resolve().parents[3] / "web"


# --- the model cache ------------------------------------------------------------------------

class RegistryModelFiles:
    """Which /models/<model>/<file> requests may be answered, and from which cache file.

    Only files the registry (candle_web.hub) lists for a model that may be shipped -- not of
    kind `test-input` and not marked `"browser": false` -- and only once the hub has verified
    them in the cache (its sha256 stamp), so a half-downloaded or corrupt file is never served.
    The cache folder is read on every request ($CANDLE_WEB_CACHE, like the hub itself).
    """

    def __init__(self, registry=None):
        from .. import hub  # noqa: PLC0415  (stdlib-only, but not needed for plain static files)

        self._hub = hub
        self._registry = registry if registry is not None else hub.default_registry()

    def locate(self, model: str, file_name: str) -> Optional[tuple[Path, Path]]:
        """(cache root, file path) for a servable file, else None."""
        if model not in self._registry:
            return None
        entry = self._registry[model]
        if entry.kind == UNSERVED_MODEL_KIND or not entry.browser:
            return None
        if file_name not in {file.name for file in entry.files}:
            return None
        if not self._hub.is_cached(model, file_name, self._registry):
            return None
        return self._hub.cache_dir(), self._hub.cached_path(model, file_name, self._registry)


# --- request handling -----------------------------------------------------------------------

class RefusedPath(Exception):
    """A request path that must not be served; carries the HTTP status to answer with."""

    def __init__(self, status: HTTPStatus, reason: str):
        super().__init__(reason)
        self.status = status


@dataclass
class SiteConfig:
    web_root: Path
    # None: nothing is served under /models/.
    model_files: Optional[RegistryModelFiles] = None
    # Served under /models/local/<name>/: name -> folder. Tests may add entries while the
    # server runs (each request reads the mapping).
    local_models: dict = field(default_factory=dict)
    # <cache>/demo/ (or a test's folder): its model folders are served under /models/local/
    # too, looked up per request, so a model whose training finishes while the server runs is
    # served without a restart; the local_models of the same name win. None: not served.
    demo_root: Optional[Path] = None
    verbose: bool = False
    extra_headers: dict = field(default_factory=dict)
    idle_timeout_s: float = IDLE_TIMEOUT_S
    max_connections: int = MAX_CONNECTIONS
    # Host names served besides the bound address and the loopback names (`--allowed-host`,
    # lower case): the names a server on 0.0.0.0 is reached by. Others get 421.
    allowed_hosts: tuple = ()
    # After SIGTERM, requests in flight get this long to finish (`--drain-seconds`, drain.py).
    drain_timeout_s: float = DEFAULT_DRAIN_S


def _decoded_segments(url_path: str) -> list[str]:
    """Split a URL path into percent-decoded segments, refusing anything that could climb.

    Decoding happens once, before the check, so `%2e%2e` is caught like `..`; a doubly
    encoded `%252e%252e` decodes to the literal name `%2e%2e`, which is simply not found.
    """
    try:
        decoded = urllib.parse.unquote(url_path, errors="strict")
    except UnicodeDecodeError:
        raise RefusedPath(HTTPStatus.BAD_REQUEST, "path is not valid UTF-8") from None
    if "\x00" in decoded or "\\" in decoded:
        raise RefusedPath(HTTPStatus.NOT_FOUND, "NUL or backslash in path")
    segments = [segment for segment in decoded.split("/") if segment]
    for segment in segments:
        if segment in (".", "..") or segment.startswith("."):
            raise RefusedPath(HTTPStatus.NOT_FOUND, f"refused path segment {segment!r}")
    return segments


def _contained_file(root: Path, candidate: Path) -> Path:
    """The real path of candidate, which must be a regular file inside root after symlinks."""
    real_root = os.path.realpath(root)
    real_candidate = os.path.realpath(candidate)
    if os.path.commonpath([real_root, real_candidate]) != real_root:
        raise RefusedPath(HTTPStatus.FORBIDDEN, "path leaves the served folder")
    if not os.path.isfile(real_candidate):
        raise RefusedPath(HTTPStatus.NOT_FOUND, "no such file")
    return Path(real_candidate)


def _local_model_folder(config: SiteConfig, name: str) -> Optional[Path]:
    """The folder served as /models/local/<name>/: a --local-model one, else a complete demo
    model folder (its config.json is written before the trainer renames it into place)."""
    folder = config.local_models.get(name)
    if folder is not None:
        return Path(folder)
    if config.demo_root is not None and (config.demo_root / name / "config.json").is_file():
        return config.demo_root / name
    return None


def _demo_progress_file(config: SiteConfig, file_name: str) -> Path:
    """<demo root>/<name>.progress.json while a trainer keeps it fresh, else RefusedPath."""
    if config.demo_root is None or not file_name.endswith(DEMO_PROGRESS_SUFFIX):
        raise RefusedPath(HTTPStatus.NOT_FOUND, "no such local model file")
    path = _contained_file(config.demo_root, config.demo_root / file_name)
    if time.time() - path.stat().st_mtime > STALE_PROGRESS_S:
        raise RefusedPath(HTTPStatus.NOT_FOUND, "progress of a trainer that stopped")
    return path


def resolve_request_path(config: SiteConfig, url_path: str) -> Path:
    """Map a URL path to a file on disk or raise RefusedPath."""
    segments = _decoded_segments(url_path)
    if not segments:
        segments = [INDEX_FILE]
    if segments[0] == MODELS_URL_PREFIX.strip("/") and len(segments) == 3 \
            and segments[1] == LOCAL_MODELS_SEGMENT:
        return _demo_progress_file(config, segments[2])
    if segments[0] == MODELS_URL_PREFIX.strip("/") and len(segments) >= 4 \
            and segments[1] == LOCAL_MODELS_SEGMENT:
        folder = _local_model_folder(config, segments[2])
        if folder is None:
            raise RefusedPath(HTTPStatus.NOT_FOUND, "no such local model folder")
        return _contained_file(folder, folder.joinpath(*segments[3:]))
    if segments[0] == MODELS_URL_PREFIX.strip("/"):
        if len(segments) < 3 or config.model_files is None:
            raise RefusedPath(HTTPStatus.NOT_FOUND, "no such model file")
        located = config.model_files.locate(segments[1], "/".join(segments[2:]))
        if located is None:
            raise RefusedPath(HTTPStatus.NOT_FOUND, "not a servable model file")
        cache_root, file_path = located
        return _contained_file(cache_root, file_path)
    return _contained_file(config.web_root, config.web_root.joinpath(*segments))


_BYTE_RANGE = re.compile(r"^\s*(\d*)\s*-\s*(\d*)\s*$")


def _parse_single_range(header: str, size: int) -> Optional[tuple[int, int]]:
    """(first, last) inclusive for a satisfiable single `bytes=` range.

    Returns None when the header should be ignored (other units, several ranges, bad
    syntax: RFC 9110 lets a server answer those with the whole file) and raises ValueError
    when the range is well formed but unsatisfiable (416).
    """
    unit, _, spec = header.partition("=")
    if unit.strip().lower() != "bytes" or "," in spec:
        return None
    match = _BYTE_RANGE.match(spec)
    if match is None or match.group(1) == match.group(2) == "":
        return None
    first_text, last_text = match.groups()
    if not first_text:  # suffix range: the last N bytes
        suffix_length = int(last_text)
        if suffix_length == 0 or size == 0:
            raise ValueError("empty suffix range")
        return max(0, size - suffix_length), size - 1
    first = int(first_text)
    if last_text and int(last_text) < first:
        return None  # syntactically invalid (RFC 9110 14.1.1): ignore the header
    if first >= size:
        raise ValueError("range starts past the end")
    last = int(last_text) if last_text else size - 1
    return first, min(last, size - 1)


def _validators(stat: os.stat_result, url_path: str) -> dict:
    etag = f'"{stat.st_size:x}-{stat.st_mtime_ns:x}"'
    return {
        "ETag": etag,
        "Last-Modified": email.utils.formatdate(stat.st_mtime, usegmt=True),
        "Cache-Control": (PINNED_CACHE_CONTROL
                          if url_path.startswith(VENDOR_PYODIDE_URL_PREFIX)
                          else REVALIDATE_CACHE_CONTROL),
        "Accept-Ranges": "bytes",
    }


def _not_modified(headers: dict, stat: os.stat_result, etag: str) -> bool:
    if_none_match = headers.get("if-none-match")
    if if_none_match is not None:
        # Weak comparison (RFC 9110 13.1.2): W/ prefixes do not matter here.
        tags = [tag.strip().removeprefix("W/") for tag in if_none_match.split(",")]
        return "*" in tags or etag in tags
    if_modified_since = headers.get("if-modified-since")
    if if_modified_since:
        try:
            since = email.utils.parsedate_to_datetime(if_modified_since).timestamp()
        except (TypeError, ValueError):
            return False
        return int(stat.st_mtime) <= since
    return False


def _range_applies(headers: dict, validators: dict) -> bool:
    """If-Range: honour Range only when the client's copy is the current one."""
    if_range = headers.get("if-range")
    if if_range is None:
        return True
    if_range = if_range.strip()
    if if_range.startswith('"') or if_range.startswith("W/"):
        return if_range == validators["ETag"]
    return if_range == validators["Last-Modified"]


async def serve_file(site: SiteConfig, scope, send, url_path: str, send_body: bool) -> None:
    """GET and HEAD of one file under the site's roots: validators, single ranges, MIME type."""
    try:
        file_path = resolve_request_path(site, url_path)
    except RefusedPath as refusal:
        await refuse(send, refusal.status, send_body)
        return
    try:
        handle = file_path.open("rb")
    except OSError:
        await refuse(send, HTTPStatus.NOT_FOUND, send_body)
        return
    with handle:
        stat = os.fstat(handle.fileno())
        await _serve_open_file(request_headers(scope), send, handle, file_path, stat, url_path,
                               send_body)


async def _serve_open_file(headers: dict, send, handle, file_path: Path, stat: os.stat_result,
                           url_path: str, send_body: bool) -> None:
    size = stat.st_size
    validators = _validators(stat, url_path)
    if _not_modified(headers, stat, validators["ETag"]):
        await respond(send, HTTPStatus.NOT_MODIFIED, dict(validators, **{"Content-Length": "0"}))
        return

    status, first, last = HTTPStatus.OK, 0, size - 1
    range_header = headers.get("range")
    if range_header and _range_applies(headers, validators):
        try:
            byte_range = _parse_single_range(range_header, size)
        except ValueError:
            await respond(send, HTTPStatus.REQUESTED_RANGE_NOT_SATISFIABLE,
                          dict(validators, **{"Content-Range": f"bytes */{size}"}))
            return
        if byte_range is not None:
            status, (first, last) = HTTPStatus.PARTIAL_CONTENT, byte_range

    length = max(0, last - first + 1)
    reply = {"Content-Type": mime_type_for(file_path), "Content-Length": str(length)}
    if status == HTTPStatus.PARTIAL_CONTENT:
        reply["Content-Range"] = f"bytes {first}-{last}/{size}"
    reply.update(validators)
    await send({"type": "http.response.start", "status": int(status),
                "headers": encode_headers(reply)})
    if not (send_body and length):
        await send({"type": "http.response.body", "body": b""})
        return
    # Reads run in a thread so that a large model file never stalls the event loop (API
    # streams share it); `send` waits while the client's socket is full (flow control).
    loop = asyncio.get_running_loop()
    handle.seek(first)
    remaining = length
    while remaining:
        chunk = await loop.run_in_executor(None, handle.read, min(COPY_CHUNK_BYTES, remaining))
        if not chunk:  # the file shrank under us: end the connection rather than lie
            raise ConnectionAbortedError(f"{file_path} shrank while being served")
        remaining -= len(chunk)
        await send({"type": "http.response.body", "body": chunk, "more_body": bool(remaining)})
