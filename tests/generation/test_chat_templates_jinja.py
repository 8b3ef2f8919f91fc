"""Models' own chat templates rendered by Jinja2 (sandboxed) against transformers.

Reference: transformers' `render_jinja_template` (what `apply_chat_template` renders with, no
tokenizer needed) on every template of llama.cpp's `models/templates/` (70 templates of Qwen,
Llama 3.x, Gemma 2/4, Phi-3.5, Mistral, DeepSeek, Granite, GLM, Kimi, gpt-oss..., from the
llama-cpp-python 0.3.36 sdist: the registry test input `llama-cpp-test-data`), for system +
user, multi-turn and one-user conversations, with and without the generation prompt. Where
transformers itself cannot render a conversation (listed below, with why), candle-web must
refuse it with the same message. Then the sandbox's limits, the fallback without jinja2, and
`candle-web generate --chat --system` on SmolLM2 against transformers' tokenizer ids.
"""

from __future__ import annotations

import re
import sys

import pytest

from candle_web import cli, hub
from candle_web.core.errors import CandleError, UnsupportedError
from candle_web.generation import chat_templates
from candle_web.generation.chat_templates import (ChatTemplate, JinjaChatTemplate,
                                                  load_chat_template)

pytest.importorskip("jinja2")

MODEL = "llama-cpp-test-data"
SMOLLM = "smollm2-135m-instruct"
SMOLLM_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
BOS, EOS = "<s>", "</s>"
CONVERSATIONS = {
    "system + user": [{"role": "system", "content": "You are terse."},
                      {"role": "user", "content": "What is 2+2?"}],
    "multi turn": [{"role": "user", "content": "Hello"},
                   {"role": "assistant", "content": "Hi! How can I help?"},
                   {"role": "user", "content": "Tell me a joke 😀"}],
    "one user turn": [{"role": "user", "content": "  Hi there \n"}],
}
# Conversations transformers cannot render, and why (checked: exactly these fail there).
TOOLS_REQUIRED = "the tool-use template iterates `tools`, which is none without tools"
TRANSFORMERS_CANNOT = {
    "CohereForAI-c4ai-command-r-plus-tool_use.jinja": (set(CONVERSATIONS), TOOLS_REQUIRED),
    "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja": (set(CONVERSATIONS), TOOLS_REQUIRED),
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja": (set(CONVERSATIONS), TOOLS_REQUIRED),
    "fireworks-ai-llama-3-firefunction-v2.jinja": (
        set(CONVERSATIONS), "the template reads a `functions` variable transformers never sets"),
    "google-gemma-2-2b-it.jinja": ({"system + user"},
                                   "Gemma 2's template raises 'System role not supported'"),
}


def template_names() -> list:
    model = hub.default_registry()[MODEL]
    return sorted(file.name.removeprefix("templates/") for file in model.files
                  if file.name.startswith("templates/"))


def test_the_sdist_has_70_templates():
    assert len(template_names()) == 70  # and a README.md: the "71" of a directory listing
    assert set(TRANSFORMERS_CANNOT) <= set(template_names())


def transformers_render(source, messages, add_generation_prompt):
    from transformers.utils.chat_template_utils import render_jinja_template

    rendered, _ = render_jinja_template([messages], chat_template=source,
                                        add_generation_prompt=add_generation_prompt,
                                        bos_token=BOS, eos_token=EOS)
    return rendered[0]


@pytest.mark.parametrize("name", template_names())
def test_template_renders_as_transformers(name, model_file):
    pytest.importorskip("transformers")
    source = model_file(MODEL, f"templates/{name}").read_text(encoding="utf-8")
    template = load_chat_template(source, BOS, EOS)
    assert isinstance(template, JinjaChatTemplate)
    failing, _ = TRANSFORMERS_CANNOT.get(name, (set(), None))
    for conversation, messages in CONVERSATIONS.items():
        for add_generation_prompt in (True, False):
            case = f"{conversation}, add_generation_prompt={add_generation_prompt}"
            if conversation in failing:
                with pytest.raises(Exception) as reference_error:
                    transformers_render(source, messages, add_generation_prompt)
                with pytest.raises(CandleError) as error:
                    template.render(messages, add_generation_prompt)
                assert str(reference_error.value) in str(error.value), case
                continue
            expected = transformers_render(source, messages, add_generation_prompt)
            assert template.render(messages, add_generation_prompt) == expected, case


# A conversation as long as a prompt gets (~1 M characters, 100 turns; newlines, quotes,
# backslashes, non-ASCII): the render's size budget (template_budget.py) must not refuse it.
LONG_TURN = "A line with «é», \"double\" and 'single' quotes, a \\ backslash 😀.\n" * 170
LONG_CONVERSATION = [{"role": "user" if index % 2 == 0 else "assistant",
                      "content": f"{index}: {LONG_TURN}"} for index in range(101)]


