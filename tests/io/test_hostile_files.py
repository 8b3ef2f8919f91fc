"""Issue 17, hostile inputs: one tiny crafted file per finding of the outside fuzzing pass.

Each file must fail at parse time with a CandleError whose message names the file, the field
and the limit, before anything is allocated from the lying value (and never with numpy's bare
ValueError / OverflowError later). The real model files must still load: that is covered by
tests/io/test_gguf.py and test_ct2.py, and re-checked here on mutated copies of tiny.en.
"""

from __future__ import annotations

import io
import re
import struct
import zipfile

import numpy as np
import pytest

from candle_web.core.errors import CandleError, FormatError
from candle_web.io import ct2, gguf, npz
from candle_web.io.gguf import GgufFile, GgufValueType, write_gguf

# ------------------------------------------------------------------------------------ CT2
# A CTranslate2 model.bin by hand (DESIGN.md section 4), version 6: one variable per entry.


def ct2_string(text: str) -> bytes:
    raw = text.encode() + b"\0"
    return struct.pack("<H", len(raw)) + raw


def ct2_variable(name: str, dims, data: bytes, dtype_id: int = 0) -> bytes:
    return (ct2_string(name) + struct.pack("<B", len(dims)) + struct.pack(f"<{len(dims)}I", *dims)
            + struct.pack("<BI", dtype_id, len(data)) + data)


def ct2_file(*variables: bytes, aliases=()) -> bytes:
    out = [struct.pack("<I", 6), ct2_string("HostileSpec"), struct.pack("<I", 1),
           struct.pack("<I", len(variables)), *variables, struct.pack("<I", len(aliases))]
    out += [ct2_string(alias) + ct2_string(target) for alias, target in aliases]
    return b"".join(out)


def read_ct2_file(tmp_path, data: bytes):
    path = tmp_path / "model.bin"
    path.write_bytes(data)
    return ct2.read_ct2(path), str(path)


@pytest.mark.parametrize("rank", [ct2.MAX_RANK + 1, 65, 255])
def test_ct2_rank_above_the_limit_is_refused_before_numpy_sees_it(tmp_path, rank):
    """Finding: a rank-65 variable raised numpy's ValueError ("maximum supported dimension")."""
    path = tmp_path / "model.bin"
    path.write_bytes(ct2_file(ct2_variable("w", [1] * rank, bytes(4))))
    with pytest.raises(FormatError) as caught:
        ct2.read_ct2(path)
    message = str(caught.value)
    assert str(path) in message and "variable 'w'" in message
    assert f"rank {rank} exceeds the limit of {ct2.MAX_RANK} (MAX_RANK)" in message


def test_ct2_rank_at_the_limit_still_loads(tmp_path):
    model, _ = read_ct2_file(tmp_path, ct2_file(ct2_variable("w", [1] * ct2.MAX_RANK, bytes(4))))
    assert model["w"].shape == (1,) * ct2.MAX_RANK


def test_ct2_empty_variable_with_huge_other_dims_is_refused(tmp_path):
    """dims [0, 2**32-1, 2**32-1] hold 0 bytes, so the byte count agrees; numpy would still
    refuse the shape ("array is too big"). Refused by the file size instead."""
    with pytest.raises(FormatError, match=r"model\.bin: variable 'e': dims \[0, 4294967295, "
                                          r"4294967295\] describe \d+ bytes once the zero dims "
                                          r"are taken as 1, more than the \d+-byte file"):
        read_ct2_file(tmp_path, ct2_file(ct2_variable("e", [0, 2**32 - 1, 2**32 - 1], b"")))
    model, _ = read_ct2_file(tmp_path, ct2_file(ct2_variable("e", [0, 3], b"")))
    assert model["e"].shape == (0, 3)  # a genuinely empty variable is fine


