"""A pickle interpreter that builds data and never runs code: the half of the PyTorch reader
(io/pytorch.py) that reads `data.pkl`.

Python's `pickle` calls whatever a pickle names (``os.system``, ``builtins.eval``...) while
loading. This interpreter is written from the pickle opcode table and knows only what a state
dict is made of:

- data opcodes of protocols 0 to 5: None/True/False, ints (all widths, text and binary),
  floats, str and bytes (all widths), tuples, lists, dicts, the memo (PUT/GET, MEMOIZE),
  MARK/POP/DUP, PROTO and FRAME;
- GLOBAL / STACK_GLOBAL, resolved against an allowlist the caller passes (`globals`:
  "module.name" -> a plain Python function or value of ours); REDUCE calls only those;
- BUILD only on an ``OrderedDict`` with a dict state (``state_dict()._metadata``), which is
  dropped;
- persistent ids (BINPERSID, PERSID), handed to the caller's ``persistent_load``.

A global outside the allowlist is never looked up: it becomes an inert placeholder that
records its name (REDUCE, NEWOBJ and BUILD on a placeholder give another placeholder), so
that one FormatError at the end can name every class and function the pickle refers to.
INST, OBJ, NEWOBJ and NEWOBJ_EX on anything else, extension codes, out-of-band buffers, sets
and any unknown opcode are refused on the spot with a FormatError naming the opcode and its
offset. Lengths are checked against the bytes left before anything is allocated; a pickle is
read in one pass, so time is linear in its size.
"""

from __future__ import annotations

import collections
import struct

from ..core.errors import FormatError

MAX_MEMO_ENTRIES = 1 << 24  # a state dict has a few entries per tensor
MAX_TEXT_INT_DIGITS = 4000
MAX_INT_KEY = 1 << 60  # dict keys: see _hashable  # INT/LONG written as text: below Python's int-from-str limit
# The placeholder names listed in one error message (the rest are counted).
MAX_NAMED_GLOBALS = 24


