"""A model loaded onto a pinned CPU backend (`Device.cpu(backend=...)`) computes on that backend.

Safetensors weights are read onto the default CPU device and moved with `to_device`; that used
to return the tensor unchanged for the equal-but-pinned device, so a float checkpoint "on numpy"
silently ran every op through the default (numba) backend. GGUF weights never took that road.
"""

from __future__ import annotations

import numpy as np
import pytest
from tests.models.llama_testlib import TINY_CONFIG, random_state, to_hf_folder

from candle_web import Device, Tensor
from candle_web.models.llama import Llama


def _backends_of(model) -> set:
    tensors = [model.embed.table, model.lm_head.weight, model.norm.weight]
    for block in model.blocks:
        tensors += [block.attn_norm.weight, block.mlp_norm.weight, block.attn.qkv.weight,
                    block.attn.out.weight, block.mlp.gate_up.weight, block.mlp.down.weight]
    return {t.device.backend.name for t in tensors}


@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_float_checkpoint_weights_live_on_the_pinned_backend(tmp_path, backend):
    if backend == "numba":
        pytest.importorskip("numba")
        import candle_native  # noqa: F401  (registers the backend)
    folder = to_hf_folder(random_state(TINY_CONFIG, seed=8), TINY_CONFIG, tmp_path / "hf")
    model = Llama.from_pretrained(folder, device=Device.cpu(backend=backend))
    assert _backends_of(model) == {backend}
    assert model.forward([[1, 2, 3]]).device.backend.name == backend


def test_to_device_onto_a_pinned_backend_shares_the_array():
    t = Tensor.from_numpy(np.arange(6, dtype=np.float32).reshape(2, 3))
    pinned = t.to_device(Device.cpu(backend="numpy"))
    assert pinned.device.backend.name == "numpy"
    assert np.shares_memory(pinned._data, t._data)
    assert pinned.to_device(Device.cpu(backend="numpy")) is pinned
    assert pinned.to_device("cpu") is pinned  # the unpinned CPU accepts any backend
