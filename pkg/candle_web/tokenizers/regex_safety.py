"""Refusing regexes that can backtrack catastrophically, before they ever run.

Python's `re` is a backtracking engine: `(a+)+c` takes exponential time on "aaa...a", and a
running match cannot be bounded (there is no step limit, Pyodide has no signals, and a signal
never reaches a worker thread). HF `tokenizers` stops such a match with Oniguruma's retry limit.
Here the patterns that come from files are analysed once at load, on the tree built by Python's
own regex parser, and refused when

- a repeat of variable count (`x*`, `x+`, `x{1,3}`) sits inside a repeat that iterates
  (max > 1), unless it repeats a single character class and a mandatory character outside
  that class follows it inside the same iteration: `(?:\\d{1,3},)+` is accepted, `(a+)+`,
  `(a?){30}` and `(\\s*\\w+)*` are not;
- an alternation inside an iterating repeat has branches that can begin with the same
  character (`(a|aa)+`, `(\\w|\\d)+` once the classes are explicit);
- groups nest deeper than MAX_REGEX_NESTING (which also bounds the recursion here);
- (polynomial blow-up) two or more unbounded repeats in a row that can match the same
  characters, with nothing between them that must consume a character outside their common
  set, and something after them that can still fail: `a*a*b`, `\\s*\\s*x`, `.*.*=`, `.*=.*=`
  each try every way of sharing a run of n characters among k repeats, O(n^k) steps at each
  start, O(n^(k+1)) over a search (`a*a*b` on 3,000 'a': 31 s; `.*.*.*.*.*=` far longer).
  When nothing after them can fail (`\\s*[\\r\\n]+` at the end of an alternative, as in Llama
  3's pattern) the first split that matches ends the search, and the pattern is accepted.
- (no backtracking at all) a part that can match nothing repeated a required number of times,
  more than MAX_EMPTY_LOOP_WORK iterations at each position, nested counts multiplied:
  `(?:){99999}` runs 99,999 empty iterations at every position (19 s on 3,000 characters).

What passes then costs at most O(n) backtracking steps per start position, O(n^2) over a search
of n characters (`.*=` on 30,000 characters: 2 s in CPython's re; HF's Oniguruma has the same
bound). The rules are conservative (a refused pattern may in fact be harmless); the patterns of
real files (GPT-2, Llama 3, Qwen 2, o200k, DeepSeek, T5...) pass.
"""

from __future__ import annotations

import re

from ..core.errors import UnsupportedError

try:
    from re import _parser as sre_parse  # Python >= 3.11
except ImportError:  # pragma: no cover - older Pythons
    import sre_parse

# Groups, repeats, alternatives and lookarounds nested in each other; real patterns use < 5.
MAX_REGEX_NESTING = 32

REPEATS = tuple(getattr(sre_parse, name) for name in ("MAX_REPEAT", "MIN_REPEAT",
                                                      "POSSESSIVE_REPEAT")
                if hasattr(sre_parse, name))
ATOMIC_GROUP = getattr(sre_parse, "ATOMIC_GROUP", None)
SINGLE_CHARACTER = (sre_parse.LITERAL, sre_parse.NOT_LITERAL, sre_parse.IN, sre_parse.ANY,
                    sre_parse.CATEGORY)
LAST_CODE_POINT = 0x10FFFF
# A character set is a tuple of disjoint sorted (first, last) ranges; UNKNOWN means "any
# character, or a set too costly to work out": it overlaps with every non-empty set.
UNKNOWN = None
EMPTY = ()


class CatastrophicPattern(Exception):
    """Internal: carries the reason up to `check_pattern`, which raises UnsupportedError."""


def parse_pattern(translated: str, pattern: str, where: str):
    """Python's parse tree of `translated`; parse failures become UnsupportedError."""
    try:
        return sre_parse.parse(translated)
    except (re.error, RecursionError, OverflowError, ValueError) as exc:
        raise UnsupportedError(f"{where}: regex {pattern[:200]!r} cannot be run by Python's "
                               f"re: {exc}") from None


