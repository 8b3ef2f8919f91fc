"""How much one chat-template render may build, and the arithmetic that sizes a result first.

A chat template comes with the model (GGUF metadata, tokenizer_config.json): untrusted input. A
step budget bounds what it does in Python (every loop iteration, ours included, is trace
events: template_sandbox.py), but one C-level call can ask for gigabytes in a single step:
`'a'|center(300000000)`, `'%0300000000d' % 1`, `s|replace('x', s)` (60,000 characters make
3.6 G), `[s] * 60000|join`, `str()` of a list holding one long string many times. So before
such an operation runs, the sandbox computes an upper bound of its result's size from its
arguments (here, without building anything) and refuses it past the limits below with
`TemplateBudgetError`; after any operation it adds the actual size to the render's total.

Sizes are counted in characters for text and items for lists, tuples and dicts.
"""

from __future__ import annotations

import contextlib
import contextvars
import itertools
import re
import sys

from ..core.errors import CandleError

# The limits, sized for the page: its Python runs in Pyodide 0.27.7's wasm32 heap, which grows
# to at most 4 GiB (the memory's declared maximum) and also holds the model (Qwen2.5-Coder's
# GGUF alone is 491 MB, plus the KV cache and numpy's buffers); natively the API server renders
# prompts beside its loaded models. A render may build:
# - one value (a string, a list/dict, an output) of at most 4 M characters or items: <= 16 MiB
#   as a UCS-4 string, 32 MiB as a list's references; also the length of the rendered prompt.
#   A long conversation is ~128 K characters (32 K tokens).
MAX_RENDERED_CHARS = 4_000_000
# - at most 32 M characters or items alive at once (everything it built that something still
#   holds): <= 128 MiB even if all of it were UCS-4 text. What is dropped stops counting:
#   templates build their prompt as `ns.out = ns.out ~ message`, each copy longer than the last;
MAX_LIVE_CHARS = 32_000_000
# - at most 512 M characters or items built in all (copies included, freed or not): the time a
#   render may spend copying, ~0.5-2 GB of memory traffic.
MAX_BUILT_CHARS = 512_000_000
# Results shorter than this are counted as built but not tracked while alive: a template keeps
# one per few dozen steps at most, so the step budget bounds them (2M steps / ~15 per kept
# value * 256 = ~34 M characters).
_TRACKED_SIZE = 256
# - at most 1 M items split out of one string (`list`, `split`, `splitlines`): each item is a
#   new string object (~50-80 bytes), so <= 80 MiB.
MAX_SPLIT_ITEMS = 1_000_000
# - integers of at most 64 Ki bits (8 KiB) from `*` and `**`; and no exponent past 256.
MAX_INT_BITS = 65_536
MAX_POWER_EXPONENT = 256

# What a value of a type we do not walk (a function, a loop, an undefined) prints as, at most.
_OPAQUE_TEXT = 1000
# Characters Python's line splitting (str.splitlines) breaks at.
_LINE_BREAKS = "\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029"
_DIGITS = re.compile(r"\d+")
# One printf-style conversion: %(key)flags width .precision length type.
_PRINTF = re.compile(r"%(?:\(([^)]*)\))?[-#0 +]*(\*|\d+)?(?:\.(\*|\d*))?[hlL]?(.?)", re.S)


class TemplateBudgetError(CandleError):
    """A chat template asked for more than a render may build (or ran out of memory)."""


