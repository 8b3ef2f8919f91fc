"""The tool fields of /v1/chat/completions: `tools`, `tool_choice`, `parallel_tool_calls`, and
what they do to the prompt, the decoding and the answer (generation/tool_calls.py reads and
writes each model family's format).

    tool_choice "none"      the tools are not shown to the model; its answer is text
                "auto"      (the default with tools) shown; the model chooses; calls are read
                            from its answer, nothing is enforced
                "required"  shown, and the answer must begin with a call of one of them
                {"type": "function", "function": {"name": N}}   shown, and must call N
    parallel_tool_calls false: at most one call (enforced for required/named, the first call
    read for auto).

"required" and a named function are enforced by constrained decoding: a structural tag
(generation/grammar.py) whose tags are the format's own call text around each tool's
`parameters` schema, so the model writes its trained format and the arguments match the schema.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from ..core.errors import CandleError
from ..generation.tool_calls import (ToolCall, ToolCallStream, ToolFormat, ToolsUnsupported,
                                     new_call_id, template_messages, tool_format_for)
from . import validation as check
from .errors import bad_request

MAX_TOOLS = 128  # OpenAI's limit
# OpenAI's rule for a function's name.
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
CHOICES = ("none", "auto", "required")
# OpenAI: a function without `parameters` takes none.
NO_PARAMETERS = {"type": "object", "properties": {}}


@dataclass(frozen=True)
class ToolRequest:
    tools: list  # the OpenAI tool objects, as given (the template's `tools`)
    names: tuple
    choice: str  # "none", "auto", "required" or a function's name
    parallel: bool
    format: ToolFormat = None  # None: no call is read (tool_choice "none" and no history)

    @property
    def shown(self) -> bool:
        """Whether the tools are in the prompt and calls are read from the answer."""
        return self.choice != "none" and self.format is not None

    def parse(self, text: str) -> tuple:
        """(content, [ToolCall]) of a whole answer."""
        if not self.shown:
            return text, []
        content, calls = self.format.parse(text, self.names)
        if calls and not self.parallel:
            calls = calls[:1]
        return content, calls


def _tools(body: dict) -> list:
    value = body.get("tools")
    if value is None:
        return []
    if not isinstance(value, list):
        raise bad_request(f"tools: expected an array, got {check.json_type_name(value)}",
                          "tools", "invalid_type")
    if len(value) > MAX_TOOLS:
        raise bad_request(f"tools: at most {MAX_TOOLS} tools, got {len(value)}", "tools")
    seen = set()
    for index, tool in enumerate(value):
        where = f"tools[{index}]"
        if not isinstance(tool, dict):
            raise bad_request(f"{where}: expected an object, got {check.json_type_name(tool)}",
                              where, "invalid_type")
        if tool.get("type") != "function":
            raise bad_request(f"{where}.type: only 'function' tools are supported, got "
                              f"{str(tool.get('type'))[:40]!r}", f"{where}.type",
                              "unsupported_value")
        function = tool.get("function")
        if not isinstance(function, dict):
            raise bad_request(f"{where}.function: expected an object with a name",
                              f"{where}.function", "invalid_type")
        name = function.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            raise bad_request(f"{where}.function.name: expected 1 to 64 letters, digits, _ or -, "
                              f"got {str(name)[:70]!r}", f"{where}.function.name")
        if name in seen:
            raise bad_request(f"{where}.function.name: {name!r} is given twice",
                              f"{where}.function.name")
        seen.add(name)
        for key, kind in (("description", str), ("parameters", dict), ("strict", bool)):
            if function.get(key) is not None and not isinstance(function[key], kind):
                raise bad_request(f"{where}.function.{key}: expected "
                                  f"{check.json_type_name(kind())}", f"{where}.function.{key}",
                                  "invalid_type")
    return value


def _choice(body: dict, names: tuple) -> str:
    value = body.get("tool_choice")
    if value is None:
        return "auto" if names else "none"
    if isinstance(value, str):
        if value not in CHOICES:
            raise bad_request(f"tool_choice: {value[:40]!r} is not one of {', '.join(CHOICES)} "
                              "or a function", "tool_choice")
        choice = value
    elif isinstance(value, dict) and value.get("type") == "function":
        function = value.get("function")
        choice = function.get("name") if isinstance(function, dict) else None
        if not isinstance(choice, str):
            raise bad_request("tool_choice.function.name: a required string is missing",
                              "tool_choice.function.name", "missing_required")
        if choice not in names:
            raise bad_request(f"tool_choice.function.name: {choice[:70]!r} is not one of the "
                              "tools", "tool_choice.function.name")
    else:
        raise bad_request("tool_choice: expected 'none', 'auto', 'required' or "
                          "{\"type\": \"function\", \"function\": {\"name\": ...}}",
                          "tool_choice", "invalid_type")
    if choice != "none" and not names:
        raise bad_request(f"tool_choice: {choice!r} needs tools", "tool_choice")
    return choice


def parse(body: dict, messages: list, template, model: str):
    """The request's ToolRequest, or None when it has no tools and no tool turns. A model whose
    template has no tool format is refused naming it (400, param `tools` or `messages`)."""
    for legacy in ("functions", "function_call"):  # ignored, the model would answer without
        if body.get(legacy) is not None:
            raise bad_request(f"{legacy}: OpenAI's deprecated function fields are not supported "
                              "here; use tools and tool_choice", legacy, "unsupported_value")
    tools = _tools(body)
    names = tuple(tool["function"]["name"] for tool in tools)
    choice = _choice(body, names)
    parallel = check.boolean(body, "parallel_tool_calls", default=True)
    history = any(message.get("tool_calls") or message["role"] == "tool"
                  for message in messages)
    if not tools and not history:
        return None
    tool_format = None
    if choice != "none" or history:
        try:
            tool_format = tool_format_for(template, model)
        except ToolsUnsupported as error:
            param = "tools" if choice != "none" else "messages"
            raise bad_request(f"{param}: {error}", param, "model_not_supported") from None
    return ToolRequest(tools, names, choice, parallel, tool_format)


def render(template, messages: list, tools) -> str:
    """The prompt: the messages (tool turns included) and, when shown, the tools, through the
    model's own template."""
    if tools is None:
        return template.render(messages)
    try:
        return template.render(template_messages(messages, tools.format),
                               tools=tools.tools if tools.shown else None)
    except CandleError as error:  # the template's own refusal (raise_exception)
        raise bad_request(f"messages: the model's chat template refused them: {error}",
                          "messages", "invalid_value") from None


