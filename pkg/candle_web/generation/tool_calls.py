"""Tool calls (OpenAI's `tools`) through the model's own chat template.

The tools reach the prompt the way transformers' `apply_chat_template(tools=...)` puts them
there: the OpenAI tool objects, as given, are the template's `tools` variable, and earlier turns
(an assistant message's `tool_calls`, `tool` messages with the results) are messages the template
renders. The model then answers in its family's format, which `ToolFormat` reads back:

    hermes       <tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>  (Qwen2.5, Hermes)
    llama3_json  {"name": ..., "parameters": {...}}   (Llama 3.1 / 3.2 / 3.3, custom tools)
    mistral      [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]   (Mistral Nemo, Small)

Small models do not always write their format's tags: Qwen2.5-Coder-0.5B answers with the bare
`{"name": ..., "arguments": ...}` object, sometimes inside a ```json fence (llama.cpp's Hermes
reader accepts these forms too). So a whole answer that is such an object, or a list of them,
fenced or not, is read as calls in every format. A call counts only when it names one of the
offered tools with an object of arguments; anything else stays the answer's text.

Which format a template has is read from its source (the marker each family's template
writes), and confirmed by rendering a probe tool: a template that never shows its tools has no
tool format, and asking it for tools is refused naming the model (`ToolsUnsupported`).

`ToolCallStream` reads an answer token by token for a streamed response: text streams as text
until a call may be starting; a call behind its format's marker goes out as OpenAI streams it
(its id, type and name with arguments "", then pieces of the arguments as they are generated);
a bare object is held to the end (text after it may make the whole answer text), when the
whole answer is read again by `ToolFormat.parse`, so the stream and the plain answer agree.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import string
import weakref
from dataclasses import dataclass

from ..core.errors import UnsupportedError

__all__ = ["HERMES", "LLAMA3_JSON", "MISTRAL", "ToolCall", "ToolCallStream", "ToolFormat",
           "ToolsUnsupported", "new_call_id", "template_messages", "tool_format_for",
           "tool_names"]


class ToolsUnsupported(UnsupportedError):
    """The model's chat template has no tool-call format (or tools need Jinja2)."""


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # JSON text of an object, as OpenAI's `function.arguments`


_ID_ALPHABET = string.ascii_letters + string.digits
_DECODER = json.JSONDecoder()
# A call's opening up to where its arguments object starts; the name must be complete.
_CALL_HEAD = re.compile(r'\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"(?:arguments|parameters)"'
                        r'\s*:\s*(?=\{)')
_FENCE = re.compile(r"^\s*```(?:json)?\s*\n?(.*?)\n?\s*```\s*$", re.DOTALL)


def new_call_id() -> str:
    """OpenAI's shape: 'call_' and 24 random letters and digits."""
    return "call_" + "".join(secrets.choice(_ID_ALPHABET) for _ in range(24))


@dataclass(frozen=True)
class ToolFormat:
    name: str
    start: str = None  # the marker that opens the calls (None: bare JSON is the format)
    end: str = None  # the marker that closes one call (None: no closing marker)
    # How constrained decoding writes one call: (the text before its arguments object, "%s"
    # the tool's name; the text after it; the trigger that opens it), the format's own form
    # first. Each format also takes the bare object its reader accepts, as small models write
    # it: forced into the tagged form the model's next tokens are out of its habit
    # (Qwen2.5-Coder-0.5B, made to write '<tool_call>', spelled it '<', 'tool', '_', 'call'
    # and called again and again until its token limit).
    call_forms: tuple = ()

    def call_tags(self, name: str) -> list:
        """[(begin, end)] of one call of `name` in each of the call forms."""
        quoted = json.dumps(name)[1:-1]
        return [(begin % quoted, end) for begin, end, _ in self.call_forms]

    @property
    def triggers(self) -> list:
        return [trigger for _, _, trigger in self.call_forms]

    def parse(self, text: str, names) -> tuple:
        """(content, calls) of a whole answer: the text outside the calls (None when there is
        none), and the ToolCalls naming one of `names`."""
        names = frozenset(names)
        if self.start and self.start in text:
            # Each marked call on its own: one that does not read stays text where it was.
            before, _, rest = text.partition(self.start)
            calls, kept = [], [before]
            for block in rest.split(self.start):
                body, _, after = block.partition(self.end) if self.end else (block, "", "")
                found = _calls_in(body, names)
                if found is None:
                    kept.append(self.start + block)
                else:
                    calls.extend(found)
                    kept.append(after)
            return _content("".join(kept).strip() if calls else text), calls
        found = _calls_in(text, names)
        if found:
            return None, found
        return _content(text), []

    def opens_call(self, text: str) -> bool:
        """Whether `text`, the start of an answer, opens what may be calls."""
        stripped = text.lstrip()
        return bool(stripped) and any(stripped.startswith(opener) for opener in self._openers())

    def may_open_call(self, text: str) -> bool:
        """Whether `text`, the start of an answer, may still open calls (wait for more)."""
        stripped = text.lstrip()
        return any(stripped.startswith(opener) or opener.startswith(stripped)
                   for opener in self._openers())

    def _openers(self) -> list:
        return ["{", "[", "```json", "```\n{"] + ([self.start] if self.start else [])


