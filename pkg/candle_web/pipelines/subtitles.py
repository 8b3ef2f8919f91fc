"""Transcript output formats: plain text, SubRip (SRT), WebVTT and JSON."""

from __future__ import annotations

import json
from dataclasses import asdict

FORMATS = ("txt", "srt", "vtt", "json")


def _timestamp(seconds: float, decimal: str) -> str:
    millis = int(round(max(seconds, 0.0) * 1000.0))
    hours, millis = divmod(millis, 3_600_000)
    minutes, millis = divmod(millis, 60_000)
    secs, millis = divmod(millis, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{decimal}{millis:03d}"


def _cues(segments):
    # Empty segments (silence the decoder skipped) produce no cue.
    return [s for s in segments if s.text.strip()]


def to_txt(transcript) -> str:
    return "\n".join(s.text.strip() for s in _cues(transcript.segments)) + "\n"


def to_srt(transcript) -> str:
    blocks = []
    for index, s in enumerate(_cues(transcript.segments), start=1):
        blocks.append(f"{index}\n{_timestamp(s.start, ',')} --> {_timestamp(s.end, ',')}\n"
                      f"{s.text.strip().replace('-->', '->')}\n")
    return "\n".join(blocks)


def to_vtt(transcript) -> str:
    blocks = ["WEBVTT\n"]
    for s in _cues(transcript.segments):
        blocks.append(f"{_timestamp(s.start, '.')} --> {_timestamp(s.end, '.')}\n"
                      f"{s.text.strip().replace('-->', '->')}\n")
    return "\n".join(blocks)


def to_json(transcript) -> str:
    payload = {
        "text": transcript.text,
        "language": transcript.language,
        "duration": transcript.duration,
        "segments": [asdict(s) for s in transcript.segments],
    }
    return json.dumps(payload, ensure_ascii=False, indent=1) + "\n"


def render(transcript, fmt: str) -> str:
    writers = {"txt": to_txt, "srt": to_srt, "vtt": to_vtt, "json": to_json}
    if fmt not in writers:
        raise ValueError(f"unknown output format {fmt!r}; choose one of {', '.join(FORMATS)}")
    return writers[fmt](transcript)