def constraint(tools):
    """The structural tag enforcing tool_choice "required" or a named function; None for
    "auto", "none" and no tools."""
    if tools is None or not tools.shown or tools.choice == "auto":
        return None
    from ..generation.grammar import Constraint, GrammarError, TagBody  # noqa: PLC0415

    tags = []
    for index, tool in enumerate(tools.tools):
        function = tool["function"]
        if tools.choice not in ("required", function["name"]):
            continue
        schema = function.get("parameters") or NO_PARAMETERS
        tags.extend((index, TagBody(begin, schema, end))
                    for begin, end in tools.format.call_tags(function["name"]))
    triggers = tools.format.triggers
    try:
        return Constraint.structural_tag([tag for _, tag in tags], triggers, at_least_one=True,
                                         stop_after_first=not tools.parallel)
    except GrammarError as error:
        # Name the tool whose schema cannot be enforced.
        for index, tag in tags:
            try:
                Constraint.structural_tag([tag], triggers, at_least_one=True)
            except GrammarError:
                param = f"tools[{index}].function.parameters"
                raise bad_request(f"{param}: {error}", param, "unsupported_value") from None
        raise


def message(text: str, tools) -> tuple:
    """(the chat message's content and tool_calls fields, the finish reason it forces or None)
    of a whole answer."""
    if tools is None:
        return {"content": text}, None
    content, calls = tools.parse(text)
    if not calls:
        return {"content": text}, None
    return {"content": content, "tool_calls": [openai_call(call) for call in calls]}, \
        "tool_calls"


def openai_call(call: ToolCall, call_id: str = None) -> dict:
    return {"id": call_id or new_call_id(), "type": "function",
            "function": {"name": call.name, "arguments": call.arguments}}


def with_constraint(options: list, tools) -> list:
    """The choices' GenerationOptions under the constraint tool_choice needs (a 400 when
    response_format asks for another one)."""
    required = constraint(tools)
    if required is None:
        return options
    if options[0].constraint is not None:
        raise bad_request(f"response_format: cannot be combined with tool_choice "
                          f"{tools.choice!r} (both constrain the answer)", "response_format")
    return [dataclasses.replace(choice, constraint=required) for choice in options]


def stream_reader(tools):
    """A ToolCallStream for one streamed choice, or None when no call is read."""
    if tools is None or not tools.shown:
        return None
    return ToolCallStream(tools.format, tools.names, max_calls=None if tools.parallel else 1)
