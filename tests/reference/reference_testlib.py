"""Helpers shared by the record_*.py programs: transformers' greedy decoding with the KV cache
and the JSON record of one greedy prompt (record_llama.py, record_qwen2.py; test_llama_float
runs the same decoding live)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
TOP_LOGITS = 8  # the last prompt position's top logits kept in a record


def torch_greedy(model, prompt_ids: list, max_new_tokens: int, eos_id: int,
                 margins: list | None = None):
    """Greedy decoding with the KV cache, stopping at EOS (not included). Returns the new ids
    and the logits of the last prompt position; `margins` (a list) receives each chosen
    token's logit lead over the runner-up (how close a greedy tie-break came)."""
    import warnings

    import torch

    with torch.no_grad(), warnings.catch_warnings():
        # transformers 5 renamed past_key_values; the old name still works and warns.
        warnings.simplefilter("ignore", FutureWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        out = model(torch.tensor([prompt_ids]), use_cache=True)
        first_logits = out.logits[0, -1].float().numpy().copy()
        past = out.past_key_values
        next_id = int(first_logits.argmax())
        if margins is not None:
            margins.append(top_lead(first_logits))
        generated = []
        while next_id != eos_id and len(generated) < max_new_tokens:
            generated.append(next_id)
            out = model(torch.tensor([[next_id]]), past_key_values=past, use_cache=True)
            past = out.past_key_values
            next_id = int(out.logits[0, -1].argmax())
            if margins is not None:
                margins.append(top_lead(out.logits[0, -1].float().numpy()))
    return generated, first_logits


def top_lead(logits: np.ndarray) -> float:
    """The top logit's lead over the second."""
    top2 = np.partition(logits, -2)[-2:]
    return float(top2[1] - top2[0])


def greedy_record(model, tokenizer, prompt: str, prompt_ids: list, max_new_tokens: int,
                  eos_id: int, margins: list | None = None) -> dict:
    """torch_greedy on one prompt, as the JSON fields the recordings share: the prompt text and
    ids, the new ids and text, whether EOS stopped it, and the top TOP_LOGITS logits of the
    last prompt position (ids and values)."""
    generated, logits = torch_greedy(model, prompt_ids, max_new_tokens, eos_id, margins)
    top = np.argsort(-logits, kind="stable")[:TOP_LOGITS]
    return {
        "prompt": prompt, "prompt_ids": list(map(int, prompt_ids)), "generated_ids": generated,
        "generated_text": tokenizer.decode(generated),
        "stopped_at_eos": len(generated) < max_new_tokens,
        "top_logits": {"ids": top.tolist(), "values": logits[top].astype(float).tolist()},
    }