def test_ct2_byte_count_must_match_the_dims(tmp_path):
    with pytest.raises(FormatError, match=r"model\.bin: variable 'w' at offset \d+: 8 bytes do "
                                          r"not hold shape \[3\] of float32 \(12 bytes\)"):
        read_ct2_file(tmp_path, ct2_file(ct2_variable("w", [3], bytes(8))))


def test_ct2_alias_cycle_and_dangling_alias_are_refused(tmp_path):
    w = ct2_variable("w", [1], bytes(4))
    with pytest.raises(FormatError, match=r"model\.bin: alias 'a': chain longer than 32 "
                                          r"\(MAX_ALIAS_DEPTH\), a cycle"):
        read_ct2_file(tmp_path, ct2_file(w, aliases=[("a", "b"), ("b", "a")]))
    with pytest.raises(FormatError, match=r"model\.bin: alias 'a' points to the missing "
                                          r"variable 'nowhere'"):
        read_ct2_file(tmp_path, ct2_file(w, aliases=[("a", "nowhere")]))


def test_ct2_name_length_past_the_end_is_refused(tmp_path):
    data = bytearray(ct2_file(ct2_variable("w", [1], bytes(4))))
    name_length_at = 4 + len(ct2_string("HostileSpec")) + 4 + 4
    data[name_length_at:name_length_at + 2] = struct.pack("<H", 0xFFFF)
    with pytest.raises(FormatError, match=r"model\.bin: variable #0 name at offset \d+: needs "
                                          r"65535 bytes"):
        read_ct2_file(tmp_path, bytes(data))


def rank_byte_offsets(data, count: int) -> list[int]:
    """Offsets of the rank bytes of a v6 model.bin's first ``count`` variables."""
    view = memoryview(data)
    pos = 4
    pos += 2 + struct.unpack_from("<H", view, pos)[0] + 4  # spec name, revision
    total = struct.unpack_from("<I", view, pos)[0]
    pos += 4
    offsets = []
    for _ in range(min(count, total)):
        pos += 2 + struct.unpack_from("<H", view, pos)[0]
        offsets.append(pos)
        rank = view[pos]
        pos += 1 + 4 * rank + 1
        pos += 4 + struct.unpack_from("<I", view, pos)[0]
    return offsets


@pytest.fixture(scope="module")
def tiny_en_bytes(model_file):
    return bytearray(model_file("whisper-tiny.en", "model.bin").read_bytes())


@pytest.mark.parametrize("rank", [9, 65, 255])
def test_real_model_bin_with_a_mutated_rank_byte(tiny_en_bytes, rank):
    """The outside pass's finding, on the real faster-whisper tiny.en: only a FormatError."""
    for offset in rank_byte_offsets(tiny_en_bytes, 3):
        original = tiny_en_bytes[offset]
        tiny_en_bytes[offset] = rank
        try:
            with pytest.raises(FormatError, match=f"rank {rank} exceeds the limit"):
                ct2.read_ct2(tiny_en_bytes)
        finally:
            tiny_en_bytes[offset] = original
    assert len(ct2.read_ct2(tiny_en_bytes).variables) == 148  # restored: still loads


# ------------------------------------------------------------------------------------ npy/npz


def npy_bytes(shape_literal: str, data: bytes = b"") -> bytes:
    header = f"{{'descr': '<f4', 'fortran_order': False, 'shape': {shape_literal}, }}"
    raw = header.encode("latin1") + b"\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(raw)) + raw + data


def test_npy_rank_above_numpys_limit_is_refused(tmp_path):
    """Finding: a rank-65 .npy raised numpy's ValueError when the array was built."""
    path = tmp_path / "deep.npy"
    path.write_bytes(npy_bytes("(" + "1, " * 65 + ")", bytes(4)))
    with pytest.raises(FormatError) as caught:
        npz.read_npy(path)
    message = str(caught.value)
    assert str(path) in message and "field 'shape'" in message
    assert "65 dims exceed the limit of 64 (MAX_NUMPY_DIMS" in message
    np.testing.assert_array_equal(npz.read_npy(npy_bytes("(1,)", bytes(4))), [0.0])


