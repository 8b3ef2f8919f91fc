"""The two-thread parts (kernels-threads.wasm, backend/wasm/team.py, team_parts.py): the
decode steps and Whisper's encoder, natively: the threads build under wasmtime on a shared memory, its helper on a real second
thread, against the one-thread steps of kernels.wasm.

The claim is exact: each output row of every product is computed by one thread with the same
code path as on one thread (row shares start at multiples of 16, web/kernels/team.h), so the
logits and the KV caches must be bit-identical, not merely close; and the helper must have
taken part (its job count grows), so a team that silently ran alone fails. Real weights:
SmolLM2-135M-Instruct Q4_1 and whisper tiny.en on a LibriVox clip; random tiny models cover
the other GGML types, odd head counts and frame counts, beams with a reorder, and a cache the
generic path extends between fused steps. Skipped, with the reason, where wasmtime or the builds are missing.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pytest
from tests.parts_testlib import (decode_logits, encode, llama_part, llama_steps, random_encoder,
                                 random_text_decoder, whisper_decoder_part, whisper_encoder_part)

from candle_web import Device, Tensor
from candle_web.backend.wasm import abi as wasm_abi
from candle_web.backend.wasm import team as wasm_team
from candle_web.core.errors import BackendUnavailable, CandleError


REPO_ROOT = Path(__file__).resolve().parents[2]
THREADS_BUILD = REPO_ROOT / "web" / "vendor" / "kernels-threads.wasm"


@pytest.fixture(scope="module")
def backend():
    from candle_web.backend import get_backend

    try:
        return get_backend("wasm")
    except BackendUnavailable as e:
        pytest.skip(f"wasm backend unavailable: {e}")


@pytest.fixture(scope="module")
def team(backend):
    pytest.importorskip("wasmtime")
    if not THREADS_BUILD.is_file():
        pytest.skip(f"{THREADS_BUILD} is not built (python scripts/build_kernels.py)")
    host = wasm_team.WasmtimeTeamHost(THREADS_BUILD)
    yield host
    host.close()


@pytest.fixture
def with_team(backend, team):
    """attach(team or None): the parts built next run on it; detached after the test."""
    yield backend.attach_team
    backend.attach_team(None)


def wasm_device():
    return Device.cpu(backend="wasm")


# -- the allocator ------------------------------------------------------------------------------
def test_the_arena_reuses_and_merges_freed_blocks():
    grown = []
    arena = wasm_team.Arena(1000, grown.append)
    a, b, c = arena.alloc(10), arena.alloc(100), arena.alloc(30)
    assert a == 1008 and b == a + 16 and c == b + 112, "16-byte aligned, packed"
    assert grown[-1] == c + 32
    arena.release(b)
    assert arena.alloc(40) == b, "first fit reuses the freed block"
    arena.release(a)
    arena.release(b)  # now a and b are one free span
    assert arena.alloc(120) == a
    arena.release(c)
    assert arena.top == c, "a freed last block goes back to the top"
    with pytest.raises(CandleError, match="not an allocated block"):
        arena.release(12345)


# -- the layouts the C side, the worker and Python share -----------------------------------------
def test_the_argument_layouts_and_offsets_agree_with_the_c_and_the_worker():
    """C and the worker read them from what scripts/abi_codegen.py generates from the table (the
    kernels' build writes it; tests/kernels/test_abi_codegen.py checks that no source keeps a
    copy): the generated header and JS module say what the hosts here use."""
    sys.path.insert(0, str(REPO_ROOT / "scripts"))
    import abi_codegen

    header = abi_codegen.c_header(wasm_abi)

    def define(name):
        return int(re.search(rf"#define {name} (\d+)", header).group(1))

    assert define("TEAM_LLAMA_HEADER") == len(wasm_abi.TEAM_LLAMA_HEADER)
    assert define("TEAM_LLAMA_LAYER") == len(wasm_abi.TEAM_LLAMA_LAYER)
    assert define("TEAM_WHISPER_HEADER") == len(wasm_abi.TEAM_WHISPER_HEADER)
    assert define("TEAM_WHISPER_BLOCK") == len(wasm_abi.TEAM_WHISPER_BLOCK)
    assert define("TEAM_ENCODER_HEADER") == len(wasm_abi.TEAM_ENCODER_HEADER)
    assert define("TEAM_ENCODER_BLOCK") == len(wasm_abi.TEAM_ENCODER_BLOCK)
    assert define("TEAM_CTRL_BYTES") == wasm_abi.TEAM_CTRL_BYTES == 4 * len(wasm_abi.TEAM_CTRL_FIELDS)
    fields = re.search(r"typedef struct \{(.*?)\} TeamCtrl;", header, re.S).group(1)
    assert tuple(re.findall(r"int32_t (\w+);", fields)) == wasm_abi.TEAM_CTRL_FIELDS
    for job, code in wasm_abi.TEAM_JOBS.items():
        assert define(f"TEAM_JOB_{job.upper()}") == code
    worker = abi_codegen.js_module(wasm_abi)
    assert f"const TEAM_CTRL_OFFSET = {1 << 20};" in worker and wasm_team.CTRL_OFFSET == 1 << 20
    assert f"const TEAM_HELPER_SCRATCH_OFFSET = {(1 << 20) + 64};" in worker
    assert wasm_team.HELPER_SCRATCH_OFFSET == wasm_team.CTRL_OFFSET + 64
    assert f"alive: {wasm_abi.TEAM_CTRL_FIELDS.index('alive')}," in worker
    team_js = (REPO_ROOT / "web" / "worker" / "team.js").read_text()
    assert re.search(r"TEAM_CTRL_OFFSET,.*\} from \"\.\./vendor/abi\.js\";", team_js, re.S)


# -- LLaMA --------------------------------------------------------------------------------------
def _greedy(model, prompt, steps, extend=None):
    """Greedy ids and every step's logits; `extend`: (after step, tokens) fed through the
    generic path in the middle (a prompt chunk appended to the same cache)."""
    steps_of = llama_steps(model, fused=True)
    model.clear_kv_cache(capacity=4)  # small: decoding grows the cache (a new buffer)
    logits = [steps_of([prompt], 0).to_numpy()[0]]
    ids = [int(np.argmax(logits[-1]))]
    for step in range(steps):
        if extend is not None and step == extend[0]:
            logits.append(steps_of([extend[1]], model.seq_len).to_numpy()[0])
            ids.append(int(np.argmax(logits[-1])))
        logits.append(steps_of([[ids[-1]]], model.seq_len).to_numpy()[0])
        ids.append(int(np.argmax(logits[-1])))
    return ids, np.array(logits)


def _numpy_generic_greedy_ids(path, prompt, steps):
    """The greedy ids of the file on the numpy backend's generic (reference) path."""
    from candle_web.models.llama import Llama

    generic = Llama.load(path, device=Device.cpu(backend="numpy"))
    steps_of = llama_steps(generic, fused=False)
    generic.clear_kv_cache(capacity=4)
    ids = [int(np.argmax(steps_of([prompt], 0).to_numpy()[0]))]
    for _ in range(steps):
        ids.append(int(np.argmax(steps_of([[ids[-1]]], generic.seq_len).to_numpy()[0])))
    return ids


