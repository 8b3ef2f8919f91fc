"""Chat templates: our renderer against Jinja (jinja2, the engine transformers uses) on the
real SmolLM2 template and on templates of the Llama 3 and Llama 2 chat formats, plus the
errors for templates it does not render."""

from __future__ import annotations

import pytest

from candle_web.generation.chat_templates import CHATML, LLAMA2, LLAMA3, ChatTemplate, render_chat
from candle_web.core.errors import CandleError, UnsupportedError

# The Llama 3 chat format (Meta's Llama 3 instruct models), written as a Jinja template.
LLAMA3_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}"
    "{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\\n\\n' + m['content'] | trim "
    "+ '<|eot_id|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{% endif %}")

# The Llama 2 chat format: [INST] blocks, the system prompt inside the first one.
LLAMA2_TEMPLATE = (
    "{% if messages[0]['role'] == 'system' %}{% set system = messages[0]['content'] %}"
    "{% set turns = messages[1:] %}{% else %}{% set system = none %}"
    "{% set turns = messages %}{% endif %}"
    "{% for m in turns %}"
    "{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('roles must alternate') }}{% endif %}"
    "{% if loop.first and system is not none %}"
    "{% set text = '<<SYS>>\\n' + system + '\\n<</SYS>>\\n\\n' + m['content'] %}"
    "{% else %}{% set text = m['content'] %}{% endif %}"
    "{% if m['role'] == 'user' %}{{ bos_token + '[INST] ' + text | trim + ' [/INST]' }}"
    "{% else %}{{ ' ' + text | trim + ' ' + eos_token }}{% endif %}"
    "{% endfor %}")

CONVERSATIONS = {
    "one user turn": [{"role": "user", "content": "What is the capital of France?"}],
    "system first": [{"role": "system", "content": "Answer briefly."},
                     {"role": "user", "content": "  Hi there \n"}],
    "multi turn": [{"role": "user", "content": "Hello"},
                   {"role": "assistant", "content": "Hi! How can I help?"},
                   {"role": "user", "content": "Tell me a joke 😀"}],
}


def jinja_render(template, messages, add_generation_prompt=True, bos="", eos=""):
    jinja2 = pytest.importorskip("jinja2")
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    return env.from_string(template).render(messages=messages, bos_token=bos, eos_token=eos,
                                            add_generation_prompt=add_generation_prompt)


@pytest.fixture(scope="module")
def smollm2_template(model_file):
    from candle_web.io.gguf import GgufFile

    path = model_file("smollm2-135m-instruct", "SmolLM2-135M-Instruct.Q4_1.gguf")
    return GgufFile(path).metadata["tokenizer.chat_template"]


@pytest.mark.parametrize("name", list(CONVERSATIONS))
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_smollm2_chatml_equals_jinja(smollm2_template, name, add_generation_prompt):
    template = ChatTemplate.detect(smollm2_template)
    assert template.format == CHATML
    assert template.default_system.startswith("You are a helpful AI assistant named SmolLM")
    messages = CONVERSATIONS[name]
    assert template.render(messages, add_generation_prompt) == \
        jinja_render(smollm2_template, messages, add_generation_prompt)


@pytest.mark.parametrize("name", list(CONVERSATIONS))
def test_llama3_format_equals_jinja(name):
    bos = "<|begin_of_text|>"
    rendered = render_chat(LLAMA3_TEMPLATE, CONVERSATIONS[name], bos_token=bos)
    assert ChatTemplate.detect(LLAMA3_TEMPLATE).format == LLAMA3
    assert rendered == jinja_render(LLAMA3_TEMPLATE, CONVERSATIONS[name], bos=bos)


@pytest.mark.parametrize("name", list(CONVERSATIONS))
def test_llama2_format_equals_jinja(name):
    rendered = render_chat(LLAMA2_TEMPLATE, CONVERSATIONS[name], bos_token="<s>",
                           eos_token="</s>")
    assert ChatTemplate.detect(LLAMA2_TEMPLATE).format == LLAMA2
    assert rendered == jinja_render(LLAMA2_TEMPLATE, CONVERSATIONS[name], bos="<s>", eos="</s>")


def test_chatml_without_a_default_system_message():
    template = ("{% for m in messages %}{{'<|im_start|>' + m['role'] + '\\n' + m['content'] + "
                "'<|im_end|>\\n'}}{% endfor %}{% if add_generation_prompt %}"
                "{{ '<|im_start|>assistant\\n' }}{% endif %}")
    messages = CONVERSATIONS["multi turn"]
    assert ChatTemplate.detect(template).default_system is None
    assert render_chat(template, messages) == jinja_render(template, messages)


def test_llama2_roles_must_alternate():
    with pytest.raises(CandleError, match="alternate"):
        render_chat(LLAMA2_TEMPLATE, [{"role": "user", "content": "a"},
                                      {"role": "user", "content": "b"}])


@pytest.mark.parametrize("template, named", [
    ("{% for m in messages %}<start_of_turn>{{ m['role'] }}\n{{ m['content'] }}<end_of_turn>"
     "{% endfor %}", "Gemma"),
    ("{% for m in messages %}{{ m['role'] | upper }}: {{ m['content'] }}\n{% endfor %}",
     "not recognised"),
    ("{{ bos_token }}Cutting Knowledge Date: December 2023 <|start_header_id|><|eot_id|>",
     "Llama 3.1"),
    (None, "no chat template"),
    ("", "no chat template"),
])
def test_templates_it_cannot_render_raise_clearly(template, named):
    with pytest.raises(UnsupportedError, match=named):
        render_chat(template, CONVERSATIONS["one user turn"])


def test_bad_messages():
    with pytest.raises(CandleError, match="no messages"):
        ChatTemplate(CHATML).render([])
    with pytest.raises(CandleError, match="message 0"):
        ChatTemplate(CHATML).render([{"role": "user", "content": 3}])
    # (role, content) pairs are accepted too
    rendered = ChatTemplate(CHATML).render([("user", "hi")], add_generation_prompt=False)
    assert rendered == "<|im_start|>user\nhi<|im_end|>\n"
