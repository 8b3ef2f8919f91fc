"""The numba backend's fused LLaMA decode step (one token, batch 1), driving
numba_kernels.decoder_step: one machine-code call per block plus one for the head, instead of
a dozen tensor ops per block.

It implements the part ``llama.decoder_step`` (candle_web.backend.parts): `FusedLlamaDecoder.build(weights)` takes the exported weights, each kept as a single unpackable quantized tensor
(GGUF on the numba backend) or as f32 matrices (float checkpoints, or GGUF dequantized at
load); it returns None when a layer is neither (e.g. mixed-type fused parts), and the model then
keeps its generic path. Float weights take the fused step too: on the generic path each token
is ~180 tensor ops that hand work back and forth between numba's OpenMP pool (rope, attention)
and OpenBLAS's threads (every matvec); SmolLM2-135M F32 decoded at 3.5 tok/s that way, and
1.1 tok/s against 6.1 fused in one process at load 6.5 on the 2 cores here.
The model's KV cache buffers are shared with the generic path (prompt processing fills them,
decode steps append here).
"""

from __future__ import annotations

import numpy as np

from ..decode_threads import decode_in_parallel
from ..kernels import decoder_step as nk
from ...quant_unpack import UNPACKABLE, kernel_weight


def _kernel_tuple(qmatmul):
    """The weight in the form the kernels take: the quantized tuple, or the f32 matrix itself
    (C-ordered, never copied when it already is); None when the layer is neither."""
    if not qmatmul.is_quantized:
        matrix = qmatmul.weight.to_numpy()
        if matrix.dtype != np.float32 or matrix.ndim != 2:
            return None
        return np.ascontiguousarray(matrix)
    if len(qmatmul.qweights) != 1:
        return None
    qtensor = qmatmul.qweights[0]
    if qtensor.dtype not in UNPACKABLE:
        return None
    w = kernel_weight(qtensor)
    return (w.levels, w.scales, w.offsets, bool(w.use_offsets), int(w.group))


def _f32(tensor) -> np.ndarray:
    return np.ascontiguousarray(tensor.to_numpy(), dtype=np.float32).reshape(-1)


class FusedLlamaDecoder:
    """Callable: (x f32[d] embedding of the new token, pos, caches, cos, sin) -> logits.
    `parallel` (settable) splits each step's matrix products over numba's threads."""

    def __init__(self, cfg, layers, final_norm, head):
        self.cfg = cfg
        self.parallel = decode_in_parallel()
        self.layers = layers  # per block: (attn_norm, mlp_norm, eps, qkv, out, gate_up, down)
        self.final_norm = final_norm  # (weight, eps)
        self.head = head
        self.vocab_rows = head.shape[0] if isinstance(head, np.ndarray) else head[0].shape[0]
        self.scale = np.float32(1.0 / np.sqrt(cfg.head_dim))

    @staticmethod
    def build(weights):
        """From the model's exported LlamaDecoderWeights (candle_web.backend.parts); None when
        a layer's weights do not fit the kernels or use a family field (qkv bias, q/k norm,
        post norms, sliding window, soft-capping...) these kernels do not implement."""
        if weights.family_fields():
            return None
        layers = []
        for layer in weights.layers:
            matrices = [_kernel_tuple(m) for m in (layer.qkv, layer.out, layer.gate_up, layer.down)]
            if any(w is None for w in matrices):
                return None
            layers.append((_f32(layer.attn_norm), _f32(layer.mlp_norm), np.float32(layer.eps),
                           *matrices))
        head = _kernel_tuple(weights.lm_head)
        if head is None:
            return None
        return FusedLlamaDecoder(weights, layers, (_f32(weights.norm), np.float32(weights.norm_eps)),
                                 head)

    def __call__(self, x: np.ndarray, pos: int, caches, cos: np.ndarray, sin: np.ndarray):
        cfg = self.cfg
        x = np.array(x, dtype=np.float32).reshape(-1)  # updated in place by the blocks
        for (attn_norm, mlp_norm, eps, qkv, out, gate_up, down), (keys, values) in zip(
                self.layers, caches):
            nk.llama_block_step(x, attn_norm, mlp_norm, eps, qkv, out, gate_up, down,
                                keys, values, pos, cos, sin, cfg.num_heads, cfg.num_kv_heads,
                                cfg.head_dim, cfg.rope_interleaved, self.scale, self.parallel)
        logits = np.empty(self.vocab_rows, np.float32)
        norm, eps = self.final_norm
        nk.final_logits(x, norm, eps, self.head, logits, self.parallel)
        return logits
