"""Exact Unicode character classes for Python's `re`, which lacks `\\p{L}`, `\\p{N}`...

HF `tokenizers` runs its patterns with Oniguruma (and a few with Rust's `regex`), where `\\p{L}`,
`\\s` and `\\w` are Unicode properties. Python's `re` knows none of `\\p{..}` and its `\\s`/`\\w`
differ (`str.isspace` includes U+001C..U+001F; `\\w` misses combining marks). So we build explicit
character classes from Unicode general categories and translate patterns.

The categories are those HF's regex engine uses, not `unicodedata`'s: Oniguruma carries its own
Unicode tables (16.0 in tokenizers 0.23), so its classes do not follow the Python version (3.11
has Unicode 14, Pyodide's 3.12 Unicode 15). One table, probed from HF by
`_category_table_generator.py` and shipped as `_category_table.py`, is used on every Python;
decoding it costs a few milliseconds, against ~0.4 s for scanning `unicodedata`. Only the regex
classes use it: `is_numeric`, `is_punctuation` and the normalizers stay on `unicodedata`, as the
Rust code they mirror uses Rust's own tables, not Oniguruma's.
"""

from __future__ import annotations

import bisect
import functools
import re
import unicodedata

from ..core.errors import UnsupportedError

MAX_CODE_POINT = 0x10FFFF

# Unicode White_Space property (stable since Unicode 6.3): Rust's `char::is_whitespace`, the
# `\s` of Oniguruma and of Rust `regex`.
WHITE_SPACE_RANGES = (
    (0x09, 0x0D), (0x20, 0x20), (0x85, 0x85), (0xA0, 0xA0), (0x1680, 0x1680),
    (0x2000, 0x200A), (0x2028, 0x2029), (0x202F, 0x202F), (0x205F, 0x205F), (0x3000, 0x3000),
)
WHITE_SPACE = frozenset(chr(cp) for start, stop in WHITE_SPACE_RANGES
                        for cp in range(start, stop + 1))

# Characters with the Alphabetic property that are neither letters, letter numbers nor marks:
# the circled and squared Latin letters (category So, Other_Alphabetic). `\w` includes them.
OTHER_ALPHABETIC_SYMBOL_RANGES = ((0x24B6, 0x24E9), (0x1F130, 0x1F149), (0x1F150, 0x1F169),
                                  (0x1F170, 0x1F189))
JOIN_CONTROL_RANGES = ((0x200C, 0x200D),)
# Oniguruma's `\w` takes Latin-1 characters from its ISO-8859-1 ctype table, which also marks
# the superscript digits and vulgar fractions (category No) as word characters; and it has no
# Join_Control. Checked against HF on every code point (tests/tokenizers).
ONIG_LATIN1_WORD_NUMBER_RANGES = ((0xB2, 0xB3), (0xB9, 0xB9), (0xBC, 0xBE))

CATEGORY_GROUPS = {
    "L": ("Lu", "Ll", "Lt", "Lm", "Lo"), "M": ("Mn", "Mc", "Me"), "N": ("Nd", "Nl", "No"),
    "P": ("Pc", "Pd", "Ps", "Pe", "Pi", "Pf", "Po"), "S": ("Sm", "Sc", "Sk", "So"),
    "Z": ("Zs", "Zl", "Zp"), "C": ("Cc", "Cf", "Cs", "Co", "Cn"),
}
LONG_CATEGORY_NAMES = {
    "Letter": "L", "Mark": "M", "Number": "N", "Punctuation": "P", "Symbol": "S",
    "Separator": "Z", "Other": "C", "Uppercase_Letter": "Lu", "Lowercase_Letter": "Ll",
    "Titlecase_Letter": "Lt", "Modifier_Letter": "Lm", "Other_Letter": "Lo",
    "Nonspacing_Mark": "Mn", "Spacing_Mark": "Mc", "Enclosing_Mark": "Me",
    "Decimal_Number": "Nd", "Letter_Number": "Nl", "Other_Number": "No",
    "Connector_Punctuation": "Pc", "Dash_Punctuation": "Pd", "Open_Punctuation": "Ps",
    "Close_Punctuation": "Pe", "Initial_Punctuation": "Pi", "Final_Punctuation": "Pf",
    "Other_Punctuation": "Po", "Math_Symbol": "Sm", "Currency_Symbol": "Sc",
    "Modifier_Symbol": "Sk", "Other_Symbol": "So", "Space_Separator": "Zs",
    "Line_Separator": "Zl", "Paragraph_Separator": "Zp", "Control": "Cc", "Format": "Cf",
    "Surrogate": "Cs", "Private_Use": "Co", "Unassigned": "Cn",
}


@functools.lru_cache(maxsize=1)
def category_runs() -> tuple[tuple[int, ...], tuple[str, ...]]:
    """Run starts and their categories, from the shipped table (the same on every Python)."""
    from . import _category_table
    runs = _category_table.decode_runs()
    starts = tuple(start for start, _ in runs)
    categories = tuple(category for _, category in runs)
    return starts, categories


def category_of(code_point: int) -> str:
    starts, categories = category_runs()
    return categories[bisect.bisect_right(starts, code_point) - 1]


