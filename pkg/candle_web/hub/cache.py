"""The model cache: where fetched files live, the stamps that vouch for them, lookups and
re-verification.

The layout is huggingface_hub's (``models--<org>--<name>/snapshots/<revision>/<file>``). A stamp
(``.verified/<revision>/<file>.json``) written after a file's sha256 was checked records its
state (size, mtime, ctime, inode) and origin, so a later lookup trusts the file without
re-hashing while that state is unchanged; any difference re-hashes it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

from .registry import FileEntry, ModelEntry, Registry, default_registry

logger = logging.getLogger("candle_web.hub")

ENV_CACHE = "CANDLE_WEB_CACHE"
ENV_OFFLINE = "CANDLE_WEB_OFFLINE"
DEFAULT_CACHE = Path("~/.cache/candle-web")
CHUNK_BYTES = 1 << 20
STAMP_FOLDER = ".verified"
TRUE_WORDS = ("1", "true", "yes", "on")


def cache_dir() -> Path:
    """$CANDLE_WEB_CACHE, else ~/.cache/candle-web (read on every call so tests can redirect)."""
    configured = os.environ.get(ENV_CACHE)
    return Path(configured).expanduser() if configured else DEFAULT_CACHE.expanduser()


def is_offline(offline: bool | None = None) -> bool:
    if offline is not None:
        return offline
    return os.environ.get(ENV_OFFLINE, "").strip().lower() in TRUE_WORDS


def repo_folder(repo: str) -> Path:
    return cache_dir() / ("models--" + repo.replace("/", "--"))


def snapshot_path(repo: str, revision: str, filename: str) -> Path:
    return repo_folder(repo) / "snapshots" / revision / filename


def stamp_path(repo: str, revision: str, filename: str) -> Path:
    return repo_folder(repo) / STAMP_FOLDER / revision / (filename + ".json")


def file_state(stat: os.stat_result) -> dict:
    """What a stamp records of a file besides its hash. Size and mtime alone can be restored
    after an in-place edit (os.utime), so ctime is there too: the kernel sets it on every
    write or metadata change and no call sets it back; the inode catches a replaced file."""
    return {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "ctime_ns": stat.st_ctime_ns,
            "inode": stat.st_ino}


def write_stamp(repo: str, revision: str, filename: str, sha256: str, verified: bool,
                origin: str | None, stat: os.stat_result | None = None) -> dict:
    """Record that the file in its current state (or `stat`, taken before it was hashed) had
    this sha256, and where it came from (shown by `candle-web models`; None keeps the origin
    an earlier stamp recorded). Returns the stamp."""
    if stat is None:
        stat = snapshot_path(repo, revision, filename).stat()
    if origin is None:
        origin = (read_stamp(repo, revision, filename) or {}).get("origin")
    stamp = {"sha256": sha256, **file_state(stat), "verified": verified, "origin": origin}
    path = stamp_path(repo, revision, filename)
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(path.name + f".{os.getpid()}.tmp")
    temp.write_text(json.dumps(stamp), encoding="utf-8")
    os.replace(temp, path)
    return stamp


def read_stamp(repo: str, revision: str, filename: str) -> dict | None:
    """The stamp as recorded, whatever state the file is in now."""
    try:
        stamp = json.loads(stamp_path(repo, revision, filename).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return stamp if isinstance(stamp, dict) else None


def checked_stamp(repo: str, revision: str, filename: str, sha256: str | None = None,
                  size: int | None = None) -> dict | None:
    """The stamp of a cached file whose content is still what it should be, else None.

    A stamp whose recorded state (size, mtime, ctime, inode) matches the file exactly is
    trusted without hashing. Any difference -- an older stamp without ctime and inode
    included -- re-hashes the file against `sha256` (else the sha256 the stamp recorded): a
    match is re-stamped and used, a mismatch is logged and treated as absent, so the caller
    fetches the file again (the download replaces it atomically; nothing is deleted here,
    which could race with another process's download)."""
    path = snapshot_path(repo, revision, filename)
    try:
        stat = path.stat()
    except OSError:
        return None
    stamp = read_stamp(repo, revision, filename)
    if stamp is not None and all(stamp.get(k) == v for k, v in file_state(stat).items()):
        return stamp
    want_sha = sha256 or (stamp or {}).get("sha256")
    want_size = size if size is not None else (stamp or {}).get("size")
    if want_sha is None:
        return None  # never stamped and no expected hash: nothing to check it against
    actual_size, digest = hash_file(path)
    if digest != want_sha or (want_size is not None and actual_size != want_size):
        logger.warning("%s@%s/%s changed in the cache since it was verified (sha256 %s, %d "
                       "bytes; expected %s): not using it, it is fetched again", repo,
                       revision[:12], filename, digest, actual_size, want_sha)
        return None
    verified = sha256 is not None or bool((stamp or {}).get("verified"))
    return write_stamp(repo, revision, filename, digest, verified, None, stat)


def stamp_matches(stamp: dict | None, file: FileEntry) -> bool:
    """Whether a stamp vouches for the file: the registry's sha256 and size where it records
    them; for a file pinned by its Hub commit alone, a stamp written after the download was
    checked against the Hub's announced hash."""
    if stamp is None or not stamp.get("verified"):
        return False
    if file.sha256 is not None and stamp.get("sha256") != file.sha256:
        return False
    return file.size is None or stamp.get("size") == file.size


def cached_file(model: ModelEntry, file: FileEntry) -> Path | None:
    stamp = checked_stamp(model.cache_repo, model.cache_revision, file.name, file.sha256,
                           file.size)
    if not stamp_matches(stamp, file):
        return None
    return snapshot_path(model.cache_repo, model.cache_revision, file.name)


def cached_path(model: str, filename: str, registry: Registry | None = None) -> Path:
    """Where a registry file lives (or will live) in the cache."""
    entry = (registry or default_registry())[model]
    entry.file(filename)
    return snapshot_path(entry.cache_repo, entry.cache_revision, filename)


def cached_origin(model: str, filename: str, registry: Registry | None = None) -> str | None:
    """Where a cached, verified registry file came from (a URL, a wheel member, a local path),
    or None when it is not cached (or was cached before origins were recorded)."""
    entry = (registry or default_registry())[model]
    file = entry.file(filename)
    stamp = checked_stamp(entry.cache_repo, entry.cache_revision, file.name, file.sha256,
                           file.size)
    if not stamp_matches(stamp, file):
        return None
    return stamp.get("origin")


def is_cached(model: str, filename: str | None = None, registry: Registry | None = None) -> bool:
    """Whether the model's files (or one of them) are cached and verified (no re-hash)."""
    entry = (registry or default_registry())[model]
    files = [entry.file(filename)] if filename is not None else entry.files
    return all(cached_file(entry, file) is not None for file in files)


def verify_cached(model: str, registry: Registry | None = None) -> dict[str, str]:
    """Re-hash every cached file of a model: 'ok', 'missing', or 'corrupt' (then removed,
    with its stamp, so that the next fetch downloads it again)."""
    entry = (registry or default_registry())[model]
    report = {}
    for file in entry.files:
        path = snapshot_path(entry.cache_repo, entry.cache_revision, file.name)
        if not path.is_file():
            report[file.name] = "missing"
            continue
        # A file pinned by its Hub commit alone is checked against the sha256 recorded when
        # its download was verified against the Hub's announcement.
        recorded = read_stamp(entry.cache_repo, entry.cache_revision, file.name)
        want_sha = file.sha256 or (recorded or {}).get("sha256")
        want_size = file.size if file.size is not None else (recorded or {}).get("size")
        size, digest = hash_file(path)
        if size == want_size and digest == want_sha:
            write_stamp(entry.cache_repo, entry.cache_revision, file.name, digest, True, None)
            report[file.name] = "ok"
        else:
            logger.warning("%s/%s is corrupt in the cache (sha256 %s, %d bytes; expected %s, "
                           "%s bytes): removing it", model, file.name, digest, size,
                           want_sha, want_size)
            path.unlink()
            stamp_path(entry.cache_repo, entry.cache_revision, file.name).unlink(missing_ok=True)
            report[file.name] = "corrupt"
    return report


def hash_file(path: Path) -> tuple[int, str]:
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as handle:
        while chunk := handle.read(CHUNK_BYTES):
            digest.update(chunk)
            size += len(chunk)
    return size, digest.hexdigest()
