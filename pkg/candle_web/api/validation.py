"""Checks for the fields of API requests: each failure is an ApiError (400) whose message and
`param` name the field, e.g. "max_tokens: expected an integer, got a string ('10')"."""

from __future__ import annotations

import json
import math

from .errors import ApiError, bad_request

_JSON_NAMES = {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
               list: "an array", dict: "an object", type(None): "null"}


def json_type_name(value) -> str:
    return _JSON_NAMES.get(type(value), type(value).__name__)


def _describe(value) -> str:
    text = repr(value)
    return json_type_name(value) + (f" ({text[:40]})" if not isinstance(value, (list, dict)) else "")


def require_object(body, what: str = "the request body") -> dict:
    if not isinstance(body, dict):
        raise bad_request(f"{what} must be a JSON object, got {json_type_name(body)}",
                          code="invalid_type")
    return body


def string(body: dict, name: str, *, required: bool = False, default=None, choices=None,
           max_length: int = None):
    value = body.get(name, None)
    if value is None:
        if required:
            raise bad_request(f"{name}: a required field is missing", name, "missing_required")
        return default
    if not isinstance(value, str):
        raise bad_request(f"{name}: expected a string, got {_describe(value)}", name,
                          "invalid_type")
    if choices is not None and value not in choices:
        raise bad_request(f"{name}: {value[:40]!r} is not one of {', '.join(choices)}", name)
    if max_length is not None and len(value) > max_length:
        raise bad_request(f"{name}: longer than {max_length} characters", name,
                          "string_above_max_length")
    return value


def integer(body: dict, name: str, *, default=None, minimum: int = None, maximum: int = None,
            maximum_reason: str = ""):
    value = body.get(name, None)
    if value is None:
        return default
    # JSON has one number type: 3.0 is accepted as 3 (as OpenAI does), True is not a number.
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad_request(f"{name}: expected an integer, got {_describe(value)}", name,
                          "invalid_type")
    if minimum is not None and value < minimum:
        raise bad_request(f"{name}: {value} is below the minimum {minimum}", name,
                          "integer_below_min_value")
    if maximum is not None and value > maximum:
        raise bad_request(f"{name}: {value} is above the maximum {maximum}{maximum_reason}",
                          name, "integer_above_max_value")
    return value


def number(body: dict, name: str, *, default=None, minimum: float = None, maximum: float = None,
           open_minimum: bool = False):
    value = body.get(name, None)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise bad_request(f"{name}: expected a finite number, got {_describe(value)}", name,
                          "invalid_type")
    value = float(value)
    if minimum is not None and (value <= minimum if open_minimum else value < minimum):
        bound = f"above {minimum:g}" if open_minimum else f"at least {minimum:g}"
        raise bad_request(f"{name}: {value:g} must be {bound}", name, "decimal_below_min_value")
    if maximum is not None and value > maximum:
        raise bad_request(f"{name}: {value:g} is above the maximum {maximum:g}", name,
                          "decimal_above_max_value")
    return value


def boolean(body: dict, name: str, *, default: bool = False) -> bool:
    value = body.get(name, None)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise bad_request(f"{name}: expected a boolean, got {_describe(value)}", name,
                          "invalid_type")
    return value


def unsupported_unless(body: dict, name: str, allowed) -> None:
    """A field the API does not implement is accepted only at its neutral value(s)."""
    value = body.get(name, None)
    if value is not None and value not in allowed:
        raise ApiError(400, f"{name}: {_describe(value)} is not supported here (only "
                            f"{', '.join(map(repr, allowed))})", param=name, code="unsupported_value")


def stop_strings(body: dict, name: str = "stop", max_count: int = 4, max_length: int = 256):
    value = body.get(name, None)
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(item, str) for item in items):
        raise bad_request(f"{name}: expected a string or an array of strings, got "
                          f"{_describe(value)}", name, "invalid_type")
    if len(items) > max_count:
        raise bad_request(f"{name}: at most {max_count} stop strings, got {len(items)}", name)
    for item in items:
        if not item:
            raise bad_request(f"{name}: a stop string is empty", name)
        if len(item) > max_length:
            raise bad_request(f"{name}: a stop string is longer than {max_length} characters",
                              name)
    return tuple(items)


