"""VarBuilder over every source (dict, safetensors bytes and path, npz, VarMap) and VarMap
save/load; files are written by the reference libraries (safetensors, numpy) where they can be."""

from __future__ import annotations

import numpy as np
import pytest

from candle_web import ModelNotFound, ShapeMismatch, Tensor, bf16, f16, f32, nn
from candle_web.io import npz as cw_npz
from candle_web.nn import init

torch = pytest.importorskip("torch")


def _weights():
    rng = np.random.default_rng(6)
    return {
        "encoder.layers.0.attn.q.weight": rng.standard_normal((4, 3)).astype(np.float32),
        "encoder.layers.0.attn.q.bias": rng.standard_normal(4).astype(np.float32),
        "encoder.norm.weight": rng.standard_normal(3).astype(np.float16),
        "head.weight": rng.standard_normal((2, 3)).astype(np.float32),
    }


def _bf16_reference_tensor():
    """A bf16 tensor as torch stores it, with its exact f32 widening."""
    values = torch.tensor([1.0, -2.5, 3.140625, 1e-3, 65280.0], dtype=torch.bfloat16)
    return values, values.float().numpy()


def _safetensors_bytes():
    from safetensors.numpy import save as st_save

    arrays = dict(_weights())
    return st_save(arrays)


SOURCE_KINDS = ["dict", "safetensors_bytes", "safetensors_path", "npz_bytes", "npz_path"]


def _builder(kind: str, tmp_path):
    weights = _weights()
    if kind == "dict":
        return nn.VarBuilder.from_tensors({k: Tensor.from_numpy(v) for k, v in weights.items()})
    if kind == "safetensors_bytes":
        return nn.VarBuilder.from_safetensors(_safetensors_bytes())
    if kind == "safetensors_path":
        path = tmp_path / "weights.safetensors"
        path.write_bytes(_safetensors_bytes())
        return nn.VarBuilder.from_safetensors(str(path))
    path = tmp_path / "weights.npz"
    np.savez(path, **weights)
    if kind == "npz_bytes":
        return nn.VarBuilder.from_npz(path.read_bytes())
    return nn.VarBuilder.from_npz(str(path))


@pytest.mark.parametrize("kind", SOURCE_KINDS)
def test_prefixed_get_returns_the_stored_values(kind, tmp_path):
    vb = _builder(kind, tmp_path)
    weights = _weights()
    q = vb.pp("encoder").pp("layers").pp(0).pp("attn").pp("q")
    np.testing.assert_array_equal(q.get((4, 3), "weight").to_numpy(),
                                  weights["encoder.layers.0.attn.q.weight"])
    np.testing.assert_array_equal(q.get((4,), "bias").to_numpy(),
                                  weights["encoder.layers.0.attn.q.bias"])
    assert vb.pp("encoder.layers.0").contains("attn.q.bias")
    assert not vb.pp("decoder").contains("attn.q.bias")
    assert sorted(vb.keys()) == sorted(weights)
    # f16 in the source becomes the builder's dtype (f32 by default), exactly.
    norm = vb.pp("encoder").get((3,), "norm.weight")
    assert norm.dtype is f32
    np.testing.assert_array_equal(norm.to_numpy(), weights["encoder.norm.weight"].astype(np.float32))


@pytest.mark.parametrize("kind", SOURCE_KINDS)
def test_shape_mismatch_names_full_path_and_both_shapes(kind, tmp_path):
    vb = _builder(kind, tmp_path)
    with pytest.raises(ShapeMismatch) as caught:
        vb.pp("encoder").pp("layers.0").pp("attn").get((3, 4), "q.weight")
    message = str(caught.value)
    assert "encoder.layers.0.attn.q.weight" in message
    assert "[3, 4]" in message and "[4, 3]" in message


@pytest.mark.parametrize("kind", SOURCE_KINDS)
def test_missing_tensor_names_it(kind, tmp_path):
    vb = _builder(kind, tmp_path)
    with pytest.raises(ModelNotFound, match=r"encoder\.layers\.1\.attn\.q\.weight"):
        vb.pp("encoder").pp("layers").pp(1).pp("attn").get((4, 3), "q.weight")


def test_builder_dtype_conversion_from_f16_and_bf16():
    from safetensors.torch import save as torch_st_save

    bf16_values, bf16_as_f32 = _bf16_reference_tensor()
    f16_values = torch.tensor([0.5, -1.25, 1000.0], dtype=torch.float16)
    data = torch_st_save({"a": bf16_values, "b": f16_values})
    vb = nn.VarBuilder.from_safetensors(data)
    a = vb.get((5,), "a")
    assert a.dtype is f32
    np.testing.assert_array_equal(a.to_numpy(), bf16_as_f32)
    np.testing.assert_array_equal(vb.get((3,), "b").to_numpy(), f16_values.float().numpy())
    # A builder set to a half dtype converts the other way (values exactly representable).
    as_f16 = vb.set_dtype(f16).get((3,), "b")
    assert as_f16.dtype is f16
    np.testing.assert_array_equal(as_f16.to_numpy(), f16_values.float().numpy())
    as_bf16 = nn.VarBuilder.from_safetensors(data, dtype=bf16).get((5,), "a")
    assert as_bf16.dtype is bf16
    np.testing.assert_array_equal(as_bf16.to_numpy(), bf16_as_f32)


