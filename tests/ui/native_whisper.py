"""The native side of the Whisper twin check, run as a subprocess by the UI tests and by
bench/browser.py: transcribe WAV files with the numpy backend and print one JSON object.

    CANDLE_WEB_BACKEND=numpy python tests/ui/native_whisper.py [--chromium-pcm|--firefox-pcm] \
        MODEL CLIP.wav...

A separate process because the backend is chosen once per process (CANDLE_WEB_BACKEND, read
when Device.cpu() first resolves) and because it then runs next to the browser on the other
core. Each clip gets the payload candle_web.worker.whisper builds in the browser (same
segments, token ids, text), the sha256 of its float32 samples (to prove both sides decoded the
same input) and its wall time; stdout carries only the JSON.

Input samples. Chromium's decodeAudioData turns 16-bit PCM into floats asymmetrically:
positive values times float32(1/32767), negative ones times float32(1/32768) (so +32767 maps
to 1.0; checked bit for bit on the LibriVox clips), while
candle_web.io.audio.load_audio divides everything by 32768 (as openai-whisper and ffmpeg do). The
two differ by at most 1/32767 - 1/32768 of full scale (~1e-9 per unit, 3e-5 at most). The
twin check is about the model's computation, so with --chromium-pcm the clip is converted the
way the browser does it, and the sha256 of the samples proves both sides start from the same
bits. bench/browser.py uses it too. Firefox's decoder divides instead (positive values by
32767, negative ones by 32768, in float32; checked bit for bit on clip 0880), which puts some
samples one bit away from Chromium's (1,950 of clip 0880's 47,840): --firefox-pcm converts
that way (tests/ui_firefox).
"""
from __future__ import annotations

import hashlib
import json
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "pkg"))

CHROMIUM_PCM_FLAG = "--chromium-pcm"
FIREFOX_PCM_FLAG = "--firefox-pcm"


def pcm16_as_floats(path: str):
    """A 16 kHz mono 16-bit WAV's samples as float32 integers (exact), for the conversions."""
    import wave

    import numpy as np

    with wave.open(path, "rb") as clip:
        if (clip.getnchannels(), clip.getsampwidth(), clip.getframerate()) != (1, 2, 16000):
            raise SystemExit(f"{path}: expected 16 kHz mono 16-bit PCM for a browser's "
                             "conversion")
        return np.frombuffer(clip.readframes(clip.getnframes()), dtype="<i2").astype(np.float32)


def chromium_pcm16(path: str):
    """A 16 kHz mono 16-bit WAV as Chromium's decodeAudioData returns it (see above)."""
    import numpy as np

    ints = pcm16_as_floats(path)
    positive_scale = np.float32(1.0 / 32767.0)
    negative_scale = np.float32(1.0 / 32768.0)
    return np.where(ints > 0, ints * positive_scale, ints * negative_scale).astype(np.float32)


def firefox_pcm16(path: str):
    """A 16 kHz mono 16-bit WAV as Firefox's decodeAudioData returns it (see above)."""
    import numpy as np

    ints = pcm16_as_floats(path)
    return np.where(ints > 0, ints / np.float32(32767), ints / np.float32(32768)).astype(
        np.float32)


BROWSER_PCM = {CHROMIUM_PCM_FLAG: chromium_pcm16, FIREFOX_PCM_FLAG: firefox_pcm16}


def main(argv: list[str]) -> int:
    conversions = [BROWSER_PCM[arg] for arg in argv if arg in BROWSER_PCM]
    argv = [arg for arg in argv if arg not in BROWSER_PCM]
    if len(conversions) > 1:
        print(f"{CHROMIUM_PCM_FLAG} and {FIREFOX_PCM_FLAG} exclude each other", file=sys.stderr)
        return 2
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    from candle_web import Device
    from candle_web.io.audio import load_audio
    from candle_web.pipelines.transcribe import transcribe
    from candle_web.pipelines import load_whisper
    from candle_web.worker.whisper import transcribe_options, transcript_payload

    model_name, clip_paths = argv[0], argv[1:]
    started = time.perf_counter()
    loaded = load_whisper(model_name)
    model, tokenizer = loaded.model, loaded.tokenizer
    load_s = time.perf_counter() - started
    clips = {}
    for clip_path in clip_paths:
        samples = conversions[0](clip_path) if conversions else load_audio(clip_path)
        started = time.perf_counter()
        transcript = transcribe(model, tokenizer, samples, transcribe_options({}))
        elapsed = time.perf_counter() - started
        payload = transcript_payload(transcript)
        payload.pop("exports")
        payload["seconds"] = elapsed
        payload["sha256"] = hashlib.sha256(samples.astype("<f4").tobytes()).hexdigest()
        clips[Path(clip_path).name] = payload
    json.dump({"backend": Device.cpu().backend.name, "loadSeconds": load_s, "clips": clips},
              sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