class Refused:
    """What an unknown global (and anything built from it) stands for: only its name."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return f"<refused {self.name}>"


class _Mark:
    __slots__ = ()


_MARK = _Mark()


class PickleMachine:
    """Runs one pickle starting at `start` in `data` (a bytes-like object).

    ``globals``: "module.name" -> callable or value (the allowlist); ``persistent_load``:
    f(pid) -> object, or None to refuse persistent ids; ``what``: how messages name the pickle.
    ``run()`` returns (the object, the offset after STOP)."""

    def __init__(self, data, start: int = 0, *, globals=None, persistent_load=None,
                 what: str = "pickle"):
        self.data = memoryview(data).cast("B") if not isinstance(data, bytes) else data
        self.pos = start
        self.globals = dict(globals or {})
        self.persistent_load = persistent_load
        self.what = what
        self.stack = []
        self.marks = []  # the stack lengths at each MARK
        self.memo = {}
        self.refused = []  # names of globals that were not allowed, in order of appearance

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

    # -- the stack ----------------------------------------------------------------------------
    def push(self, value) -> None:
        self.stack.append(value)

    def pop(self):
        if not self.stack or (self.marks and len(self.stack) <= self.marks[-1]):
            raise self.fail("pops an empty stack")
        return self.stack.pop()

    def pop_mark(self) -> list:
        if not self.marks:
            raise self.fail("needs a MARK and there is none")
        start = self.marks.pop()
        items = self.stack[start:]
        del self.stack[start:]
        return items

    def top(self):
        if not self.stack or (self.marks and len(self.stack) <= self.marks[-1]):
            raise self.fail("reads an empty stack")
        return self.stack[-1]

    def memo_put(self, key: int) -> None:
        if not 0 <= key < 1 << 32:  # what the binary opcodes can write; no colliding hashes
            raise self.fail(f"memo key of {key.bit_length()} bits")
        if len(self.memo) >= MAX_MEMO_ENTRIES and key not in self.memo:
            raise self.fail(f"more than {MAX_MEMO_ENTRIES} memo entries")
        self.memo[key] = self.top()

    def memo_get(self, key: int):
        if key not in self.memo:
            raise self.fail(f"memo key {key} was never stored")
        self.push(self.memo[key])

    # -- globals ------------------------------------------------------------------------------
    def find_global(self, module, name):
        if not isinstance(module, str) or not isinstance(name, str):
            raise self.fail("STACK_GLOBAL needs two strings")
        full = f"{module}.{name}"
        if full in self.globals:
            return self.globals[full]
        self.refused.append(full)
        return Refused(full)

    def call(self, func, args):
        if isinstance(func, Refused):
            return Refused(func.name)
        if not isinstance(args, tuple):
            raise self.fail("REDUCE needs an argument tuple")
        if not callable(func):
            raise self.fail(f"REDUCE on a value that is not a function ({type(func).__name__})")
        return func(*args)

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
                    names = list(dict.fromkeys(self.refused))
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
                raise self.fail(f"opcode {code!r}: {type(error).__name__}: {error}", at) from None


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
    m.push(tuple(m.pop_mark()))


def _tuple_n(count: int):
    def handler(m):
        items = [m.pop() for _ in range(count)][::-1]
        m.push(tuple(items))
    return handler


def _list(m):
    m.push(m.pop_mark())


def _append(m):
    value = m.pop()
    target = m.top()
    if not isinstance(target, list):
        raise m.fail(f"APPEND to a {type(target).__name__}")
    target.append(value)


def _appends(m):
    items = m.pop_mark()
    target = m.top()
    if not isinstance(target, list):
        raise m.fail(f"APPENDS to a {type(target).__name__}")
    target.extend(items)


def key_problem(key):
    """Why `key` may not be a dict key here, or None. Allowed: keys whose hashes a file cannot
    make collide: str and bytes (randomised hashes), ints up to 2**60 (hashed as themselves),
    None, and tuples of those. Huge ints and floats are refused: multiples of 2**61 - 1 all
    hash alike, which turns n insertions into n**2 work."""
    if isinstance(key, tuple):
        return next((problem for problem in map(key_problem, key) if problem), None)
    if isinstance(key, int) and not -MAX_INT_KEY <= key <= MAX_INT_KEY:
        return f"a dict key int of {key.bit_length()} bits"
    if not isinstance(key, (str, bytes, int, type(None))):
        return f"a dict key of type {type(key).__name__}"
    return None


def _hashable(m, key):
    problem = key_problem(key)
    if problem:
        raise m.fail(problem)


def _set_items(m, target, items):
    if not isinstance(target, dict):
        raise m.fail(f"SETITEM(S) on a {type(target).__name__}")
    if len(items) % 2:
        raise m.fail("SETITEMS with an odd number of values")
    for index in range(0, len(items), 2):
        _hashable(m, items[index])
        target[items[index]] = items[index + 1]


def _dict(m):
    items = m.pop_mark()
    target = {}
    _set_items(m, target, items)
    m.push(target)


def _setitem(m):
    value = m.pop()
    key = m.pop()
    _set_items(m, m.top(), [key, value])


def _setitems(m):
    items = m.pop_mark()
    _set_items(m, m.top(), items)


def _global(m):
    module = m.line().decode("utf-8")
    name = m.line().decode("utf-8")
    m.push(m.find_global(module, name))


def _stack_global(m):
    name = m.pop()
    module = m.pop()
    m.push(m.find_global(module, name))


def _reduce(m):
    args = m.pop()
    func = m.pop()
    m.push(m.call(func, args))


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
    items = m.pop_mark()
    named = items[0].name if items and isinstance(items[0], Refused) else "a class"
    raise m.fail(f"opcode OBJ is refused: it would build an instance of {named}")


def _dup(m):
    m.push(m.top())


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
    b"r": lambda m: m.memo_put(m.unpack("<I")), b"\x94": lambda m: m.memo_put(len(m.memo)),
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


__all__ = ["PickleMachine", "Refused", "key_problem", "run_pickle"]
