"""Property test: mutated safetensors buffers (flipped bytes, truncations, spliced header
fields, lying length prefixes) give either a valid file or a CandleError, never another
exception, never an allocation driven by a lying header, and the same accept/reject verdict
as the reference library (except where we are documented to be stricter).

The memory bound is 64 bytes per input byte plus 64 KiB: parsing a small JSON header costs a few
dozen bytes per byte of text, and the largest legitimate expansion is I8 -> i64 (8x). A header
that made us trust a declared size would blow far past it (the splices use sizes up to 2**70).
"""

import json
import struct
import tracemalloc

import numpy as np
import safetensors
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

from candle_web.core.errors import CandleError, UnsupportedError
from candle_web.io import safetensors as st

FUZZ_DTYPES = ["BOOL", "U8", "I8", "I16", "U16", "I32", "U32", "I64", "U64", "F16", "BF16",
               "F32", "F64", "F8_E4M3", "F8_E5M2", "F8_E8M0", "C64", "F4"]
MEMORY_PER_INPUT_BYTE = 64
MEMORY_SLACK_BYTES = 64 * 1024
# Messages of the cases where we refuse what the reference accepts (see the module doc).
STRICTER_MESSAGES = ("duplicate key", "overflows")

BOUNDARY_INTS = [0, 1, 2, 3, 4, 7, 8, 2**31, 2**32, 2**53 + 1, 2**62, 2**63 - 1, 2**63,
                 2**64 - 1, 2**64, 2**70, -1, -(2**63)]
json_scalars = (hs.none() | hs.booleans() | hs.sampled_from(BOUNDARY_INTS)
                | hs.integers(-(2**70), 2**70) | hs.floats(allow_nan=False)
                | hs.text(max_size=4) | hs.sampled_from(FUZZ_DTYPES + ["F12", "__metadata__"]))
json_values = hs.recursive(
    json_scalars,
    lambda children: hs.lists(children, max_size=4)
    | hs.dictionaries(hs.text(max_size=3), children, max_size=3),
    max_leaves=8)


@hs.composite
def valid_files(draw) -> bytes:
    names = draw(hs.lists(hs.text(min_size=1, max_size=5).filter(lambda n: n != "__metadata__"),
                          max_size=4, unique=True))
    tensors = {}
    for name in names:
        dtype_name = draw(hs.sampled_from(FUZZ_DTYPES[:-1]))  # F4 cannot be written
        storage = st.STORED_DTYPES[dtype_name].storage
        shape = draw(hs.lists(hs.integers(0, 3), max_size=3))
        nbytes = int(np.prod(shape, dtype=np.int64)) * storage.itemsize
        raw = draw(hs.binary(min_size=nbytes, max_size=nbytes))
        values = np.frombuffer(raw, dtype=storage).reshape(shape)
        tensors[name] = st.RawTensor(values, dtype_name)
    metadata = draw(hs.none() | hs.dictionaries(hs.text(max_size=4), hs.text(max_size=4),
                                                min_size=1, max_size=2))
    return st.serialize(tensors, metadata=metadata)


def flip_bytes(buffer: bytes, flips) -> bytes:
    mutated = bytearray(buffer)
    for position, mask in flips:
        mutated[position % len(mutated)] ^= mask
    return bytes(mutated)


@hs.composite
def mutated_files(draw) -> bytes:
    buffer = draw(valid_files())
    kind = draw(hs.sampled_from(["flip", "truncate", "splice", "sizes", "sizes", "length"]))
    if kind == "flip":
        flips = draw(hs.lists(hs.tuples(hs.integers(0, 10**6), hs.integers(1, 255)),
                              min_size=1, max_size=4))
        return flip_bytes(buffer, flips)
    if kind == "truncate":
        return buffer[:draw(hs.integers(0, len(buffer) - 1))]
    header_len = struct.unpack("<Q", buffer[:8])[0]
    header = json.loads(buffer[8:8 + header_len])
    data = buffer[8 + header_len:]
    if kind == "length":
        # A lying length prefix over an intact header.
        raw = json.dumps(header).encode()
        lie = draw(hs.sampled_from([-8, -1, 1, 8]) | hs.sampled_from(BOUNDARY_INTS))
        return struct.pack("<Q", max(0, len(raw) + lie) % 2**64) + raw + data
    tensor_names = sorted(name for name in header if name != "__metadata__")
    if kind == "sizes" and tensor_names:
        # Near-valid numbers: shapes and offsets from small and boundary integers, to reach
        # the overflow, byte-count, overlap, gap and bounds checks rather than type checks.
        entry = header[draw(hs.sampled_from(tensor_names))]
        numbers = hs.integers(0, 40) | hs.sampled_from(BOUNDARY_INTS)
        if draw(hs.booleans()):
            entry["shape"] = draw(hs.lists(numbers, max_size=4))
        else:
            entry["data_offsets"] = draw(hs.lists(numbers, min_size=2, max_size=2))
        raw = json.dumps(header).encode()
        return struct.pack("<Q", len(raw)) + raw + data
    # Splice: replace one field of one entry (or a whole entry) by an arbitrary JSON value.
    targets = sorted(header)
    if targets and draw(hs.booleans()):
        name = draw(hs.sampled_from(targets))
        value = draw(json_values)
        if isinstance(header[name], dict) and header[name] and draw(hs.booleans()):
            field = draw(hs.sampled_from(sorted(header[name]) + ["extra"]))
            header[name][field] = value
        elif draw(hs.booleans()):
            del header[name]
        else:
            header[name] = value
    else:
        header[draw(hs.text(max_size=4))] = draw(json_values)
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + data


def read_everything(buffer: bytes):
    """Parse and materialise every tensor (as stored and as candle storage)."""
    reader = st.SafeTensors(buffer)
    for name in reader.keys():
        try:
            reader.get_numpy(name)
            reader.get_candle_numpy(name)
        except UnsupportedError:
            pass  # valid file, dtype candle cannot hold: refused by name, fine
    return reader


def reference_verdict(buffer: bytes) -> bool:
    try:
        safetensors.deserialize(buffer)
        return True
    except Exception:
        return False


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_files())
def test_mutated_buffers_raise_only_candle_errors_within_a_memory_bound(buffer):
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        try:
            read_everything(buffer)
            accepted, message = True, ""
        except CandleError as err:
            accepted, message = False, str(err)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak - before <= MEMORY_PER_INPUT_BYTE * len(buffer) + MEMORY_SLACK_BYTES, (
        f"{peak - before} bytes allocated for a {len(buffer)}-byte input")

    reference_accepted = reference_verdict(buffer)
    if reference_accepted and not accepted:
        assert any(s in message for s in STRICTER_MESSAGES), (
            f"the reference accepts what we refuse: {message}")
    assert not (accepted and not reference_accepted), "we accept what the reference refuses"


@settings(max_examples=60, deadline=None)
@given(valid_files())
def test_valid_files_round_trip_through_the_reference(buffer):
    reader = read_everything(buffer)
    reference = dict(safetensors.deserialize(buffer))
    assert reader.keys() == sorted(reference)
    for name, view in reference.items():
        assert bytes(reader.get_bytes(name)) == bytes(view["data"])
        assert reader.info(name).dtype == view["dtype"]
        assert list(reader.info(name).shape) == view["shape"]
    rewritten = st.serialize({name: st.RawTensor(reader.get_numpy(name), reader.info(name).dtype)
                              for name in reader.keys()}, metadata=reader.metadata or None)
    assert rewritten == buffer