def text_content(content, param: str) -> str:
    """A message's content: a string, or an array of {"type": "text", "text": ...} parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        pieces = []
        for index, part in enumerate(content):
            where = f"{param}[{index}]"
            if not isinstance(part, dict) or part.get("type") != "text":
                kind = part.get("type") if isinstance(part, dict) else json_type_name(part)
                raise bad_request(f"{where}: only text parts are supported, got {kind!r}", where,
                                  "unsupported_value")
            if not isinstance(part.get("text"), str):
                raise bad_request(f"{where}.text: expected a string", f"{where}.text",
                                  "invalid_type")
            pieces.append(part["text"])
        return "".join(pieces)
    raise bad_request(f"{param}: expected a string or an array of text parts, got "
                      f"{_describe(content)}", param, "invalid_type")


ROLES = ("system", "developer", "user", "assistant", "tool")


def _nested_string(obj: dict, key: str, where: str, **options):
    """`string` for a field inside the body: errors name its whole path."""
    return string({f"{where}.{key}": obj.get(key)}, f"{where}.{key}", **options)


def _tool_calls(message: dict, where: str) -> list:
    """An assistant message's `tool_calls` as OpenAI sends them back: [{"id", "type":
    "function", "function": {"name", "arguments": JSON text of an object}}]."""
    value = message.get("tool_calls")
    if value is None:
        return []
    if not isinstance(value, list):
        raise bad_request(f"{where}.tool_calls: expected an array, got {_describe(value)}",
                          f"{where}.tool_calls", "invalid_type")
    calls = []
    for index, call in enumerate(value):
        here = f"{where}.tool_calls[{index}]"
        if not isinstance(call, dict):
            raise bad_request(f"{here}: expected an object, got {_describe(call)}", here,
                              "invalid_type")
        _nested_string(call, "type", here, choices=("function",))
        call_id = _nested_string(call, "id", here, required=True)
        function = call.get("function")
        if not isinstance(function, dict):
            raise bad_request(f"{here}.function: expected an object with name and arguments",
                              f"{here}.function", "invalid_type")
        name = _nested_string(function, "name", f"{here}.function", required=True)
        arguments = _nested_string(function, "arguments", f"{here}.function", required=True)
        try:
            decoded = json.loads(arguments)
        except ValueError:
            decoded = None
        if not isinstance(decoded, dict):
            raise bad_request(f"{here}.function.arguments: expected the JSON text of an object, "
                              f"got {arguments[:40]!r}", f"{here}.function.arguments",
                              "invalid_value")
        calls.append({"id": call_id, "type": "function",
                      "function": {"name": name, "arguments": arguments}})
    return calls


def messages(body: dict, max_count: int = 1024) -> list:
    value = body.get("messages", None)
    if value is None:
        raise bad_request("messages: a required field is missing", "messages",
                          "missing_required")
    if not isinstance(value, list):
        raise bad_request(f"messages: expected an array, got {_describe(value)}", "messages",
                          "invalid_type")
    if not value:
        raise bad_request("messages: the array is empty", "messages", "empty_array")
    if len(value) > max_count:
        raise bad_request(f"messages: at most {max_count} messages", "messages")
    out = []
    for index, message in enumerate(value):
        where = f"messages[{index}]"
        if not isinstance(message, dict):
            raise bad_request(f"{where}: expected an object, got {_describe(message)}", where,
                              "invalid_type")
        role = message.get("role")
        if role not in ROLES:
            raise bad_request(f"{where}.role: expected one of {', '.join(ROLES)}, got "
                              f"{_describe(role)}", f"{where}.role")
        calls = _tool_calls(message, where) if role == "assistant" else []
        # An assistant turn that only called tools has no content (OpenAI sends null).
        content = message.get("content")
        content = (None if content is None and calls
                   else text_content(content, f"{where}.content"))
        # "developer" is OpenAI's newer name for the system message.
        item = {"role": "system" if role == "developer" else role, "content": content}
        if calls:
            item["tool_calls"] = calls
        if role == "tool":
            item["tool_call_id"] = _nested_string(message, "tool_call_id", where, required=True)
        if isinstance(message.get("name"), str) and role in ("tool", "user", "assistant"):
            item["name"] = message["name"]
        out.append(item)
    return out


def response_format(body: dict, name: str = "response_format"):
    """OpenAI's `response_format` as a generation.grammar.Constraint (None for "text" or
    absent): a wrong type is a 400 naming the field, a schema keyword the grammar engines
    cannot enforce a 400 `unsupported_schema_feature` naming each keyword and where it is."""
    from ..generation.grammar import Constraint, GrammarError, UnsupportedSchema  # noqa: PLC0415

    try:
        return Constraint.from_response_format(body.get(name), name)
    except UnsupportedSchema as error:
        raise ApiError(400, f"{getattr(error, 'param', name)}: {error}",
                       param=getattr(error, "param", name),
                       code="unsupported_schema_feature") from None
    except GrammarError as error:
        raise bad_request(str(error), getattr(error, "param", name)) from None


def compile_constraint(tokenizer, constraint, vocab_size: int, stop_token_ids,
                       name: str = "response_format") -> None:
    """Compile the request's grammar now (run it off the event loop): what the engine refuses
    (a pattern it cannot read, say) is a 400 before the request queues, and the scheduler
    thread then finds the grammar compiled. A server without the grammar extra answers 501
    saying how to install it."""
    from ..core.errors import BackendUnavailable  # noqa: PLC0415
    from ..generation.grammar import GrammarError, grammar_row  # noqa: PLC0415

    try:
        grammar_row(tokenizer, constraint, vocab_size, stop_token_ids)
    except GrammarError as error:
        raise bad_request(f"{name}: {error}", name) from None
    except BackendUnavailable as error:
        raise ApiError(501, str(error), param=name, code="not_implemented") from None