def check_pattern(translated: str, pattern: str, where: str) -> None:
    """Raise UnsupportedError naming `where` when the pattern can backtrack exponentially."""
    parsed = parse_pattern(translated, pattern, where)
    _check_nesting(parsed, pattern, where)
    ignorecase = bool(parsed.state.flags & re.IGNORECASE)
    try:
        _walk(parsed, EMPTY, False, ignorecase)
    except CatastrophicPattern as exc:
        raise UnsupportedError(
            f"{where}: regex {pattern[:200]!r} can backtrack catastrophically (exponential "
            f"time on some inputs): {exc}. Refused: no variable repeat inside a repeat unless "
            f"a delimiter follows it, no alternatives that start alike inside a repeat"
        ) from None
    work = _empty_loop_work(parsed)
    if work > MAX_EMPTY_LOOP_WORK:
        raise UnsupportedError(
            f"{where}: regex {pattern[:200]!r} repeats a part that can match nothing a "
            f"required number of times ({work} iterations at every position of the text, "
            f"at most {MAX_EMPTY_LOOP_WORK}): `(?:){{99999}}` took 19 s on 3,000 characters")
    try:
        _sequence_polynomial(_flatten(parsed, ignorecase), False)
    except CatastrophicPattern as exc:
        raise UnsupportedError(
            f"{where}: regex {pattern[:200]!r} can backtrack polynomially (time a power of the "
            f"text length: {exc}). Refused: no two unbounded repeats in a row over the same "
            f"characters when something after them can fail"
        ) from None


# ---- the tree --------------------------------------------------------------------------

def _children(op, av) -> list:
    if op in REPEATS:
        return [av[2]]
    if op is sre_parse.SUBPATTERN:
        return [av[3]]
    if op is sre_parse.BRANCH:
        return list(av[1])
    if op in (sre_parse.ASSERT, sre_parse.ASSERT_NOT):
        return [av[1]]
    if op is ATOMIC_GROUP:
        return [av]
    if op is sre_parse.GROUPREF_EXISTS:
        return [branch for branch in av[1:] if branch is not None]
    return []


def _check_nesting(parsed, pattern: str, where: str) -> None:
    """Iteratively, so that the recursive walk below is bounded by MAX_REGEX_NESTING."""
    stack = [(parsed, 1)]
    while stack:
        subpattern, depth = stack.pop()
        if depth > MAX_REGEX_NESTING:
            raise UnsupportedError(f"{where}: regex {pattern[:200]!r} nests groups and "
                                   f"repeats more than {MAX_REGEX_NESTING} levels deep")
        for op, av in subpattern:
            stack.extend((child, depth + 1) for child in _children(op, av))


# ---- character sets --------------------------------------------------------------------

def _merge(ranges) -> tuple:
    merged = []
    for first, last in sorted(ranges):
        if merged and first <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], last))
        else:
            merged.append((first, last))
    return tuple(merged)


def _union(left, right):
    if left is UNKNOWN or right is UNKNOWN:
        return UNKNOWN
    return _merge(left + right)


def _overlap(left, right) -> bool:
    if left is UNKNOWN or right is UNKNOWN:
        return bool(left != EMPTY and right != EMPTY)
    i = j = 0
    while i < len(left) and j < len(right):
        if left[i][1] < right[j][0]:
            i += 1
        elif right[j][1] < left[i][0]:
            j += 1
        else:
            return True
    return False


def _class_set(items: list):
    """The set of an IN node: literals and ranges, negated or not; categories are UNKNOWN."""
    negated = False
    ranges = []
    for op, av in items:
        if op is sre_parse.NEGATE:
            negated = True
        elif op is sre_parse.LITERAL:
            ranges.append((av, av))
        elif op is sre_parse.RANGE:
            ranges.append(av)
        else:
            return UNKNOWN
    merged = _merge(ranges)
    if not negated:
        return merged
    complement = []
    start = 0
    for first, last in merged:
        if first > start:
            complement.append((start, first - 1))
        start = last + 1
    if start <= LAST_CODE_POINT:
        complement.append((start, LAST_CODE_POINT))
    return tuple(complement)


def _character_set(op, av, ignorecase: bool):
    """Set of one single-character node."""
    if ignorecase or op in (sre_parse.ANY, sre_parse.NOT_LITERAL, sre_parse.CATEGORY):
        return UNKNOWN
    if op is sre_parse.LITERAL:
        return ((av, av),)
    return _class_set(av)


def _group_flags(av, ignorecase: bool) -> bool:
    _, add_flags, del_flags, _ = av
    if add_flags & re.IGNORECASE:
        return True
    if del_flags & re.IGNORECASE:
        return False
    return ignorecase


