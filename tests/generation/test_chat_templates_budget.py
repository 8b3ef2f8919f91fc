"""Hostile chat templates cannot allocate past the render's budget (issue 37, item 2).

Each reproducer renders in a child process whose address space is capped at what it holds after
the imports plus 1 GiB (tests/bounded_run_testlib.py), so an allocation the budget missed shows
as a MemoryError, or as a peak far over the budget, instead of swapping the machine. Before the
sizes were checked ahead, `'a'|center(300000000)`, `'%0300000000d' % 1`, `ljust`, `replace` and
`join` each built 0.3-1.5 GB and `s|replace('x', s)` asked for 3.6 G characters. Now each is
refused by a TemplateBudgetError naming the operation, having built next to nothing.
"""

from __future__ import annotations

import pytest

from tests.bounded_run_testlib import assert_typed_error, run_bounded

pytest.importorskip("jinja2")

CAP = 1 << 30  # RLIMIT_AS: the interpreter and jinja2 as imported, plus 1 GiB
# What a refused render may have allocated at its peak: twice what a render may keep at once
# (MAX_LIVE_CHARS, 32 M characters: 32 MB of ASCII text) covers the budget's own worst case.
REFUSED_PEAK_BYTES = 64 << 20
S = "x" * 60_000  # the review's `s`: s|replace('x', s) is 3.6 G characters
BIG = "x" * 1_000_000
SETUP = """
from candle_web.generation.chat_templates import load_chat_template
"""
BODY = """
template = load_chat_template({source!r})
rendered = template.render([{{"role": "user", "content": "hi"}}], s={s!r}, big={big!r})
_result["value"] = rendered[:200]
"""
DOUBLING = "{% set ns = namespace(t=s) %}{% for i in range(20) %}STEP{% endfor %}{{ ns.t|length }}"
KEEPING = ("{% set ns = namespace(kept=[]) %}{% for i in range(2000) %}"
           "{% set ns.kept = ns.kept + [ITEM] %}{% endfor %}{{ ns.kept|length }}")

# (what, template source, a fragment the error names)
REPRODUCERS = [
    # the review's five
    ("center filter", "{{ 'a'|center(300000000) }}", "the center filter"),
    ("printf width", "{{ '%0300000000d' % 1 }}", "the % operator"),
    ("str.ljust", "{{ 'a'.ljust(300000000) }}", "str.ljust()"),
    ("replace filter", "{% set t = s|replace('x', s) %}{{ t|length }}", "the replace filter"),
    ("join filter", "{{ ([s] * 60000)|join|length }}", "the join filter"),
    # the same through the other routes to each
    ("str.replace", "{{ s.replace('x', s)|length }}", "str.replace()"),
    ("str.join", "{{ ''.join([s] * 60000)|length }}", "str.join()"),
    ("str.rjust", "{{ 'a'.rjust(300000000) }}", "str.rjust()"),
    ("str.center", "{{ 'a'.center(300000000) }}", "str.center()"),
    ("str.zfill", "{{ '1'.zfill(300000000) }}", "str.zfill()"),
    ("str.expandtabs", "{{ '\\t'.expandtabs(300000000) }}", "str.expandtabs()"),
    ("format filter", "{{ '%0300000000d'|format(1) }}", "the format filter"),
    ("printf of a list", "{{ '%s' % ([s] * 60000,) }}", "the % operator"),
    ("str.format width", "{{ '{:>300000000}'.format(1) }}", "str.format field"),
    ("str.format by item", "{{ '{:>300000000}'['format'](1) }}", "str.format field"),
    ("str.format repeats a field", "{{ ('{0}' * 1000).format(s)|length }}",
     "str.format field"),
    # operators
    ("repetition", "{{ (s * 60000)|length }}", "the * operator"),
    ("~ doubling", DOUBLING.replace("STEP", "{% set ns.t = ns.t ~ ns.t %}"), "the ~ operator"),
    ("+ doubling", DOUBLING.replace("STEP", "{% set ns.t = ns.t + ns.t %}"), "the + operator"),
    ("~ of a list", "{{ ('' ~ [s] * 60000)|length }}", "the ~ operator"),
    ("int squaring", "{% set ns = namespace(n=3) %}{% for i in range(40) %}"
     "{% set ns.n = ns.n * ns.n %}{% endfor %}{{ ns.n > 0 }}", "bits"),
    ("int power", "{% set ns = namespace(n=2 ** 256) %}{% for i in range(4) %}"
     "{% set ns.n = ns.n ** 256 %}{% endfor %}{{ ns.n > 0 }}", "bits"),
    # filters that build more than their input
    ("indent width", "{{ s|indent(300000000, true) }}", "the indent filter"),
    ("indent per line", "{{ ('y\\n' * 60000)|indent(s)|length }}", "the indent filter"),
    ("wordwrap", "{{ s|wordwrap(1, wrapstring=s)|length }}", "the wordwrap filter"),
    ("tojson of a list", "{{ ([s] * 60000)|tojson|length }}", "the tojson filter"),
    ("tojson indent", "{{ [1]|tojson(indent=300000000) }}", "the tojson filter"),
    ("string of a list", "{{ ([s] * 60000)|string|length }}", "the string filter"),
    ("pprint of a list", "{{ ([s] * 60000)|pprint|length }}", "the pprint filter"),
    ("escape of a list", "{{ ([s] * 60000)|e|length }}", "the e filter"),
    ("output of a list", "{{ [s] * 60000 }}", "an output"),
    ("sum of lists", "{{ ([[s]] * 60000)|sum(start=[])|length }}", "the sum filter"),
    ("batch padding", "{{ [1]|batch(300000000, 'x')|list|length }}", "the batch filter"),
    ("list of a string", "{{ ('\u3042' * 2000000)|list|length }}", "the list filter"),
    ("str.split", "{{ ('\u3042\u3042 ' * 1300000).split()|length }}", "str.split()"),
    ("strftime_now", "{{ strftime_now('%c' * 2000000)|length }}", "strftime_now()"),
    # blocks and macros doubling their text
    ("macro doubling", "{% macro twice(t) %}{{ t }}{{ t }}{% endmacro %}"
     + DOUBLING.replace("STEP", "{% set ns.t = twice(ns.t) %}"), "a block's text"),
    ("set block doubling", DOUBLING.replace(
        "STEP", "{% set t %}{{ ns.t }}{{ ns.t }}{% endset %}{% set ns.t = t %}"),
     "a block's text"),
    # many values each under the limit, kept: the render's total
    ("kept concatenations", KEEPING.replace("ITEM", "big ~ i"), "kept at once"),
    ("kept slices", KEEPING.replace("ITEM", "big[i:]"), "kept at once"),
]


