"""Opening the files a user names: regular files only.

A path on the command line can name anything: `/dev/zero` reads forever (until memory runs
out), a FIFO blocks in `open` until a writer comes, a directory fails deep in a reader. Every
reader that takes a path from a user (audio, weights) goes through here and refuses what is not
a regular file, naming the path and what it is, before reading a byte:

- `open_regular_file` opens without blocking (O_NONBLOCK, so a FIFO with no writer does not
  hang), then checks the opened file itself (fstat: no race with a rename);
- `check_regular_file` only looks (stat, which never blocks), for readers that open the path
  themselves (mmap).
"""

from __future__ import annotations

import os
import stat

from ..core.errors import FormatError

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
          (stat.S_ISSOCK, "a socket"))


def describe_mode(mode: int) -> str:
    for test, name in _KINDS:
        if test(mode):
            return name
    return "not a regular file"


def _refuse(path: str, mode: int, what: str) -> FormatError:
    return FormatError(f"{path}: is {describe_mode(mode)}, not a regular file; {what} is read "
                       f"from regular files only (save the stream to a file first)")


def check_regular_file(path, what: str = "input") -> None:
    """FormatError unless `path` is a regular file (symbolic links followed). A missing or
    unreadable path raises OSError, as `open` would."""
    path = os.fspath(path)
    mode = os.stat(path).st_mode
    if not stat.S_ISREG(mode):
        raise _refuse(path, mode, what)


def open_regular_file(path, what: str = "input"):
    """A binary file object for `path`, or FormatError when it is not a regular file. Never
    blocks: the open is non-blocking, and the check is made on the opened descriptor."""
    path = os.fspath(path)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
    descriptor = os.open(path, flags)
    try:
        mode = os.fstat(descriptor).st_mode
        if not stat.S_ISREG(mode):
            raise _refuse(path, mode, what)
        return os.fdopen(descriptor, "rb")
    except BaseException:
        os.close(descriptor)
        raise
