"""A pickle interpreter that builds data and never runs code: the half of the PyTorch reader
(io/pytorch.py) that reads `data.pkl`.

Python's `pickle` calls whatever a pickle names (``os.system``, ``builtins.eval``...) while
loading. This interpreter is written from the pickle opcode table and knows only what a state
dict is made of:

- data opcodes of protocols 0 to 5: None/True/False, ints (all widths, text and binary),
  floats, str and bytes (all widths), tuples, lists, dicts, the memo (PUT/GET, MEMOIZE),
  MARK/POP/DUP, PROTO and FRAME;
- GLOBAL / STACK_GLOBAL, resolved against an allowlist the caller passes (`globals`:
  "module.name" -> a plain Python function or value of ours); REDUCE calls only those. An
  allowed function checks its arguments' types and returns a new value or an immutable one
  (never a list or dict it was given);
- BUILD only on an ``OrderedDict`` with a dict state (``state_dict()._metadata``), which is
  dropped;
- persistent ids (BINPERSID, PERSID), handed to the caller's ``persistent_load``.

A global outside the allowlist is never looked up: it becomes an inert placeholder that
records its name (REDUCE, NEWOBJ and BUILD on a placeholder give another placeholder), so
that one FormatError at the end can name every class and function the pickle refers to.
INST, OBJ, NEWOBJ and NEWOBJ_EX on anything else, extension codes, out-of-band buffers, sets
and any unknown opcode are refused on the spot with a FormatError naming the opcode and its
offset. Lengths are checked against the bytes left before anything is allocated.

*Time and memory linear in the pickle's size.* DUP and the memo let a pickle refer to one
value many times: 2 bytes (DUP, TUPLE2) make a tuple whose halves are one object, so 80 bytes
can describe a tuple of 2**40 nodes. Whatever walks such a value as a tree (Python's tuple
hash, ``repr``, ``str``, a check of a dict key) would take exponential time. So every value
carries its *size*, the value written out in full (one per container and scalar, plus the
length of each string and bytes, a shared part counted each time it appears), summed as
containers are built and grown; a container, and the arguments of all calls together, may
not exceed ``NODES_PER_BYTE`` per byte read so far (plus ``MIN_SIZE_CAP``). A list or dict
that the memo or a DUP also refers to keeps one size record for every reference, and once it
is inside another container it may not change (the containers that hold it counted its size;
a real pickler fills a container before another one takes it, cycles aside). The memo keeps
at most one entry per two bytes read (every entry a real pickler makes follows an opcode that
built the value), a global's name is kept once however often it appears and refused from
``MAX_GLOBAL_NAME`` characters, dict keys are checked with a walk that stops at
``MAX_KEY_NODES`` nodes,
and values appear in messages only through `describe`, which stops at
``MAX_DESCRIBED_CHARS`` (these two live in io/pickle_values.py).
"""

from __future__ import annotations

import collections
import struct

from ..core.errors import FormatError
from .pickle_values import Refused, describe, key_problem, leaf_size

# A value (or all calls' arguments together) may be this many times the bytes read so far,
# plus MIN_SIZE_CAP: a real state dict's size is about its pickle's length (sharing is rare:
# tied weights share a storage, which weighs 1).
NODES_PER_BYTE = 16
MIN_SIZE_CAP = 1 << 20
MAX_TEXT_INT_DIGITS = 4000  # INT/LONG written as text: below Python's int-from-str limit
MAX_GLOBAL_NAME = 512  # characters of "module.name"
MAX_ERROR_CHARS = 200  # an error raised by Python while running an opcode, quoted
# The placeholder names listed in one error message (the rest are counted).
MAX_NAMED_GLOBALS = 24


class _Mark:
    __slots__ = ()


_MARK = _Mark()


class _Shared:
    """The size of a list or dict that the memo or a DUP also refers to: one record shared by
    every reference, so that filling the container through one of them is seen through all."""

    __slots__ = ("size", "nested")

    def __init__(self, size: int):
        self.size = size
        self.nested = False  # inside another container (or a call's arguments): frozen


def _size_of(entry) -> int:
    return entry.size if type(entry) is _Shared else entry


