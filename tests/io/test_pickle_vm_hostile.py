"""Pickles that refer to one value many times (DUP, memo GET) or flood the memo: the reader
must stay linear in the file's size (issue 37). Each reproducer is a `pytorch_model.bin` of a
few bytes to a few MiB that made the reader of the reviewed revision run for minutes (a tuple
whose halves are one object, nested: 2 bytes double it) or reach gigabytes; each runs here in
a child process with a memory cap (200 MB over the interpreter) and a hang guard, and must end
in a typed error that names what is wrong, not a MemoryError, not a hang."""

from __future__ import annotations

import pickle
import struct
import sys

import pytest

from tests.bounded_run_testlib import assert_typed_error, run_bounded
from tests.io.test_pytorch_hostile import (Entry, global_, integer, legacy_file, plain,
                                           state_dict_pickle, text, zip_file)
from candle_web.core.errors import FormatError
from candle_web.io.pickle_values import MAX_DESCRIBED_CHARS, describe
from candle_web.io.pickle_vm import run_pickle
from candle_web.io.pytorch import TorchCheckpoint

PROTO = b"\x80\x02"
DUP, TUPLE2, MEMOIZE = b"2", b"\x86", b"\x94"
HANG_SECONDS = 30.0  # the reviewed revision ran past this on each reproducer


def doubled(levels: int) -> bytes:
    """A tuple of 2**(levels+1) - 1 nodes in 2 * levels + 1 bytes: None, then DUP + TUPLE2
    (a tuple whose two halves are one object) again and again."""
    return b"N" + (DUP + TUPLE2) * levels


def memoized(slot: int, value: bytes) -> bytes:
    """`value`, stored in memo slot `slot` (LONG_BINPUT) and left on the stack."""
    return value + b"r" + struct.pack("<I", slot)


def get(slot: int) -> bytes:
    return b"j" + struct.pack("<I", slot)


def load_bounded(tmp_path, data: bytes, after: str = "") -> dict:
    """TorchCheckpoint(data) (then `after`) in a capped child process."""
    path = tmp_path / "pytorch_model.bin"
    path.write_bytes(data)
    return run_bounded(f"checkpoint = TorchCheckpoint(path)\n{after}",
                       setup="from candle_web.io.pytorch import TorchCheckpoint\n"
                             f"path = {str(path)!r}", hang_seconds=HANG_SECONDS)


def assert_refused(result: dict, *fragments: str) -> str:
    message = assert_typed_error(result, *fragments)
    assert "MemoryError" not in message and "RecursionError" not in message, message
    return message


# -- a tuple whose halves are one object, nested ------------------------------------------------
SHARED_TUPLE_ROUTES = {
    # name: the pickle; the review's timings at the reviewed revision
    "a dict key (key check and tuple hash; 51 bytes took 3.0 s, x2 every 2 bytes)":
        PROTO + b"}" + doubled(40) + b"Ns.",
    "torch.device (str of it; 80 bytes took 24 s and 400 MB)":
        PROTO + global_("torch", "device") + doubled(30) + b"\x85R.",
    "the storage type of a persistent id (its repr in the refusal)":
        PROTO + b"(" + text("storage") + doubled(40) + text("0") + text("cpu") + integer(1)
        + b"tQ.",
    "the head of a persistent id (its repr in the refusal)":
        PROTO + doubled(40) + b"\x85Q.",
    "the whole checkpoint, printed by its user (30 levels: tensors are looked for 32 deep)":
        PROTO + doubled(30) + b".",
}


@pytest.mark.parametrize("route", list(SHARED_TUPLE_ROUTES))
def test_a_value_shared_with_itself_is_refused_while_it_is_built(route, tmp_path):
    """The tuple is refused when it passes 16 nodes per byte read (plus 2**20), at 2**21 - 1
    nodes, before anything walks it; printing what was loaded would have walked it too."""
    result = load_bounded(tmp_path, zip_file(SHARED_TUPLE_ROUTES[route]),
                          after="print(len(repr(checkpoint.object)))")
    assert_refused(result, "data.pkl: a tuple of size 2097151", "16 per byte")


