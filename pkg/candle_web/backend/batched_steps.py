"""Continuous batching's steps (the API's text scheduler): one token for each of B sequences,
each at its own position with its own KV caches, in one step; and the prompts of several
sequences in one pass. The strategies of backend/parts.py for servers: the part's `step_rows`
and `step_prompts` where the backend has them (numba), else each row through the single-sequence
step, so that a row's logits are bit for bit those the sequence gets alone either way."""

from __future__ import annotations

import numpy as np

from ..core import dtype as dt
from ..core.errors import ShapeMismatch
from ..core.tensor import Tensor
from .parts import LLAMA_DECODER_STEP, FastPath, FusedCausalSteps, fast_path, start_causal_decoding


# -- continuous batching: B sequences, each at its own position, in one step ---------------------
def start_batched_causal_decoding(model, exact: bool = True):
    """How a server advances several causal-LM sequences by one token each, every sequence at
    its own position with its own KV caches (`nn.KvCache` per block, as `model.caches` holds
    them): `FusedBatchedSteps` when the model's `llama.decoder_step` part offers `step_rows`
    (numba), else `ReferenceBatchedSteps`. Both are called as
    steps(ids [B] ints, row_caches [B][blocks]) -> f32 numpy logits [B, vocab], and both give
    each row exactly the logits (bit for bit) that `start_causal_decoding(model)` gives that
    sequence alone, so a request's greedy ids do not depend on its batch (the API uses this).
    exact=False: without the part, `ModelBatchedSteps` (the model's `forward_rows`, one numpy
    product per weight for all rows) instead: the reference computation, close to the single
    step but not bit-identical to it."""
    if hasattr(model, "part_weights"):
        path = fast_path(LLAMA_DECODER_STEP, model, model.device)
        if getattr(path.impl, "step_rows", None) is not None:
            return FusedBatchedSteps(model, path)
    if not exact and hasattr(model, "forward_rows"):
        return ModelBatchedSteps(model)
    return ReferenceBatchedSteps(model)


class ModelBatchedSteps:
    """The model's own batched tensor path (`forward_rows`): each weight read once per step for
    all rows, attention per row. NOT bit-identical to the single-sequence step: a numpy/BLAS
    product over B rows (sgemm, M = B) may sum a row in another order than M = 1, so a row's
    logits can differ in the last bits and a near-tie argmax flip; the server therefore takes
    `ReferenceBatchedSteps` where no batched part exists."""

    def __init__(self, model):
        self.model = model

    def __call__(self, ids, row_caches) -> np.ndarray:
        return self.model.forward_rows(ids, row_caches).to_numpy()


class ReferenceBatchedSteps:
    """Each row through `start_causal_decoding(model)`'s step in turn, the row's caches swapped
    into the model: bit-identical to the single-sequence step by construction (the same call),
    but the weights are read once per row, not once per step. It is the path of backends
    without a batched part (numpy): a batched numpy matmul (BLAS sgemm with M = B) may round a
    row differently from M = 1, which would make greedy ids depend on the batch."""

    def __init__(self, model):
        self.model = model
        self.single = start_causal_decoding(model)

    def prompts(self, prompts, row_caches) -> np.ndarray:
        """Each prompt through the single-sequence path in turn, on its own caches (see
        FusedBatchedSteps.prompts)."""
        model, saved = self.model, self.model.caches
        rows = []
        try:
            for prompt, caches in zip(prompts, row_caches):
                model.caches = caches
                rows.append(self.single(np.array([list(prompt)], np.int64),
                                        model.seq_len).to_numpy().reshape(-1))
        finally:
            model.caches = saved
        return np.stack(rows)

    def __call__(self, ids, row_caches) -> np.ndarray:
        model, saved = self.model, self.model.caches
        rows = []
        try:
            for token, caches in zip(np.asarray(ids, dtype=np.int64).reshape(-1), row_caches):
                model.caches = caches
                rows.append(self.single(np.array([[token]], np.int64),
                                        model.seq_len).to_numpy().reshape(-1))
        finally:
            model.caches = saved
        return np.stack(rows)