def test_several_safetensors_files_form_one_namespace(tmp_path):
    from safetensors.numpy import save_file

    save_file({"part1.w": np.ones((2, 2), np.float32)}, str(tmp_path / "a.safetensors"))
    save_file({"part2.w": np.zeros((3,), np.float32)}, str(tmp_path / "b.safetensors"))
    vb = nn.VarBuilder.from_safetensors([str(tmp_path / "a.safetensors"),
                                         str(tmp_path / "b.safetensors")])
    assert vb.pp("part1").get((2, 2), "w").to_numpy().sum() == 4.0
    assert vb.pp("part2").get((3,), "w").dims() == (3,)


def test_npz_written_by_candle_web_loads_too(tmp_path):
    path = tmp_path / "ours.npz"
    cw_npz.save({"x.y": np.arange(6, dtype=np.float32).reshape(2, 3)}, path)
    vb = nn.VarBuilder.from_npz(str(path))
    np.testing.assert_array_equal(vb.pp("x").get((2, 3), "y").to_numpy(),
                                  np.arange(6, dtype=np.float32).reshape(2, 3))


# -- VarMap ------------------------------------------------------------------------------------

def test_get_with_init_creates_each_var_once():
    varmap = nn.VarMap()
    vb = nn.VarBuilder.from_varmap(varmap).pp("block")
    first = vb.get_with_init((3, 2), "w", init.Const(0.5))
    again = vb.get_with_init((3, 2), "w", init.Const(9.0))  # existing var wins; init ignored
    assert again is first
    np.testing.assert_array_equal(again.to_numpy(), np.full((3, 2), 0.5, np.float32))
    assert list(varmap.data()) == ["block.w"] and len(varmap.all_vars()) == 1
    assert first.is_variable()
    with pytest.raises(ShapeMismatch, match=r"block\.w.*\[3, 2\].*\[2, 3\]"):
        vb.get_with_init((2, 3), "w", init.ZERO)
    # Plain `get` on a VarMap builder finds what exists and names what does not.
    assert vb.get((3, 2), "w") is first
    with pytest.raises(ModelNotFound, match=r"block\.missing"):
        vb.get((1,), "missing")


def test_get_with_init_on_a_file_source_reads_the_file():
    vb = nn.VarBuilder.from_safetensors(_safetensors_bytes())
    head = vb.get_with_init((2, 3), "head.weight", init.ZERO)
    np.testing.assert_array_equal(head.to_numpy(), _weights()["head.weight"])


def test_varmap_save_then_load_restores_values(tmp_path):
    from safetensors.numpy import load_file

    varmap = nn.VarMap()
    layer = nn.linear(5, 3, nn.VarBuilder.from_varmap(varmap).pp("fc"))
    saved_weight = layer.weight.to_numpy().copy()
    path = tmp_path / "vars.safetensors"
    varmap.save(path)
    # The reference library reads what we wrote, names and values.
    reference = load_file(str(path))
    assert sorted(reference) == ["fc.bias", "fc.weight"]
    np.testing.assert_array_equal(reference["fc.weight"], saved_weight)
    # Clobber the vars, load, and get the saved values back into the same Var objects.
    layer.weight.set(layer.weight.zeros_like())
    layer.bias.set(layer.bias.zeros_like())
    varmap.load(path)
    np.testing.assert_array_equal(layer.weight.to_numpy(), saved_weight)
    np.testing.assert_array_equal(layer.bias.to_numpy(), reference["fc.bias"])
    # Saving again to the same path after a load must not disturb the loaded vars.
    varmap.save(path)
    np.testing.assert_array_equal(layer.weight.to_numpy(), saved_weight)


def test_varmap_load_of_a_file_missing_a_var_names_it(tmp_path):
    from safetensors.numpy import save_file

    varmap = nn.VarMap()
    nn.linear(5, 3, nn.VarBuilder.from_varmap(varmap).pp("fc"))
    path = tmp_path / "partial.safetensors"
    save_file({"fc.weight": np.zeros((3, 5), np.float32)}, str(path))
    with pytest.raises(ModelNotFound, match=r"fc\.bias"):
        varmap.load(path)


def test_varmap_load_of_a_wrong_shape_names_var_and_shapes(tmp_path):
    from safetensors.numpy import save_file

    varmap = nn.VarMap()
    nn.linear(5, 3, nn.VarBuilder.from_varmap(varmap).pp("fc"))
    path = tmp_path / "wrong.safetensors"
    save_file({"fc.weight": np.zeros((5, 3), np.float32), "fc.bias": np.zeros(3, np.float32)},
              str(path))
    with pytest.raises(ShapeMismatch, match=r"fc\.weight.*\[5, 3\].*\[3, 5\]"):
        varmap.load(path)


def test_varmap_load_converts_half_files_to_the_var_dtype(tmp_path):
    from safetensors.numpy import save_file

    varmap = nn.VarMap()
    var = nn.VarBuilder.from_varmap(varmap).get_with_init((4,), "w", init.ZERO)
    values = np.array([0.5, -1.5, 2.25, 1000.0], np.float16)
    save_file({"w": values}, str(tmp_path / "half.safetensors"))
    varmap.load(tmp_path / "half.safetensors")
    assert var.dtype is f32
    np.testing.assert_array_equal(var.to_numpy(), values.astype(np.float32))


def test_dict_source_accepts_numpy_arrays():
    vb = nn.VarBuilder.from_tensors({"w": np.arange(4, dtype=np.float16)})
    w = vb.get((4,), "w")
    assert w.dtype is f32
    np.testing.assert_array_equal(w.to_numpy(), np.arange(4, dtype=np.float32))
