"""Tool calls through models' own chat templates (generation/tool_calls.py).

References: transformers' `render_jinja_template` (what `apply_chat_template(tools=...)`
renders with) on the real templates of Qwen2.5, Llama 3.1/3.2/3.3 and Mistral Nemo from
llama.cpp's `models/templates/` (the registry's `llama-cpp-test-data`): the same conversation
with tools, an assistant turn that called tools and the tool results must render to the same
text. The readers are checked against the templates too: a call the template itself writes
into an assistant turn (what the model was trained to write) must be read back as that call,
whole and fed in pieces as a stream."""

from __future__ import annotations

import json

import pytest

from candle_web.generation.chat_templates import load_chat_template
from candle_web.generation.tool_calls import (HERMES, LLAMA3_JSON, MISTRAL, ToolCall,
                                              ToolCallStream, ToolsUnsupported,
                                              template_messages, tool_format_for)

pytest.importorskip("jinja2")

MODEL = "llama-cpp-test-data"
BOS, EOS = "<s>", "</s>"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city",
    "parameters": {"type": "object", "required": ["city"],
                   "properties": {"city": {"type": "string", "description": "The city"},
                                  "unit": {"type": "string", "enum": ["C", "F"]}}}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The local time in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
# Mistral's templates take 9-character ids; the others any.
CALL_IDS = ["abcDEF123", "xyz987UVW"]
TEMPLATES = {  # template file -> (its format, the text that ends an assistant turn)
    "Qwen-Qwen2.5-7B-Instruct.jinja": (HERMES, "<|im_end|>\n"),
    "meta-llama-Llama-3.1-8B-Instruct.jinja": (LLAMA3_JSON, "<|eot_id|>"),
    "meta-llama-Llama-3.2-3B-Instruct.jinja": (LLAMA3_JSON, "<|eot_id|>"),
    "meta-llama-Llama-3.3-70B-Instruct.jinja": (LLAMA3_JSON, "<|eot_id|>"),
    "mistralai-Mistral-Nemo-Instruct-2407.jinja": (MISTRAL, EOS),
}
# Llama 3.x's templates take one call per assistant turn.
SINGLE_CALL = {name for name, (fmt, _) in TEMPLATES.items() if fmt is LLAMA3_JSON}