_BARE_CALL = ('{"name": "%s", "arguments": ', "}", '{"name": ')
HERMES = ToolFormat("hermes", "<tool_call>", "</tool_call>", (
    ('<tool_call>\n{"name": "%s", "arguments": ', "}\n</tool_call>", "<tool_call>"),
    _BARE_CALL))
LLAMA3_JSON = ToolFormat("llama3_json", "<|python_tag|>", None, (
    ('{"name": "%s", "parameters": ', "}", '{"name": '),))
MISTRAL = ToolFormat("mistral", "[TOOL_CALLS]", None, (
    ('[TOOL_CALLS][{"name": "%s", "arguments": ', "}]", "[TOOL_CALLS]"), _BARE_CALL))
FORMATS = (HERMES, LLAMA3_JSON, MISTRAL)


def _content(text: str):
    return text if text.strip() else None


def _calls_in(body: str, names) -> list:
    """The calls in `body` (one JSON object, a list of them, or several objects one after
    another, optionally in a ```json fence); None when it is not that, or a call names a tool
    not offered or has no object of arguments."""
    fenced = _FENCE.match(body)
    if fenced:
        body = fenced.group(1)
    items = _json_items(body)
    if not items:
        return None
    calls = [_call_from(value, raw, names) for value, raw in items]
    return None if None in calls else calls


def _json_items(body: str):
    """[(value, its text)] of the JSON values in `body`, a top-level list's elements taken one
    by one; None when something in it is not JSON."""
    items, position, depth = [], 0, 0
    while True:
        while position < len(body) and body[position] in " \t\r\n;,":
            position += 1
        if position == len(body):
            return items if depth == 0 else None
        if body[position] == "[" and depth == 0:
            position, depth = position + 1, 1
            continue
        if body[position] == "]" and depth == 1:
            position, depth = position + 1, 0
            continue
        try:
            value, end = _DECODER.raw_decode(body, position)
        except ValueError:
            return None
        items.append((value, body[position:end]))
        position = end


def _call_from(value, raw, names):
    if not isinstance(value, dict) or value.get("name") not in names:
        return None
    arguments = value.get("arguments", value.get("parameters", {}))
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        try:
            decoded = json.loads(arguments)
        except ValueError:
            return None
        return ToolCall(value["name"], arguments) if isinstance(decoded, dict) else None
    if not isinstance(arguments, dict):
        return None
    return ToolCall(value["name"], _raw_arguments(raw) or json.dumps(arguments,
                                                                     ensure_ascii=False))


def _raw_arguments(raw):
    """The arguments object as the model wrote it (what a stream sent), when the call opens
    with its name then its arguments."""
    if raw is None:
        return None
    head = _CALL_HEAD.match(raw)
    if head is None:
        return None
    _, end = _DECODER.raw_decode(raw, head.end())
    return raw[head.end():end]


# -- which format a template has ------------------------------------------------------------

_PROBE_TOOL = {"type": "function", "function": {
    "name": "candle_web_probe_tool", "description": "Finds whether the template shows tools.",
    "parameters": {"type": "object", "properties": {}}}}
_FORMATS_OF = weakref.WeakKeyDictionary()


# A JSON call's "name" key as templates write it ('{"name": ' or '{\\"name\\": ').
_JSON_NAME_KEY = re.compile(r'\\?"name\\?"\s*:')


