"""The numba backend's fused LLaMA decode step (one token, batch 1), driving
numba_kernels.decoder_step: one machine-code call per block plus one for the head, instead of
a dozen tensor ops per block.

It implements the part ``llama.decoder_step`` (candle_web.backend.parts):
`FusedLlamaDecoder.build(weights)` takes the exported weights, each kept as unpackable quantized
tensors (GGUF on the numba backend) or as f32 matrices (float checkpoints, or GGUF dequantized
at load); it returns None when a layer is neither, or when the model uses a family field these
kernels do not implement (IMPLEMENTED_FAMILY_FIELDS: qwen2's QKV bias is), and the model then
keeps its generic path.

A fused projection whose parts have different GGML types (Qwen2.5's Q4_K_M file: Q5_0 q/k
with a Q8_0 v in half of its blocks) is joined into one kernel weight here: the parts' levels
and scales stacked row-wise, 32-element groups split into two 16-element ones with the same
scale where another part has 16-element groups (Q6_K), zero offsets for the parts without;
every element's value stays scale * level + offset, so only the summation order changes.

Float weights take the fused step too: on the generic path each token
is ~180 tensor ops that hand work back and forth between numba's OpenMP pool (rope, attention)
and OpenBLAS's threads (every matvec); SmolLM2-135M F32 decoded at 3.5 tok/s that way, and
1.1 tok/s against 6.1 fused in one process at load 6.5 on the 2 cores here.
The model's KV cache buffers are shared with the generic path (prompt processing fills them,
decode steps append here).
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from candle_web.backend.settings import settings
from candle_web.quantized.int8_weights import quantize_weight_rows

from ..decode_threads import decode_in_parallel
from ..kernels import decoder_step as nk
from ...quant_unpack import UNPACKABLE, kernel_weight

# The LlamaDecoderWeights family fields (backend/parts.py) the block step implements.
IMPLEMENTED_FAMILY_FIELDS = frozenset({"qkv_bias"})
NO_BIAS = np.zeros(0, np.float32)


def _kernel_tuple(qmatmul):
    """The weight in the form the kernels take: the quantized tuple (its levels viewed as
    uint8 under the compute type int8, which selects the integer kernels, qint8.py), or the
    f32 matrix itself (C-ordered, never copied when it already is; under int8 quantized per
    output row into such a tuple); None when the layer is neither."""
    weight = _float_or_quantized_tuple(qmatmul)
    if settings().compute_type != "int8" or weight is None:
        return weight
    if isinstance(weight, tuple):
        return (weight[0].view(np.uint8), *weight[1:])
    if weight.shape[1] % 32:
        return weight  # the int8 products take rows in blocks of 32: this one stays f32
    # A float checkpoint: int8 per output row at load (CTranslate2's rule, int8_weights.py).
    rows = quantize_weight_rows(weight)
    return (rows.levels.view(np.uint8), rows.scales, np.zeros((1, 1), np.float32), False, 32)


def _float_or_quantized_tuple(qmatmul):
    if not qmatmul.is_quantized:
        matrix = qmatmul.weight.to_numpy()
        if matrix.dtype != np.float32 or matrix.ndim != 2:
            return None
        return np.ascontiguousarray(matrix)
    if any(q.dtype not in UNPACKABLE for q in qmatmul.qweights):
        return None
    unpacked = [kernel_weight(q) for q in qmatmul.qweights]
    if len(unpacked) == 1:
        w = unpacked[0]
        return (w.levels, w.scales, w.offsets, bool(w.use_offsets), int(w.group))
    return _joined(unpacked)


def _kernel_tuples(matrices) -> list:
    """_kernel_tuple of each matrix, on one thread per CPU: unpacking is numpy work that
    releases the GIL (Qwen2.5-0.5B's Q4_K_M file: 1.5 s of a 3.2 s server start on one
    thread)."""
    workers = max(1, min(len(matrices), os.cpu_count() or 1))
    if workers == 1:
        return [_kernel_tuple(m) for m in matrices]
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="candle-web-unpack") as pool:
        return list(pool.map(_kernel_tuple, matrices))


def _joined(parts):
    """Kernel weights of a fused projection's parts (types may differ) as one tuple: rows
    stacked, groups of the smallest size (a wider group's scale and offset repeated), zero
    offsets for parts without. Copies the parts (a projection's q/k/v: ~1 MB per Qwen2.5-0.5B
    block)."""
    group = min(w.group for w in parts)
    use_offsets = any(w.use_offsets for w in parts)
    scales, offsets = [], []
    for w in parts:
        repeat = w.group // group
        scales.append(np.repeat(w.scales, repeat, axis=1))
        if use_offsets:
            offsets.append(np.repeat(w.offsets, repeat, axis=1) if w.use_offsets
                           else np.zeros_like(scales[-1]))
    return (np.concatenate([w.levels for w in parts]), np.concatenate(scales),
            np.concatenate(offsets) if use_offsets else np.zeros((1, 1), np.float32),
            use_offsets, group)


def _f32(tensor) -> np.ndarray:
    return np.ascontiguousarray(tensor.to_numpy(), dtype=np.float32).reshape(-1)


class FusedLlamaDecoder:
    """Callable: (x f32[d] embedding of the new token, pos, caches, cos, sin) -> logits.
    `parallel` (settable) splits each step's matrix products over numba's threads."""

    def __init__(self, cfg, layers, final_norm, head):
        self.cfg = cfg
        self.parallel = decode_in_parallel()
        self.layers = layers  # per block: (attn_norm, mlp_norm, eps, qkv, qkv_bias, out,
        #                                   gate_up, down)
        self.final_norm = final_norm  # (weight, eps)
        self.head = head
        self.vocab_rows = head.shape[0] if isinstance(head, np.ndarray) else head[0].shape[0]
        self.scale = np.float32(1.0 / np.sqrt(cfg.head_dim))

    @staticmethod
    def build(weights):
        """From the model's exported LlamaDecoderWeights (candle_web.backend.parts); None when
        a layer's weights do not fit the kernels or use a family field (q/k norm, post norms,
        sliding window, soft-capping...) these kernels do not implement (the QKV bias they do)."""
        if weights.family_fields() - IMPLEMENTED_FAMILY_FIELDS:
            return None
        matrices = [m for layer in weights.layers
                    for m in (layer.qkv, layer.out, layer.gate_up, layer.down)]
        tuples = iter(_kernel_tuples(matrices + [weights.lm_head]))
        layers = []
        for layer in weights.layers:
            qkv, out, gate_up, down = (next(tuples) for _ in range(4))
            if any(w is None for w in (qkv, out, gate_up, down)):
                return None
            bias = NO_BIAS if layer.qkv_bias is None else _f32(layer.qkv_bias)
            layers.append((_f32(layer.attn_norm), _f32(layer.mlp_norm), np.float32(layer.eps),
                           qkv, bias, out, gate_up, down))
        head = next(tuples)
        if head is None:
            return None
        return FusedLlamaDecoder(weights, layers, (_f32(weights.norm), np.float32(weights.norm_eps)),
                                 head)

    def __call__(self, x: np.ndarray, pos: int, caches, cos: np.ndarray, sin: np.ndarray):
        cfg = self.cfg
        x = np.array(x, dtype=np.float32).reshape(-1)  # updated in place by the blocks
        for (attn_norm, mlp_norm, eps, qkv, bias, out, gate_up, down), (keys, values) in zip(
                self.layers, caches):
            nk.llama_block_step(x, attn_norm, mlp_norm, eps, qkv, bias, out, gate_up, down,
                                keys, values, pos, cos, sin, cfg.num_heads, cfg.num_kv_heads,
                                cfg.head_dim, cfg.rope_interleaved, self.scale, self.parallel)
        logits = np.empty(self.vocab_rows, np.float32)
        norm, eps = self.final_norm
        nk.final_logits(x, norm, eps, self.head, logits, self.parallel)
        return logits

    def step_rows(self, xs, positions, row_caches, cos, sin):
        """B sequences at once, each at its own position with its own caches (see
        llama_batched.step_rows): per row bit-identical to calling this step on it alone."""
        from .llama_batched import step_rows

        return step_rows(self, xs, positions, row_caches, cos, sin)

    def step_prompts(self, xs, segments, cos, sin):
        """Prompt tokens of one or more sequences as the rows of one step (see
        llama_batched.step_prompts): each segment's last logits, bit-identical to stepping
        through its tokens one by one."""
        from .llama_batched import step_prompts

        return step_prompts(self, xs, segments, cos, sin)