def openai_call(index: int, name: str, arguments: dict) -> dict:
    """A call as an OpenAI client sends it back: arguments as JSON text."""
    return {"id": CALL_IDS[index], "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments)}}


def conversation(calls: list) -> list:
    """system + user, the assistant's calls (content null, as OpenAI sends it), their
    results."""
    return ([{"role": "system", "content": "You are terse."},
             {"role": "user", "content": "Weather and time in Paris?"},
             {"role": "assistant", "content": None, "tool_calls": calls}]
            + [{"role": "tool", "tool_call_id": call["id"],
                "content": json.dumps({"result": index})} for index, call in enumerate(calls)])


def transformers_messages(messages: list) -> list:
    """The same conversation in the shape transformers' docs give templates: a call's
    arguments as an object (OpenAI's JSON text decoded), None values left out."""
    out = []
    for message in messages:
        message = {key: value for key, value in message.items() if value is not None}
        if "tool_calls" in message:
            message["tool_calls"] = [
                {**call, "function": {**call["function"],
                                      "arguments": json.loads(call["function"]["arguments"])}}
                for call in message["tool_calls"]]
        out.append(message)
    return out


def transformers_render(source: str, messages: list, tools, add_generation_prompt=True) -> str:
    from transformers.utils.chat_template_utils import render_jinja_template

    rendered, _ = render_jinja_template([messages], tools=tools, chat_template=source,
                                        add_generation_prompt=add_generation_prompt,
                                        bos_token=BOS, eos_token=EOS)
    return rendered[0]


@pytest.fixture(scope="module")
def sources(model_file):
    return {name: model_file(MODEL, f"templates/{name}").read_text(encoding="utf-8")
            for name in TEMPLATES}


def calls_for(name: str) -> list:
    calls = [openai_call(0, "get_weather", {"city": "Paris", "unit": "C"}),
             openai_call(1, "get_time", {"city": "Paris"})]
    return calls[:1] if name in SINGLE_CALL else calls


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_the_template_format_is_recognised(name, sources):
    template = load_chat_template(sources[name], BOS, EOS)
    assert tool_format_for(template, "some-model") is TEMPLATES[name][0]


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_tools_and_tool_turns_render_as_transformers(name, sources):
    pytest.importorskip("transformers")
    template = load_chat_template(sources[name], BOS, EOS)
    messages = conversation(calls_for(name))
    rendered = template.render(template_messages(messages, TEMPLATES[name][0]),
                               tools=[WEATHER, TIME])
    expected = transformers_render(sources[name], transformers_messages(messages),
                                   [WEATHER, TIME])
    assert rendered == expected
    assert "get_time" in rendered and "result" in rendered  # the tools and results are shown


def test_mistral_ids_are_made_to_fit_its_template(sources):
    """OpenAI-shaped ids ('call_' + 24) would make Mistral's template refuse the turn: each is
    given the same 9-character id in the call and in its result."""
    name = "mistralai-Mistral-Nemo-Instruct-2407.jinja"
    template = load_chat_template(sources[name], BOS, EOS)
    messages = conversation([dict(openai_call(0, "get_weather", {"city": "Oslo"}),
                                  id="call_a1B2c3D4e5F6g7H8i9J0k1L2")])
    messages[-1]["tool_call_id"] = "call_a1B2c3D4e5F6g7H8i9J0k1L2"
    shown = template_messages(messages, MISTRAL)
    short = shown[2]["tool_calls"][0]["id"]
    assert len(short) == 9 and short.isalnum() and shown[3]["tool_call_id"] == short
    rendered = template.render(shown, tools=[WEATHER])
    assert f'"id": "{short}"' in rendered and f'"call_id": "{short}"' in rendered


def answer_as_trained(source: str, calls: list, end: str) -> str:
    """The assistant turn the template itself writes for `calls`: what the model learned to
    write after its generation prompt, up to the end of its turn."""
    # No system message: Mistral's template moves it to the last user turn.
    messages = transformers_messages(conversation(calls)[1:3])
    prompt = transformers_render(source, messages[:1], [WEATHER, TIME])
    whole = transformers_render(source, messages, [WEATHER, TIME], add_generation_prompt=False)
    assert whole.startswith(prompt)
    answer = whole[len(prompt):]
    assert answer.endswith(end)
    return answer[:-len(end)]


def streamed(tool_format, text: str, step: int, names=("get_weather", "get_time")):
    """(content, {index: [id, name, arguments]}, the deltas) from feeding `text` in pieces of
    `step` characters, as OpenAI clients put the deltas together."""
    reader = ToolCallStream(tool_format, names)
    deltas = []
    for start in range(0, len(text), step):
        deltas += reader.feed(text[start:start + step])
    deltas += reader.finish()
    content, calls = "", {}
    for delta in deltas:
        content += delta.get("content", "")
        for piece in delta.get("tool_calls", []):
            if "id" in piece:  # the first piece of a call: id, type and name, arguments ""
                assert piece["index"] not in calls
                assert piece["type"] == "function" and piece["function"]["arguments"] == ""
                assert piece["id"].startswith("call_") and len(piece["id"]) == 29
                calls[piece["index"]] = [piece["id"], piece["function"]["name"], ""]
            else:  # later pieces: arguments only
                assert set(piece) == {"index", "function"}
                assert set(piece["function"]) == {"arguments"}
                calls[piece["index"]][2] += piece["function"]["arguments"]
    return content, calls, reader


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_calls_the_template_writes_are_read_back(name, sources):
    pytest.importorskip("transformers")
    tool_format, end = TEMPLATES[name]
    calls = calls_for(name)
    answer = answer_as_trained(sources[name], calls, end)
    expected = [(call["function"]["name"], json.loads(call["function"]["arguments"]))
                for call in calls]
    content, found = tool_format.parse(answer, ["get_weather", "get_time"])
    assert content is None
    assert [(call.name, json.loads(call.arguments)) for call in found] == expected
    for step in (1, 3, 17):
        content, pieces, _ = streamed(tool_format, answer, step)
        assert content == ""
        assert [(name_, json.loads(arguments)) for _, name_, arguments in
                (pieces[i] for i in sorted(pieces))] == expected
        assert [pieces[i][2] for i in sorted(pieces)] == [call.arguments for call in found]


# Answers as models write them (Qwen2.5-Coder-0.5B writes the bare and fenced forms).
ANSWERS = [
    ('{"name": "get_weather", "arguments": {"city": "Paris"}}', HERMES,
     None, [("get_weather", '{"city": "Paris"}')]),
    ('```json\n{\n  "name": "get_weather",\n  "arguments": {\n    "city": "Berlin"\n  }\n}\n```',
     HERMES, None, [("get_weather", '{\n    "city": "Berlin"\n  }')]),
    ('Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n'
     '</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>', HERMES,
     "Let me look.", [("get_weather", '{"city": "Rome"}'), ("get_time", "{}")]),
    ('<tool_call>\n{"name": "get_weather", "arguments": "{\\"city\\": \\"Lima\\"}"}\n'
     '</tool_call>', HERMES, None, [("get_weather", '{"city": "Lima"}')]),
    ('[{"name": "get_weather", "arguments": {"city": "Oslo"}}, '
     '{"name": "get_time", "arguments": {"city": "Oslo"}}]', HERMES, None,
     [("get_weather", '{"city": "Oslo"}'), ("get_time", '{"city": "Oslo"}')]),
    ('<|python_tag|>{"name": "get_time", "parameters": {"city": "Quito"}}', LLAMA3_JSON, None,
     [("get_time", '{"city": "Quito"}')]),
    ('{"name": "get_weather", "parameters": {"city": "Lagos"}}; '
     '{"name": "get_time", "parameters": {"city": "Lagos"}}', LLAMA3_JSON, None,
     [("get_weather", '{"city": "Lagos"}'), ("get_time", '{"city": "Lagos"}')]),
    ('[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Nice"}}]', MISTRAL, None,
     [("get_weather", '{"city": "Nice"}')]),
    # Not calls: text stays text.
    ("It is sunny in Paris.", HERMES, "It is sunny in Paris.", []),
    ('{"city": "Paris", "temperature": 18}', HERMES, '{"city": "Paris", "temperature": 18}', []),
    ('{"name": "send_email", "arguments": {"to": "x"}}', HERMES,
     '{"name": "send_email", "arguments": {"to": "x"}}', []),  # a tool not offered
    ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
     '<tool_call>\n{"name": "get_time" "arguments": {"city": "Oslo"}}\n</tool_call>Done.',
     HERMES, '<tool_call>\n{"name": "get_time" "arguments": {"city": "Oslo"}}\n</tool_call>Done.',
     [("get_weather", '{"city": "Oslo"}')]),  # the second call's JSON is broken
    ('{"name": "get_weather", "arguments": {"city": "Paris"}}\n{"temperature": 18}', HERMES,
     '{"name": "get_weather", "arguments": {"city": "Paris"}}\n{"temperature": 18}', []),
    ("```python\nprint('hi')\n```", HERMES, "```python\nprint('hi')\n```", []),
    ("[1] A list.", MISTRAL, "[1] A list.", []),
]


