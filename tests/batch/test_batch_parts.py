"""The parts of `candle-web batch` that need no cluster: what the inputs expand to, the options it
shares with the single-file commands, the message without Ray, the resume bookkeeping (what
counts as done, what a killed run leaves behind), and the read stages' skipping."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from tests.batch.batch_testlib import REPO, cli_env

from candle_web.core.errors import InvalidOption


# -- inputs ----------------------------------------------------------------------------------------
def test_inputs_expand_folders_globs_and_list_files(tmp_path):
    from candle_web.batch.inputs import expand_audio_inputs

    (tmp_path / "a" / "deep").mkdir(parents=True)
    (tmp_path / "b").mkdir()
    for name in ("a/one.wav", "a/deep/two.flac", "a/notes.md", "b/one.wav", "b/three.mp3"):
        (tmp_path / name).write_bytes(b"x")
    listing = tmp_path / "list.txt"
    listing.write_text("# comment\n\nb/three.mp3\n/nowhere/gone.wav\n")
    found = expand_audio_inputs([tmp_path / "a", str(tmp_path / "b" / "*.wav"), listing,
                                 tmp_path / "a" / "one.wav"])
    paths = [item.path for item in found]
    assert paths == [str(tmp_path / "a/deep/two.flac"), str(tmp_path / "a/one.wav"),
                     str(tmp_path / "b/one.wav"), str(tmp_path / "b/three.mp3"), "/nowhere/gone.wav"]
    # Two inputs named one.wav: their outputs get a hash of the path; the others keep the stem.
    names = {item.path: item.output_name for item in found}
    assert names[str(tmp_path / "a/deep/two.flac")] == "two"
    assert names[str(tmp_path / "a/one.wav")].startswith("one-")
    assert names[str(tmp_path / "a/one.wav")] != names[str(tmp_path / "b/one.wav")]


@pytest.mark.parametrize("argument, problem", [
    ("*.nothing-matches", "no file matches this pattern"),
    ("empty-folder", "holds no audio files"),
])
def test_inputs_that_yield_nothing_are_refused_naming_them(tmp_path, argument, problem):
    from candle_web.batch.inputs import expand_audio_inputs

    (tmp_path / "empty-folder").mkdir()
    with pytest.raises(InvalidOption, match=problem) as caught:
        expand_audio_inputs([str(tmp_path / argument)])
    assert argument in str(caught.value)


@pytest.mark.parametrize("line, message", [
    ("{oops", "not valid JSON"),
    ("[1, 2]", "expected a JSON object"),
    ('{"id": "a"}', 'field "text" is missing'),
    ('{"text": ["x"]}', 'field "text" must be a string'),
    ('{"text": "x", "id": 1.5}', 'field "id" must be a string or an integer'),
])
def test_bad_jsonl_lines_are_refused_naming_the_field(line, message):
    from candle_web.batch.inputs import parse_text_line

    with pytest.raises(InvalidOption, match=message):
        parse_text_line(line)


def test_good_jsonl_lines():
    from candle_web.batch.inputs import parse_text_line

    assert parse_text_line('"plain"') == ("plain", None)
    assert parse_text_line('{"text": "t", "id": 7}') == ("t", "7")


# -- the command -----------------------------------------------------------------------------------
def test_batch_transcribe_takes_every_option_transcribe_takes():
    """The shared options are transcribe's own; the batch maps each one onto TranscribeOptions
    (a new transcribe option fails here until batch passes it on too)."""
    from candle_web import cli
    from candle_web.batch.command import TRANSCRIBE_OPTIONS, shared_dests, transcribe_options

    parser = cli.build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices
    assert shared_dests(sub["transcribe"]) == TRANSCRIBE_OPTIONS
    args = parser.parse_args(["batch", "transcribe", "x.wav", "--out", "o", "--beam-size", "3",
                              "--no-fallback", "--initial-prompt", "Hi", "--without-timestamps"])
    options = transcribe_options(args)
    assert (options.beam_size, options.temperatures, options.initial_prompt,
            options.without_timestamps) == (3, (0.0,), "Hi", True)
    bad = subprocess.run([sys.executable, "-m", "candle_web.cli", "batch", "transcribe", "x.wav",
                          "--out", "o", "--beam-size", "0"], capture_output=True, text=True,
                         env=cli_env())
    assert bad.returncode == 2 and "--beam-size" in bad.stderr


def test_without_ray_the_command_names_the_extra(tmp_path):
    # A `ray` that cannot be imported, first on the path: as in an install without the extra.
    fake = tmp_path / "no-ray" / "ray"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError(\"No module named 'ray'\")\n")
    env = dict(cli_env(), PYTHONPATH=f"{tmp_path / 'no-ray'}:{cli_env()['PYTHONPATH']}")
    clip = tmp_path / "a.wav"
    clip.write_bytes(b"")
    out = subprocess.run([sys.executable, "-m", "candle_web.cli", "batch", "transcribe", str(clip),
                          "--out", str(tmp_path / "out")], capture_output=True, text=True, env=env)
    assert out.returncode == 2, out.stderr
    assert "pip install 'candle-web[cluster]'" in out.stderr and "Traceback" not in out.stderr


def test_the_package_and_the_cli_import_without_ray():
    script = ("import sys, candle_web.batch, candle_web.cli; candle_web.cli.build_parser(); "
              "print(sorted(m for m in sys.modules if m.split('.')[0] in ('ray', 'pyarrow')))")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env=cli_env(), cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


# -- resume bookkeeping ----------------------------------------------------------------------------
def _write_rows(out, status, rows, name):
    import pyarrow.parquet as pq

    from candle_web.batch import records

    folder = out / "results" / f"status={status}"
    folder.mkdir(parents=True, exist_ok=True)
    table = records.to_table([{**row, "status": status} for row in rows], "transcribe")
    pq.write_table(table.drop_columns(["status"]), folder / name)
    return folder / name


def test_a_half_written_file_is_moved_aside_and_its_inputs_redone(tmp_path):
    from candle_web.batch import records

    good = _write_rows(tmp_path, "done", [{"input_id": "/a.wav", "sha256": "aa", "config_key": "k"},
                                          {"input_id": "/b.wav", "sha256": "bb", "config_key": "other"}],
                       "one.parquet")
    _write_rows(tmp_path, "error", [{"input_id": "/c.wav", "sha256": None, "config_key": "k",
                                     "error": "/c.wav: gone"}], "two.parquet")
    cut = good.with_name("cut.parquet")
    cut.write_bytes(good.read_bytes()[:200])  # what a kill mid-write leaves
    existing = records.existing_keys(tmp_path, "k")
    assert existing.done == {("/a.wav", "aa")}  # /b.wav was done with other options
    assert existing.errors == {("/c.wav", None)}
    assert existing.quarantined == [str(cut)]
    assert not cut.exists() and (tmp_path / "quarantine" / "status=done-cut.parquet").exists()


def test_an_output_folder_belongs_to_one_task(tmp_path):
    from candle_web.batch import records

    records.prepare_output(tmp_path, "transcribe")
    records.prepare_output(tmp_path, "transcribe")
    with pytest.raises(InvalidOption, match="batch transcribe"):
        records.prepare_output(tmp_path, "embed")


def test_one_run_at_a_time_per_output_folder(tmp_path):
    from candle_web.batch.records import OutputLock

    with OutputLock(tmp_path):
        with pytest.raises(InvalidOption, match=f"pid {os.getpid()}"):
            OutputLock(tmp_path).__enter__()
    # A lock left by a killed run (its process is gone) is taken over.
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    import socket

    (tmp_path / ".lock").write_text(json.dumps({"host": socket.gethostname(), "pid": int(dead)}))
    with OutputLock(tmp_path) as lock:
        assert json.loads(lock.path.read_text())["pid"] == os.getpid()
    assert not (tmp_path / ".lock").exists()


def test_model_and_options_make_the_config_key():
    from candle_web.batch import records

    fingerprint = records.model_fingerprint("whisper-tiny.en", {})
    assert all(len(digest) == 64 for digest in fingerprint["files"].values())
    base = records.config_key("transcribe", fingerprint, {"beam_size": None})
    assert base == records.config_key("transcribe", fingerprint, {"beam_size": None})
    assert base != records.config_key("transcribe", fingerprint, {"beam_size": 2})
    assert base != records.config_key("embed", fingerprint, {"beam_size": None})


# -- the read stages, called as Ray calls them (a pyarrow batch in, a table out) --------------------
def test_read_audio_skips_what_is_done_and_keeps_failures_as_rows(tmp_path):
    import pyarrow as pa

    from candle_web.batch import stages
    from candle_web.io.wav import write_wav

    import numpy as np

    clip, broken, gone = tmp_path / "a.wav", tmp_path / "b.wav", tmp_path / "gone.wav"
    write_wav(str(clip), np.zeros(1600, np.float32), 16000)
    broken.write_bytes(b"RIFF")
    batch = pa.table({"path": [str(clip), str(broken), str(gone)], "output_name": ["a", "b", "gone"]})
    config = {"model": "m", "options": "{}", "config_key": "k"}
    rows = stages.read_audio(batch, config=config, skip=frozenset()).to_pylist()
    assert [(row["status"], row["error_stage"]) for row in rows] == \
        [("pending", None), ("error", "decode"), ("error", "read")]
    assert rows[0]["audio_seconds"] == 0.1 and len(rows[0]["payload"]) == 1600 * 4
    done = frozenset({(str(clip), rows[0]["sha256"]), (str(gone), None)})
    again = stages.read_audio(batch, config=config, skip=done).to_pylist()
    assert [row["path"] for row in again] == [str(broken)]


def test_read_text_skips_what_is_done_and_refused_lines_alike():
    import pyarrow as pa

    from candle_web.batch import stages

    batch = pa.table({"path": ["/t.jsonl"] * 2, "line": [1, 2], "raw": ['"hello"', "{bad"],
                      "input_id": ["/t.jsonl:1", "/t.jsonl:2"]})
    config = {"model": "m", "options": "{}", "config_key": "k"}
    rows = stages.read_text(batch, config=config, skip=frozenset()).to_pylist()
    assert [(row["status"], row["text"]) for row in rows] == [("pending", "hello"), ("error", None)]
    done = frozenset((row["input_id"], row["sha256"]) for row in rows)
    assert stages.read_text(batch, config=config, skip=done).num_rows == 0


def test_an_address_where_no_head_answers_fails_in_seconds_naming_it(tmp_path):
    import socket

    with socket.socket() as probe:  # a port nothing listens on once this closes
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    clip = tmp_path / "a.wav"
    clip.write_bytes(b"")
    out = subprocess.run([sys.executable, "-m", "candle_web.cli", "batch", "transcribe", str(clip),
                          "--out", str(tmp_path / "out"), "--ray-address", f"127.0.0.1:{port}"],
                         capture_output=True, text=True, env=cli_env(), timeout=120)
    assert out.returncode == 2, out.stderr
    assert f"--ray-address 127.0.0.1:{port}: no Ray head answers there" in out.stderr


def test_a_stopped_run_names_what_the_stage_raised():
    """Ray gives the driver its own wrapper; the stage's exception survives in the remote
    traceback's text (this is the shape of Ray 2.60's message for a model that did not load)."""
    from candle_web.batch.runner import _cause_of

    ray_text = ("\x1b[36mray::MapWorker(MapBatches(Transcriber)).submit()\x1b[39m (pid=1, ip=1)\n"
                "  File \"stages.py\", line 164, in _model\n"
                "candle_web.core.errors.ModelNotFound: /m: no tokenizer.json next to the Whisper weights\n"
                "\nThe above exception was the direct cause of the following exception:\n\n"
                "ray.exceptions.UserCodeException: UDF failed to process a data block.")
    assert _cause_of(RuntimeError(ray_text)) == \
        "ModelNotFound: /m: no tokenizer.json next to the Whisper weights"