def test_a_shared_tuple_in_the_legacy_layout_is_refused_too(tmp_path):
    """The legacy layout's protocol-version pickle (quoted in its refusal) as the carrier."""
    data = plain(0x1950A86A20F9469CFC6C) + PROTO + doubled(40) + b"."
    result = load_bounded(tmp_path, data)
    assert_refused(result, "protocol version: a tuple of size 2097151")


def test_a_tuple_key_used_again_and_again_is_refused_at_its_first_use(tmp_path):
    """A key of 2**17 - 1 nodes (within the size cap) set 200 000 times: every insertion
    hashed (and checked) all of it, about 5 * 10**10 steps. Keys are walked up to 256 nodes."""
    key = memoized(0, doubled(16)) + b"0"
    data = PROTO + key + b"}" + (get(0) + b"Ns") * 200_000 + b"."
    result = load_bounded(tmp_path, zip_file(data))
    assert_refused(result, "a dict key tuple of more than 256 nodes")


def colliding_int_pairs(count: int) -> list:
    """`count` pairs (a, b) of ints within 2**60 whose tuples hash alike under CPython's tuple
    hash (xxHash's mixing with public constants; an int's hash is the int): for each a, the b
    that brings the mix to the first pair's state is solved for (one a in eight gives a b in
    range)."""
    mask, prime1, prime2, prime5 = (1 << 64) - 1, 11400714785074694791, \
        14029467366897019727, 2870177450012600261

    def mix(acc: int, value: int) -> int:
        acc = (acc + (hash(value) & mask) * prime2) & mask
        return ((acc << 31 | acc >> 33) & mask) * prime1 & mask

    wanted = mix(mix(prime5, 1), 0) * pow(prime1, -1, 1 << 64) & mask
    wanted = (wanted >> 31 | wanted << 33) & mask  # the state before the last rotation
    inverse2, pairs, first = pow(prime2, -1, 1 << 64), [], 0
    while len(pairs) < count:
        first += 1
        lane = (wanted - mix(prime5, first)) * inverse2 & mask
        if lane < 1 << 60:
            pairs.append((first, lane))
        elif lane >= (1 << 64) - (1 << 60) and lane != mask:
            pairs.append((first, lane - (1 << 64)))  # a negative int hashes as itself too
    return pairs


def test_tuple_keys_whose_hashes_collide_are_refused(tmp_path):
    """60 000 keys (a, b) of one hash: each insertion compared with every key before it (the
    reviewed revision allowed tuples of small ints as keys). A tuple key that holds an int
    must start with a str or bytes, whose hash is random."""
    if sys.implementation.name != "cpython" or sys.hash_info.width != 64:
        pytest.skip("the collisions are solved for CPython's 64-bit tuple hash")
    pairs = colliding_int_pairs(60_000)
    assert len({hash(pair) for pair in pairs[:1000]}) == 1  # they do collide
    data = PROTO + b"}" + b"".join(integer(a) + integer(b) + TUPLE2 + b"Ns"
                                   for a, b in pairs) + b"."
    result = load_bounded(tmp_path, zip_file(data))
    assert_refused(result, "a dict key tuple that holds an int and does not start with a str")
    named = PROTO + b"}(" + text("layer") + integer(0) + TUPLE2 + b"Nu."
    assert TorchCheckpoint(zip_file(named)).object == {("layer", 0): None}


