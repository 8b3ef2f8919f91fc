"""The Generate view's session: a LLaMA-family model from one GGUF file (its tokenizer and chat
template from the GGUF's own metadata), then generation with streamed tokens.

In the page the wasm backend keeps the GGML blocks packed (`supports_qmatmul`) and each decode
step is one kernel call per block (backend/wasm/parts.py). With `?backend=numpy` the weights are
dequantized to float32 once at load (quantized/qmatmul.py): SmolLM2-135M's 98 MB of Q4_1 blocks
become ~540 MB of f32, each array far below wasm32's 2 GiB limit, and every decode step is then
BLAS matmuls.
"""
from __future__ import annotations

import json
import time

import numpy as np

from candle_web.core.errors import CandleError, FormatError, ModelNotFound
from candle_web.worker.session import (Session, _unpinned, checked_text, generation_options,
                                       python_value)

# Bounds of one request, so a mistyped field cannot start an endless job.
MAX_NEW_TOKENS_LIMIT = 2048
MAX_PROMPT_CHARS = 32_000
# A chat turn renders and tokenizes the whole conversation (the pure-Python tokenizer in wasm).
MAX_CONVERSATION_CHARS = 400_000
# The one file a folder URL must hold for a LLaMA load (LlamaSession.manifest).
FOLDER_GGUF = "model.gguf"
PAGE_OPTIONS = ("maxTokens", "temperature", "topK", "topP", "seed", "repeatPenalty",
                "repeatLastN")


