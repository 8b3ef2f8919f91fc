"""The batch tests' inputs: ~20 short clips cut with sox from the test speech (the LibriVox
clips and the pocketsphinx recordings `make test` fetches), plus the broken files a real
archive has: a truncated WAV, random bytes named .wav, an empty file, and a listed path that
does not exist."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np

# (name, source, sox effects / output options): 17 decodable clips, 1.2-7.1 s each.
LIBRIVOX = "sense_and_sensibility_01_austen_64kb-{}.wav"
GOOD = [
    *[(f"lv{n}-a.wav", LIBRIVOX.format(n), ["trim", "0", "2.5"]) for n in ("0870", "0880", "0890", "0920", "0930")],
    *[(f"lv{n}-b.wav", LIBRIVOX.format(n), ["trim", "1.5"]) for n in ("0870", "0880", "0890", "0920", "0930")],
    ("lv0870-full.wav", LIBRIVOX.format("0870"), []),
    ("lv0920-mid.wav", LIBRIVOX.format("0920"), ["trim", "1", "3"]),
    ("goforward.wav", "goforward.raw", []),
    ("something.wav", "something.raw", []),
    ("something-8k.wav", "something.raw", ["rate", "8000"]),
    ("lv0890-44k-stereo.wav", LIBRIVOX.format("0890"), ["trim", "0", "3", "rate", "44100", "channels", "2"]),
    ("goforward.flac", "goforward.raw", []),
]
BROKEN = ["truncated.wav", "random-bytes.wav", "empty.wav"]
MISSING = "gone/never-there.wav"


def make_clips(speech: Path, folder: Path) -> dict:
    """Write the clips under folder/clips/ (and two under folder/more/, named by a list file).
    Returns {"inputs": [command-line inputs], "good": [paths], "broken": [paths]}."""
    if shutil.which("sox") is None:
        raise RuntimeError("sox is missing: `make test` installs it (Debian package sox)")
    clips, more = folder / "clips", folder / "more"
    clips.mkdir(parents=True)
    more.mkdir()
    good = []
    for index, (name, source, effects) in enumerate(GOOD):
        # The last two go to more/, reached through the list file.
        target = (more if index >= len(GOOD) - 2 else clips) / name
        src = speech / "librivox" / source if source.startswith("sense") else speech / source
        raw = ["-t", "raw", "-r", "16000", "-e", "signed", "-b", "16", "-c", "1"] if source.endswith(".raw") else []
        subprocess.run(["sox", *raw, str(src), str(target), *effects], check=True, capture_output=True)
        good.append(str(target))
    whole = (clips / "lv0880-a.wav").read_bytes()
    (clips / "truncated.wav").write_bytes(whole[:len(whole) // 3])
    (clips / "random-bytes.wav").write_bytes(np.random.default_rng(7).integers(0, 256, 4096, np.uint8).tobytes())
    (clips / "empty.wav").write_bytes(b"")
    listing = folder / "more.txt"
    listing.write_text("# two clips and one path that is gone\n" + "\n".join(
        [f"more/{Path(p).name}" for p in good if Path(p).parent == more] + [MISSING]) + "\n")
    broken = [str(clips / name) for name in BROKEN] + [str(folder / MISSING)]
    return {"inputs": [str(clips), str(listing)], "good": good, "broken": broken}
