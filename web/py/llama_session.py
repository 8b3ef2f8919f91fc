"""The worker's text-generation commands on the Python side (the Generate view): build a
LLaMA-family model from a GGUF file streamed into a buffer, then generate with streamed tokens.

The GGUF's tokenizer and chat template come from its own metadata. In Pyodide the numpy
backend dequantizes the weights to float32 once at load (quantized/qmatmul.py): SmolLM2-135M's
98 MB of Q4_1 blocks become ~540 MB of f32, each array far below wasm32's 2 GiB limit, and every
decode step is then BLAS matmuls.

Imported by web/worker.js inside Pyodide; importable natively too (tests/ui/native_text_models.py
builds the model from the same bytes through `build_generator` for the twin check).
"""
from __future__ import annotations

import json
import time

import numpy as np

import model_files

LLAMA_KIND = "llama"
# Bounds of one request, so a mistyped field cannot start an endless job.
MAX_NEW_TOKENS_LIMIT = 2048
MAX_PROMPT_CHARS = 32_000
# Page option name -> GenerationOptions field. Missing or null fields keep the defaults.
OPTION_FIELDS = {
    "maxTokens": "max_new_tokens",
    "temperature": "temperature",
    "topK": "top_k",
    "topP": "top_p",
    "seed": "seed",
    "repeatPenalty": "repeat_penalty",
    "repeatLastN": "repeat_last_n",
}
INTEGER_OPTIONS = ("maxTokens", "topK", "seed", "repeatLastN")

# The one model kept in memory: key -> (Llama, Tokenizer).
_loaded: dict = {}


def browser_models() -> str:
    return json.dumps(model_files.browser_models(LLAMA_KIND))


def manifest_json(model=None, hf_repo=None, revision=None, url=None) -> str:
    from candle_web.errors import ModelNotFound

    # A GGUF has no fixed file name, so only registry models (which list theirs) are loaded.
    if model is None:
        raise ModelNotFound("load (llama): choose a registry model, e.g. "
                            "smollm2-135m-instruct; Hub repos and folders are not supported "
                            "for LLaMA in the page (natively: candle-web generate --model FILE.gguf)")
    entry_manifest = model_files.manifest(LLAMA_KIND, (), model=model)
    ggufs = [f for f in entry_manifest["files"] if f["name"].endswith(".gguf")]
    if len(ggufs) != 1:
        raise ModelNotFound(f"load: registry model {model!r} must list exactly one .gguf file "
                            f"for the page, it lists {[f['name'] for f in entry_manifest['files']]}")
    return json.dumps(entry_manifest)


def allocate_file(key: str, file_name: str, size) -> np.ndarray:
    return model_files.allocate_file(key, file_name, size)


def discard_incoming(key: str) -> None:
    model_files.discard_incoming(key)


def build_generator(gguf_bytes) -> tuple:
    """(Llama, Tokenizer) from the bytes of one GGUF file."""
    from candle_web.io.gguf import GgufFile
    from candle_web.models.llama import Llama
    from candle_web.tokenizers import Tokenizer

    gguf = GgufFile(memoryview(gguf_bytes))
    return Llama.from_gguf(gguf), Tokenizer.from_gguf_metadata(gguf.metadata)


def build_model(key: str) -> str:
    """Build the model from the staged GGUF buffer; JSON summary of the model."""
    from candle_web.chat_templates import chat_template_for
    from candle_web.errors import CandleError, FormatError

    staged = model_files.take_staged(key, ())
    ggufs = [name for name in staged if name.endswith(".gguf")]
    if len(ggufs) != 1:
        raise FormatError(f"load: {key}: expected one .gguf file, received {sorted(staged)}")
    _loaded.clear()  # free the previous model before building the next one
    started = time.perf_counter()
    model, tokenizer = build_generator(staged.pop(ggufs[0]))
    build_ms = (time.perf_counter() - started) * 1000.0
    _loaded[key] = (model, tokenizer)
    try:
        chat_format = chat_template_for(model, tokenizer).format
    except CandleError:
        chat_format = None  # no template, or one the renderer does not know: plain prompts
    cfg = model.config
    weight_bytes = sum(_weight_bytes(block) for block in model.blocks)
    return json.dumps({"key": key, "buildMs": build_ms, "layers": cfg.num_layers,
                       "hidden": cfg.hidden_size, "vocab": cfg.vocab_size,
                       "context": cfg.max_position_embeddings, "chatFormat": chat_format,
                       "blockWeightBytes": weight_bytes})


