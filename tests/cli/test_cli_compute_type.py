"""`--compute-type int8|float32` on transcribe, generate, chat and serve: a bad value is a usage
error naming the flag; a good one is the compute type in force when the command loads its
models (override_settings, before any load), and for transcribe it changes what runs: the
Whisper parts quantize their weights under int8 and not without the flag."""

from __future__ import annotations

import pytest

from candle_web import cli
from candle_web.backend.settings import settings
from candle_web.core.errors import CandleError

COMMANDS = [["transcribe", "a.wav"], ["generate", "hi"], ["chat"], ["serve"]]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda argv: argv[0])
def test_a_bad_compute_type_is_refused_naming_the_flag(command, capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(command + ["--compute-type", "int4"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    line = err.strip().splitlines()[-1]
    assert line.startswith(f"candle-web {command[0]}: error: argument --compute-type: "), line
    assert "'int4'" in line and "'float32'" in line and "'int8'" in line


class _Stop(CandleError):
    """Raised where the command would load its model, once the compute type is recorded."""


@pytest.mark.parametrize("command, loader", [
    (["generate", "hi"], "candle_web.pipelines.load_llama"),
    (["chat"], "candle_web.pipelines.load_llama"),
    (["serve", "--port", "0"], "candle_web.serve.server.serve"),
])
@pytest.mark.parametrize("flag", ["int8", "float32", None])
def test_the_flag_is_in_force_when_the_models_load(command, loader, flag, monkeypatch, capsys):
    seen = []

    def record(*args, **kwargs):
        seen.append(settings().compute_type)
        raise _Stop("stopped before loading")

    monkeypatch.setenv("CANDLE_WEB_COMPUTE_TYPE", "int8" if flag == "float32" else "float32")
    monkeypatch.setattr(loader, record)
    argv = command + ([] if flag is None else ["--compute-type", flag])
    try:
        cli.main(argv)
    except _Stop:  # serve's start is not inside cli.main's CandleError handler
        pass
    capsys.readouterr()
    # Without the flag the environment's choice stands; with it, the flag wins over it.
    assert seen == [flag or "float32"]


def test_transcribe_int8_quantizes_the_whisper_parts_and_float32_does_not(monkeypatch, capsys,
                                                                          numba_device):
    from candle_web import hub
    from candle_web.backend.settings import reload_settings
    from candle_native.numba.parts import whisper_decoder, whisper_encoder

    clip = (hub.cache_dir() / "testdata" / "speech" / "librivox"
            / "sense_and_sensibility_01_austen_64kb-0930.wav")
    if not clip.is_file():
        pytest.fail("test speech is missing: run `make test` (scripts/fetch_test_audio.sh)")
    quantized = []
    for module in (whisper_decoder, whisper_encoder):
        original = module.int8_weight

        def counting(matrix, original=original, where=module.__name__.rsplit(".", 1)[-1]):
            quantized.append(where)
            return original(matrix)

        monkeypatch.setattr(module, "int8_weight", counting)
    texts = {}
    for flag in ("int8", None):
        reload_settings()
        quantized.clear()
        assert cli.main(["transcribe", str(clip)] + (["--compute-type", flag] if flag else [])) == 0
        texts[flag] = capsys.readouterr().out.strip()
        if flag == "int8":
            # tiny.en: 4 blocks x 4 encoder linears and x 6 decoder linears
            assert quantized.count("whisper_encoder") == 16
            assert quantized.count("whisper_decoder") == 24
        else:
            assert quantized == []
    assert texts["int8"] == texts[None] == "He might even have been made amiable himself."
