"""Hostile and lying PyTorch checkpoints: pickles that would run code, build objects or lie
about sizes must give typed errors (FormatError naming the global, opcode or field) and have
no side effect, in both layouts. Every pickle here is written opcode by opcode; the payloads
that would create a file are first shown to create it under Python's own pickle (in a
subprocess), so a test that finds no file proves the reader did not run them."""

from __future__ import annotations

import io
import struct
import subprocess
import sys
import zipfile
from dataclasses import dataclass

import numpy as np
import pytest

from candle_web.core.errors import CandleError, FormatError
from candle_web.io.pytorch import TorchCheckpoint
from candle_web.io.weights import open_weights

LEGACY_MAGIC = 0x1950A86A20F9469CFC6C


# -- writing checkpoints by hand ----------------------------------------------------------------
def integer(value: int) -> bytes:
    """LONG1 (LONG4 past 255 bytes): any int, negative and huge ones included (what a lying
    file can write)."""
    length = max(1, (value.bit_length() + 8) // 8)
    head = b"\x8a" + bytes([length]) if length < 256 else b"\x8b" + struct.pack("<i", length)
    return head + value.to_bytes(length, "little", signed=True)


def text(value: str) -> bytes:
    raw = value.encode("utf-8")
    return b"X" + struct.pack("<I", len(raw)) + raw


def tuple_of(values) -> bytes:
    return b"(" + b"".join(integer(v) if isinstance(v, int) else v for v in values) + b"t"


def global_(module: str, name: str) -> bytes:
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def plain(value) -> bytes:
    """A protocol-2 pickle of ints, strings, bools, None, lists and dicts, by opcodes."""
    return b"\x80\x02" + _plain(value) + b"."


def _plain(value) -> bytes:
    if value is None:
        return b"N"
    if value is True or value is False:
        return b"\x88" if value else b"\x89"
    if isinstance(value, int):
        return integer(value)
    if isinstance(value, str):
        return text(value)
    if isinstance(value, list):
        return b"](" + b"".join(_plain(v) for v in value) + b"e"
    if isinstance(value, dict):
        return b"}(" + b"".join(_plain(k) + _plain(v) for k, v in value.items()) + b"u"
    raise TypeError(type(value))


@dataclass
class Entry:
    """One tensor of a hand-written state dict; `size`, `stride` and `offset` may be raw
    pickle bytes (to write a float or a bool where an int belongs)."""

    name: str
    key: str
    numel: int  # what the persistent id declares for the storage
    offset: object = 0
    size: object = (1,)
    stride: object = (1,)
    storage_type: str = "FloatStorage"


def state_dict_pickle(entries, legacy: bool) -> bytes:
    out = b"\x80\x02" + global_("collections", "OrderedDict") + b")R("
    for e in entries:
        pid = (b"(" + text("storage") + global_("torch", e.storage_type) + text(e.key)
               + text("cpu") + integer(e.numel) + (b"N" if legacy else b"") + b"t")
        size = e.size if isinstance(e.size, bytes) else tuple_of(e.size)
        stride = e.stride if isinstance(e.stride, bytes) else tuple_of(e.stride)
        offset = e.offset if isinstance(e.offset, bytes) else integer(e.offset)
        out += (text(e.name) + global_("torch._utils", "_rebuild_tensor_v2") + b"(" + pid
                + b"Q" + offset + size + stride + b"\x89"
                + global_("collections", "OrderedDict") + b")R" + b"tR")
    return out + b"u."


def legacy_file(data_pickle: bytes, keys=(), storages: bytes = b"", little: bool = True,
                first: bytes = None) -> bytes:
    info = {"protocol_version": 1001, "little_endian": little,
            "type_sizes": {"short": 2, "int": 4, "long": 4}}
    return ((first if first is not None else plain(LEGACY_MAGIC)) + plain(1001) + plain(info)
            + data_pickle + plain(list(keys)) + storages)


def legacy_storage(count: int, payload: bytes, little: bool = True) -> bytes:
    return struct.pack("<q" if little else ">q", count) + payload


def zip_file(data_pickle: bytes, storages: dict = None, byteorder: bytes = b"little",
             extra: dict = None) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr("archive/data.pkl", data_pickle)
        if byteorder is not None:
            archive.writestr("archive/byteorder", byteorder)
        for key, payload in (storages or {}).items():
            archive.writestr(f"archive/data/{key}", payload)
        for name, payload in (extra or {}).items():
            archive.writestr(name, payload)
        archive.writestr("archive/version", b"3\n")
    return out.getvalue()


def checkpoint(entries, storages: dict, layout: str) -> bytes:
    """`storages`: key -> (element count written in the file, raw bytes)."""
    legacy = layout == "legacy"
    data = state_dict_pickle(entries, legacy)
    if legacy:
        return legacy_file(data, list(storages),
                           b"".join(legacy_storage(n, raw) for n, raw in storages.values()))
    return zip_file(data, {key: raw for key, (_, raw) in storages.items()})


LAYOUTS = ("zip", "legacy")
FLOATS = np.arange(12, dtype="<f4")


def test_the_hand_written_files_are_real_checkpoints():
    """The writers above make files torch reads (so the hostile variants below differ from a
    valid file only by what they lie about), and so does the reader, views included."""
    torch = pytest.importorskip("torch")
    entries = [Entry("a", "0", 12, 0, (3, 4), (4, 1)), Entry("b", "0", 12, 1, (2, 2), (4, 2))]
    for layout in LAYOUTS:
        data = checkpoint(entries, {"0": (12, FLOATS.tobytes())}, layout)
        reference = torch.load(io.BytesIO(data), weights_only=True)
        ours = TorchCheckpoint(data)
        assert ours.format == layout
        for name in ("a", "b"):
            np.testing.assert_array_equal(ours.get_numpy(name), reference[name].numpy())
        np.testing.assert_array_equal(ours.get_numpy("b"), [[1, 3], [5, 7]])


def test_a_big_endian_legacy_file_is_converted():
    data = legacy_file(state_dict_pickle([Entry("a", "k", 3, 0, (3,), (1,), "LongStorage")],
                                         True),
                       ["k"], legacy_storage(3, np.array([1, -2, 2**40], ">i8").tobytes(),
                                             little=False), little=False)
    got = TorchCheckpoint(data).get_numpy("a")
    assert got.dtype == np.dtype("=i8")
    np.testing.assert_array_equal(got, [1, -2, 2**40])


# -- pickles that would run code -----------------------------------------------------------------
def payloads(marker) -> dict:
    """name -> (pickle bytes, what the error must name). Each would create `marker` when
    unpickled by Python's pickle (checked in the test)."""
    create = f"open({str(marker)!r}, 'w').close()"
    shell = f"touch '{marker}'"
    return {
        "os.system via GLOBAL+REDUCE": (
            b"\x80\x02" + global_("os", "system") + text(shell) + b"\x85R.", "os.system"),
        "posix.system via STACK_GLOBAL": (
            b"\x80\x04" + b"\x8c\x05posix\x8c\x06system\x93" + text(shell) + b"\x85R.",
            "posix.system"),
        "builtins.eval": (
            b"\x80\x02" + global_("builtins", "eval") + text(create) + b"\x85R.",
            "builtins.eval"),
        "builtins.getattr(__import__('os'), 'system')": (
            b"\x80\x02" + global_("builtins", "getattr") + b"(" + global_("builtins", "__import__")
            + text("os") + b"\x85R" + text("system") + b"tR" + text(shell) + b"\x85R.",
            "builtins.getattr"),
        "INST os.system": (b"\x80\x02(V" + shell.encode() + b"\nios\nsystem\n.", "INST"),
        "OBJ os.system": (b"\x80\x02(" + global_("os", "system") + text(shell) + b"o.", "OBJ"),
    }


def test_the_payloads_do_run_under_pythons_pickle(tmp_path):
    """The control: Python's own pickle runs every payload (so their absence of effect below
    is the reader's doing)."""
    for index, name in enumerate(payloads("x")):
        marker = tmp_path / f"marker{index}"
        payload = payloads(marker)[name][0]
        script = "import pickle, sys; pickle.loads(open(sys.argv[1], 'rb').read())"
        source = tmp_path / f"payload{index}.pkl"
        source.write_bytes(payload)
        subprocess.run([sys.executable, "-c", script, str(source)], check=False,
                       capture_output=True, timeout=60)
        assert marker.exists(), name


@pytest.mark.parametrize("where", ["zip data.pkl", "legacy data pickle", "legacy first pickle"])
@pytest.mark.parametrize("name", list(payloads("x")))
def test_code_running_pickles_are_refused_and_have_no_effect(name, where, tmp_path):
    marker = tmp_path / "marker"
    payload, named = payloads(marker)[name]
    if where == "zip data.pkl":
        data = zip_file(payload)
    elif where == "legacy data pickle":
        data = legacy_file(payload)
    else:
        data = legacy_file(plain({}), first=payload)
    path = tmp_path / "pytorch_model.bin"
    path.write_bytes(data)
    for attempt in (lambda: TorchCheckpoint(data), lambda: open_weights(path)):
        with pytest.raises(FormatError, match=named.replace(".", r"\.")):
            attempt()
    assert not marker.exists()


OBJECT_BUILDERS = {
    "REDUCE on a refused class": (
        b"\x80\x02" + global_("argparse", "Namespace") + b")R.", "argparse.Namespace"),
    "NEWOBJ of a refused class, then BUILD": (
        b"\x80\x02" + global_("argparse", "Namespace") + b")\x81}(" + text("a") + integer(1)
        + b"ub.", "argparse.Namespace"),
    "NEWOBJ of an allowed class": (
        b"\x80\x02" + global_("collections", "OrderedDict") + b")\x81.", "NEWOBJ is refused"),
    "NEWOBJ_EX": (b"\x80\x04" + global_("collections", "OrderedDict") + b")}\x92.",
                  "NEWOBJ_EX is refused"),
    "BUILD with a list state": (
        b"\x80\x02" + global_("collections", "OrderedDict") + b")R]b.", "BUILD is refused"),
    "BUILD on a list": (b"\x80\x02]}b.", "BUILD is refused"),
    "REDUCE on a string": (b"\x80\x02" + text("os.system") + b")R.", "REDUCE on a value"),
    "an extension code": (b"\x80\x02\x82\x01.", "EXT1"),
    "a set": (b"\x80\x04\x8f.", "EMPTY_SET"),
    "an out-of-band buffer": (b"\x80\x05\x97.", "NEXT_BUFFER"),
    "a persistent id that is not a storage": (
        b"\x80\x02(" + text("module") + text("os") + b"tQ.", "'module' is refused"),
    "a text persistent id": (b"\x80\x02Pos.system\n.", "refused"),
    "a storage of a refused type": (
        b"\x80\x02(" + text("storage") + global_("torch", "ComplexFloatStorage") + text("0")
        + text("cpu") + integer(1) + b"tQ.", "torch.ComplexFloatStorage"),
    "an unknown opcode": (b"\x80\x02\xff.", "unknown opcode"),
    "torch's own tensor subclass rebuild": (
        b"\x80\x02" + global_("torch._tensor", "_rebuild_from_type_v2") + b".",
        "torch._tensor._rebuild_from_type_v2"),
}


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("name", list(OBJECT_BUILDERS))
def test_object_building_opcodes_and_unknown_globals_are_refused(name, layout):
    payload, named = OBJECT_BUILDERS[name]
    data = zip_file(payload) if layout == "zip" else legacy_file(payload)
    with pytest.raises(FormatError, match=named.replace(".", r"\.").replace("(", r"\(")):
        TorchCheckpoint(data)


def test_every_refused_name_is_listed_once():
    payload = (b"\x80\x02(" + global_("os", "system") + global_("builtins", "eval")
               + global_("os", "system") + b"l.")
    with pytest.raises(FormatError, match=r"names 2 class\(es\)/function\(s\).*: os\.system, "
                                          r"builtins\.eval\. Nothing was imported"):
        TorchCheckpoint(zip_file(payload))


# -- lying sizes ---------------------------------------------------------------------------------
LIES = {
    # name: (entries, storages {key: (count written, bytes)}, what the error names)
    "more elements than the storage": (
        [Entry("t", "0", 4, 0, (5,), (1,))], {"0": (4, FLOATS[:4].tobytes())}, "past the 4"),
    "an offset past the end": (
        [Entry("t", "0", 4, 2, (3,), (1,))], {"0": (4, FLOATS[:4].tobytes())}, "reaches element 5"),
    "strides past the end": (
        [Entry("t", "0", 4, 0, (2, 2), (3, 1))], {"0": (4, FLOATS[:4].tobytes())},
        "reaches element 5"),
    "a negative size": ([Entry("t", "0", 4, 0, (-1,), (1,))], {"0": (4, FLOATS[:4].tobytes())},
                        r"size\[0\] -1"),
    "a negative stride": ([Entry("t", "0", 4, 3, (2,), (-1,))],
                          {"0": (4, FLOATS[:4].tobytes())}, r"stride\[0\] -1"),
    "a negative offset": ([Entry("t", "0", 4, -1, (1,), (1,))],
                          {"0": (4, FLOATS[:4].tobytes())}, "storage offset -1"),
    "a huge size": ([Entry("t", "0", 4, 0, (2**63,), (1,))], {"0": (4, FLOATS[:4].tobytes())},
                    r"size\[0\] 9223372036854775808"),
    "sizes whose product overflows": (
        [Entry("t", "0", 4, 0, (2**40, 2**40), (0, 0))], {"0": (4, FLOATS[:4].tobytes())},
        "too large"),
    "an empty tensor numpy cannot shape": (
        [Entry("t", "0", 4, 0, (0, 2**61, 2**61), (1, 1, 1))], {"0": (4, FLOATS[:4].tobytes())},
        "too large"),
    "a size of a million bits": (
        [Entry("t", "0", 4, 0, (2**(10**6),), (1,))], {"0": (4, FLOATS[:4].tobytes())},
        "of 1000001 bits"),
    "a huge stride": ([Entry("t", "0", 4, 0, (2,), (2**61,))], {"0": (4, FLOATS[:4].tobytes())},
                      "past the 4"),
    "a float size": ([Entry("t", "0", 4, 0, b"(G@\x00\x00\x00\x00\x00\x00\x00t", (1,))],
                     {"0": (4, FLOATS[:4].tobytes())}, r"size\[0\] is a float"),
    "a bool stride": ([Entry("t", "0", 4, 0, (1,), b"(\x88t")], {"0": (4, FLOATS[:4].tobytes())},
                      r"stride\[0\] is a bool"),
    "65 dims": ([Entry("t", "0", 4, 0, (1,) * 65, (1,) * 65)], {"0": (4, FLOATS[:4].tobytes())},
                "65 dims"),
    "size and stride ranks differ": ([Entry("t", "0", 4, 0, (2, 2), (1,))],
                                     {"0": (4, FLOATS[:4].tobytes())}, "differ in rank"),
    "a storage claiming more than its bytes": (
        [Entry("t", "0", 8, 0, (8,), (1,))], {"0": (8, FLOATS[:4].tobytes())},
        "storage '0'"),
    "a huge storage": ([Entry("t", "0", 2**61, 0, (1,), (1,))],
                       {"0": (2**61, FLOATS[:4].tobytes())}, "storage '0'"),
    "a storage declared twice with different types": (
        [Entry("a", "0", 4, 0, (4,), (1,)), Entry("b", "0", 2, 0, (2,), (1,), "LongStorage")],
        {"0": (4, FLOATS[:4].tobytes())}, "declared twice"),
}


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("name", list(LIES))
def test_lying_sizes_are_format_errors_before_any_read(name, layout):
    entries, storages, named = LIES[name]
    with pytest.raises(FormatError, match=named):
        TorchCheckpoint(checkpoint(entries, storages, layout))


def test_a_legacy_count_that_disagrees_or_runs_past_the_file_is_refused():
    data = state_dict_pickle([Entry("t", "0", 4, 0, (4,), (1,))], True)
    with pytest.raises(FormatError, match="declares 4 elements, its data holds 5"):
        TorchCheckpoint(legacy_file(data, ["0"], legacy_storage(5, FLOATS[:5].tobytes())))
    with pytest.raises(FormatError, match="runs past the end"):
        TorchCheckpoint(legacy_file(data, ["0"], legacy_storage(4, FLOATS[:3].tobytes())))
    with pytest.raises(FormatError, match="have no data"):
        TorchCheckpoint(legacy_file(data, [], b""))
    with pytest.raises(FormatError, match="no tensor declares it"):
        TorchCheckpoint(legacy_file(data, ["0", "1"], legacy_storage(4, FLOATS[:4].tobytes())))


def test_overlapping_zip_storages_are_refused():
    """Two central-directory entries pointing at the same bytes (a zip can say that)."""
    entries = [Entry("a", "0", 4, 0, (4,), (1,)), Entry("b", "1", 4, 0, (4,), (1,))]
    data = bytearray(zip_file(state_dict_pickle(entries, False),
                              {"0": FLOATS[:4].tobytes(), "1": FLOATS[4:8].tobytes()}))
    archive = zipfile.ZipFile(io.BytesIO(bytes(data)))
    first = archive.getinfo("archive/data/0").header_offset
    central = data.find(b"PK\x01\x02")
    while True:  # the central-directory entry of archive/data/1
        name_length = struct.unpack("<H", data[central + 28:central + 30])[0]
        if data[central + 46:central + 46 + name_length] == b"archive/data/1":
            break
        central = data.find(b"PK\x01\x02", central + 4)
    data[central + 42:central + 46] = struct.pack("<I", first)
    with pytest.raises(FormatError, match="overlap"):
        TorchCheckpoint(bytes(data))


def test_torchscript_and_broken_zips_are_typed():
    from candle_web.core.errors import UnsupportedError

    with pytest.raises(UnsupportedError, match="TorchScript"):
        TorchCheckpoint(zip_file(plain({}), extra={"archive/constants.pkl": plain([])}))
    with pytest.raises(FormatError, match="byteorder"):
        TorchCheckpoint(zip_file(plain({}), byteorder=b"middle"))
    with pytest.raises(FormatError, match="data.pkl"):
        TorchCheckpoint(zip_file(plain({}), extra={"other/data.pkl": plain({})}))
    compressed = io.BytesIO()
    with zipfile.ZipFile(compressed, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("archive/data.pkl", plain({}))
    with pytest.raises(UnsupportedError, match="compressed"):
        TorchCheckpoint(compressed.getvalue())
    with pytest.raises(FormatError, match="not a PyTorch checkpoint"):
        TorchCheckpoint(plain(12345))
    with pytest.raises(FormatError, match="neither a zip"):
        TorchCheckpoint(b"GGUF\x03\x00\x00\x00")


# -- resource lies ------------------------------------------------------------------------------
@pytest.mark.parametrize("payload, named", [
    (b"\x80\x04\x8d" + struct.pack("<Q", 2**62) + b"ab.", "needs 4611686018427387904 bytes"),
    (b"\x80\x02X" + struct.pack("<I", 2**32 - 1) + b".", "needs 4294967295 bytes"),
    (b"\x80\x02\x8b" + struct.pack("<i", 2**31 - 1) + b".", "needs 2147483647 bytes"),
    (b"\x80\x02L" + b"9" * 100_000 + b"L\n.", "no end of line"),
    (b"\x80\x02I" + b"9" * 4_100 + b"\n.", "text integer of 4100 digits"),
    (b"\x80\x02h\x07.", "memo key 7 was never stored"),
    (b"\x80\x02Np" + str(2**61 - 1).encode() + b"\n.", "memo key of 61 bits"),
    (b"\x80\x02a.", "pops an empty stack"),
    (b"\x80\x02N(\x85.", "pops an empty stack"),
    (b"\x80\x02e.", "needs a MARK"),
    (b"\x80\x02NN.", "STOP with 2 values"),
    (b"\x80\x02N", "needs 1 bytes"),
    (b"\x80\x09N.", "protocol 9"),
])
def test_lying_lengths_and_broken_pickles_fail_before_allocating(payload, named):
    with pytest.raises(FormatError, match=named):
        TorchCheckpoint(zip_file(payload))


def test_dict_keys_that_would_collide_are_refused():
    """Multiples of 2**61 - 1 (as ints or floats) all hash alike: 100 000 of them would make
    the dict quadratic (minutes). Refused at the first one, naming the key."""
    keys = b"".join(integer(k * (2**61 - 1)) + b"N" for k in range(1, 100_000))
    with pytest.raises(FormatError, match="a dict key int of 61 bits"):
        TorchCheckpoint(zip_file(b"\x80\x02}(" + keys + b"u."))
    with pytest.raises(FormatError, match="a dict key of type float"):
        TorchCheckpoint(zip_file(b"\x80\x02}(G" + struct.pack(">d", 2.0**61) + b"Nu."))
    pairs = b"".join(integer(k * (2**61 - 1)) + b"N\x86" for k in range(1, 1000))
    with pytest.raises(FormatError, match="OrderedDict: a dict key int of 61 bits"):
        TorchCheckpoint(zip_file(b"\x80\x02" + global_("collections", "OrderedDict") + b"(]("
                                 + pairs + b"etR."))
    small = b"\x80\x02}(" + b"".join(integer(k) + b"N" for k in (-5, 0, 2**60)) + b"u."
    assert TorchCheckpoint(zip_file(small)).keys() == []


def test_deep_nesting_and_cycles_are_bounded():
    deep = b"\x80\x02" + b"]" * 100_000 + b"a" * 99_999 + b"."
    with pytest.raises(FormatError, match="nested more than 32 deep"):
        TorchCheckpoint(zip_file(deep))
    cycle = b"\x80\x02]q\x00h\x00a."  # a list that contains itself
    assert TorchCheckpoint(zip_file(cycle)).keys() == []


@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_truncation_is_a_typed_error(layout):
    entries = [Entry("a", "0", 12, 0, (3, 4), (4, 1)), Entry("b", "1", 3, 0, (3,), (1,),
                                                             "LongStorage")]
    data = checkpoint(entries, {"0": (12, FLOATS.tobytes()),
                                "1": (3, np.arange(3, dtype="<i8").tobytes())}, layout)
    assert TorchCheckpoint(data).keys() == ["a", "b"]
    for cut in range(len(data)):  # the last storage ends the file: every cut breaks it
        with pytest.raises(CandleError):
            TorchCheckpoint(data[:cut])