def _format_from_source(source: str):
    """The format whose marker the template writes; None for none of them (XML-style calls,
    as Qwen3-Coder's '<tool_call><function=...>', and Mistral's newer 'name[ARGS]{...}' are
    other formats)."""
    if "<tool_call>" in source and _JSON_NAME_KEY.search(source):
        return HERMES
    if "[TOOL_CALLS]" in source and "[ARGS]" not in source:
        return MISTRAL
    if "<|start_header_id|>" in source and '"parameters"' in source:
        return LLAMA3_JSON
    return None


def tool_format_for(template, model: str) -> ToolFormat:
    """The tool-call format of `template` (a loaded chat template), or ToolsUnsupported naming
    `model`. Found once per template."""
    from .chat_templates import JinjaChatTemplate  # noqa: PLC0415

    if not isinstance(template, JinjaChatTemplate):
        raise ToolsUnsupported(f"{model}: tools need the model's own chat template rendered by "
                               "Jinja2 (pip install 'candle-web[chat]')")
    if template not in _FORMATS_OF:
        found = _format_from_source(template.source)
        if found is not None:
            try:
                shown = template.render([{"role": "user", "content": "Hello"}],
                                        tools=[_PROBE_TOOL])
            except Exception:  # noqa: BLE001  (a template that cannot show a tool has none)
                shown = ""
            if _PROBE_TOOL["function"]["name"] not in shown:
                found = None
        _FORMATS_OF[template] = found
    found = _FORMATS_OF[template]
    if found is None:
        raise ToolsUnsupported(f"{model}: this model's chat template has no tool-call format "
                               f"candle-web reads ({', '.join(f.name for f in FORMATS)}): it "
                               "does not show tools to the model, or writes calls otherwise")
    return found


def tool_names(tools) -> list:
    return [tool["function"]["name"] for tool in tools]


# -- the conversation as the template sees it -----------------------------------------------

def _mistral_id(call_id: str) -> str:
    """Mistral's templates take 9 letters and digits as a call's id: the same id for the call
    and its result, made from the id the client holds (an OpenAI-shaped 'call_...')."""
    if len(call_id) == 9 and call_id.isalnum():
        return call_id
    digest = hashlib.sha256(call_id.encode("utf-8")).digest()
    return "".join(_ID_ALPHABET[byte % len(_ID_ALPHABET)] for byte in digest[:9])


def template_messages(messages, tool_format: ToolFormat = None) -> list:
    """The validated API messages as chat templates expect them (as transformers' docs and
    vLLM give them): a call's arguments as an object, not OpenAI's JSON text; for Mistral,
    the ids its template accepts."""
    out = []
    for message in messages:
        message = dict(message)
        if message.get("tool_calls"):
            calls = []
            for call in message["tool_calls"]:
                function = dict(call["function"])
                function["arguments"] = json.loads(function["arguments"])
                call = {**call, "function": function}
                if tool_format is MISTRAL:
                    call["id"] = _mistral_id(call["id"])
                calls.append(call)
            message["tool_calls"] = calls
        if tool_format is MISTRAL and message.get("tool_call_id"):
            message["tool_call_id"] = _mistral_id(message["tool_call_id"])
        out.append(message)
    return out


# -- reading a streamed answer --------------------------------------------------------------

