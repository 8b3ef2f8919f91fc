"""What the values a pickle builds may cost, and how they are shown: the checks io/pickle_vm.py
(the interpreter) and io/pytorch.py (its allowlisted functions) apply to them.

A few bytes of pickle can make a value that is huge when walked as a tree (DUP and the memo
let one object appear any number of times) or a string of megabytes that many values refer
to. So a value's *size* counts what writing it out costs (`leaf_size` for one that is not a
container), a dict key is checked by a walk that stops at MAX_KEY_NODES nodes, and a value is
quoted in a message only through `describe`, which stops at MAX_DESCRIBED_CHARS characters.
"""

from __future__ import annotations

MAX_INT_KEY = 1 << 60  # dict keys: see key_problem
MAX_KEY_NODES = 256  # a dict key is hashed (every node of it) each time it is used
MAX_DESCRIBED_CHARS = 80  # a pickle's value quoted in a message


class Refused:
    """What an unknown global (and anything built from it) stands for: only its name."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return f"<refused {self.name}>"


def leaf_size(value) -> int:
    """The size of a value that is not a container: 1, plus a string's or bytes' length and an
    int's bytes (what writing it out costs)."""
    kind = type(value)  # exact types: what the opcodes build (bool weighs 1)
    if kind is str or kind is bytes:
        return 1 + len(value)
    if kind is int:
        return 1 + value.bit_length() // 8
    return 1


class _Text(str):
    """Punctuation on `describe`'s to-do stack (text to write, not a value to describe)."""

    __slots__ = ()


def describe(value, limit: int = MAX_DESCRIBED_CHARS) -> str:
    """`repr` of a value a pickle built, cut after `limit` characters ("..." then). The walk
    stops there too: a value whose full repr would be exponentially long (shared parts) or
    gigabytes (a long string) costs about `limit` steps."""
    pieces, length, todo = [], 0, [value]
    while todo and length <= limit:
        item = todo.pop()
        if type(item) is _Text:
            text = item
        elif isinstance(item, (tuple, list)):
            is_tuple = isinstance(item, tuple)
            text = "(" if is_tuple else "["
            todo.append(_Text((",)" if len(item) == 1 else ")") if is_tuple else "]"))
            shown = item[:limit]  # each item takes 1 character at least: the rest is cut
            for index in range(len(shown) - 1, -1, -1):
                todo.append(shown[index])
                if index:
                    todo.append(_Text(", "))
        elif isinstance(item, dict):
            text = "{"
            todo.append(_Text("}"))
            pairs = []
            for pair in item.items():
                if len(pairs) >= limit:
                    break
                pairs.append(pair)
            for index in range(len(pairs) - 1, -1, -1):
                todo.extend((pairs[index][1], _Text(": "), pairs[index][0]))
                if index:
                    todo.append(_Text(", "))
        else:
            text = _describe_scalar(item, limit)
        pieces.append(text)
        length += len(text)
    text = "".join(pieces)
    return text if length <= limit and not todo else text[:limit] + "..."


def _describe_scalar(value, limit: int) -> str:
    if isinstance(value, (str, bytes)):
        return repr(value[:limit + 1])
    if isinstance(value, int) and value.bit_length() > 64:
        return f"<an int of {value.bit_length()} bits>"  # repr would be slow (or refused)
    if value is None or isinstance(value, (int, float, Refused)):
        return repr(value)[:limit + 1]
    return f"<{type(value).__name__}>"


def key_problem(key):
    """Why `key` may not be a dict key here, or None. Allowed: keys whose hashes a file cannot
    make collide: str and bytes (randomised hashes), ints up to 2**60 (hashed as themselves),
    None, and tuples of those of at most MAX_KEY_NODES nodes (a tuple's hash walks every node,
    shared ones included, each time the key is used) where a tuple that holds an int starts
    with a str or bytes. Huge ints and floats are refused: multiples of 2**61 - 1 all hash
    alike, which turns n insertions into n**2 work; so are tuples of ints, whose hashes can be
    solved for."""
    return _key_walk(key, {}, 0)[1]


def _key_walk(key, sizes: dict, depth: int):
    """(tree size, problem or None) of a dict key. `sizes` holds the tuples already walked, by
    identity: a tuple shared inside the key is judged once, and the walk stops as soon as the
    tree passes MAX_KEY_NODES, so it takes MAX_KEY_NODES**2 steps at worst."""
    if not isinstance(key, tuple):
        return 1, _scalar_key_problem(key)
    known = sizes.get(id(key))
    if known is not None:
        return known, None
    too_big = f"a dict key tuple of more than {MAX_KEY_NODES} nodes"
    if depth >= MAX_KEY_NODES or len(key) >= MAX_KEY_NODES:
        return MAX_KEY_NODES + 1, too_big
    if key and not isinstance(key[0], (str, bytes)) and any(isinstance(item, int)
                                                            for item in key):
        # Python's tuple hash mixes its items' hashes with public constants, and an int's
        # hash is the int: a file can solve for tuples of ints whose hashes are all equal (one
        # in eight tries), n of which make n**2 work. A str or bytes first (a random hash)
        # leaves nothing to solve for.
        return 1, ("a dict key tuple that holds an int and does not start with a str or "
                   "bytes (its hash could be made to collide)")
    total = 1
    for item in key:
        size, problem = _key_walk(item, sizes, depth + 1)
        if problem:
            return total, problem
        total += size
        if total > MAX_KEY_NODES:
            return total, too_big
    sizes[id(key)] = total
    return total, None


def _scalar_key_problem(key):
    if isinstance(key, int) and not -MAX_INT_KEY <= key <= MAX_INT_KEY:
        return f"a dict key int of {key.bit_length()} bits"
    if not isinstance(key, (str, bytes, int, type(None))):
        return f"a dict key of type {type(key).__name__}"
    return None


__all__ = ["MAX_DESCRIBED_CHARS", "MAX_KEY_NODES", "Refused", "describe", "key_problem",
           "leaf_size"]