class FusedBatchedSteps:
    """All rows in one call of the part's `step_rows`: one pass over each weight per step for
    every row (kernels/batched_step.py in the numba backend), attention per row over its own
    cache. The cache hand-off is FusedCausalSteps's: each row's key and value are written at
    its position of its own caches, which then advance."""

    def __init__(self, model, path: FastPath):
        self.model, self.path = model, path
        self.fallback = ReferenceBatchedSteps(model)

    def __call__(self, ids, row_caches) -> np.ndarray:
        model = self.model
        impl = self.path.usable()
        array = np.asarray(ids, dtype=np.int64).reshape(-1)
        if impl is None or len(array) != len(row_caches) or not len(array):
            return self.fallback(array, row_caches)
        cfg = model.config
        x = model.embed(Tensor.from_numpy(array.reshape(-1, 1), dt.i64, model.device))
        entry = (1, cfg.num_kv_heads, 1, cfg.head_dim)
        positions, buffers = [], []
        for caches in row_caches:
            positions.append(caches[0].length)
            row = []
            for cache in caches:
                keys, values = cache.buffers(1, entry, x.dtype, x.device)
                row.append((keys[0], values[0]))  # [n_kv, capacity, head_dim]
            buffers.append(row)
        model.rotary.tables(max(positions), 1)  # grows the tables to cover every position
        logits = impl.step_rows(x.storage().reshape(len(array), -1), positions, buffers,
                                model.rotary.cos.storage(), model.rotary.sin.storage())
        for caches in row_caches:
            for cache in caches:
                cache.advance(1)
        return logits

    def prompts(self, prompts, row_caches) -> np.ndarray:
        """Several sequences' prompts (or the rest of them: each is appended to whatever its
        caches row_caches[r] hold) as the rows of steps of at most PROMPT_CHUNK rows, each
        weight read once per step for all of them -> logits [R, vocab] of each prompt's last
        token, bit for bit those of running each prompt alone (the part's `step_prompts`; a
        server admitting several requests at once). Without it, one prompt after another."""
        model = self.model
        impl = self.path.usable()
        if impl is None or getattr(impl, "step_prompts", None) is None:
            return self.fallback.prompts(prompts, row_caches)
        prompts = [np.asarray(p, dtype=np.int64).reshape(-1) for p in prompts]
        if len(prompts) != len(row_caches) or any(not p.size for p in prompts):
            raise ShapeMismatch(f"prompts: {len(prompts)} non-empty prompts need as many rows "
                                f"of caches, got {len(row_caches)}")
        cfg = model.config
        x = model.embed(Tensor.from_numpy(np.concatenate(prompts).reshape(-1, 1), dt.i64,
                                          model.device))
        xs = x.storage().reshape(-1, x.dims()[-1])
        entry = (1, cfg.num_kv_heads, 1, cfg.head_dim)
        starts, buffers = [], []
        for prompt, caches in zip(prompts, row_caches):
            starts.append(caches[0].length)
            row = []
            for cache in caches:
                keys, values = cache.buffers(prompt.size, entry, x.dtype, x.device)
                row.append((keys[0], values[0]))
            buffers.append(row)
        model.rotary.tables(0, max(s + p.size for s, p in zip(starts, prompts)))
        cos, sin = model.rotary.cos.storage(), model.rotary.sin.storage()
        # Rows in prompt order, cut into steps of at most `chunk` rows; a step's rows of one
        # prompt form a segment (r, first row, length).
        chunk = FusedCausalSteps.PROMPT_CHUNK
        steps, rows = [[]], 0
        for r, prompt in enumerate(prompts):
            for done in range(0, prompt.size, chunk):
                length = min(prompt.size - done, chunk)
                if rows + length > chunk:
                    steps.append([])
                    rows = 0
                steps[-1].append((r, done, length))
                rows += length
        offsets = np.cumsum([0] + [p.size for p in prompts])
        logits = [None] * len(prompts)
        for step in steps:
            segments = [(starts[r] + done, length, buffers[r]) for r, done, length in step]
            step_xs = np.concatenate([xs[offsets[r] + done:offsets[r] + done + length]
                                      for r, done, length in step])
            out = impl.step_prompts(step_xs, segments, cos, sin)
            for (r, done, length), row_logits in zip(step, out):
                if done + length == prompts[r].size:
                    logits[r] = row_logits
        for prompt, caches in zip(prompts, row_caches):
            for cache in caches:
                cache.advance(prompt.size)
        return np.stack(logits)