# ---- what a node can match first, and whether it can match nothing -----------------------

def _nullable(subpattern) -> bool:
    return all(_item_nullable(op, av) for op, av in subpattern)


def _item_nullable(op, av) -> bool:
    if op in SINGLE_CHARACTER:
        return False
    if op in REPEATS:
        return av[0] == 0 or _nullable(av[2])
    if op is sre_parse.SUBPATTERN:
        return _nullable(av[3])
    if op is ATOMIC_GROUP:
        return _nullable(av)
    if op is sre_parse.BRANCH:
        return any(_nullable(branch) for branch in av[1])
    return True  # anchors, lookarounds, back-references (which may be empty)


def _first(subpattern, ignorecase: bool):
    """Characters that can begin a match of `subpattern`."""
    found = EMPTY
    for op, av in subpattern:
        found = _union(found, _item_first(op, av, ignorecase))
        if not _item_nullable(op, av):
            break
    return found


def _item_first(op, av, ignorecase: bool):
    return _item_set(op, av, ignorecase, _first)


def _item_set(op, av, ignorecase: bool, sequence_set):
    """The characters of one item, where `sequence_set` (_first: what can begin a match;
    _sequence_alphabet: everything it can consume) gives those of a sequence inside it."""
    if op in SINGLE_CHARACTER:
        return _character_set(op, av, ignorecase)
    if op in REPEATS:
        return EMPTY if av[1] == 0 else sequence_set(av[2], ignorecase)
    if op is sre_parse.SUBPATTERN:
        return sequence_set(av[3], _group_flags(av, ignorecase))
    if op is ATOMIC_GROUP:
        return sequence_set(av, ignorecase)
    if op is sre_parse.BRANCH:
        found = EMPTY
        for branch in av[1]:
            found = _union(found, sequence_set(branch, ignorecase))
        return found
    if op is sre_parse.GROUPREF or op is sre_parse.GROUPREF_EXISTS:
        return UNKNOWN
    return EMPTY  # anchors and lookarounds consume nothing


def _single_character_body(subpattern, ignorecase: bool):
    """The set when `subpattern` is exactly one single-character node (groups unwrapped),
    else UNKNOWN."""
    items = list(subpattern)
    while len(items) == 1 and items[0][0] is sre_parse.SUBPATTERN:
        ignorecase = _group_flags(items[0][1], ignorecase)
        items = list(items[0][1][3])
    if len(items) == 1 and items[0][0] in SINGLE_CHARACTER:
        return _character_set(items[0][0], items[0][1], ignorecase)
    return UNKNOWN


# ---- the rules -------------------------------------------------------------------------

def _walk(subpattern, follow, repeating: bool, ignorecase: bool) -> None:
    """`follow`: characters that can come right after `subpattern` inside the current
    iteration of the innermost iterating repeat (UNKNOWN at the end of an iteration)."""
    items = list(subpattern)
    after = [follow] * len(items)
    if not repeating:
        # Follow sets only matter inside an iterating repeat (which resets them): skip the
        # work on the large classes of top-level alternatives.
        for op, av in items:
            _visit(op, av, UNKNOWN, repeating, ignorecase)
        return
    # Right to left: what can follow item i is the first set of the items after it, up to
    # the first one that must consume a character.
    for index in range(len(items) - 2, -1, -1):
        op, av = items[index + 1]
        first = _item_first(op, av, ignorecase)
        after[index] = first if not _item_nullable(op, av) else _union(first, after[index + 1])
    for (op, av), item_follow in zip(items, after):
        _visit(op, av, item_follow, repeating, ignorecase)


def _visit(op, av, follow, repeating: bool, ignorecase: bool) -> None:
    if op in REPEATS:
        _visit_repeat(av, follow, repeating, ignorecase)
    elif op is sre_parse.BRANCH:
        if repeating:
            _check_alternatives(av[1], follow, ignorecase)
        for branch in av[1]:
            _walk(branch, follow, repeating, ignorecase)
    elif op is sre_parse.SUBPATTERN:
        _walk(av[3], follow, repeating, _group_flags(av, ignorecase))
    elif op is ATOMIC_GROUP:
        _walk(av, follow, repeating, ignorecase)
    elif op in (sre_parse.ASSERT, sre_parse.ASSERT_NOT):
        _walk(av[1], UNKNOWN, repeating, ignorecase)
    elif op is sre_parse.GROUPREF_EXISTS:
        for branch in av[1:]:
            if branch is not None:
                _walk(branch, follow, repeating, ignorecase)


