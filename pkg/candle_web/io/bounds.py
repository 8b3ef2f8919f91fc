"""Bounds that every tensor file reader checks before it trusts a number from the file.

A header is written by whoever made the file: its shapes can claim more bytes than any machine
holds (or than fit in 64 bits), and a zip member's offsets can point past the archive. The
readers (safetensors.py, npz.py, pytorch.py) check those numbers here, each raising its own
FormatError that names the file and the field; these helpers only compute and compare, so
that a header full of huge dims never makes a reader multiply giant integers or allocate.
"""

from __future__ import annotations

import struct
import zipfile

# numpy's own limit on the number of dimensions of an array.
MAX_NUMPY_DIMS = 64
# The most bytes an array may claim: numpy sizes are signed 64-bit.
MAX_ARRAY_BYTES = 2**63 - 1

# A zip local file header: signature, versions, flags, method, time, date, CRC, sizes, then the
# lengths of the name and the extra field that come before the member's data.
ZIP_LOCAL_HEADER = struct.Struct("<4s2B4HL2L2H")
ZIP_LOCAL_SIGNATURE = b"PK\x03\x04"


def nonzero_bytes(shape, item_bytes: int, limit: int = MAX_ARRAY_BYTES) -> int | None:
    """item_bytes times the product of the non-zero dims of `shape`, or None as soon as that
    passes `limit` (the product grows with every dim, so it stops at the first overflow and
    never multiplies the rest). numpy needs this product to fit even when a dim is zero."""
    total = item_bytes
    if total > limit:
        return None
    for dim in shape:
        if dim:
            total *= dim
            if total > limit:
                return None
    return total


def zip_member_data_start(buffer, info: zipfile.ZipInfo) -> int | None:
    """Where a zip member's data starts in `buffer` (the whole archive), read through its local
    file header: the central directory points at that header, whose own name and extra-field
    lengths say how far the data is. None when there is no valid local header at that offset.
    The caller checks that the member's bytes from there fit in the buffer."""
    start = info.header_offset
    local = bytes(buffer[max(start, 0):start + ZIP_LOCAL_HEADER.size])
    if start < 0 or len(local) != ZIP_LOCAL_HEADER.size or local[:4] != ZIP_LOCAL_SIGNATURE:
        return None
    fields = ZIP_LOCAL_HEADER.unpack(local)
    return start + ZIP_LOCAL_HEADER.size + fields[-2] + fields[-1]
