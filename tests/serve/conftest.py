"""A candle-web server on a free port over a small synthetic site and model cache."""
from __future__ import annotations

import hashlib
import os

import numpy as np
import pytest

from candle_web import hub
from candle_web.serve import RegistryModelFiles, SiteConfig, start_in_thread

# Ranges are about offsets, so 64 KiB is plenty and keeps the suite fast. Seeded so that a
# failure reproduces.
PAYLOAD_BYTES = 64 * 1024
PAYLOAD_SEED = 20240501
MODEL_FILE_BYTES = 4096


@pytest.fixture(scope="module")
def payload() -> bytes:
    return np.random.default_rng(PAYLOAD_SEED).integers(0, 256, PAYLOAD_BYTES,
                                                       dtype=np.uint8).tobytes()


def _file_entry(name: str, data: bytes) -> dict:
    return {"name": name, "sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}


def _model(name: str, kind: str, files: dict, browser: bool = True) -> dict:
    return {"name": name, "kind": kind, "browser": browser, "sources": [],
            "files": [_file_entry(file_name, data) for file_name, data in files.items()]}


@pytest.fixture(scope="module")
def site_tree(tmp_path_factory, payload) -> dict:
    """web root + hub cache + a secret outside both, with symlinks in and out."""
    base = tmp_path_factory.mktemp("site")
    web, cache, outside = base / "web", base / "cache", base / "outside"
    for folder in (web / "sub", web / "vendor" / "pyodide", outside):
        folder.mkdir(parents=True)

    (web / "index.html").write_text("<!doctype html><title>candle-web test</title>\n")
    (web / "app.js").write_text("export const answer = 42;\n")
    (web / "worker.mjs").write_text("self.onmessage = () => {};\n")
    (web / "style.css").write_text("body { margin: 0; }\n")
    (web / "data.json").write_text('{"ok": true}\n')
    (web / "blob.bin").write_bytes(payload)
    (web / "clip.wav").write_bytes(b"RIFF\x00\x00\x00\x00WAVE")
    (web / "empty.txt").write_bytes(b"")
    (web / "sub" / "page.txt").write_text("nested\n")
    (web / ".hidden").write_text("dotfile\n")
    (web / "vendor" / "pyodide" / "pyodide.asm.wasm").write_bytes(b"\x00asm\x01\x00\x00\x00")
    (web / "vendor" / "pyodide" / "numpy-2.0.2-cp312-cp312-pyodide_2024_0_wasm32.whl") \
        .write_bytes(b"PK\x05\x06" + bytes(18))

    secret = outside / "secret.txt"
    secret.write_text("TOP-SECRET\n")
    os.symlink(secret, web / "escape.txt")  # symlink out of the root: must be refused
    os.symlink(web / "sub" / "page.txt", web / "alias.txt")  # inside the root: fine

    weights = payload[:MODEL_FILE_BYTES]
    registry = hub.Registry.from_dict({"schema": 1, "models": [
        _model("tiny-model", "bert", {"weights.bin": weights, "config.json": b"{}",
                                      "unverified.bin": b"not stamped"}),
        _model("kernel-test-input", "test-input", {"blocks.gguf": b"GGUF test input"}),
        _model("not-for-browser", "llama", {"w.gguf": b"GGUF private"}, browser=False),
        _model("leaky-model", "bert", {"leak.bin": secret.read_bytes()}),
    ]}, origin="tests/serve registry")

    saved_cache = os.environ.get(hub.ENV_CACHE)
    os.environ[hub.ENV_CACHE] = str(cache)  # the hub reads it on every call
    try:
        def place(model: str, file_name: str, data: bytes, stamp: bool = True) -> None:
            path = hub.cached_path(model, file_name, registry)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
            if stamp:
                hub.verify_cached(model, registry)

        place("tiny-model", "config.json", b"{}", stamp=False)
        place("tiny-model", "unverified.bin", b"not stamped", stamp=False)
        place("tiny-model", "weights.bin", weights)  # stamps the two above as well
        # Changed after verification: the stamp no longer matches, so it must not be served.
        hub.cached_path("tiny-model", "unverified.bin", registry).write_bytes(b"tampered")
        place("kernel-test-input", "blocks.gguf", b"GGUF test input")
        place("not-for-browser", "w.gguf", b"GGUF private")
        leak = hub.cached_path("leaky-model", "leak.bin", registry)
        leak.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(secret, leak)  # a cache entry pointing out of the cache: refused
        hub.verify_cached("leaky-model", registry)
        yield {"web": web, "cache": cache, "secret": secret, "registry": registry,
               "weights": weights}
    finally:
        if saved_cache is None:
            os.environ.pop(hub.ENV_CACHE, None)
        else:
            os.environ[hub.ENV_CACHE] = saved_cache


@pytest.fixture(scope="module")
def server_url(site_tree) -> str:
    site = SiteConfig(web_root=site_tree["web"],
                      model_files=RegistryModelFiles(site_tree["registry"]))
    server, url = start_in_thread(port=0, site=site)
    yield url.rstrip("/")
    server.shutdown()
    server.server_close()
