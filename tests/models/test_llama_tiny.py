"""LLaMA model mechanics on tiny random checkpoints: both weight layouts, GQA, KV cache, rope
scaling and tied heads against transformers' LlamaForCausalLM, plus the load-time errors.

Tolerances: the tiny model's logits are O(1-3); numpy and torch sum the same f32 products in
different orders, which measured <= 2e-6 apart here, so 1e-4 is a wide margin that still
catches any real mistake (a wrong rotation or head grouping moves logits by ~0.1-1).
"""

from __future__ import annotations

import numpy as np
import pytest
from tests.models.llama_testlib import (TINY_CONFIG, dequantized_state, gguf_metadata,
                                        one_blas_thread, permute_rows, random_state,
                                        reference_script, to_gguf, to_hf_folder,
                                        transformers_logits)
from tests.tolerances_testlib import assert_near_truth

from candle_web import Tensor, bf16
from candle_web.core.errors import (FormatError, IndexOutOfRange, ShapeMismatch, UnsupportedError)
from candle_web.io.gguf import write_gguf
from candle_web.models.llama import Llama, LlamaConfig
from candle_web.quantized import GgmlDType

TOLERANCE = 1e-4
IDS = [5, 17, 3, 90, 44, 7, 12, 60, 1, 33, 71, 29]


@pytest.fixture(scope="module", autouse=True)
def _blas_threads():
    with one_blas_thread():
        yield


@pytest.fixture(scope="module")
def state():
    return random_state(TINY_CONFIG, seed=0)


@pytest.fixture(scope="module")
def hf_model(state, tmp_path_factory):
    return Llama.from_pretrained(to_hf_folder(state, TINY_CONFIG, tmp_path_factory.mktemp("hf")))


def logits_of(model, ids):
    model.clear_kv_cache()
    return model.forward(ids, all_logits=True).to_numpy()[0]


def test_hf_checkpoint_matches_transformers(hf_model, state):
    pytest.importorskip("transformers")
    expected = transformers_logits(TINY_CONFIG, state, IDS)
    np.testing.assert_allclose(logits_of(hf_model, IDS), expected, atol=TOLERANCE, rtol=0)
    assert hf_model.config.rope_interleaved is False


def test_weight_names_agree_with_the_gguf_package(state):
    """The model's HF -> GGUF name table (which also writes this file's GGUF checkpoints) is
    llama.cpp's converter mapping, as the `gguf` package states it."""
    gguf = pytest.importorskip("gguf")
    from candle_web.models.llama import LLAMA_WEIGHT_NAMES

    mapping = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, TINY_CONFIG["num_hidden_layers"])
    for hf_name in state:
        expected = mapping.get_name(hf_name, try_suffixes=(".weight",))
        assert LLAMA_WEIGHT_NAMES.translate(hf_name, "hf", "gguf") == expected, hf_name


def test_gguf_layout_gives_the_same_logits_as_hf_layout(hf_model, state, tmp_path):
    # GGUF Q/K rows are permuted and rotated with rope_i; HF rows rotate halves with rope.
    model = Llama.load(to_gguf(state, TINY_CONFIG, tmp_path / "tiny.gguf"))
    assert model.config.rope_interleaved is True
    np.testing.assert_allclose(logits_of(model, IDS), logits_of(hf_model, IDS), atol=1e-5, rtol=0)


def test_permutation_is_undone_by_the_reference_script():
    unpermute_rows = reference_script().unpermute_rows
    w = np.arange(8 * 16 * 3, dtype=np.float32).reshape(8 * 16, 3)
    permuted = permute_rows(w, 8)
    assert not np.array_equal(permuted, w)
    np.testing.assert_array_equal(unpermute_rows(permuted, 8), w)


