"""Transcript output formats: plain text, SubRip (SRT), WebVTT and JSON.

With word timestamps, SRT and VTT cues are built from words as openai-whisper's writers build
them: `max_line_width` characters per line and `max_line_count` lines per cue (both given:
cues no longer follow segments, and a pause over 3 s starts a new cue), and `highlight_words`
repeats a cue once per word with that word underlined (<u>...</u>) while it is spoken.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass

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


@dataclass(frozen=True)
class CueOptions:
    """Word-level cue layout (used only when the segments carry words)."""
    max_line_width: int = None
    max_line_count: int = None
    highlight_words: bool = False

    def __post_init__(self):
        for name in ("max_line_width", "max_line_count"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")


def _has_words(segments) -> bool:
    return bool(segments) and getattr(segments[0], "words", None) is not None


def _word_groups(segments, options: CueOptions):
    """Lists of word dicts ({word, start, end}), one per cue; a word starting a new line
    within a cue carries a leading newline."""
    preserve_segments = options.max_line_count is None or options.max_line_width is None
    max_width = options.max_line_width or 1000
    line_len, line_count, cue = 0, 1, []
    first = next((w.start for s in segments for w in (s.words or [])), None)
    last = first or 0.0
    for segment in segments:
        for i, word in enumerate(segment.words or []):
            timing = {"word": word.word, "start": word.start, "end": word.end}
            long_pause = not preserve_segments and timing["start"] - last > 3.0
            has_room = line_len + len(timing["word"]) <= max_width
            segment_break = i == 0 and len(cue) > 0 and preserve_segments
            if line_len > 0 and has_room and not long_pause and not segment_break:
                line_len += len(timing["word"])
            else:
                timing["word"] = timing["word"].strip()
                if (cue and options.max_line_count is not None
                        and (long_pause or line_count >= options.max_line_count)) or segment_break:
                    yield cue
                    cue, line_count = [], 1
                elif line_len > 0:
                    line_count += 1
                    timing["word"] = "\n" + timing["word"]
                line_len = len(timing["word"].strip())
            cue.append(timing)
            last = timing["start"]
    if cue:
        yield cue


def _cue_times(transcript, options: CueOptions):
    """(start s, end s, text) per cue: one per segment, or built from words."""
    if not _has_words(transcript.segments):
        for s in _cues(transcript.segments):
            yield s.start, s.end, s.text.strip()
        return
    for cue in _word_groups(transcript.segments, options):
        text = "".join(w["word"] for w in cue)
        if not options.highlight_words:
            yield cue[0]["start"], cue[-1]["end"], text
            continue
        last = cue[0]["start"]
        for i, word in enumerate(cue):
            if _timestamp(last, ".") != _timestamp(word["start"], "."):
                yield last, word["start"], text
            yield word["start"], word["end"], "".join(
                re.sub(r"^(\s*)(.*)$", r"\1<u>\2</u>", w["word"], flags=re.S) if j == i else w["word"]
                for j, w in enumerate(cue))
            last = word["end"]


def to_srt(transcript, options: CueOptions = CueOptions()) -> str:
    blocks = []
    for index, (start, end, text) in enumerate(_cue_times(transcript, options), start=1):
        blocks.append(f"{index}\n{_timestamp(start, ',')} --> {_timestamp(end, ',')}\n"
                      f"{text.replace('-->', '->')}\n")
    return "\n".join(blocks)


def to_vtt(transcript, options: CueOptions = CueOptions()) -> str:
    blocks = ["WEBVTT\n"]
    for start, end, text in _cue_times(transcript, options):
        blocks.append(f"{_timestamp(start, '.')} --> {_timestamp(end, '.')}\n"
                      f"{text.replace('-->', '->')}\n")
    return "\n".join(blocks)


def to_json(transcript) -> str:
    """Segments as dicts; `words` (start, end, probability per word) only when computed."""
    segments = []
    for s in transcript.segments:
        entry = asdict(s)
        if entry.get("words") is None:
            entry.pop("words", None)
        segments.append(entry)
    payload = {
        "text": transcript.text,
        "language": transcript.language,
        "duration": transcript.duration,
        "segments": segments,
    }
    return json.dumps(payload, ensure_ascii=False, indent=1) + "\n"


def render(transcript, fmt: str, options: CueOptions = CueOptions()) -> str:
    writers = {"txt": to_txt, "srt": to_srt, "vtt": to_vtt, "json": to_json}
    if fmt not in writers:
        raise ValueError(f"unknown output format {fmt!r}; choose one of {', '.join(FORMATS)}")
    if fmt in ("srt", "vtt"):
        return writers[fmt](transcript, options)
    return writers[fmt](transcript)