def _visit_repeat(av, follow, repeating: bool, ignorecase: bool) -> None:
    low, high, body = av
    if repeating and low != high and _first(body, ignorecase) != EMPTY:
        repeated = _single_character_body(body, ignorecase)
        if repeated is UNKNOWN or follow is UNKNOWN or _overlap(repeated, follow):
            raise CatastrophicPattern("a repeat of variable count inside another repeat can "
                                      "split the same text in exponentially many ways")
    if high > 1:
        # Inside an iterating repeat, the end of the body can be followed by anything.
        _walk(body, UNKNOWN, True, ignorecase)
    else:
        _walk(body, follow, repeating, ignorecase)


def _check_alternatives(branches, follow, ignorecase: bool) -> None:
    seen = EMPTY
    for branch in branches:
        first = _first(branch, ignorecase)
        if _nullable(branch):
            first = _union(first, follow)
        if _overlap(first, seen):
            raise CatastrophicPattern("alternatives that can begin with the same character "
                                      "inside a repeat can be tried in exponentially many "
                                      "combinations")
        seen = _union(seen, first)


# ---- polynomial blow-up: repeats in a row that share characters ------------------------------

# A repeat whose count can vary by more than this is "unbounded" for the polynomial rule:
# `\\p{N}{1,3}` and `x?` add a constant factor, `x*`, `x+` and `x{0,1000}` a factor of n.
MAX_BOUNDED_SPAN = 16
BACKTRACKING_REPEATS = tuple(getattr(sre_parse, name) for name in ("MAX_REPEAT", "MIN_REPEAT")
                             if hasattr(sre_parse, name))


def _flatten(subpattern, ignorecase: bool) -> list:
    """(op, av, ignorecase) of a sequence, the items of plain groups spliced in: `(a*)(a*)b`
    is the sequence a*, a*, b."""
    flat = []
    for op, av in subpattern:
        if op is sre_parse.SUBPATTERN:
            flat.extend(_flatten(av[3], _group_flags(av, ignorecase)))
        else:
            flat.append((op, av, ignorecase))
    return flat


def _alphabet(op, av, ignorecase: bool):
    """Every character the item can consume (lookarounds consume none)."""
    return _item_set(op, av, ignorecase, _sequence_alphabet)


def _sequence_alphabet(subpattern, ignorecase: bool):
    found = EMPTY
    for op, av in subpattern:
        found = _union(found, _alphabet(op, av, ignorecase))
    return found


def _backtracks_unboundedly(op, av) -> bool:
    """Whether the item can match runs of many different lengths at one place and give
    characters back one at a time: an unbounded repeat that is not possessive, or a group or
    alternation holding one (atomic groups and lookarounds never give back)."""
    if op in REPEATS:
        if op in BACKTRACKING_REPEATS and av[1] - av[0] > MAX_BOUNDED_SPAN \
                and _first(av[2], False) != EMPTY:
            return True
        return op in BACKTRACKING_REPEATS and _sequence_backtracks(av[2])
    if op is sre_parse.SUBPATTERN:
        return _sequence_backtracks(av[3])
    if op is sre_parse.BRANCH:
        return any(_sequence_backtracks(branch) for branch in av[1])
    return False


def _sequence_backtracks(subpattern) -> bool:
    return any(_backtracks_unboundedly(op, av) for op, av in subpattern)


def _can_fail(op, av) -> bool:
    """Whether the item can fail where it stands (False: it can always match nothing)."""
    if op in REPEATS:
        return av[0] > 0 and _sequence_can_fail(av[2])
    if op is sre_parse.SUBPATTERN:
        return _sequence_can_fail(av[3])
    if op is ATOMIC_GROUP:
        return _sequence_can_fail(av)
    if op is sre_parse.BRANCH:
        return all(_sequence_can_fail(branch) for branch in av[1])
    return True  # characters, anchors, lookarounds, back-references


def _sequence_can_fail(subpattern) -> bool:
    return any(_can_fail(op, av) for op, av in subpattern)