class PickleMachine:
    """Runs one pickle starting at `start` in `data` (a bytes-like object).

    ``globals``: "module.name" -> callable or value (the allowlist); ``persistent_load``:
    f(pid) -> object, or None to refuse persistent ids; ``what``: how messages name the pickle.
    ``run()`` returns (the object, the offset after STOP)."""

    def __init__(self, data, start: int = 0, *, globals=None, persistent_load=None,
                 what: str = "pickle"):
        self.data = memoryview(data).cast("B") if not isinstance(data, bytes) else data
        self.start = self.pos = start
        self.globals = dict(globals or {})
        self.persistent_load = persistent_load
        self.what = what
        self.stack = []
        self.sizes = []  # each stack value's size: an int, or a _Shared record
        self.marks = []  # the stack lengths at each MARK
        # The memo: ids a pickler hands out in order (0, 1, 2...) live in two lists (value,
        # size), any other id in `sparse_memo` (id -> (value, size)).
        self.memo, self.memo_sizes, self.sparse_memo = [], [], {}
        self.call_sizes = 0  # the sizes of all calls' arguments, together
        self.refused = {}  # names of globals that were not allowed (one string each), in order

    # -- reading ------------------------------------------------------------------------------
    def fail(self, message: str, at=None) -> FormatError:
        where = self.pos if at is None else at
        return FormatError(f"{self.what}: {message} (at byte {where})")

    def take(self, count: int) -> bytes:
        if count < 0 or count > len(self.data) - self.pos:
            raise self.fail(f"needs {count} bytes, only {max(len(self.data) - self.pos, 0)} "
                            "are left")
        chunk = bytes(self.data[self.pos:self.pos + count])
        self.pos += count
        return chunk

    def unpack(self, fmt: str):
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def line(self) -> bytes:
        """Up to the next newline (text opcodes), which is consumed."""
        end = bytes(self.data[self.pos:self.pos + MAX_TEXT_INT_DIGITS + 256]).find(b"\n")
        if end < 0:
            raise self.fail("a text argument has no end of line (or is too long)")
        return self.take(end + 1)[:-1]

    # -- sizes --------------------------------------------------------------------------------
    def size_cap(self) -> int:
        return NODES_PER_BYTE * (self.pos - self.start) + MIN_SIZE_CAP

    def check_size(self, size: int, what: str) -> None:
        if size > self.size_cap():
            raise self.fail(
                f"{what} of size {size} (shared parts counted each time they appear) from "
                f"{self.pos - self.start} bytes of pickle: more than {NODES_PER_BYTE} per "
                f"byte plus {MIN_SIZE_CAP}, what no state dict needs (walking it would take "
                "time out of proportion to the file)")

    @staticmethod
    def nest(entries) -> int:
        """The total size of values going inside a container (or into a call's arguments). A
        shared list or dict among them is frozen from now on: the container counted it."""
        total = 0
        for entry in entries:
            if type(entry) is _Shared:
                entry.nested = True
                total += entry.size
            else:
                total += entry
        return total

    def share_top(self):
        """The top's size entry, made a _Shared record if the top is a list or dict (about to
        be referred to by the memo or a DUP as well)."""
        entry = self.sizes[-1]
        if type(entry) is not _Shared and isinstance(self.stack[-1], (list, dict)):
            entry = self.sizes[-1] = _Shared(entry)
        return entry

    def grow_top(self, entries, opcode: str) -> None:
        """The list or dict on top is getting the values whose size entries are `entries`."""
        entry = self.sizes[-1]
        if type(entry) is _Shared and entry.nested:
            raise self.fail(f"{opcode} changes a {type(self.stack[-1]).__name__} that is already "
                            "inside another container (a pickler fills a container before it "
                            "is used)")
        size = _size_of(entry) + self.nest(entries)
        self.check_size(size, f"a {type(self.stack[-1]).__name__}")
        if type(entry) is _Shared:
            entry.size = size
        else:
            self.sizes[-1] = size

    # -- the stack ----------------------------------------------------------------------------
    def push(self, value, size=None) -> None:
        self.stack.append(value)
        self.sizes.append(leaf_size(value) if size is None else size)

    def push_built(self, container, entries) -> None:
        """Push a new container made of the values whose size entries are `entries`."""
        size = 1 + self.nest(entries)
        self.check_size(size, f"a {type(container).__name__}")
        self.push(container, size)

    def pop_entry(self):
        """(value, size entry) of the top, removed."""
        if not self.stack or (self.marks and len(self.stack) <= self.marks[-1]):
            raise self.fail("pops an empty stack")
        return self.stack.pop(), self.sizes.pop()

    def pop(self):
        return self.pop_entry()[0]

    def pop_mark(self):
        """(values, size entries) since the last MARK, removed."""
        if not self.marks:
            raise self.fail("needs a MARK and there is none")
        start = self.marks.pop()
        items, entries = self.stack[start:], self.sizes[start:]
        del self.stack[start:], self.sizes[start:]
        return items, entries

    def top(self):
        if not self.stack or (self.marks and len(self.stack) <= self.marks[-1]):
            raise self.fail("reads an empty stack")
        return self.stack[-1]

    def memo_put(self, key: int) -> None:
        if not 0 <= key < 1 << 32:  # what the binary opcodes can write; no colliding hashes
            raise self.fail(f"memo key of {key.bit_length()} bits")
        value = self.top()
        entry = self.share_top()
        memo = self.memo
        if key < len(memo):
            memo[key], self.memo_sizes[key] = value, entry
            return
        if key == len(memo):  # the usual case: ids handed out in order
            memo.append(value)
            self.memo_sizes.append(entry)
            if self.sparse_memo:
                self.sparse_memo.pop(key, None)
        else:
            self.sparse_memo[key] = (value, entry)
        entries = len(memo) + len(self.sparse_memo)
        if entries > (self.pos - self.start) // 2:
            raise self.fail(f"{entries} memo entries from {self.pos - self.start} bytes: a "
                            "pickler memoizes each value once, after the opcode that built it")

    def memo_count(self) -> int:
        """How many memo ids are stored: the id MEMOIZE gives the top."""
        return len(self.memo) + len(self.sparse_memo)

    def memo_get(self, key: int):
        if key < len(self.memo):
            self.push(self.memo[key], self.memo_sizes[key])
        elif key in self.sparse_memo:
            self.push(*self.sparse_memo[key])
        else:
            raise self.fail(f"memo key {key} was never stored")

    # -- globals ------------------------------------------------------------------------------
    def find_global(self, module, name):
        if not isinstance(module, str) or not isinstance(name, str):
            raise self.fail("STACK_GLOBAL needs two strings")
        if len(module) + len(name) >= MAX_GLOBAL_NAME:
            raise self.fail(f"a global name of {len(module) + len(name) + 1} characters")
        full = f"{module}.{name}"
        if full in self.globals:
            return self.globals[full]
        return Refused(self.refused.setdefault(full, full))

    def call(self, func, args, args_entry):
        """(result, its size) of REDUCE."""
        if isinstance(func, Refused):
            return Refused(func.name), 1
        if not isinstance(args, tuple):
            raise self.fail("REDUCE needs an argument tuple")
        if not callable(func):
            raise self.fail(f"REDUCE on a value that is not a function ({type(func).__name__})")
        # A function's work (and what it builds) grows with its arguments, which may be shared
        # values reached by 2-byte memo GETs: every call is charged its arguments' size.
        args_size = _size_of(args_entry)
        self.call_sizes += args_size
        self.check_size(self.call_sizes, "the arguments of the calls, together,")
        result = func(*args)
        if isinstance(result, (tuple, list, dict)):
            return result, 1 + args_size  # built from the arguments only
        return result, leaf_size(result)

    # -- the loop -----------------------------------------------------------------------------
    def run(self):
        while True:
            at = self.pos
            code = self.take(1)
            handler = _OPCODES.get(code)
            if handler is None:
                name = _REFUSED_OPCODES.get(code)
                if name is None:
                    raise self.fail(f"unknown opcode {code!r}", at)
                raise self.fail(f"opcode {name} is refused: it builds objects or reads data a "
                                "state dict does not need", at)
            if handler is _stop:
                if len(self.stack) != 1 or self.marks:
                    raise self.fail(f"STOP with {len(self.stack)} values on the stack and "
                                    f"{len(self.marks)} open MARKs", at)
                if self.refused:
                    names = list(self.refused)
                    shown = ", ".join(names[:MAX_NAMED_GLOBALS])
                    more = len(names) - MAX_NAMED_GLOBALS
                    raise FormatError(
                        f"{self.what}: refused: the pickle names "
                        f"{len(names)} class(es)/function(s) a state dict does not use: "
                        f"{shown}{f' and {more} more' if more > 0 else ''}. Nothing was "
                        "imported or run (only tensors, numbers, strings, lists, tuples and "
                        "dicts are read, as torch.load(weights_only=True) does)")
                return self.stack[0], self.pos
            try:
                handler(self)
            except FormatError:
                raise
            except (ValueError, TypeError, OverflowError, UnicodeDecodeError, KeyError,
                    IndexError, struct.error, RecursionError, MemoryError) as error:
                # A KeyError's text is its key's repr: described, as the pickle's values are.
                text = (describe(error.args[0]) if isinstance(error, KeyError) and error.args
                        else str(error)[:MAX_ERROR_CHARS])
                raise self.fail(f"opcode {code!r}: {type(error).__name__}: {text}", at) from None


