"""`candle-web serve`: isolation headers, MIME types, ranges, validators, traversal."""
from __future__ import annotations

import http.client
import os
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from candle_web.serve import ISOLATION_HEADERS, SiteConfig, start_in_thread

REPO_ROOT = Path(__file__).resolve().parents[2]
HTTP_TIMEOUT_S = 10


def fetch(url: str, method: str = "GET", headers: dict | None = None):
    """(status, headers, body) via urllib, with HTTP errors returned instead of raised."""
    request = urllib.request.Request(url, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S) as response:
            return response.status, response.headers, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.headers, error.read()


def raw_get(server_url: str, raw_path: str):
    """Send the path bytes exactly as given (urllib would not, for some of them)."""
    parsed = urllib.parse.urlsplit(server_url)
    connection = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=HTTP_TIMEOUT_S)
    try:
        connection.putrequest("GET", raw_path, skip_accept_encoding=True)
        connection.endheaders()
        response = connection.getresponse()
        return response.status, response.getheaders(), response.read()
    finally:
        connection.close()


def assert_isolated(headers) -> None:
    for name, value in ISOLATION_HEADERS.items():
        assert headers.get(name) == value, f"{name} missing or wrong: {headers.get(name)!r}"


# --- basics ---------------------------------------------------------------------------------

def test_root_serves_index_with_isolation_headers(server_url, site_tree):
    status, headers, body = fetch(server_url + "/")
    assert status == 200
    assert headers["Content-Type"] == "text/html; charset=utf-8"
    assert body == (site_tree["web"] / "index.html").read_bytes()
    assert headers["Cross-Origin-Opener-Policy"] == "same-origin"
    assert headers["Cross-Origin-Embedder-Policy"] == "require-corp"
    assert headers["Cross-Origin-Resource-Policy"] == "same-origin"
    assert_isolated(headers)


@pytest.mark.parametrize("path, expected_type", [
    ("/app.js", "text/javascript; charset=utf-8"),
    ("/worker.mjs", "text/javascript; charset=utf-8"),
    ("/style.css", "text/css; charset=utf-8"),
    ("/data.json", "application/json"),
    ("/blob.bin", "application/octet-stream"),
    ("/clip.wav", "audio/wav"),
    ("/vendor/pyodide/pyodide.asm.wasm", "application/wasm"),
    ("/vendor/pyodide/numpy-2.0.2-cp312-cp312-pyodide_2024_0_wasm32.whl", "application/zip"),
    ("/models/tiny-model/weights.bin", "application/octet-stream"),
    ("/models/tiny-model/config.json", "application/json"),
])
def test_mime_types(server_url, path, expected_type):
    status, headers, _ = fetch(server_url + path)
    assert status == 200, path
    assert headers["Content-Type"] == expected_type
    assert headers["X-Content-Type-Options"] == "nosniff"


def test_errors_carry_isolation_headers_too(server_url):
    status, headers, _ = fetch(server_url + "/no-such-file.js")
    assert status == 404
    assert_isolated(headers)


def test_head_has_headers_and_no_body(server_url, payload):
    status, headers, body = fetch(server_url + "/blob.bin", method="HEAD")
    assert status == 200
    assert body == b""
    assert int(headers["Content-Length"]) == len(payload)
    assert headers["Accept-Ranges"] == "bytes"


def test_empty_file(server_url):
    status, headers, body = fetch(server_url + "/empty.txt")
    assert (status, body, headers["Content-Length"]) == (200, b"", "0")


def test_post_is_refused(server_url):
    status, headers, _ = fetch(server_url + "/index.html", method="POST")
    assert status == 405
    assert headers["Allow"] == "GET, HEAD"


def test_cache_control_pins_vendored_pyodide_only(server_url):
    _, pinned, _ = fetch(server_url + "/vendor/pyodide/pyodide.asm.wasm")
    _, page, _ = fetch(server_url + "/app.js")
    assert "max-age=" in pinned["Cache-Control"]
    assert page["Cache-Control"] == "no-cache"


# --- ranges ---------------------------------------------------------------------------------