@pytest.mark.parametrize("source, fragment", [case[1:] for case in REPRODUCERS],
                         ids=[case[0] for case in REPRODUCERS])
def test_hostile_template_is_refused_before_it_builds(source, fragment):
    result = run_bounded(BODY.format(source=source, s=S, big=BIG), SETUP, headroom=CAP)
    assert result["type"] == "TemplateBudgetError", result
    assert_typed_error(result, "chat template:", fragment)
    assert result["traced_peak_bytes"] < REFUSED_PEAK_BYTES, result


def test_out_of_memory_under_the_budget_is_the_typed_error():
    """A process with less memory than the budget assumes (here 40 MiB over the imports, under
    tracemalloc): the MemoryError of an operation the budget allows becomes the same typed
    error, not a bare MemoryError."""
    # four strings of 3 M emoji: 12 M characters (under the budget), 48 MB as UCS-4
    source = ("{% set a = '\U0001F600' * 3000000 %}{% set b = a ~ 'x' %}{% set c = a ~ 'y' %}"
              "{% set d = a ~ 'z' %}{{ [a, b, c, d]|length }}")
    result = run_bounded(BODY.format(source=source, s="", big=""), SETUP, headroom=40 << 20)
    assert result["type"] == "TemplateBudgetError", result
    assert_typed_error(result, "out of memory")


def test_sizes_under_the_limits_still_render():
    """The budget refuses by size, not by operation: the same operations on sizes a prompt has
    render as Python computes them."""
    from candle_web.generation.chat_templates import load_chat_template

    text = "ab\tc " * 1000
    cases = {
        "{{ s|center(6000) }}": text.center(6000),
        "{{ s|replace('a', 'xyz') }}": text.replace("a", "xyz"),
        "{{ [s, s]|join(', ') }}": f"{text}, {text}",
        "{{ s.ljust(5100, '.') }}": text.ljust(5100, "."),
        "{{ '%-7d|%s' % (42, s) }}": "%-7d|%s" % (42, text),
        "{{ '{:>5100}'.format(s) }}": f"{text:>5100}",
        "{{ s.expandtabs(4) }}": text.expandtabs(4),
        "{{ (s ~ '!') * 3 }}": (text + "!") * 3,
        "{{ s|indent(2) }}": text,  # one line: indent leaves the first line alone
        "{{ ['a', 1, none]|tojson(indent=2) }}": '[\n  "a",\n  1,\n  null\n]',
        "{{ [s[:3]] * 2 }}": str([text[:3]] * 2),
        "{{ (3 ** 200) * (7 ** 100) }}": str(3 ** 200 * 7 ** 100),
        "{{ s.split()|length }}": str(len(text.split())),
    }
    for source, expected in cases.items():
        rendered = load_chat_template(source).render([{"role": "user", "content": "x"}], s=text)
        assert rendered == expected, source


