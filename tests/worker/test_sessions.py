"""The browser worker's Python half (candle_web.worker), natively and without a browser: the
manifests a `load` fetches, the staging of file bytes, building once and keeping the model, the
typed errors the page sees, and the checks of a run's options. The UI tests drive the same
code through the worker; these pin its rules where a failure is quick to read."""
from __future__ import annotations

import json

import numpy as np
import pytest

from candle_web import hub
from candle_web.core.errors import (CandleError, FormatError, InvalidOption, ModelNotFound,
                               UnsupportedError)
from candle_web.worker import (BertSession, LlamaSession, Session, T5Session, WhisperSession,
                               eval_twin, session_for)
from candle_web.worker.session import FILE_LIMIT_BYTES, files_from_folder
from candle_web.worker.whisper import transcribe_options

PINNED_COMMIT = "0123456789abcdef0123456789abcdef01234567"


class CountingSession(Session):
    """A session whose "model" is the bytes it was built from, counting its builds."""

    kind = "bert"
    command = "embed"
    required_files = ("a.bin", "b.bin")

    def __init__(self, fail_with=None):
        super().__init__()
        self.builds = 0
        self.fail_with = fail_with

    def build(self, files):
        self.builds += 1
        if self.fail_with is not None:
            raise self.fail_with
        return {name: bytes(buffer) for name, buffer in files.items()}

    def describe(self, model):
        return {"files": sorted(model)}

    def compute(self, model, name=None, on_event=None):
        if on_event is not None:
            on_event("seen", {"name": name})
        return {"size": len(model[name]), "bytes": np.frombuffer(model[name], dtype=np.uint8)}


def stage(session, key: str, files: dict) -> None:
    """Fill the session's buffers the way web/worker.js streams a download into them."""
    for name, data in files.items():
        session.allocate_file(key, name, len(data))[:] = np.frombuffer(data, dtype=np.uint8)


# --- manifests ------------------------------------------------------------------------------

def test_manifest_of_a_registry_model_lists_its_files_with_sizes_and_hashes():
    manifest = WhisperSession().manifest(model="whisper-tiny.en")
    entry = hub.default_registry()["whisper-tiny.en"]
    assert manifest["key"] == "whisper-tiny.en" and manifest["source"] == "server"
    assert manifest["files"] == [{"name": f.name, "size": f.size, "sha256": f.sha256,
                                  "url": f"models/whisper-tiny.en/{f.name}"}
                                 for f in entry.files]
    assert json.loads(WhisperSession().manifest_json(model="whisper-tiny.en")) == manifest


def test_manifest_refuses_a_model_of_another_kind_and_names_the_right_ones():
    with pytest.raises(ModelNotFound) as info:
        BertSession().manifest(model="smollm2-135m-instruct")
    assert str(info.value) == ("load: registry model 'smollm2-135m-instruct' is a llama model; "
                               "browser bert models: all-minilm-l6-v2")
    with pytest.raises(ModelNotFound, match="no registry model 'nope'"):
        BertSession().manifest(model="nope")


def test_manifest_of_a_folder_url_or_unpinned_hub_commit_has_no_hashes():
    folder = T5Session().manifest(url="models/local/t5-demo/")
    assert folder["key"] == "url:models/local/t5-demo/" and folder["source"] == "url"
    assert [f["url"] for f in folder["files"]] == [
        "models/local/t5-demo/config.json", "models/local/t5-demo/model.safetensors",
        "models/local/t5-demo/tokenizer.json"]
    assert all(f["sha256"] is None and f["size"] is None for f in folder["files"])
    hub_manifest = T5Session().manifest(hf_repo="someone/t5", revision=PINNED_COMMIT)
    assert hub_manifest["key"] == f"someone/t5@{PINNED_COMMIT}"
    assert hub_manifest["files"][0]["url"] == (
        f"https://huggingface.co/someone/t5/resolve/{PINNED_COMMIT}/config.json")


@pytest.mark.parametrize("naming, fragment", [
    ({"url": "../secret/"}, "must be a path on this server ending in '/'"),
    ({"url": "models/local/x/", "model": "t5-small"}, "name exactly one of"),
    ({}, "name exactly one of"),
    ({"hf_repo": "someone/t5", "revision": "main"}, "pin a full 40-character commit hash"),
    ({"hf_repo": "not a repo", "revision": PINNED_COMMIT}, "must look like 'owner/name'"),
])
def test_manifest_refuses_bad_namings(naming, fragment):
    with pytest.raises(ModelNotFound, match=fragment):
        T5Session().manifest(**naming)


