"""A transcribe run placed in a longer recording (the Transcribe view's live mode): `offset`
moves the run's segments to their place, `prior` keeps the segments already final in front,
and the text and exports then cover the whole recording. Checked natively with the real
whisper-tiny.en against the same clip transcribed on its own (the reference: placing a run
must not change what it decodes), and the page's bad values against their error messages."""
from __future__ import annotations

import json
import re
from types import SimpleNamespace

import numpy as np
import pytest

from candle_web import hub
from candle_web.core.errors import FormatError
from candle_web.worker import WhisperSession
from candle_web.worker.session import files_from_folder

MODEL = "whisper-tiny.en"
CLIP_FIRST = "sense_and_sensibility_01_austen_64kb-0880.wav"
CLIP_SECOND = "sense_and_sensibility_01_austen_64kb-0930.wav"
OFFSET = 4.5  # seconds: where the second clip starts in the "recording"
SRT_START = re.compile(r"^(\d\d):(\d\d):(\d\d),(\d\d\d) --> ", re.M)


def clip_samples(name: str) -> np.ndarray:
    from candle_web.io.audio import load_audio

    path = hub.cache_dir() / "testdata" / "speech" / "librivox" / name
    if not path.is_file():
        pytest.fail(f"{path} is missing: run `make test` (scripts/fetch_test_audio.sh)")
    return load_audio(str(path)).astype(np.float32)


@pytest.fixture(scope="module")
def session(model_file):
    session = WhisperSession()
    folder = model_file(MODEL, "model.bin").parent
    for name, data in files_from_folder(folder, session.required_files).items():
        session.allocate_file(MODEL, name, data.size)[:] = data
    session.build_model(MODEL)
    return session


def run(session, samples, **fields):
    events = []
    text, _ = session.run(MODEL, {"samples": samples.tobytes(), **fields},
                          on_event=lambda kind, data: events.append((kind, json.loads(data))))
    return json.loads(text), [data for kind, data in events if kind == "segment"]


def test_a_placed_run_keeps_the_prior_segments_and_moves_its_own(session):
    first, _ = run(session, clip_samples(CLIP_FIRST))
    alone, _ = run(session, clip_samples(CLIP_SECOND))
    placed, streamed = run(session, clip_samples(CLIP_SECOND), offset=OFFSET,
                           prior=first["segments"])

    count = len(first["segments"])
    assert placed["segments"][:count] == first["segments"]  # kept as they were
    moved = placed["segments"][count:]
    assert [s["tokens"] for s in moved] == [s["tokens"] for s in alone["segments"]]
    for got, own in zip(moved, alone["segments"], strict=True):
        # Both are rounded to the millisecond, so the sum may differ by one rounding step.
        assert got["start"] == pytest.approx(own["start"] + OFFSET, abs=1e-3)
        assert got["end"] == pytest.approx(own["end"] + OFFSET, abs=1e-3)
    assert [s["id"] for s in placed["segments"]] == list(range(len(placed["segments"])))
    # The streamed segments are the placed ones too (the page shows them as they come).
    assert [(s["id"], s["start"], s["tokens"]) for s in streamed] == \
        [(s["id"], s["start"], s["tokens"]) for s in moved]

    assert placed["text"].strip() == f"{first['text'].strip()} {alone['text'].strip()}"
    assert placed["duration"] == pytest.approx(OFFSET + alone["duration"])
    # Timings are about the samples of this run, not the whole recording.
    assert placed["timings"]["audioSeconds"] == pytest.approx(alone["duration"])
    srt_starts = [int(h) * 3600 + int(m) * 60 + int(s) + int(ms) / 1000
                  for h, m, s, ms in SRT_START.findall(placed["exports"]["srt"])]
    assert srt_starts == pytest.approx([s["start"] for s in placed["segments"]
                                        if s["text"].strip()], abs=1e-3)
    assert placed["exports"]["txt"].splitlines() == [s["text"].strip() for s in
                                                     placed["segments"] if s["text"].strip()]


class StubWhisper:
    config = SimpleNamespace(n_vocab=51864)


@pytest.mark.parametrize("fields, fragment", [
    ({"offset": -1}, "offset must be a number of seconds from 0"),
    ({"offset": True}, "offset must be a number"),
    ({"prior": "text"}, "prior must be a list"),
    ({"prior": [3]}, r"prior\[0\] must be a segment object"),
    ({"prior": [{"start": 0, "end": 1, "text": "a", "tokens": [1]}, {"start": "0"}]},
     r"prior\[1\]\.start must be a finite number"),
    ({"prior": [{"start": 2, "end": 1, "text": "a", "tokens": []}]},
     r"prior\[0\]: start 2.0 and end 1.0"),
    ({"prior": [{"start": 0, "end": 1, "text": None, "tokens": []}]}, r"prior\[0\]\.text"),
    ({"prior": [{"start": 0, "end": 1, "text": "a", "tokens": [51864]}]},
     r"prior\[0\]\.tokens must be a list of token ids in 0\.\.51863"),
])
def test_bad_offsets_and_prior_segments_are_refused_by_field(fields, fragment):
    session = WhisperSession()
    session._loaded["stub"] = (StubWhisper(), None)  # refused before any audio is read
    with pytest.raises(FormatError, match=fragment):
        session.run("stub", {"samples": np.zeros(16, np.float32).tobytes(), **fields})
