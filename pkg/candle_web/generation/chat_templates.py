"""Chat prompts: the model's own Jinja template, or the common formats recognised directly.

Models ship a Jinja template (GGUF `tokenizer.chat_template`, HF `tokenizer_config.json`).
`load_chat_template` (what `chat_template_for` uses) renders it with Jinja2 as transformers'
`apply_chat_template` does: a sandbox (`ImmutableSandboxedEnvironment`, trim_blocks and
lstrip_blocks, the loop controls, the `{% generation %}` tag), the globals `raise_exception`,
`strftime_now`, a plain `dict` and a namespace that refuses underscore names, a `tojson` filter
taking json.dumps' options (not HTML-escaping), and the variables `messages`,
`add_generation_prompt`, `bos_token`/`eos_token`, `tools`/`documents` none. jinja2 is imported
when a template is loaded (natively the `chat` extra; the page vendors Jinja2 3.1.6 and a pure
MarkupSafe from PyPI, scripts/vendor_pyodide.py). A render is bounded: a step budget (a
template cannot loop for ever), sizes of `*`/`**` results, the output length.

Without jinja2, or for a template jinja2 cannot parse, `ChatTemplate.detect` recognises the
three formats below by their marker tokens and renders them directly, and raises
`UnsupportedError` for anything else, so a prompt is never silently built in the wrong format.

    chatml  <|im_start|>{role}\\n{content}<|im_end|>\\n ... <|im_start|>assistant\\n
            (SmolLM, Qwen, OpenHermes). A default system message written as a literal in the
            template (inserted when the conversation does not start with one) is honoured.
    llama3  {bos}<|start_header_id|>{role}<|end_header_id|>\\n\\n{content, trimmed}<|eot_id|>
            ... <|start_header_id|>assistant<|end_header_id|>\\n\\n   (Llama 3 / 3.0 style)
    llama2  {bos}[INST] <<SYS>>\\n{system}\\n<</SYS>>\\n\\n{user} [/INST] {assistant} {eos}
            {bos}[INST] {user} [/INST] ...   (Llama 2 chat; roles must alternate)

Render a prompt, then encode it *without* the tokenizer's own special tokens (the template
already placed BOS where the format wants it).
"""

from __future__ import annotations

import functools
import json
import re
import sys
from dataclasses import dataclass

from ..core.errors import CandleError, UnsupportedError

CHATML = "chatml"
LLAMA3 = "llama3"
LLAMA2 = "llama2"
FORMATS = (CHATML, LLAMA3, LLAMA2)

# A ChatML default system message: a quoted literal from "<|im_start|>system" + newline (a
# real one or a Jinja "\n" escape) to "<|im_end|>", with no Jinja expression inside.
_CHATML_DEFAULT_SYSTEM = re.compile(
    r"""['"]<\|im_start\|>system(?:\n|\\n)([^'"{}+]*?)<\|im_end\|>""")
# Template features outside the formats above: refuse rather than render them wrongly.
_UNSUPPORTED_MARKERS = {
    "Cutting Knowledge Date": "the Llama 3.1+ template (date and tool preamble)",
    "<start_of_turn>": "the Gemma template",
    "<|user|>": "the Zephyr/Phi template",
}


def _normalise_messages(messages) -> list:
    out = []
    for index, message in enumerate(messages):
        if isinstance(message, dict):
            role, content = message.get("role"), message.get("content")
        elif isinstance(message, (tuple, list)) and len(message) == 2:
            role, content = message
        else:
            raise CandleError(f"chat message {index}: expected {{'role', 'content'}} or a "
                              f"(role, content) pair, got {message!r}")
        if not isinstance(role, str) or not isinstance(content, str):
            raise CandleError(f"chat message {index}: role and content must be strings, got "
                              f"role={role!r} content={type(content).__name__}")
        out.append((role, content))
    if not out:
        raise CandleError("chat: no messages to render")
    return out