def _sequence_polynomial(flat: list, tail_can_fail: bool) -> None:
    """Raise CatastrophicPattern on a chain of two or more unboundedly backtracking items over
    shared characters, with only nullable items or shared characters between them, that
    something after can make fail. `tail_can_fail`: whether what follows this sequence (in the
    enclosing ones) can fail."""
    fails_after = [tail_can_fail] * (len(flat) + 1)
    for index in range(len(flat) - 1, -1, -1):
        op, av, _ = flat[index]
        fails_after[index] = fails_after[index + 1] or _can_fail(op, av)
    chain = 0
    shared = EMPTY
    for index, (op, av, ignorecase) in enumerate(flat):
        rest_can_fail = fails_after[index + 1]
        _inner_polynomial(op, av, ignorecase, rest_can_fail)
        if _backtracks_unboundedly(op, av):
            alphabet = _alphabet(op, av, ignorecase)
            if chain and _overlap(alphabet, shared):
                chain += 1
                shared = _intersection(shared, alphabet)
                if rest_can_fail:
                    raise CatastrophicPattern(
                        f"{chain} repeats in a row can share the same run of characters, and "
                        f"what follows them can fail: every split of the run is tried")
            else:
                chain, shared = 1, alphabet
        elif not _can_fail(op, av) or _item_nullable(op, av):
            continue  # optional items do not separate the repeats around them
        elif not (chain and _overlap(_alphabet(op, av, ignorecase), shared)):
            chain, shared = 0, EMPTY  # a character the repeats cannot take: a delimiter


def _inner_polynomial(op, av, ignorecase: bool, rest_can_fail: bool) -> None:
    if op in REPEATS:
        possessive = op not in BACKTRACKING_REPEATS
        _sequence_polynomial(_flatten(av[2], ignorecase), rest_can_fail and not possessive)
    elif op is sre_parse.BRANCH:
        for branch in av[1]:
            _sequence_polynomial(_flatten(branch, ignorecase), rest_can_fail)
    elif op is ATOMIC_GROUP:
        _sequence_polynomial(_flatten(av, ignorecase), False)
    elif op in (sre_parse.ASSERT, sre_parse.ASSERT_NOT):
        _sequence_polynomial(_flatten(av[1], ignorecase), False)
    elif op is sre_parse.GROUPREF_EXISTS:
        for branch in av[1:]:
            if branch is not None:
                _sequence_polynomial(_flatten(branch, ignorecase), rest_can_fail)


def _intersection(left, right):
    """Characters in both sets (UNKNOWN when either is)."""
    if left is UNKNOWN:
        return right
    if right is UNKNOWN:
        return left
    found = []
    i = j = 0
    while i < len(left) and j < len(right):
        first = max(left[i][0], right[j][0])
        last = min(left[i][1], right[j][1])
        if first <= last:
            found.append((first, last))
        if left[i][1] < right[j][1]:
            i += 1
        else:
            j += 1
    return tuple(found)


# ---- required iterations of parts that can match nothing -------------------------------------

# `(?:){99999}` or `(?:b?){5000}` must run their minimum count at every position of the text,
# consuming nothing (3-19 s on 3,000 characters); an iteration that consumes is bounded by the
# text. Real patterns need a handful (`\\p{N}{1,3}` consumes).
MAX_EMPTY_LOOP_WORK = 1000


def _empty_loop_work(subpattern) -> int:
    """Iterations run at one position by repeats whose body can match nothing, nested ones
    multiplied (the minimum count, at least one: past it the engine stops at an empty
    iteration)."""
    work = 0
    for op, av in subpattern:
        if op in REPEATS:
            inner = _empty_loop_work(av[2])
            # At least one iteration is tried whenever one is allowed: `(?:(?:){99999})*`
            # runs the inner count once at each position before the empty match stops it.
            tried = max(av[0], min(av[1], 1))
            work += tried * (1 + inner) if _nullable(av[2]) else inner
        elif op is sre_parse.SUBPATTERN:
            work += _empty_loop_work(av[3])
        elif op is ATOMIC_GROUP:
            work += _empty_loop_work(av)
        elif op is sre_parse.BRANCH:
            work += sum(_empty_loop_work(branch) for branch in av[1])
        elif op in (sre_parse.ASSERT, sre_parse.ASSERT_NOT):
            work += _empty_loop_work(av[1])
        elif op is sre_parse.GROUPREF_EXISTS:
            work += sum(_empty_loop_work(branch) for branch in av[1:] if branch is not None)
        if work > MAX_EMPTY_LOOP_WORK:
            return work  # enough to refuse; the products can get huge
    return work