def _one_and_two_threads(path, attach, team, run):
    from candle_web.models.llama import Llama

    attach(None)
    alone = Llama.load(path, device=wasm_device())
    assert type(llama_part(alone)).__name__ == "LlamaDecoderStep"
    one = run(alone)
    attach(team)
    paired = Llama.load(path, device=wasm_device())
    part = llama_part(paired)
    assert type(part).__name__ == "TeamLlamaDecoderStep"
    jobs = team.helper_jobs
    two = run(paired)
    assert part.threads_used == 2 and team.helper_jobs > jobs, "the helper took no part"
    return one, two


@pytest.mark.parametrize("qtype, wide", [
    ("Q4_0", False), ("Q4_1", False), ("Q8_0", False), ("Q5_1", False), ("Q4_K", True),
    ("Q6_K", True), (None, False),
], ids=["Q4_0", "Q4_1", "Q8_0", "Q5_1", "Q4_K", "Q6_K", "f32"])
def test_llama_steps_on_two_threads_equal_one_thread_bit_for_bit(with_team, team, tmp_path,
                                                                 qtype, wide):
    from tests.models import llama_testlib

    path = llama_testlib.tiny_gguf(tmp_path, qtype, wide)[0]  # wide: rows for the K-quants
    prompt = [1, 5, 9, 33, 70] if not wide else [2, 7, 100]
    (ids1, logits1), (ids2, logits2) = _one_and_two_threads(
        path, with_team, team, lambda model: _greedy(model, prompt, 8))
    assert ids2 == ids1
    np.testing.assert_array_equal(logits2, logits1)