@dataclass(frozen=True)
class ChatTemplate:
    format: str
    default_system: str = None
    bos_token: str = ""
    eos_token: str = ""

    @staticmethod
    def detect(template, bos_token: str = "", eos_token: str = "") -> "ChatTemplate":
        """Recognise `template` (the Jinja source) as one of FORMATS."""
        if not template:
            raise UnsupportedError("this model has no chat template; prompt it without chat "
                                   "formatting (or give a template)")
        if not isinstance(template, str):
            raise UnsupportedError(f"chat template: expected a string, got "
                                   f"{type(template).__name__} (named template lists are not "
                                   "supported)")
        for marker, what in _UNSUPPORTED_MARKERS.items():
            if marker in template:
                raise UnsupportedError(f"chat template: {what} is not supported; supported "
                                       f"formats: {', '.join(FORMATS)}")
        if "<|im_start|>" in template and "<|im_end|>" in template:
            found = _CHATML_DEFAULT_SYSTEM.search(template)
            default = found.group(1).replace("\\n", "\n") if found else None
            return ChatTemplate(CHATML, default, bos_token, eos_token)
        if "<|start_header_id|>" in template and "<|eot_id|>" in template:
            return ChatTemplate(LLAMA3, None, bos_token, eos_token)
        if "[INST]" in template and "<<SYS>>" in template:
            return ChatTemplate(LLAMA2, None, bos_token, eos_token)
        head = template[:80].replace("\n", "\\n")
        raise UnsupportedError(f"chat template not recognised (starts {head!r}); supported "
                               f"formats: {', '.join(FORMATS)} (not a Jinja engine)")

    def render(self, messages, add_generation_prompt: bool = True) -> str:
        messages = _normalise_messages(messages)
        if self.format == CHATML:
            return self._chatml(messages, add_generation_prompt)
        if self.format == LLAMA3:
            return self._llama3(messages, add_generation_prompt)
        return self._llama2(messages)

    def _chatml(self, messages, add_generation_prompt) -> str:
        parts = []
        if self.default_system is not None and messages[0][0] != "system":
            parts.append(f"<|im_start|>system\n{self.default_system}<|im_end|>\n")
        for role, content in messages:
            parts.append(f"<|im_start|>{role}\n{content}<|im_end|>\n")
        if add_generation_prompt:
            parts.append("<|im_start|>assistant\n")
        return "".join(parts)

    def _llama3(self, messages, add_generation_prompt) -> str:
        parts = [self.bos_token]
        for role, content in messages:
            parts.append(f"<|start_header_id|>{role}<|end_header_id|>\n\n"
                         f"{content.strip()}<|eot_id|>")
        if add_generation_prompt:
            parts.append("<|start_header_id|>assistant<|end_header_id|>\n\n")
        return "".join(parts)

    def _llama2(self, messages) -> str:
        system = None
        if messages[0][0] == "system":
            system, messages = messages[0][1], messages[1:]
        parts = []
        for index, (role, content) in enumerate(messages):
            if (role == "user") != (index % 2 == 0):
                raise CandleError(f"llama2 chat: roles must alternate user/assistant starting "
                                  f"with user (after an optional system message); message "
                                  f"{index} is {role!r}")
            if index == 0 and system is not None:
                content = f"<<SYS>>\n{system}\n<</SYS>>\n\n{content}"
            if role == "user":
                parts.append(f"{self.bos_token}[INST] {content.strip()} [/INST]")
            else:
                parts.append(f" {content.strip()} {self.eos_token}")
        return "".join(parts)


def render_chat(template, messages, add_generation_prompt: bool = True, bos_token: str = "",
                eos_token: str = "") -> str:
    """Detect `template`'s format and render `messages` (dicts with role/content)."""
    return ChatTemplate.detect(template, bos_token, eos_token).render(messages,
                                                                      add_generation_prompt)


# -- Jinja templates ---------------------------------------------------------------------------

# Trace events a render may take (the largest of llama.cpp's 70 templates takes ~6000 for four
# messages; 2M take ~1 s natively): past this the template is looping, not formatting.
MAX_TEMPLATE_STEPS = 2_000_000
# Characters a rendered prompt, or one string or list built with `*`, may have.
MAX_RENDERED_CHARS = 4_000_000
MAX_POWER_EXPONENT = 256
JINJA_HINT = "install jinja2 (pip install 'candle-web[chat]') to render the model's own template"