@pytest.mark.parametrize("name", template_names())
def test_long_conversation_renders_as_transformers(name, model_file):
    pytest.importorskip("transformers")
    source = model_file(MODEL, f"templates/{name}").read_text(encoding="utf-8")
    template = load_chat_template(source, BOS, EOS)
    if "multi turn" in TRANSFORMERS_CANNOT.get(name, (set(), None))[0]:
        with pytest.raises(Exception) as reference_error:
            transformers_render(source, LONG_CONVERSATION, True)
        with pytest.raises(CandleError, match=re.escape(str(reference_error.value))):
            template.render(LONG_CONVERSATION)
        return
    expected = transformers_render(source, LONG_CONVERSATION, True)
    assert len(expected) > 1_000_000
    assert template.render(LONG_CONVERSATION) == expected


WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city «now».",
    "parameters": {"type": "object", "required": ["city"],
                   "properties": {"city": {"type": "string", "description": "The city"}}}}}
COHERE_TOOL = {"name": "internet_search", "description": "Search the web",
               "parameter_definitions": {"query": {"type": "str", "description": "the query",
                                                   "required": True}}}


@pytest.mark.parametrize("name, tool", [
    ("CohereForAI-c4ai-command-r-plus-tool_use.jinja", COHERE_TOOL),
    ("NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja", WEATHER_TOOL),
    ("NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja", WEATHER_TOOL),
    ("Qwen-Qwen2.5-7B-Instruct.jinja", WEATHER_TOOL),
    ("meta-llama-Llama-3.1-8B-Instruct.jinja", WEATHER_TOOL),
])
def test_tool_templates_with_tools_render_as_transformers(name, tool, model_file):
    """The tool-use templates transformers cannot render without tools, given one."""
    from transformers.utils.chat_template_utils import render_jinja_template

    source = model_file(MODEL, f"templates/{name}").read_text(encoding="utf-8")
    messages = CONVERSATIONS["system + user"]
    rendered, _ = render_jinja_template([messages], tools=[tool], chat_template=source,
                                        add_generation_prompt=True, bos_token=BOS,
                                        eos_token=EOS)
    ours = load_chat_template(source, BOS, EOS).render(messages, tools=[tool])
    assert ours == rendered[0]
    assert "get_weather" in ours or "internet_search" in ours  # the tool is in the prompt


# -- the environment transformers gives templates ------------------------------------------------

def render(source: str, messages=None, **variables) -> str:
    messages = messages or [{"role": "user", "content": "x"}]
    return load_chat_template(source, BOS, EOS).render(messages, **variables)


def test_globals_filters_and_variables():
    assert render("{{ bos_token }}|{{ eos_token }}|{{ add_generation_prompt }}|"
                  "{{ tools }}|{{ documents }}") == "<s>|</s>|True|None|None"
    # tojson: json.dumps' options, no HTML escaping, non-ASCII kept
    assert render("{{ {'b': 'é<', 'a': [1]} | tojson(indent=1, sort_keys=True) }}") == \
        '{\n "a": [\n  1\n ],\n "b": "é<"\n}'
    assert re.fullmatch(r"\d{4}", render("{{ strftime_now('%Y') }}"))
    assert render("{{ dict(a=1)['a'] }}{% set ns = namespace(n=2) %}{{ ns.n }}") == "12"
    assert render("{% for m in [1, 2, 3] %}{% if m == 2 %}{% break %}{% endif %}{{ m }}"
                  "{% endfor %}") == "1"
    assert render("{% generation %}kept{% endgeneration %}") == "kept"
    # trim_blocks and lstrip_blocks, as transformers sets them
    assert render("  {% if true %}\nA\n  {% endif %}\nB") == "A\nB"
    with pytest.raises(CandleError, match="chat template: no system role"):
        render("{{ raise_exception('no system role') }}")
    # messages keep their other JSON fields; None values are dropped as transformers does
    assert render("{{ messages[0]['name'] }}{{ messages[0]['extra'] is defined }}",
                  [{"role": "user", "content": "x", "name": "ann", "extra": None}]) == "annFalse"


@pytest.mark.parametrize("source, message", [
    ('{% set f = "{0.__class__.__mro__}".format %}{{ f(1) }}', "unsafe"),
    ('{{ ("{0.__class__}"|attr("format"))(1) }}', None),
    ('{{ "x"["format"]("{0.__class__}") }}', None),
    ("{{ namespace(_secret=1) }}", "underscore names are refused"),
    ("{% set ns = namespace() %}{% set ns._x = 1 %}", None),
    ("{{ ''.__class__.__mro__ }}", None),
    ("{{ 'a' * 100000000 }}", "too long"),
    ("{{ 2 ** 100000000 }}", "exponent"),
    ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
     "steps"),
    ("{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}", "characters"),
])
def test_hostile_templates_are_refused(source, message):
    """Sandbox escapes (str.format reached indirectly: refused on the jinja2 3.1.3 Pyodide
    ships too), loops and sizes: a CandleError or an empty undefined, never code or a hang."""
    try:
        rendered = render(source)
    except CandleError as error:
        if message is not None:
            assert message in str(error)
        return
    assert message is None and "class" not in rendered and "object" not in rendered


