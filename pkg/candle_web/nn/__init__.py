"""Layers, functional ops, rotary embeddings, KV cache, losses, optimizers and weight loading."""

from . import init, loss, ops, optim, rotary
from .kv_cache import Cache, KvCache
from .layers import (Activation, Conv1d, Conv2d, Embedding, LayerNorm, Linear, Module, RmsNorm,
                     conv1d, conv2d, embedding, layer_norm, linear, linear_no_bias, rms_norm)
from .optim import SGD, AdamW, ParamsAdamW
from .rotary import rope, rope_frequencies, rope_i
from .var_builder import VarBuilder, VarMap

__all__ = [
    "init", "loss", "ops", "optim", "rotary", "Cache", "KvCache", "Activation", "Conv1d",
    "Conv2d", "Embedding", "LayerNorm", "Linear", "Module", "RmsNorm", "conv1d", "conv2d",
    "embedding", "layer_norm", "linear", "linear_no_bias", "rms_norm", "SGD", "AdamW",
    "ParamsAdamW", "rope", "rope_frequencies", "rope_i", "VarBuilder", "VarMap",
]