def test_kv_cache_steps_equal_one_full_pass(hf_model):
    full = logits_of(hf_model, IDS)
    hf_model.clear_kv_cache(capacity=2)  # forces the cache to grow while decoding
    steps = [hf_model.forward(IDS[:5], 0, all_logits=True).to_numpy()[0]]
    for position in range(5, len(IDS)):
        steps.append(hf_model.forward([IDS[position]], position).to_numpy())
    np.testing.assert_allclose(np.concatenate(steps), full, atol=1e-5, rtol=0)


def test_batch_rows_are_independent(hf_model):
    hf_model.clear_kv_cache()
    batch = hf_model.forward([IDS[:6], IDS[6:]]).to_numpy()
    for row, ids in enumerate((IDS[:6], IDS[6:])):
        np.testing.assert_allclose(batch[row], logits_of(hf_model, ids)[-1], atol=1e-5, rtol=0)


@pytest.mark.parametrize("scaling", [
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 32},
    {"rope_type": "linear", "factor": 4.0},
], ids=["llama3", "linear"])
def test_rope_scaling_matches_transformers(state, tmp_path, scaling):
    pytest.importorskip("transformers")
    config = dict(TINY_CONFIG, rope_scaling=scaling)
    model = Llama.from_pretrained(to_hf_folder(state, config, tmp_path))
    assert model.config.rope_scaling.kind == scaling["rope_type"]
    ids = list(np.random.default_rng(1).integers(0, TINY_CONFIG["vocab_size"], 40))
    expected = transformers_logits(config, state, ids)
    # With original context 32 some wavelengths are kept, some blended, some scaled: the
    # scaled logits must differ from the unscaled ones, and match transformers.
    assert np.abs(expected - transformers_logits(TINY_CONFIG, state, ids)).max() > 0.1
    np.testing.assert_allclose(logits_of(model, ids), expected, atol=TOLERANCE, rtol=0)


def test_gguf_rope_freqs_tensor_applies_llama3_scaling(state, tmp_path):
    """llama.cpp stores llama3 scaling as per-frequency divisors (rope_freqs.weight)."""
    pytest.importorskip("transformers")
    import torch  # noqa: F401  (transformers' rope functions return torch tensors)
    from transformers import LlamaConfig as HfLlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 32}
    config = dict(TINY_CONFIG, rope_scaling=scaling)
    hf_config = HfLlamaConfig(**{k: v for k, v in config.items()
                                 if k not in ("architectures", "model_type")})
    scaled, _ = ROPE_INIT_FUNCTIONS["llama3"](hf_config, None)
    hd = TINY_CONFIG["head_dim"]
    plain = 1.0 / TINY_CONFIG["rope_theta"] ** (np.arange(0, hd, 2) / hd)
    factors = (plain / scaled.numpy().astype(np.float64)).astype(np.float32)
    path = to_gguf(state, TINY_CONFIG, tmp_path / "scaled.gguf",
                   extra_tensors={"rope_freqs.weight": factors})
    model = Llama.load(path)
    assert model.config.rope_scaling.kind == "freq_factors"
    ids = list(np.random.default_rng(1).integers(0, TINY_CONFIG["vocab_size"], 40))
    np.testing.assert_allclose(logits_of(model, ids), transformers_logits(config, state, ids),
                               atol=TOLERANCE, rtol=0)


def test_tied_embeddings_in_both_layouts(tmp_path):
    pytest.importorskip("transformers")
    config = dict(TINY_CONFIG, tie_word_embeddings=True)
    state = random_state(config, seed=3)
    assert "lm_head.weight" not in state
    expected = transformers_logits(config, state, IDS)
    hf = Llama.from_pretrained(to_hf_folder(state, config, tmp_path / "hf"))
    gguf = Llama.load(to_gguf(state, config, tmp_path / "tied.gguf"))
    assert hf.config.tie_word_embeddings and gguf.config.tie_word_embeddings
    np.testing.assert_allclose(logits_of(hf, IDS), expected, atol=TOLERANCE, rtol=0)
    np.testing.assert_allclose(logits_of(gguf, IDS), expected, atol=TOLERANCE, rtol=0)