def test_npz_member_with_rank_65_is_refused(tmp_path):
    path = tmp_path / "deep.npz"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("deep.npy", npy_bytes("(" + "1, " * 65 + ")", bytes(4)))
    with npz.NpzFile(path) as archive:
        with pytest.raises(FormatError, match=r"deep\.npz member 'deep\.npy': field 'shape': 65 "
                                              r"dims exceed the limit of 64"):
            archive.get_numpy("deep")


def test_npy_empty_array_with_huge_dims_and_oversized_header():
    with pytest.raises(FormatError, match=r"field 'shape'.*overflows \(more than 2\*\*63 bytes"):
        npz.read_npy(npy_bytes(f"(0, {2**62}, 4)"))
    huge_header = b"\x93NUMPY\x02\x00" + struct.pack("<I", 2**32 - 1) + b"{"
    with pytest.raises(FormatError, match="header length 4294967295 exceeds the 10000-byte cap"):
        npz.read_npy(huge_header)


# ------------------------------------------------------------------------------------ GGUF


def gguf_bytes(metadata=None, tensors=None, **options) -> bytes:
    out = io.BytesIO()
    write_gguf(out, metadata or {}, tensors or {}, **options)
    return out.getvalue()


def gguf_with_alignment(value: int, value_type=GgufValueType.UINT64) -> bytes:
    """A file with no tensors whose only key is general.alignment (the writer refuses these)."""
    key = gguf.ALIGNMENT_KEY.encode()
    fmt = "<Q" if value_type == GgufValueType.UINT64 else "<I"
    return (b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", len(key)) + key
            + struct.pack("<I", value_type) + struct.pack(fmt, value))


def tensor_field_offset(raw: bytes, name: str, field: str) -> int:
    """Where tensor ``name``'s first dim or data offset is stored in ``raw``."""
    name_at = raw.index(struct.pack("<Q", len(name)) + name.encode())
    n_dims_at = name_at + 8 + len(name)
    if field == "dims":
        return n_dims_at + 4
    n_dims = struct.unpack_from("<I", raw, n_dims_at)[0]
    return n_dims_at + 4 + 8 * n_dims + 4


def patched(raw: bytes, offset: int, fmt: str, value) -> bytes:
    data = bytearray(raw)
    struct.pack_into(fmt, data, offset, value)
    return bytes(data)


@pytest.mark.parametrize("alignment", [2**17, 2**40, 2**63])
def test_gguf_alignment_above_the_limit_is_refused(tmp_path, alignment):
    """Findings: alignment 2**40 put the data section far past the end of a tiny file, and 2**63
    gave a file with no tensors a data offset of 2**63 (OverflowError later)."""
    path = tmp_path / "aligned.gguf"
    path.write_bytes(gguf_with_alignment(alignment))
    with pytest.raises(FormatError) as caught:
        GgufFile(path)
    message = str(caught.value)
    assert str(path) in message
    assert (f"general.alignment {alignment} exceeds the limit of {gguf.MAX_ALIGNMENT} "
            "(MAX_ALIGNMENT") in message


def test_gguf_data_section_past_the_end_is_refused():
    raw = gguf_with_alignment(gguf.MAX_ALIGNMENT, GgufValueType.UINT32)
    with pytest.raises(FormatError, match=rf"data section would start at byte 65536 \(tensor "
                                          rf"infos end at {len(raw)}, padded to general\."
                                          rf"alignment 65536\), past the end of the "
                                          rf"{len(raw)}-byte file"):
        GgufFile(raw)
    # The same alignment with the padding present is a valid file.
    whole = GgufFile(gguf_bytes(alignment=gguf.MAX_ALIGNMENT))
    assert whole.data_offset == gguf.MAX_ALIGNMENT and not whole.tensors


def test_gguf_writer_refuses_an_alignment_the_reader_would_refuse():
    with pytest.raises(CandleError, match=r"power of two up to 65536 \(MAX_ALIGNMENT\)"):
        gguf_bytes(alignment=2 * gguf.MAX_ALIGNMENT)


