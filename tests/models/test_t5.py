"""T5 against transformers: small random v1.0 (ReLU, tied head) and v1.1/flan (gated GELU,
untied head, 3 decoder layers over a 2-layer encoder) models, rebuilt from numpy's seeded
generator by tests/reference/record_t5.py and compared with what transformers computed from
the same files (recorded in t5_reference.json, and live when transformers is installed).

Tolerances: encoder outputs to 1e-4 absolute (values are O(1); f32 sums in another order
differ by ~1e-6); logits to 1e-3 absolute (values up to ~20; observed differences ~2e-5).
Greedy generations must be token-identical; record_t5.py guarantees every greedy step's top-2
logit margin is at least 1e-3, far above the rounding noise.
"""

from __future__ import annotations

import importlib.util
import json
import warnings
from pathlib import Path

import numpy as np
import pytest

from candle_web.core.errors import FormatError, ShapeMismatch, UnsupportedError
from candle_web.models.t5 import (GenerationOptions, T5Config, T5ForConditionalGeneration,
                                  relative_position_bucket)
from candle_web.pipelines.text2text import T5TextGenerator
from candle_web.tokenizers import Tokenizer

REFERENCE_DIR = Path(__file__).resolve().parent.parent / "reference"
ENCODER_ATOL = 1e-4
LOGITS_ATOL = 1e-3
CONFIG_NAMES = ("v1_0", "v1_1")


