"""The Text-to-text view's session: a T5 from config.json + model.safetensors + tokenizer.json,
then generation from a prompt (task prefix included) with streamed tokens.

No T5 weights can be fetched offline (none is in any package registry), so a T5 comes from the
registry when it lists one, from the Hub (online), or from a folder on the serving origin
(`candle-web serve --local-model DIR` serves DIR under /models/local/<DIR name>/).
"""
from __future__ import annotations

import time
import warnings

from candle_web.worker.session import (CONFIG_FILE, TOKENIZER_FILE, Session, checked_text,
                                       generation_options)

WEIGHTS_FILE = "model.safetensors"
DEFAULT_MAX_NEW_TOKENS = 64
MAX_NEW_TOKENS_LIMIT = 512
MAX_INPUT_CHARS = 32_000
PAGE_OPTIONS = ("maxTokens", "temperature", "topK", "topP", "seed")
# What the view says when no T5 can be had here: the ways to get one.
HOW_TO_GET_A_T5 = (
    "No T5 weights are available offline. Load one of: a Hub repository and revision (online, "
    "e.g. google-t5/t5-small at a pinned commit); or a folder this server serves: start it with "
    "`candle-web serve --local-model DIR` (DIR holds config.json, model.safetensors and "
    "tokenizer.json) and enter models/local/<DIR name>/ as the folder. Natively: "
    "`candle-web text2text --model DIR \"translate English to German: ...\"`. `make demo` "
    "also trains a tiny demo T5 that only spells out numbers (examples/t5_spell_numbers.py) "
    "and serves it; the view then offers it as its default.")


class T5Session(Session):
    kind = "t5"
    command = "text2text"
    required_files = (CONFIG_FILE, WEIGHTS_FILE, TOKENIZER_FILE)
    hint = HOW_TO_GET_A_T5

    def build(self, files: dict):
        from candle_web.pipelines import load_t5
        from candle_web.pipelines.text2text import T5TextGenerator

        loaded = load_t5(files)  # opened as a folder is (io/checkpoint.py)
        return T5TextGenerator(loaded.model, loaded.tokenizer)

    def describe(self, generator) -> dict:
        cfg = generator.model.config
        return {"dModel": cfg.d_model, "encoderLayers": cfg.num_layers,
                "decoderLayers": cfg.num_decoder_layers, "vocab": cfg.vocab_size,
                "gated": cfg.is_gated_act, "maxInputTokens": cfg.max_input_tokens}

    def compute(self, generator, prompt=None, options=None, on_event=None) -> dict:
        """on_event(kind, payload) sees "token" and "done". The payload is what the page shows
        and the twin check compares."""
        checked_text(prompt, "text2text: the input", MAX_INPUT_CHARS,
                     "; type a text (with a task prefix such as 'translate English to German: ')")
        opts = generation_options(options, "text2text", PAGE_OPTIONS, MAX_NEW_TOKENS_LIMIT,
                                  default_max_new=DEFAULT_MAX_NEW_TOKENS)
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
                        "tokensPerSecond": generated / (elapsed_ms / 1000.0) if elapsed_ms
                        else 0.0},
        }
