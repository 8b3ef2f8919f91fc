"""Continuous batching's decode step (backend/batched_steps.py `start_batched_causal_decoding`; on
numba `FusedLlamaDecoder.step_rows`, kernels/batched_step.py): B sequences, each at its own
position with its own KV cache, one token each per step, every weight read once per step.

What must hold, and why it is checked bitwise: a served request's greedy ids must not depend on
the requests that run beside it (issue 25), so each row's logits must equal, bit for bit, those
the single-sequence step (`start_causal_decoding`, what `candle-web generate` runs) gives that
sequence alone -- any tolerance would allow an argmax to flip. Rows join at different rounds
with prompts of different lengths and leave after different numbers of tokens, as in the
server. Independently of the single step, each row's logits on tiny random models are checked
against float64 transformers (the measured bound of tests/tolerances_testlib.py), for the
kernel forms: 32-element groups without and with offsets (Q8_0, Q4_1), 16-element ones (Q6_K),
mixed types with a QKV bias (qwen2), f32 matrices; serial and parallel.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.models.llama_testlib import (QWEN2_CONFIG, TINY_CONFIG, WIDE_CONFIG, dequantized_state,
                                        qwen2_mixed_gguf, random_state, to_gguf,
                                        transformers_logits)
from tests.parts_testlib import llama_part
from tests.tolerances_testlib import assert_near_truth

from candle_web import Device
from candle_web.backend import batched_steps, parts
from candle_web.core.errors import BackendUnavailable
from candle_web.models.llama import Llama
from candle_web.quantized import GgmlDType

REAL_MODELS = ["smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct"]
REAL_PROMPTS = ["Hello", "The capital of France is", "def fibonacci(n):",
                "Once upon a time, in a land far away, there lived a", "1, 2, 3,",
                "Write a haiku about the sea.", "import numpy as np\n"]
# Per row: the round it joins at and the decode steps it runs (then it leaves).
JOINS = [0, 0, 1, 3, 3, 4, 6]
STEPS = [8, 5, 9, 3, 7, 6, 4]


def decode_alone(model, prompt, steps):
    """(greedy ids, logits [steps, vocab] of the decode steps) through the single-sequence
    path: the prompt in one call, then one token per call."""
    single = parts.start_causal_decoding(model)
    model.clear_kv_cache(len(prompt) + steps + 1)
    logits = single(np.array([prompt]), 0).to_numpy()[0]
    ids, rows = [int(np.argmax(logits))], []
    for _ in range(steps):
        logits = single(np.array([[ids[-1]]]), model.seq_len).to_numpy()[0]
        rows.append(logits)
        ids.append(int(np.argmax(logits)))
    return ids, np.array(rows)


def decode_batched(model, prompts, joins, steps):
    """The scheduler's rounds: each round one batched step over the rows already running
    (each one's last id at its own position), then the rows joining this round run their
    prompt alone. Returns per row (greedy ids, logits [steps, vocab]) and the largest batch."""
    single = parts.start_causal_decoding(model)
    batched = batched_steps.start_batched_causal_decoding(model)
    ids, logits, caches = [None] * len(prompts), [[] for _ in prompts], [None] * len(prompts)
    largest, round_ = 0, 0
    while round_ <= max(joins) or any(c is not None for c in caches):
        running = [row for row, c in enumerate(caches) if c is not None]
        if running:
            largest = max(largest, len(running))
            out = batched([ids[row][-1] for row in running], [caches[row] for row in running])
            assert out.shape == (len(running), model.lm_head.out_features)
            for index, row in enumerate(running):
                logits[row].append(out[index])
                ids[row].append(int(np.argmax(out[index])))
                if len(logits[row]) == steps[row]:
                    caches[row] = None  # leaves: its slot is free
        for row in (r for r, j in enumerate(joins) if j == round_):
            model.clear_kv_cache(len(prompts[row]) + steps[row] + 1)
            first = single(np.array([prompts[row]]), 0).to_numpy()[0]
            ids[row], caches[row] = [int(np.argmax(first))], model.caches
        round_ += 1
    return [(ids[row], np.array(logits[row])) for row in range(len(prompts))], largest


def assert_batched_equals_alone(model, prompts, joins=JOINS, steps=STEPS):
    """Every row's logits bit-identical to its run alone (hence its greedy ids); returns the
    batched rows' (ids, logits)."""
    alone = [decode_alone(model, p, s) for p, s in zip(prompts, steps)]
    rows, largest = decode_batched(model, prompts, joins, steps)
    assert largest >= 4, "the rounds never batched more than a few rows"
    for row, ((ids, logits), (alone_ids, alone_logits)) in enumerate(zip(rows, alone)):
        assert logits.shape == alone_logits.shape
        differ = np.flatnonzero((logits != alone_logits).any(axis=1))
        assert differ.size == 0, (f"row {row}: logits of steps {differ.tolist()} differ from the "
                                  f"single step's (max {np.abs(logits - alone_logits).max()})")
        assert ids == alone_ids, f"row {row}"
    return rows


@pytest.mark.parametrize("name", REAL_MODELS)
def test_real_models_rows_joining_later_match_alone_bitwise(numba_device, name):
    from candle_web.pipelines import load_llama

    loaded = load_llama(name, device=numba_device)
    model = loaded.model
    assert isinstance(batched_steps.start_batched_causal_decoding(model), batched_steps.FusedBatchedSteps)
    prompts = [loaded.tokenizer.encode(text).ids for text in REAL_PROMPTS]
    assert len({len(p) for p in prompts}) >= 5, "prompts of different lengths"
    assert_batched_equals_alone(model, [list(map(int, p)) for p in prompts])


TINY_PROMPTS = [[1, 5, 9], [4], [2, 7, 80, 31, 8, 3], [40, 41], [6, 6, 6, 6], [90, 3, 12],
                [77]]


def tiny_model(kind, folder, device):
    """(model path, config, weights as the file holds them in HF layout) for one kernel form."""
    if kind == "qwen2-mixed":
        path, decoded = qwen2_mixed_gguf(folder)
        return path, QWEN2_CONFIG, decoded
    config = WIDE_CONFIG if kind == "Q6_K" else TINY_CONFIG
    state = random_state(config, seed=11)
    qtype = None if kind == "f32" else GgmlDType.parse(kind)
    path = to_gguf(state, config, folder / f"{kind}.gguf", quantize_to=qtype)
    return path, config, dequantized_state(state, qtype)


@pytest.mark.parametrize("parallel", [True, False])
@pytest.mark.parametrize("kind", ["Q8_0", "Q4_1", "Q6_K", "qwen2-mixed", "f32"])
def test_tiny_models_bitwise_and_near_float64_truth(numba_device, tmp_path, kind, parallel):
    pytest.importorskip("transformers")
    path, config, weights = tiny_model(kind, tmp_path, numba_device)
    model = Llama.load(path, device=numba_device,
                       mode="dequantize" if kind == "f32" else "auto")
    assert model.lm_head.is_quantized == (kind != "f32")
    part = llama_part(model)
    assert part is not None
    part.parallel = parallel
    rows = assert_batched_equals_alone(model, TINY_PROMPTS)
    reference = Llama.load(path, device=Device.cpu(backend="numpy"))
    for prompt, (ids, logits) in zip(TINY_PROMPTS, rows):
        sequence = prompt + ids[:-1]  # logits[k] is read at position len(prompt) + k
        positions = slice(len(prompt), len(sequence))
        reference.clear_kv_cache()
        expected = reference.forward([sequence], all_logits=True).to_numpy()[0][positions]
        truth = transformers_logits(config, weights, sequence, dtype=np.float64)[positions]
        assert_near_truth(logits, expected, truth, f"{kind} prompt {prompt}")


def test_numpy_backend_takes_the_per_row_reference(tmp_path):
    """Without a batched part (numpy) each row runs the single step in turn, on its own caches:
    bit-identical by construction; the model's own caches are left as they were."""
    path = to_gguf(random_state(TINY_CONFIG, seed=12), TINY_CONFIG, tmp_path / "q8.gguf",
                   quantize_to=GgmlDType.Q8_0)
    model = Llama.load(path, device=Device.cpu(backend="numpy"))
    assert isinstance(batched_steps.start_batched_causal_decoding(model), batched_steps.ReferenceBatchedSteps)
    assert_batched_equals_alone(model, TINY_PROMPTS)
    # several prompts at once: one after another, each as alone
    steps = batched_steps.start_batched_causal_decoding(model)
    caches = []
    for _ in TINY_PROMPTS[:3]:
        model.clear_kv_cache(8)
        caches.append(model.caches)
    logits = steps.prompts(TINY_PROMPTS[:3], caches)
    for row, prompt in enumerate(TINY_PROMPTS[:3]):
        assert np.array_equal(logits[row], prompt_in_one_call(model, prompt)[0])
        assert caches[row][0].length == len(prompt)
    own = model.caches
    steps = batched_steps.start_batched_causal_decoding(model)
    model.clear_kv_cache(8)
    other = model.caches
    model.caches = own
    steps([3], [other])
    assert model.caches is own and other[0].length == 1


@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_model_forward_rows_is_near_the_single_step(tmp_path, backend):
    """The model's batched reference (`Llama.forward_rows`, batched_steps.ModelBatchedSteps: one product
    per weight for all rows) against float64 transformers, rows at different positions; it is
    documented as not bit-identical, so only the measured bound is asserted. Its greedy ids
    are compared too (random weights with these prompts have no near-ties at 1e-3)."""
    pytest.importorskip("transformers")
    if backend == "numba":
        try:
            from candle_web.backend import get_backend
            get_backend("numba")
        except BackendUnavailable as e:
            pytest.skip(f"numba backend unavailable: {e}")
    state = random_state(TINY_CONFIG, seed=13)
    path = to_gguf(state, TINY_CONFIG, tmp_path / "q8.gguf", quantize_to=GgmlDType.Q8_0)
    model = Llama.load(path, device=Device.cpu(backend=backend))
    steps = batched_steps.start_batched_causal_decoding(model, exact=False)
    if backend == "numpy":
        assert isinstance(steps, batched_steps.ModelBatchedSteps)
    else:
        assert isinstance(steps, batched_steps.FusedBatchedSteps)
        steps = batched_steps.ModelBatchedSteps(model)
    reference = Llama.load(path, device=Device.cpu(backend="numpy"))
    weights = dequantized_state(state, GgmlDType.Q8_0)
    caches, sequences = [], []
    for prompt in TINY_PROMPTS:
        model.clear_kv_cache(len(prompt) + 2)
        first = model.forward([prompt]).to_numpy()[0]
        caches.append(model.caches)
        sequences.append(prompt + [int(np.argmax(first))])
    logits = steps([s[-1] for s in sequences], caches)
    assert logits.shape == (len(TINY_PROMPTS), TINY_CONFIG["vocab_size"])
    for row, sequence in enumerate(sequences):
        assert caches[row][0].length == len(sequence)
        reference.clear_kv_cache()
        expected = reference.forward([sequence]).to_numpy()[0]
        truth = transformers_logits(TINY_CONFIG, weights, sequence, dtype=np.float64)[-1]
        assert_near_truth(logits[row], expected, truth, f"row {row}")
        assert int(np.argmax(logits[row])) == int(np.argmax(expected))


# Tiny configs with each feature forward_rows must honour per row: sliding windows (a window
# of 4 against rows at positions 2, 6 and 14), soft-caps and a tied head (gemma2), q/k norms
# (qwen3), a local rotary base per layer (gemma3).
FAMILY_BASE = {"vocab_size": 128, "hidden_size": 64, "intermediate_size": 96,
               "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
               "head_dim": 16, "max_position_embeddings": 64, "rms_norm_eps": 1e-6,
               "rope_theta": 10000.0, "bos_token_id": 1, "eos_token_id": 2}
FAMILY_CONFIGS = {
    "gemma2": dict(FAMILY_BASE, model_type="gemma2", tie_word_embeddings=True, sliding_window=4,
                   query_pre_attn_scalar=16, attn_logit_softcapping=2.0,
                   final_logit_softcapping=5.0, hidden_activation="gelu_pytorch_tanh"),
    "qwen3": dict(FAMILY_BASE, model_type="qwen3", head_dim=32, tie_word_embeddings=False),
    "gemma3": dict(FAMILY_BASE, model_type="gemma3_text", tie_word_embeddings=True,
                   sliding_window=4, sliding_window_pattern=2, query_pre_attn_scalar=16,
                   rope_theta=1e6, rope_local_base_freq=10000.0,
                   hidden_activation="gelu_pytorch_tanh"),
}


@pytest.mark.parametrize("name", sorted(FAMILY_CONFIGS))
def test_forward_rows_over_the_families(tmp_path, name):
    """`Llama.forward_rows` has no per-family branch: each row of a step over rows at
    different positions against float64 transformers on that row's full sequence."""
    pytest.importorskip("transformers")
    import torch

    from tests.models.llama_testlib import GGUF_ARCHITECTURE, transformers_model

    config = FAMILY_CONFIGS[name]
    torch.manual_seed(14)
    hf = transformers_model(config)
    with torch.no_grad():
        for param in hf.parameters():
            if param.dim() == 1:  # norms at their init (1, or Gemma's 0) would hide a mix-up
                param.add_(0.1 * torch.randn_like(param))
    state = {k: v.detach().numpy().copy() for k, v in hf.state_dict().items()}
    if config.get("tie_word_embeddings"):
        state.pop("lm_head.weight", None)
    path = to_gguf(state, config, tmp_path / f"{name}.gguf",
                   arch=GGUF_ARCHITECTURE[config["model_type"]])
    model = Llama.load(path, device=Device.cpu(backend="numpy"))
    reference = Llama.load(path, device=Device.cpu(backend="numpy"))
    prompts = [[5, 17], [5, 17, 3, 90, 44, 7], [9, 8, 7, 6, 5, 4, 3, 21, 22, 23, 24, 25, 26, 27]]
    caches, sequences = [], []
    for prompt in prompts:
        model.clear_kv_cache(len(prompt) + 1)
        sequences.append(prompt + [int(np.argmax(model.forward([prompt]).to_numpy()[0]))])
        caches.append(model.caches)
    logits = batched_steps.ModelBatchedSteps(model)([s[-1] for s in sequences], caches)
    for row, sequence in enumerate(sequences):
        reference.clear_kv_cache()
        expected = reference.forward([sequence]).to_numpy()[0]
        truth = transformers_logits(config, state, sequence, dtype=np.float64)[-1]
        assert_near_truth(logits[row], expected, truth, f"{name} row {row}")


def prompt_token_by_token(model, prompt):
    """(logits after the prompt's last token, the blocks' cached keys) feeding the prompt one
    token per call of the single step."""
    single = parts.start_causal_decoding(model)
    model.clear_kv_cache(len(prompt) + 1)
    for token in prompt:
        logits = single(np.array([[token]]), model.seq_len).to_numpy()[0]
    return logits, [cache.k.buffer()[..., :len(prompt), :].copy() for cache in model.caches]


def prompt_in_one_call(model, prompt):
    single = parts.start_causal_decoding(model)
    model.clear_kv_cache(len(prompt) + 1)
    logits = single(np.array([prompt]), 0).to_numpy()[0]
    assert model.seq_len == len(prompt)
    return logits, [cache.k.buffer()[..., :len(prompt), :].copy() for cache in model.caches]


def assert_prompt_paths_agree(model, prompt, what):
    alone_logits, alone_keys = prompt_token_by_token(model, prompt)
    logits, keys = prompt_in_one_call(model, prompt)
    assert np.array_equal(logits, alone_logits), (
        f"{what}: the prompt's logits differ from token by token "
        f"(max {np.abs(logits - alone_logits).max()})")
    for block, (got, want) in enumerate(zip(keys, alone_keys)):
        assert np.array_equal(got, want), f"{what}: block {block}'s cached keys differ"
    return logits


@pytest.mark.parametrize("kind", ["Q4_1", "Q6_K", "qwen2-mixed", "f32"])
def test_tiny_prompts_in_one_call_equal_token_by_token(numba_device, tmp_path, kind,
                                                       monkeypatch):
    """A prompt through the part's `step_prompts` (its tokens as rows of one sequence, each
    weight read once for all of them): the last token's logits and every cached key are those
    of feeding it token by token, bit for bit, also when it spans several chunks
    (FusedCausalSteps.PROMPT_CHUNK, set to 3 here); and near float64 transformers."""
    pytest.importorskip("transformers")
    path, config, weights = tiny_model(kind, tmp_path, numba_device)
    model = Llama.load(path, device=numba_device,
                       mode="dequantize" if kind == "f32" else "auto")
    assert getattr(llama_part(model), "step_prompts", None) is not None
    reference = Llama.load(path, device=Device.cpu(backend="numpy"))
    prompt = [1, 5, 9, 4, 2, 7, 80, 31, 8, 3, 40]
    logits = assert_prompt_paths_agree(model, prompt, kind)
    monkeypatch.setattr(parts.FusedCausalSteps, "PROMPT_CHUNK", 3)
    assert np.array_equal(assert_prompt_paths_agree(model, prompt, f"{kind} in chunks of 3"),
                          logits)
    reference.clear_kv_cache()
    expected = reference.forward([prompt]).to_numpy()[0]
    truth = transformers_logits(config, weights, prompt, dtype=np.float64)[-1]
    assert_near_truth(logits, expected, truth, f"{kind} prompt")


def test_real_model_prompt_in_one_call_equals_token_by_token(numba_device):
    from candle_web.pipelines import load_llama

    loaded = load_llama(REAL_MODELS[0], device=numba_device)
    for text in REAL_PROMPTS[3:5]:
        prompt = list(map(int, loaded.tokenizer.encode(text).ids))
        assert_prompt_paths_agree(loaded.model, prompt, text)


@pytest.mark.parametrize("kind", ["Q4_1", "qwen2-mixed"])
def test_several_prompts_in_one_pass_equal_each_alone(numba_device, tmp_path, kind,
                                                      monkeypatch):
    """`FusedBatchedSteps.prompts` (a server admitting several requests at once): prompts of
    different lengths, one of them appended to a cache that already holds a prefix, as rows of
    shared steps (steps of 4 rows here, so prompts are cut across steps and steps mix prompts):
    each prompt's last logits and cached keys are bit for bit those of running it alone."""
    path, _, _ = tiny_model(kind, tmp_path, numba_device)
    model = Llama.load(path, device=numba_device)
    monkeypatch.setattr(parts.FusedCausalSteps, "PROMPT_CHUNK", 4)
    single = parts.start_causal_decoding(model)
    prefix, rest = [3, 8, 1], [40, 5, 9, 77, 2]
    prompts = [[1, 5, 9, 4, 2, 7, 80, 31, 8, 3], [6], [90, 3, 12]]
    alone = []
    for prompt in prompts + [prefix + rest]:
        alone.append(prompt_in_one_call(model, prompt))
    # the joint pass: three fresh caches and one holding the prefix already
    caches = []
    for _ in prompts:
        model.clear_kv_cache(16)
        caches.append(model.caches)
    model.clear_kv_cache(16)
    single(np.array([prefix]), 0)
    caches.append(model.caches)
    batched = batched_steps.start_batched_causal_decoding(model)
    assert isinstance(batched, batched_steps.FusedBatchedSteps)
    logits = batched.prompts(prompts + [rest], caches)
    for row, (want_logits, want_keys) in enumerate(alone):
        assert np.array_equal(logits[row], want_logits), f"prompt {row}'s logits"
        length = len((prompts + [prefix + rest])[row])
        assert caches[row][0].length == length
        for block, cache in enumerate(caches[row]):
            assert np.array_equal(cache.k.buffer()[..., :length, :], want_keys[block]), (
                f"prompt {row}, block {block}'s keys")