def load_recorder():
    spec = importlib.util.spec_from_file_location("record_t5", REFERENCE_DIR / "record_t5.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def recorder():
    return load_recorder()


@pytest.fixture(scope="module")
def reference():
    return json.loads((REFERENCE_DIR / "t5_reference.json").read_text())


@pytest.fixture(scope="module")
def model_dirs(recorder, tmp_path_factory):
    root = tmp_path_factory.mktemp("t5")
    return {name: recorder.write_model(name, root / name) for name in CONFIG_NAMES}


@pytest.fixture(scope="module")
def models(model_dirs):
    return {name: T5ForConditionalGeneration.from_pretrained(folder)
            for name, folder in model_dirs.items()}


@pytest.fixture(scope="module")
def tokenizer():
    return Tokenizer.from_file(REFERENCE_DIR / "t5_tokenizer.json")


@pytest.fixture(scope="module")
def hf_models(model_dirs):
    """transformers' models on the same files (skipped where transformers is missing)."""
    pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    return {name: transformers.T5ForConditionalGeneration.from_pretrained(str(folder)).eval()
            for name, folder in model_dirs.items()}


# -- relative position buckets --------------------------------------------------------------
def test_relative_position_buckets_match_the_recorded_reference(reference):
    buckets = reference["buckets"]
    relative = np.array(buckets["relative_positions"])
    assert relative_position_bucket(relative, True, 32, 128).tolist() == buckets["bidirectional"]
    assert relative_position_bucket(relative, False, 32, 128).tolist() == buckets["causal"]
    # The exact region maps each distance to itself, the log region saturates at the end.
    assert relative_position_bucket(np.array([-3, 0, 3]), True, 32, 128).tolist() == [3, 0, 19]
    assert relative_position_bucket(np.array([-1000]), False, 32, 128).tolist() == [31]


@pytest.mark.parametrize("num_buckets,max_distance", [(32, 128), (8, 20), (10, 24), (64, 256)])
def test_relative_position_buckets_match_transformers_live(num_buckets, max_distance):
    torch = pytest.importorskip("torch")
    modeling = pytest.importorskip("transformers.models.t5.modeling_t5")
    relative = np.arange(-1500, 1501)
    for bidirectional in (True, False):
        expected = modeling.T5Attention._relative_position_bucket(
            torch.from_numpy(relative), bidirectional, num_buckets, max_distance).numpy()
        got = relative_position_bucket(relative, bidirectional, num_buckets, max_distance)
        np.testing.assert_array_equal(got, expected)


# -- tokenizer ------------------------------------------------------------------------------
def test_unigram_tokenizer_gives_the_recorded_ids(reference, tokenizer):
    for name in CONFIG_NAMES:
        for prompt in reference["models"][name]["prompts"]:
            assert tokenizer.encode(prompt["text"]).ids == prompt["ids"]
            assert prompt["ids"][-1] == 1  # "$A </s>"


# -- recorded reference ---------------------------------------------------------------------
@pytest.mark.parametrize("name", CONFIG_NAMES)
def test_encoder_and_decoder_match_the_recorded_reference(name, models, reference):
    model = models[name]
    for prompt in reference["models"][name]["prompts"]:
        encoder = model.encode([prompt["ids"]]).to_numpy()[0]
        np.testing.assert_allclose(encoder, prompt["encoder_output"], rtol=0, atol=ENCODER_ATOL)
        logits = model.forward([prompt["ids"]], [prompt["decoder_ids"]]).to_numpy()[0]
        np.testing.assert_allclose(logits, prompt["decoder_logits"], rtol=0, atol=LOGITS_ATOL)


@pytest.mark.parametrize("name", CONFIG_NAMES)
def test_greedy_generation_is_token_identical(name, models, reference):
    model = models[name]
    recorded = reference["models"][name]
    options = GenerationOptions(max_new_tokens=reference["max_new_tokens"])
    for prompt in recorded["prompts"]:
        assert model.generate([prompt["ids"]], options=options)[0] == prompt["greedy"]
    batch = recorded["batch"]
    assert 0 in batch["attention_mask"][1]  # the batch really is padded
    generated = model.generate(batch["ids"], batch["attention_mask"], options=options)
    for row, expected in zip(generated, batch["greedy"]):
        # transformers pads finished rows; ours stop at their eos.
        assert row == expected[:len(row)] and all(t == 0 for t in expected[len(row):])


def test_the_two_configs_really_differ_in_the_ways_under_test(models):
    v10, v11 = models["v1_0"], models["v1_1"]
    assert (v10.config.dense_act_fn, v10.config.is_gated_act, v10.config.scale_decoder_outputs) == (
        "relu", False, True)
    assert (v11.config.dense_act_fn, v11.config.is_gated_act, v11.config.scale_decoder_outputs) == (
        "gelu_new", True, False)
    assert len(v11.decoder_blocks) == 3 and len(v11.encoder_blocks) == 2
    assert v10.lm_head.weight is v10.shared  # tied: one table
    assert v11.lm_head.weight is not v11.shared


# -- live against transformers --------------------------------------------------------------
LIVE_PROMPT = "translate English to German: A dog runs in the park while children play."


@pytest.mark.parametrize("name", CONFIG_NAMES)
def test_matches_transformers_live(name, models, hf_models, tokenizer):
    import torch

    model, hf = models[name], hf_models[name]
    ids = tokenizer.encode(LIVE_PROMPT).ids
    decoder_ids = [0, 17, 42, 99, 5, 180, 64, 3, 250]
    with torch.no_grad():
        hf_encoder = hf.get_encoder()(input_ids=torch.tensor([ids])).last_hidden_state[0].numpy()
        hf_logits = hf(input_ids=torch.tensor([ids]), decoder_input_ids=torch.tensor([decoder_ids]),
                       use_cache=False).logits[0].numpy()
        hf_greedy = hf.generate(input_ids=torch.tensor([ids]), max_new_tokens=10, do_sample=False,
                                num_beams=1, use_cache=False)[0, 1:].tolist()
    np.testing.assert_allclose(model.encode([ids]).to_numpy()[0], hf_encoder, rtol=0, atol=ENCODER_ATOL)
    np.testing.assert_allclose(model.forward([ids], [decoder_ids]).to_numpy()[0], hf_logits,
                               rtol=0, atol=LOGITS_ATOL)
    ours = model.generate([ids], options=GenerationOptions(max_new_tokens=10))[0]
    assert ours == hf_greedy[:len(ours)]


@pytest.mark.parametrize("name", CONFIG_NAMES)
def test_cached_step_by_step_decoding_equals_teacher_forcing(name, models, tokenizer):
    model = models[name]
    ids = tokenizer.encode(LIVE_PROMPT).ids
    decoder_ids = [0, 17, 42, 99, 5, 180]
    full = model.forward([ids], [decoder_ids]).to_numpy()[0]
    state = model.start_decoding(model.encode([ids]))
    steps = [model.decode([[token]], state).to_numpy()[0, 0] for token in decoder_ids]
    np.testing.assert_allclose(np.stack(steps), full, rtol=0, atol=1e-4)
    # Two tokens at once after a prefix (cache + causal mask with an offset) agree too.
    state = model.start_decoding(model.encode([ids]))
    first = model.decode([decoder_ids[:3]], state).to_numpy()[0]
    rest = model.decode([decoder_ids[3:]], state).to_numpy()[0]
    np.testing.assert_allclose(np.concatenate([first, rest]), full, rtol=0, atol=1e-4)


# -- text in, text out ----------------------------------------------------------------------
def test_text_generator_decodes_streams_and_samples(models, tokenizer, reference):
    generator = T5TextGenerator(models["v1_1"], tokenizer)
    prompt = reference["models"]["v1_1"]["prompts"][1]
    events = []
    result = generator(prompt["text"], GenerationOptions(max_new_tokens=12),
                       on_event=lambda kind, payload: events.append((kind, payload)))
    assert result.token_ids == prompt["greedy"]
    assert result.text == tokenizer.decode(prompt["greedy"])
    pieces = [payload["text"] for kind, payload in events if kind == "token"]
    assert "".join(pieces) == result.text and events[-1][0] == "done"
    assert result.input_tokens == len(prompt["ids"]) and not result.truncated
    sampled = GenerationOptions(max_new_tokens=12, temperature=1.0, top_k=20, top_p=0.9, seed=7)
    first, again = generator(prompt["text"], sampled), generator(prompt["text"], sampled)
    assert first.token_ids == again.token_ids  # seeded
    other = generator(prompt["text"], GenerationOptions(max_new_tokens=12, temperature=1.0, seed=8))
    assert other.token_ids != first.token_ids


def test_generation_can_be_cancelled_and_stopped(models, tokenizer, reference):
    from candle_web.core.errors import Cancelled

    generator = T5TextGenerator(models["v1_0"], tokenizer)
    text = reference["models"]["v1_0"]["prompts"][0]["text"]
    with pytest.raises(Cancelled):
        generator(text, GenerationOptions(max_new_tokens=12), on_event=lambda kind, payload: False)
    full = generator(text, GenerationOptions(max_new_tokens=12))
    stop = full.text.strip()[:2]
    stopped = generator(text, GenerationOptions(max_new_tokens=12, stop_strings=(stop,)))
    assert stopped.stop_reason == "stop_string" and stop not in stopped.text
    assert len(stopped.token_ids) < len(full.token_ids)


def test_empty_prompt_still_generates(models, tokenizer):
    result = T5TextGenerator(models["v1_0"], tokenizer)("", GenerationOptions(max_new_tokens=3))
    assert result.input_tokens == 1 and len(result.token_ids) <= 3


def test_over_long_input_is_truncated_with_a_notice(model_dirs, tokenizer):
    config = json.loads((model_dirs["v1_0"] / "config.json").read_text())
    config["n_positions"] = 16
    model = T5ForConditionalGeneration.load(str(model_dirs["v1_0"] / "model.safetensors"), config)
    generator = T5TextGenerator(model, tokenizer)
    long_prompt = "summarize: " + "the quick brown fox jumps over the lazy dog " * 20
    with pytest.warns(UserWarning, match="truncated"):
        result = generator(long_prompt, GenerationOptions(max_new_tokens=4))
    assert result.truncated and result.input_tokens == 16
    with pytest.warns(UserWarning, match="529 tokens, more than the model's limit of 16"):
        ids, truncated = generator.encode_prompt(long_prompt)
    assert truncated and len(ids) == 16 and ids[-1] == 1  # still ends with </s>
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not generator("summarize: short", GenerationOptions(max_new_tokens=2)).truncated


# -- bad input ------------------------------------------------------------------------------
@pytest.mark.parametrize("field", ["vocab_size", "d_model", "d_kv", "d_ff", "num_layers", "num_heads"])
def test_missing_config_field_is_a_format_error_naming_it(model_dirs, field):
    config = json.loads((model_dirs["v1_0"] / "config.json").read_text())
    del config[field]
    with pytest.raises(FormatError, match=f"missing field '{field}'"):
        T5Config.from_hf_config(config)


def test_bad_config_values_are_refused():
    base = {"vocab_size": 10, "d_model": 8, "d_kv": 4, "d_ff": 16, "num_layers": 1, "num_heads": 2}
    with pytest.raises(UnsupportedError, match="gated-swoosh.*swoosh"):
        T5Config.from_hf_config({**base, "feed_forward_proj": "gated-swoosh"})
    with pytest.raises(FormatError, match="feed_forward_proj"):
        T5Config.from_hf_config({**base, "feed_forward_proj": "fancy-gated-gelu"})
    with pytest.raises(FormatError, match="'d_model' must be a positive integer"):
        T5Config.from_hf_config({**base, "d_model": "8"})
    assert T5Config.from_hf_config({**base, "feed_forward_proj": "gated-silu"}).dense_act_fn == "silu"


def test_checkpoint_shape_mismatch_names_the_tensor(recorder, tmp_path):
    from candle_web.io.safetensors import save

    weights = recorder.random_t5_weights("v1_0")
    name = "decoder.block.1.layer.1.EncDecAttention.k.weight"
    weights[name] = weights[name][:, :-1].copy()
    save(weights, tmp_path / "model.safetensors")
    with pytest.raises(ShapeMismatch, match=r"EncDecAttention\.k\.weight.*\[32, 32\].*\[32, 31\]"):
        T5ForConditionalGeneration.load(str(tmp_path / "model.safetensors"),
                                        recorder.config_json("v1_0"))


def test_bad_ids_and_masks_are_refused(models):
    model = models["v1_0"]
    with pytest.raises(ShapeMismatch, match="integer token ids"):
        model.encode([[0.5, 1.0]])
    with pytest.raises(ShapeMismatch, match="seq > 0"):
        model.encode([[]])
    with pytest.raises(ShapeMismatch, match="attention_mask"):
        model.encode([[5, 6, 1]], attention_mask=[[1, 1]])
