"""The Transcribe view's kept segments (a cancelled transcription's finished segments): the
worker writes their transcript and exports with the same subtitles module as for a whole
transcript, and refuses a malformed request by the field at fault."""
from __future__ import annotations

import json

import pytest

from candle_web.core.errors import FormatError
from candle_web.pipelines import subtitles
from candle_web.pipelines.transcribe import Segment, Transcript
from candle_web.worker.whisper import kept_payload

N_VOCAB = 51864  # whisper tiny.en's
KEPT = [
    {"start": 0.0, "end": 4.2, "text": " He was not an ill disposed young man,", "tokens": [50363, 679],
     "temperature": 0.0, "avgLogprob": -0.21, "noSpeechProb": 0.01},
    {"start": 4.2, "end": 7.1, "text": " unless to be rather cold hearted.", "tokens": [4556], "temperature": 0.0,
     "avgLogprob": -0.3, "noSpeechProb": 0.02},
]


def test_kept_segments_get_the_exports_of_an_equal_transcript():
    payload = kept_payload({"segments": KEPT, "duration": 50.0, "language": "en"}, N_VOCAB)
    segments = [Segment(id=i, seek=0, start=s["start"], end=s["end"], text=s["text"],
                        tokens=s["tokens"], temperature=0.0, avg_logprob=s["avgLogprob"],
                        compression_ratio=0.0, no_speech_prob=s["noSpeechProb"])
                for i, s in enumerate(KEPT)]
    reference = Transcript(text="".join(s["text"] for s in KEPT), segments=segments,
                           language="en", duration=50.0)
    for fmt in ("txt", "srt", "vtt", "json"):
        assert payload["exports"][fmt] == subtitles.render(reference, fmt), fmt
    assert payload["exports"]["txt"] == ("He was not an ill disposed young man,\n"
                                         "unless to be rather cold hearted.\n")
    assert json.loads(payload["exports"]["json"])["duration"] == 50.0
    assert [s["end"] for s in payload["segments"]] == [4.2, 7.1]


@pytest.mark.parametrize("kept, field", [
    ([], "kept must be"),
    ({"segments": KEPT, "duration": -1}, "kept.duration"),
    ({"segments": KEPT, "duration": True}, "kept.duration"),
    ({"segments": KEPT, "duration": 3.0, "language": 7}, "kept.language"),
    ({"segments": [{**KEPT[0], "text": None}], "duration": 3.0}, "kept.segments[0].text"),
    ({"segments": [{**KEPT[0], "tokens": [N_VOCAB]}], "duration": 3.0}, "kept.segments[0].tokens"),
])
def test_a_malformed_kept_request_names_its_field(kept, field):
    with pytest.raises(FormatError, match=field.replace("[", r"\[").replace("]", r"\]")):
        kept_payload(kept, N_VOCAB)
