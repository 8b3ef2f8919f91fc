"""Extended grapheme clusters (Unicode UAX #29), as the Rust crate `unicode-segmentation` cuts them.

HF's `Precompiled` normalizer works grapheme by grapheme (`str::graphemes(true)`), so the
cluster boundaries decide its output. The property data is shipped in `_grapheme_table.py`,
generated from the crate's own tables (the version HF `tokenizers` links; see that file), so
the boundaries do not depend on the Unicode version of the running Python.

Rules (UAX #29, Unicode 15.1+): GB3 CR x LF; GB4/GB5 break around controls; GB6-GB8 Hangul
syllable sequences; GB9 x (Extend | ZWJ); GB9a x SpacingMark; GB9b Prepend x; GB9c Indic
conjuncts (Consonant [Extend Linker]* Linker [Extend Linker]* x Consonant); GB11 emoji ZWJ
sequences (ExtPict Extend* ZWJ x ExtPict); GB12/GB13 regional indicator pairs; else break.
"""

from __future__ import annotations

import bisect
import functools

# Grapheme categories: one per code point, as in the crate (ExtPict and InCB=Consonant are
# categories of their own there: no code point with either has another break property).
OTHER = "Any"
CR = "CR"
LF = "LF"
CONTROL = "Control"
EXTEND = "Extend"
ZWJ = "ZWJ"
PREPEND = "Prepend"
SPACING_MARK = "SpacingMark"
REGIONAL_INDICATOR = "RI"
HANGUL_L = "L"
HANGUL_V = "V"
HANGUL_T = "T"
HANGUL_LV = "LV"
HANGUL_LVT = "LVT"
EXTENDED_PICTOGRAPHIC = "ExtPict"
INCB_CONSONANT = "InCBConsonant"

# Precomposed Hangul syllables: LV when the trailing-consonant index is 0, else LVT.
HANGUL_SYLLABLE_FIRST = 0xAC00
HANGUL_SYLLABLE_LAST = 0xD7A3
HANGUL_TRAILING_COUNT = 28

CONTROLS = frozenset((CR, LF, CONTROL))


@functools.lru_cache(maxsize=1)
def _tables():
    from . import _grapheme_table
    starts, lasts, categories = [], [], []
    for first, last, category in _grapheme_table.decode_ranges():
        starts.append(first)
        lasts.append(last)
        categories.append(category)
    incb_extend = _grapheme_table.decode_set(_grapheme_table.INCB_EXTEND)
    incb_linker = _grapheme_table.decode_set(_grapheme_table.INCB_LINKER)
    return starts, lasts, categories, incb_extend, incb_linker


@functools.lru_cache(maxsize=4096)
def grapheme_category(char: str) -> str:
    code_point = ord(char)
    if HANGUL_SYLLABLE_FIRST <= code_point <= HANGUL_SYLLABLE_LAST:
        trailing = (code_point - HANGUL_SYLLABLE_FIRST) % HANGUL_TRAILING_COUNT
        return HANGUL_LV if trailing == 0 else HANGUL_LVT
    starts, lasts, categories, _, _ = _tables()
    index = bisect.bisect_right(starts, code_point) - 1
    if index >= 0 and code_point <= lasts[index]:
        return categories[index]
    return OTHER


def _hangul_joins(before: str, after: str) -> bool:
    if before == HANGUL_L:
        return after in (HANGUL_L, HANGUL_V, HANGUL_LV, HANGUL_LVT)        # GB6
    if before in (HANGUL_LV, HANGUL_V):
        return after in (HANGUL_V, HANGUL_T)                               # GB7
    if before in (HANGUL_LVT, HANGUL_T):
        return after == HANGUL_T                                           # GB8
    return False


