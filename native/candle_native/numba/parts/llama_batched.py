"""The numba backend's batched LLaMA decode step: B sequences, one new token each, each at its
own position with its own KV cache (kernels/batched_step.py). Offered as
`FusedLlamaDecoder.step_rows` (the part ``llama.decoder_step``'s batched entry, see
candle_web.backend.batched_steps.start_batched_causal_decoding). Per block: one kernel call for the
first half of all rows (one pass over the QKV weight), one per row for its cache and attention,
one for the second half (one pass over each of the output, gate|up and down weights); then the
head once for all rows. Each row's logits are bit-identical to the single step's.

`step_prompts` runs prompts' tokens the same way, as rows of their sequences, each sharing its
sequence's cache (row b of a segment at start + b, attending to the rows before it): the weights
are read once for all the tokens of all the prompts, only each segment's last row goes through
the head, and the logits are bit-identical to feeding each prompt token by token through the
single step."""

from __future__ import annotations

import numpy as np

from ..kernels import batched_step as bk


def _blocks(decoder, xs, positions, cos, sin, attend) -> np.ndarray:
    """Every block over the rows xs f32[B, d] in place; attend(index, qkvs, attended) writes
    the rows' keys and values into their caches and their attention outputs."""
    cfg = decoder.cfg
    q_size = cfg.num_heads * cfg.head_dim
    for index, (attn_norm, mlp_norm, eps, qkv, bias, out, gate_up, down) in enumerate(
            decoder.layers):
        qkvs = bk.block_rows_before_attention(
            xs, attn_norm, eps, qkv, bias, positions, cos, sin, cfg.num_heads,
            cfg.num_kv_heads, cfg.head_dim, cfg.rope_interleaved, decoder.parallel)
        attended = np.empty((xs.shape[0], q_size), np.float32)
        attend(index, qkvs, attended)
        bk.block_rows_after_attention(xs, attended, out, mlp_norm, eps, gate_up, down,
                                      decoder.parallel)
    return xs


def _logits(decoder, xs) -> np.ndarray:
    logits = np.empty((xs.shape[0], decoder.vocab_rows), np.float32)
    norm, eps = decoder.final_norm
    bk.final_logits_rows(xs, norm, eps, decoder.head, logits, decoder.parallel)
    return logits


def step_rows(decoder, xs: np.ndarray, positions, row_caches, cos: np.ndarray,
              sin: np.ndarray) -> np.ndarray:
    """xs f32[B, d] (the new tokens' embeddings), positions [B], row_caches[b][block] = (keys,
    values) f32[n_kv, capacity, head_dim] of row b (capacity > positions[b]) -> logits
    f32[B, vocab]. Writes each row's key and value at its position."""
    cfg = decoder.cfg
    xs = np.array(xs, dtype=np.float32).reshape(len(row_caches), -1)  # updated in place
    positions = np.asarray(positions, dtype=np.int64)

    def attend(index, qkvs, attended):
        for b in range(len(row_caches)):
            keys, values = row_caches[b][index]
            bk.store_and_attend(qkvs[b], keys, values, positions[b], cfg.num_heads,
                                cfg.num_kv_heads, cfg.head_dim, decoder.scale, attended[b],
                                decoder.parallel)

    return _logits(decoder, _blocks(decoder, xs, positions, cos, sin, attend))


def step_prompts(decoder, xs: np.ndarray, segments, cos: np.ndarray,
                 sin: np.ndarray) -> np.ndarray:
    """Prompt tokens of one or more sequences as the rows of one step: xs f32[R, d] (their
    embeddings), segments [(start, length, caches)] in row order, each `length` consecutive rows
    of one sequence at positions start .. start + length - 1 (caches[block] = (keys, values),
    capacity >= start + length; a sequence may have several segments, in order) -> logits
    f32[len(segments), vocab] of each segment's last row. Writes the rows' keys and values."""
    cfg = decoder.cfg
    xs = np.array(xs, dtype=np.float32, ndmin=2)  # updated in place
    positions = np.concatenate([np.arange(start, start + length, dtype=np.int64)
                                for start, length, _ in segments])
    bounds = np.cumsum([0] + [length for _, length, _ in segments])

    def attend(index, qkvs, attended):
        for (_, _, caches), first, stop in zip(segments, bounds[:-1], bounds[1:]):
            keys, values = caches[index]
            bk.store_and_attend_rows(qkvs[first:stop], keys, values, positions[first:stop],
                                     cfg.num_heads, cfg.num_kv_heads, cfg.head_dim,
                                     decoder.scale, attended[first:stop], decoder.parallel)

    xs = _blocks(decoder, xs, positions, cos, sin, attend)
    return _logits(decoder, np.ascontiguousarray(xs[bounds[1:] - 1]))
