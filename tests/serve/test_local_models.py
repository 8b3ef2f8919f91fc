"""`candle-web serve --local-model DIR`: a model folder outside the registry served under
/models/local/<DIR name>/ (the Text-to-text view loads a T5 from there), and nothing else."""
from __future__ import annotations

import http.client
import os
import urllib.error
import urllib.request

import pytest

from candle_web import serve

WEIGHTS = bytes(range(256)) * 40


@pytest.fixture(scope="module")
def local_site(tmp_path_factory):
    root = tmp_path_factory.mktemp("local-models")
    web_root = root / "web"
    web_root.mkdir()
    (web_root / "index.html").write_text("<!doctype html><title>t</title>")
    folder = root / "my-t5"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(WEIGHTS)
    (folder / "config.json").write_text('{"d_model": 8}')
    (folder / ".hidden").write_text("secret")
    (root / "outside.txt").write_text("not served")
    os.symlink(root / "outside.txt", folder / "escape.txt")
    site = serve.make_site_config(web_root, serve_models=False, local_models=[folder])
    server, url = serve.start_in_thread("127.0.0.1", 0, site)
    yield {"url": url.rstrip("/"), "folder": folder, "root": root, "site": site}
    server.shutdown()
    server.server_close()


def status_of(url: str) -> int:
    try:
        with urllib.request.urlopen(url) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def test_local_model_files_are_served_with_isolation_headers(local_site):
    with urllib.request.urlopen(local_site["url"] + "/models/local/my-t5/model.safetensors") as r:
        assert r.read() == WEIGHTS
        assert r.headers["Content-Length"] == str(len(WEIGHTS))
        assert r.headers["Cross-Origin-Resource-Policy"] == "same-origin"
    assert local_site["site"].local_models == {"my-t5": local_site["folder"].resolve()}


@pytest.mark.parametrize("path", [
    "/models/local/other/config.json",  # no such local model
    "/models/local/my-t5/missing.json",
    "/models/local/my-t5/.hidden",  # dotfiles are never served
    "/models/local/my-t5/",  # a folder is not a file
    "/models/my-t5/config.json",  # not a registry model (and no registry here)
])
def test_anything_else_is_not_found(local_site, path):
    assert status_of(local_site["url"] + path) == 404


@pytest.mark.parametrize("raw_path", [
    "/models/local/my-t5/../../outside.txt",
    "/models/local/my-t5/%2e%2e/outside.txt",
    "/models/local/%2e%2e/outside.txt",
])
def test_climbing_out_is_refused(local_site, raw_path):
    host, port = local_site["url"].removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        connection.request("GET", raw_path)
        assert connection.getresponse().status in (403, 404)
    finally:
        connection.close()


def test_symlink_out_of_the_folder_is_forbidden(local_site):
    assert status_of(local_site["url"] + "/models/local/my-t5/escape.txt") == 403


def test_bad_local_model_arguments_are_refused(tmp_path):
    with pytest.raises(ValueError, match="not a folder"):
        serve.local_model_map([tmp_path / "nope"])
    (tmp_path / "a" / "same").mkdir(parents=True)
    (tmp_path / "b" / "same").mkdir(parents=True)
    with pytest.raises(ValueError, match="two folders named 'same'"):
        serve.local_model_map([tmp_path / "a" / "same", tmp_path / "b" / "same"])
    with pytest.raises(SystemExit) as exit_info:
        serve.main(["--local-model", str(tmp_path / "nope"), "--port", "0"])
    assert exit_info.value.code == 2
