"""`candle-web text2text`: a local T5 folder end to end, and the clear message when the Hub is
off (no offline mirror of T5 weights exists)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from candle_web import cli
from candle_web.tokenizers import Tokenizer

REFERENCE_DIR = Path(__file__).resolve().parent.parent / "reference"


@pytest.fixture(scope="module")
def t5_folder(tmp_path_factory):
    spec = importlib.util.spec_from_file_location("record_t5", REFERENCE_DIR / "record_t5.py")
    recorder = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recorder)
    return recorder.write_model("v1_1", tmp_path_factory.mktemp("t5cli") / "v1_1")


def test_text2text_prints_the_greedy_output(t5_folder, capsys):
    reference = json.loads((REFERENCE_DIR / "t5_reference.json").read_text())["models"]["v1_1"]
    prompt = reference["prompts"][1]
    assert cli.main(["text2text", prompt["text"], "--model", str(t5_folder), "--max-tokens", "12"]) == 0
    out, err = capsys.readouterr()
    expected = Tokenizer.from_file(REFERENCE_DIR / "t5_tokenizer.json").decode(prompt["greedy"])
    assert out == expected + "\n"
    assert f"{len(prompt['ids'])} input tokens, 12 generated" in err


def test_text2text_offline_without_a_local_model_says_what_to_do(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("CANDLE_WEB_OFFLINE", "1")
    monkeypatch.setenv("CANDLE_WEB_CACHE", str(tmp_path))
    assert cli.main(["text2text", "translate English to German: Hello"]) == 2
    err = capsys.readouterr().err
    assert "google-t5/t5-small@df1b051c" in err and "--model DIR" in err
    assert cli.main(["text2text", "x", "--model", "not a model"]) == 2
    assert "not a folder, a registry model or a Hub" in capsys.readouterr().err