def test_gguf_empty_tensor_with_a_huge_dim_is_refused(tmp_path):
    """Finding: dims [2**63-1, 0] were accepted (0 elements), then dequantize raised numpy's
    "array is too big"."""
    raw = gguf_bytes(tensors={"t": np.zeros((0, 4), np.float32)})
    path = tmp_path / "empty.gguf"
    path.write_bytes(patched(raw, tensor_field_offset(raw, "t", "dims"), "<Q", 2**63 - 1))
    with pytest.raises(FormatError) as caught:
        GgufFile(path)
    message = str(caught.value)
    assert str(path) in message
    assert re.search(r"tensor 't' \(F32, dims \[9223372036854775807, 0\]\) describes "
                     r"9223372036854775807 elements once its zero dims are taken as 1, more "
                     rf"than the \d+ that the whole {len(raw)}-byte file could hold",
                     message), message
    # A genuinely empty tensor still loads and dequantizes.
    empty = GgufFile(raw)
    assert empty.qtensor("t").dequantize().shape == (0, 4)


@pytest.mark.parametrize("second_offset", [0, 32])
def test_gguf_overlapping_tensors_are_refused(second_offset):
    """Finding: two tensors at the same offset were accepted. Partial overlap too."""
    raw = gguf_bytes(tensors={"a": np.zeros(16, np.float32), "b": np.ones(16, np.float32)})
    bad = patched(raw, tensor_field_offset(raw, "b", "offset"), "<Q", second_offset)
    with pytest.raises(FormatError, match=rf"tensor 'b' at data offset {second_offset} overlaps "
                                          r"tensor 'a' \(bytes 0\.\.64\)"):
        GgufFile(bad)


def test_gguf_empty_tensors_may_share_an_offset():
    """llama.cpp's layout puts the tensor after an empty one at the same offset: still valid."""
    raw = gguf_bytes(tensors={"e": np.zeros((0, 4), np.float32), "a": np.ones(8, np.float32)})
    parsed = GgufFile(raw)
    assert parsed.tensors["e"].offset == parsed.tensors["a"].offset == 0
    np.testing.assert_array_equal(parsed.qtensor("a").dequantize(), np.ones(8))


def test_gguf_tensor_range_past_the_file_names_the_tensor():
    raw = gguf_bytes(tensors={"a": np.zeros(16, np.float32)})
    bad = patched(raw, tensor_field_offset(raw, "a", "dims"), "<Q", 2**62)
    with pytest.raises(FormatError, match=r"tensor 'a' \(F32, dims \[4611686018427387904\]\) "
                                          r"needs bytes 0\.\.18446744073709551616 of the data "
                                          r"section, which has 64"):
        GgufFile(bad)


@pytest.mark.parametrize("field_at, value, message", [
    (8, 2**40, r"1099511627776 tensor infos needs \d+ bytes but only \d+ remain"),
    (16, 2**60, r"1152921504606846976 metadata entries needs \d+ bytes but only \d+ remain"),
    (24, 2**63, r"metadata key 0 \(a string of 9223372036854775808 bytes\) needs"),
])
def test_gguf_counts_and_lengths_are_bounded_by_the_remaining_bytes(field_at, value, message):
    raw = gguf_bytes({"k": "value", "ids": np.arange(4, dtype=np.int32)})
    with pytest.raises(FormatError, match=message):
        GgufFile(patched(raw, field_at, "<Q", value))


def test_gguf_array_length_is_bounded_before_allocating():
    raw = gguf_bytes({"ids": np.arange(4, dtype=np.int32)})
    count_at = 24 + 8 + len("ids") + 4 + 4
    with pytest.raises(FormatError, match=r"array 'ids' \(2305843009213693952 x int32\) needs "
                                          r"9223372036854775808 bytes but only \d+ remain"):
        GgufFile(patched(raw, count_at, "<Q", 2**61))
