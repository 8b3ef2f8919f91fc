"""Registry models pinned by a Hub commit alone (T5: no offline mirror, some sha256s unknown
here): files are checked against the content hash the Hub announces for the commit, against a
local stand-in for the Hub that answers HEAD the way the Hub does."""

from __future__ import annotations

import hashlib
import shutil
import subprocess

import numpy as np
import pytest

from candle_web import hub
from candle_web.core.errors import FormatError, HashMismatch, ModelNotFound
from candle_web.hub.content import GIT_BLOB_SHA1, AnnouncedContent, ContentChecker
from tests.hub.hub_testlib import REVISION, registry_data

REPO = "test-org/tiny-t5"
WEIGHTS = np.random.default_rng(1).integers(0, 256, size=(1 << 20) + 77, dtype=np.uint8).tobytes()
CONFIG = b'{"d_model": 8, "num_layers": 1}\n'
TOKENIZER = b'{"version": "1.0", "model": {"type": "Unigram"}}\n'


def commit_pinned_registry(weights_sha256: str | None = None, revision: str = REVISION,
                           extra_sources: tuple = ()):
    files = [{"name": "model.safetensors", "sha256": weights_sha256 or
              hashlib.sha256(WEIGHTS).hexdigest()},
             {"name": "config.json"}, {"name": "tokenizer.json"}]
    sources = [{"hf": {"repo": REPO, "revision": revision}}, *extra_sources]
    data = registry_data("tiny-t5", files, sources)
    data["models"][0]["size"] = len(WEIGHTS) + 200
    return hub.Registry.from_dict(data)


def serve_like_the_hub(fake_hub, config_body: bytes = CONFIG, weights_body: bytes = WEIGHTS):
    fake_hub.add_announced(REPO, REVISION, "model.safetensors", weights_body, lfs=True,
                           announced=WEIGHTS)
    fake_hub.add_announced(REPO, REVISION, "config.json", config_body, lfs=False,
                           announced=CONFIG)
    fake_hub.add_announced(REPO, REVISION, "tokenizer.json", TOKENIZER, lfs=False)


def test_registry_allows_missing_hashes_only_for_a_model_pinned_to_one_hub_commit():
    registry = commit_pinned_registry()
    model = registry["tiny-t5"]
    assert not model.pinned_by_sha256
    assert model.file("config.json").sha256 is None and model.file("config.json").size is None
    assert model.size == len(WEIGHTS) + 200  # the approximate size the entry gives
    files = [{"name": "config.json"}]
    not_allowed = {
        "a branch, not a commit": [{"hf": {"repo": REPO, "revision": "main"}}],
        "a second source": [{"hf": {"repo": REPO, "revision": REVISION}}, {"local": "/models"}],
        "no Hub source": [{"local": "/models"}],
    }
    for why, sources in not_allowed.items():
        with pytest.raises(FormatError, match=r"'config.json' has no sha256.*40-hex commit"):
            hub.Registry.from_dict(registry_data("m", files, sources))
    without_size = registry_data("m", files, [{"hf": {"repo": REPO, "revision": REVISION}}])
    with pytest.raises(FormatError, match="approximate 'size'"):
        hub.Registry.from_dict(without_size)


def test_commit_pinned_model_downloads_checked_against_the_hub_and_caches(cache, fake_hub):
    serve_like_the_hub(fake_hub)
    registry = commit_pinned_registry()
    paths = hub.fetch_model("tiny-t5", registry=registry)
    assert paths["model.safetensors"].read_bytes() == WEIGHTS
    assert paths["config.json"].read_bytes() == CONFIG
    assert paths["tokenizer.json"].read_bytes() == TOKENIZER
    # Each file was announced (HEAD) before the download; the weights came from storage.
    assert f"HEAD /{REPO}/resolve/{REVISION}/config.json" in fake_hub.requests
    assert f"/storage/{hashlib.sha256(WEIGHTS).hexdigest()}" in fake_hub.requests
    assert hub.is_cached("tiny-t5", registry=registry)
    before = len(fake_hub.requests)
    assert hub.fetch_model("tiny-t5", registry=registry) == paths
    assert len(fake_hub.requests) == before  # verified stamps: no new request
    assert hub.verify_cached("tiny-t5", registry=registry) == {
        "model.safetensors": "ok", "config.json": "ok", "tokenizer.json": "ok"}
    # Silent corruption of a file pinned by the commit alone is still caught.
    paths["config.json"].write_bytes(CONFIG.replace(b"8", b"9"))
    assert hub.verify_cached("tiny-t5", registry=registry)["config.json"] == "corrupt"
    assert not paths["config.json"].exists()