@functools.lru_cache(maxsize=None)
def category_ranges(categories: frozenset) -> tuple[tuple[int, int], ...]:
    """Merged inclusive code point ranges whose general category is in `categories`."""
    starts, run_categories = category_runs()
    ranges: list[tuple[int, int]] = []
    for index, category in enumerate(run_categories):
        if category not in categories:
            continue
        first = starts[index]
        last = starts[index + 1] - 1 if index + 1 < len(starts) else MAX_CODE_POINT
        if ranges and ranges[-1][1] + 1 == first:
            ranges[-1] = (ranges[-1][0], last)
        else:
            ranges.append((first, last))
    return tuple(ranges)


def merge_ranges(ranges) -> tuple[tuple[int, int], ...]:
    merged: list[tuple[int, int]] = []
    for first, last in sorted(ranges):
        if merged and first <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(last, merged[-1][1]))
        else:
            merged.append((first, last))
    return tuple(merged)


def complement_ranges(ranges) -> tuple[tuple[int, int], ...]:
    result = []
    next_free = 0
    for first, last in merge_ranges(ranges):
        if first > next_free:
            result.append((next_free, first - 1))
        next_free = last + 1
    if next_free <= MAX_CODE_POINT:
        result.append((next_free, MAX_CODE_POINT))
    return tuple(result)


def expand_category_name(name: str) -> frozenset:
    """'L' -> {Lu, Ll, ...}; 'Lu' -> {Lu}; long names like 'Letter' too."""
    short = LONG_CATEGORY_NAMES.get(name, name)
    if short in CATEGORY_GROUPS:
        return frozenset(CATEGORY_GROUPS[short])
    if len(short) == 2 and short[0] in CATEGORY_GROUPS and short in CATEGORY_GROUPS[short[0]]:
        return frozenset((short,))
    if short == "L&" or short == "LC":
        return frozenset(("Lu", "Ll", "Lt"))
    raise UnsupportedError(f"regex translation: unknown Unicode property \\p{{{name}}}")


@functools.lru_cache(maxsize=None)
def property_ranges(name: str) -> tuple[tuple[int, int], ...]:
    """Ranges of a named class: general categories, or 'space', 'word' (Rust regex crate's
    \\w, for added tokens), 'onig_word' (Oniguruma's \\w, for patterns), 'digit', 'hex'."""
    if name == "space":
        return WHITE_SPACE_RANGES
    if name in ("word", "onig_word"):
        # Unicode \w (UTS #18, Rust's regex crate): Alphabetic | Mark | Decimal_Number |
        # Connector_Punctuation | Join_Control. Alphabetic = letters + letter numbers +
        # Other_Alphabetic, whose only members outside marks are the circled/squared letters.
        parts = category_ranges(frozenset(CATEGORY_GROUPS["L"] + CATEGORY_GROUPS["M"]
                                          + ("Nd", "Pc", "Nl")))
        if name == "onig_word":
            return merge_ranges(parts + OTHER_ALPHABETIC_SYMBOL_RANGES
                                + ONIG_LATIN1_WORD_NUMBER_RANGES)
        return merge_ranges(parts + OTHER_ALPHABETIC_SYMBOL_RANGES + JOIN_CONTROL_RANGES)
    if name == "digit":
        return category_ranges(frozenset(("Nd",)))
    if name == "hex":
        return ((0x30, 0x39), (0x41, 0x46), (0x61, 0x66))
    return category_ranges(expand_category_name(name))


def _escape_code_point(code_point: int) -> str:
    if code_point <= 0xFFFF:
        return f"\\u{code_point:04x}"
    return f"\\U{code_point:08x}"


def ranges_to_class_body(ranges) -> str:
    """The inside of a `[...]` class matching exactly `ranges` (no brackets)."""
    pieces = []
    for first, last in ranges:
        if first == last:
            pieces.append(_escape_code_point(first))
        else:
            pieces.append(_escape_code_point(first) + "-" + _escape_code_point(last))
    return "".join(pieces)


def class_body(name: str, negated: bool = False) -> str:
    ranges = property_ranges(name)
    if negated:
        ranges = complement_ranges(ranges)
    return ranges_to_class_body(ranges)


# Escapes with a class meaning in Oniguruma: letter -> (property name, negated).
CLASS_ESCAPES = {
    "s": ("space", False), "S": ("space", True),
    "w": ("onig_word", False), "W": ("onig_word", True),
    "d": ("digit", False), "D": ("digit", True), "h": ("hex", False), "H": ("hex", True),
}


def _read_property_name(pattern: str, index: int) -> tuple[str, bool, int]:
    """Parse the `{Name}` or `{^Name}` after `\\p`; returns (name, negated, next index)."""
    if index >= len(pattern) or pattern[index] != "{":
        # One-letter form: \pL
        if index < len(pattern):
            return pattern[index], False, index + 1
        raise UnsupportedError("regex translation: dangling \\p at the end of the pattern")
    closing = pattern.find("}", index)
    if closing < 0:
        raise UnsupportedError(f"regex translation: unclosed \\p{{ in {pattern!r}")
    name = pattern[index + 1:closing]
    negated = name.startswith("^")
    return name.lstrip("^"), negated, closing + 1


