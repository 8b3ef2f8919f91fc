"""The fields of /v1/audio/transcriptions and /translations beyond the file: OpenAI's
`timestamp_granularities[]` (word and segment times in verbose_json; words are the CLI's
`--word-timestamps`), `stream` (OpenAI's `transcript.text.delta` / `transcript.text.done`
server-sent events, one delta per segment as it is decoded), and `language` checked against
the model (an English-only model refuses another language instead of ignoring it).
"""

from __future__ import annotations

import json

from .errors import bad_request

GRANULARITIES = ("word", "segment")
# The names an English-only model accepts for its language.
ENGLISH = ("en", "english")


def granularities(values: list, response_format: str) -> tuple:
    """The timestamp granularities asked for (`values`: the form's
    `timestamp_granularities[]` fields, as the openai client sends them); OpenAI allows them
    with verbose_json only."""
    for value in values:
        if not isinstance(value, str) or value not in GRANULARITIES:
            shown = value[:40] if isinstance(value, str) else "a file"
            raise bad_request(f"timestamp_granularities: {shown!r} is not one of "
                              f"{', '.join(GRANULARITIES)}", "timestamp_granularities")
    if values and response_format != "verbose_json":
        raise bad_request("timestamp_granularities: needs response_format \"verbose_json\" "
                          f"(got {response_format!r})", "timestamp_granularities")
    return tuple(dict.fromkeys(values)) or ("segment",)


def stream_flag(value) -> bool:
    if value is None:
        return False
    if value.lower() not in ("true", "false"):
        raise bad_request(f"stream: expected true or false, got {value[:40]!r}", "stream",
                          "invalid_type")
    return value.lower() == "true"


def check_language(language, model_name: str, multilingual: bool) -> None:
    """An English-only model transcribes English whatever it is told: another language is
    refused rather than answered in English."""
    if language and not multilingual and language.lower() not in ENGLISH:
        raise bad_request(f"language: {model_name} is an English-only model; it cannot "
                          f"transcribe {language!r} (leave language out, or send 'en', or use "
                          "a multilingual model)", "language", "unsupported_language")


def verbose_json(result, task: str, wanted: tuple) -> dict:
    """OpenAI's verbose_json: `segments` for the segment granularity, `words` (each with its
    text, no leading space, start and end in seconds) for the word one."""
    answer = {"task": task, "language": result.language or "english",
              "duration": result.duration, "text": result.text}
    if "word" in wanted:
        answer["words"] = [{"word": word.word.strip(), "start": word.start, "end": word.end}
                           for segment in result.segments for word in (segment.words or ())]
    if "segment" in wanted:
        answer["segments"] = [{"id": s.id, "seek": s.seek, "start": s.start, "end": s.end,
                               "text": s.text, "tokens": list(s.tokens),
                               "temperature": s.temperature, "avg_logprob": s.avg_logprob,
                               "compression_ratio": s.compression_ratio,
                               "no_speech_prob": s.no_speech_prob}
                              for s in result.segments]
    return answer


def sse(payload: dict) -> bytes:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n".encode("utf-8")


def delta_event(text: str) -> bytes:
    return sse({"type": "transcript.text.delta", "delta": text, "logprobs": None})


def done_event(text: str) -> bytes:
    return sse({"type": "transcript.text.done", "text": text, "logprobs": None})
