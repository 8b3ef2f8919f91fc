"""The worker's `live` steps (WhisperSession.live_step): the page starts a recording, sends the
audio heard from the open window's start whenever the reply's nextPassAt has been heard, and
after Stop the rest; the replies carry what the page shows. Checked natively with the real
whisper-tiny.en on LibriVox speech against pipelines.transcribe's LiveTranscriber driven
directly (the policy itself is tested in tests/pipelines/test_live_transcriber.py), and the
page's bad values against their error messages."""
from __future__ import annotations

import json

import numpy as np
import pytest

from candle_web import hub
from candle_web.core.errors import FormatError, UnsupportedError
from candle_web.worker import WhisperSession
from candle_web.worker.session import files_from_folder

MODEL = "whisper-tiny.en"
CLIPS = ("sense_and_sensibility_01_austen_64kb-0870.wav",
         "sense_and_sensibility_01_austen_64kb-0880.wav")
RATE = 16_000


@pytest.fixture(scope="module")
def session(model_file):
    session = WhisperSession()
    folder = model_file(MODEL, "model.bin").parent
    for name, data in files_from_folder(folder, session.required_files).items():
        session.allocate_file(MODEL, name, data.size)[:] = data
    session.build_model(MODEL)
    return session


@pytest.fixture(scope="module")
def recording():
    from candle_web.io.audio import load_audio

    folder = hub.cache_dir() / "testdata" / "speech" / "librivox"
    if not folder.is_dir():
        pytest.fail(f"{folder} is missing: run `make test` (scripts/fetch_test_audio.sh)")
    gap = np.zeros(RATE, dtype=np.float32)
    return np.concatenate([part for name in CLIPS
                           for part in (gap, load_audio(str(folder / name)).astype(np.float32))])


def step(session, recording_id, action, samples=None, offset=None, options=None):
    events = []
    request = {"live": {"recording": recording_id, "action": action}, "options": options,
               "offset": offset}
    if samples is not None:
        request["samples"] = samples.tobytes()
    text, _ = session.run(MODEL, request,
                          on_event=lambda kind, data: events.append((kind, json.loads(data))))
    return json.loads(text), events


def test_a_live_recording_step_by_step_gives_the_transcribers_transcript(session, recording):
    from candle_web.pipelines.transcribe import LiveTranscriber

    reply, _ = step(session, 7, "start")
    live = reply["live"]
    assert live["passes"] == 0 and live["nextPassAt"] == 3.0 and live["windowStart"] == 0.0
    # The reference: the transcriber driven directly, the same way.
    model, tokenizer = session.loaded(MODEL)
    direct = LiveTranscriber(model, tokenizer)
    shown = []
    while live["nextPassAt"] * RATE <= recording.size:
        heard = recording[:int(live["nextPassAt"] * RATE)]
        start = int(round(live["windowStart"] * RATE))
        reply, events = step(session, 7, "pass", heard[start:], start / RATE)
        expected = direct.step(heard[start:], start / RATE)
        live = reply["live"]
        assert live["ran"] == (expected is not None)
        if expected is not None:
            assert live["history"] == expected.history_entry()
            assert [s["text"] for s in live["partial"]] == [s.text for s in expected.partial]
            shown.append(live["history"])
            assert any(kind == "window" for kind, _ in events)
        assert (live["passes"], live["commits"], live["windowStart"]) == \
            (direct.passes, direct.commits, direct.window_start)
    assert shown  # passes ran while "recording"
    start = int(round(live["windowStart"] * RATE))
    result, events = step(session, 7, "stop", recording[start:], start / RATE)
    whole = direct.finish(recording[start:], start / RATE)
    assert result["text"] == whole.text
    assert [s["tokens"] for s in result["segments"]] == [s.tokens for s in whole.segments]
    assert [s["id"] for s in result["segments"]] == list(range(len(result["segments"])))
    assert result["exports"]["txt"].strip()
    assert result["timings"]["audioSeconds"] == pytest.approx(recording.size / RATE)
    assert result["timings"]["elapsedMs"] >= result["timings"]["lastPassMs"] > 0
    assert result["live"]["passes"] == direct.passes
    # The recording is over: another pass is refused.
    with pytest.raises(FormatError, match="recording 7 was not started"):
        step(session, 7, "pass", recording[:RATE], 0.0)


@pytest.mark.parametrize("live, message", [
    ({"recording": 0, "action": "start"}, "recording must be an integer"),
    ({"recording": True, "action": "start"}, "recording must be an integer"),
    ({"recording": 3, "action": "rewind"}, "action must be one of start, pass, stop"),
    ("start", "expected {recording, action}"),
])
def test_bad_live_fields_are_named(session, live, message):
    with pytest.raises(FormatError, match=message):
        session.run(MODEL, {"live": live})


def test_a_pass_for_another_recording_is_refused(session):
    step(session, 11, "start")
    with pytest.raises(FormatError, match="recording 12 was not started"):
        step(session, 12, "pass", np.zeros(RATE, dtype=np.float32), 0.0)
    with pytest.raises(UnsupportedError, match="unknown option"):
        step(session, 13, "start", options={"speed": 2})
