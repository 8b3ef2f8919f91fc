#!/usr/bin/env python3
"""Copy the demo page's sample clips into web/vendor/samples/ (generated, git-ignored).

The clips are the real speech of Debian's pocketsphinx-testdata that scripts/fetch_test_audio.sh
puts in the candle-web cache (<cache>/testdata/speech): the five LibriVox WAVs and goforward.raw
(headerless int16, given a WAV header here so the browser can decode it). manifest.json lists
each clip with its title, duration, reference transcript and sha256, for the page and the UI
tests. Nothing is committed: the clips are re-created from the cache whenever they are missing.

Usage: python scripts/vendor_samples.py   (also run by scripts/vendor_pyodide.py)
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import wave
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
SAMPLES_DIR = REPO_ROOT / "web" / "vendor" / "samples"
MANIFEST_NAME = "manifest.json"
CACHE_ENV_VAR = "CANDLE_WEB_CACHE"
DEFAULT_CACHE = "~/.cache/candle-web"
SPEECH_SUBDIR = Path("testdata") / "speech"
SAMPLE_RATE = 16_000
RAW_CLIPS = {"goforward.raw": ("goforward.wav", "Go forward ten meters (pocketsphinx)",
                               "go forward ten meters")}
LIBRIVOX_TITLE = "Sense and Sensibility, LibriVox, clip {number}"


def speech_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV_VAR) or DEFAULT_CACHE).expanduser() / SPEECH_SUBDIR


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def wav_seconds(path: Path) -> float:
    with wave.open(str(path), "rb") as clip:
        return clip.getnframes() / clip.getframerate()


def librivox_transcripts(folder: Path) -> dict:
    """clip stem -> lower-case reference words (the package's `transcription` file)."""
    listing = folder / "transcription"
    if not listing.is_file():
        return {}
    found = {}
    for line in listing.read_text(encoding="utf-8").splitlines():
        text, _, ident = line.rpartition("(")
        if ident:
            words = text.replace("<s>", " ").replace("</s>", " ").split()
            found[ident.rstrip(")").strip()] = " ".join(words)
    return found


def raw_to_wav(source: Path, target: Path) -> None:
    data = source.read_bytes()
    if len(data) % 2:
        raise ValueError(f"{source}: odd byte count {len(data)} for int16 samples")
    temp = target.with_name(target.name + ".part")
    with wave.open(str(temp), "wb") as clip:
        clip.setnchannels(1)
        clip.setsampwidth(2)
        clip.setframerate(SAMPLE_RATE)
        clip.writeframes(data)  # pocketsphinx's raw files are little-endian, like WAV
    temp.replace(target)


def vendor_samples(source: Path | None = None, target: Path = SAMPLES_DIR) -> list[dict]:
    """Copy what the cache has; returns the manifest entries (empty when there is no speech)."""
    source = source or speech_dir()
    librivox = source / "librivox"
    if not librivox.is_dir():
        print(f"[vendor] no test speech in {source}: the page will show no sample clips "
              "(run scripts/fetch_test_audio.sh)", flush=True)
        return []
    target.mkdir(parents=True, exist_ok=True)
    transcripts = librivox_transcripts(librivox)
    entries = []
    for number, wav in enumerate(sorted(librivox.glob("*.wav")), start=1):
        destination = target / wav.name
        if not destination.is_file() or destination.read_bytes() != wav.read_bytes():
            shutil.copyfile(wav, destination)
        entries.append({"file": wav.name, "title": LIBRIVOX_TITLE.format(number=number),
                        "reference": transcripts.get(wav.stem, ""), "librivox": True})
    for raw_name, (wav_name, title, reference) in RAW_CLIPS.items():
        raw = source / raw_name
        if raw.is_file():
            destination = target / wav_name
            if not destination.is_file():
                raw_to_wav(raw, destination)
            entries.append({"file": wav_name, "title": title, "reference": reference,
                            "librivox": False})
    for entry in entries:
        path = target / entry["file"]
        entry["seconds"] = round(wav_seconds(path), 3)
        entry["sha256"] = sha256_of(path)
        entry["bytes"] = path.stat().st_size
    (target / MANIFEST_NAME).write_text(json.dumps({"clips": entries}, indent=2) + "\n",
                                        encoding="utf-8")
    return entries


def main() -> int:
    entries = vendor_samples()
    print(f"[vendor] {len(entries)} sample clips in {SAMPLES_DIR}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