def test_what_is_dropped_stops_counting():
    """Building more than the render may keep is fine when each copy is dropped (a prompt built
    as `ns.out = ns.out ~ message` is), and refused when the copies are kept."""
    from candle_web.generation.chat_templates import (MAX_LIVE_CHARS, TemplateBudgetError,
                                                      load_chat_template)

    big = "x" * 1_000_000
    rounds = MAX_LIVE_CHARS // len(big) + 8
    dropped = load_chat_template(
        "{% set ns = namespace(n=0) %}{% for i in range(" + str(rounds) + ") %}"
        "{% set t = big ~ i %}{% set ns.n = ns.n + t|length %}{% endfor %}{{ ns.n }}")
    assert dropped.render([{"role": "user", "content": "x"}], big=big) == str(
        sum(len(big + str(i)) for i in range(rounds)))
    kept = load_chat_template(KEEPING.replace("2000", str(rounds)).replace("ITEM", "big ~ i"))
    with pytest.raises(TemplateBudgetError, match="kept at once"):
        kept.render([{"role": "user", "content": "x"}], big=big)


def test_the_size_bounds_are_upper_bounds():
    """Each bound the sandbox refuses by is at least the size Python then builds (else a
    refusal could come after the allocation), on values with the escapes that make text grow:
    quotes, backslashes, control characters, non-ASCII, astral, nesting, shared items."""
    import json

    import jinja2.utils
    from markupsafe import Markup, escape

    from candle_web.generation.template_budget import (STR_METHOD_SIZES, escaped_size,
                                                       format_field_size, printf_size,
                                                       replace_size, text_size)

    text = "a'b\"c\\d\n\x00é😀\u200b"
    values = [text, "", 7, -2 ** 200, 1.5e308, True, None, [text] * 3, (text, [text, {}]),
              {text: [1, None, {"k": text}], 3: (2.5,)}, {text, "x"}, Markup("<b>" + text),
              {"a": 1}.items(), jinja2.utils.Namespace(a=[text] * 2)]
    for value in values:
        assert text_size(value) >= len(str(value)), value
        assert text_size(value, quoted=True) >= len(repr(value)), value
        try:
            for options in ({}, {"ensure_ascii": True}, {"indent": 3},
                            {"indent": 2, "separators": (" ,", " : ")}):
                width = options.get("indent")
                assert text_size(value, json=True, indent=width,
                                 separators=options.get("separators"),
                                 ensure_ascii=options.get("ensure_ascii", False)) >= len(
                    json.dumps(value, **options)), (value, options)
        except TypeError:
            pass  # json cannot write it (a set, a Namespace)
        assert escaped_size(str(value)) >= len(escape(str(value)))
        assert format_field_size(value, "") >= len(format(value, "")), value
    for spec, value in (("^30", text), (">+12,.3f", 1.5e308), ("#x", 2 ** 100), ("0>9", 5),
                        (",d", -2 ** 90), (".2%", 0.5)):
        assert format_field_size(value, spec) >= len(format(value, spec)), spec
    for template, arguments in (("%s|%r|%a", (text, text, text)), ("%-9.3f%05d", (1e300, 7)),
                                ("%*d|%.*s", (12, 1, 2, text)), ("%(a)s%(a)r", {"a": [text]}),
                                ("%#o%x%c", (2 ** 70, 255, 65)), ("%s", [text, text])):
        assert printf_size(template, arguments) >= len(template % arguments), template
    for old, new in (("a", "xyz"), ("", "-"), ("\\", ""), ("zz", "y")):
        assert replace_size(text * 3, old, new) == len((text * 3).replace(old, new))
    lines = "a b\tc\r\nd\x1ce\u2028  f\t\t" * 3
    for method, arguments in (("center", (40, "*")), ("ljust", (3,)), ("zfill", (50,)),
                              ("expandtabs", (13,)), ("replace", ("b", "bbb", 2)),
                              ("join", (["x", lines],)), ("translate", ({97: "xyz", 98: None},)),
                              ("split", ()), ("split", ("\t",)), ("rsplit", (" ", 1)),
                              ("splitlines", (True,))):
        size_of, _ = STR_METHOD_SIZES[method]
        built = getattr(lines, method)(*arguments)
        assert size_of(lines, *arguments) >= len(built), method
