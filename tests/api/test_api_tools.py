"""Tool calls on `candle-web serve --api` (Qwen2.5-Coder-0.5B-Instruct Q4_K_M, greedy, on
loopback), driven by the clients users run: the `openai` package (a weather tool on five
prompts, the tool's result fed back, streamed tool-call deltas, tool_choice required / named /
none), langchain-openai's `bind_tools` and `llm --functions` with a Python function. The
prompt is what transformers' `render_jinja_template` (apply_chat_template) makes of the same
conversation with the GGUF's own template. A model whose template has no tool format (SmolLM2)
and malformed tool fields are 400s naming the model or the field."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

openai = pytest.importorskip("openai", reason="the dev extra installs the openai client")
pytest.importorskip("starlette", reason="the serve extra installs starlette")
pytest.importorskip("jinja2", reason="the chat extra installs jinja2")

from tests.api.api_testlib import HTTP_TIMEOUT_S, LLM, api_server, post_json  # noqa: E402

QWEN = "qwen2.5-coder-0.5b-instruct"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "required": ["city"],
                   "properties": {"city": {"type": "string", "description": "The city name"}}}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Get the current local time in a city",
    "parameters": {"type": "object", "required": ["city"],
                   "properties": {"city": {"type": "string"}}}}}
PROMPTS = {"Paris": "What's the weather like in Paris today?",
           "Tokyo": "Is it raining in Tokyo right now?",
           "Cairo": "How hot is it in Cairo?",
           "Berlin": "Tell me the weather in Berlin.",
           "London": "Should I take an umbrella in London today?"}
# Room for a call: Qwen's take 16-28 tokens here.
MAX_TOKENS = 48
CALL_ID = re.compile(r"^call_[A-Za-z0-9]{24}$")
FORECAST = "heavy rain all day"


@pytest.fixture(scope="module")
def pool():
    from candle_web.api import ModelPool

    pool = ModelPool(parallel=2, queue_size=8)
    pool.add(QWEN)
    pool.add(LLM)
    yield pool
    pool.close()


@pytest.fixture(scope="module")
def base_url(pool, tmp_path_factory):
    with api_server(pool, tmp_path_factory) as url:
        yield url + "/v1"


@pytest.fixture(scope="module")
def client(base_url):
    return openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0,
                         timeout=HTTP_TIMEOUT_S)


def ask(client, messages, **fields):
    fields = {"temperature": 0, "max_tokens": MAX_TOKENS, **fields}
    return client.chat.completions.create(model=QWEN, messages=messages, **fields)


def user(question: str) -> list:
    return [{"role": "user", "content": question}]


@pytest.fixture(scope="module")
def weather_answers(client):
    """The five weather prompts with the tool, sent at once (they share batched steps)."""
    with ThreadPoolExecutor(len(PROMPTS)) as threads:
        answers = threads.map(lambda question: ask(client, user(question), tools=[WEATHER]),
                              PROMPTS.values())
        return dict(zip(PROMPTS, answers))


def the_call(answer):
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert choice.message.content is None and len(choice.message.tool_calls) == 1
    call = choice.message.tool_calls[0]
    assert call.type == "function" and CALL_ID.match(call.id)
    return call


@pytest.mark.parametrize("city", list(PROMPTS))
def test_each_weather_prompt_calls_the_tool_naming_its_city(weather_answers, city):
    call = the_call(weather_answers[city])
    assert call.function.name == "get_weather"
    arguments = json.loads(call.function.arguments)
    assert arguments["city"].lower() == city.lower()


def transformers_prompt_tokens(pool, messages, tools) -> int:
    """The tokens of transformers' rendering of `messages` with the GGUF's own template."""
    from transformers.utils.chat_template_utils import render_jinja_template

    loaded = pool.models[QWEN].loaded
    rendered, _ = render_jinja_template([messages], tools=tools,
                                        chat_template=loaded.model.chat_template,
                                        add_generation_prompt=True)
    return len(loaded.tokenizer.encode(rendered[0], add_special_tokens=False).ids)


def test_the_tools_reach_the_prompt_as_transformers_renders_them(pool, client,
                                                                 weather_answers):
    pytest.importorskip("transformers")
    with_tools = weather_answers["Paris"].usage.prompt_tokens
    without = ask(client, user(PROMPTS["Paris"]), max_tokens=1).usage.prompt_tokens
    assert with_tools > without + 100  # the tool's signature and instructions
    assert with_tools == transformers_prompt_tokens(pool, user(PROMPTS["Paris"]), [WEATHER])
    assert without == transformers_prompt_tokens(pool, user(PROMPTS["Paris"]), None)


def test_the_tool_result_fed_back_gets_a_final_answer(pool, client, weather_answers):
    """The agent's next turn: the assistant's call (content null, as the client returns it)
    and the tool's result are accepted, rendered as transformers renders them, and the model
    answers with text. (Qwen2.5-Coder-0.5B restates its call before the result in that text:
    the small model's habit; what matters here is that it is an answer, not a call.)"""
    pytest.importorskip("transformers")
    call = the_call(weather_answers["London"])
    assistant = weather_answers["London"].choices[0].message.model_dump(
        include={"role", "content", "tool_calls"})
    messages = user(PROMPTS["London"]) + [
        assistant, {"role": "tool", "tool_call_id": call.id,
                    "content": json.dumps({"forecast": FORECAST})}]
    answer = ask(client, messages, tools=[WEATHER])
    choice = answer.choices[0]
    assert choice.finish_reason == "stop" and choice.message.tool_calls is None
    assert FORECAST in choice.message.content
    # The prompt: the call with its arguments as an object, the result in Qwen's tool turn.
    shown = [dict(message) for message in messages]
    shown[1] = {"role": "assistant", "tool_calls": [
        {"id": call.id, "type": "function", "function": {
            "name": "get_weather", "arguments": json.loads(call.function.arguments)}}]}
    assert answer.usage.prompt_tokens == transformers_prompt_tokens(pool, shown, [WEATHER])


def streamed(client, messages, **fields) -> tuple:
    """(content, [[id, name, arguments]], finish_reason, number of argument pieces) of a
    streamed answer, checking each tool-call delta's shape as OpenAI sends them."""
    content, calls, finish, pieces = "", {}, None, 0
    for chunk in ask(client, messages, stream=True, **fields):
        choice = chunk.choices[0]
        content += choice.delta.content or ""
        finish = choice.finish_reason or finish
        for delta in choice.delta.tool_calls or []:
            if delta.id is not None:  # the first: id, type, name, arguments ""
                assert delta.index == len(calls) and CALL_ID.match(delta.id)
                assert delta.type == "function" and delta.function.arguments == ""
                calls[delta.index] = [delta.id, delta.function.name, ""]
            else:  # then pieces of the arguments only
                assert delta.type is None and delta.function.name is None
                calls[delta.index][2] += delta.function.arguments
                pieces += 1
    return content, [calls[index] for index in sorted(calls)], finish, pieces


def test_a_streamed_call_comes_as_openai_deltas(client, weather_answers):
    content, calls, finish, _ = streamed(client, user(PROMPTS["Paris"]), tools=[WEATHER])
    expected = the_call(weather_answers["Paris"])
    assert content == "" and finish == "tool_calls"
    assert [(name, arguments) for _, name, arguments in calls] == [
        (expected.function.name, expected.function.arguments)]


def test_tool_choice_required_makes_a_call_where_the_model_would_not(client):
    """A haiku request: under "required" (and one call at most) the answer is one call of the
    tool with arguments its schema allows, streamed piece by piece."""
    content, calls, finish, pieces = streamed(
        client, user("Write a haiku about the sea."), tools=[WEATHER],
        tool_choice="required", parallel_tool_calls=False, max_tokens=64)
    assert finish == "tool_calls" and len(calls) == 1 and calls[0][1] == "get_weather"
    arguments = json.loads(calls[0][2])
    assert isinstance(arguments["city"], str) and arguments["city"]
    assert pieces >= 1


def test_a_named_function_is_the_one_called(client):
    answer = ask(client, user(PROMPTS["Paris"]), tools=[WEATHER, TIME],
                 tool_choice={"type": "function", "function": {"name": "get_time"}},
                 parallel_tool_calls=False)
    call = the_call(answer)
    assert call.function.name == "get_time"
    assert json.loads(call.function.arguments)["city"] == "Paris"


def test_tool_choice_none_leaves_the_tools_out(client):
    with_none = ask(client, user(PROMPTS["Paris"]), tools=[WEATHER], tool_choice="none",
                    max_tokens=1)
    without = ask(client, user(PROMPTS["Paris"]), max_tokens=1)
    assert with_none.usage.prompt_tokens == without.usage.prompt_tokens
    assert with_none.choices[0].message.tool_calls is None


def refusal(base_url, body) -> dict:
    status, _, payload = post_json(base_url.removesuffix("/v1"), "/v1/chat/completions", body)
    assert status == 400, payload
    return json.loads(payload)["error"]


def test_a_model_without_a_tool_format_is_refused_naming_it(base_url):
    error = refusal(base_url, {"model": LLM, "messages": user("Weather in Paris?"),
                               "tools": [WEATHER]})
    assert error["param"] == "tools" and LLM in error["message"]
    assert "no tool-call format" in error["message"]
    history = user("Weather in Paris?") + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    error = refusal(base_url, {"model": LLM, "messages": history})
    assert error["param"] == "messages" and LLM in error["message"]


CALL = {"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}
BAD_FIELDS = [
    ({"messages": user("Hi") + [{"role": "assistant", "content": None, "tool_calls": [
        {**CALL, "function": {"name": "get_weather", "arguments": "{city: Paris"}}]}]},
     "messages[1].tool_calls[0].function.arguments"),
    ({"messages": user("Hi") + [{"role": "assistant", "content": None,
                                 "tool_calls": [{**CALL, "id": None}]}]},
     "messages[1].tool_calls[0].id"),
    ({"messages": user("Hi") + [{"role": "assistant", "content": None},
                                {"role": "tool", "content": "sunny"}]},
     "messages[1].content"),
    ({"messages": user("Hi") + [{"role": "assistant", "content": None, "tool_calls": [CALL]},
                                {"role": "tool", "content": "sunny"}]},
     "messages[2].tool_call_id"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice.function.name"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": "always"}, "tool_choice"),
    ({"tools": [{"type": "retrieval"}]}, "tools[0].type"),
    ({"tools": [{"type": "function", "function": {"name": "get weather"}}]},
     "tools[0].function.name"),
    ({"tools": [WEATHER, WEATHER]}, "tools[1].function.name"),
    ({"tools": [WEATHER], "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
    ({"functions": [WEATHER["function"]]}, "functions"),  # the deprecated fields
    # A schema keyword the grammar cannot enforce, where the call is enforced.
    ({"tools": [{"type": "function", "function": {
        "name": "f", "parameters": {"type": "object", "not": {"required": ["x"]}}}}],
      "tool_choice": "required"}, "tools[0].function.parameters"),
]


@pytest.mark.parametrize("fields, param", BAD_FIELDS, ids=[param for _, param in BAD_FIELDS])
def test_malformed_tool_fields_are_refused_naming_the_field(base_url, fields, param):
    body = {"model": QWEN, "messages": user("Weather in Paris?"), "max_tokens": 1, **fields}
    assert refusal(base_url, body)["param"] == param


def get_weather(city: str) -> str:
    """Get the current weather in a city.

    Args:
        city: The city name
    """
    return json.dumps({"forecast": FORECAST})


def test_langchain_bind_tools_calls_and_takes_the_result(base_url):
    chat_models = pytest.importorskip("langchain_openai",
                                      reason="the dev extra installs langchain-openai")
    from langchain_core.messages import HumanMessage, ToolMessage

    model = chat_models.ChatOpenAI(model=QWEN, base_url=base_url, api_key="unused",
                                   temperature=0, max_tokens=MAX_TOKENS, max_retries=0,
                                   timeout=HTTP_TIMEOUT_S).bind_tools([get_weather])
    question = HumanMessage(PROMPTS["Paris"])
    called = model.invoke([question])
    assert [(call["name"], call["args"]) for call in called.tool_calls] == [
        ("get_weather", {"city": "Paris"})]
    result = ToolMessage(get_weather("Paris"), tool_call_id=called.tool_calls[0]["id"])
    answer = model.invoke([question, called, result])
    assert answer.tool_calls == [] and FORECAST in answer.content


def test_llm_cli_runs_a_python_tool(base_url, tmp_path):
    """`llm --functions 'def get_weather(...)'` against the server, configured as an
    OpenAI-compatible model with tools in llm's extra-openai-models.yaml: llm runs the function
    the model called (it writes down its city) and prints the model's answer to the result.
    (llm 0.36 offers every --functions function as a tool; its `-T NAME` takes registered
    plugin tools only and refuses a --functions one, "Tool(s) get_weather not found", before
    any request.)"""
    llm_cli = shutil.which("llm", path=str(Path(sys.executable).parent))
    if llm_cli is None:
        pytest.skip("the dev extra installs the llm command line")
    (tmp_path / "extra-openai-models.yaml").write_text(
        f"- model_id: candle-qwen\n  model_name: {QWEN}\n  api_base: \"{base_url}\"\n"
        f"  supports_tools: true\n")
    calls = tmp_path / "calls.txt"
    functions = (f"def get_weather(city: str) -> str:\n"
                 f"    \"\"\"Get the current weather in a city\"\"\"\n"
                 f"    with open({str(calls)!r}, 'a') as record:\n"
                 f"        record.write(city + '\\n')\n"
                 f"    return '{{\"forecast\": \"{FORECAST}\"}}'\n")
    environment = {**os.environ, "LLM_USER_PATH": str(tmp_path), "OPENAI_API_KEY": "unused"}
    process = subprocess.run([llm_cli, "-m", "candle-qwen", "--no-log", "-o", "temperature",
                              "0", "-o", "max_tokens", str(MAX_TOKENS), "--functions",
                              functions, PROMPTS["Paris"]],
                             capture_output=True, text=True, timeout=HTTP_TIMEOUT_S * 3,
                             env=environment)
    assert process.returncode == 0, process.stderr[-2000:]
    assert calls.read_text().split() == ["Paris"]
    assert FORECAST in process.stdout