# -- opcode handlers ------------------------------------------------------------------------------
def _stop(m):  # handled in run()
    pass


def _proto(m):
    version = m.take(1)[0]
    if version > 5:
        raise m.fail(f"pickle protocol {version} is newer than 5")


def _frame(m):
    m.unpack("<Q")  # protocol 4 framing: the frame's length, a hint only


def _mark(m):
    m.marks.append(len(m.stack))


def _pop(m):
    if m.marks and len(m.stack) == m.marks[-1]:
        m.marks.pop()  # POP of a MARK (pickle's own behaviour)
    else:
        m.pop()


def _text_int(m, text: bytes) -> int:
    text = text.rstrip(b"L")
    if len(text) > MAX_TEXT_INT_DIGITS:
        raise m.fail(f"a text integer of {len(text)} digits")
    return int(text.decode("ascii"))


def _int(m):
    text = m.line()
    if text == b"00":
        m.push(False)
    elif text == b"01":
        m.push(True)
    else:
        m.push(_text_int(m, text))


def _long1(m):
    m.push(int.from_bytes(m.take(m.take(1)[0]), "little", signed=True))


def _long4(m):
    m.push(int.from_bytes(m.take(m.unpack("<i")), "little", signed=True))


def _float(m):
    m.push(float(m.line().decode("ascii")))