# Fast path: each character is mapped to a one-letter code (str.translate, at C speed), and
# UAX #29's regular expression for clusters runs over the codes, with classes of a few ASCII
# letters. Extend is split by Indic_Conjunct_Break (Linker / Extend / neither) for GB9c.
CODE_OF_CATEGORY = {
    OTHER: "a", CR: "r", LF: "n", CONTROL: "c", PREPEND: "p", SPACING_MARK: "s",
    REGIONAL_INDICATOR: "i", HANGUL_L: "L", HANGUL_V: "V", HANGUL_T: "T", HANGUL_LV: "B",
    HANGUL_LVT: "W", EXTENDED_PICTOGRAPHIC: "x", INCB_CONSONANT: "k",
}
EXTEND_LINKER_CODE = "l"       # Extend, InCB=Linker
EXTEND_INCB_CODE = "e"         # Extend, InCB=Extend
EXTEND_OTHER_CODE = "f"        # Extend, no InCB value
ZWJ_INCB_CODE = "z"            # ZWJ, InCB=Extend
ZWJ_OTHER_CODE = "Z"           # ZWJ, no InCB value

CONTROL_CODES = "rnc"
EXTEND_CODES = "lef"
ZWJ_CODES = "zZ"
# Characters that can join the one before them (or, for Prepend, CR and Hangul L, the one
# after): text whose codes have none of these is made of single-character clusters.
JOINING_CODES = "rp" + EXTEND_CODES + ZWJ_CODES + "siLVT"

# UAX #29:  CR LF | Control | Prepend* core (Extend | ZWJ | SpacingMark)*
#   core = Hangul syllable | RI RI | ExtPict (Extend* ZWJ ExtPict)* | InCB conjunct
#        | any other character but a control
# `re` takes the first alternative that matches, so the longer cores come first.
_HANGUL = "L*(?:V+|BV*|W)T*|L+|T+"
_PICTOGRAPHIC = f"x(?:[{EXTEND_CODES}]*[{ZWJ_CODES}]x)*"
_CONJUNCT = "k(?:[lez]*l[lez]*k)+"
CLUSTER_PATTERN = (f"rn|[{CONTROL_CODES}]|p*(?:{_HANGUL}|ii|{_PICTOGRAPHIC}|{_CONJUNCT}"
                   f"|[^{CONTROL_CODES}])[{EXTEND_CODES}{ZWJ_CODES}s]*")


def _code_of(char: str) -> str:
    category = grapheme_category(char)
    if category == EXTEND:
        _, _, _, incb_extend, incb_linker = _tables()
        if char in incb_linker:
            return EXTEND_LINKER_CODE
        return EXTEND_INCB_CODE if char in incb_extend else EXTEND_OTHER_CODE
    if category == ZWJ:
        return ZWJ_INCB_CODE if char in _tables()[3] else ZWJ_OTHER_CODE
    return CODE_OF_CATEGORY[category]


class _CodeTable(dict):
    """code point -> one-letter grapheme code, for `str.translate`, filled on first sight."""

    def __missing__(self, code_point: int) -> str:
        code = _code_of(chr(code_point))
        self[code_point] = code
        return code


_CODE_TABLE = _CodeTable()


def grapheme_codes(text: str) -> str:
    """One letter per character of `text` naming its grapheme break class (see above)."""
    return text.translate(_CODE_TABLE)


@functools.lru_cache(maxsize=1)
def cluster_regex():
    import re
    return re.compile(CLUSTER_PATTERN)


@functools.lru_cache(maxsize=1)
def joining_regex():
    import re
    return re.compile(f"[{JOINING_CODES}]")


def cluster_spans(text: str):
    """(start, stop) of each extended grapheme cluster of `text` with two characters or more
    (usually none); every character outside them is a cluster of its own."""
    codes = grapheme_codes(text)
    if not joining_regex().search(codes):
        return []
    return [match.span() for match in cluster_regex().finditer(codes)
            if match.end() - match.start() > 1]


def graphemes(text: str) -> list:
    """The extended grapheme clusters of `text`, in order."""
    clusters = []
    position = 0
    for start, stop in cluster_spans(text):
        clusters.extend(text[position:start])
        clusters.append(text[start:stop])
        position = stop
    clusters.extend(text[position:])
    return clusters