@pytest.mark.parametrize("range_header, first, last", [
    ("bytes=0-0", 0, 0),
    ("bytes=10-19", 10, 19),
    ("bytes=65000-", 65000, 65535),
    ("bytes=-100", 65436, 65535),
    ("bytes=60000-999999", 60000, 65535),  # end past the file is clipped
    ("bytes=-999999", 0, 65535),  # suffix longer than the file: whole file
])
def test_satisfiable_ranges(server_url, payload, range_header, first, last):
    status, headers, body = fetch(server_url + "/blob.bin", headers={"Range": range_header})
    assert status == 206
    assert headers["Content-Range"] == f"bytes {first}-{last}/{len(payload)}"
    assert int(headers["Content-Length"]) == last - first + 1
    assert body == payload[first:last + 1]
    assert_isolated(headers)


@pytest.mark.parametrize("range_header", ["bytes=65536-", "bytes=70000-70010", "bytes=-0"])
def test_unsatisfiable_ranges_get_416(server_url, payload, range_header):
    status, headers, body = fetch(server_url + "/blob.bin", headers={"Range": range_header})
    assert status == 416
    assert headers["Content-Range"] == f"bytes */{len(payload)}"
    assert body == b""


@pytest.mark.parametrize("range_header", [
    "bytes=0-1,5-6",  # several ranges: we answer with the whole file, as RFC 9110 allows
    "bytes=20-10",  # last < first is invalid syntax: ignore
    "items=0-5",
    "bytes=abc",
])
def test_ignored_ranges_give_whole_file(server_url, payload, range_header):
    status, _, body = fetch(server_url + "/blob.bin", headers={"Range": range_header})
    assert status == 200
    assert body == payload


def test_range_on_model_file(server_url, site_tree):
    weights = site_tree["weights"]
    status, headers, body = fetch(server_url + "/models/tiny-model/weights.bin",
                                  headers={"Range": "bytes=4000-"})
    assert status == 206
    assert headers["Content-Range"] == f"bytes 4000-4095/{len(weights)}"
    assert body == weights[4000:]
    status, _, body = fetch(server_url + "/models/tiny-model/weights.bin")
    assert (status, body) == (200, weights)


@pytest.mark.parametrize("path", [
    "/models/kernel-test-input/blocks.gguf",  # kind test-input: never served
    "/models/not-for-browser/w.gguf",  # "browser": false
    "/models/tiny-model/unverified.bin",  # changed since the hub verified it
    "/models/tiny-model/not-in-registry.bin",
    "/models/unknown-model/weights.bin",
])
def test_only_verified_shippable_registry_files_are_served(server_url, site_tree, path):
    status, _, _ = fetch(server_url + path)
    assert status == 404
    # The files do exist in the cache: the refusal is the policy, not a missing file.
    cache_files = {p.name for p in site_tree["cache"].rglob("*") if p.is_file()}
    if "unknown-model" not in path and "not-in-registry" not in path:
        assert path.rsplit("/", 1)[1] in cache_files


# --- validators -----------------------------------------------------------------------------

def test_etag_and_last_modified_give_304(server_url):
    status, headers, _ = fetch(server_url + "/data.json")
    assert status == 200
    etag, last_modified = headers["ETag"], headers["Last-Modified"]
    assert etag.startswith('"') and etag.endswith('"')

    status, not_modified, body = fetch(server_url + "/data.json",
                                       headers={"If-None-Match": etag})
    assert (status, body) == (304, b"")
    assert not_modified["ETag"] == etag
    assert_isolated(not_modified)

    status, _, body = fetch(server_url + "/data.json",
                            headers={"If-None-Match": f'"other", W/{etag}'})
    assert (status, body) == (304, b"")

    status, _, _ = fetch(server_url + "/data.json", headers={"If-Modified-Since": last_modified})
    assert status == 304
    status, _, _ = fetch(server_url + "/data.json", headers={"If-None-Match": '"stale"'})
    assert status == 200


