"""Whisper from Hugging Face safetensors (the `openai/whisper-*` layout).

No HF-layout Whisper checkpoint can be fetched here, so the test writes one from the real
CTranslate2 weights (a pure renaming; the fused QKV is split back into q/k/v), then checks
that candle-web loads it to the same tokens, and that `transformers` running that very
checkpoint gives the same logits.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from candle_web.models.whisper import Whisper
from candle_web.pipelines.transcribe import TranscribeOptions, transcribe


def ct2_to_hf(ct2):
    d = ct2["decoder/embeddings/weight"].shape[1]
    out = {}

    def put(name, value):
        out[name] = np.ascontiguousarray(value, dtype=np.float32)

    def ln(dst, src):
        put(f"{dst}.weight", ct2.get_f32(f"{src}/gamma"))
        put(f"{dst}.bias", ct2.get_f32(f"{src}/beta"))

    def lin(dst, src, rows=slice(None), bias=True):
        put(f"{dst}.weight", ct2.get_f32(f"{src}/weight")[rows])
        if bias:
            put(f"{dst}.bias", ct2.get_f32(f"{src}/bias")[rows])

    def layers(side):
        n = 0
        while f"{side}/layer_{n}/ffn/linear_0/weight" in ct2:
            n += 1
        return n

    for side in ("encoder", "decoder"):
        for i in range(layers(side)):
            p, s = f"model.{side}.layers.{i}", f"{side}/layer_{i}"
            lin(f"{p}.self_attn.q_proj", f"{s}/self_attention/linear_0", slice(0, d))
            lin(f"{p}.self_attn.k_proj", f"{s}/self_attention/linear_0", slice(d, 2 * d), bias=False)
            lin(f"{p}.self_attn.v_proj", f"{s}/self_attention/linear_0", slice(2 * d, 3 * d))
            lin(f"{p}.self_attn.out_proj", f"{s}/self_attention/linear_1")
            ln(f"{p}.self_attn_layer_norm", f"{s}/self_attention/layer_norm")
            lin(f"{p}.fc1", f"{s}/ffn/linear_0")
            lin(f"{p}.fc2", f"{s}/ffn/linear_1")
            ln(f"{p}.final_layer_norm", f"{s}/ffn/layer_norm")
            if side == "decoder":
                lin(f"{p}.encoder_attn.q_proj", f"{s}/attention/linear_0")
                lin(f"{p}.encoder_attn.k_proj", f"{s}/attention/linear_1", slice(0, d), bias=False)
                lin(f"{p}.encoder_attn.v_proj", f"{s}/attention/linear_1", slice(d, 2 * d))
                lin(f"{p}.encoder_attn.out_proj", f"{s}/attention/linear_2")
                ln(f"{p}.encoder_attn_layer_norm", f"{s}/attention/layer_norm")
        ln(f"model.{side}.layer_norm", f"{side}/layer_norm")
    for conv in ("conv1", "conv2"):
        put(f"model.encoder.{conv}.weight", ct2.get_f32(f"encoder/{conv}/weight"))
        put(f"model.encoder.{conv}.bias", ct2.get_f32(f"encoder/{conv}/bias"))
    put("model.encoder.embed_positions.weight", ct2.get_f32("encoder/position_encodings/encodings"))
    put("model.decoder.embed_positions.weight", ct2.get_f32("decoder/position_encodings/encodings"))
    put("model.decoder.embed_tokens.weight", ct2.get_f32("decoder/embeddings/weight"))
    vocab = ct2["decoder/embeddings/weight"].shape[0]
    config = {
        "model_type": "whisper", "architectures": ["WhisperForConditionalGeneration"],
        "vocab_size": vocab, "num_mel_bins": ct2["encoder/conv1/weight"].shape[1], "d_model": d,
        "encoder_layers": layers("encoder"), "decoder_layers": layers("decoder"),
        "encoder_attention_heads": int(ct2.scalar("encoder/num_heads")),
        "decoder_attention_heads": int(ct2.scalar("decoder/num_heads")),
        "encoder_ffn_dim": 4 * d, "decoder_ffn_dim": 4 * d, "max_source_positions": 1500,
        "max_target_positions": 448, "activation_function": "gelu", "scale_embedding": False,
        "pad_token_id": 50256, "bos_token_id": 50257, "eos_token_id": 50256,
        "decoder_start_token_id": 50257, "tie_word_embeddings": True,
    }
    return out, config


@pytest.fixture(scope="module")
def hf_checkpoint(tmp_path_factory, model_file):
    from candle_web.io.ct2 import read_ct2
    from candle_web.io.safetensors import save

    ct2 = read_ct2(str(model_file("whisper-tiny.en", "model.bin")))
    tensors, config = ct2_to_hf(ct2)
    folder = tmp_path_factory.mktemp("whisper-tiny.en-hf")
    save(tensors, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(config))
    return folder, config


def test_hf_layout_gives_the_same_tokens_as_ct2(hf_checkpoint, whisper_models, speech_clips):
    folder, config = hf_checkpoint
    ct2_model, tokenizer = whisper_models("whisper-tiny.en")
    hf_model = Whisper.load(str(folder / "model.safetensors"), config)
    samples = speech_clips["goforward.raw"]
    greedy = TranscribeOptions(temperatures=(0.0,))
    want = [s.tokens for s in transcribe(ct2_model, tokenizer, samples, greedy).segments]
    assert [s.tokens for s in transcribe(hf_model, tokenizer, samples, greedy).segments] == want


def test_load_whisper_reads_each_hf_file_once(hf_checkpoint, model_file, tmp_path, monkeypatch,
                                              whisper_models, speech_clips):
    """The HF layout through the loader (a folder of model.safetensors, config.json and
    tokenizer.json): each file is opened once, however often the checkpoint is asked again
    afterwards (issue 36), and the model gives the CTranslate2 weights' tokens."""
    from candle_web.pipelines import load_whisper
    from tests.file_opens_testlib import count_opens, opens_per_file

    folder, _ = hf_checkpoint
    for name in ("model.safetensors", "config.json"):
        (tmp_path / name).symlink_to(folder / name)
    shutil.copy(model_file("whisper-tiny.en", "tokenizer.json"), tmp_path / "tokenizer.json")
    opened = count_opens(monkeypatch)
    loaded = load_whisper(str(tmp_path))
    assert loaded.checkpoint.config["d_model"] == loaded.model.config.d_model
    assert loaded.checkpoint.weights.has("model.decoder.embed_tokens.weight")
    assert loaded.checkpoint.tokenizer is loaded.tokenizer
    assert opens_per_file(opened, loaded.checkpoint.files) == {
        "model.safetensors": 1, "config.json": 1, "tokenizer.json": 1}
    ct2_model, tokenizer = whisper_models("whisper-tiny.en")
    greedy = TranscribeOptions(temperatures=(0.0,))
    samples = speech_clips["goforward.raw"]
    want = [s.tokens for s in transcribe(ct2_model, tokenizer, samples, greedy).segments]
    got = transcribe(loaded.model, loaded.tokenizer, samples, greedy).segments
    assert [s.tokens for s in got] == want