def test_syntax_errors_and_missing_templates():
    with pytest.raises(UnsupportedError, match="Jinja syntax error at line 1"):
        load_chat_template("{% for m in messages %}{{ m['content'] }}")
    # a recognised format still renders when Jinja cannot parse the rest
    broken_chatml = "<|im_start|>{{ m['role'] }<|im_end|>"
    assert isinstance(load_chat_template(broken_chatml), ChatTemplate)
    for missing in (None, ""):
        with pytest.raises(UnsupportedError, match="no chat template"):
            load_chat_template(missing)


def test_without_jinja2_the_recognised_formats_render(monkeypatch, model_file):
    from candle_web.io.gguf import GgufFile

    source = GgufFile(model_file(SMOLLM, SMOLLM_GGUF)).metadata["tokenizer.chat_template"]
    with_jinja = load_chat_template(source).render(CONVERSATIONS["multi turn"])
    monkeypatch.setitem(sys.modules, "jinja2", None)  # `import jinja2` raises ImportError
    fallback = load_chat_template(source)
    assert isinstance(fallback, ChatTemplate) and fallback.format == "chatml"
    assert fallback.render(CONVERSATIONS["multi turn"]) == with_jinja
    gemma = model_file(MODEL, "templates/google-gemma-2-2b-it.jinja").read_text()
    with pytest.raises(UnsupportedError, match="install jinja2"):
        load_chat_template(gemma)


# -- candle-web generate --chat --system on SmolLM2 ------------------------------------------------

@pytest.fixture(scope="module")
def transformers_tokenizer(model_file, tmp_path_factory):
    transformers = pytest.importorskip("transformers")
    folder = tmp_path_factory.mktemp("smollm2-tokenizer")
    (folder / SMOLLM_GGUF).symlink_to(model_file(SMOLLM, SMOLLM_GGUF))
    return transformers.AutoTokenizer.from_pretrained(str(folder), gguf_file=SMOLLM_GGUF)


def reference_ids(tokenizer, messages) -> list:
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if not isinstance(ids, list):  # a BatchEncoding (return_dict defaults on in some versions)
        ids = ids["input_ids"]
    return list(ids)


@pytest.mark.parametrize("system", [None, "You are a pirate. Answer in one line."])
def test_chat_system_prompt_ids_equal_transformers(system, model_file, transformers_tokenizer):
    from candle_web.generation.chat_templates import chat_template_for
    from candle_web.pipelines import load_llama

    loaded = load_llama(model_file(SMOLLM, SMOLLM_GGUF))
    template = chat_template_for(loaded.model, loaded.tokenizer)
    assert isinstance(template, JinjaChatTemplate) and template.format == "chatml"
    messages = cli.chat_messages("What is the capital of France?", system)
    rendered = template.render(messages)
    ids = loaded.tokenizer.encode(rendered, add_special_tokens=False).ids
    assert ids == reference_ids(transformers_tokenizer, messages)
    # The template's default system message is used only without --system.
    assert ("You are a helpful AI assistant named SmolLM" in rendered) == (system is None)


def test_cli_generate_chat_system(capsys, model_file, transformers_tokenizer):
    path = str(model_file(SMOLLM, SMOLLM_GGUF))
    system = "You are a pirate."
    assert cli.main(["generate", "Hello", "--model", path, "--chat", "--system", system,
                     "--max-tokens", "2"]) == 0
    err = capsys.readouterr().err
    expected = reference_ids(transformers_tokenizer, cli.chat_messages("Hello", system))
    assert f"{len(expected)} prompt tokens" in err
    # --system is part of a chat: refused without --chat, before any model loads
    assert cli.main(["generate", "Hello", "--model", "no-such-model", "--system", system]) == 2
    assert "--system needs --chat" in capsys.readouterr().err


QWEN = "qwen2.5-coder-0.5b-instruct"
QWEN_GGUF = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"


def test_qwen25_gguf_chat_ids_equal_transformers(model_file, tmp_path):
    """The real instruct model's ChatML + tool-calling template and qwen2 vocabulary, both from
    its GGUF metadata (no weights loaded), against transformers' tokenizer built from the same
    file."""
    transformers = pytest.importorskip("transformers")
    from candle_web.io.gguf import read_gguf
    from candle_web.tokenizers import Tokenizer

    path = model_file(QWEN, QWEN_GGUF)
    metadata = read_gguf(path).metadata
    tokenizer = Tokenizer.from_gguf_metadata(
        {key: value for key, value in metadata.items() if key.startswith("tokenizer.ggml.")})
    bos, eos = (tokenizer.id_to_token(int(metadata[f"tokenizer.ggml.{name}_token_id"]))
                for name in ("bos", "eos"))
    template = load_chat_template(metadata["tokenizer.chat_template"], bos, eos)
    assert isinstance(template, JinjaChatTemplate)
    (tmp_path / QWEN_GGUF).symlink_to(path)
    reference = transformers.AutoTokenizer.from_pretrained(str(tmp_path), gguf_file=QWEN_GGUF)
    for system in (None, "You write Python. Be brief."):
        messages = cli.chat_messages("Write a function that adds «2+2» 😀\n  and prints it",
                                     system)
        ids = tokenizer.encode(template.render(messages), add_special_tokens=False).ids
        assert ids == reference_ids(reference, messages)