class LlamaSession(Session):
    kind = "llama"
    command = "generate"
    _conversation = None  # the Chat view's conversation on the loaded model (chat_turn)

    def manifest(self, model=None, hf_repo=None, revision=None, url=None) -> dict:
        # A GGUF has no fixed file name: registry models list theirs; a folder on this origin
        # (`candle-web serve --local-model`, bench/browser.py's requantized files) serves its
        # one GGUF as FOLDER_GGUF.
        if url is not None and model is None and hf_repo is None:
            manifest = super().manifest(url=url)  # checks the folder URL
            manifest["files"] = _unpinned((FOLDER_GGUF,), url)
            return manifest
        if model is None:
            raise ModelNotFound("load (llama): choose a registry model, e.g. "
                                "smollm2-135m-instruct, or a folder on this server holding "
                                f"{FOLDER_GGUF}; Hub repos are not supported for LLaMA in the "
                                "page (natively: candle-web generate --model FILE.gguf)")
        manifest = super().manifest(model=model)
        names = [f["name"] for f in manifest["files"]]
        if sum(name.endswith(".gguf") for name in names) != 1:
            raise ModelNotFound(f"load: registry model {model!r} must list exactly one .gguf "
                                f"file for the page, it lists {names}")
        return manifest

    def build(self, files: dict) -> tuple:
        """(Llama, Tokenizer) from the one .gguf file among `files` (its tokenizer and chat
        template from its metadata), opened as pipelines.load_llama opens a file."""
        from candle_web.pipelines import load_llama

        ggufs = [name for name in files if name.endswith(".gguf")]
        if len(ggufs) != 1:
            raise FormatError(f"load: expected one .gguf file, received {sorted(files)}")
        loaded = load_llama(files)
        return loaded.model, loaded.tokenizer

    def describe(self, model) -> dict:
        llama, tokenizer = model
        cfg = llama.config
        return {"layers": cfg.num_layers, "hidden": cfg.hidden_size, "vocab": cfg.vocab_size,
                "context": cfg.max_position_embeddings,
                **chat_template_summary(llama, tokenizer),
                "blockWeightBytes": sum(_weight_bytes(block) for block in llama.blocks)}

    def compute(self, model, prompt=None, chat: bool = False, options=None, messages=None,
                context=None, response_format=None, on_event=None) -> dict:
        """Generate; on_event(kind, payload) sees "prompt", "token" and "done" (see
        candle_web.generation.decode_loop). The payload is what the page shows and the twin
        check compares. With `messages` (the Chat view's `chat` command): answer the last
        user message of that conversation (see `chat_turn`). `response_format` (OpenAI's
        shape: json_object or json_schema) constrains the answer with the grammar engine (in
        the page web-xgrammar, prepared by the worker from `grammar_plan_json`)."""
        from candle_web.generation.chat_templates import chat_template_for
        from candle_web.generation import generate

        if messages is not None:
            return self.chat_turn(model, messages, context, options, on_event, response_format)
        llama, tokenizer = model
        chat = bool(chat)
        # A chat template places BOS itself (chat_templates.py).
        opts = generation_options(options, "generate", PAGE_OPTIONS, MAX_NEW_TOKENS_LIMIT,
                                  add_special_tokens=not chat,
                                  constraint=_constraint(response_format))
        rendered = checked_text(prompt, "generate: the prompt", MAX_PROMPT_CHARS,
                                "; type something to continue from")
        if chat:
            rendered = chat_template_for(llama, tokenizer).render(
                [{"role": "user", "content": prompt}])
        started = time.perf_counter()
        result = generate(llama, tokenizer, rendered, opts, on_event=on_event)
        elapsed_ms = (time.perf_counter() - started) * 1000.0
        return {
            "text": result.text, "tokenIds": [int(t) for t in result.token_ids],
            "promptIds": [int(t) for t in result.prompt_ids], "renderedPrompt": rendered,
            "stopReason": result.stop_reason, "stopString": result.stop_string,
            "timings": {"elapsedMs": elapsed_ms, "promptMs": result.prompt_seconds * 1000.0,
                        "decodeMs": result.decode_seconds * 1000.0,
                        "tokensPerSecond": result.tokens_per_second,
                        "promptTokensPerSecond": result.prompt_tokens_per_second},
        }


    def chat_turn(self, model, messages, context=None, options=None, on_event=None,
                  response_format=None) -> dict:
        """One turn of the Chat view: `messages` (OpenAI format, a system message first if
        any) ends with the user message to answer. The session keeps one Conversation per
        loaded model, so the KV cache carries over: only the tokens past the prefix it shares
        with the previous turn run (an edit or regenerate rolls it back). `context` caps the
        context (tokens; None: the model's). Stop keeps the partial answer (stopReason
        "cancelled"). Where the backend's steps do not split a prompt exactly (the page's wasm
        and numpy) nothing is reused and "reuseNote" says so (ChatTurn.reuse_note)."""
        from candle_web.generation.conversation import Conversation, check_messages

        llama, tokenizer = model
        messages = check_messages(python_value(messages), "chat: messages")
        if not messages or messages[-1]["role"] != "user":
            raise CandleError("chat: the conversation must end with a user message to answer")
        checked_text(messages[-1]["content"], "chat: the message", MAX_PROMPT_CHARS)
        total = sum(len(message["content"]) for message in messages)
        if total > MAX_CONVERSATION_CHARS:
            raise CandleError(f"chat: the conversation has {total} characters; at most "
                              f"{MAX_CONVERSATION_CHARS} (start a new chat, or export this one)")
        if context is not None and (isinstance(context, bool) or not isinstance(context, int)
                                    or context < 16):
            raise CandleError(f"chat: context must be a whole number of tokens >= 16, got "
                              f"{context!r}")
        opts = generation_options(options, "chat", PAGE_OPTIONS, MAX_NEW_TOKENS_LIMIT,
                                  add_special_tokens=False,
                                  constraint=_constraint(response_format))
        conversation = self._conversation
        if conversation is None or conversation.model is not llama:
            conversation = self._conversation = Conversation(llama, tokenizer)
        conversation.context_length = _context(llama, context)
        conversation.load_messages(messages[:-1])
        started = time.perf_counter()
        turn = conversation.send(messages[-1]["content"], opts, on_event)
        result = turn.result
        timings = {"elapsedMs": (time.perf_counter() - started) * 1000.0}
        if result is not None:
            timings.update(promptMs=result.prompt_seconds * 1000.0,
                           decodeMs=result.decode_seconds * 1000.0,
                           tokensPerSecond=result.tokens_per_second)
        return {"text": turn.text, "tokenIds": [int(t) for t in turn.token_ids],
                "promptTokens": turn.prompt_tokens, "reusedTokens": turn.reused_tokens,
                "newTokens": turn.new_tokens, "reuseNote": turn.reuse_note,
                "droppedMessages": turn.dropped_messages,
                "notice": turn.notice, "context": conversation.context_length,
                "stopReason": turn.stop_reason, "timings": timings}


    # --- structured outputs in the page: the worker prepares web-xgrammar first ------------

    def grammar_plan_json(self, key: str, response_format, bridge) -> str:
        """The worker's plan for a request's responseFormat on loaded model `key` (JSON; null
        without one): see candle_web.worker.grammar. `bridge`: the JS grammarBridge."""
        from candle_web.worker.grammar import grammar_plan

        llama, tokenizer = self.loaded(key)
        return json.dumps(grammar_plan(llama, tokenizer, python_value(response_format), bridge))

    def grammar_stats_json(self) -> str:
        """The last constrained request's grammar cost per step (JSON; {} before any)."""
        from candle_web.worker.grammar import request_stats

        return json.dumps(request_stats())

    def grammar_vocabulary_json(self, key: str) -> str:
        """Model `key`'s vocabulary as web-xgrammar's TokenizerInfo takes it (JSON)."""
        from candle_web.worker.grammar import vocabulary_json

        return vocabulary_json(*self.loaded(key))