def test_changed_file_gets_new_etag_and_if_range_falls_back(server_url, site_tree):
    target = site_tree["web"] / "sub" / "changing.txt"
    target.write_text("first version\n")
    _, headers, _ = fetch(server_url + "/sub/changing.txt")
    old_etag = headers["ETag"]

    status, _, body = fetch(server_url + "/sub/changing.txt",
                            headers={"Range": "bytes=0-4", "If-Range": old_etag})
    assert (status, body) == (206, b"first")

    target.write_text("second version, longer\n")
    later = time.time() + 5  # a different mtime even on coarse-grained file systems
    os.utime(target, (later, later))
    status, headers, body = fetch(server_url + "/sub/changing.txt",
                                  headers={"If-None-Match": old_etag})
    assert status == 200 and headers["ETag"] != old_etag
    status, _, body = fetch(server_url + "/sub/changing.txt",
                            headers={"Range": "bytes=0-4", "If-Range": old_etag})
    assert (status, body) == (200, b"second version, longer\n")


# --- traversal ------------------------------------------------------------------------------

@pytest.mark.parametrize("raw_path", [
    "/../outside/secret.txt",
    "/../../outside/secret.txt",
    "/sub/../../outside/secret.txt",
    "/%2e%2e/outside/secret.txt",
    "/%2E%2E/outside/secret.txt",
    "/sub/%2e%2e/%2e%2e/outside/secret.txt",
    "/%2e%2e%2foutside%2fsecret.txt",
    "/sub/..%2F..%2Foutside%2Fsecret.txt",
    "/%252e%252e/outside/secret.txt",  # double encoding decodes to a literal name: not found
    "/..%5coutside%5csecret.txt",
    "/.hidden",
    "/%2ehidden",
    "//etc/passwd",
    "/sub/page.txt%00.js",
    "/models/tiny-model/../../outside/secret.txt",
    "/models/%2e%2e/outside/secret.txt",
    "/models/tiny-model",
    "/models/tiny-model/a/b",
])
def test_traversal_is_refused(server_url, raw_path):
    status, headers, body = raw_get(server_url, raw_path)
    assert status in (403, 404), f"{raw_path} -> {status}"
    assert b"TOP-SECRET" not in body
    assert b"root:" not in body


def test_symlink_out_of_root_is_forbidden(server_url):
    status, _, body = raw_get(server_url, "/escape.txt")
    assert status == 403
    assert b"TOP-SECRET" not in body
    status, _, body = raw_get(server_url, "/models/leaky-model/leak.bin")
    assert status == 403
    assert b"TOP-SECRET" not in body


def test_symlink_inside_root_is_served(server_url):
    status, _, body = fetch(server_url + "/alias.txt")
    assert (status, body) == (200, b"nested\n")


def test_query_string_is_ignored(server_url, site_tree):
    status, _, body = fetch(server_url + "/app.js?v=123")
    assert (status, body) == (200, (site_tree["web"] / "app.js").read_bytes())


def test_no_models_without_cache(site_tree):
    server, url = start_in_thread(port=0, site=SiteConfig(web_root=site_tree["web"],
                                                          model_files=None))
    try:
        status, _, _ = fetch(url + "models/tiny-model/weights.bin")
        assert status == 404
        status, _, _ = fetch(url + "app.js")
        assert status == 200
    finally:
        server.shutdown()
        server.server_close()


# --- the command line -----------------------------------------------------------------------

def test_cli_prints_url_and_serves_the_real_web_folder():
    """`python -m candle_web.serve --port 0` on the checkout's web/: the real page shell."""
    environment = dict(os.environ, PYTHONUNBUFFERED="1")
    environment["PYTHONPATH"] = os.pathsep.join(
        [str(REPO_ROOT / "pkg"), environment.get("PYTHONPATH", "")])
    process = subprocess.Popen(
        [sys.executable, "-m", "candle_web.serve", "--port", "0", "--quiet"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=environment)
    try:
        line = process.stdout.readline()
        assert line.startswith("candle-web: serving "), line
        url = line.rsplit(" at ", 1)[1].strip()
        assert url.startswith("http://127.0.0.1:") and not url.endswith(":0/")
        status, headers, body = fetch(url)
        assert status == 200 and b"<html" in body.lower()
        assert_isolated(headers)
        status, headers, _ = fetch(url + "worker.js")
        assert status == 200 and headers["Content-Type"] == "text/javascript; charset=utf-8"
    finally:
        process.terminate()
        process.wait(timeout=HTTP_TIMEOUT_S)
