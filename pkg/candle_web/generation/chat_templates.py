"""Chat prompts: the model's own Jinja template, or the common formats recognised directly.

Models ship a Jinja template (GGUF `tokenizer.chat_template`, HF `tokenizer_config.json`).
`load_chat_template` (what `chat_template_for` uses) renders it with Jinja2 as transformers'
`apply_chat_template` does, in the sandbox of template_sandbox.py (the environment transformers
gives templates, a step budget and a size budget checked before anything large is built), with
the variables `messages`, `add_generation_prompt`, `bos_token`/`eos_token`, `tools`/`documents`
none. jinja2 is imported when a template is loaded (natively the `chat` extra; the page vendors
Jinja2 3.1.6 and a pure MarkupSafe from PyPI, scripts/vendor_pyodide.py).

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

import re
from dataclasses import dataclass

from ..core.errors import CandleError, UnsupportedError
from .template_budget import (MAX_BUILT_CHARS, MAX_LIVE_CHARS, MAX_RENDERED_CHARS,
                              TemplateBudgetError)
from .template_sandbox import (MAX_TEMPLATE_STEPS, compile_template, jinja_environment,
                               render_bounded, template_data)

__all__ = ["CHATML", "FORMATS", "JINJA_HINT", "LLAMA2", "LLAMA3", "MAX_BUILT_CHARS",
           "MAX_LIVE_CHARS", "MAX_RENDERED_CHARS", "MAX_TEMPLATE_STEPS", "ChatTemplate",
           "JinjaChatTemplate", "TemplateBudgetError", "chat_template_for", "jinja_environment",
           "load_chat_template", "render_chat"]

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
        # An assistant turn that only called tools has no content (OpenAI's null).
        calls_only = content is None and isinstance(message, dict) and message.get("tool_calls")
        if not isinstance(role, str) or not (isinstance(content, str) or calls_only):
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


# -- the model's own Jinja template (rendered in template_sandbox.py) ---------------------------

JINJA_HINT = "install jinja2 (pip install 'candle-web[chat]') to render the model's own template"


def _jinja_messages(messages) -> list:
    """The messages as the template sees them: JSON data, keys whose value is None dropped (as
    transformers does)."""
    _normalise_messages(messages)  # the same checks and errors as the direct formats
    out = []
    for index, message in enumerate(messages):
        if isinstance(message, dict):
            message = {key: value for key, value in message.items() if value is not None}
        else:
            message = {"role": message[0], "content": message[1]}
        out.append(template_data(message, f"chat message {index}"))
    return out


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
        context = {"bos_token": self.bos_token, "eos_token": self.eos_token,
                   **template_data(variables, "chat template variables"),
                   "messages": _jinja_messages(messages),
                   "tools": template_data(tools, "chat template tools"),
                   "documents": template_data(documents, "chat template documents"),
                   "add_generation_prompt": bool(add_generation_prompt)}
        return render_bounded(self.compiled, context)


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
        compiled = compile_template(template)
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
