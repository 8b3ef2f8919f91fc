"""The weights protocol (io/weights.py) every model loads through: each source gives the stored
values (numpy is the reference: values are compared exactly, since loading only converts f16 and
GGML blocks to f32 and either is exact or is the blocks' own decoding), shapes are checked before
data is read and errors name the tensor as the file calls it; the name tables map a model's names
to each naming, including the slices of a fused tensor."""

from __future__ import annotations

import numpy as np
import pytest

from candle_web.core.errors import FormatError, ModelNotFound, ShapeMismatch
from candle_web.io.gguf import write_gguf
from candle_web.io.safetensors import serialize
from candle_web.io.weights import (DictWeights, FirstOf, GgufWeights, RowSlice, SafetensorsWeights,
                                   WeightNames, open_weights)
from candle_web.quantized import QTensor

RNG = np.random.default_rng(0)
WEIGHTS = {"blk.0.q": RNG.standard_normal((64, 32)).astype(np.float32),
           "blk.0.k": RNG.standard_normal((32, 32)).astype(np.float32),
           "norm": RNG.standard_normal(32).astype(np.float16)}


def test_open_weights_tells_the_format_and_refuses_what_it_cannot(tmp_path):
    assert isinstance(open_weights(serialize(WEIGHTS)), SafetensorsWeights)
    path = tmp_path / "w.gguf"
    write_gguf(path, {}, WEIGHTS)
    assert isinstance(open_weights(path), GgufWeights)
    assert isinstance(open_weights(path.read_bytes()), GgufWeights)
    assert isinstance(open_weights(WEIGHTS), DictWeights)
    with pytest.raises(FormatError, match="neither GGUF nor safetensors"):
        open_weights(b"\x00" * 64)
    with pytest.raises(FormatError, match="'.h5'"):
        open_weights(tmp_path / "model.h5")


@pytest.mark.parametrize("kind", ["safetensors", "gguf", "dict"])
def test_every_source_gives_the_stored_values_and_checks_shapes(kind, tmp_path):
    if kind == "gguf":
        write_gguf(tmp_path / "w.gguf", {}, WEIGHTS)
        weights = open_weights(tmp_path / "w.gguf")
    else:
        weights = open_weights(serialize(WEIGHTS) if kind == "safetensors" else WEIGHTS)
    assert weights.has("blk.0.q") and not weights.has("blk.0.v")
    assert weights.shape("blk.0.q") == (64, 32)
    np.testing.assert_array_equal(weights.tensor("norm", (32,)).to_numpy(),
                                  WEIGHTS["norm"].astype(np.float32))
    fused = weights.matrix([("blk.0.q", (64, 32)), ("blk.0.k", (32, 32))])
    np.testing.assert_array_equal(fused.weight.to_numpy(),
                                  np.concatenate([WEIGHTS["blk.0.q"], WEIGHTS["blk.0.k"]]))
    with pytest.raises(ShapeMismatch, match=r"blk\.0\.k.*\[32, 32\]"):
        weights.tensor("blk.0.k", (32, 31))
    with pytest.raises(ModelNotFound, match=r"blk\.0\.v"):
        weights.matrix([("blk.0.v", (32, 32))])


def test_ggml_blocks_stay_packed_or_decode_as_the_mode_says():
    q8 = QTensor.from_float(WEIGHTS["blk.0.q"], "Q8_0")
    weights = DictWeights({"q": q8})
    kept = weights.matrix([("q", (64, 32))], mode="quantized")
    dense = weights.matrix([("q", (64, 32))], mode="dequantize")
    assert kept.is_quantized and not dense.is_quantized
    np.testing.assert_array_equal(dense.weight.to_numpy(), q8.dequantize())
    np.testing.assert_array_equal(weights.tensor("q").to_numpy(), q8.dequantize())


NAMES = WeightNames(("hf", "fused"), {
    "embed": (FirstOf("model.embed", "embed_tokens"), "tok"),
    "blocks.{i}.q": ("layers.{i}.q_proj", RowSlice("blk.{i}.qk", 0, 2)),
    "blocks.{i}.k": ("layers.{i}.k_proj", RowSlice("blk.{i}.qk", 1, 2)),
    "blocks.{i}.bias": (None, "blk.{i}.bias"),
}, marker="embed")


def test_name_tables_map_model_names_to_each_naming():
    hf = {"embed_tokens": np.ones((4, 2), np.float32),
          "layers.3.q_proj": WEIGHTS["blk.0.k"], "layers.3.k_proj": WEIGHTS["blk.0.q"][:32]}
    fused = {"tok": np.ones((4, 2), np.float32), "blk.3.qk": WEIGHTS["blk.0.q"]}
    assert NAMES.naming_of(DictWeights(hf)) == "hf" and NAMES.naming_of(DictWeights(fused)) == "fused"
    assert NAMES.naming_of(DictWeights({"other": np.zeros(1, np.float32)})) is None
    assert NAMES.translate("embed_tokens", "hf", "fused") == "tok"
    assert NAMES.translate("tok", "fused", "hf") == "model.embed"  # FirstOf: the first spelling
    with pytest.raises(ModelNotFound, match="no single-tensor counterpart"):
        NAMES.translate("layers.7.k_proj", "hf", "fused")  # a slice of blk.7.qk
    view = NAMES.view(DictWeights(hf), "hf")
    assert view.has("embed")  # FirstOf: the second spelling is the one this file has
    assert not view.has("blocks.3.bias")  # None: the naming stores no such weight
    with pytest.raises(ModelNotFound, match="blocks.3.bias"):
        view.tensor("blocks.3.bias")
    assert sorted(view.names()) == ["blocks.3.k", "blocks.3.q", "embed"]
    # A RowSlice is a row slice of the fused tensor: q the first half, k the second.
    split = NAMES.view(DictWeights(fused), "fused")
    assert split.shape("blocks.3.k") == (32, 32)
    np.testing.assert_array_equal(split.tensor("blocks.3.q", (32, 32)).to_numpy(),
                                  WEIGHTS["blk.0.q"][:32])
    np.testing.assert_array_equal(split.tensor("blocks.3.k", (32, 32)).to_numpy(),
                                  WEIGHTS["blk.0.q"][32:])
    with pytest.raises(ShapeMismatch, match=r"blk\.3\.qk"):
        split.tensor("blocks.3.k", (16, 32))  # the fused tensor would be [32, 32]
