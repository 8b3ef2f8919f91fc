"""candle_web.hub against a local stand-in for the Hub: download, verification, fall-through,
offline switch, cache layout and stamps, local paths."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time

import numpy as np
import pytest

from candle_web import hub
from candle_web.core.errors import CandleError, HashMismatch, ModelNotFound
from tests.hub.hub_testlib import REVISION, file_entry, registry_data

REPO = "test-org/tiny-model"
# Bigger than hub.CHUNK_BYTES so that progress is reported several times.
WEIGHTS = np.random.default_rng(0).integers(0, 256, size=3 * (1 << 20) + 123,
                                            dtype=np.uint8).tobytes()
CONFIG = b'{"hidden_size": 8}\n'
# Some kernels advance file timestamps once per scheduler tick (up to 10 ms): a write within
# the tick that stamped the file could leave ctime unchanged.
COARSE_CLOCK_S = 0.03


def hf_registry(*extra_sources: dict, files: tuple[bytes, ...] = (WEIGHTS, CONFIG)):
    names = ["weights.bin", "config.json"][: len(files)]
    entries = [file_entry(name, body) for name, body in zip(names, files)]
    sources = [{"hf": {"repo": REPO, "revision": REVISION}}, *extra_sources]
    return hub.Registry.from_dict(registry_data("tiny", entries, sources))


def serve_all(fake_hub):
    fake_hub.add(REPO, REVISION, "weights.bin", WEIGHTS)
    fake_hub.add(REPO, REVISION, "config.json", CONFIG)


def snapshot_files(cache) -> list[str]:
    """Every file under the snapshots, including hidden temporaries."""
    root = cache / f"models--{REPO.replace('/', '--')}" / "snapshots"
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


def test_hub_download_streams_with_progress_into_hf_layout(cache, fake_hub):
    serve_all(fake_hub)
    registry = hf_registry()
    calls = []
    path = hub.fetch("tiny", "weights.bin", progress=lambda *c: calls.append(c),
                     registry=registry)

    assert path == cache / "models--test-org--tiny-model" / "snapshots" / REVISION / "weights.bin"
    assert path.read_bytes() == WEIGHTS
    assert calls[0] == (0, len(WEIGHTS), "weights.bin")
    assert calls[-1] == (len(WEIGHTS), len(WEIGHTS), "weights.bin")
    done = [c[0] for c in calls]
    assert done == sorted(done) and len(calls) >= 4  # 0, then one call per 1 MiB chunk
    assert hub.is_cached("tiny", "weights.bin", registry=registry)
    assert not hub.is_cached("tiny", registry=registry)  # config.json not fetched yet

    paths = hub.fetch_model("tiny", registry=registry)
    assert paths["config.json"].read_bytes() == CONFIG
    assert snapshot_files(cache) == [f"{REVISION}/config.json", f"{REVISION}/weights.bin"]
    # Cached: no new request, even with the server emptied.
    requests_before = len(fake_hub.requests)
    fake_hub.files.clear()
    assert hub.fetch("tiny", "weights.bin", registry=registry) == path
    assert len(fake_hub.requests) == requests_before


def test_404_is_a_clear_model_not_found(cache, fake_hub):
    registry = hf_registry()  # the server holds nothing
    with pytest.raises(ModelNotFound) as info:
        hub.fetch("tiny", "config.json", registry=registry)
    message = str(info.value)
    assert "HTTP 404" in message
    assert f"/{REPO}/resolve/{REVISION}/config.json" in message
    assert "tiny" in message and "models/fetch.py" in message


@pytest.mark.parametrize("how", ["same-size", "longer-announced", "longer-unannounced"])
def test_wrong_content_raises_hash_mismatch_and_leaves_nothing(cache, fake_hub, how):
    registry = hf_registry()
    wrong = bytearray(WEIGHTS)
    wrong[12345] ^= 0xFF
    if how != "same-size":
        wrong += b"extra bytes"
    path = fake_hub.add(REPO, REVISION, "weights.bin", bytes(wrong))
    if how == "longer-unannounced":
        fake_hub.unsized_paths.add(path)
    with pytest.raises(HashMismatch) as info:
        hub.fetch("tiny", "weights.bin", registry=registry)
    message = str(info.value)
    assert "weights.bin" in message
    assert hashlib.sha256(WEIGHTS).hexdigest() in message
    if how == "same-size":
        assert hashlib.sha256(bytes(wrong)).hexdigest() in message
    assert snapshot_files(cache) == []  # no partial file, no temporary left behind
    assert not hub.is_cached("tiny", "weights.bin", registry=registry)


def test_timeout_falls_through_to_next_source(cache, fake_hub, tmp_path, monkeypatch):
    monkeypatch.setenv("CANDLE_WEB_HF_TIMEOUT", "0.3")
    fake_hub.slow_paths.add(f"/{REPO}/resolve/{REVISION}/config.json")
    local = tmp_path / "local-copy"
    local.mkdir()
    (local / "config.json").write_bytes(CONFIG)
    registry = hf_registry({"local": str(local)})
    path = hub.fetch("tiny", "config.json", registry=registry)
    assert path.read_bytes() == CONFIG
    assert path.parent.name == REVISION  # cached in the snapshot, not used in place
    assert fake_hub.requests == [f"/{REPO}/resolve/{REVISION}/config.json"]


def test_timeout_without_other_source_is_a_clear_error(cache, fake_hub, monkeypatch):
    monkeypatch.setenv("CANDLE_WEB_HF_TIMEOUT", "0.3")
    fake_hub.slow_paths.add(f"/{REPO}/resolve/{REVISION}/config.json")
    registry = hf_registry()
    with pytest.raises(ModelNotFound, match=r"cannot reach .*timeout 0.3 s"):
        hub.fetch("tiny", "config.json", registry=registry)
    # The endpoint is remembered as down: the next file does not wait for the timeout again.
    with pytest.raises(ModelNotFound, match="unreachable moments ago"):
        hub.fetch("tiny", "weights.bin", registry=registry)
    assert len(fake_hub.requests) == 1


def test_offline_switch_skips_the_hub(cache, fake_hub, monkeypatch):
    serve_all(fake_hub)
    registry = hf_registry()
    monkeypatch.setenv("CANDLE_WEB_OFFLINE", "1")
    with pytest.raises(ModelNotFound, match="CANDLE_WEB_OFFLINE=1"):
        hub.fetch("tiny", "config.json", registry=registry)
    assert fake_hub.requests == []
    # The explicit argument wins over the environment, both ways.
    path = hub.fetch("tiny", "config.json", offline=False, registry=registry)
    assert hub.cached_origin("tiny", "config.json", registry=registry) == (
        f"{fake_hub.url}/{REPO}/resolve/{REVISION}/config.json")
    monkeypatch.delenv("CANDLE_WEB_OFFLINE")
    fake_hub.files.clear()
    assert hub.fetch("tiny", "config.json", offline=True, registry=registry) == path
    with pytest.raises(ModelNotFound, match="skipped"):
        hub.fetch("tiny", "weights.bin", offline=True, registry=registry)
    # cache_only asks no source at all, the Hub included, whatever the offline switch says.
    requests = len(fake_hub.requests)
    with pytest.raises(ModelNotFound, match=r"skipped \(cache only\)"):
        hub.fetch("tiny", "weights.bin", offline=False, cache_only=True, registry=registry)
    assert len(fake_hub.requests) == requests


def edit_in_place_keeping_size_and_mtime(path, byte: bytes = b"X") -> None:
    """Overwrite the first byte, then put the old mtime back: what a careless tool (or a
    deliberate tamperer) does. Only ctime, which no call can set, records the write."""
    time.sleep(COARSE_CLOCK_S)
    stat = path.stat()
    with open(path, "r+b") as handle:
        handle.write(byte)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    after = path.stat()
    assert (after.st_size, after.st_mtime_ns) == (stat.st_size, stat.st_mtime_ns)
    assert after.st_ctime_ns != stat.st_ctime_ns


def test_changed_file_is_not_trusted_and_verify_catches_silent_corruption(cache, fake_hub):
    serve_all(fake_hub)
    registry = hf_registry()
    path = hub.fetch("tiny", "config.json", registry=registry)
    assert hub.verify_cached("tiny", registry=registry) == {"weights.bin": "missing",
                                                            "config.json": "ok"}
    # Rewritten file (new mtime): the stamp no longer vouches for it, so it is fetched again.
    path.write_bytes(b"x" * len(CONFIG))
    assert not hub.is_cached("tiny", "config.json", registry=registry)
    assert hub.fetch("tiny", "config.json", registry=registry).read_bytes() == CONFIG

    # An in-place edit that restores size and mtime still changes ctime: the stamp no longer
    # matches, the re-hash finds the wrong bytes, and fetch downloads the file again.
    edit_in_place_keeping_size_and_mtime(path)
    assert not hub.is_cached("tiny", "config.json", registry=registry)
    requests = len(fake_hub.requests)
    assert hub.fetch("tiny", "config.json", registry=registry).read_bytes() == CONFIG
    assert len(fake_hub.requests) == requests + 1

    # Corruption that leaves every recorded attribute alone (bit rot on the disk; simulated
    # by re-stamping the damaged file's state) passes the cheap check; verify re-hashes.
    edit_in_place_keeping_size_and_mtime(path)
    hub.cache.write_stamp(REPO, REVISION, "config.json", hashlib.sha256(CONFIG).hexdigest(),
                          True, None)
    assert hub.is_cached("tiny", "config.json", registry=registry)
    assert hub.verify_cached("tiny", registry=registry)["config.json"] == "corrupt"
    assert not path.exists()
    assert not hub.is_cached("tiny", "config.json", registry=registry)


@pytest.mark.parametrize("change", ["touch", "copy_over", "old_stamp"])
def test_unchanged_content_with_a_new_state_is_rehashed_and_restamped(cache, fake_hub, change):
    """A stamp that does not match the file exactly costs one re-hash, not a download: a
    touched file (mtime), a file replaced by an identical copy (inode), and a stamp written
    before ctime and inode were recorded are all re-stamped and used as they are."""
    serve_all(fake_hub)
    registry = hf_registry()
    path = hub.fetch("tiny", "config.json", registry=registry)
    stamp_path = hub.cache.stamp_path(REPO, REVISION, "config.json")
    if change == "touch":
        os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
    elif change == "copy_over":
        copy = path.with_name("copy.tmp")
        copy.write_bytes(path.read_bytes())
        os.replace(copy, path)
    else:
        stamp = json.loads(stamp_path.read_text())
        del stamp["ctime_ns"], stamp["inode"]
        stamp_path.write_text(json.dumps(stamp))
    requests = len(fake_hub.requests)
    assert hub.fetch("tiny", "config.json", registry=registry).read_bytes() == CONFIG
    assert len(fake_hub.requests) == requests  # nothing downloaded
    stamp = json.loads(stamp_path.read_text())
    stat = path.stat()
    assert (stamp["size"], stamp["mtime_ns"], stamp["ctime_ns"], stamp["inode"]) == (
        stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino)
    assert stamp["origin"] == hub.hf_url(REPO, REVISION, "config.json")  # kept


def test_fetch_hf_refetches_an_unverified_file_edited_in_place(cache, fake_hub):
    """A file cached without a known sha256 is checked against the sha256 recorded when it
    was downloaded."""
    fake_hub.add("some-org/any-model", "main", "tokenizer.json", CONFIG)
    path = hub.fetch_hf("some-org/any-model", "main", "tokenizer.json")
    edit_in_place_keeping_size_and_mtime(path)
    requests = len(fake_hub.requests)
    assert hub.fetch_hf("some-org/any-model", "main", "tokenizer.json").read_bytes() == CONFIG
    assert len(fake_hub.requests) == requests + 1


def test_local_folder_and_file_as_model(tmp_path, cache):
    folder = tmp_path / "my-model"
    (folder / "sub").mkdir(parents=True)
    (folder / "config.json").write_bytes(CONFIG)
    (folder / "sub" / "extra.txt").write_text("x")
    assert hub.fetch(str(folder), "config.json") == folder / "config.json"
    assert hub.fetch(folder / "config.json") == folder / "config.json"
    assert hub.fetch_model(folder) == {"config.json": folder / "config.json"}  # not sub/
    with pytest.raises(ModelNotFound, match="no file 'model.bin'.*config.json"):
        hub.fetch(folder, "model.bin")
    with pytest.raises(ModelNotFound, match="is a folder"):
        hub.fetch(folder)
    with pytest.raises(ModelNotFound, match="no such file or folder"):
        hub.fetch(str(tmp_path / "absent"), "config.json")
    with pytest.raises(ModelNotFound, match="whisper-tiny.en"):
        hub.fetch("no-such-model", "config.json")  # the message lists registry models


def test_fetch_hf_any_repo_without_hash_warns_and_caches(cache, fake_hub, caplog):
    fake_hub.add("some-org/any-model", "main", "tokenizer.json", CONFIG)
    with caplog.at_level(logging.WARNING, logger="candle_web.hub"):
        path = hub.fetch_hf("some-org/any-model", "main", "tokenizer.json")
    assert path == (cache / "models--some-org--any-model" / "snapshots" / "main" /
                    "tokenizer.json")
    assert path.read_bytes() == CONFIG
    assert "no sha256 is known" in caplog.text
    fake_hub.files.clear()
    assert hub.fetch_hf("some-org/any-model", "main", "tokenizer.json", offline=True) == path


def test_fetch_hf_with_hash_verifies(cache, fake_hub):
    fake_hub.add("some-org/any-model", "main", "a.json", CONFIG)
    with pytest.raises(HashMismatch, match="a.json"):
        hub.fetch_hf("some-org/any-model", "main", "a.json", sha256="0" * 64)
    assert not (cache / "models--some-org--any-model" / "snapshots" / "main" / "a.json").exists()
    good = hashlib.sha256(CONFIG).hexdigest()
    assert hub.fetch_hf("some-org/any-model", "main", "a.json", sha256=good,
                        size=len(CONFIG)).read_bytes() == CONFIG
    with pytest.raises(ModelNotFound, match="org/name"):
        hub.fetch_hf("../escape", "main", "a.json")
    with pytest.raises(ModelNotFound, match="plain relative path"):
        hub.fetch_hf("some-org/any-model", "main", "../../a.json")


def test_every_error_is_a_candle_error():
    for error in (ModelNotFound, HashMismatch):
        assert issubclass(error, CandleError)