class RenderBudget:
    """What one render has built (MAX_BUILT_CHARS) and what of it is still alive
    (MAX_LIVE_CHARS)."""

    def __init__(self, live: int = MAX_LIVE_CHARS, built: int = MAX_BUILT_CHARS):
        self.live_limit = live
        self.built_limit = built
        self.built = 0
        self.live = 0
        self._kept = []  # (value, size) of each tracked result, until nothing else holds it

    def check(self, what: str, size: int, limit: int = MAX_RENDERED_CHARS,
              unit: str = "characters or items") -> None:
        """Refuse an operation whose result (`size`, an upper bound) would pass a limit."""
        if size > limit:
            raise TemplateBudgetError(
                f"chat template: {what} would be too long ({size} {unit} or more; one value "
                f"may have {limit})")
        if self.built + size > self.built_limit:
            raise TemplateBudgetError(
                f"chat template: {what} would take the render past {self.built_limit} "
                f"characters or items built in all (too long; {self.built} built so far)")
        if size >= _TRACKED_SIZE and self.live + size > self.live_limit:
            self._forget_dropped()
            if self.live + size > self.live_limit:
                raise TemplateBudgetError(
                    f"chat template: {what} would take the render past {self.live_limit} "
                    f"characters or items kept at once (too long; {self.live} kept)")

    def copy(self, what: str, size: int) -> None:
        """Count `size` characters or items copied and dropped at once (sum()'s running
        totals) in what the render built."""
        if self.built + size > self.built_limit:
            raise TemplateBudgetError(
                f"chat template: {what} would copy more than {self.built_limit - self.built} "
                f"characters or items (too long; {self.built_limit} may be built in all)")
        self.built += size

    def add(self, what: str, result) -> None:
        """Count a result that was built (checked, if no bound was computed before)."""
        size = sized(result)
        if size:
            self.check(what, size)
            self.built += size
            if size >= _TRACKED_SIZE:
                self.live += size
                self._kept.append((result, size))

    def _forget_dropped(self) -> None:
        """Stop counting the results nothing but this budget holds any more (by reference
        count: CPython's, and Pyodide's, which is CPython). Newest first, so that a dropped
        list lets go of its items before they are looked at."""
        entries, self._kept, self.live = self._kept, [], 0
        while entries:
            value, size = entries.pop()
            if sys.getrefcount(value) > 2:  # more than `value` here and getrefcount's own
                self._kept.append((value, size))
                self.live += size
        self._kept.reverse()


_ACTIVE = contextvars.ContextVar("chat_template_budget", default=None)


def current_budget() -> RenderBudget:
    """The budget of the render under way; outside one (Jinja folding constants while it
    compiles a template) a fresh one, so a single value is still bounded."""
    budget = _ACTIVE.get()
    return budget if budget is not None else RenderBudget()


@contextlib.contextmanager
def render_budget():
    token = _ACTIVE.set(RenderBudget())
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def sized(value) -> int:
    """Characters or items of a built value (0 for what has no length we count)."""
    if isinstance(value, (str, bytes, list, tuple, dict, set, frozenset)):
        return len(value)
    return 0


def _count(digits: str) -> int:
    # A width of 13 digits is already past every limit: no need to parse 5,000 of them.
    return int(digits) if len(digits) <= 12 else 10 ** 12


def _int_text(value: int) -> int:
    """Digits of an int in any base the formats use (octal takes the most), sign, prefix."""
    return value.bit_length() // 3 + 4


def quoted_size(text: str, json: bool = False, ensure_ascii: bool = False) -> int:
    """An upper bound of len(repr(text)) (or of its JSON string): a printable string gains its
    quotes and escaped quotes/backslashes; an escape takes at most 10 characters (12 for a
    JSON surrogate pair)."""
    if json and ensure_ascii and not text.isascii():
        return 12 * len(text) + 2
    if text.isprintable():
        return (len(text) + text.count('"') + text.count("\\") + 2
                + (0 if json else text.count("'")))
    return (6 if json else 10) * len(text) + 2