def test_a_cache_the_generic_path_extended_is_copied_in_before_the_next_step(with_team, team,
                                                                              tmp_path):
    """Fused steps, then a 3-token chunk through the generic path into the same cache, then
    fused steps again: the team's mirror must pick up the chunk's keys and values."""
    from tests.models import llama_testlib

    path = llama_testlib.tiny_gguf(tmp_path, seed=5)[0]
    run = lambda model: _greedy(model, [1, 5, 9], 8, extend=(3, [40, 41, 42]))  # noqa: E731
    (ids1, logits1), (ids2, logits2) = _one_and_two_threads(path, with_team, team, run)
    assert ids2 == ids1
    np.testing.assert_array_equal(logits2, logits1)


def test_a_team_without_its_helper_runs_alone_with_the_same_numbers(backend, tmp_path):
    from tests.models import llama_testlib
    from candle_web.models.llama import Llama

    pytest.importorskip("wasmtime")
    if not THREADS_BUILD.is_file():
        pytest.skip(f"{THREADS_BUILD} is not built")
    lonely = wasm_team.WasmtimeTeamHost(THREADS_BUILD, helper=False)
    try:
        assert lonely.threads == 1
        path = llama_testlib.tiny_gguf(tmp_path)[0]
        backend.attach_team(None)
        want = _greedy(Llama.load(path, device=wasm_device()), [1, 5, 9], 5)
        backend.attach_team(lonely)
        model = Llama.load(path, device=wasm_device())
        got = _greedy(model, [1, 5, 9], 5)
        assert llama_part(model).threads_used == 1
        assert lonely.helper_jobs == 0
        assert got[0] == want[0]
        np.testing.assert_array_equal(got[1], want[1])
    finally:
        backend.attach_team(None)
        lonely.close()


def test_real_smollm2_q4_1_decodes_the_same_on_two_threads(with_team, team, model_file):
    path = model_file("smollm2-135m-instruct", "SmolLM2-135M-Instruct.Q4_1.gguf")
    prompt = [1, 9690, 198, 2683, 359, 253, 5356, 30, 2, 198]  # any ids: the step is tested
    (ids1, logits1), (ids2, logits2) = _one_and_two_threads(
        path, with_team, team, lambda model: _greedy(model, prompt, 12))
    assert ids2 == ids1
    np.testing.assert_array_equal(logits2, logits1)


@pytest.mark.parametrize("make", ["qwen2-mixed", "q5_k"])
def test_qwen2_bias_and_q5_k_steps_on_two_threads_equal_one_thread(with_team, team, tmp_path,
                                                                    make):
    from tests.models.llama_testlib import qwen2_mixed_gguf
    from tests.wasm_testlib import q5_k_gguf

    path = qwen2_mixed_gguf(tmp_path)[0] if make == "qwen2-mixed" else q5_k_gguf(tmp_path)[0]
    (ids1, logits1), (ids2, logits2) = _one_and_two_threads(
        path, with_team, team, lambda model: _greedy(model, [2, 7, 100, 31], 8))
    assert ids2 == ids1
    np.testing.assert_array_equal(logits2, logits1)