@functools.lru_cache(maxsize=64)
def translate_pattern(pattern: str) -> str:
    """Translate an Oniguruma/Rust regex into an equivalent Python `re` pattern.

    Only the class escapes differ in meaning between the engines for the patterns found in
    tokenizer files: `\\p{..}`, `\\P{..}`, `\\s`, `\\w`, `\\d`, `\\h` (and negations), `\\z`.
    They are replaced by explicit code point classes, inside or outside brackets."""
    out = []
    index = 0
    in_class = False
    class_start = -1
    while index < len(pattern):
        char = pattern[index]
        if char == "\\" and index + 1 < len(pattern):
            escape = pattern[index + 1]
            if escape in "pP":
                name, negated, index = _read_property_name(pattern, index + 2)
                negated = negated != (escape == "P")
                body = class_body(name, negated)
                out.append(body if in_class else "[" + body + "]")
                continue
            if escape in CLASS_ESCAPES:
                name, negated = CLASS_ESCAPES[escape]
                body = class_body(name, negated)
                out.append(body if in_class else "[" + body + "]")
                index += 2
                continue
            if escape == "z" and not in_class:
                out.append("\\Z")
                index += 2
                continue
            if escape == "x" and index + 2 < len(pattern) and pattern[index + 2] == "{":
                code_point, index = _read_braced_code_point(pattern, index)
                out.append(_escape_code_point(code_point))
                continue
            out.append(pattern[index:index + 2])
            index += 2
            continue
        if in_class:
            if char == "]" and index > class_start:
                in_class = False
            elif char == "[":
                # Python would warn about possible nested sets: a literal '[' in a class.
                out.append("\\[")
                index += 1
                continue
        elif char == "[":
            in_class = True
            out.append(char)
            index += 1
            # A ']' right after '[' or '[^' is a literal in both engines.
            if index < len(pattern) and pattern[index] == "^":
                out.append("^")
                index += 1
            class_start = index + 1 if index < len(pattern) and pattern[index] == "]" else index
            continue
        out.append(char)
        index += 1
    return "".join(out)


# At most this many hex digits in `\x{...}` (U+10FFFF has six; Oniguruma allows leading 0s).
MAX_BRACED_HEX_DIGITS = 8


def _read_braced_code_point(pattern: str, index: int) -> tuple[int, int]:
    """`\\x{HHHH}` at `index` -> (code point, index after the closing brace)."""
    closing = pattern.find("}", index)
    digits = pattern[index + 3:closing] if closing >= 0 else ""
    valid = (0 < len(digits) <= MAX_BRACED_HEX_DIGITS
             and all(char in "0123456789abcdefABCDEF" for char in digits))
    if not valid or int(digits, 16) > MAX_CODE_POINT:
        raise UnsupportedError(f"regex translation: bad escape {pattern[index:index + 12]!r} "
                               f"(expected \\x{{hex code point <= 10FFFF}})")
    return int(digits, 16), closing + 1


@functools.lru_cache(maxsize=64)
def compile_pattern(pattern: str, where: str = "regex") -> "re.Pattern[str]":
    """Translate and compile `pattern`; `where` (the field it came from) names it in errors.
    Patterns that can backtrack catastrophically are refused first (regex_safety)."""
    from .regex_safety import check_pattern
    try:
        translated = translate_pattern(pattern)
    except UnsupportedError as exc:
        raise UnsupportedError(f"{where}: {exc}") from None
    check_pattern(translated, pattern, where)
    try:
        return re.compile(translated)
    except (re.error, RecursionError, OverflowError, ValueError) as exc:
        raise UnsupportedError(f"{where}: regex {pattern[:200]!r} cannot be run by Python's "
                               f"re: {exc}") from None


# Per-character predicates mirroring the Rust helpers used by HF tokenizers.

def is_whitespace(char: str) -> bool:
    """Rust `char::is_whitespace` (White_Space property)."""
    return char in WHITE_SPACE


def is_punctuation(char: str) -> bool:
    """Punctuation as BERT sees it: ASCII punctuation (includes $+<=>^`|~) or category P*."""
    if char.isascii():
        return char in ASCII_PUNCTUATION
    return (unicodedata.category(char)[0] == "P") != (char in legacy_flip_set("PUNCTUATION_FLIP"))


ASCII_PUNCTUATION = frozenset("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")


def is_numeric(char: str) -> bool:
    """Rust `char::is_numeric`: general categories Nd, Nl, No."""
    return unicodedata.category(char)[0] == "N"


@functools.lru_cache(maxsize=None)
def legacy_flip_set(name: str) -> frozenset:
    """Characters on which HF's older Unicode tables disagree with `unicodedata` (see
    `_legacy_unicode.py`); only meaningful for the Unicode version that file was made from."""
    from . import _legacy_unicode
    ranges = getattr(_legacy_unicode, name)
    return frozenset(chr(code_point) for first, last in ranges
                     for code_point in range(first, last + 1))