@pytest.mark.parametrize("text, tool_format, content, calls", ANSWERS)
def test_answers_are_read_as_calls_or_text(text, tool_format, content, calls):
    found_content, found = tool_format.parse(text, ["get_weather", "get_time"])
    assert found_content == content
    assert found == [ToolCall(name, arguments) for name, arguments in calls]
    for step in (1, 4):
        streamed_content, pieces, reader = streamed(tool_format, text, step)
        assert [(pieces[i][1], pieces[i][2]) for i in sorted(pieces)] == calls
        assert reader.calls == found
        # Text before the calls streams as it comes; text alone comes out whole.
        assert streamed_content.strip() == (content or "")


def test_text_streams_before_the_answer_ends():
    """Plain text is not held back: each piece goes out as it comes, except a tail that may
    be the start of a call marker."""
    reader = ToolCallStream(HERMES, ["get_weather"])
    assert reader.feed("It is") == [{"content": "It is"}]
    assert reader.feed(" sunny <tool") == [{"content": " sunny "}]
    assert reader.feed("bar>") == [{"content": "<toolbar>"}]


def test_parallel_false_keeps_the_first_call():
    text = ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "A"}}\n</tool_call>\n'
            '<tool_call>\n{"name": "get_weather", "arguments": {"city": "B"}}\n</tool_call>')
    reader = ToolCallStream(HERMES, ["get_weather"], max_calls=1)
    deltas = reader.feed(text) + reader.finish()
    assert {piece["index"] for delta in deltas for piece in delta["tool_calls"]} == {0}
    assert reader.calls == [ToolCall("get_weather", '{"city": "A"}')]


@pytest.mark.parametrize("name", ["google-gemma-2-2b-it.jinja", "Qwen3-Coder.jinja",
                                  "unsloth-mistral-Devstral-Small-2507.jinja"])
def test_templates_without_a_format_read_here_are_refused_naming_the_model(name, model_file):
    """Gemma 2 shows no tools; Qwen3-Coder writes XML-style calls and Devstral Mistral's newer
    'name[ARGS]{...}': formats not read here, refused rather than misread."""
    source = model_file(MODEL, f"templates/{name}").read_text(encoding="utf-8")
    with pytest.raises(ToolsUnsupported, match="^my-model: .*no tool-call format"):
        tool_format_for(load_chat_template(source, BOS, EOS), "my-model")


def test_a_template_naming_the_marker_but_not_showing_tools_has_none():
    source = ('{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n'
              '{% endfor %}{# writes {"name": ...} in <tool_call> but never the tools #}')
    with pytest.raises(ToolsUnsupported, match="my-model"):
        tool_format_for(load_chat_template(source), "my-model")


def test_a_marked_call_that_breaks_off_has_gone_out_as_a_call():
    """The stream sends a marked call's arguments as they come; when its JSON then breaks off
    (a free "auto" answer: under tool_choice required the grammar keeps it whole), what went
    out stays a call, while the whole answer reads the text as text."""
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": \n</tool_call>'
    assert HERMES.parse(text, ["get_weather"]) == (text, [])
    _, pieces, reader = streamed(HERMES, text, 2)
    assert [(name, arguments) for _, name, arguments in pieces.values()] == [
        ("get_weather", '{"city":')]
    assert reader.calls == [ToolCall("get_weather", '{"city":')]