def test_real_qwen2_5_coder_decodes_the_same_on_two_threads_and_generic(with_team, team,
                                                                         model_file):
    """Qwen2.5-Coder-0.5B-Instruct Q4_K_M (Q5_0/Q8_0/Q4_K/Q6_K pieces, the q|k|v bias, a tied
    Q8_0 head of 151,936 rows): two threads equal one bit for bit, and the greedy ids equal
    the numpy backend's generic path."""
    path = model_file("qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")
    prompt = [151644, 872, 198, 3838, 374, 220, 17, 10, 17, 30, 151645, 198, 151644, 77091, 198]
    (ids1, logits1), (ids2, logits2) = _one_and_two_threads(
        path, with_team, team, lambda model: _greedy(model, prompt, 6))
    assert ids2 == ids1
    np.testing.assert_array_equal(logits2, logits1)
    assert ids1 == _numpy_generic_greedy_ids(path, prompt, 6)



@pytest.mark.parametrize("shape, qtype", [
    (dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
          intermediate_size=48), None),
    (dict(hidden_size=96, num_attention_heads=6, num_key_value_heads=3, head_dim=16,
          intermediate_size=64), None),
    (dict(hidden_size=96, num_attention_heads=6, num_key_value_heads=3, head_dim=16,
          intermediate_size=64), "Q8_0"),
    (dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=1, head_dim=16,
          intermediate_size=96), None),
    (dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
          intermediate_size=40), None),
], ids=["head_dim-8", "3-kv-heads", "3-kv-heads-Q8_0", "1-kv-head", "ffn-40-fused-gate-up"])
def test_llama_block_phases_split_by_kv_heads_give_the_same_numbers(with_team, team, tmp_path,
                                                                   shape, qtype):
    """The team's LLaMA block runs q|k|v, RoPE, the cache write and attention of each thread's
    kv heads in one phase and gate|up with silu in another (web/kernels/steps.c): kv heads that
    do not split evenly (3), a thread with none (1), heads whose rows would start a share off
    the 16-row alignment (head_dim 8: one thread takes the phase), and an f32 model's fused
    q|k|v and gate|up pieces with ffn 40 (up's rows would start unaligned: one thread takes
    it). Two threads equal one bit for bit; the greedy ids are the numpy generic path's."""
    from tests.models import llama_testlib
    from candle_web.quantized import GgmlDType

    config = dict(llama_testlib.TINY_CONFIG, **shape)
    state = llama_testlib.random_state(config, seed=11)
    path = llama_testlib.to_gguf(state, config, tmp_path / "odd.gguf",
                                 quantize_to=None if qtype is None else GgmlDType.parse(qtype))
    prompt = [3, 17, 40, 8]
    (ids1, logits1), (ids2, logits2) = _one_and_two_threads(
        path, with_team, team, lambda model: _greedy(model, prompt, 8))
    assert ids2 == ids1
    np.testing.assert_array_equal(logits2, logits1)
    assert ids1 == _numpy_generic_greedy_ids(path, prompt, 8)

# -- Whisper ------------------------------------------------------------------------------------
def _half_valued(decoder):
    for block in decoder.blocks:
        for tensor in (block.attn.qkv.weight, block.attn.out.weight, block.cross_attn.q.weight,
                       block.cross_attn.kv.weight, block.cross_attn.out.weight,
                       block.mlp.fc1.weight, block.mlp.fc2.weight):
            values = tensor.storage_numpy()
            values[...] = values.astype(np.float16).astype(np.float32)
    values = decoder.token_embedding.storage_numpy()
    values[...] = values.astype(np.float16).astype(np.float32)
    return decoder


