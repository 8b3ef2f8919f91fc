"""The Jinja sandbox chat templates render in, as transformers' `apply_chat_template` does.

`jinja_environment()`: an `ImmutableSandboxedEnvironment` with trim_blocks and lstrip_blocks,
the loop controls, the `{% generation %}` tag, the globals `raise_exception`, `strftime_now`, a
plain `dict` and a namespace that refuses underscore names, and a `tojson` filter taking
json.dumps' options (not HTML-escaping). jinja2 is imported inside the functions only (the core
stays importable without it; natively it is the `chat` extra, the page vendors Jinja2 3.1.6).

A template is untrusted input (it comes with the model), so a render is bounded:
- steps: a trace function counts the render's Python events (a template cannot loop for ever;
  the one bound that works in Pyodide, which has no threads or signals to interrupt a loop).
  This also bounds everything built item by item in Python.
- sizes, before they are built (template_budget.py): each operation that can build more than
  its inputs in one C call is sized from its arguments first and refused past the budget: the
  operators `*`, `**`, `+`, `%` (`intercepted_binops`) and `~` (its code generator), the str
  methods a template calls (`call`: center, ljust, replace, join...), `str.format` (a sized
  formatter), the filters (center, format, indent, join, replace, wordwrap, string, tojson,
  escape, sum, batch...), slices (its code generator), block bodies and each `{{ }}` output (`concat`, `finalize`).
  Every result is counted, in what the render built and (while anything holds it) in what it
  keeps. The rendered text has the per-value limit.
- MemoryError (a limit set lower than the budget) and the other failures become a typed
  CandleError naming the template.
"""

from __future__ import annotations

import datetime
import functools
import json
import sys
import types

from ..core.errors import CandleError
from .template_budget import (MAX_POWER_EXPONENT, MAX_RENDERED_CHARS, MAX_SPLIT_ITEMS,
                              STR_METHOD_SIZES, TemplateBudgetError, binop_size,
                              current_budget, escaped_size, format_field_size, join_size,
                              line_count, printf_size, render_budget, replace_size, text_size)

# Trace events a render may take (the largest of llama.cpp's 70 templates takes ~6000 for four
# messages; 2M take ~1 s natively): past this the template is looping, not formatting.
MAX_TEMPLATE_STEPS = 2_000_000


class _StepBudget(Exception):
    pass