def _constraint(response_format):
    """The request's responseFormat as a grammar Constraint (None: free text)."""
    if response_format is None:
        return None
    from candle_web.worker.grammar import page_constraint

    return page_constraint(python_value(response_format))


def chat_template_summary(llama, tokenizer) -> dict:
    """How the page renders this model's chat prompts: {"chatFormat": the recognised format
    ("chatml", "llama3", "llama2"), "jinja" for another template, None without one;
    "chatTemplate": "jinja" (the model's own template, rendered by Jinja2 as natively),
    "builtin" (the recognised format rendered directly) or None; "chatTemplateNote": why the
    model's own template is not rendered, for the page to show, else None}. In the page jinja2
    is there when the worker installed the vendored Jinja2/MarkupSafe wheels."""
    import importlib.util

    from candle_web.generation.chat_templates import JinjaChatTemplate, chat_template_for

    try:
        template = chat_template_for(llama, tokenizer)
    except CandleError as exc:
        # No template, or one neither Jinja nor the recognised formats render: plain prompts.
        return {"chatFormat": None, "chatTemplate": None,
                "chatTemplateNote": None if not llama.chat_template else str(exc)}
    if isinstance(template, JinjaChatTemplate):
        return {"chatFormat": template.format, "chatTemplate": "jinja", "chatTemplateNote": None}
    if importlib.util.find_spec("jinja2") is None:
        why = "jinja2 is not loaded in this page (the browser console says why)"
    else:
        why = "Jinja could not parse it"
    return {"chatFormat": template.format, "chatTemplate": "builtin",
            "chatTemplateNote": f"chat prompts use the built-in {template.format} format, not "
                                f"the model's own template: {why}"}


def _context(llama, context) -> int:
    limit = llama.config.max_position_embeddings
    return limit if context is None else min(int(context), limit) if limit else int(context)


def _weight_bytes(block) -> int:
    """Bytes held by a block's matmul weights (packed blocks, or f32 when dequantized at load)."""
    total = 0
    for layer in (block.attn.qkv, block.attn.out, block.mlp.gate_up, block.mlp.down):
        if layer.weight is not None:
            total += int(np.prod(layer.weight.dims())) * 4
        else:
            total += sum(np.asarray(q.data).nbytes for q in layer.qweights)
    return total
