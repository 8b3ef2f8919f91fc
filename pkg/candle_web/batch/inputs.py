"""What a batch runs over: audio paths from files, folders, globs and list files; texts from
JSON Lines files. Pure standard library: the driver expands these before Ray starts, so a typo
fails in a second with the path named, not after a cluster came up."""

from __future__ import annotations

import glob
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from ..core.errors import InvalidOption

# What a folder contributes: the containers load_audio decodes (WAV natively, the rest through
# soundfile or ffmpeg), plus headerless int16 (.raw/.pcm, as `candle-web transcribe` reads them).
AUDIO_SUFFIXES = (".wav", ".wave", ".flac", ".mp3", ".ogg", ".oga", ".opus", ".m4a", ".aac",
                  ".webm", ".aiff", ".aif", ".raw", ".pcm")
# A file with one of these suffixes is a list of inputs, one path a line (# starts a comment;
# relative paths are relative to the list file's folder).
LIST_SUFFIXES = (".txt", ".lst", ".list")
GLOB_CHARACTERS = set("*?[")


@dataclass(frozen=True)
class AudioInput:
    path: str          # absolute, as the workers open it (a cluster needs shared storage)
    output_name: str   # the stem of its TXT/SRT/VTT files: unique within the batch


def expand_audio_inputs(arguments) -> list[AudioInput]:
    """Absolute paths, in the order given, each once. A path that does not exist stays in (it
    becomes a row of the errors table, the run continues); a glob or folder that yields
    nothing, or no input at all, is an error now."""
    paths: list[str] = []
    for argument in arguments:
        paths.extend(_expand_one(str(argument), depth=0))
    unique = list(dict.fromkeys(paths))
    if not unique:
        raise InvalidOption("batch transcribe: no input files (give files, folders, globs or a "
                            "list file)")
    return [AudioInput(path, name) for path, name in zip(unique, output_names(unique))]


def _expand_one(argument: str, depth: int) -> list[str]:
    path = Path(argument).expanduser()
    if path.is_dir():
        found = sorted(str(item.resolve()) for item in path.rglob("*")
                       if item.is_file() and item.suffix.lower() in AUDIO_SUFFIXES)
        if not found:
            raise InvalidOption(f"{argument}: the folder holds no audio files "
                                f"({', '.join(AUDIO_SUFFIXES)})")
        return found
    if path.is_file() and path.suffix.lower() in LIST_SUFFIXES:
        if depth > 0:
            raise InvalidOption(f"{argument}: a list file may not name another list file")
        return _read_list_file(path, depth)
    if not path.exists() and GLOB_CHARACTERS & set(argument):
        matches = sorted(glob.glob(os.path.expanduser(argument), recursive=True))
        files = [str(Path(match).resolve()) for match in matches if Path(match).is_file()]
        if not files:
            raise InvalidOption(f"{argument}: no file matches this pattern")
        return files
    return [str(path.resolve())]


def _read_list_file(path: Path, depth: int) -> list[str]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise InvalidOption(f"{path}: cannot read the list of inputs: {error}") from None
    out = []
    for line in lines:
        entry = line.strip()
        if not entry or entry.startswith("#"):
            continue
        target = Path(entry).expanduser()
        if not target.is_absolute():
            target = path.parent / target
        out.extend(_expand_one(str(target), depth + 1))
    return out


def output_names(paths: list[str]) -> list[str]:
    """The file stem of each input (what `candle-web transcribe --output-dir` writes), with a
    short hash of the full path added where two inputs share a stem."""
    stems = [Path(path).stem or "audio" for path in paths]
    counts: dict[str, int] = {}
    for stem in stems:
        counts[stem] = counts.get(stem, 0) + 1
    return [stem if counts[stem] == 1 else f"{stem}-{hashlib.sha256(path.encode()).hexdigest()[:8]}"
            for stem, path in zip(stems, paths)]


@dataclass(frozen=True)
class TextLine:
    path: str   # the JSONL file (absolute)
    line: int   # 1-based line number in it
    raw: str    # the line as read; parsed (and refused with a message) in the pipeline


def read_text_lines(arguments) -> list[TextLine]:
    """Every non-blank line of the given JSON Lines files. Each line is a JSON object with a
    "text" string (and optionally an "id"), or a bare JSON string; the pipeline parses it, so a
    bad line becomes a row of the errors table instead of stopping the run."""
    out = []
    for argument in arguments:
        path = Path(str(argument)).expanduser()
        if not path.is_file():
            raise InvalidOption(f"{argument}: no such file (batch embed reads JSON Lines files)")
        try:
            with open(path, encoding="utf-8") as handle:
                for number, line in enumerate(handle, 1):
                    if line.strip():
                        out.append(TextLine(str(path.resolve()), number, line.rstrip("\n")))
        except UnicodeDecodeError as error:
            raise InvalidOption(f"{argument}: not UTF-8 text ({error})") from None
    if not out:
        raise InvalidOption("batch embed: the input files hold no lines")
    return out


def parse_text_line(raw: str) -> tuple[str, str | None]:
    """(text, id or None) of one JSONL line; InvalidOption naming the field otherwise."""
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as error:
        raise InvalidOption(f"not valid JSON: {error.msg} at column {error.colno}") from None
    if isinstance(value, str):
        return value, None
    if not isinstance(value, dict):
        raise InvalidOption(f"expected a JSON object with a \"text\" string, got "
                            f"{type(value).__name__}")
    if "text" not in value:
        raise InvalidOption(f"field \"text\" is missing (fields: {', '.join(sorted(value)) or 'none'})")
    text = value["text"]
    if not isinstance(text, str):
        raise InvalidOption(f"field \"text\" must be a string, got {type(text).__name__}")
    ident = value.get("id")
    if ident is not None and not isinstance(ident, (str, int)):
        raise InvalidOption(f"field \"id\" must be a string or an integer, got {type(ident).__name__}")
    return text, None if ident is None else str(ident)
