"""`candle-web models` on the real cache that `make test` filled: every default model is there,
and each file says which of its registry sources it came from."""

from __future__ import annotations

import pytest

from candle_web import cli, hub

# What `make test` fetches (models/fetch.py --default); each must be listed as cached.
DEFAULT_MODELS = ("whisper-tiny.en", "whisper-base", "smollm2-135m-instruct", "all-minilm-l6-v2")


def allowed_origins(model: hub.ModelEntry, filename: str) -> list[str]:
    """The origins a file may honestly have: its pinned Hub URL, or a member of its mirror."""
    origins = []
    for source in model.sources:
        (kind, spec), = source.items()
        if kind == "hf":
            origins.append(hub.hf_url(spec["repo"], spec["revision"], filename))
        elif kind == "pypi":
            joined = {join["name"]: join["parts"] for join in spec.get("join", [])}
            members = {}
            for package in spec["packages"]:
                wheel = (f"{package['name'].replace('-', '_')}-{package['version']}-"
                         f"py3-none-any.whl")
                members.update({local: f"{wheel}:{member}"
                                for local, member in package["members"].items()})
            parts = joined.get(filename, [filename])
            if all(part in members for part in parts):
                origins.append("pypi " + " + ".join(members[part] for part in parts))
    return origins


@pytest.mark.parametrize("name", DEFAULT_MODELS)
def test_models_lists_where_each_cached_file_came_from(name, capsys):
    assert cli.main(["models"]) == 0
    lines = capsys.readouterr().out.splitlines()
    row = next(i for i, line in enumerate(lines) if line.split()[:1] == [name])
    assert lines[row].split()[3] == "yes", f"{name} is not cached: {lines[row]}"
    model = hub.default_registry()[name]
    listed = {line.split()[0]: line.split(" from ", 1)[1]
              for line in lines[row + 1:row + 1 + len(model.files)]}
    assert set(listed) == {file.name for file in model.files}
    for file in model.files:
        assert listed[file.name] in allowed_origins(model, file.name), (
            f"{name}/{file.name}: listed origin {listed[file.name]!r}")