def _text_string(m):
    """STRING: a quoted Python 2 str literal; only plain quoted ASCII is accepted."""
    text = m.line()
    if len(text) < 2 or text[:1] != text[-1:] or text[:1] not in (b"'", b'"'):
        raise m.fail("STRING argument is not a quoted string")
    m.push(text[1:-1].decode("unicode_escape"))


def _unicode(m):
    m.push(m.line().decode("raw-unicode-escape"))


def _sized(fmt: str, kind: str):
    def handler(m):
        length = m.unpack(fmt)
        raw = m.take(length)
        if kind == "str":
            m.push(raw.decode("utf-8", "surrogatepass"))
        elif kind == "py2str":
            m.push(raw.decode("utf-8"))  # a Python 2 str, decoded as torch.load does (UTF-8)
        else:
            m.push(raw)
    return handler


def _tuple(m):
    items, entries = m.pop_mark()
    m.push_built(tuple(items), entries)


def _tuple_n(count: int):
    def handler(m):
        popped = [m.pop_entry() for _ in range(count)][::-1]
        m.push_built(tuple(value for value, _ in popped), [entry for _, entry in popped])
    return handler


def _list(m):
    items, entries = m.pop_mark()
    m.push_built(items, entries)


def _append(m):
    value, entry = m.pop_entry()
    target = m.top()
    if not isinstance(target, list):
        raise m.fail(f"APPEND to a {type(target).__name__}")
    m.grow_top([entry], "APPEND")
    target.append(value)


def _appends(m):
    items, entries = m.pop_mark()
    target = m.top()
    if not isinstance(target, list):
        raise m.fail(f"APPENDS to a {type(target).__name__}")
    m.grow_top(entries, "APPENDS")
    target.extend(items)


def _hashable(m, key):
    problem = key_problem(key)
    if problem:
        raise m.fail(problem)


def _set_items(m, target, items):
    if len(items) % 2:
        raise m.fail("SETITEMS with an odd number of values")
    for index in range(0, len(items), 2):
        _hashable(m, items[index])
        target[items[index]] = items[index + 1]


def _dict(m):
    items, entries = m.pop_mark()
    target = {}
    _set_items(m, target, items)
    m.push_built(target, entries)


def _setitem(m):
    value, value_entry = m.pop_entry()
    key, key_entry = m.pop_entry()
    _grow_dict(m, [key, value], [key_entry, value_entry])


def _setitems(m):
    _grow_dict(m, *m.pop_mark())


def _grow_dict(m, items, entries):
    target = m.top()
    if not isinstance(target, dict):
        raise m.fail(f"SETITEM(S) on a {type(target).__name__}")
    m.grow_top(entries, "SETITEM(S)")
    _set_items(m, target, items)


def _global(m):
    module = m.line().decode("utf-8")
    name = m.line().decode("utf-8")
    m.push(m.find_global(module, name))


def _stack_global(m):
    name = m.pop()
    module = m.pop()
    m.push(m.find_global(module, name))


def _reduce(m):
    args, args_entry = m.pop_entry()
    func = m.pop()
    m.push(*m.call(func, args, args_entry))


def _newobj(m):
    m.pop()  # the arguments
    cls = m.pop()
    if not isinstance(cls, Refused):
        raise m.fail("opcode NEWOBJ is refused: it builds an instance of a class")
    m.push(Refused(cls.name))