@pytest.mark.parametrize("n_head, d, half", [(4, 64, False), (3, 48, False), (6, 384, True)],
                         ids=["four-heads", "odd-heads", "f16-bits-tiny-sized"])
def test_whisper_steps_with_beams_on_two_threads_equal_one_thread(with_team, team, n_head, d,
                                                                  half):
    audio = np.random.default_rng(8).standard_normal((2, 30, d)).astype(np.float32)

    def build():
        decoder = random_text_decoder(wasm_device(), np.random.default_rng(7), d=d,
                                      n_head=n_head, dtype=np.float32)
        return _half_valued(decoder) if half else decoder

    with_team(None)
    want, state1, fed = decode_logits(build(), audio, wasm_device(), steps=6, reorder_at=3)
    with_team(team)
    decoder = build()
    jobs = team.helper_jobs
    got, state2, _ = decode_logits(decoder, audio, wasm_device(), steps=6, reorder_at=3, fed=fed)
    assert type(whisper_decoder_part(decoder)).__name__ == "TeamWhisperDecoderStep"
    assert whisper_decoder_part(decoder).threads_used == 2 and team.helper_jobs > jobs
    np.testing.assert_array_equal(got, want)
    for one, two in zip(state1.caches, state2.caches):
        n = one.length
        np.testing.assert_array_equal(two.k.buffer()[:, :, :n], one.k.buffer()[:, :, :n])
        np.testing.assert_array_equal(two.v.buffer()[:, :, :n], one.v.buffer()[:, :, :n])