def text_size(value, limit: int = MAX_RENDERED_CHARS, quoted: bool = False,
              json: bool = False, indent: int = None, separators=None,
              ensure_ascii: bool = False) -> int:
    """An upper bound of len(str(value)) (`quoted`: of repr(value); `json`: of json.dumps with
    an `indent` this wide, `separators` and `ensure_ascii`), computed by walking the value
    without building its text (nor a list of its items: a stack of iterators, one per level).
    Stops once past `limit`: a list holding one long string many times (or nested lists of
    lists) is refused after `limit` characters' worth of walking."""
    if isinstance(value, str) and not (quoted or json):
        return len(value)
    item_sep, key_sep = separators or ((", " if indent is None else ","), ": ")
    total = 0
    levels = [iter((value,))]  # below the top, every string is quoted (repr or JSON)
    while levels and total <= limit:
        item = next(levels[-1], _END)
        if item is _END:
            levels.pop()
        elif isinstance(item, str):
            total += quoted_size(item, json, ensure_ascii)
            if not json and type(item) is not str:
                total += 8  # Markup('...')
        elif isinstance(item, bool) or item is None:
            total += 5
        elif isinstance(item, int):
            total += _int_text(item)
        elif isinstance(item, float):
            total += 24
        else:
            walked = _children(item)
            if walked is None:
                total += _OPAQUE_TEXT
                continue
            count, children, pairs = walked
            depth = len(levels)
            line = 0 if indent is None else 1 + indent * depth
            total += 2 + 14 + count * (len(item_sep) + line) + line  # brackets, a type's name
            if pairs:
                total += count * len(key_sep)
            levels.append(children)
    return total


_END = object()


def _children(value):
    """(how many, an iterator over the values its text is made of (a dict's keys and values in
    turn), whether they are pairs), or None for what we do not walk (its text is bounded by
    _OPAQUE_TEXT)."""
    if isinstance(value, (list, tuple, set, frozenset, type({}.keys()), type({}.values()))):
        return len(value), iter(value), False
    if isinstance(value, (dict, type({}.items()))):
        pairs = value.items() if isinstance(value, dict) else value
        return len(value), itertools.chain.from_iterable(pairs), True
    try:  # a jinja2 Namespace: its text is that of the dict it keeps
        attributes = object.__getattribute__(value, "_Namespace__attrs")
    except AttributeError:
        return None
    return _children(attributes)


def printf_size(template: str, arguments) -> int:
    """An upper bound of len(template % arguments): the template, each conversion's width and
    precision (`*` takes them from the arguments), and each value's text."""
    total = len(template)
    mapping = arguments if isinstance(arguments, dict) else None
    positional = iter(arguments if isinstance(arguments, tuple) else (arguments,))
    for key, width, precision, kind in _PRINTF.findall(template):
        if kind == "%" or not kind:
            continue
        for field in (width, precision):
            if field == "*":
                star = next(positional, 0)
                total += abs(star) if isinstance(star, int) else 0
            elif field:
                total += _count(field)
        if key and mapping is not None:
            value = mapping.get(key)
        else:
            value = next(positional, None)
        if kind in "sra":
            total += text_size(value, quoted=kind != "s")
        elif isinstance(value, int):
            total += _int_text(value)
        else:
            total += 330  # a float in %f: up to 309 digits, then the precision counted above
    if hasattr(template, "__html__"):  # Markup % args escapes them: up to 5 characters each
        total *= 6
    return total


def format_field_size(value, spec: str) -> int:
    """An upper bound of len(format(value, spec)): the value's text (a float's in 'f' or '%'
    up to 311 digits, with grouping 104 separators more; a grouped int's half as long again)
    plus the digits in the spec (the width and the precision, a digit used as fill counted as
    well)."""
    if isinstance(value, float):
        base = 480
    elif isinstance(value, int) and not isinstance(value, bool):
        base = 2 * _int_text(value)
    else:
        base = text_size(value)
    return base + sum(_count(digits) for digits in _DIGITS.findall(spec))


def escaped_size(text: str) -> int:
    """len(markupsafe.escape(text)): & < > " ' become 5, 4, 4, 5, 5 characters."""
    return (len(text) + 4 * (text.count("&") + text.count('"') + text.count("'"))
            + 3 * (text.count("<") + text.count(">")))