def segment_by_rules(text: str) -> list:
    """The clusters of `text`, deciding each boundary rule by rule (GB3..GB999).

    Slow (a Python step per character) but written straight from the rules: the reference
    that `graphemes` (one regular expression) is tested against."""
    if not text:
        return []
    _, _, _, incb_extend, incb_linker = _tables()
    clusters = []
    start = 0
    before = grapheme_category(text[0])
    # Context for the rules that look further back than one character:
    regional_run = 1 if before == REGIONAL_INDICATOR else 0   # GB12/13: RIs just before
    emoji_state = "pict" if before == EXTENDED_PICTOGRAPHIC else None   # GB11
    conjunct_state = "consonant" if before == INCB_CONSONANT else None  # GB9c
    for index in range(1, len(text)):
        char = text[index]
        after = grapheme_category(char)
        if before == CR and after == LF:
            joins = True                                                   # GB3
        elif before in CONTROLS or after in CONTROLS:
            joins = False                                                  # GB4, GB5
        elif _hangul_joins(before, after):
            joins = True
        elif after in (EXTEND, ZWJ, SPACING_MARK) or before == PREPEND:
            joins = True                                                   # GB9, 9a, 9b
        elif after == INCB_CONSONANT and conjunct_state == "linked":
            joins = True                                                   # GB9c
        elif before == ZWJ and after == EXTENDED_PICTOGRAPHIC and emoji_state == "zwj":
            joins = True                                                   # GB11
        elif before == REGIONAL_INDICATOR and after == REGIONAL_INDICATOR:
            joins = regional_run % 2 == 1                                  # GB12, GB13
        else:
            joins = False                                                  # GB999
        if not joins:
            clusters.append(text[start:index])
            start = index

        regional_run = regional_run + 1 if after == REGIONAL_INDICATOR else 0
        if after == EXTENDED_PICTOGRAPHIC:
            emoji_state = "pict"
        elif after == EXTEND and emoji_state == "pict":
            pass
        elif after == ZWJ and emoji_state == "pict":
            emoji_state = "zwj"
        else:
            emoji_state = None
        if after == INCB_CONSONANT:
            conjunct_state = "consonant"
        elif char in incb_linker and conjunct_state is not None:
            conjunct_state = "linked"
        elif char in incb_extend and conjunct_state is not None:
            pass
        else:
            conjunct_state = None
        before = after
    clusters.append(text[start:])
    return clusters


# ---- generator (development time only) ---------------------------------------------------

CRATE_CATEGORY_NAMES = {
    "GC_CR": CR, "GC_LF": LF, "GC_Control": CONTROL, "GC_Extend": EXTEND, "GC_ZWJ": ZWJ,
    "GC_Prepend": PREPEND, "GC_SpacingMark": SPACING_MARK,
    "GC_Regional_Indicator": REGIONAL_INDICATOR, "GC_L": HANGUL_L, "GC_V": HANGUL_V,
    "GC_T": HANGUL_T, "GC_LV": HANGUL_LV, "GC_LVT": HANGUL_LVT,
    "GC_Extended_Pictographic": EXTENDED_PICTOGRAPHIC, "GC_InCB_Consonant": INCB_CONSONANT,
}


def _rust_table_body(source: str, name: str) -> str:
    start = source.index(f"const {name}:")
    start = source.index("= &[", start) + len("= &[")
    return source[start:source.index("];", start)]


def read_crate_tables(tables_rs: str) -> dict:
    """Parse `src/tables.rs` of unicode-segmentation: grapheme categories, InCB sets."""
    import re
    version = re.search(r"UNICODE_VERSION: \(u64, u64, u64\) = \((\d+), (\d+), (\d+)\)",
                        tables_rs).groups()
    char = r"'\\u\{([0-9a-fA-F]+)\}'"
    ranges = []
    for first, last, category in re.findall(rf"\({char},\s*{char},\s*(GC_\w+)\)",
                                            _rust_table_body(tables_rs, "grapheme_cat_table")):
        ranges.append((int(first, 16), int(last, 16), CRATE_CATEGORY_NAMES[category]))
    incb_extend = [(int(first, 16), int(last, 16)) for first, last in
                   re.findall(rf"\({char},\s*{char}\)",
                              _rust_table_body(tables_rs, "InCB_Extend_table"))]
    linker_source = tables_rs[tables_rs.index("fn is_incb_linker"):]
    linker_source = linker_source[:linker_source.index("}\n")]
    linkers = [int(value, 16) for value in re.findall(char, linker_source)]
    return {"version": ".".join(version), "ranges": ranges, "incb_extend": incb_extend,
            "incb_linker": [(value, value) for value in linkers]}


