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


# -- candle-web models --verify -----------------------------------------------------------------
def test_models_shows_each_models_licence(capsys):
    """As a Hub model card does: a user sees the terms before using the weights (the Gemma
    terms included)."""
    assert cli.main(["models"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "licence" in lines[1]
    for model in hub.list_models():
        row = next(line for line in lines if line.split()[:1] == [model.name])
        assert model.license and model.license in row, f"{model.name}: {row}"


def test_models_verify_rehashes_every_file_and_fails_on_corruption(cache, fake_hub, monkeypatch,
                                                                   capsys):
    """--verify re-hashes whatever the stamps say (a stamp cannot vouch for bit rot that left
    every attribute alone), reports each file and exits 1 when one was corrupt."""
    from tests.hub.hub_testlib import REVISION, file_entry, registry_data

    repo, weights, config = "test-org/verify-me", b"w" * 1000, b'{"a": 1}'
    fake_hub.add(repo, REVISION, "weights.bin", weights)
    fake_hub.add(repo, REVISION, "config.json", config)
    data = registry_data("verify-me", [file_entry("weights.bin", weights),
                                       file_entry("config.json", config)],
                         [{"hf": {"repo": repo, "revision": REVISION}}])
    other = registry_data("never-fetched", [file_entry("x.bin", b"x")],
                          [{"hf": {"repo": "test-org/other", "revision": REVISION}}])
    data["models"] += other["models"]
    registry = hub.Registry.from_dict(data)
    # The package and its cache module each look the default registry up.
    monkeypatch.setattr(hub, "default_registry", lambda: registry)
    monkeypatch.setattr(hub.cache, "default_registry", lambda: registry)
    monkeypatch.setattr(hub, "list_models", lambda: list(registry))
    paths = hub.fetch_model("verify-me")

    assert cli.main(["models", "--verify"]) == 0
    out = capsys.readouterr().out
    assert "never-fetched" in out and "not cached" in out
    assert f"weights.bin              ok from {hub.hf_url(repo, REVISION, 'weights.bin')}" in out

    # Damage the bytes and forge the stamp to match the damaged file's state.
    paths["weights.bin"].write_bytes(b"W" + weights[1:])
    hub.cache.write_stamp(repo, REVISION, "weights.bin",
                          file_entry("weights.bin", weights)["sha256"], True, None)
    assert hub.is_cached("verify-me", "weights.bin")  # the cheap check is fooled
    assert cli.main(["models", "--verify"]) == 1
    captured = capsys.readouterr()
    assert "weights.bin              corrupt (sha256 mismatch: removed" in captured.out
    assert "config.json              ok" in captured.out
    assert "1 corrupt file(s) removed from the cache: verify-me/weights.bin" in captured.err
    assert not paths["weights.bin"].exists()
    assert cli.main(["models", "--verify"]) == 0  # now simply missing: fetched on next use
    assert "weights.bin              missing" in capsys.readouterr().out
