"""`candle-web generate --json-schema FILE`: the answer is JSON that validates against the schema
in FILE (SmolLM2-135M-Instruct, greedy, through the chat template); a schema the engine cannot
enforce, or a file that is not one, is a one-line usage error before any model loads."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("xgrammar", reason="the grammar extra installs xgrammar")
jsonschema = pytest.importorskip("jsonschema", reason="the dev extra installs jsonschema")

from candle_web import cli  # noqa: E402

CITY = {"type": "object", "required": ["city", "country", "coastal"],
        "properties": {"city": {"type": "string"}, "country": {"type": "string"},
                       "coastal": {"type": "boolean"}}}


def test_the_answer_validates_against_the_schema(tmp_path, capsys):
    schema = tmp_path / "city.json"
    schema.write_text(json.dumps(CITY))
    assert cli.main(["generate", "--chat", "--max-tokens", "80", "--json-schema", str(schema),
                     "Describe Paris as JSON."]) == 0
    captured = capsys.readouterr()
    assert "stopped: eos" in captured.err
    jsonschema.validate(json.loads(captured.out), CITY)


@pytest.mark.parametrize("content, words", [
    (json.dumps({"type": "object", "properties": {"a": {"oneOf": [{"type": "string"}]}}}),
     "oneOf at #/properties/a"),
    ("{not json", "not a JSON document"),
    ("[1, 2]", "a JSON schema is an object"),
])
def test_a_bad_schema_file_is_a_usage_error_naming_why(tmp_path, capsys, content, words):
    schema = tmp_path / "schema.json"
    schema.write_text(content)
    assert cli.main(["generate", "--json-schema", str(schema), "x"]) == 2
    error = capsys.readouterr().err
    assert str(schema) in error and words in error
