"""`candle-web serve` and the demo models it trains (<cache>/demo/): a model folder that
appears while the server runs is served without a restart, and while its trainer runs, the
trainer's progress file is served as /models/local/<name>.progress.json (for the page's
"demo model still training: 40%"), but not once it is stale."""
from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request

import pytest

from candle_web import serve

NAME = "t5-spell-numbers"
PROGRESS = {"model": NAME, "phase": "training", "step": 320, "steps": 800}
HTTP_TIMEOUT_S = 10


def fetch(url: str, method: str = "GET"):
    """(status, headers, body), HTTP errors returned instead of raised."""
    request = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S) as response:
            return response.status, response.headers, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.headers, error.read()


@pytest.fixture
def demo_site(tmp_path):
    web_root = tmp_path / "web"
    web_root.mkdir()
    (web_root / "index.html").write_text("<!doctype html><title>t</title>")
    demo_root = tmp_path / "demo"
    demo_root.mkdir()
    site = serve.make_site_config(web_root, serve_models=False, demo_root=demo_root)
    server, url = serve.start_in_thread("127.0.0.1", 0, site)
    yield {"url": url.rstrip("/"), "root": demo_root, "site": site}
    server.shutdown()
    server.server_close()


def write_model_folder(folder, config: dict) -> None:
    """As the trainer does: complete in a dot-named sibling, then renamed into place."""
    staging = folder.parent / f".{folder.name}-staging"
    staging.mkdir()
    (staging / "config.json").write_text(json.dumps(config))
    staging.rename(folder)


def test_a_demo_folder_that_appears_later_is_served(demo_site):
    config_url = f"{demo_site['url']}/models/local/{NAME}/config.json"
    assert fetch(config_url, "HEAD")[0] == 404
    (demo_site["root"] / "half-written").mkdir()  # no config.json: not a model folder
    assert fetch(f"{demo_site['url']}/models/local/half-written/x", "HEAD")[0] == 404
    staging = demo_site["root"] / f".{NAME}-staging"
    staging.mkdir()
    (staging / "config.json").write_text("{}")
    # The trainer's staging folder (dot-named) is never served, even once it looks complete.
    assert fetch(f"{demo_site['url']}/models/local/.{NAME}-staging/config.json")[0] == 404
    staging.rename(demo_site["root"] / NAME)
    status, headers, body = fetch(config_url)
    assert (status, body) == (200, b"{}")
    assert headers["Cross-Origin-Resource-Policy"] == "same-origin"


def test_an_explicit_local_model_wins_over_a_demo_folder(demo_site, tmp_path):
    write_model_folder(demo_site["root"] / NAME, {"from": "demo"})
    explicit = tmp_path / "explicit" / NAME
    explicit.mkdir(parents=True)
    (explicit / "config.json").write_text('{"from": "explicit"}')
    demo_site["site"].local_models[NAME] = explicit
    body = fetch(f"{demo_site['url']}/models/local/{NAME}/config.json")[2]
    assert json.loads(body) == {"from": "explicit"}


def test_progress_is_served_while_fresh(demo_site):
    url = f"{demo_site['url']}/models/local/{NAME}{serve.DEMO_PROGRESS_SUFFIX}"
    assert fetch(url)[0] == 404  # no training going on
    progress = demo_site["root"] / f"{NAME}{serve.DEMO_PROGRESS_SUFFIX}"
    progress.write_text(json.dumps(PROGRESS))
    status, headers, body = fetch(url)
    assert status == 200 and json.loads(body) == PROGRESS
    assert headers["Content-Type"] == "application/json"
    assert headers["Cache-Control"] == "no-cache"  # the page must see each new version
    # A trainer that was killed leaves its file behind: once stale it says nothing.
    stale = time.time() - serve.STALE_PROGRESS_S - 5
    os.utime(progress, (stale, stale))
    assert fetch(url)[0] == 404
    progress.write_text(json.dumps(PROGRESS))  # rewritten: fresh again
    assert fetch(url)[0] == 200
    progress.unlink()
    assert fetch(url)[0] == 404


@pytest.mark.parametrize("path", [
    f"/models/local/{NAME}",  # a folder name, not a progress file
    "/models/local/notes.json",
    f"/models/local/.{NAME}{serve.DEMO_PROGRESS_SUFFIX}",  # the trainer's temporary file
])
def test_nothing_else_is_served_beside_the_demo_folders(demo_site, path):
    for name in ("notes.json", f".{NAME}{serve.DEMO_PROGRESS_SUFFIX}"):
        (demo_site["root"] / name).write_text("{}")
    assert fetch(demo_site["url"] + path)[0] == 404


def test_without_a_demo_root_no_progress_is_served(tmp_path):
    (tmp_path / f"{NAME}{serve.DEMO_PROGRESS_SUFFIX}").write_text("{}")
    site = serve.SiteConfig(web_root=tmp_path)
    with pytest.raises(serve.RefusedPath):
        serve.resolve_request_path(site, f"/models/local/{NAME}{serve.DEMO_PROGRESS_SUFFIX}")


def test_the_demo_root_follows_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv(serve.CACHE_ENV_VAR, str(tmp_path))
    assert serve.demo_models_root() == tmp_path / serve.DEMO_MODELS_FOLDER
    assert serve.demo_progress_path(NAME) == tmp_path / "demo" / f"{NAME}.progress.json"