def _weight_bytes(block) -> int:
    """Bytes held by a block's matmul weights (f32 when dequantized at load)."""
    total = 0
    for layer in (block.attn.qkv, block.attn.out, block.mlp.gate_up, block.mlp.down):
        if layer.weight is not None:
            total += int(np.prod(layer.weight.dims())) * 4
        else:
            total += sum(np.asarray(q.data).nbytes for q in layer.qweights)
    return total


def loaded_generator(key: str) -> tuple:
    from candle_web.errors import ModelNotFound

    if key not in _loaded:
        have = ", ".join(_loaded) or "none"
        raise ModelNotFound(f"generate: model {key!r} is not loaded (loaded: {have}); send "
                            "`load` with kind 'llama' first")
    return _loaded[key]


def generation_options(options: dict | None, chat: bool):
    """GenerationOptions from the page's plain dict; unknown names are refused."""
    from candle_web.errors import CandleError
    from candle_web.generation import GenerationOptions

    fields = model_files.numeric_options(options, OPTION_FIELDS, INTEGER_OPTIONS, "generate")
    max_new = fields.get("max_new_tokens")
    if max_new is not None and not 1 <= max_new <= MAX_NEW_TOKENS_LIMIT:
        raise CandleError(f"generate: maxTokens must be 1..{MAX_NEW_TOKENS_LIMIT}, got {max_new}")
    if fields.get("repeat_last_n", 0) < 0:
        raise CandleError(f"generate: repeatLastN must be >= 0, got {fields['repeat_last_n']}")
    # A chat template places BOS itself (chat_templates.py).
    return GenerationOptions(add_special_tokens=not chat, **fields)


def render_prompt(model, tokenizer, prompt: str, chat: bool) -> str:
    from candle_web.chat_templates import chat_template_for
    from candle_web.errors import CandleError

    if not isinstance(prompt, str) or not prompt.strip():
        raise CandleError("generate: the prompt is empty; type something to continue from")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise CandleError(f"generate: the prompt has {len(prompt)} characters; at most "
                          f"{MAX_PROMPT_CHARS}")
    if not chat:
        return prompt
    return chat_template_for(model, tokenizer).render([{"role": "user", "content": prompt}])


def run_generation(model, tokenizer, prompt: str, chat: bool, options=None, on_event=None) -> dict:
    """Generate; on_event(kind, payload dict) sees "prompt", "token" and "done" (see
    candle_web.generation.decode_loop). The result payload is what the page shows and the
    twin check compares."""
    from candle_web.generation import generate

    if options is not None and hasattr(options, "to_py"):
        options = options.to_py()  # a JS object from the worker
    opts = generation_options(options, chat)
    rendered = render_prompt(model, tokenizer, prompt, chat)
    started = time.perf_counter()
    result = generate(model, tokenizer, rendered, opts, on_event=on_event)
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


def generate(key: str, prompt: str, chat: bool, options=None, on_event=None) -> str:
    """For the worker: generate with the loaded model `key`; on_event(kind, json_text)
    streams the events; the return value is the JSON of the final result."""
    model, tokenizer = loaded_generator(key)

    def forward(kind, payload):
        if on_event is not None:
            on_event(kind, json.dumps(payload))

    return json.dumps(run_generation(model, tokenizer, prompt, bool(chat), options, forward))