def test_a_list_that_grows_after_it_was_shared_is_refused(tmp_path):
    """Filling a list after a tuple took it would hide its growth from the tuple: L_i = [],
    T_i = (L_i,) * 16, then L_i gets T_(i-1). Every container is small when it is built, yet
    T_14 written out has 16**15 parts (its repr never ends; 30 levels deep, so the search for
    tensors still reads it). Refused at the first change."""
    data = PROTO
    for i in range(15):
        data += (b"]" + b"r" + struct.pack("<I", i)  # L_i = [], memoized
                 + b"(" + get(i) * 16 + b"t"  # T_i = (L_i, L_i, ...)
                 + b"r" + struct.pack("<I", 1000 + i) + b"0"  # T_i memoized, popped
                 + (get(1000 + i - 1) if i else b"N") + b"a0")  # L_i gets T_(i-1), popped
    result = load_bounded(tmp_path, zip_file(data + get(1014) + b"."),
                          after="print(len(repr(checkpoint.object)))")
    assert_refused(result, "APPEND changes a list that is already inside another container")


# -- the memo --------------------------------------------------------------------------------------
def test_a_memo_flood_is_refused_before_it_grows(tmp_path):
    """16 MiB of MEMOIZE on one value: the reviewed revision kept an entry for each (82 bytes
    per byte: 1.3 GB). A pickler memoizes a value once, after the opcode that built it: at
    most one entry per two bytes read."""
    data = b"\x80\x04N" + MEMOIZE * (16 << 20) + b"."
    result = load_bounded(tmp_path, zip_file(data))
    assert_refused(result, "4 memo entries from 7 bytes")


def test_memo_ids_out_of_order_still_read():
    """Ids a pickler hands out in order live in a list; others (pickletools.optimize keeps old
    ids, a hand-written pickle may skip) in a dict; GET sees the last PUT either way."""
    data = (PROTO + b"]" + text("a") + b"r\x07\x00\x00\x00a" + text("b") + b"q\x00a"
            + b"N" + b"q\x07" + b"0" + b"h\x07h\x00\x86a" + b"N" + MEMOIZE + b"0" + b".")
    value, _ = run_pickle(data)
    assert value == ["a", "b", (None, "b")] == pickle.loads(data)  # no globals: safe to load


# -- calls and names that copy what they are given -----------------------------------------------
def test_calls_on_a_shared_string_are_charged_its_length(tmp_path):
    """`_codecs.encode` of one memoized 1 MB string, 20 000 times (7 bytes each): 20 GB of
    copies for 140 kB. Every call is charged its arguments' size."""
    big = b"X" + struct.pack("<I", 1 << 20) + b"a" * (1 << 20)
    call = global_("_codecs", "encode") + b"(" + get(0) + text("latin1") + b"tR"
    data = PROTO + b"]" + memoized(0, big) + b"0" + b"(" + call * 20_000 + b"e."
    result = load_bounded(tmp_path, zip_file(data))
    assert_refused(result, "the arguments of the calls, together, of size")


def test_a_long_global_name_is_refused(tmp_path):
    """STACK_GLOBAL of a memoized 1 MB module name, 10 000 times: each placeholder used to
    hold its own 1 MB "module.name" (10 GB). Names are refused past 512 characters."""
    module = b"X" + struct.pack("<I", 1 << 20) + b"m" * (1 << 20)
    data = (b"\x80\x04" + memoized(0, module) + b"0" + b"]("
            + (get(0) + get(0) + b"\x93") * 10_000 + b"e.")
    result = load_bounded(tmp_path, zip_file(data))
    assert_refused(result, "a global name of 2097153 characters")


def test_a_tensor_name_built_from_one_long_key_repeated_is_refused(tmp_path):
    """31 nested dicts keyed by one memoized 10 000-character string, then 2 000 tensors:
    each tensor's name copied the 310 000 characters (620 MB). Names stop at 1024."""
    tensor = state_dict_pickle([Entry("t", "0", 4, 0, (4,), (1,))], False)
    start = tensor.index(global_("torch._utils", "_rebuild_tensor_v2"))
    rebuild = tensor[start:tensor.rindex(b"R") + 1]  # REDUCE(rebuild, args): one tensor
    key = memoized(0, text("k" * 10_000))
    data = PROTO + key + b"0" + b"}" + (get(0) + b"}") * 31
    data += b"(" + b"".join(integer(i) + rebuild for i in range(2_000)) + b"u"
    data += b"s" * 31 + b"."
    result = load_bounded(tmp_path, zip_file(data, {"0": b"\x00" * 16}))
    assert_refused(result, "a tensor name of more than 1024 characters")


