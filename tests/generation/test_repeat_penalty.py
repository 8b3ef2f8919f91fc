"""Repeat penalty against transformers' RepetitionPenaltyLogitsProcessor (same f32 ops, so
bit-equal), and the window."""

from __future__ import annotations

import numpy as np
import pytest

from candle_web.core.errors import CandleError
from candle_web.generation import apply_repeat_penalty, penalty_window


@pytest.mark.parametrize("penalty", [1.1, 1.5, 0.8])
def test_equals_transformers_repetition_penalty(penalty):
    pytest.importorskip("transformers")
    import torch
    from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

    rng = np.random.default_rng(0)
    logits = rng.normal(0.0, 3.0, 50).astype(np.float32)
    logits[7] = 0.0  # zero stays zero either way
    context = [3, 7, 3, 12, 40, 12, 12, 49, 0]
    expected = RepetitionPenaltyLogitsProcessor(penalty)(torch.tensor([context]),
                                                         torch.from_numpy(logits.copy())[None])
    np.testing.assert_array_equal(apply_repeat_penalty(logits, penalty, context),
                                  expected[0].numpy())


def test_penalty_only_touches_the_context_and_pushes_down():
    logits = np.array([2.0, -2.0, 1.0, -1.0], np.float32)
    out = apply_repeat_penalty(logits, 2.0, [0, 1, 1])
    assert out.tolist() == [1.0, -4.0, 1.0, -1.0]
    assert logits.tolist() == [2.0, -2.0, 1.0, -1.0]  # the input is not modified
    assert apply_repeat_penalty(logits, 1.0, [0, 1]).tolist() == logits.tolist()
    assert apply_repeat_penalty(logits, 2.0, [99, -1]).tolist() == logits.tolist()


def test_window_is_the_last_n_tokens():
    tokens = [5, 6, 7, 8, 9]
    assert penalty_window(tokens, 2) == [8, 9]
    assert penalty_window(tokens, 64) == tokens
    assert penalty_window(tokens, 0) == []


def test_bad_penalty():
    with pytest.raises(CandleError, match="penalty"):
        apply_repeat_penalty(np.zeros(3, np.float32), 0.0, [1])