def test_bf16_checkpoint_computes_in_f32(state, tmp_path):
    """A bf16 safetensors checkpoint (the common HF case) equals the f32 model on the same
    bf16-rounded values."""
    pytest.importorskip("transformers")
    from candle_web.io.safetensors import save

    rounded = {k: Tensor.from_numpy(v).to_dtype(bf16).to_numpy() for k, v in state.items()}
    folder = to_hf_folder(rounded, TINY_CONFIG, tmp_path)
    save({k: Tensor.from_numpy(v).to_dtype(bf16) for k, v in state.items()},
         folder / "model.safetensors")
    model = Llama.from_pretrained(folder)
    expected = transformers_logits(TINY_CONFIG, rounded, IDS)
    np.testing.assert_allclose(logits_of(model, IDS), expected, atol=TOLERANCE, rtol=0)


def test_quantized_and_dequantized_matmul_modes_agree(state, tmp_path):
    """Keeping Q8_0 blocks (multiplying through backend.qmatmul) and dequantizing at load use
    the same weights: equal logits up to summation order, so the packed logits are as close to
    the float64 truth (transformers on the decoded weights) as assert_near_truth allows."""
    pytest.importorskip("transformers")
    path = to_gguf(state, TINY_CONFIG, tmp_path / "q8.gguf", quantize_to=GgmlDType.Q8_0)
    dense = Llama.load(path, mode="dequantize")
    packed = Llama.load(path, mode="quantized")
    assert not dense.blocks[0].attn.qkv.is_quantized
    assert packed.blocks[0].attn.qkv.is_quantized and packed.embed.qtable is not None
    truth = transformers_logits(TINY_CONFIG, dequantized_state(state, GgmlDType.Q8_0), IDS,
                                dtype=np.float64)
    assert_near_truth(logits_of(packed, IDS), logits_of(dense, IDS), truth)


# -- bad input -----------------------------------------------------------------------------
def test_unsupported_gguf_architecture_is_named(state, tmp_path):
    path = to_gguf(state, TINY_CONFIG, tmp_path / "mamba.gguf", arch="mamba")
    with pytest.raises(UnsupportedError, match="mamba"):
        Llama.load(path)


def test_unsupported_hf_model_type_is_named(state, tmp_path):
    folder = to_hf_folder(state, dict(TINY_CONFIG, model_type="gpt_neox"), tmp_path)
    with pytest.raises(UnsupportedError, match="gpt_neox"):
        Llama.from_pretrained(folder)


def test_unsupported_rope_scaling_is_named(state, tmp_path):
    with pytest.raises(UnsupportedError, match="yarn"):
        LlamaConfig.from_hf_config(dict(TINY_CONFIG, rope_scaling={"rope_type": "yarn",
                                                                   "factor": 4.0}))
    path = to_gguf(state, TINY_CONFIG, tmp_path / "yarn.gguf",
                   extra_metadata={"llama.rope.scaling.type": "yarn",
                                   "llama.rope.scaling.factor": 4.0})
    with pytest.raises(UnsupportedError, match="yarn"):
        Llama.load(path)


def test_gguf_tensor_disagreeing_with_its_metadata(state, tmp_path):
    metadata = gguf_metadata(TINY_CONFIG)
    metadata["llama.feed_forward_length"] = 128  # the tensors say 96
    path = tmp_path / "lying.gguf"
    to_gguf(state, TINY_CONFIG, path)
    from candle_web.io.gguf import GgufFile

    gguf = GgufFile(path)
    tensors = {name: gguf.qtensor(name) for name in gguf.tensors}
    write_gguf(tmp_path / "lying2.gguf", metadata, tensors)
    with pytest.raises(ShapeMismatch, match="ffn_gate"):
        Llama.load(tmp_path / "lying2.gguf")