def _hangul_syllable_category(code_point: int) -> str:
    trailing = (code_point - HANGUL_SYLLABLE_FIRST) % HANGUL_TRAILING_COUNT
    return HANGUL_LV if trailing == 0 else HANGUL_LVT


def render_grapheme_table_module(tables: dict, source_name: str) -> str:
    # Hangul syllables are computed, not stored: check the crate agrees, then drop them.
    kept = []
    for first, last, category in tables["ranges"]:
        if category in (HANGUL_LV, HANGUL_LVT):
            assert HANGUL_SYLLABLE_FIRST <= first and last <= HANGUL_SYLLABLE_LAST
            assert all(_hangul_syllable_category(cp) == category
                       for cp in range(first, last + 1))
            continue
        kept.append(f"{first:x}-{last:x}:{category}" if first != last
                    else f"{first:x}:{category}")

    def lines(entries, per_line):
        return "\n".join(" ".join(entries[i:i + per_line])
                         for i in range(0, len(entries), per_line))

    def range_entries(ranges):
        return [f"{first:x}-{last:x}" if first != last else f"{first:x}"
                for first, last in ranges]

    return (
        f'"""Generated by `python -m candle_web.tokenizers.graphemes {source_name}`: do not '
        "edit.\n\n"
        f"Grapheme break data of the Rust crate unicode-segmentation (Unicode "
        f"{tables['version']}), the\n"
        "crate HF `tokenizers` links. RANGES: 'first-last:category' (hexadecimal, inclusive; "
        "one code\npoint written alone); unlisted code points are 'Any'; Hangul syllables "
        "(LV/LVT) are computed.\n"
        'INCB_EXTEND and INCB_LINKER: the Indic_Conjunct_Break Extend and Linker code points."""'
        f"\n\nUNICODE_VERSION = {tables['version']!r}\n\n"
        f'RANGES = """\n{lines(kept, 6)}\n"""\n\n'
        f'INCB_EXTEND = """\n{lines(range_entries(tables["incb_extend"]), 10)}\n"""\n\n'
        f'INCB_LINKER = """\n{lines(range_entries(tables["incb_linker"]), 10)}\n"""\n\n\n'
        "def _bounds(entry):\n"
        "    first, _, last = entry.partition('-')\n"
        "    return int(first, 16), int(last or first, 16)\n\n\n"
        "def decode_ranges():\n"
        "    ranges = []\n"
        "    for entry in RANGES.split():\n"
        "        span, category = entry.split(':')\n"
        "        ranges.append((*_bounds(span), category))\n"
        "    return ranges\n\n\n"
        "def decode_set(text):\n"
        "    members = set()\n"
        "    for entry in text.split():\n"
        "        first, last = _bounds(entry)\n"
        "        members.update(chr(code_point) for code_point in range(first, last + 1))\n"
        "    return frozenset(members)\n"
    )


if __name__ == "__main__":
    import pathlib
    import sys
    if len(sys.argv) != 2:
        sys.exit("usage: python -m candle_web.tokenizers.graphemes "
                 "PATH/TO/unicode-segmentation/src/tables.rs")
    crate_tables = read_crate_tables(pathlib.Path(sys.argv[1]).read_text(encoding="utf-8"))
    target = pathlib.Path(__file__).with_name("_grapheme_table.py")
    target.write_text(render_grapheme_table_module(crate_tables, "unicode-segmentation/"
                                                                 "src/tables.rs"),
                      encoding="utf-8")
    print(f"wrote {target} for Unicode {crate_tables['version']}")