def test_llama_loads_registry_models_and_a_folder_holding_model_gguf():
    assert LlamaSession().manifest(model="smollm2-135m-instruct")["files"][0]["name"].endswith(
        ".gguf")
    folder = LlamaSession().manifest(url="models/local/x/")
    assert folder["files"] == [{"name": "model.gguf", "size": None, "sha256": None,
                                "url": "models/local/x/model.gguf"}]
    with pytest.raises(ModelNotFound, match="Hub repos are not supported for LLaMA"):
        LlamaSession().manifest(hf_repo="a/b", revision="main")
    with pytest.raises(ModelNotFound, match="folder URL must be a path"):
        LlamaSession().manifest(url="../x/")


def test_models_reply_carries_a_hint_only_where_a_session_has_one():
    assert "hint" not in json.loads(BertSession().models_json())
    assert [m["name"] for m in json.loads(BertSession().models_json())["models"]] == [
        "all-minilm-l6-v2"]
    assert json.loads(T5Session().models_json())["hint"].startswith("No T5 weights")


# --- staging --------------------------------------------------------------------------------

def test_staged_bytes_are_taken_once_and_every_required_file_must_arrive():
    session = CountingSession()
    stage(session, "m", {"a.bin": b"abc", "b.bin": b"de"})
    stage(session, "other", {"a.bin": b"x"})
    staged = session.take_staged("m")
    assert {name: bytes(buffer) for name, buffer in staged.items()} == {"a.bin": b"abc",
                                                                         "b.bin": b"de"}
    with pytest.raises(FormatError, match="files never received: a.bin, b.bin"):
        session.take_staged("m")  # taken already
    session.discard_incoming("other")
    assert session._incoming == {}


@pytest.mark.parametrize("size", [0, -1, 2.5, True, "12", None, FILE_LIMIT_BYTES])
def test_allocate_file_refuses_sizes_that_are_not_byte_counts_under_the_limit(size):
    session = CountingSession()
    with pytest.raises(FormatError, match=f"below {FILE_LIMIT_BYTES}"):
        session.allocate_file("m", "a.bin", size)
    assert session._incoming == {}


def test_allocate_file_hands_out_a_uint8_buffer_of_the_announced_size():
    buffer = CountingSession().allocate_file("m", "a.bin", 3.0)  # JS numbers may be floats
    assert buffer.dtype == np.uint8 and buffer.shape == (3,)


# --- build once, then cached ------------------------------------------------------------------

def test_build_once_then_runs_use_the_cached_model():
    session = CountingSession()
    stage(session, "m", {"a.bin": b"abc", "b.bin": b"de"})
    summary = json.loads(session.build_model("m"))
    assert summary["key"] == "m" and summary["files"] == ["a.bin", "b.bin"]
    assert summary["buildMs"] >= 0
    events = []
    for _ in range(2):
        text, arrays = session.run("m", {"name": "a.bin"},
                                   on_event=lambda kind, data: events.append((kind, data)))
        assert json.loads(text) == {"size": 3}  # arrays travel apart, as ArrayBuffers
        assert arrays["bytes"].tobytes() == b"abc"
    assert session.builds == 1
    assert events == [("seen", '{"name": "a.bin"}')] * 2
    assert session._incoming == {}  # the raw bytes went with the build


def test_a_new_load_replaces_the_model_and_names_what_is_loaded():
    session = CountingSession()
    stage(session, "first", {"a.bin": b"1", "b.bin": b"1"})
    session.build_model("first")
    stage(session, "second", {"a.bin": b"22", "b.bin": b"2"})
    session.build_model("second")
    with pytest.raises(ModelNotFound) as info:
        session.run("first", {"name": "a.bin"})
    assert str(info.value) == ("embed: model 'first' is not loaded (loaded: second); send "
                               "`load` with kind 'bert' first")