def template_data(value, where: str, depth: int = 0):
    """A copy of `value` made of JSON types only (what a template may see), as transformers
    rebuilds its template inputs."""
    if depth > 32:
        raise CandleError(f"{where}: nested too deeply")
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, dict):
        return {str(key): template_data(item, f"{where}[{key!r}]", depth + 1)
                for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [template_data(item, f"{where}[{index}]", depth + 1)
                for index, item in enumerate(value)]
    raise CandleError(f"{where}: expected JSON data (str, number, bool, list, dict), got "
                      f"{type(value).__name__}")


def _text(budget, what: str, value) -> str:
    """str(value), sized first (a list's text can be far longer than the list)."""
    if isinstance(value, str):
        return value
    budget.check(what, text_size(value))
    return str(value)


def _checked_output(value):
    """The environment's `finalize`: each `{{ }}` value, sized before it becomes text."""
    current_budget().check("an output {{ }}", text_size(value))
    return value


# -- the filters that can build more than their input: sized from their arguments first -------
# Each takes (budget, what, the filter's context/environment argument or None, the filter's
# own arguments) and raises past the budget.

def _center(budget, what, _, value, width=80):
    budget.check(what, max(text_size(value), width))


def _format(budget, what, _, value, *args, **kwargs):
    budget.check(what, printf_size(_text(budget, what, value), kwargs or args))


def _indent(budget, what, _, s, width=4, first=False, blank=False):
    text = _text(budget, what, s)
    indention = len(width) if isinstance(width, str) else max(width, 0)
    budget.check(what, len(text) + 1 + line_count(text) * (indention + 1))


def _join(budget, what, eval_ctx, value, d="", attribute=None):
    if isinstance(value, str):
        budget.check(what, len(value) + len(_text(budget, what, d)) * len(value))
        return
    items = value.keys() if isinstance(value, dict) else value
    if attribute is not None:
        from jinja2.filters import make_attrgetter

        items = list(map(make_attrgetter(eval_ctx.environment, attribute), items))
    size = join_size(_text(budget, what, d), list(items))
    budget.check(what, size * (6 if eval_ctx.autoescape else 1))


def _replace(budget, what, eval_ctx, s, old, new, count=None):
    text, old, new = (_text(budget, what, part) for part in (s, old, new))
    if eval_ctx.autoescape:  # each part escaped first: up to 6 times as long
        size = 6 * len(text) + (6 * len(text) + 1) * 6 * len(new)
    else:
        size = replace_size(text, old, new, -1 if count is None else count)
    budget.check(what, size)


def _wordwrap(budget, what, environment, s, width=79, break_long_words=True, wrapstring=None,
              break_on_hyphens=True):
    text = _text(budget, what, s)
    wrap = environment.newline_sequence if wrapstring is None else wrapstring
    budget.check(what, len(text) + (len(text) + 1) * len(wrap))  # a line holds >= 1 character


def _string(budget, what, _, value):
    budget.check(what, text_size(value))


def _pprint(budget, what, _, value):
    budget.check(what, 2 * text_size(value, quoted=True, indent=1))


def _escape(budget, what, _, value):
    budget.check(what, escaped_size(value) if isinstance(value, str) else 6 * text_size(value))


def _xmlattr(budget, what, _, d, autospace=True):
    budget.check(what, 6 * text_size(d))


def _urlencode(budget, what, _, value):
    budget.check(what, 12 * text_size(value))  # a character is up to 4 bytes, each %XX


def _urlize(budget, what, _, value, trim_url_limit=None, nofollow=False, target=None,
            rel=None, extra_schemes=None):
    text = _text(budget, what, value)
    extra = 64 + len(_text(budget, what, target or "")) + len(_text(budget, what, rel or ""))
    budget.check(what, 12 * len(text) + (len(text) // 3 + 1) * extra)


def _sum(budget, what, environment, iterable, attribute=None, start=0):
    if not isinstance(start, (str, list, tuple)):
        return  # numbers: an int sum grows by a bit per doubling of the count
    items = iterable
    if attribute is not None:
        from jinja2.filters import make_attrgetter

        items = map(make_attrgetter(environment, attribute), iterable)
    # sum() of lists copies the running total at each step: all of it is built.
    length, copied = len(start), 0
    for item in items:
        length += len(item) if isinstance(item, (str, list, tuple)) else 0
        copied += length
        if length > MAX_RENDERED_CHARS or copied > budget.built_limit:
            break
    budget.check(what, length)
    budget.copy(what, copied)


def _batch(budget, what, _, value, linecount, fill_with=None):
    if fill_with is not None:  # the last batch is padded with [fill_with] * linecount at once
        budget.check(what, linecount)


def _list(budget, what, _, value):
    if isinstance(value, str):  # a new string object per character
        budget.check(what, len(value), MAX_SPLIT_ITEMS)


SIZED_FILTERS = {"center": _center, "format": _format, "indent": _indent, "join": _join,
                 "replace": _replace, "wordwrap": _wordwrap, "string": _string,
                 "pprint": _pprint, "escape": _escape, "e": _escape, "forceescape": _escape,
                 "xmlattr": _xmlattr, "urlencode": _urlencode, "urlize": _urlize, "sum": _sum,
                 "batch": _batch, "list": _list}
# Filters whose input is walked twice (sized, then used): an iterator becomes a list first.
_MATERIALIZED = {"join", "sum"}


def _sized_filter(name: str, original):
    """`original` with its result's size checked first (SIZED_FILTERS) and counted after."""
    precheck = SIZED_FILTERS.get(name)
    takes_context = hasattr(original, "jinja_pass_arg")  # eval_ctx / environment / context
    what = f"the {name} filter"

    @functools.wraps(original)
    def sized_filter(*args, **kwargs):
        budget = current_budget()
        if precheck is not None:
            lead, params = (args[:1], list(args[1:])) if takes_context else ((), list(args))
            if (name in _MATERIALIZED and params
                    and not isinstance(params[0], (str, list, tuple, dict))):
                params[0] = list(params[0])
            precheck(budget, what, lead[0] if lead else None, *params, **kwargs)
            args = (*lead, *params)
        result = original(*args, **kwargs)
        budget.add(what, result)
        return result

    return sized_filter


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    """transformers' tojson: json.dumps with its options, no HTML escaping; sized first (json
    makes its indent string before anything else)."""
    width = None if indent is None else (len(indent) if isinstance(indent, str)
                                         else max(int(indent), 0))
    budget = current_budget()
    size = text_size(value, json=True, indent=width, separators=separators,
                     ensure_ascii=ensure_ascii) + (width or 0)
    budget.check("the tojson filter", size)
    text = json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)
    budget.add("the tojson filter", text)
    return text


def _strftime_now(format):
    text = _text(current_budget(), "strftime_now()", format)
    # A directive is a few characters that become at most a few dozen (%c: 24).
    current_budget().check("strftime_now()", len(text) + 64 * text.count("%"))
    return datetime.datetime.now().strftime(text)


def _call_name(obj) -> str:
    return f"{getattr(obj, '__name__', None) or type(obj).__name__}()"


@functools.lru_cache(maxsize=1)
def _environment_class():
    """The sandbox class, built on first use (jinja2 is imported here, not at module level)."""
    import jinja2
    import jinja2.ext
    import jinja2.nodes
    from jinja2.compiler import CodeGenerator, optimizeconst
    from jinja2.exceptions import SecurityError
    from jinja2.sandbox import ImmutableSandboxedEnvironment, SandboxedFormatter

    class GenerationTag(jinja2.ext.Extension):
        """`{% generation %}...{% endgeneration %}` (transformers marks assistant text with
        it): rendered as its body."""
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [],
                                          body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    class SizedCode(CodeGenerator):
        """Compiles `a ~ b` to the environment's sized_concat and `x[a:b]` to its sized_slice
        (jinja2 intercepts neither): the same joiner, called once the operands' text is sized;
        the same slice, counted."""

        @optimizeconst
        def visit_Getitem(self, node, frame):
            if not isinstance(node.arg, jinja2.nodes.Slice):
                return super().visit_Getitem(node, frame)
            self.write("environment.sized_slice(")
            self.visit(node.node, frame)
            self.write(", slice(")
            for part in (node.arg.start, node.arg.stop, node.arg.step):
                if part is None:
                    self.write("None")
                else:
                    self.visit(part, frame)
                self.write(", ")
            self.write("))")

        @optimizeconst
        def visit_Concat(self, node, frame):
            if frame.eval_ctx.volatile:
                joiner = "(markup_join if context.eval_ctx.volatile else str_join)"
            elif frame.eval_ctx.autoescape:
                joiner = "markup_join"
            else:
                joiner = "str_join"
            self.write(f"environment.sized_concat({joiner}, (")
            for argument in node.nodes:
                self.visit(argument, frame)
                self.write(", ")
            self.write("))")

    class SizedFormatter(SandboxedFormatter):
        """str.format's fields sized before each is formatted (a width, a list's text), and
        counted as they are built (a field used many times)."""

        def convert_field(self, value, conversion):
            if conversion in ("r", "a", "s"):
                current_budget().check("a str.format field",
                                       text_size(value, quoted=conversion != "s"))
            return super().convert_field(value, conversion)

        def format_field(self, value, format_spec):
            budget = current_budget()
            budget.check("a str.format field", format_field_size(value, format_spec))
            text = super().format_field(value, format_spec)
            budget.add("a str.format field", text)
            return text

    class ChatSandbox(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset(("*", "**", "+", "%"))
        code_generator_class = SizedCode

        def is_safe_attribute(self, obj, attr, value):
            # str.format reached any other way than `getattr` below (item access, the attr
            # filter) would skip the sandboxed formatter on jinja2 < 3.1.5 (Pyodide 0.27's own
            # package is 3.1.3): refused.
            if isinstance(obj, str) and attr in ("format", "format_map"):
                return False
            return super().is_safe_attribute(obj, attr, value)

        def getattr(self, obj, attribute):
            if isinstance(obj, str) and attribute in ("format", "format_map"):
                return self._sized_format(obj, attribute == "format_map")
            return super().getattr(obj, attribute)

        def wrap_str_format(self, value):
            # jinja2 >= 3.1.5 wraps str.format reached by item access here: sized as well.
            if (isinstance(value, (types.MethodType, types.BuiltinMethodType))
                    and isinstance(value.__self__, str)
                    and value.__name__ in ("format", "format_map")):
                return self._sized_format(value.__self__, value.__name__ == "format_map")
            return None

        def _sized_format(self, text: str, is_map: bool):
            formatter = SizedFormatter(self)

            def format_call(*args, **kwargs):
                if is_map:
                    if kwargs or len(args) != 1:
                        raise TypeError("format_map() takes exactly one argument")
                    args, kwargs = (), args[0]
                result = formatter.vformat(text, args, kwargs)
                current_budget().add("str.format()", result)
                return result

            return format_call

        def call_binop(self, context, operator, left, right):
            budget = current_budget()
            what = f"the {operator} operator"
            if (operator == "**" and isinstance(right, (int, float))
                    and abs(right) > MAX_POWER_EXPONENT):
                raise SecurityError(f"exponent {right} is too large")
            bound = binop_size(operator, left, right)
            if bound is not None:
                size, limit, unit = bound
                budget.check(what, size, limit, unit)
            result = self.binop_table[operator](left, right)
            budget.add(what, result)
            return result

        def call(self, context, obj, /, *args, **kwargs):
            budget = current_budget()
            owner = getattr(obj, "__self__", None) if isinstance(
                obj, (types.MethodType, types.BuiltinMethodType)) else None
            if isinstance(owner, str) and obj.__name__ in STR_METHOD_SIZES:
                if obj.__name__ == "join" and args and not isinstance(args[0], (list, tuple)):
                    args = (list(args[0]), *args[1:])  # sized, then joined: walked twice
                size_of, limit = STR_METHOD_SIZES[obj.__name__]
                arguments = {key: value for key, value in kwargs.items()
                             if key not in ("_loop_vars", "_block_vars")}  # jinja2's own
                budget.check(f"str.{obj.__name__}()", size_of(owner, *args, **arguments),
                             limit)
            result = super().call(context, obj, *args, **kwargs)
            budget.add(_call_name(obj), result)
            return result

        def sized_slice(self, obj, index: slice):
            """`obj[a:b]` (SizedCode): a copy at most as long as `obj`, counted."""
            result = obj[index]
            current_budget().add("a slice", result)
            return result

        def sized_concat(self, joiner, values):
            """`a ~ b ~ ...` (SizedCode): their text sized, then joined."""
            budget = current_budget()
            size = sum(text_size(value) for value in values)
            if getattr(joiner, "__name__", "") != "str_join":  # markup_join escapes them
                size *= 6
            budget.check("the ~ operator", size)
            result = joiner(values)
            budget.add("the ~ operator", result)
            return result

        def concat(self, pieces):
            """A block's text (`{% set %}` blocks, macros, `{% filter %}`), sized before it is
            joined. (The generated code calls `environment.concat`.)"""
            pieces = list(pieces)
            budget = current_budget()
            budget.check("a block's text", sum(map(len, pieces)))
            text = "".join(pieces)
            budget.add("a block's text", text)
            return text

    return ChatSandbox, GenerationTag


def jinja_environment():
    """A sandboxed Jinja environment with the options, globals and filters transformers gives
    chat templates (see the module docstring). Raises ImportError without jinja2."""
    import jinja2.ext
    import jinja2.utils
    from jinja2.exceptions import SecurityError, TemplateError

    sandbox, generation_tag = _environment_class()

    def raise_exception(message):
        raise TemplateError(message)

    class PlainDict:
        """`dict(...)` and `dict.fromkeys(...)`, and nothing else of the type."""

        def __call__(self, *args, **kwargs):
            return dict(*args, **kwargs)

        def fromkeys(self, *args, **kwargs):
            return dict.fromkeys(*args, **kwargs)

    class Namespace(jinja2.utils.Namespace):
        """A namespace that refuses underscore names (no route to the interpreter)."""

        def __init__(*args, **kwargs):
            self, args = args[0], args[1:]
            attributes = dict(*args, **kwargs)
            for name in attributes:
                Namespace._check(name)
            jinja2.utils.Namespace.__init__(self, attributes)

        def __setitem__(self, name, value):
            Namespace._check(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check(name):
            if isinstance(name, str) and name.startswith("_"):
                raise SecurityError(f"namespace attribute {name!r} "
                                    f"(underscore names are refused)")

    environment = sandbox(trim_blocks=True, lstrip_blocks=True, finalize=_checked_output,
                          extensions=[generation_tag, jinja2.ext.loopcontrols])
    environment.filters["tojson"] = _tojson
    for name, original in list(environment.filters.items()):
        if original is not _tojson:
            environment.filters[name] = _sized_filter(name, original)
    environment.globals["raise_exception"] = raise_exception
    environment.globals["strftime_now"] = _strftime_now
    environment.globals["dict"] = PlainDict()
    environment.globals["namespace"] = Namespace
    return environment


def compile_template(source: str):
    """`source` compiled in a fresh sandbox (jinja2's TemplateSyntaxError when it does not
    parse; ImportError without jinja2)."""
    try:
        return jinja_environment().from_string(source)
    except MemoryError:
        raise TemplateBudgetError("chat template: out of memory while compiling it") from None


def render_bounded(compiled, context: dict) -> str:
    """compiled.render(context) within the budgets (see the module docstring); every failure of
    the template is a CandleError that says so."""
    from jinja2.exceptions import TemplateError

    try:
        with render_budget():
            return _render_counting_steps(compiled, context)
    except _StepBudget:
        raise CandleError(f"chat template: rendering took more than {MAX_TEMPLATE_STEPS} "
                          f"steps (a template that loops instead of formatting)") from None
    except MemoryError:
        raise TemplateBudgetError("chat template: out of memory while rendering (the template "
                                  "builds more than this process can hold)") from None
    except TemplateError as exc:
        raise CandleError(f"chat template: {exc}") from None
    except RecursionError:
        raise CandleError("chat template: recursion too deep") from None
    except (TypeError, ValueError, KeyError, IndexError, AttributeError,
            ArithmeticError) as exc:
        raise CandleError(f"chat template: {type(exc).__name__}: {exc}") from None


def _render_counting_steps(compiled, context: dict) -> str:
    """compiled.generate(context) joined, stopped past MAX_TEMPLATE_STEPS trace events or
    MAX_RENDERED_CHARS characters."""
    steps = [0]

    def trace(frame, event, arg):
        steps[0] += 1
        if steps[0] > MAX_TEMPLATE_STEPS:
            raise _StepBudget()
        return trace

    previous = sys.gettrace()
    pieces = []
    length = 0
    sys.settrace(trace)
    try:
        for piece in compiled.generate(context):
            length += len(piece)
            if length > MAX_RENDERED_CHARS:
                raise CandleError(f"chat template: the rendered text passed "
                                  f"{MAX_RENDERED_CHARS} characters")
            pieces.append(piece)
    finally:
        sys.settrace(previous)
    return "".join(pieces)
