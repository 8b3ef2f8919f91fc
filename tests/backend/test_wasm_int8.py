"""The compute type int8 on the wasm backend (the page's ?compute=int8), natively under
wasmtime: the fused LLaMA steps (web/kernels/steps.c) and the prompt's products
(backend.qmatmul) multiply through linear_int8.c, which tests/kernels/test_wasm_int8.py checks
bit for bit against candle_web.quantized.int8_rows.

The twin check. In float32 the page's and numba's steps differ in the last bits (FMA, sum
orders) and their greedy ids are equal (tests/backend/test_wasm_team.py). In int8 the products
are the same bits on both (the same int8_rows), but the activations they quantize come from
those float steps: a last-bit difference that moves one value across a rounding boundary
changes its int8 level, that changes the next layer's inputs by ~1e-3, which moves many more
levels there; measured on SmolLM2 Q4_1, the page's and numba's int8 logits differ by 0.17 at
the first token and by up to 1.5 later (int8 against float32 on numba: 0.4 to 1.2), where a
1-ulp change of one input moves nothing. So equal ids are asserted as the native int8 test does
(tests/backend/test_int8_decoding.py): teacher-forced on numba's int8 greedy ids, the page picks
numba's token at almost every position, and where it does not numba itself hesitates (top-2
margin <= MARGIN). Bitwise: two threads equal one thread, and the int8 path really ran (the
part's matrices carry MATRIX_INT8; its logits are not float32's).
"""

from __future__ import annotations

import numpy as np
import pytest

from candle_web import Device
from candle_web.backend.settings import override_settings, reload_settings
from candle_web.backend.wasm import abi
from candle_web.core.errors import BackendUnavailable
from tests.backend.test_wasm_team import THREADS_BUILD
from tests.parts_testlib import llama_part, llama_steps

PROMPT = [1, 9690, 198, 2683, 359, 253, 5356, 30, 2, 198]  # SmolLM2's ids
STEPS = 16
MARGIN = 1.0  # logits: the largest native top-2 margin where the page may pick another token
AGREEMENT = 0.85  # least share of positions where the page picks numba's token


@pytest.fixture(scope="module")
def backend():
    from candle_web.backend import get_backend

    try:
        return get_backend("wasm")
    except BackendUnavailable as e:
        pytest.skip(f"wasm backend unavailable: {e}")


def greedy(model, prompt, steps, forced=None):
    """Greedy ids and every step's logits, the prompt in one call (as Generate runs it);
    `forced`: feed these ids instead of the argmax (teacher forcing)."""
    steps_of = llama_steps(model, fused=True)
    model.clear_kv_cache(capacity=len(prompt) + steps + 1)
    logits = [steps_of([prompt], 0).to_numpy()[0]]
    ids = [int(np.argmax(logits[-1]))]
    for step in range(steps - 1):
        token = ids[-1] if forced is None else forced[step]
        logits.append(steps_of([[token]], model.seq_len).to_numpy()[0])
        ids.append(int(np.argmax(logits[-1])))
    return ids, np.array(logits)


def run(path, device, compute_type, prompt, steps, forced=None):
    """(model, greedy(...)) of the file loaded and decoded under the compute type (the parts
    are built at the first step, the prompt's products read it per call)."""
    from candle_web.models.llama import Llama

    override_settings(compute_type=compute_type)
    try:
        model = Llama.load(path, device=device)
        return model, greedy(model, prompt, steps, forced)
    finally:
        reload_settings()


def int8_pieces(part) -> bool:
    """Whether every quantized matrix of the wasm part carries MATRIX_INT8."""
    flag = abi.MATRIX_FLAGS["int8"]
    kinds = [kind for layer in part.layers for linear in (layer[3], layer[5], layer[6], layer[7])
             for kind, _, _ in linear.pieces] + [kind for kind, _, _ in part.head.pieces]
    return all(kind & flag for kind in kinds if kind > 1)


@pytest.mark.parametrize("model, filename, prompt", [
    ("smollm2-135m-instruct", "SmolLM2-135M-Instruct.Q4_1.gguf", PROMPT),
    ("qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
     [151644, 872, 198, 3838, 374, 220, 17, 10, 17, 30, 151645, 198, 151644, 77091, 198]),
], ids=["smollm2-q4_1", "qwen2.5-q4_k_m"])
def test_the_page_in_int8_decodes_as_numba_in_int8(backend, numba_device, model_file, model,
                                                   filename, prompt):
    path = model_file(model, filename)
    wasm = Device.cpu(backend="wasm")
    native, (native_ids, native_logits) = run(path, numba_device, "int8", prompt, STEPS)
    assert {w[0].dtype for w in [layer[3] for layer in llama_part(native).layers]} == {np.dtype(np.uint8)}
    page, (ids, logits) = run(path, wasm, "int8", prompt, STEPS, forced=native_ids)
    part = llama_part(page)
    assert type(part).__name__ == "LlamaDecoderStep" and int8_pieces(part)
    agree, worst = 0, 0.0
    for position, (mine, theirs) in enumerate(zip(ids, native_ids)):
        top2 = np.sort(native_logits[position])[-2:]
        if mine == theirs:
            agree += 1
        else:
            worst = max(worst, float(top2[1] - top2[0]))
    assert agree / STEPS >= AGREEMENT, f"the page picked numba's int8 token at {agree}/{STEPS}"
    assert worst <= MARGIN, f"the page differs where numba's top-2 margin is {worst:.2f}"
    _, (_, float_logits) = run(path, wasm, "float32", prompt, 1)
    assert not np.array_equal(logits[0], float_logits[0]), "int8 gave float32's very bits"


def test_two_threads_in_int8_equal_one_thread_bit_for_bit(backend, model_file):
    from candle_web.backend.wasm import team as wasm_team

    pytest.importorskip("wasmtime")
    if not THREADS_BUILD.is_file():
        pytest.skip(f"{THREADS_BUILD} is not built (python scripts/build_kernels.py)")
    path = model_file("smollm2-135m-instruct", "SmolLM2-135M-Instruct.Q4_1.gguf")
    wasm = Device.cpu(backend="wasm")
    backend.attach_team(None)
    _, (ids1, logits1) = run(path, wasm, "int8", PROMPT, 8)
    host = wasm_team.WasmtimeTeamHost(THREADS_BUILD)
    try:
        backend.attach_team(host)
        paired, (ids2, logits2) = run(path, wasm, "int8", PROMPT, 8)
        part = llama_part(paired)
        assert type(part).__name__ == "TeamLlamaDecoderStep" and part.threads_used == 2
    finally:
        backend.attach_team(None)
        host.close()
    assert ids2 == ids1
    np.testing.assert_array_equal(logits2, logits1)
