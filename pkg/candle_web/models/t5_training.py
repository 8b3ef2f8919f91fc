"""A trainable T5: the model of t5.py with every weight a `Var` of a `VarMap`.

    varmap = nn.VarMap()
    model = trainable_t5(config, varmap)            # missing weights created with T5's init
    logits = model(input_ids, decoder_ids, mask)    # teacher forcing, recorded by autograd
    loss = sequence_cross_entropy(logits, labels, label_mask)
    optimizer.backward_step(loss); varmap.save("model.safetensors")   # HF tensor names

Inference builds matrices as `QMatMul` layers, which call the backend directly and record
nothing; here they are `nn.Linear` layers over the Vars, so the same modules train. The tied
head (v1.0 configs) multiplies by the shared embedding Var itself, so both uses of it get
gradients. The saved file loads back with `T5ForConditionalGeneration.load` / transformers'
`from_pretrained`.
"""

from __future__ import annotations

import numpy as np

from ..core import dtype as dt
from ..core.errors import ShapeMismatch, UnsupportedError
from ..nn import init as nn_init
from ..nn.layers import Linear
from ..nn.loss import cross_entropy
from ..nn.var_builder import VarMap
from ..core.tensor import Tensor
from ..io.weights import Weights
from .t5 import T5Config, T5ForConditionalGeneration

LM_HEAD = "lm_head.weight"


def initial_std(config: T5Config, name: str) -> float:
    """Standard deviation of a fresh weight, as HF's T5 `_init_weights` (factor 1.0), which
    folds the missing 1/sqrt(d_kv) attention scaling into the query init. One deviation: an
    untied lm_head starts at d_model ** -0.5 instead of 1.0, so the first logits have unit
    scale like the tied head's rescale gives (with 1.0 they start ~sqrt(d_model) wide)."""
    d, d_kv, heads = config.d_model, config.d_kv, config.num_heads
    leaf = name.rsplit(".", 2)[-2]  # "q" in "...SelfAttention.q.weight"
    table = {"q": (d * d_kv) ** -0.5, "k": d ** -0.5, "v": d ** -0.5, "o": (heads * d_kv) ** -0.5,
             "wi": d ** -0.5, "wi_0": d ** -0.5, "wi_1": d ** -0.5, "wo": config.d_ff ** -0.5,
             "relative_attention_bias": d ** -0.5, "shared": 1.0, "lm_head": d ** -0.5}
    if leaf not in table:
        raise UnsupportedError(f"t5 training: no initialisation for weight {name!r}")
    return table[leaf]


class _VarMapWeights(Weights):
    """A weights source over a VarMap, by HF name: existing Vars are reused (shape-checked),
    missing ones created; layer norms start at 1. Matrices are `nn.Linear` over the Vars."""

    naming = "hf"  # the names T5.load asks for, and the ones saved
    label = "the VarMap"

    def __init__(self, config: T5Config, varmap: VarMap, device):
        self.config, self.varmap, self.device = config, varmap, device

    def names(self) -> list:
        return self.varmap.names()

    def has(self, name: str) -> bool:
        if name == LM_HEAD:  # a fresh VarMap holds nothing yet: the config decides
            return not self.config.scale_decoder_outputs
        return self.varmap.has(name)

    def shape(self, name: str) -> tuple:
        return self.varmap.shape(name)

    def tensor(self, name: str, shape=None, dtype=None, device=None) -> Tensor:
        init = (nn_init.ONE if "layer_norm" in name
                else nn_init.Randn(0.0, initial_std(self.config, name)))
        return self.varmap.get_or_create(name, shape, init, dt.f32, self.device)

    def matrix(self, parts, device=None, mode: str = "auto") -> Linear:
        (name, shape), = parts
        return Linear(self.tensor(name, shape))

    def tied_matrix(self, tensor: Tensor) -> Linear:
        return Linear(tensor)


def trainable_t5(config: T5Config, varmap: VarMap, device=None) -> T5ForConditionalGeneration:
    """A T5 whose weights are the Vars of `varmap` under HF names (created when missing,
    drawn from the device's generator: seed it with `manual_seed` for a repeatable start)."""
    from ..core.device import Device

    device = Device.parse(device)
    return T5ForConditionalGeneration.load(_VarMapWeights(config, varmap, device), config, device)


def sequence_cross_entropy(logits: Tensor, labels, label_mask) -> Tensor:
    """Mean cross entropy over the real (mask 1) positions of logits [b, t, vocab] against
    label ids [b, t]; padded positions do not count. Only the kept rows go through the
    log-softmax, so padding costs nothing in the backward pass either."""
    labels, label_mask = np.asarray(labels), np.asarray(label_mask)
    b, t, vocab = logits.dims()
    if labels.shape != (b, t) or label_mask.shape != (b, t):
        raise ShapeMismatch(f"sequence_cross_entropy: logits {[b, t, vocab]} need labels and "
                            f"mask [{b}, {t}], got {list(labels.shape)} and "
                            f"{list(label_mask.shape)}")
    kept = np.flatnonzero(label_mask.reshape(-1) > 0)
    if kept.size == 0:
        raise ShapeMismatch("sequence_cross_entropy: the label mask keeps no position")
    rows = Tensor.from_numpy(kept.astype(np.int64), dt.i64, logits.device)
    targets = Tensor.from_numpy(labels.reshape(-1)[kept].astype(np.int64), dt.i64, logits.device)
    return cross_entropy(logits.reshape(b * t, vocab).index_select(rows, 0), targets)
