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
times that, plus FLOOR_ULPS of the largest logit (tests/tolerances_testlib.py). The greedy ids are
compared with the float64 truth's, whose top-2 margin at each step is checked to exceed that
bound (so an equal id is not luck).
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.models.llama_testlib import (GGUF_ARCHITECTURE, one_blas_thread, to_gguf,
                                        transformers_logits, transformers_model)
from tests.tolerances_testlib import assert_near_truth, measured_bound

from candle_web.models.llama import Llama

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

PROMPT = [5, 17, 3, 90, 44, 7, 12, 60, 1, 33]
NEW_TOKENS = 8

BASE = {
    "vocab_size": 256, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    "max_position_embeddings": 128, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
    "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0,
}

# A window of 4 makes the sliding layers differ from full attention within the 10-token prompt
# and the 8 steps after it; soft-caps small enough to bend the scores and logits.
FAMILIES = {
    "qwen2": dict(BASE, model_type="qwen2", tie_word_embeddings=True, rope_theta=1e6),
    "mistral": dict(BASE, model_type="mistral", sliding_window=4),
    "qwen3": dict(BASE, model_type="qwen3", head_dim=32),  # head_dim != d / heads
    "phi3": dict({k: v for k, v in BASE.items() if k != "head_dim"}, model_type="phi3",
                 sliding_window=5),
    # longrope: the 10-token prompt within original_max_position_embeddings (short factors),
    # the sequence past it from the 3rd new token (long factors; cos/sin scaled by 1.40).
    "phi3_longrope": dict({k: v for k, v in BASE.items() if k != "head_dim"},
                          model_type="phi3", original_max_position_embeddings=12,
                          rope_scaling={"type": "longrope",
                                        "short_factor": [1.0, 1.1, 1.3, 1.6, 2.0, 2.5, 3.0, 4.0],
                                        "long_factor": [1.0, 1.5, 2.5, 4.0, 6.0, 9.0, 12.0, 16.0]}),
    "gemma2": dict(BASE, model_type="gemma2", tie_word_embeddings=True, sliding_window=4,
                   query_pre_attn_scalar=16, attn_logit_softcapping=2.0,
                   final_logit_softcapping=5.0, hidden_activation="gelu_pytorch_tanh"),
    "gemma3": dict(BASE, model_type="gemma3_text", tie_word_embeddings=True, sliding_window=4,
                   sliding_window_pattern=2, query_pre_attn_scalar=16, rope_theta=1e6,
                   rope_local_base_freq=10000.0, hidden_activation="gelu_pytorch_tanh"),
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


def transformers_greedy(config, state, prompt, steps, dtype, feed=None):
    """transformers' greedy decoding through its KV cache (as `generate` runs it: longrope's
    cached keys keep the rotation they had) in `dtype`: (ids, logits [steps, vocab] each id
    was chosen from); `feed` replays given ids instead of the argmax."""
    model = transformers_model(config, state, dtype)
    ids, rows, cache, new = [], [], None, list(prompt)
    with torch.no_grad():
        for step in range(steps):
            out = model(torch.tensor([new]), past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            rows.append(out.logits[0, -1].numpy())
            ids.append(int(np.argmax(rows[-1])) if feed is None else feed[step])
            new = ids[-1:]
    return ids, np.stack(rows)


def greedy(model, prompt, steps, with_logits=False):
    """Our greedy ids (and the logits each was chosen from): the prompt in one pass, then one
    token at a time through the KV cache."""
    model.clear_kv_cache()
    rows = [model.forward([prompt]).to_numpy()[0]]
    out = []
    for step in range(steps):
        out.append(int(np.argmax(rows[-1])))
        if step + 1 < steps:
            rows.append(model.forward([[out[-1]]]).to_numpy()[0])
    return (out, np.stack(rows)) if with_logits else out


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
    expected, step_truth = transformers_greedy(config, state, PROMPT, NEW_TOKENS, np.float64)
    _, step_reference = transformers_greedy(config, state, PROMPT, NEW_TOKENS, np.float32,
                                            feed=expected)
    bound = measured_bound(step_reference, step_truth)
    for logits in step_truth:
        top = np.sort(logits)[-2:]
        assert top[1] - top[0] > 2 * bound, "a near tie: the greedy ids would prove nothing"
    return (name, folder / "hf", gguf, (reference, truth),
            (expected, step_reference, step_truth))


@pytest.mark.parametrize("layout", ["hf", "gguf"])
def test_logits_and_greedy_ids_equal_transformers(family, layout):
    """The prompt's logits at every position, then 8 greedy steps through the KV cache (the
    sliding windows' cache reads, longrope's switch to its long factors): the same ids, and the
    logits each was chosen from near transformers' float64 ones."""
    name, hf_folder, gguf, (reference, truth), (expected, step_reference, step_truth) = family
    model = Llama.from_pretrained(hf_folder if layout == "hf" else gguf)
    got = model.forward([PROMPT], all_logits=True).to_numpy()[0]
    assert_near_truth(got, reference, truth, f"{name} {layout} logits")
    ids, steps = greedy(model, PROMPT, NEW_TOKENS, with_logits=True)
    assert ids == expected
    assert_near_truth(steps, step_reference, step_truth, f"{name} {layout} decode steps")


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


@pytest.mark.parametrize("model_type, fields", [
    ("qwen2", {"use_sliding_window": True, "sliding_window": 4, "max_window_layers": 2}),
    ("qwen3", {"use_sliding_window": True, "sliding_window": 4, "max_window_layers": 1}),
    ("qwen2", {"use_sliding_window": False, "sliding_window": 4}),
    ("mistral", {"sliding_window": 4}),
    ("gemma2", {"sliding_window": 4}),
    ("gemma3_text", {"sliding_window": 4}),
    ("gemma3_text", {"sliding_window": 4, "sliding_window_pattern": 3}),
], ids=lambda v: v if isinstance(v, str) else "-".join(f"{k}={x}" for k, x in v.items()))
def test_windowed_layers_without_layer_types_follow_transformers(model_type, fields):
    """A config.json without `layer_types` (written before transformers 5): which layers slide
    comes from each family's rule, as transformers derives its layer_types (7 layers, so a
    pattern of 6 shows both kinds)."""
    from transformers import AutoConfig

    from candle_web.models.llama import LlamaConfig

    config = dict(BASE, model_type=model_type, num_hidden_layers=7, **fields)
    theirs = AutoConfig.for_model(model_type, **{k: v for k, v in config.items()
                                                 if k != "model_type"})
    ours = LlamaConfig.from_hf_config(config)
    expected = [t == "sliding_attention" for t in getattr(theirs, "layer_types", None)
                or ["sliding_attention" if theirs.sliding_window else "full_attention"] * 7]
    assert [ours.window(i) is not None for i in range(7)] == expected
    if any(expected):
        assert ours.sliding_window == theirs.sliding_window


def test_gemma2_soft_caps_default_only_where_absent():
    """transformers' Gemma2Config defaults (50, 30) apply to a config.json without the keys; an
    explicit null turns the cap off, as in transformers."""
    from candle_web.models.llama import LlamaConfig

    config = {k: v for k, v in FAMILIES["gemma2"].items()
              if k not in ("attn_logit_softcapping", "final_logit_softcapping")}
    absent = LlamaConfig.from_hf_config(config)
    assert (absent.attn_logit_softcap, absent.final_logit_softcap) == (50.0, 30.0)
    off = LlamaConfig.from_hf_config(dict(config, attn_logit_softcapping=None,
                                          final_logit_softcapping=None))
    assert (off.attn_logit_softcap, off.final_logit_softcap) == (None, None)


# -- bad input -----------------------------------------------------------------------------------
@pytest.mark.parametrize("name, missing, key", [
    ("gemma2", "sliding_window", "gemma2.attention.sliding_window"),
    ("gemma2", "attn_logit_softcapping", "gemma2.attn_logit_softcapping"),
    ("gemma3", "sliding_window", "gemma3.attention.sliding_window"),
])
def test_a_gguf_missing_a_required_key_names_it(tmp_path, name, missing, key):
    from candle_web.core.errors import FormatError

    config, state, _ = make_family(name)
    path = to_gguf(state, dict(config, **{missing: None}), tmp_path / "broken.gguf",
                   arch=GGUF_ARCHITECTURE[config["model_type"]])
    with pytest.raises(FormatError, match=f"missing metadata key '{key}'"):
        Llama.load(path)


def test_unsupported_or_broken_families_and_scalings_are_named(tmp_path):
    from candle_web.core.errors import FormatError, UnsupportedError
    from candle_web.models.llama import LlamaConfig

    config, state, _ = make_family("phi3")
    path = to_gguf(state, config, tmp_path / "longrope.gguf", arch="phi3",
                   extra_tensors={"rope_factors_long.weight": np.ones(8, np.float32),
                                  "rope_factors_short.weight": np.ones(8, np.float32)})
    with pytest.raises(FormatError, match="'phi3.rope.scaling.original_context_length'"):
        Llama.load(path)
    yarn = dict(config, rope_scaling={"rope_type": "yarn", "factor": 4.0})
    with pytest.raises(UnsupportedError, match="'yarn' is not supported"):
        LlamaConfig.from_hf_config(yarn)
    short = dict(FAMILIES["phi3_longrope"])
    short["rope_scaling"] = dict(short["rope_scaling"], short_factor=[1.0, "x"])
    with pytest.raises(FormatError, match="short_factor"):
        LlamaConfig.from_hf_config(short)
    with pytest.raises(UnsupportedError, match="partial_rotary_factor"):
        LlamaConfig.from_hf_config(dict(config, partial_rotary_factor=0.5))
    with pytest.raises(UnsupportedError, match=r"'falcon'.*supported: \('llama', 'mistral'"):
        LlamaConfig.from_hf_config(dict(config, model_type="falcon"))
    with pytest.raises(FormatError, match="layer_types"):
        LlamaConfig.from_hf_config(dict(FAMILIES["gemma2"], layer_types=["full_attention"]))
    config, state, _ = make_family("qwen2")
    path = to_gguf(state, config, tmp_path / "mamba.gguf", arch="mamba")
    with pytest.raises(UnsupportedError, match=r"'mamba'.*supported: \('llama', 'qwen2', 'qwen3', "
                                               r"'phi3', 'gemma2', 'gemma3'\)"):
        Llama.load(path)


# -- the fast path ----------------------------------------------------------------------------
@pytest.mark.parametrize("backend", ["numba", "wasm"])
@pytest.mark.parametrize("name", ["qwen3", "gemma2"])
def test_parts_without_the_family_fields_leave_it_to_the_reference_path(tmp_path, backend, name):
    """The numba and wasm `llama.decoder_step` parts implement plain LLaMA (and numba qwen2's
    bias): for q/k norms or Gemma's norms, soft-caps and windows their factories return None, so
    decoding on that device takes the model's forward and gives the numpy backend's greedy ids."""
    from candle_web import Device
    from candle_web.backend import get_backend
    from candle_web.core.errors import BackendUnavailable
    from tests.parts_testlib import llama_part, llama_steps

    try:
        get_backend(backend)
    except BackendUnavailable as e:
        pytest.skip(f"{backend} backend unavailable: {e}")
    config, state, _ = make_family(name)
    path = to_gguf(state, config, tmp_path / f"{name}.gguf",
                   arch=GGUF_ARCHITECTURE[config["model_type"]])
    model = Llama.load(path, device=Device.cpu(backend=backend))
    assert model.part_weights().family_fields() - {"qkv_bias"}
    assert llama_part(model) is None

    def decode(model):
        steps = llama_steps(model, fused=True)
        model.clear_kv_cache()
        ids = [int(np.argmax(steps([PROMPT], 0).to_numpy()[0]))]
        for _ in range(NEW_TOKENS - 1):
            ids.append(int(np.argmax(steps([[ids[-1]]], model.seq_len).to_numpy()[0])))
        return ids

    assert decode(model) == decode(Llama.load(path, device=Device.cpu(backend="numpy")))


# -- a real file ------------------------------------------------------------------------------
GEMMA3_PROMPT = [2, 818, 5279, 529, 7001, 563, 496, 3207, 236764, 532]  # bos + 9 arbitrary ids


def gemma3_transformers_from_gguf(path):
    """transformers' Gemma3ForCausalLM (float64) on the GGUF's weights as decoded by the `gguf`
    package (not this project's dequantizer; the blocks' bytes located by io/gguf.py, whose
    gguf.GGUFReader counterpart takes 40 s over the 262k-token vocabulary): names mapped by
    gguf's own table, the converter's 1 + w norms turned back into w; the config from the file's
    metadata plus what llama.cpp fixes for gemma3 (5 sliding layers of 6, local RoPE base 10000,
    scores / sqrt(head_dim))."""
    gguf = pytest.importorskip("gguf")
    from gguf.quants import dequantize
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    from candle_web.io.gguf import GgufFile

    file = GgufFile(path)
    meta = {name: value for name, value in file.metadata.items() if name.startswith("gemma3.")}
    layers = int(meta["gemma3.block_count"])
    head_dim = int(meta["gemma3.attention.key_length"])
    config = Gemma3TextConfig(
        vocab_size=int(file.tensors["token_embd.weight"].shape[0]),
        hidden_size=int(meta["gemma3.embedding_length"]),
        intermediate_size=int(meta["gemma3.feed_forward_length"]), num_hidden_layers=layers,
        num_attention_heads=int(meta["gemma3.attention.head_count"]),
        num_key_value_heads=int(meta["gemma3.attention.head_count_kv"]), head_dim=head_dim,
        rms_norm_eps=float(meta["gemma3.attention.layer_norm_rms_epsilon"]),
        sliding_window=int(meta["gemma3.attention.sliding_window"]),
        query_pre_attn_scalar=head_dim, rope_theta=float(meta["gemma3.rope.freq_base"]),
        rope_local_base_freq=10000.0, max_position_embeddings=int(meta["gemma3.context_length"]),
        tie_word_embeddings=True, pad_token_id=0, bos_token_id=2, eos_token_id=1)
    config._attn_implementation = "eager"
    with torch.device("meta"):
        shapes = {k: tuple(v.shape) for k, v in Gemma3ForCausalLM(config).state_dict().items()}
    mapping = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GEMMA3, layers)
    state = {}
    for hf_name, shape in shapes.items():
        if hf_name == "lm_head.weight":
            continue  # tied
        qtensor = file.qtensor(mapping.get_name(hf_name, try_suffixes=(".weight",)))
        raw = np.frombuffer(memoryview(qtensor.data), np.uint8).reshape(shape[0], -1) \
            if len(shape) == 2 else np.frombuffer(memoryview(qtensor.data), np.uint8)
        values = dequantize(raw, gguf.GGMLQuantizationType(int(qtensor.dtype)))
        values = values.astype(np.float64).reshape(shape)
        if hf_name.endswith("norm.weight"):
            values = values - 1.0
        state[hf_name] = torch.from_numpy(values)
    model = Gemma3ForCausalLM(config).eval().double()
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    model.tie_weights()
    return model


def test_real_gemma3_270m_gguf_matches_transformers(model_file):
    """Gemma-3-270M Q4_K_M (Q8_0 embedding, Q4_K/Q5_0/Q6_K/Q8_0 blocks) loads and generates:
    logits at every prompt position against transformers in float64 on the same decoded
    weights (assert_near_truth, transformers' f32 run as the reference error), and 8 greedy
    ids through the KV cache equal the float64 ones."""
    path = model_file("gemma3-270m-q4km", "gemma-3-270m-Q4_K_M.gguf")
    model = Llama.from_pretrained(path)
    cfg = model.config
    assert (cfg.family, cfg.qk_norm, cfg.post_norms, cfg.sliding_window) == ("gemma3", True, True,
                                                                              512)
    assert cfg.sliding_layers == tuple((i + 1) % 6 != 0 for i in range(18))
    got = model.forward([GEMMA3_PROMPT], all_logits=True).to_numpy()[0]
    ours = greedy(model, GEMMA3_PROMPT, NEW_TOKENS)

    hf = gemma3_transformers_from_gguf(path)
    ids = list(GEMMA3_PROMPT)
    with torch.no_grad():
        out = hf(torch.tensor([ids]), use_cache=True)
        truth = out.logits[0].numpy()
        steps = [out.logits[0, -1].numpy()]
        cache = out.past_key_values
        for _ in range(NEW_TOKENS - 1):
            ids.append(int(np.argmax(steps[-1])))
            out = hf(torch.tensor([[ids[-1]]]), past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            steps.append(out.logits[0, -1].numpy())
        ids.append(int(np.argmax(steps[-1])))
        reference = hf.float()(torch.tensor([GEMMA3_PROMPT])).logits[0].numpy()
    assert_near_truth(got, reference, truth, "gemma3-270m logits")
    bound = measured_bound(reference, truth)
    for logits in steps:
        top = np.sort(logits)[-2:]
        assert top[1] - top[0] > 2 * bound, "a near tie: the greedy ids would prove nothing"
    assert ours == ids[len(GEMMA3_PROMPT):]