def line_count(text: str) -> int:
    """An upper bound of len(text.splitlines()) + 1."""
    return sum(text.count(mark) for mark in _LINE_BREAKS) + 2


def replace_size(text: str, old: str, new: str, count: int = -1) -> int:
    """len(text.replace(old, new, count)), exactly (`''` occurs len(text) + 1 times)."""
    found = text.count(old)
    if count is not None and count >= 0:
        found = min(found, count)
    return len(text) + found * (len(new) - len(old))


def join_size(separator: str, items: list, quoted: bool = False) -> int:
    """An upper bound of len(separator.join(str(item) for item in items))."""
    total = len(separator) * max(len(items) - 1, 0)
    for item in items:
        total += text_size(item, quoted=quoted)
        if total > MAX_RENDERED_CHARS:
            break
    return total


def _split_items(text: str, sep=None, maxsplit: int = -1) -> int:
    found = text.count(sep) + 1 if sep else len(text) // 2 + 1
    return found if maxsplit is None or maxsplit < 0 else min(found, maxsplit + 1)


def _translate_size(text: str, table) -> int:
    longest = 1
    if isinstance(table, dict):
        longest = max((len(item) for item in table.values() if isinstance(item, str)),
                      default=1)
    return len(text) * max(longest, 1)


def binop_size(operator: str, left, right):
    """(an upper bound of the size of `left operator right`, the limit, its unit) for the
    operators that can build more than their operands in one step, else None."""
    sequences = (str, list, tuple)
    if operator == "*":
        for sequence, count in ((left, right), (right, left)):
            if isinstance(sequence, sequences) and isinstance(count, int):
                return len(sequence) * max(count, 0), MAX_RENDERED_CHARS, "characters or items"
        if isinstance(left, int) and isinstance(right, int):
            return left.bit_length() + right.bit_length(), MAX_INT_BITS, "bits"
    elif operator == "**":
        if isinstance(left, int) and isinstance(right, int) and right > 0:
            return left.bit_length() * right, MAX_INT_BITS, "bits"
    elif operator == "+":
        if isinstance(left, sequences) and isinstance(right, sequences):
            return len(left) + len(right), MAX_RENDERED_CHARS, "characters or items"
    elif operator == "%" and isinstance(left, str):
        return printf_size(left, right), MAX_RENDERED_CHARS, "characters or items"
    return None


# str methods a template may call that build more than their input in one C call: a function
# of (the string, the call's arguments) giving an upper bound of the result's size, and the
# limit that applies. (`format`/`format_map` go through the sandbox's sized formatter; `join`'s
# iterable is made a list first.)
STR_METHOD_SIZES = {
    "center": (lambda text, width, fillchar=" ": max(len(text), width), MAX_RENDERED_CHARS),
    "ljust": (lambda text, width, fillchar=" ": max(len(text), width), MAX_RENDERED_CHARS),
    "rjust": (lambda text, width, fillchar=" ": max(len(text), width), MAX_RENDERED_CHARS),
    "zfill": (lambda text, width: max(len(text), width), MAX_RENDERED_CHARS),
    "expandtabs": (lambda text, tabsize=8: len(text) + text.count("\t") * max(tabsize, 0),
                   MAX_RENDERED_CHARS),
    "replace": (replace_size, MAX_RENDERED_CHARS),
    "join": (lambda text, items: len(text) * max(len(items) - 1, 0)
             + sum(len(item) for item in items if isinstance(item, str)), MAX_RENDERED_CHARS),
    "translate": (_translate_size, MAX_RENDERED_CHARS),
    "split": (_split_items, MAX_SPLIT_ITEMS),
    "rsplit": (_split_items, MAX_SPLIT_ITEMS),
    "splitlines": (lambda text, keepends=False: line_count(text), MAX_SPLIT_ITEMS),
}