@pytest.mark.parametrize("interruption", [KeyboardInterrupt(), FormatError("load: broken")])
def test_a_cancelled_or_failed_build_keeps_nothing_and_the_session_stays_usable(interruption):
    """Cancelling raises KeyboardInterrupt inside the build (Pyodide's interrupt buffer)."""
    session = CountingSession(fail_with=interruption)
    stage(session, "m", {"a.bin": b"abc", "b.bin": b"de"})
    with pytest.raises(type(interruption)):
        session.build_model("m")
    assert session._incoming == {} and session._loaded == {}
    session.fail_with = None
    stage(session, "m", {"a.bin": b"abc", "b.bin": b"de"})
    session.build_model("m")
    assert json.loads(session.run("m", {"name": "b.bin"})[0]) == {"size": 2}


# --- kinds --------------------------------------------------------------------------------------

def test_each_kind_has_one_session_and_none_is_whisper():
    assert isinstance(session_for("whisper"), WhisperSession)
    assert session_for(None) is session_for("whisper")
    assert {kind: type(session_for(kind)).__name__ for kind in ("bert", "llama", "t5")} == {
        "bert": "BertSession", "llama": "LlamaSession", "t5": "T5Session"}


@pytest.mark.parametrize("kind", ["nope", "", 3, "Whisper"])
def test_an_unknown_kind_is_a_typed_error_listing_the_known_ones(kind):
    with pytest.raises(UnsupportedError) as info:
        session_for(kind)
    assert str(info.value) == (f"unknown model kind {json.dumps(kind)}; known: whisper, bert, "
                               "llama, t5, vad, faces")


# --- options ------------------------------------------------------------------------------------

class StubLlama(LlamaSession):
    """LlamaSession with a stand-in model (built from nothing): the options are refused
    before it is used."""

    def build(self, files):
        return None, None

    def describe(self, model):
        return {}


class StubT5(T5Session):
    required_files = ()

    def build(self, files):
        return None

    def describe(self, model):
        return {}


def loaded_stub(session_class):
    session = session_class()
    session.build_model("stub")
    return session


@pytest.mark.parametrize("options, error, fragment", [
    ({"maxTokens": 5000}, CandleError, r"generate: maxTokens must be 1\.\.2048, got 5000"),
    ({"maxTokens": 0}, CandleError, r"maxTokens must be 1\.\.2048, got 0"),
    ({"maxTokens": 2.5}, CandleError, "option maxTokens must be a whole number"),
    ({"temperature": "hot"}, CandleError, "option temperature must be a number"),
    ({"temperature": float("nan")}, CandleError, "option temperature must be a number"),
    ({"topP": 5}, InvalidOption, r"top_p must be a finite number in \(0, 1\]"),
    ({"seed": -1}, InvalidOption, "seed must be an integer >= 0"),
    ({"repeatLastN": -5}, InvalidOption, "repeat_last_n must be an integer >= 0"),
    ({"beams": 2}, CandleError, "generate: unknown option"),
])
def test_generate_options_out_of_range_are_refused(options, error, fragment):
    session = loaded_stub(StubLlama)
    with pytest.raises(error, match=fragment):
        session.run("stub", {"prompt": "hi", "chat": False, "options": options})


@pytest.mark.parametrize("request_fields, fragment", [
    ({"prompt": "hi", "options": {"maxTokens": 513}}, r"text2text: maxTokens must be 1\.\.512"),
    ({"prompt": "hi", "options": {"repeatLastN": 3}}, "text2text: unknown option"),
    ({"prompt": "   "}, "text2text: the input is empty"),
    ({"prompt": "x" * 32_001}, "the input has 32001 characters; at most 32000"),
])
def test_text2text_requests_out_of_range_are_refused(request_fields, fragment):
    with pytest.raises(CandleError, match=fragment):
        loaded_stub(StubT5).run("stub", request_fields)


def test_transcribe_options_are_checked_by_name_and_range():
    assert transcribe_options({"beam_size": 2, "language": None}).beam_size == 2
    with pytest.raises(UnsupportedError, match="transcribe: unknown option"):
        transcribe_options({"beams": 2})
    with pytest.raises(InvalidOption, match="beam_size"):
        transcribe_options({"beam_size": 1000})