def test_gguf_missing_metadata_key(state, tmp_path):
    metadata = gguf_metadata(TINY_CONFIG)
    del metadata["llama.block_count"]
    to_gguf(state, TINY_CONFIG, tmp_path / "full.gguf")
    from candle_web.io.gguf import GgufFile

    gguf = GgufFile(tmp_path / "full.gguf")
    write_gguf(tmp_path / "missing.gguf", metadata, {n: gguf.qtensor(n) for n in gguf.tensors})
    with pytest.raises(FormatError, match="llama.block_count"):
        Llama.load(tmp_path / "missing.gguf")


def test_bad_ids_and_positions(hf_model):
    hf_model.clear_kv_cache()
    with pytest.raises(IndexOutOfRange, match="96"):
        hf_model.forward([3, TINY_CONFIG["vocab_size"]])
    with pytest.raises(ShapeMismatch, match="index_pos 4"):
        hf_model.forward([3], 4)
    with pytest.raises(ShapeMismatch, match="token ids"):
        hf_model.forward(np.zeros((1, 0), dtype=np.int64))


def test_gguf_from_bytes_as_in_the_browser(state, tmp_path, hf_model):
    """The browser hands the fetched file over as bytes (no path, no mmap)."""
    data = to_gguf(state, TINY_CONFIG, tmp_path / "tiny.gguf").read_bytes()
    model = Llama.load(data)
    np.testing.assert_allclose(logits_of(model, IDS), logits_of(hf_model, IDS), atol=1e-5, rtol=0)


def test_load_llama_folder_needs_a_tokenizer(state, tmp_path):
    from candle_web.core.errors import ModelNotFound
    from candle_web.pipelines import load_llama

    with pytest.raises(ModelNotFound, match="tokenizer.json"):
        load_llama(to_hf_folder(state, TINY_CONFIG, tmp_path))


# -- QMatMul -------------------------------------------------------------------------------
def test_qmatmul_fuses_mixed_types_in_both_modes():
    from candle_web.quantized import QTensor
    from candle_web.quantized.qmatmul import QMatMul

    rng = np.random.default_rng(4)
    parts = [QTensor.from_float(rng.standard_normal((8, 64)).astype(np.float32), GgmlDType.Q4_0),
             QTensor.from_float(rng.standard_normal((4, 64)).astype(np.float32), GgmlDType.Q8_0),
             QTensor.from_float(rng.standard_normal((4, 64)).astype(np.float32), GgmlDType.Q8_0)]
    x = Tensor.from_numpy(rng.standard_normal((2, 3, 64)).astype(np.float32))
    expected = x.to_numpy() @ np.concatenate([p.dequantize() for p in parts]).T
    for mode in ("dequantize", "quantized"):
        layer = QMatMul.fused(parts, mode=mode)
        assert (layer.out_features, layer.in_features) == (16, 64)
        np.testing.assert_allclose(layer(x).to_numpy(), expected, atol=1e-4, rtol=1e-5)
        # one row takes the matrix-vector path
        np.testing.assert_allclose(layer(x.narrow(1, 0, 1).narrow(0, 0, 1)).to_numpy()[0, 0],
                                   expected[0, 0], atol=1e-4, rtol=1e-5)
    with pytest.raises(ShapeMismatch, match="input"):
        QMatMul.fused(parts)(Tensor.from_numpy(np.zeros((1, 32), np.float32)))
    with pytest.raises(ShapeMismatch, match="widths"):
        QMatMul.fused([parts[0], QTensor.from_float(np.zeros((4, 32), np.float32),
                                                    GgmlDType.Q8_0)])


def test_hf_folder_reads_generation_config_eos(state, tmp_path):
    import json

    folder = to_hf_folder(state, TINY_CONFIG, tmp_path)
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 5, 7]}))
    assert Llama.from_pretrained(folder).config.eos_token_ids == (2, 5, 7)