def test_bytes_that_differ_from_the_announced_git_blob_are_refused(cache, fake_hub):
    serve_like_the_hub(fake_hub, config_body=CONFIG.replace(b"8", b"9"))
    registry = commit_pinned_registry()
    with pytest.raises(HashMismatch) as info:
        hub.fetch("tiny-t5", "config.json", registry=registry)
    assert "config.json" in str(info.value) and "git-blob-sha1" in str(info.value.__cause__)
    assert not hub.cached_path("tiny-t5", "config.json", registry=registry).exists()


def test_storage_bytes_that_differ_from_the_announced_sha256_are_refused(cache, fake_hub):
    tampered = bytearray(WEIGHTS)
    tampered[100] ^= 1
    serve_like_the_hub(fake_hub, weights_body=bytes(tampered))
    registry = commit_pinned_registry()
    with pytest.raises(HashMismatch, match="model.safetensors"):
        hub.fetch("tiny-t5", "model.safetensors", registry=registry)
    assert not hub.cached_path("tiny-t5", "model.safetensors", registry=registry).exists()


def test_an_announcement_contradicting_the_registry_pin_downloads_nothing(cache, fake_hub):
    serve_like_the_hub(fake_hub)
    registry = commit_pinned_registry(weights_sha256="ab" * 32)
    with pytest.raises(HashMismatch) as info:
        hub.fetch("tiny-t5", "model.safetensors", registry=registry)
    cause = str(info.value.__cause__)
    assert "ab" * 32 in cause and hashlib.sha256(WEIGHTS).hexdigest() in cause
    assert not any(r.startswith("/storage/") for r in fake_hub.requests)


def test_no_announced_hash_or_another_commit_is_a_clear_failure(cache, fake_hub):
    serve_like_the_hub(fake_hub)
    path = f"/{REPO}/resolve/{REVISION}/config.json"
    fake_hub.head_headers[path] = {"X-Repo-Commit": REVISION}  # a server naming no hash
    registry = commit_pinned_registry()
    with pytest.raises(ModelNotFound, match="names no content hash"):
        hub.fetch("tiny-t5", "config.json", registry=registry)
    fake_hub.head_headers[path] = {"X-Repo-Commit": "f" * 40, "ETag": '"' + "0" * 40 + '"',
                                   "Content-Length": "3"}
    with pytest.raises(ModelNotFound, match=f"resolved commit {'f' * 40}, not the pinned"):
        hub.fetch("tiny-t5", "config.json", registry=registry)


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_git_blob_check_agrees_with_git_hash_object(tmp_path):
    """The id the Hub announces for a file kept in git is git's own blob id."""
    body = (tmp_path / "sample.json")
    body.write_bytes(TOKENIZER * 3)
    git_id = subprocess.run(["git", "hash-object", str(body)], capture_output=True, text=True,
                            check=True).stdout.strip()
    announced = AnnouncedContent(REVISION, GIT_BLOB_SHA1, git_id, len(TOKENIZER * 3))
    checker = ContentChecker(announced, "sample.json", "test")
    checker.update(TOKENIZER)
    checker.update(TOKENIZER * 2)
    checker.check(len(TOKENIZER * 3))  # no HashMismatch


def test_shipped_t5_entries_are_pinned_to_hub_commits():
    registry = hub.default_registry()
    # sha256 of model.safetensors as the Hub's file pages publish them for these commits.
    expected = {
        "t5-small": ("google-t5/t5-small", "df1b051c49625cf57a3d0d8d3863ed4d13564fe4",
                     "bd944e5f1b3ad9b70dd9d00010a517059e19265671076b8b0a4a58d9491842bc"),
        "flan-t5-small": ("google/flan-t5-small", "0fc9ddf78a1e988dac52e2dac162b0ede4fd74ab",
                          "495fa51e204676f1a857a9fc13c4c89f3f5ba9f480b898cebca02add25e6d749"),
    }
    for name, (repo, revision, weights_sha) in expected.items():
        model = registry[name]
        assert model.kind == "t5" and not model.browser
        assert model.sources == ({"hf": {"repo": repo, "revision": revision}},)
        assert model.file("model.safetensors").sha256 == weights_sha
        assert {f.name for f in model.files} == {"model.safetensors", "config.json",
                                                 "tokenizer.json"}