@pytest.mark.parametrize("sentences, fragment", [
    ("one string", "expected a list of sentences"),
    ([], "no sentences"),
    (["ok", " "], "sentence 2 is empty or not text"),
    (["s"] * 65, "65 sentences; at most 64"),
])
def test_embed_requests_out_of_range_are_refused(sentences, fragment):
    session = BertSession()
    session._loaded["stub"] = None  # refused before the embedder is touched
    with pytest.raises(CandleError, match=fragment):
        session.run("stub", {"sentences": sentences})


# --- the real thing, from the cached files -----------------------------------------------------

def test_bert_session_builds_the_pipelines_embedder_from_staged_bytes(model_file):
    """The worker builds from bytes what pipelines.load_bert loads from the folder."""
    from candle_web.pipelines import load_bert
    from candle_web.pipelines.embed import SentenceEmbedder

    session = BertSession()
    folder = model_file("all-minilm-l6-v2", "model.safetensors").parent
    for name, data in files_from_folder(folder, session.required_files).items():
        session.allocate_file("all-minilm-l6-v2", name, data.size)[:] = data
    summary = json.loads(session.build_model("all-minilm-l6-v2"))
    assert (summary["dims"], summary["layers"], summary["maxTokens"]) == (384, 6, 256)
    sentences = ["A man is eating food.", "A man is riding a horse."]
    text, arrays = session.run("all-minilm-l6-v2", {"sentences": sentences})
    reply = json.loads(text)
    assert reply["count"] == 2 and reply["dims"] == 384
    assert arrays["vectors"].dtype == np.float32 and arrays["vectors"].shape == (2, 384)
    loaded = load_bert(folder)
    native = SentenceEmbedder(loaded.model, loaded.tokenizer).embed(sentences).vectors
    np.testing.assert_allclose(arrays["vectors"], native, rtol=0, atol=1e-6)


def test_eval_twin_reply_keeps_the_output_apart():
    text, arrays = eval_twin({"seed": 1, "m": 2, "k": 3, "n": 4})
    reply = json.loads(text)
    assert reply["shape"] == [2, 4] and reply["dtype"] == "f32" and len(reply["timingsMs"]) == 1
    assert arrays["output"].shape == (2, 4)
    np.testing.assert_allclose(arrays["output"].sum(axis=1), 1.0, rtol=1e-6)


def test_llama_models_offer_qwen_with_licences_and_gemma_only_when_asked():
    """The page's pickers: SmolLM2 and Qwen2.5-Coder offered with their licences; Gemma-3-270M
    (Gemma terms) listed only with `all` (the page's ?models=all), and loadable by name."""
    session = LlamaSession()
    offered = {m["name"]: m["license"] for m in json.loads(session.models_json())["models"]}
    assert offered == {"smollm2-135m-instruct": "Apache-2.0",
                       "qwen2.5-coder-0.5b-instruct": "Apache-2.0"}
    every = {m["name"]: m for m in json.loads(session.models_json(True))["models"]}
    assert every["gemma3-270m-q4km"]["license"] == "Gemma Terms of Use"
    assert every["gemma3-270m-q4km"]["offered"] is False
    assert json.loads(session.models_json("yes"))["models"] == json.loads(
        session.models_json())["models"], "only a real true asks for every model"
    manifest = session.manifest(model="gemma3-270m-q4km")
    assert [f["name"] for f in manifest["files"]] == ["gemma-3-270m-Q4_K_M.gguf"]
    qwen = session.manifest(model="qwen2.5-coder-0.5b-instruct")["files"][0]
    assert qwen["size"] == 491_400_064 and qwen["sha256"].startswith("1d9614638d18")


@pytest.mark.parametrize("sizes, fragment", [
    ([FILE_LIMIT_BYTES], "must stay under 2,147,483,648 bytes"),
    ([1_900_000_000, 1_000_000], "need about 3.5 GiB of the page's memory"),
], ids=["one-array-too-big", "heap-too-small"])
def test_a_model_too_big_for_the_page_is_refused_before_download(sizes, fragment):
    files = [{"name": f"part{i}.gguf", "size": size, "sha256": None, "url": ""}
             for i, size in enumerate(sizes)]
    with pytest.raises(UnsupportedError, match=fragment) as raised:
        LlamaSession().check_page_memory("big-model", files)
    assert "big-model" in str(raised.value)
    LlamaSession().check_page_memory("qwen", [{"name": "q.gguf", "size": 491_400_064}])