def _newobj_ex(m):
    m.pop()
    m.pop()
    cls = m.pop()
    if not isinstance(cls, Refused):
        raise m.fail("opcode NEWOBJ_EX is refused: it builds an instance of a class")
    m.push(Refused(cls.name))


def _build(m):
    state = m.pop()
    target = m.top()
    if isinstance(target, Refused):
        return
    if isinstance(target, collections.OrderedDict) and isinstance(state, dict):
        return  # state_dict()._metadata (per-module versions): not needed to read tensors
    raise m.fail(f"opcode BUILD is refused on a {type(target).__name__} (it sets an object's "
                 "state)")


def _binpersid(m):
    pid = m.pop()
    if m.persistent_load is None:
        raise m.fail("a persistent id where none is expected")
    m.push(m.persistent_load(pid))


def _persid(m):
    pid = m.line().decode("ascii")
    if m.persistent_load is None:
        raise m.fail("a persistent id where none is expected")
    m.push(m.persistent_load(pid))


def _inst(m):
    module, name = m.line().decode("utf-8", "replace"), m.line().decode("utf-8", "replace")
    raise m.fail(f"opcode INST is refused: it would build an instance of {module}.{name}")


def _obj(m):
    items, _ = m.pop_mark()
    named = items[0].name if items and isinstance(items[0], Refused) else "a class"
    raise m.fail(f"opcode OBJ is refused: it would build an instance of {named}")


def _dup(m):
    value = m.top()
    m.push(value, m.share_top())


def _pop_mark(m):
    m.pop_mark()


_OPCODES = {
    b".": _stop, b"\x80": _proto, b"\x95": _frame, b"(": _mark, b"0": _pop, b"1": _pop_mark,
    b"2": _dup,
    b"N": lambda m: m.push(None), b"\x88": lambda m: m.push(True),
    b"\x89": lambda m: m.push(False),
    b"I": _int, b"J": lambda m: m.push(m.unpack("<i")), b"K": lambda m: m.push(m.take(1)[0]),
    b"M": lambda m: m.push(m.unpack("<H")), b"L": lambda m: m.push(_text_int(m, m.line())),
    b"\x8a": _long1, b"\x8b": _long4, b"F": _float, b"G": lambda m: m.push(m.unpack(">d")),
    b"S": _text_string, b"T": _sized("<i", "py2str"), b"U": _sized("<B", "py2str"),
    b"B": _sized("<i", "bytes"), b"C": _sized("<B", "bytes"), b"\x8e": _sized("<Q", "bytes"),
    b"V": _unicode, b"X": _sized("<I", "str"), b"\x8c": _sized("<B", "str"),
    b"\x8d": _sized("<Q", "str"),
    b")": lambda m: m.push(()), b"t": _tuple, b"\x85": _tuple_n(1), b"\x86": _tuple_n(2),
    b"\x87": _tuple_n(3),
    b"]": lambda m: m.push([]), b"l": _list, b"a": _append, b"e": _appends,
    b"}": lambda m: m.push({}), b"d": _dict, b"s": _setitem, b"u": _setitems,
    b"p": lambda m: m.memo_put(_text_int(m, m.line())), b"q": lambda m: m.memo_put(m.take(1)[0]),
    b"r": lambda m: m.memo_put(m.unpack("<I")), b"\x94": lambda m: m.memo_put(m.memo_count()),
    b"g": lambda m: m.memo_get(_text_int(m, m.line())), b"h": lambda m: m.memo_get(m.take(1)[0]),
    b"j": lambda m: m.memo_get(m.unpack("<I")),
    b"c": _global, b"\x93": _stack_global, b"R": _reduce, b"\x81": _newobj,
    b"\x92": _newobj_ex, b"b": _build, b"Q": _binpersid, b"P": _persid, b"i": _inst,
    b"o": _obj,
}
_REFUSED_OPCODES = {
    b"\x82": "EXT1", b"\x83": "EXT2", b"\x84": "EXT4",
    b"\x8f": "EMPTY_SET", b"\x90": "ADDITEMS", b"\x91": "FROZENSET", b"\x96": "BYTEARRAY8",
    b"\x97": "NEXT_BUFFER", b"\x98": "READONLY_BUFFER",
}


def run_pickle(data, start: int = 0, **options):
    """(object, end offset) of the pickle at `start` (see PickleMachine for the options)."""
    return PickleMachine(data, start, **options).run()


__all__ = ["PickleMachine", "Refused", "describe", "key_problem", "run_pickle"]