class _StepBudget(Exception):
    pass


def _checked_data(value, where: str, depth: int = 0):
    """A copy of `value` made of JSON types only (what a template may see), as transformers
    rebuilds its template inputs; keys whose value is None are dropped from messages."""
    if depth > 32:
        raise CandleError(f"{where}: nested too deeply")
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, dict):
        return {str(key): _checked_data(item, f"{where}[{key!r}]", depth + 1)
                for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_checked_data(item, f"{where}[{index}]", depth + 1)
                for index, item in enumerate(value)]
    raise CandleError(f"{where}: expected JSON data (str, number, bool, list, dict), got "
                      f"{type(value).__name__}")


def _jinja_messages(messages) -> list:
    _normalise_messages(messages)  # the same checks and errors as the direct formats
    out = []
    for index, message in enumerate(messages):
        if isinstance(message, dict):
            message = {key: value for key, value in message.items() if value is not None}
        else:
            message = {"role": message[0], "content": message[1]}
        out.append(_checked_data(message, f"chat message {index}"))
    return out


@functools.lru_cache(maxsize=1)
def _environment_class():
    """The sandbox class, built on first use (jinja2 is imported here, not at module level)."""
    import jinja2
    import jinja2.ext
    import jinja2.nodes
    from jinja2.sandbox import ImmutableSandboxedEnvironment, SandboxedFormatter
    from jinja2.exceptions import SecurityError

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

    class ChatSandbox(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset(("*", "**"))

        def is_safe_attribute(self, obj, attr, value):
            # str.format reached any other way than `getattr` below (item access, the attr
            # filter) would skip the sandboxed formatter on jinja2 < 3.1.5 (Pyodide 0.27's own
            # package is 3.1.3): refused.
            if isinstance(obj, str) and attr in ("format", "format_map"):
                return False
            return super().is_safe_attribute(obj, attr, value)

        def getattr(self, obj, attribute):
            if isinstance(obj, str) and attribute in ("format", "format_map"):
                return self._sandboxed_format(obj, attribute == "format_map")
            return super().getattr(obj, attribute)

        def _sandboxed_format(self, text: str, is_map: bool):
            formatter = SandboxedFormatter(self)

            def format_call(*args, **kwargs):
                if is_map:
                    if kwargs or len(args) != 1:
                        raise TypeError("format_map() takes exactly one argument")
                    args, kwargs = (), args[0]
                result = formatter.vformat(text, args, kwargs)
                _check_size(result)
                return result

            return format_call

        def call_binop(self, context, operator, left, right):
            if operator == "**":
                if isinstance(right, (int, float)) and abs(right) > MAX_POWER_EXPONENT:
                    raise SecurityError(f"exponent {right} is too large")
                return left ** right
            if operator == "*":
                for sequence, count in ((left, right), (right, left)):
                    if (isinstance(sequence, (str, list, tuple)) and isinstance(count, int)
                            and len(sequence) * count > MAX_RENDERED_CHARS):
                        raise SecurityError("a repeated string or list "
                                            "would be too long")
                return left * right
            return super().call_binop(context, operator, left, right)

    return ChatSandbox, GenerationTag


def _check_size(text: str) -> None:
    if len(text) > MAX_RENDERED_CHARS:
        raise CandleError(f"chat template: the rendered text passed {MAX_RENDERED_CHARS} "
                          f"characters")


def jinja_environment():
    """A sandboxed Jinja environment with the options, globals and filters transformers gives
    chat templates (see the module docstring). Raises ImportError without jinja2."""
    import datetime

    import jinja2
    import jinja2.ext
    import jinja2.utils
    from jinja2.exceptions import SecurityError, TemplateError

    sandbox, generation_tag = _environment_class()

    def raise_exception(message):
        raise TemplateError(message)

    def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent,
                          separators=separators, sort_keys=sort_keys)

    def strftime_now(format):
        return datetime.datetime.now().strftime(format)

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

    environment = sandbox(trim_blocks=True, lstrip_blocks=True,
                          extensions=[generation_tag, jinja2.ext.loopcontrols])
    environment.filters["tojson"] = tojson
    environment.globals["raise_exception"] = raise_exception
    environment.globals["strftime_now"] = strftime_now
    environment.globals["dict"] = PlainDict()
    environment.globals["namespace"] = Namespace
    return environment