# -- the allowlisted functions check what they are given -------------------------------------------
ARGUMENTS = {
    "torch.device of a tuple": (global_("torch", "device") + b"N\x85\x85R",
                                "torch.device: argument 1 (type) is a tuple, expected a str"),
    "torch.device with a str index": (global_("torch", "device") + text("cuda") + text("0")
                                      + b"\x86R", "torch.device: argument 2 (index) is a str"),
    "torch.Size of floats": (global_("torch", "Size") + b"G?\xf0\x00\x00\x00\x00\x00\x00"
                                                        b"\x85\x85R",
                             "torch.Size: argument 1 (sizes) holds a float, expected ints"),
    "OrderedDict of an int": (global_("collections", "OrderedDict") + b"K\x01\x85R",
                              "collections.OrderedDict: argument 1 (items) is a int"),
    "_codecs.encode of bytes": (global_("_codecs", "encode") + b"C\x01a" + text("latin1")
                                + b"\x86R", "_codecs.encode: argument 1 (obj) is a bytes"),
    "a parameter of a string": (global_("torch._utils", "_rebuild_parameter") + text("w")
                                + b"\x89}\x87R",
                                "torch._utils._rebuild_parameter: argument 1 (data) is a str"),
}


@pytest.mark.parametrize("name", list(ARGUMENTS))
def test_allowlisted_functions_refuse_arguments_of_other_types(name):
    payload, named = ARGUMENTS[name]
    with pytest.raises(FormatError, match=named.replace("(", r"\(").replace(")", r"\)")
                       .replace(".", r"\.")):
        TorchCheckpoint(zip_file(PROTO + payload + b"."))


def test_a_tensor_flag_of_the_wrong_type_is_refused():
    entries = [Entry("t", "0", 4, 0, (4,), (1,))]
    good = state_dict_pickle(entries, False)
    assert TorchCheckpoint(zip_file(good, {"0": b"\x00" * 16})).keys() == ["t"]
    bad = good.replace(b"\x89" + global_("collections", "OrderedDict"),
                       text("yes") + global_("collections", "OrderedDict"))
    with pytest.raises(FormatError, match=r"_rebuild_tensor_v2: argument 5 \(requires_grad\) "
                                          "is a str, expected a bool"):
        TorchCheckpoint(zip_file(bad, {"0": b"\x00" * 16}))


# -- what is still read ------------------------------------------------------------------------------
def test_a_state_dict_referred_to_twice_still_reads():
    """Sharing as a real checkpoint may ({"model": sd, "ema": sd}) is far from the caps (the
    second reference is the same tensors: they are listed once, under the first name)."""
    entries = [Entry(f"layer{i}.weight", str(i), 4, 0, (2, 2), (2, 1)) for i in range(200)]
    state = state_dict_pickle(entries, False)[len(PROTO):-1]
    data = PROTO + b"}(" + text("model") + memoized(0, state) + text("ema") + get(0) + b"u."
    checkpoint = TorchCheckpoint(zip_file(data, {str(i): b"\x00" * 16 for i in range(200)}))
    assert checkpoint.keys() == [f"model.layer{i}.weight" for i in range(200)]
    assert checkpoint.object["ema"] is checkpoint.object["model"]


def test_describe_cuts_long_and_shared_values():
    shared = None
    for _ in range(60):
        shared = (shared, shared)  # 2**61 nodes, were it written out
    assert len(describe(shared)) == MAX_DESCRIBED_CHARS + 3
    assert describe(shared).startswith("((((((((((")
    assert describe(("storage", None, [1, 2], {"a": b"x"})) == \
        "('storage', None, [1, 2], {'a': b'x'})"
    assert describe("s" * 10**6).endswith("...") and len(describe("s" * 10**6)) < 100
    assert describe(2**100000) == "<an int of 100001 bits>"
    assert describe((1,)) == "(1,)"
