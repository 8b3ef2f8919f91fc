"""Hostile command-line options (issue 17): every option of every subcommand is range-checked
as it is parsed -- exit status 2, one `error:` line naming the option and its range, no
traceback -- and the option dataclasses the browser worker builds refuse the same values."""

from __future__ import annotations

import numpy as np
import pytest

from candle_web import cli
from candle_web.generation import option_limits
from candle_web.core.errors import CandleError, InvalidOption

BEAM_RANGE = f"an integer from 1 to {option_limits.MAX_BEAM_SIZE}"


def parse_error(argv, capsys) -> str:
    """The one error line argparse prints for `argv` (after asserting exit status 2)."""
    with pytest.raises(SystemExit) as info:
        cli.main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    errors = [line for line in err.splitlines() if "error:" in line]
    assert len(errors) == 1 and err.rstrip().endswith(errors[0]), err
    return errors[0]


@pytest.mark.parametrize("argv, option, allowed", [
    (["transcribe", "a.wav", "--beam-size", "2000"], "--beam-size", BEAM_RANGE),
    (["transcribe", "a.wav", "--beam-size", "100000"], "--beam-size", BEAM_RANGE),
    (["transcribe", "a.wav", "--beam-size", "0"], "--beam-size", BEAM_RANGE),
    (["transcribe", "a.wav", "--beam-size", "2.5"], "--beam-size", BEAM_RANGE),
    (["transcribe", "a.wav", "--task", "summarize"], "--task", "invalid choice"),
    (["generate", "hi", "--seed", "-1"], "--seed", "an integer >= 0"),
    (["generate", "hi", "--temperature", "-1"], "--temperature", "a finite number >= 0 (0: greedy)"),
    (["generate", "hi", "--temperature", "inf"], "--temperature", "a finite number >= 0"),
    (["generate", "hi", "--temperature", "nan"], "--temperature", "a finite number >= 0"),
    (["generate", "hi", "--top-p", "5"], "--top-p", "a finite number in (0, 1]"),
    (["generate", "hi", "--top-p", "-2"], "--top-p", "a finite number in (0, 1]"),
    (["generate", "hi", "--top-p", "0"], "--top-p", "a finite number in (0, 1]"),
    (["generate", "hi", "--top-k", "0"], "--top-k", "an integer >= 1"),
    (["generate", "hi", "--repeat-last-n", "-5"], "--repeat-last-n", "an integer >= 0"),
    (["generate", "hi", "--repeat-penalty", "0"], "--repeat-penalty", "a finite number > 0"),
    (["generate", "hi", "--max-tokens", "-1"], "--max-tokens", "an integer >= 0"),
    (["text2text", "hi", "--seed", "-1", "--temperature", "1"], "--seed", "an integer >= 0"),
    (["text2text", "hi", "--temperature", "inf"], "--temperature", "a finite number >= 0"),
    (["text2text", "hi", "--top-p", "1.5"], "--top-p", "a finite number in (0, 1]"),
    (["text2text", "hi", "--max-tokens", "many"], "--max-tokens", "an integer >= 0"),
    (["embed", "a", "--format", "csv"], "--format", "invalid choice"),
    (["serve", "--port", "70000"], "--port", "an integer from 0 to 65535"),
    (["serve", "--port", "-1"], "--port", "an integer from 0 to 65535"),
    (["models", "--verfy"], "unrecognized arguments", "--verfy"),
])
def test_out_of_range_options_are_one_line_usage_errors(argv, option, allowed, capsys):
    line = parse_error(argv, capsys)
    # Unknown arguments are reported by the top-level parser, range errors by the subcommand's.
    assert line.startswith((f"candle-web {argv[0]}: error: ", "candle-web: error: "))
    assert option in line and allowed in line, line


def test_accepted_edges_parse(capsys):
    parser = cli.build_parser()
    args = parser.parse_args(["generate", "hi", "--temperature", "0", "--top-p", "1",
                              "--seed", "0", "--repeat-last-n", "0", "--top-k", "1"])
    assert (args.temperature, args.top_p, args.seed, args.repeat_last_n) == (0.0, 1.0, 0, 0)
    args = parser.parse_args(["transcribe", "a.wav", "--beam-size", str(option_limits.MAX_BEAM_SIZE)])
    assert args.beam_size == option_limits.MAX_BEAM_SIZE