class JinjaChatTemplate:
    """A model's chat template rendered by Jinja2 (sandboxed, as transformers renders it).

    `format` is the recognised format ("chatml", "llama3", "llama2") when `ChatTemplate.detect`
    knows the template, else "jinja"; `default_system` likewise."""

    def __init__(self, source: str, compiled, bos_token: str = "", eos_token: str = "",
                 recognised: ChatTemplate = None):
        self.source = source
        self.compiled = compiled
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.format = recognised.format if recognised is not None else "jinja"
        self.default_system = recognised.default_system if recognised is not None else None

    def render(self, messages, add_generation_prompt: bool = True, tools: list = None,
               documents: list = None, **variables) -> str:
        """Render `messages` (dicts with role/content, or (role, content) pairs). `tools`
        (JSON schemas) and `documents` (dicts) as apply_chat_template takes them; extra
        `variables` (JSON data) are passed to the template, as its kwargs."""
        from jinja2.exceptions import TemplateError

        context = {"bos_token": self.bos_token, "eos_token": self.eos_token,
                   **_checked_data(variables, "chat template variables"),
                   "messages": _jinja_messages(messages),
                   "tools": _checked_data(tools, "chat template tools"),
                   "documents": _checked_data(documents, "chat template documents"),
                   "add_generation_prompt": bool(add_generation_prompt)}
        try:
            return _bounded_render(self.compiled, context)
        except _StepBudget:
            raise CandleError(f"chat template: rendering took more than {MAX_TEMPLATE_STEPS} "
                              f"steps (a template that loops instead of formatting)") from None
        except TemplateError as exc:
            raise CandleError(f"chat template: {exc}") from None
        except RecursionError:
            raise CandleError("chat template: recursion too deep") from None
        except (TypeError, ValueError, KeyError, IndexError, AttributeError,
                ArithmeticError) as exc:
            raise CandleError(f"chat template: {type(exc).__name__}: {exc}") from None


def _bounded_render(compiled, context: dict) -> str:
    """compiled.render(context), stopped past MAX_TEMPLATE_STEPS trace events or
    MAX_RENDERED_CHARS characters (a trace function is the one bound that works in Pyodide,
    which has no threads or signals to interrupt a loop)."""
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


def load_chat_template(template, bos_token: str = "", eos_token: str = ""):
    """The template to render a model's prompts with: a JinjaChatTemplate when jinja2 is
    there and parses `template`; else the recognised format (ChatTemplate), else a clear
    UnsupportedError (naming jinja2 when it is missing)."""
    if not template or not isinstance(template, str):
        return ChatTemplate.detect(template, bos_token, eos_token)  # raises, naming why
    try:
        recognised = ChatTemplate.detect(template, bos_token, eos_token)
        not_recognised = None
    except UnsupportedError as exc:
        recognised, not_recognised = None, exc
    try:
        import jinja2  # noqa: F401  (optional: the page loads it, natively the chat extra)
    except ImportError:
        if recognised is not None:
            return recognised
        raise UnsupportedError(f"{not_recognised}; {JINJA_HINT}") from None
    from jinja2.exceptions import TemplateSyntaxError

    try:
        compiled = jinja_environment().from_string(template)
    except TemplateSyntaxError as exc:
        if recognised is not None:
            return recognised
        raise UnsupportedError(f"chat template: Jinja syntax error at line {exc.lineno}: "
                               f"{exc.message}") from None
    return JinjaChatTemplate(template, compiled, bos_token, eos_token, recognised)


def chat_template_for(model, tokenizer):
    """The chat template of a loaded model (its `chat_template` source, rendered by Jinja2
    when available), with the BOS/EOS token strings the template may use taken from its
    tokenizer."""

    def token(token_id):
        if token_id is None:
            return ""
        return tokenizer.id_to_token(int(token_id)) or ""

    config = model.config
    eos_ids = tuple(config.eos_token_ids)
    return load_chat_template(model.chat_template, token(config.bos_token_id),
                              token(eos_ids[0] if eos_ids else None))
