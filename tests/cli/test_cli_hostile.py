"""Issue 28: the command line on ordinary hostile input. Arguments that are not UTF-8 (Python
turns their bytes into lone surrogates) are refused as usage errors naming the argument; audio
paths that are not regular files (/dev/zero, a FIFO) are refused naming the path, without
reading or blocking; a file whose *name* is not UTF-8 is still a file and is transcribed. Run
as a user runs it: `python -m candle_web.cli` in a child process, arguments as raw bytes."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
# espeak-ng's "Hello world, this is a test of the speech recogniser." in the test speech that
# `make models` puts in the model cache (scripts/fetch_test_audio.sh; espeak-ng and sox are
# system-deps): relative to hub.cache_dir(), which follows CANDLE_WEB_CACHE as the child does.
HELLO = Path("testdata") / "speech" / "synth" / "hello_16k.wav"
# A hang guard: reading /dev/zero ran until memory ran out, a FIFO blocked for ever.
HANG_SECONDS = 300


def candle_web(*args) -> subprocess.CompletedProcess:
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", CANDLE_WEB_OFFLINE="1",
               PYTHONPATH=os.pathsep.join([str(REPO_ROOT / "pkg"), str(REPO_ROOT / "native")]))
    command = [os.fsencode(sys.executable), b"-m", b"candle_web.cli",
               *[arg if isinstance(arg, bytes) else os.fsencode(arg) for arg in args]]
    return subprocess.run(command, capture_output=True, timeout=HANG_SECONDS, env=env)


@pytest.mark.parametrize("args, argument, shown", [
    ([b"generate", b"\xff\xfe"], "prompt", "byte 0xFF that is not UTF-8 (U+DCFF) at character 0"),
    ([b"transcribe", b"clip.wav", b"--initial-prompt", b"ab\xff"], "--initial-prompt",
     "byte 0xFF that is not UTF-8 (U+DCFF) at character 2"),
    ([b"transcribe", b"clip.wav", b"--language", b"e\xe9"], "--language",
     "byte 0xE9 that is not UTF-8 (U+DCE9) at character 1"),
    ([b"text2text", b"translate: \xc3"], "prompt", "byte 0xC3"),
    ([b"embed", b"fine", b"caf\xe9"], "texts", "byte 0xE9"),
])
def test_non_utf8_text_arguments_are_usage_errors(args, argument, shown):
    """The finding: `candle-web generate $'\\xff\\xfe'` and `transcribe --initial-prompt
    $'\\xff'` ended in a traceback (UnicodeEncodeError in the tokenizer)."""
    done = candle_web(*args)
    err = done.stderr.decode("utf-8", "replace")
    assert done.returncode == 2, err
    assert f"error: argument {argument}: not valid text: {shown}" in err, err
    assert "Traceback" not in err


def test_valid_utf8_text_passes_the_check():
    """The same arguments in UTF-8 get past parsing (here: to a missing model name)."""
    done = candle_web("generate", "caf\u00e9 \u65e5\u672c", "--model", "no-such-model")
    err = done.stderr.decode()
    assert "not valid text" not in err and done.returncode != 0 and "Traceback" not in err


@pytest.fixture(scope="module")
def hello_clip(model_file) -> Path:
    """The synthesised clip, with whisper-tiny.en cached for the child to load (a missing file
    fails the test naming the command that fetches it)."""
    from candle_web import hub

    for name in ("model.bin", "config.json", "tokenizer.json"):
        model_file("whisper-tiny.en", name)
    clip = hub.cache_dir() / HELLO
    if not clip.is_file():
        pytest.fail(f"{clip} is missing: run `make models` (scripts/fetch_test_audio.sh "
                    "synthesises it with espeak-ng and sox)", pytrace=False)
    return clip


def test_special_files_are_refused_and_the_regular_one_still_transcribed(tmp_path, hello_clip):
    """`transcribe /dev/zero` read until memory ran out; a FIFO blocked for ever. Both are
    refused naming the path; the regular file given with them (whose name is not UTF-8) is
    still transcribed, and the exit status says something failed."""
    fifo = tmp_path / "stream.wav"
    os.mkfifo(fifo)
    odd_name = os.fsencode(tmp_path) + b"/h\xe9llo.wav"  # Latin-1, not UTF-8
    shutil.copyfile(hello_clip, odd_name)
    done = candle_web(b"transcribe", b"/dev/zero", os.fsencode(fifo), odd_name,
                      b"--model", b"whisper-tiny.en")
    err = done.stderr.decode("utf-8", "replace")
    assert done.returncode == 1, err
    assert "candle-web: /dev/zero: is a character device, not a regular file" in err
    assert f"candle-web: {fifo}: is a FIFO (named pipe), not a regular file" in err
    assert "Traceback" not in err
    # The clip (espeak: "hello world, this is a test of the speech recognition...") was
    # transcribed: tiny.en gets these two words of it right.
    transcript = done.stdout.decode().lower()
    assert "world" in transcript and "speech" in transcript, transcript
    # Named on stderr with the odd byte escaped (stderr's backslashreplace), no traceback.
    assert "h\\udce9llo.wav: " in err and "real-time factor" in err
