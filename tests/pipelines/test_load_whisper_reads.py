"""load_whisper reads each file of the checkpoint once: it opens the checkpoint and hands the
opened one to Whisper.from_pretrained, which reads it without opening it again (issue 36: a
load that quantizes at load time must not read its weights twice). The transcripts of a model
loaded this way are the whisper tests' (tests/models/test_whisper.py loads through
load_whisper)."""

from __future__ import annotations

import candle_web.pipelines as pipelines
from candle_web.models import whisper
from tests.file_opens_testlib import count_opens, opens_per_file


def test_a_ctranslate2_whisper_reads_each_file_once(monkeypatch, model_file):
    model_file("whisper-tiny.en", "model.bin")  # in the cache, or the test fails naming how
    opened = count_opens(monkeypatch)
    loaded = pipelines.load_whisper("whisper-tiny.en")
    assert loaded.model.config.n_text_layer == 4  # built from those reads
    # What the model read stays in the checkpoint: asking it again opens nothing.
    assert loaded.checkpoint.config["alignment_heads"]
    assert loaded.checkpoint.weights.has("decoder/embeddings/weight")
    assert loaded.checkpoint.tokenizer is loaded.tokenizer
    assert opens_per_file(opened, loaded.checkpoint.files) == {
        "model.bin": 1, "config.json": 1, "tokenizer.json": 1}


def test_the_model_reads_the_checkpoint_the_loader_opened(monkeypatch, model_file):
    """One Checkpoint is made from the source; from_pretrained gets that one, as it is."""
    model_file("whisper-tiny.en", "model.bin")
    calls = []
    real = pipelines.open_checkpoint

    def recording(source, *args, **kwargs):
        calls.append((source, real(source, *args, **kwargs)))
        return calls[-1][1]

    monkeypatch.setattr(pipelines, "open_checkpoint", recording)
    monkeypatch.setattr(whisper, "open_checkpoint", recording)
    loaded = pipelines.load_whisper("whisper-tiny.en")
    assert [source for source, _ in calls] == ["whisper-tiny.en", loaded.checkpoint]
    assert all(made is loaded.checkpoint for _, made in calls)