def test_logits_match_transformers(hf_checkpoint, speech_clips):
    """Same checkpoint in transformers (PyTorch): decoder logits agree to 2e-3 absolute.
    Logits are O(10); f32 sums over 384-1536 terms in different orders differ by ~1e-4."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from candle_web import Tensor
    from candle_web.io import audio

    folder, config = hf_checkpoint
    reference = transformers.WhisperForConditionalGeneration.from_pretrained(str(folder)).eval()
    ours = Whisper.load(str(folder / "model.safetensors"), config)
    mel = audio.pad_or_trim(audio.log_mel_spectrogram(speech_clips["something.raw"]), audio.N_FRAMES)
    prefix = np.array([[50257, 50363, 1514, 7382]], dtype=np.int64)  # sot, 0.00, " Go", " somewhere"
    with torch.no_grad():
        want = reference(input_features=torch.from_numpy(mel[None]),
                         decoder_input_ids=torch.from_numpy(prefix)).logits.numpy()
    features = ours.encode(Tensor.from_numpy(mel[None]))
    got = ours.logits(Tensor.from_numpy(prefix), ours.start_decoding(features)).to_numpy()
    assert got.shape == want.shape
    assert np.max(np.abs(got - want)) < 2e-3
    assert (got.argmax(-1) == want.argmax(-1)).all()
