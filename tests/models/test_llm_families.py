"""The LLM families of models/llama.py against transformers, from both checkpoint layouts.

Per family, a tiny random model is made by transformers itself (its *ForCausalLM class,
`torch.manual_seed`, 2 layers, d 64, vocab 256; every 1-D weight -- norms, biases -- nudged off
its init so a norm offset or a bias left out would show), saved by transformers as an HF folder
(config.json + safetensors) and by the project's GGUF writer as llama.cpp's converter lays it
out (llama_testlib.to_gguf). Both must give transformers' logits at every prompt position and
its 8 greedy ids.

Tolerance: both sides run the same function in f32 but sum in other orders (BLAS blocking,
fused QKV, grouped-query attention), so each of the L = 2 layers adds reassociation error that
the next amplifies; rather than bound that by hand, `assert_near_truth` measures transformers'
own f32 error against its float64 run on the same weights and allows ours MEASURED_FACTOR (4)
times that, plus FLOOR_ULPS of the largest logit (tests/tolerances.py). The greedy ids are
compared with the float64 truth's, whose top-2 margin at each step is checked to exceed that
bound (so an equal id is not luck).
"""

from __future__ import annotations

import numpy as np
import pytest

from llama_testlib import (GGUF_ARCHITECTURE, one_blas_thread, to_gguf, transformers_logits,
                           transformers_model)
from tolerances import assert_near_truth, measured_bound

from candle_web.models.llama import Llama

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

PROMPT = [5, 17, 3, 90, 44, 7, 12, 60, 1, 33]
NEW_TOKENS = 8

BASE = {
    "vocab_size": 256, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    "max_position_embeddings": 128, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
    "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2,
}

FAMILIES = {
    "qwen2": dict(BASE, model_type="qwen2", tie_word_embeddings=True, rope_theta=1e6),
}


@pytest.fixture(scope="module", autouse=True)
def _blas_threads():
    with one_blas_thread():
        yield


def make_family(name: str, seed: int = 0):
    """(config, HF-named f32 state) of a transformers-initialised tiny model of family `name`."""
    config = FAMILIES[name]
    torch.manual_seed(seed)
    model = transformers_model(config)
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() == 1:  # norms (init 1, or 0 for Gemma's 1 + w), biases (init 0)
                param.add_(0.1 * torch.randn_like(param))
    state = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    if config.get("tie_word_embeddings"):
        state.pop("lm_head.weight", None)
    return config, state, model


def truth_greedy(config, state, prompt, steps, bound):
    """float64 transformers' greedy ids, each step's top-2 margin checked against `bound`."""
    ids = list(prompt)
    for _ in range(steps):
        logits = transformers_logits(config, state, ids, dtype=np.float64)[-1]
        top = np.sort(logits)[-2:]
        assert top[1] - top[0] > 2 * bound, "a near tie: the greedy ids would prove nothing"
        ids.append(int(np.argmax(logits)))
    return ids[len(prompt):]


def greedy(model, prompt, steps):
    """Our greedy ids: the prompt in one pass, then one token at a time through the KV cache."""
    model.clear_kv_cache()
    logits = model.forward([prompt]).to_numpy()[0]
    out = []
    for _ in range(steps):
        out.append(int(np.argmax(logits)))
        logits = model.forward([[out[-1]]]).to_numpy()[0]
    return out


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request, tmp_path_factory):
    name = request.param
    config, state, model = make_family(name)
    folder = tmp_path_factory.mktemp(name)
    model.save_pretrained(folder / "hf")
    arch = GGUF_ARCHITECTURE[config["model_type"]]
    gguf = to_gguf(state, config, folder / f"{name}.gguf", arch=arch)
    truth = transformers_logits(config, state, PROMPT, dtype=np.float64)
    reference = transformers_logits(config, state, PROMPT)
    return name, config, state, folder / "hf", gguf, reference, truth


@pytest.mark.parametrize("layout", ["hf", "gguf"])
def test_logits_and_greedy_ids_equal_transformers(family, layout):
    name, config, state, hf_folder, gguf, reference, truth = family
    model = Llama.from_pretrained(hf_folder if layout == "hf" else gguf)
    assert model.config.family == GGUF_ARCHITECTURE[config["model_type"]] or layout == "hf"
    model.clear_kv_cache()
    got = model.forward([PROMPT], all_logits=True).to_numpy()[0]
    assert_near_truth(got, reference, truth, f"{name} {layout} logits")
    bound = measured_bound(reference, truth)
    assert greedy(model, PROMPT, NEW_TOKENS) == truth_greedy(config, state, PROMPT, NEW_TOKENS,
                                                              bound)


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_weight_names_agree_with_the_gguf_package(name):
    """The family's HF -> GGUF name table (which also writes these GGUF files) is llama.cpp's
    converter mapping as the `gguf` package states it."""
    gguf = pytest.importorskip("gguf")
    from candle_web.models.llama import weight_names

    config, state, _ = make_family(name)
    arch = GGUF_ARCHITECTURE[config["model_type"]]
    mapping = gguf.get_tensor_name_map(gguf.MODEL_ARCH[arch.upper()], config["num_hidden_layers"])
    for hf_name in state:
        expected = mapping.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        assert weight_names(arch).translate(hf_name, "hf", "gguf") == expected, hf_name
