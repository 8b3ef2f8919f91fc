"""Turning logits into the next token, like Candle's `LogitsProcessor`.

Strategies (`Sampling`): argmax (greedy), sampling from the whole distribution, top-k, top-p
(nucleus), and top-k then top-p; all but argmax divide the logits by a temperature first.
Sampling is seeded: the same seed and logits give the same tokens on every platform (numpy's
PCG64 generator, one uniform draw per token, inverse-CDF lookup).

Mask semantics (match Candle and transformers' TopK/TopP warpers):
  * top-k keeps the k most probable tokens; ties at the k-th place go to the lower token id.
  * top-p keeps, in order of decreasing probability, every token whose more-probable
    predecessors hold less than p of the mass: the smallest set reaching p, the token that
    crosses p included. p <= 0 or p >= 1 disables the mask.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..core.errors import CandleError, ShapeError

# Candle's examples use the speed of light as their default seed; so do we.
DEFAULT_SEED = 299792458
# Temperatures at or below this are treated as 0: greedy decoding.
MIN_TEMPERATURE = 1e-7

KINDS = ("argmax", "all", "top_k", "top_p", "top_k_then_top_p")


@dataclass(frozen=True)
class Sampling:
    kind: str = "argmax"
    temperature: float = 1.0
    k: int = None
    p: float = None

    def __post_init__(self):
        if self.kind not in KINDS:
            raise CandleError(f"Sampling: unknown kind {self.kind!r}; expected one of {KINDS}")
        if self.kind in ("top_k", "top_k_then_top_p") and (self.k is None or self.k < 1):
            raise CandleError(f"Sampling {self.kind}: k must be a positive integer, got {self.k}")
        if self.kind in ("top_p", "top_k_then_top_p") and self.p is None:
            raise CandleError(f"Sampling {self.kind}: p is required")
        if self.kind != "argmax" and not self.temperature > 0:
            raise CandleError(f"Sampling {self.kind}: temperature must be > 0, got "
                              f"{self.temperature} (use argmax for greedy)")

    @staticmethod
    def from_options(temperature=None, top_k=None, top_p=None) -> "Sampling":
        """The strategy Candle's examples build from --temperature/--top-k/--top-p: greedy
        when the temperature is absent or ~0, else the masks that are given."""
        if temperature is None or temperature <= MIN_TEMPERATURE:
            return Sampling("argmax")
        if top_k is None and top_p is None:
            return Sampling("all", temperature)
        if top_p is None:
            return Sampling("top_k", temperature, k=int(top_k))
        if top_k is None:
            return Sampling("top_p", temperature, p=float(top_p))
        return Sampling("top_k_then_top_p", temperature, k=int(top_k), p=float(top_p))


def softmax(logits: np.ndarray) -> np.ndarray:
    """Softmax in float64 (exact enough that masks do not depend on rounding)."""
    shifted = logits.astype(np.float64) - np.max(logits)
    weights = np.exp(shifted)
    return weights / weights.sum()


def top_k_mask(probs: np.ndarray, k: int) -> np.ndarray:
    """Boolean mask of the k most probable entries (ties broken toward the lower index)."""
    keep = np.zeros(probs.shape, dtype=bool)
    if k >= probs.size:
        keep[:] = True
        return keep
    order = np.argsort(-probs, kind="stable")
    keep[order[:k]] = True
    return keep


def top_p_mask(probs: np.ndarray, p: float) -> np.ndarray:
    """Boolean mask of the nucleus: entries whose more probable predecessors sum to < p."""
    if p <= 0.0 or p >= 1.0:
        return np.ones(probs.shape, dtype=bool)
    order = np.argsort(-probs, kind="stable")
    mass_before = np.cumsum(probs[order]) - probs[order]
    keep = np.zeros(probs.shape, dtype=bool)
    keep[order[mass_before < p]] = True
    return keep


class LogitsProcessor:
    """`sample(logits) -> token id` with a seeded generator; `distribution(logits)` is the
    (masked, renormalised) distribution a sample is drawn from."""

    def __init__(self, seed: int = DEFAULT_SEED, temperature=None, top_p=None, top_k=None,
                 sampling: Sampling = None):
        self.sampling = sampling or Sampling.from_options(temperature, top_k, top_p)
        self.rng = np.random.default_rng(seed)

    @staticmethod
    def from_sampling(seed: int, sampling: Sampling) -> "LogitsProcessor":
        return LogitsProcessor(seed, sampling=sampling)

    def distribution(self, logits) -> np.ndarray:
        """float64 probabilities [vocab] after temperature and masks (one-hot for argmax)."""
        logits = _as_vector(logits)
        s = self.sampling
        if s.kind == "argmax":
            probs = np.zeros(logits.shape, dtype=np.float64)
            probs[int(np.argmax(logits))] = 1.0
            return probs
        probs = softmax(logits / np.float64(s.temperature))
        keep = np.ones(probs.shape, dtype=bool)
        if s.kind in ("top_k", "top_k_then_top_p"):
            keep &= top_k_mask(probs, s.k)
        if s.kind == "top_p":
            keep &= top_p_mask(probs, s.p)
        if s.kind == "top_k_then_top_p":
            # The nucleus is taken within the top k, renormalised (as Candle does).
            within_k = np.where(keep, probs, 0.0)
            keep &= top_p_mask(within_k / within_k.sum(), s.p)
        masked = np.where(keep, probs, 0.0)
        return masked / masked.sum()

    def sample(self, logits) -> int:
        if self.sampling.kind == "argmax":
            return int(np.argmax(_as_vector(logits)))
        return self.sample_from(self.distribution(logits))

    def sample_from(self, probs: np.ndarray) -> int:
        """Inverse-CDF draw: one uniform number per token, so runs are reproducible."""
        cdf = np.cumsum(probs)
        target = self.rng.random() * cdf[-1]
        # The first entry whose CDF exceeds the target: masked (zero) entries never are,
        # since the CDF does not rise over them.
        index = int(np.searchsorted(cdf, target, side="right"))
        if index >= probs.size:  # rounding put the target on the CDF's top step
            index = int(np.flatnonzero(probs)[-1])
        return index


def _as_vector(logits) -> np.ndarray:
    if hasattr(logits, "to_numpy"):
        logits = logits.to_numpy()
    logits = np.asarray(logits)
    if logits.ndim == 2 and logits.shape[0] == 1:
        logits = logits[0]
    if logits.ndim != 1 or logits.size == 0:
        raise ShapeError(f"logits processor: expected logits [vocab] (or [1, vocab]), got "
                         f"shape {list(logits.shape)}")
    return logits
