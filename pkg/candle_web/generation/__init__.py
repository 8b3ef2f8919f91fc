"""Text generation: logits processing and sampling, repeat penalty, stop conditions and
UTF-8-safe streaming, and the `generate` loop that ties them to a causal LM (or, through
`Seq2SeqLM`, an encoder-decoder)."""

from .decode_loop import (STOP_CONTEXT, STOP_EOS, STOP_MAX_TOKENS, STOP_STRING, CausalLM, Decoder,
                          GenerationOptions, GenerationResult, Seq2SeqLM, generate, sample_steps)
from .logits_processor import DEFAULT_SEED, LogitsProcessor, Sampling, top_k_mask, top_p_mask
from .penalties import apply_repeat_penalty, penalty_window
from .stopping import StopStringMatcher
from .streaming import TokenOutputStream

__all__ = ["generate", "sample_steps", "Decoder", "CausalLM", "Seq2SeqLM", "GenerationOptions",
           "GenerationResult", "LogitsProcessor", "Sampling", "DEFAULT_SEED", "top_k_mask", "top_p_mask", "apply_repeat_penalty", "penalty_window",
           "StopStringMatcher", "TokenOutputStream", "STOP_EOS", "STOP_STRING",
           "STOP_MAX_TOKENS", "STOP_CONTEXT"]
