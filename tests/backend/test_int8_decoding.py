"""The compute type int8 through whole models (CANDLE_WEB_COMPUTE_TYPE=int8: the fused LLaMA
part's quantized products in integer arithmetic, numba kernels/qint8.py).

Bitwise, as for float32 (tests/backend/test_batched_decoding.py, whose helpers run here): a
row's logits are the same alone, in a batch of rows joining and leaving, and as a prompt's
token in one call or token by token -- the activations are quantized per row and the products
keep a fixed order, so continuous batching's guarantee holds in int8 too.

Against the float32 path (the reference, itself checked against transformers): teacher-forced
on the float path's greedy ids, the int8 logits pick the same next token at almost every
position, and the positions where they differ are ones where the float path itself hesitates
(its top-2 margin small). Measured over the 7 reference prompts x 12 positions:
SmolLM2-135M (Q4_1/Q8_0) agrees at 79/84, differing where float32's margin was 0.02-0.26
logits; Qwen2.5-Coder-0.5B (Q4_K_M: Q5_0/Q8_0/Q4_K/Q6_K) at 83/84, margin 0.009 there. The
largest logit difference was 0.38-0.47 of the logits' standard deviation; free-running greedy
continuations of 12 tokens were identical on 3/7 (SmolLM2) and 6/7 (Qwen) prompts.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.backend.test_batched_decoding import (REAL_PROMPTS, TINY_PROMPTS,
                                                 assert_batched_equals_alone,
                                                 assert_prompt_paths_agree, tiny_model)
from tests.parts_testlib import llama_part

from candle_web.backend import parts
from candle_web.backend.settings import override_settings, reload_settings
from candle_web.models.llama import Llama

TEACHER_STEPS = 12
# Per model: (least share of positions where int8's argmax is float32's, largest float32 top-2
# margin, in logits, at a position where they differ). Measured: see the module doc.
AGREEMENT = {"smollm2-135m-instruct": (0.9, 0.5), "qwen2.5-coder-0.5b-instruct": (0.95, 0.5)}


@pytest.fixture
def int8(numba_device):
    override_settings(compute_type="int8")
    yield numba_device
    reload_settings()


def int8_levels(model) -> bool:
    """Whether the model's fused part took the int8 kernels (levels viewed as uint8)."""
    part = llama_part(model)
    weights = [layer[3] for layer in part.layers] + [part.head]
    return all(isinstance(w, tuple) and w[0].dtype == np.uint8 for w in weights)


@pytest.mark.parametrize("kind", ["Q8_0", "Q4_1", "Q6_K", "qwen2-mixed", "f32"])
def test_tiny_models_in_int8_keep_rows_bitwise(int8, tmp_path, kind):
    """Also a float checkpoint, whose matrices the compute type int8 quantizes per output row
    at load (quantized/int8_weights.py)."""
    path, _, _ = tiny_model(kind, tmp_path, int8)
    model = Llama.load(path, device=int8, mode="dequantize" if kind == "f32" else "auto")
    assert int8_levels(model)
    assert_batched_equals_alone(model, TINY_PROMPTS)
    assert_prompt_paths_agree(model, [1, 5, 9, 4, 2, 7, 80, 31, 8, 3, 40], kind)


def greedy_logits(model, prompt, steps, forced=None):
    """Logits of `steps` positions after `prompt`, feeding `forced` ids (or the greedy ones)."""
    single = parts.start_causal_decoding(model)
    model.clear_kv_cache(len(prompt) + steps + 1)
    logits = single(np.array([prompt]), 0).to_numpy()[0]
    rows, ids = [logits], [int(np.argmax(logits))]
    for step in range(steps - 1):
        token = forced[step] if forced is not None else ids[-1]
        logits = single(np.array([[token]]), model.seq_len).to_numpy()[0]
        rows.append(logits)
        ids.append(int(np.argmax(logits)))
    return ids, np.array(rows)


@pytest.mark.parametrize("name", sorted(AGREEMENT))
def test_real_models_in_int8(numba_device, name):
    """Rows bitwise alone and batched in int8, and int8's next tokens those of float32 where
    float32 is sure of them."""
    from candle_web.pipelines import load_llama

    reload_settings()
    reference = load_llama(name, device=numba_device)
    prompts = [list(map(int, reference.tokenizer.encode(t).ids)) for t in REAL_PROMPTS]
    float_runs = [greedy_logits(reference.model, p, TEACHER_STEPS) for p in prompts]
    try:
        override_settings(compute_type="int8")
        loaded = load_llama(name, device=numba_device)
        assert int8_levels(loaded.model)
        assert_batched_equals_alone(loaded.model, prompts)
        agree, total, worst_margin = 0, 0, 0.0
        for prompt, (ids, float_logits) in zip(prompts, float_runs):
            int8_ids, int8_logits = greedy_logits(loaded.model, prompt, TEACHER_STEPS, forced=ids)
            for position in range(TEACHER_STEPS):
                total += 1
                top2 = np.sort(float_logits[position])[-2:]
                if int8_ids[position] == ids[position]:
                    agree += 1
                else:
                    worst_margin = max(worst_margin, float(top2[1] - top2[0]))
    finally:
        reload_settings()
    least, margin = AGREEMENT[name]
    assert agree / total >= least, f"{name}: int8 picked float32's token at {agree}/{total}"
    assert worst_margin <= margin, (f"{name}: int8 differs where float32's top-2 margin is "
                                    f"{worst_margin:.2f}")
