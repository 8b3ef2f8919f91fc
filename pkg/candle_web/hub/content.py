"""What the Hub says a file at a commit is (its content hash and size), and checking a download
against it.

Most registry files are pinned by a sha256 recorded in registry.json. Models with no offline
mirror (T5) are pinned by a Hub commit instead, and the sha256 of some of their files could not
be recorded here. The Hub is content-addressed, so the commit still pins the bytes, and its
answer to a HEAD on /<repo>/resolve/<commit>/<file> (before any redirect) names them:

  X-Repo-Commit                  the commit the revision resolved to;
  X-Linked-Etag, X-Linked-Size   for a file kept in LFS/Xet storage (the weights): its sha256
                                 and size; the answer itself is a redirect to the storage CDN,
                                 which is not followed for the HEAD;
  ETag, Content-Length           for a file kept in git itself (config.json, tokenizer.json):
                                 its git blob id, the sha1 of b"blob <size>\\0" + the bytes.

A download is then checked against that hash while it streams, like a registry sha256: a file
whose hash the Hub does not announce is refused rather than cached unchecked.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
import urllib.error
import urllib.parse
import urllib.request

from ..core.errors import HashMismatch
from .registry import FileEntry

SHA256 = "sha256"
GIT_BLOB_SHA1 = "git-blob-sha1"
# Renamed repos answer with a relative redirect to the new name; follow a few of those.
MAX_RELATIVE_REDIRECTS = 5
_HEX40 = re.compile(r"^[0-9a-f]{40}$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


class AnnouncementError(Exception):
    """The Hub could not be asked, or gave no usable content hash (a source failure)."""


@dataclasses.dataclass(frozen=True)
class AnnouncedContent:
    """A file's content as the Hub names it at one commit."""

    commit: str | None
    algorithm: str  # SHA256 or GIT_BLOB_SHA1
    digest: str
    size: int | None


class _DoNotRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None  # urlopen then raises HTTPError(30x), whose headers we read


def _unquoted_etag(value: str | None) -> str:
    value = (value or "").strip()
    if value.startswith("W/"):
        value = value[2:]
    return value.strip('"').lower()


def _size_header(value: str | None) -> int | None:
    return int(value) if value and value.strip().isdigit() else None


def parse_announcement(headers, url: str) -> AnnouncedContent:
    """The content a HEAD answer's headers name; AnnouncementError when they name none."""
    commit = (headers.get("X-Repo-Commit") or "").strip().lower() or None
    linked = _unquoted_etag(headers.get("X-Linked-Etag"))
    if linked:
        if not _HEX64.match(linked):
            raise AnnouncementError(f"{url}: X-Linked-Etag {linked!r} is not a sha256")
        return AnnouncedContent(commit, SHA256, linked, _size_header(headers.get("X-Linked-Size")))
    etag = _unquoted_etag(headers.get("ETag"))
    size = _size_header(headers.get("Content-Length"))
    if _HEX40.match(etag) and size is not None:
        return AnnouncedContent(commit, GIT_BLOB_SHA1, etag, size)
    if _HEX64.match(etag):
        return AnnouncedContent(commit, SHA256, etag, size)
    raise AnnouncementError(f"{url}: the server names no content hash for the file (ETag "
                            f"{headers.get('ETag')!r}, no X-Linked-Etag), so it cannot be "
                            f"checked; refusing it")


def announced_content(url: str, timeout: float, user_agent: str) -> AnnouncedContent:
    """HEAD url without following the redirect to storage; the content its headers name."""
    opener = urllib.request.build_opener(_DoNotRedirect)
    for _ in range(MAX_RELATIVE_REDIRECTS + 1):
        request = urllib.request.Request(url, method="HEAD", headers={"User-Agent": user_agent})
        try:
            with opener.open(request, timeout=timeout) as response:
                return parse_announcement(response.headers, url)
        except urllib.error.HTTPError as exc:
            if not 300 <= exc.code < 400:
                raise AnnouncementError(f"HTTP {exc.code} {exc.reason} for HEAD {url}") from None
            if exc.headers.get("X-Linked-Etag"):
                return parse_announcement(exc.headers, url)
            location = exc.headers.get("Location") or ""
            if urllib.parse.urlsplit(location).netloc:
                raise AnnouncementError(f"{url}: redirected to another host ({location}) with "
                                        "no content hash") from None
            url = urllib.parse.urljoin(url, location)
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise AnnouncementError(f"cannot reach {url} ({reason}; timeout {timeout:g} s)") from None
    raise AnnouncementError(f"{url}: more than {MAX_RELATIVE_REDIRECTS} redirects")


class ContentChecker:
    """Hashes a download as it streams and compares it with what the Hub announced."""

    def __init__(self, announced: AnnouncedContent, name: str, origin: str):
        self.announced = announced
        self.name = name
        self.origin = origin
        if announced.algorithm == GIT_BLOB_SHA1:
            self._digest = hashlib.sha1()  # noqa: S324 -- git's object id, not a security hash
            self._digest.update(b"blob %d\0" % announced.size)
        else:
            self._digest = hashlib.sha256()

    @property
    def size_limit(self) -> int | None:
        return self.announced.size

    def update(self, chunk: bytes) -> None:
        self._digest.update(chunk)

    def check(self, done: int) -> None:
        """Raise HashMismatch unless the bytes seen match the announcement."""
        actual = self._digest.hexdigest()
        size = self.announced.size
        if actual != self.announced.digest or (size is not None and done != size):
            raise HashMismatch(
                f"{self.name} from {self.origin}: {self.announced.algorithm} {actual} ({done} "
                f"bytes) does not match the {self.announced.digest} ({size} bytes) the Hub "
                f"announces for commit {self.announced.commit}; the download was discarded")


def expectation_from_the_hub(file: FileEntry, url: str, revision: str, timeout: float):
    """(expected FileEntry or None, ContentChecker or None) for a file the registry pins by
    its model's Hub commit: what the Hub announces for that commit, cross-checked with any
    sha256 or size the registry does record. AnnouncementError when the Hub cannot say."""
    announced = announced_content(url, timeout, "candle-web")
    if announced.commit is not None and announced.commit != revision:
        raise AnnouncementError(f"{url}: the Hub resolved commit {announced.commit}, not the "
                                f"pinned {revision}")
    if announced.algorithm == SHA256:
        if file.sha256 is not None and announced.digest != file.sha256:
            raise HashMismatch(f"{file.name} at {url}: the Hub announces sha256 "
                               f"{announced.digest}, the registry pins {file.sha256}; nothing "
                               f"was downloaded")
        size = file.size if file.size is not None else announced.size
        if size is None:
            return None, ContentChecker(announced, file.name, url)
        return FileEntry(file.name, announced.digest, size), None
    if file.sha256 is not None:
        # The registry's sha256 is the stronger pin; the git blob id is checked as well.
        size = file.size if file.size is not None else announced.size
        return FileEntry(file.name, file.sha256, size), ContentChecker(announced, file.name, url)
    return None, ContentChecker(announced, file.name, url)