def test_beam_size_help_states_the_maximum_and_why(capsys):
    with pytest.raises(SystemExit):
        cli.main(["transcribe", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert f"1..{option_limits.MAX_BEAM_SIZE}" in text and "decoder state" in text


def test_help_figures_match_the_beam_state_estimate():
    """The per-beam sizes the help and option_limits quote are what beam_state_bytes says."""
    from candle_web.models.whisper import WhisperConfig
    from candle_web.models.whisper_decode import beam_state_bytes

    tiny_en = WhisperConfig(80, 51864, 384, 4, 6, 4, 6)
    base = WhisperConfig(80, 51865, 512, 6, 8, 6, 8)
    assert round(beam_state_bytes(tiny_en) / 1e6) == 26
    assert round(beam_state_bytes(base) / 1e6) == 51


# -- the same limits in the option dataclasses ------------------------------------------------
@pytest.mark.parametrize("fields, named", [
    ({"beam_size": 0}, "beam_size must be " + BEAM_RANGE),
    ({"beam_size": 2000}, "beam_size must be " + BEAM_RANGE),
    ({"best_of": 0}, "best_of must be"),
    ({"patience": 0.0}, "patience must be a finite number > 0"),
    ({"temperatures": (0.0, -0.2)}, "temperatures entry must be a finite number >= 0"),
    ({"temperatures": ()}, "temperatures must be a non-empty list"),
    ({"temperatures": (float("inf"),)}, "temperatures entry must be a finite number"),
    ({"no_speech_threshold": float("nan")}, "no_speech_threshold must be a finite number"),
    ({"task": "summarize"}, "task must be one of ['transcribe', 'translate']"),
    ({"language": 7}, "language must be a string"),
])
def test_transcribe_options_are_checked(fields, named):
    from candle_web.pipelines.transcribe import TranscribeOptions

    with pytest.raises(InvalidOption) as info:
        TranscribeOptions(**fields)
    assert named in str(info.value)


@pytest.mark.parametrize("fields, named", [
    ({"seed": -1}, "seed must be an integer >= 0, got -1"),
    ({"temperature": -1.0}, "temperature must be a finite number >= 0"),
    ({"temperature": float("inf")}, "temperature must be a finite number >= 0"),
    ({"temperature": float("nan")}, "temperature must be a finite number >= 0"),
    ({"top_p": 5.0, "temperature": 1.0}, "top_p must be a finite number in (0, 1]"),
    ({"top_p": -2.0}, "top_p must be a finite number in (0, 1]"),
    ({"top_k": 0}, "top_k must be an integer >= 1"),
    ({"repeat_last_n": -5}, "repeat_last_n must be an integer >= 0"),
    ({"repeat_penalty": float("inf")}, "repeat_penalty must be a finite number > 0"),
    ({"max_new_tokens": 2.5}, "max_new_tokens must be an integer >= 0"),
])
def test_generation_options_are_checked(fields, named):
    from candle_web.generation import GenerationOptions

    with pytest.raises(InvalidOption) as info:
        GenerationOptions(**fields)
    assert named in str(info.value)
    assert isinstance(info.value, CandleError)


def test_numpy_scalars_are_accepted_as_their_values():
    from candle_web.generation import GenerationOptions

    options = GenerationOptions(seed=np.int64(3), top_p=np.float32(0.5), temperature=1.0)
    assert options.seed == 3


def test_decoder_rows_beyond_the_memory_budget_are_refused(monkeypatch):
    from candle_web.models.whisper import WhisperConfig
    from candle_web.models.whisper_decode import beam_state_bytes, check_decoder_rows

    base = WhisperConfig(80, 51865, 512, 6, 8, 6, 8)
    monkeypatch.setattr(option_limits, "memory_budget_bytes", lambda: 10 * beam_state_bytes(base))
    check_decoder_rows(base, 10)
    with pytest.raises(InvalidOption, match=r"beam_size 11 needs ~0\.6 GB .* at most 10 fit"):
        check_decoder_rows(base, 11)


def test_memory_budget_is_half_the_machine_or_a_wasm_heap():
    budget = option_limits.memory_budget_bytes()
    assert budget >= option_limits.FALLBACK_MEMORY_BYTES // 4


# -- errors after parsing: one line, no traceback ---------------------------------------------
@pytest.fixture
def no_model(monkeypatch):
    """transcribe without loading Whisper: the audio is read (and fails) before it is used."""
    from candle_web import pipelines

    monkeypatch.setattr(pipelines, "load_whisper",
                        lambda *args, **kwargs: pipelines.Loaded(None, None))


def test_audio_errors_name_the_path_once_and_no_object_repr(tmp_path, no_model, capsys):
    noise = tmp_path / "noise.mp3"
    noise.write_bytes(np.random.default_rng(0).integers(0, 256, 2000, dtype=np.uint8).tobytes())
    truncated = tmp_path / "truncated.wav"
    truncated.write_bytes(b"RIFF\x24\x00\x00\x00WAVEfmt ")
    missing = tmp_path / "missing.wav"
    assert cli.main(["transcribe", str(noise), str(truncated), str(missing)]) == 1
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 3, lines
    for line, path in zip(lines, (noise, truncated, missing)):
        assert line.startswith(f"candle-web: {path}: ") and line.count(str(path)) == 1, line
        assert "BytesIO" not in line and " object at 0x" not in line and "Traceback" not in line
    assert lines[2] == f"candle-web: {missing}: cannot read it: no such file"


def test_an_os_error_after_parsing_is_one_line(tmp_path, no_model, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    assert cli.main(["transcribe", "x.wav", "--output-dir", str(blocker / "out")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("candle-web: ") and len(err.splitlines()) == 1 and "Traceback" not in err


def test_beam_width_beyond_memory_is_refused_before_decoding(tmp_path, model_file, monkeypatch,
                                                             capsys):
    """--beam-size within 1..32 but beyond what this machine can hold for the model: the
    transcription stops with a one-line error (exit status 2) before any decoding."""
    from candle_web.io.wav import write_wav

    model_file("whisper-tiny.en", "model.bin")  # cached, or the test says how to fetch it
    monkeypatch.setattr(option_limits, "memory_budget_bytes", lambda: 100_000_000)
    clip = tmp_path / "silence.wav"
    write_wav(str(clip), np.zeros(16000, np.float32), 16000)
    assert cli.main(["transcribe", str(clip), "--beam-size", "8"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("candle-web: beam_size 8 needs ~0.2 GB of decoder state") and "at most 3" in err
