"""LogitsProcessor: exact masks (against transformers' TopK/TopP warpers when installed, and
worked examples), the sampled distribution, and seeded reproducibility."""

from __future__ import annotations

import numpy as np
import pytest

from candle_web.core.errors import CandleError, ShapeError
from candle_web.generation import LogitsProcessor, Sampling, top_k_mask, top_p_mask


def random_logits(seed, size=64):
    return np.random.default_rng(seed).normal(0.0, 2.0, size).astype(np.float32)


def reference_softmax(logits, temperature=1.0):
    from scipy.special import softmax

    return softmax(np.asarray(logits, dtype=np.float64) / temperature)


def test_argmax_is_greedy_and_ignores_the_seed():
    logits = random_logits(0)
    for seed in (0, 1, 2):
        assert LogitsProcessor(seed).sample(logits) == int(np.argmax(logits))
    # A temperature at or near zero also means greedy (Candle's convention).
    assert LogitsProcessor(0, temperature=0.0).sampling.kind == "argmax"
    assert LogitsProcessor(0, temperature=1e-9, top_k=5).sampling.kind == "argmax"


def test_strategy_from_options():
    assert Sampling.from_options(0.7).kind == "all"
    assert Sampling.from_options(0.7, top_k=5).kind == "top_k"
    assert Sampling.from_options(0.7, top_p=0.9).kind == "top_p"
    assert Sampling.from_options(0.7, top_k=5, top_p=0.9).kind == "top_k_then_top_p"


def test_temperature_scales_logits_before_softmax():
    pytest.importorskip("scipy")
    logits = random_logits(1)
    for temperature in (0.5, 1.0, 1.7):
        got = LogitsProcessor(0, temperature=temperature).distribution(logits)
        np.testing.assert_allclose(got, reference_softmax(logits, temperature), rtol=1e-12,
                                   atol=1e-15)


def test_worked_top_p_examples():
    probs = np.array([0.05, 0.5, 0.15, 0.3])
    # Sorted: 0.5, 0.3, 0.15, 0.05; mass before each: 0, 0.5, 0.8, 0.95.
    assert top_p_mask(probs, 0.45).tolist() == [False, True, False, False]
    assert top_p_mask(probs, 0.75).tolist() == [False, True, False, True]
    assert top_p_mask(probs, 0.85).tolist() == [False, True, True, True]
    assert top_p_mask(probs, 1.0).all() and top_p_mask(probs, 0.0).all()  # disabled


def test_worked_top_k_examples():
    probs = np.array([0.1, 0.4, 0.1, 0.4])
    assert top_k_mask(probs, 1).tolist() == [False, True, False, False]  # tie: lower id
    assert top_k_mask(probs, 3).tolist() == [True, True, False, True]
    assert top_k_mask(probs, 10).all()


@pytest.mark.parametrize("seed", range(5))
def test_masks_equal_transformers_warpers(seed):
    pytest.importorskip("transformers")
    import torch
    from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

    logits = random_logits(seed, 200)
    scores = torch.from_numpy(logits.astype(np.float64))[None]
    probs = reference_softmax(logits)
    for k in (1, 5, 40):
        kept = torch.isfinite(TopKLogitsWarper(k)(None, scores.clone()))[0].numpy()
        np.testing.assert_array_equal(top_k_mask(probs, k), kept)
    for p in (0.1, 0.5, 0.9, 0.97):
        kept = torch.isfinite(TopPLogitsWarper(p)(None, scores.clone()))[0].numpy()
        np.testing.assert_array_equal(top_p_mask(probs, p), kept)


def test_top_k_then_top_p_takes_the_nucleus_within_the_top_k():
    logits = np.log(np.array([0.4, 0.25, 0.2, 0.1, 0.05]))
    dist = LogitsProcessor(0, temperature=1.0, top_k=3, top_p=0.6).distribution(logits)
    # Top 3 renormalised: 0.4/0.85, 0.25/0.85, 0.2/0.85 = 0.47, 0.29, 0.24; mass before the
    # third is 0.76 >= 0.6, so the nucleus is the first two.
    np.testing.assert_allclose(dist, [0.4 / 0.65, 0.25 / 0.65, 0, 0, 0], atol=1e-12)


@pytest.mark.parametrize("options", [
    {"temperature": 1.0},
    {"temperature": 0.8, "top_k": 4},
    {"temperature": 1.2, "top_p": 0.7},
    {"temperature": 1.0, "top_k": 5, "top_p": 0.8},
], ids=["all", "top_k", "top_p", "top_k_then_top_p"])
def test_sample_frequencies_follow_the_distribution(options):
    """8000 seeded draws: masked tokens never appear (exact); frequencies within 0.02 of the
    probabilities (3.6 standard deviations of a frequency, at most 0.0056; the draws are
    seeded, so the outcome is fixed, not flaky)."""
    logits = random_logits(11, 10)
    processor = LogitsProcessor(seed=5, **options)
    expected = processor.distribution(logits)
    draws = np.array([processor.sample(logits) for _ in range(8000)])
    counts = np.bincount(draws, minlength=logits.size) / draws.size
    assert np.all(counts[expected == 0] == 0)
    assert np.abs(counts - expected).max() < 0.02


def test_same_seed_same_tokens_and_other_seeds_differ():
    logits = random_logits(3, 100)

    def run(seed):
        processor = LogitsProcessor(seed, temperature=1.0, top_p=0.95)
        return [processor.sample(logits) for _ in range(50)]

    assert run(42) == run(42)
    assert run(42) != run(43)


def test_bad_arguments():
    with pytest.raises(CandleError, match="k must be"):
        LogitsProcessor(0, temperature=1.0, top_k=0)
    with pytest.raises(CandleError, match="unknown kind"):
        Sampling("beam")
    with pytest.raises(ShapeError, match="logits"):
        LogitsProcessor(0).sample(np.zeros((2, 3), np.float32))