class ToolCallStream:
    """The deltas of a streamed chat answer that may call tools. `feed(text)` and `finish()`
    return lists of OpenAI delta objects: {"content": ...} or {"tool_calls": [...]}; `calls`
    holds the ToolCalls sent (for the finish reason)."""

    def __init__(self, tool_format: ToolFormat, names, new_id=new_call_id, max_calls=None):
        self.format, self.names, self.new_id = tool_format, frozenset(names), new_id
        self.max_calls = max_calls  # parallel_tool_calls false: 1
        self.text = ""
        self.sent_content = 0  # characters of `text` sent as content
        self.calls_from = None  # where the calls begin in `text` (None: not yet)
        self.sent = []  # [id, name, arguments sent] per call streamed
        self.calls = []

    def feed(self, piece: str) -> list:
        self.text += piece
        if self.calls_from is None:
            start = self._calls_start()
            if start is None:
                return self._content_upto(self._safe_content_end())
            self.calls_from = start
            deltas = self._content_upto(start)
        else:
            deltas = []
        return deltas + self._stream_calls()

    def finish(self) -> list:
        content, calls = self.format.parse(self.text, self.names)
        calls = calls[:self.max_calls]
        if not calls:
            if self.sent:  # a call went out whose end is malformed: it stays a call
                self.calls = [ToolCall(name, arguments) for _, name, arguments in self.sent]
                return []
            return self._content_upto(len(self.text))  # what was held back is text
        deltas = []
        # Text beside the calls that has not gone out (after them, or a call that did not read).
        sent_text = self.text[:self.sent_content].strip()
        if content and content.startswith(sent_text) and content[len(sent_text):].strip():
            deltas.append({"content": content[len(sent_text):]})
        for index, call in enumerate(calls):
            if index == len(self.sent):
                deltas.append(self._head(index, call.name))
            sent = self.sent[index][2]
            if call.arguments.startswith(sent) and len(call.arguments) > len(sent):
                deltas.append(self._arguments(index, call.arguments[len(sent):]))
                self.sent[index][2] = call.arguments
        self.calls = calls
        return deltas

    # -- helpers --
    def _calls_start(self):
        """Where a call begins in the text so far, or None while the text is plain."""
        if self.sent_content == 0 and self.format.opens_call(self.text):
            return len(self.text) - len(self.text.lstrip())
        if self.format.start and self.format.start in self.text:
            return self.text.index(self.format.start)
        return None

    def _safe_content_end(self) -> int:
        """Text may go out up to here: not a start that may still become a call."""
        if self.sent_content == 0 and self.format.may_open_call(self.text):
            return 0
        return _before_partial(self.text, self.format.start)

    def _content_upto(self, end: int) -> list:
        piece = self.text[self.sent_content:end]
        self.sent_content = max(self.sent_content, end)
        return [{"content": piece}] if piece else []

    def _stream_calls(self) -> list:
        """Heads and argument pieces of the marked calls written so far (an arguments object
        that is not closed yet is all arguments: nothing to hold back). A marked call whose
        JSON then breaks off has gone out as a call: the stream cannot take it back."""
        region = self.text[self.calls_from:]
        if not (self.format.start and region.startswith(self.format.start)):
            # A bare object may yet be followed by text that makes the answer text (a small
            # model's call, then the result it imagines): it is read once the answer ends.
            return []
        deltas, position, index = [], 0, 0
        while True:
            head = _CALL_HEAD.search(region, position)
            if head is None or head.group(1) not in self.names or index == self.max_calls:
                break
            try:
                _, end = _DECODER.raw_decode(region, head.end())
                arguments, closed = region[head.end():end], True
            except ValueError:
                arguments, closed, end = self._open_arguments(region, head.end())
            if index == len(self.sent):
                deltas.append(self._head(index, head.group(1)))
            sent = self.sent[index][2]
            if arguments.startswith(sent) and len(arguments) > len(sent):
                deltas.append(self._arguments(index, arguments[len(sent):]))
                self.sent[index][2] = arguments
            if not closed:
                break
            position, index = end, index + 1
        return deltas

    def _open_arguments(self, region: str, start: int) -> tuple:
        """(the arguments so far, whether the call is over, where it ends) of a call whose
        arguments object is not closed: over, broken, at its end marker; else going on, less
        a tail that may be the start of the end marker."""
        rest, marker = region[start:], self.format.end
        if marker and marker in rest:
            cut = rest.index(marker)
            return rest[:cut].rstrip(), True, start + cut + len(marker)
        return rest[:_before_partial(rest, marker)].rstrip(), False, len(region)

    def _head(self, index: int, name: str) -> dict:
        self.sent.append([self.new_id(), name, ""])
        return {"tool_calls": [{"index": index, "id": self.sent[index][0], "type": "function",
                                "function": {"name": name, "arguments": ""}}]}

    @staticmethod
    def _arguments(index: int, piece: str) -> dict:
        return {"tool_calls": [{"index": index, "function": {"arguments": piece}}]}


def _before_partial(text: str, marker: str) -> int:
    """Where a tail of `text` that may be the start of `marker` begins (len(text) if none)."""
    if marker:
        for keep in range(min(len(marker) - 1, len(text)), 0, -1):
            if marker.startswith(text[-keep:]):
                return len(text) - keep
    return len(text)
