"""The worker's text-to-text commands on the Python side (the Text-to-text view): build a T5
from config.json + model.safetensors + tokenizer.json streamed into buffers, then generate with
streamed tokens.

No T5 weights can be fetched offline (none is in any package registry), so a T5 comes from the
registry when it lists one, from the Hub (online), or from a folder on the serving origin
(`candle-web serve --local-model DIR` serves DIR under /models/local/<DIR name>/).

Imported by web/worker.js inside Pyodide; importable natively too (tests/ui/native_text_models.py
builds the model from the same bytes through `build_generator` for the twin check).
"""
from __future__ import annotations

import json
import time
import warnings

import numpy as np

import model_files

T5_KIND = "t5"
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
TOKENIZER_FILE = "tokenizer.json"
REQUIRED_FILES = (CONFIG_FILE, WEIGHTS_FILE, TOKENIZER_FILE)
DEFAULT_MAX_NEW_TOKENS = 64
MAX_NEW_TOKENS_LIMIT = 512
MAX_INPUT_CHARS = 32_000
# Page option name -> GenerationOptions field.
OPTION_FIELDS = {
    "maxTokens": "max_new_tokens",
    "temperature": "temperature",
    "topK": "top_k",
    "topP": "top_p",
    "seed": "seed",
}
INTEGER_OPTIONS = ("maxTokens", "topK", "seed")
# What the view says when no T5 can be had here: the ways to get one.
HOW_TO_GET_A_T5 = (
    "No T5 weights are available offline. Load one of: a Hub repository and revision (online, "
    "e.g. google-t5/t5-small at a pinned commit); or a folder this server serves: start it with "
    "`candle-web serve --local-model DIR` (DIR holds config.json, model.safetensors and "
    "tokenizer.json) and enter models/local/<DIR name>/ as the folder. Natively: "
    "`candle-web text2text --model DIR \"translate English to German: ...\"`. `make demo` "
    "also trains a tiny demo T5 that only spells out numbers (examples/t5_spell_numbers.py) "
    "and serves it; the view then offers it as its default.")

# The one model kept in memory: key -> T5TextGenerator.
_loaded: dict = {}


def browser_models() -> str:
    return json.dumps(model_files.browser_models(T5_KIND))


def how_to_get_a_model() -> str:
    return HOW_TO_GET_A_T5


def manifest_json(model=None, hf_repo=None, revision=None, url=None) -> str:
    return json.dumps(model_files.manifest(T5_KIND, REQUIRED_FILES, model, hf_repo, revision,
                                           url))


def allocate_file(key: str, file_name: str, size) -> np.ndarray:
    return model_files.allocate_file(key, file_name, size)


def discard_incoming(key: str) -> None:
    model_files.discard_incoming(key)


def build_generator(files: dict):
    """A T5TextGenerator from {file name: bytes-like} (config, safetensors, tokenizer)."""
    from candle_web.errors import FormatError
    from candle_web.models.t5 import T5TextGenerator, load_t5_safetensors
    from candle_web.tokenizers import Tokenizer

    try:
        config = json.loads(bytes(files[CONFIG_FILE]).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise FormatError(f"load: {CONFIG_FILE} is not JSON: {error}") from None
    model = load_t5_safetensors(memoryview(files[WEIGHTS_FILE]), config)
    return T5TextGenerator(model, Tokenizer.from_bytes(memoryview(files[TOKENIZER_FILE])))


def build_model(key: str) -> str:
    """Build the T5 from the staged buffers; JSON summary of the model."""
    staged = model_files.take_staged(key, REQUIRED_FILES)
    _loaded.clear()  # free the previous model before building the next one
    started = time.perf_counter()
    generator = build_generator(staged)
    build_ms = (time.perf_counter() - started) * 1000.0
    _loaded[key] = generator
    cfg = generator.model.config
    return json.dumps({"key": key, "buildMs": build_ms, "dModel": cfg.d_model,
                       "encoderLayers": cfg.num_layers, "decoderLayers": cfg.num_decoder_layers,
                       "vocab": cfg.vocab_size, "gated": cfg.is_gated_act,
                       "maxInputTokens": cfg.max_input_tokens})


def loaded_generator(key: str):
    from candle_web.errors import ModelNotFound

    if key not in _loaded:
        have = ", ".join(_loaded) or "none"
        raise ModelNotFound(f"text2text: model {key!r} is not loaded (loaded: {have}); send "
                            "`load` with kind 't5' first")
    return _loaded[key]


def generation_options(options: dict | None):
    from candle_web.errors import CandleError
    from candle_web.generation import GenerationOptions

    fields = model_files.numeric_options(options, OPTION_FIELDS, INTEGER_OPTIONS, "text2text")
    max_new = fields.setdefault("max_new_tokens", DEFAULT_MAX_NEW_TOKENS)
    if not 1 <= max_new <= MAX_NEW_TOKENS_LIMIT:
        raise CandleError(f"text2text: maxTokens must be 1..{MAX_NEW_TOKENS_LIMIT}, got {max_new}")
    return GenerationOptions(**fields)


def run_text2text(generator, prompt: str, options=None, on_event=None) -> dict:
    """Generate from `prompt` (task prefix included); on_event(kind, payload dict) sees
    "token" and "done". The result payload is what the page shows and the twin check compares."""
    from candle_web.errors import CandleError

    if options is not None and hasattr(options, "to_py"):
        options = options.to_py()  # a JS object from the worker
    if not isinstance(prompt, str) or not prompt.strip():
        raise CandleError("text2text: the input is empty; type a text (with a task prefix such "
                          "as 'translate English to German: ')")
    if len(prompt) > MAX_INPUT_CHARS:
        raise CandleError(f"text2text: the input has {len(prompt)} characters; at most "
                          f"{MAX_INPUT_CHARS}")
    opts = generation_options(options)
    full_tokens = len(generator.tokenizer.encode(prompt).ids)
    started = time.perf_counter()
    # The truncation warning is reported in the result (truncated, inputTokens) instead.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = generator(prompt, opts, on_event=on_event)
    elapsed_ms = (time.perf_counter() - started) * 1000.0
    generated = len(result.token_ids)
    return {
        "text": result.text, "tokenIds": [int(t) for t in result.token_ids],
        "inputTokens": result.input_tokens, "fullInputTokens": full_tokens,
        "truncated": bool(result.truncated),
        "maxInputTokens": generator.model.config.max_input_tokens,
        "stopReason": result.stop_reason,
        "timings": {"elapsedMs": elapsed_ms,
                    "tokensPerSecond": generated / (elapsed_ms / 1000.0) if elapsed_ms else 0.0},
    }


def text2text(key: str, prompt: str, options=None, on_event=None) -> str:
    """For the worker: on_event(kind, json_text) streams the events; returns the result JSON."""
    generator = loaded_generator(key)

    def forward(kind, payload):
        if on_event is not None:
            on_event(kind, json.dumps(payload))

    return json.dumps(run_text2text(generator, prompt, options, forward))