@pytest.mark.parametrize("frames, shape", [
    (160, {}), (157, dict(n_head=3, d=48)), (40, dict(n_head=6, d=96, n_mels=20)),
], ids=["even-frames", "odd-frames-odd-heads", "six-heads"])
def test_whisper_encoder_on_two_threads_equals_one_thread(with_team, team, frames, shape):
    mel = np.random.default_rng(3).standard_normal(
        (2, shape.get("n_mels", 12), frames)).astype(np.float32)
    features = []
    for attached in (None, team):
        with_team(attached)
        encoder = random_encoder(wasm_device(), np.random.default_rng(5), **shape)
        jobs = team.helper_jobs
        features.append(encode(encoder, mel, wasm_device()))
        part = whisper_encoder_part(encoder)
        assert type(part).__name__ == ("TeamWhisperEncoder" if attached else "WhisperEncoder")
        if attached:
            assert part.threads_used == 2 and team.helper_jobs == jobs + 2  # one job per audio
    assert features[0].shape == (2, (frames - 1) // 2 + 1, shape.get("d", 64))
    np.testing.assert_array_equal(features[1], features[0])


def test_real_tiny_en_transcribes_the_same_on_two_threads(with_team, team, model_file):
    from candle_web import hub
    from candle_web.io import audio
    from candle_web.io.audio import load_audio
    from candle_web.models.whisper import Whisper

    model_dir = model_file("whisper-tiny.en", "model.bin").parent
    clips = sorted((hub.cache_dir() / "testdata" / "speech" / "librivox").glob("*.wav"))
    if not clips:
        pytest.fail("no LibriVox clips in the model cache: run `make test`")
    samples = load_audio(clips[0])
    mel = audio.pad_or_trim(audio.log_mel_spectrogram(samples, 80), audio.N_FRAMES)
    runs, encoded = [], []
    for attached in (None, team):
        with_team(attached)
        model = Whisper.from_pretrained(model_dir, device=wasm_device())
        features = model.encode(Tensor.from_numpy(mel[None].astype(np.float32),
                                                  device=wasm_device()))
        encoded.append(features.to_numpy())
        state = model.start_decoding(features)
        tokens = [50257, 50362]  # <|startoftranscript|> <|notimestamps|>
        feed, logits = tokens, []
        for _ in range(40):
            ids = Tensor.from_numpy(np.array([feed], np.int64), device=wasm_device())
            step = model.logits(ids, state, positions=[len(feed) - 1])
            logits.append(step.to_numpy()[0, -1])
            tokens.append(int(np.argmax(logits[-1])))
            feed = tokens[-1:]
            if tokens[-1] == 50256:  # <|endoftext|>
                break
        runs.append((tokens, np.array(logits)))
        if attached is team:
            assert type(whisper_decoder_part(model.decoder)).__name__ == "TeamWhisperDecoderStep"
            assert whisper_decoder_part(model.decoder).threads_used == 2
            assert type(whisper_encoder_part(model.encoder)).__name__ == "TeamWhisperEncoder"
            assert whisper_encoder_part(model.encoder).threads_used == 2
    assert encoded[0].shape == (1, 1500, 384)
    np.testing.assert_array_equal(encoded[1], encoded[0])
    (tokens1, logits1), (tokens2, logits2) = runs
    assert len(tokens1) > 10, "the clip should give a sentence"
    assert tokens2 == tokens1
    np.testing.assert_array_equal(logits2, logits1)


def test_the_cache_mirrors_are_kept_from_step_to_step(with_team, team, tmp_path):
    """The model hands the part new views of the same cache buffers every step: the team must
    keep its copies (copying the whole cache in per token would cost more than the step)."""
    from tests.models import llama_testlib
    from candle_web.models.llama import Llama

    with_team(team)
    model = Llama.load(llama_testlib.tiny_gguf(tmp_path)[0], device=wasm_device())
    steps_of = llama_steps(model, fused=True)
    model.clear_kv_cache(capacity=64)  # no growth in the steps below
    steps_of([[1, 5, 9]], 0)
    part = llama_part(model)
    seen = []
    for token in (4, 8, 15):
        steps_of([[token]], model.seq_len)
        seen.append([id(mirror) for mirror in part.mirrors])
    assert seen[0] == seen[1] == seen[2]
    assert all(mirror.synced == 6 for mirror in part.mirrors)


def _tiny_llama(tmp_path):
    from tests.models import llama_testlib

    return llama_testlib.tiny_gguf(tmp_path)[0]


def test_a_collected_part_gives_its_shared_memory_back(with_team, team, tmp_path):
    import gc

    from candle_web.models.llama import Llama

    with_team(team)
    before = team.arena.allocated_bytes
    model = Llama.load(_tiny_llama(tmp_path), device=wasm_device())
    _greedy(model, [1, 5, 9], 3)
    assert team.arena.allocated_bytes > before + 100_000, "the weights are in the shared memory"
    del model
    gc.collect()
    assert team.arena.allocated_bytes == before


def test_weights_the_shared_memory_cannot_hold_run_on_one_thread(with_team, tmp_path,
                                                                 monkeypatch):
    import gc

    from candle_web.models.llama import Llama

    small = wasm_team.WasmtimeTeamHost(THREADS_BUILD, helper=False)
    try:
        with_team(small)
        before = small.arena.allocated_bytes
        # The arena may not grow past its top by more than 64 KiB: the weights do not fit.
        monkeypatch.setattr(wasm_team, "MAX_BYTES", small.arena.top + (1 << 16))
        model = Llama.load(_tiny_llama(tmp_path), device=wasm_device())
        with pytest.warns(UserWarning, match="TeamLlamaDecoderStep: one thread runs instead: "
                                             ".* exceed the shared memory"):
            part = llama_part(model)
        assert type(part).__name__ == "LlamaDecoderStep"
        with_team(None)
        want = _greedy(Llama.load(_tiny_llama(tmp_path), device=wasm_device()), [1, 5, 9], 4)
        assert _greedy(model, [1, 5, 9], 4)[0] == want[0]
        gc.collect()
        assert small.arena.allocated_bytes == before, "the half-built part kept its blocks"
    finally:
        small.close()
