"""Property test: mutated npy files and npz archives (flipped bytes, truncations, lying size
fields) give either arrays or a CandleError, never another exception, and never allocate far
beyond the input (a lying size must not be trusted). Bound: 64 bytes per input byte + 64 KiB,
well below what the lies ask for (sizes up to 2**32 in the zip headers).
"""

import io
import struct
import tracemalloc

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

from candle_web.core.errors import CandleError
from candle_web.io import npz

MEMORY_PER_INPUT_BYTE = 64
MEMORY_SLACK_BYTES = 64 * 1024
SIZE_LIES = [0, 1, 64, 2**16, 2**24, 2**31 - 1, 2**32 - 1]
DTYPES = ["?", "u1", "<i2", ">i4", "<i8", "<u8", "<f2", ">f4", "<f8"]


@hs.composite
def arrays(draw):
    dtype = np.dtype(draw(hs.sampled_from(DTYPES)))
    shape = tuple(draw(hs.lists(hs.integers(0, 4), max_size=3)))
    raw = draw(hs.binary(min_size=int(np.prod(shape)) * dtype.itemsize,
                         max_size=int(np.prod(shape)) * dtype.itemsize))
    array = np.frombuffer(raw, dtype=dtype).reshape(shape)
    return np.asfortranarray(array) if draw(hs.booleans()) else array


@hs.composite
def archives(draw) -> bytes:
    members = draw(hs.dictionaries(hs.text("abc", min_size=1, max_size=3), arrays(),
                                   min_size=1, max_size=3))
    writer = draw(hs.sampled_from(["ours", "ours_compressed", "numpy", "numpy_compressed"]))
    if writer.startswith("ours"):
        return npz.save(members, compressed=writer.endswith("compressed"))
    buffer = io.BytesIO()
    (np.savez_compressed if writer.endswith("compressed") else np.savez)(buffer, **members)
    return buffer.getvalue()


@hs.composite
def mutated(draw, files) -> bytes:
    data = bytearray(draw(files))
    kind = draw(hs.sampled_from(["flip", "truncate", "size"]))
    if kind == "flip":
        for _ in range(draw(hs.integers(1, 4))):
            data[draw(hs.integers(0, len(data) - 1))] ^= draw(hs.integers(1, 255))
    elif kind == "truncate":
        del data[draw(hs.integers(0, len(data) - 1)):]
    else:
        # Overwrite a 4-byte little-endian field somewhere (zip sizes, npy header length...).
        position = draw(hs.integers(0, max(0, len(data) - 4)))
        data[position:position + 4] = struct.pack("<I", draw(hs.sampled_from(SIZE_LIES)))
    return bytes(data)


def read_all_members(data: bytes) -> None:
    reader = npz.NpzFile(data)
    for name in reader.keys():
        reader.get_numpy(name)


def check_bounded(function, data: bytes) -> None:
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        try:
            function(data)
        except CandleError:
            pass
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak - before <= MEMORY_PER_INPUT_BYTE * len(data) + MEMORY_SLACK_BYTES, (
        f"{peak - before} bytes allocated for a {len(data)}-byte input")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated(archives()))
def test_mutated_npz_gives_arrays_or_candle_errors(data):
    check_bounded(read_all_members, data)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated(arrays().map(npz.write_npy)))
def test_mutated_npy_gives_an_array_or_a_candle_error(data):
    check_bounded(npz.read_npy, data)
