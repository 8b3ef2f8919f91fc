"""Counting the files a piece of code opens, per path: for tests that a loader reads each of a
checkpoint's files once (issue 36: a load that quantizes at load time must not read its
weights twice)."""

from __future__ import annotations

import builtins
import io
import os
from collections import Counter


def count_opens(monkeypatch) -> Counter:
    """Every open from now on (builtins.open, io.open: pathlib's reads; os.open: the
    non-blocking opener of io/files.py), as absolute path -> count, until the test ends. mmap
    maps a descriptor already opened, so a mapped file counts once."""
    counts: Counter = Counter()

    def counting(real):
        def opener(file, *args, **kwargs):
            if isinstance(file, (str, bytes, os.PathLike)):
                counts[os.path.abspath(os.fsdecode(file))] += 1
            return real(file, *args, **kwargs)
        return opener

    monkeypatch.setattr(builtins, "open", counting(builtins.open))
    monkeypatch.setattr(io, "open", counting(io.open))
    monkeypatch.setattr(os, "open", counting(os.open))
    return counts


def opens_per_file(counts: Counter, files: dict) -> dict:
    """A checkpoint's {file name: path} as {file name: times opened}."""
    return {name: counts[os.path.abspath(os.fspath(path))] for name, path in files.items()}
